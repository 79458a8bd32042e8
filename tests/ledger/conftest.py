"""A real DuckDB file per test, opened as the daemon opens it (no external access)."""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb
import pytest

from kliqued.ledger import IntervalRow, ensure_schema

H = 3_600_000


def ms(text: str) -> int:
    """`2026-06-30T12:00` (UTC) as epoch milliseconds."""
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)


def row(
    n: int,
    start: str | int,
    *,
    task: str | None = None,
    user: str = "alice",
    group: str = "team-a",
    gpu_type: str = "h100",
    gpus_milli: int = 1000,
    weight_milli: int = 1000,
    project: str | None = "llm",
    place: int = 1,
    group_path: str | None = None,
) -> IntervalRow:
    task = task or f"t-{n}"
    return IntervalRow(
        interval_id=f"{task}#{place}",
        task=task,
        user=user,
        project=project,
        group=group,
        policy=group,
        profile="standard",
        resource=f"{group}/standard",
        pool="onprem-k8s",
        gpu_type=gpu_type,
        gpus_milli=gpus_milli,
        weight_milli=weight_milli,
        start_ms=start if isinstance(start, int) else ms(start),
        revision="sha256:test",
        group_path=group_path,
    )


@pytest.fixture
def db(tmp_path):
    conn = duckdb.connect(str(tmp_path / "ledger.duckdb"), config={"enable_external_access": False})
    ensure_schema(conn)
    yield conn
    conn.close()


def set_prices(conn, *prices: tuple[str, str, str]) -> None:
    conn.execute("DELETE FROM prices")
    for gpu_type, price, start in prices:
        conn.execute(
            "INSERT INTO prices (gpu_type, per_gpu_hour, currency, effective_from) "
            "VALUES (?, ?, 'EUR', ?)",
            [gpu_type, price, datetime.fromisoformat(start)],
        )
