"""The one atomic writer: a target is the old version or the new one, whole, never half of one;
a failed write leaves no temporary behind, and a killed writer's temporary is cleaned up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import citycube.io.atomic as atomic_module
from citycube.io.atomic import (
    atomic_path,
    remove_dir_atomic,
    replace_dir_atomic,
    write_json_atomic,
    write_text_atomic,
)
from citycube.io.scratch import remove_dead_leftovers


class Boom(Exception):
    """A writer failing halfway."""


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_text_write_replaces_the_file_and_makes_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "note.txt"
    assert write_text_atomic("first ✓\n", path) == path
    write_text_atomic("second\n", path)
    assert path.read_text(encoding="utf-8") == "second\n"
    assert _entries(path.parent) == ["note.txt"]


def test_json_is_indented_with_sorted_keys(tmp_path: Path) -> None:
    path = write_json_atomic({"b": 1, "a": Path("x")}, tmp_path / "r.json")
    assert path.read_text(encoding="utf-8") == '{\n  "a": "x",\n  "b": 1\n}'
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "x", "b": 1}


def test_a_write_that_raises_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = write_text_atomic("old", tmp_path / "table.parquet")
    with pytest.raises(Boom), atomic_path(path) as tmp:
        tmp.write_bytes(b"half a ne")
        raise Boom
    assert path.read_text(encoding="utf-8") == "old"
    assert _entries(tmp_path) == ["table.parquet"]


def test_a_write_that_raises_before_anything_exists_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "never.json"
    with pytest.raises(Boom), atomic_path(path):
        raise Boom
    assert _entries(tmp_path) == []


def test_the_file_has_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    atomic = write_text_atomic("x", tmp_path / "atomic")
    assert atomic.stat().st_mode == plain.stat().st_mode


@pytest.mark.parametrize("durable", [False, True])
def test_only_a_durable_write_syncs_and_it_syncs_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    path = tmp_path / "_complete.json"
    synced: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(path.exists())  # False: the target is not in place yet
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_text_atomic("{}", path, durable=durable)
    assert synced == ([False] if durable else [])
    assert path.read_text(encoding="utf-8") == "{}"


def test_another_library_writes_to_the_temporary_name(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    with atomic_path(path) as tmp:
        pq.write_table(pa.table({"x": [1, 2]}), tmp)
        assert not path.exists()
    assert pq.read_table(path).column("x").to_pylist() == [1, 2]


def test_a_symlink_is_repointed_in_one_rename(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    link = tmp_path / "current"
    for target in ("one", "two"):
        with atomic_path(link) as tmp:
            os.symlink(target, tmp)
    assert os.readlink(link) == "two"
    assert _entries(tmp_path) == ["current", "one", "two"]


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from citycube.io.atomic import atomic_path

    with atomic_path(Path(sys.argv[1])) as tmp:
        tmp.write_text("half a new ver")
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_killed_writers_temporary_is_removed_by_the_leftover_cleanup(tmp_path: Path) -> None:
    path = write_text_atomic("old", tmp_path / "cube.json")
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], check=False)
    assert done.returncode == -signal.SIGKILL
    leftovers = [name for name in _entries(tmp_path) if name != "cube.json"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".cube.json.tmp-")
    assert path.read_text(encoding="utf-8") == "old"

    with atomic_path(path) as live:  # a live writer's temporary is never taken for a leftover
        live.write_text("new")
        assert remove_dead_leftovers(path) == 1
        assert live.exists()
    assert path.read_text(encoding="utf-8") == "new"
    assert _entries(tmp_path) == ["cube.json"]


def _folder(path: Path, version: str) -> None:
    path.mkdir()
    for name in ("a.parquet", "b.parquet"):
        (path / name).write_text(version)


def _seen(folder: Path) -> tuple[str, ...] | None:
    """What a reader of ``folder`` finds: each file's version, or None for no folder."""
    if not folder.exists():
        return None
    return tuple(
        (folder / name).read_text() if (folder / name).exists() else "-"
        for name in ("a.parquet", "b.parquet")
    )


@pytest.fixture(params=["exchange", "move aside"])
def swap(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Each way a folder can be swapped: in one exchange, or moved aside first."""
    if request.param == "exchange":
        (tmp_path / "x").mkdir()
        (tmp_path / "y").mkdir()
        if not atomic_module.exchange_paths(tmp_path / "x", tmp_path / "y"):
            pytest.skip("this file system cannot exchange two folders in one step")
        (tmp_path / "x").rmdir()
        (tmp_path / "y").rmdir()
    else:
        monkeypatch.setattr(atomic_module, "exchange_paths", lambda first, second: False)
    return request.param


def test_a_folder_swap_leaves_the_old_folder_or_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    dest = tmp_path / "published"
    _folder(dest, "old")
    observed: list[tuple[str, ...] | None] = []

    def watching(function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            result = function(*args)
            observed.append(_seen(dest))
            return result

        return call

    monkeypatch.setattr(os, "replace", watching(os.replace))
    monkeypatch.setattr(atomic_module, "exchange_paths", watching(atomic_module.exchange_paths))
    with atomic_path(dest) as tmp:
        _folder(tmp, "new")
    monkeypatch.undo()
    assert _seen(dest) == ("new", "new")
    allowed = {("old", "old"), ("new", "new")} | ({None} if swap == "move aside" else set())
    assert observed and set(observed) <= allowed, "a reader saw a mixed or partial folder"
    assert _entries(tmp_path) == ["published"]


def test_a_folder_write_that_raises_leaves_the_old_folder(tmp_path: Path, swap: str) -> None:
    dest = tmp_path / "benchmark"
    _folder(dest, "old")
    with pytest.raises(Boom), atomic_path(dest) as tmp:
        tmp.mkdir()
        (tmp / "a.parquet").write_text("new")
        raise Boom
    assert _seen(dest) == ("old", "old")
    assert _entries(tmp_path) == ["benchmark"]


def test_a_folder_swap_that_fails_puts_the_old_folder_back(tmp_path: Path, swap: str) -> None:
    dest = tmp_path / "store.zarr"
    _folder(dest, "old")
    with pytest.raises(FileNotFoundError):
        replace_dir_atomic(tmp_path / "never-written", dest)
    assert _seen(dest) == ("old", "old")
    assert _entries(tmp_path) == ["store.zarr"]


def test_a_folder_takes_an_empty_place(tmp_path: Path, swap: str) -> None:
    src = tmp_path / "staging"
    _folder(src, "new")
    replace_dir_atomic(src, tmp_path / "item")
    assert _seen(tmp_path / "item") == ("new", "new")
    assert _entries(tmp_path) == ["item"]


def test_a_folder_removal_leaves_no_folder_and_no_leftover(tmp_path: Path) -> None:
    folder = tmp_path / "item"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "values.parquet").write_bytes(b"x")
    remove_dir_atomic(folder)
    assert list(tmp_path.iterdir()) == []
    remove_dir_atomic(folder)  # nothing there: nothing done, no error
    assert list(tmp_path.iterdir()) == []
