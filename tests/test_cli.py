"""Command-line behaviour a user meets first: help, and clear errors for bad selections."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("build", "render", "report", "views", "summary", "dagster-home"):
        assert command in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cities", "Atlantis"], "unknown city 'Atlantis'"),
        (["--cities", "Boston", "--years", "1999"], "outside the calendar 2000–2025"),
        (["--cities", "Boston", "--years", "soon"], "cannot read years"),
    ],
)
def test_bad_selection_fails_clearly_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["--data", str(tmp_path / "data"), "build", *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # nothing was written


def test_summary_without_a_release_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--data", str(tmp_path), "summary"]) == 2
    assert "make run" in capsys.readouterr().err
