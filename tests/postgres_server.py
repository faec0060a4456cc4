"""A real PostgreSQL server for tests: PostgreSQL 16 from the ``pgserver`` wheel (the ``dev``
extra), in a new temporary folder, listening on 127.0.0.1 only; and PgBouncer (Debian's
``pgbouncer`` package, which ``make test`` installs where it can) in front of one.

Only the server programs the wheel ships are used (``initdb``, ``pg_ctl``, ``postgres``); the
package's Python side is not imported. PostgreSQL refuses to run as root, so as root the server
runs as ``nobody``, from a copy of the programs in the temporary folder (the virtual
environment may lie under a folder that ``nobody`` cannot enter).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.ports import free_loopback_port
from tests.processes import stop_process

UNPRIVILEGED_USER = "nobody"


def server_programs() -> Path:
    """The folder of the wheel's PostgreSQL installation (bin/, lib/, share/)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pgserver is not installed: run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _unprivileged(folder: Path) -> dict[str, Any]:
    """As root: hand ``folder`` to the unprivileged user and return the ``subprocess`` arguments
    that run a program as that user (PostgreSQL and PgBouncer refuse root); otherwise {}."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam(UNPRIVILEGED_USER)
    folder.chmod(0o755)
    os.chown(folder, account.pw_uid, account.pw_gid)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@contextlib.contextmanager
def postgres_server(database: str = "citycube") -> Iterator[str]:
    """Start a server with a new empty ``database``; yield its URL; stop it and remove its
    folder on exit."""
    import psycopg2

    folder = Path(tempfile.mkdtemp(prefix="citycube-pg-"))
    programs = server_programs()
    run_as = _unprivileged(folder)
    if run_as:
        # The programs find their libraries at ../../../pgserver.libs: the same layout.
        site = programs.parent.parent
        for part in ("bin", "lib", "share"):
            copied = f"pgserver/pginstall/{part}"
            shutil.copytree(site / copied, folder / "pg" / copied, symlinks=True)
        shutil.copytree(site / "pgserver.libs", folder / "pg" / "pgserver.libs", symlinks=True)
        programs = folder / "pg" / "pgserver" / "pginstall"
    data, log = folder / "data", folder / "server.log"
    pg_ctl = str(programs / "bin" / "pg_ctl")
    port = free_loopback_port()

    def run(*command: str) -> None:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=False, **run_as
        )
        if done.returncode != 0:
            server_log = log.read_text(errors="replace") if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n"
                f"{server_log}"
            )

    try:
        run(
            str(programs / "bin" / "initdb"),
            *("-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8"),
            *("--locale=C", "--no-instructions"),
        )
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories=''"
        run(pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
        try:
            admin = psycopg2.connect(host="127.0.0.1", port=port, user="postgres")
            admin.autocommit = True
            with admin.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{database}"')
            admin.close()
            yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}"
        finally:
            run(pg_ctl, "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PGBOUNCER_CONFIG = """\
[databases]
{database} = host=127.0.0.1 port={server_port} dbname={database} user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = session
max_client_conn = 1000
default_pool_size = 40
log_connections = 0
log_disconnections = 0
logfile = {folder}/pgbouncer.log
"""
"""Session pooling: a client's server connection goes back to the pool when the client closes
it, which dagster-postgres does after every statement (its engine keeps no connection)."""


def pgbouncer_program() -> str | None:
    """The ``pgbouncer`` program, or None where it is not installed."""
    return shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


@contextlib.contextmanager
def pgbouncer(url: str) -> Iterator[str]:
    """Start PgBouncer in front of the server at ``url`` (from :func:`postgres_server`); yield
    the URL that reaches the same database through it; stop it and remove its folder on exit."""
    program = pgbouncer_program()
    if program is None:
        raise RuntimeError("pgbouncer is not installed (Debian's pgbouncer package)")
    server_port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    database = url.rsplit("/", 1)[1]
    folder = Path(tempfile.mkdtemp(prefix="citycube-pgbouncer-"))
    port = free_loopback_port()
    run_as = _unprivileged(folder)  # like PostgreSQL, PgBouncer refuses to run as root
    config = folder / "pgbouncer.ini"
    config.write_text(
        PGBOUNCER_CONFIG.format(
            database=database, server_port=server_port, port=port, folder=folder
        ),
        encoding="utf-8",
    )
    (folder / "users.txt").write_text('"postgres" ""\n', encoding="utf-8")
    process = subprocess.Popen(
        [program, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **run_as
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = folder / "pgbouncer.log"
                    why = log.read_text(errors="replace") if log.exists() else ""
                    raise RuntimeError(f"pgbouncer did not start:\n{why}") from None
                time.sleep(0.1)
        yield url.replace(f":{server_port}/", f":{port}/")
    finally:
        stop_process(process, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
