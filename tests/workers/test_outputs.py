"""A task's outputs file (workers/outputs.py): KEY=VALUE lines, what is kept and what is not.
The worker giving $KLIQUE_OUTPUTS and sending the lines with the finished report is tested
for real in tests/channels/test_pipelines.py."""

from __future__ import annotations

from pathlib import Path

from workers import outputs


def test_key_value_lines_are_read_and_the_rest_skipped(tmp_path: Path) -> None:
    f = tmp_path / "t.outputs"
    f.write_text(
        "# written by prep.py\nPATH_OUT=/data/x=1\n\nnot a line\n 9BAD=x\n"
        "SIZE = 42\nPATH_OUT=/data/y\n"
    )
    assert outputs.read(str(f)) == {"PATH_OUT": "/data/y", "SIZE": "42"}


def test_no_file_or_nothing_valid_is_none(tmp_path: Path) -> None:
    assert outputs.read(str(tmp_path / "absent")) is None
    (tmp_path / "junk").write_text("junk\n=x\n")
    assert outputs.read(str(tmp_path / "junk")) is None


def test_the_file_is_read_up_to_its_cap(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_text("".join(f"K{i}=v\n" for i in range(1000)) + "A" * outputs.MAX_BYTES)
    got = outputs.read(str(f))
    assert got is not None and len(got) == outputs.MAX_KEYS
    assert outputs.path_for("/state/logs/t-1.log") == "/state/logs/t-1.log.task/outputs"
