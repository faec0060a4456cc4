"""Names for temporary files that say which process owns them, so cleanup never hits a live write.

Each result has one writer, but a writer can outlive the run that started it (a dask task keeps
running after its run was stopped) and a killed writer leaves its temporary files behind. A
temporary name carries the writer's pid; a leftover is removed only when that process no
longer exists.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

_OWNER = re.compile(r"\.(?:tmp|old)-(\d+)-[0-9a-f]{32}(?:\.tmp)?$")


def owned_name(target: Path, kind: str = "tmp") -> Path:
    """A sibling name for ``target`` owned by this process (kind 'tmp' or 'old')."""
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex}")


def process_alive(pid: int) -> bool:
    """True when a process with this pid exists (signal 0 probes without touching it)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_leftovers(target: Path) -> int:
    """Delete temporary siblings of ``target`` whose owning process has died; count them."""
    removed = 0
    if not target.parent.exists():
        return 0
    for leftover in target.parent.glob(f".{target.name}.*"):
        match = _OWNER.search(leftover.name)
        if not match or process_alive(int(match.group(1))):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed += 1
    return removed


def remove_dead_leftovers_in(folder: Path) -> int:
    """Delete every temporary entry of ``folder`` whose owning process has died; count them."""
    if not folder.is_dir():
        return 0
    removed = 0
    for leftover in folder.iterdir():
        match = _OWNER.search(leftover.name)
        if match and not process_alive(int(match.group(1))):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            removed += 1
    return removed
