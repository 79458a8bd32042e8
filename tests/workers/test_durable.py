"""``workers.durable.fsync_together``: the records' fsyncs issued at once (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import durable


def test_every_record_written_is_synced_and_one_forgotten_since_is_skipped(tmp_path):
    records = [tmp_path / f"t-{i}.e1.json" for i in range(20)]  # more than THREADS
    for p in records:
        p.write_text("{}")
    forgotten = tmp_path / "t-gone.e1.json"  # written, then removed before the report
    durable.fsync_together([*records, forgotten], tmp_path)  # no error for the gone one


def test_a_directory_that_cannot_be_opened_fails_the_batch(tmp_path):
    """The directory's fsync makes the renames durable: without it the report must not go
    (the worker then rides out a state-dir fault), so its failure is raised."""
    record = tmp_path / "t-1.e1.json"
    record.write_text("{}")
    with pytest.raises(FileNotFoundError):
        durable.fsync_together([record], Path(tmp_path / "no-such-dir"))
