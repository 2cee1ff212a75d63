"""Soak / race test (issue 11): writers (real `iox-batch write` processes and in-process threads), a persist loop,
a compaction loop and queries, all at once on ONE partition of one table, for IOX_SOAK_SECONDS (CI default 30;
`make soak` runs 60).

Every writer overwrites the same keys, leaving fields out at random (NULLs that must not override). The test's
own tally records every committed write with the catalog order the write reported; the expected answer is, per
key, each field's last non-null value in that order. A writer-owned counter field (`c<w>`, rising with each of
writer w's writes) checks the same thing without trusting orders: its final value is the last one w wrote there.
Checked: every point is found exactly once with its last values, no command failed except with the documented
retryable error (exit 75, which the writer retries), the partition persists at the end, and no persist ever refused
the partition ("ingester chunk older than one of its files": the race 0004_database_orders.sql closed). Queries
during the soak must see each key once and never see a writer's counter go backwards."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.errors import CatalogError, CatalogUnavailableError, IoxError
from iox_planner.maintenance.persist import persist
from iox_planner.ingest.write import write_line_protocol

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SECONDS = float(os.environ.get("IOX_SOAK_SECONDS", "30"))
SEED = int(os.environ.get("IOX_SOAK_SEED", "11"))
DAY = 1_704_067_200_000_000_000
KEYS = 24
PROCESS_WRITERS = 2
THREAD_WRITERS = 2
IOX = str(Path(sys.executable).parent / "iox-batch")
ORDER_LINE = re.compile(r"wrote ingester chunk \S+: soak 2024-01-01, (\d+) rows, order (\d+)")


@dataclass
class Write:
    order: int
    values: dict[tuple[str, int], dict[str, Any]]  # key -> the fields this write gave it


@dataclass
class Soak:
    catalog: Catalog
    db: str
    deadline: float
    writes: list[Write] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    retried: int = 0
    persists: int = 0
    compactions: int = 0
    compaction_skips: int = 0
    refusals: list[str] = field(default_factory=list)
    queries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


def _batch(rng: random.Random, writer: int, n: int) -> tuple[str, dict[tuple[str, int], dict[str, Any]]]:
    """Writer `writer`'s n-th write: a random half of the keys, each with a random non-empty subset of the fields
    (the writer's counter c<w>, the shared float `x` and string `s`)."""
    lines, values = [], {}
    for j in sorted(rng.sample(range(KEYS), KEYS // 2)):
        fields: dict[str, Any] = {}
        if rng.random() < 0.7:
            fields[f"c{writer}"] = n
        if rng.random() < 0.5:
            fields["x"] = writer * 1000.0 + n + 0.25
        if rng.random() < 0.5 or not fields:
            fields["s"] = f"w{writer}n{n}"
        key = (f"k{j:02d}", DAY + j * 1_000_000_000)
        text = ",".join(f"{name}={value}i" if isinstance(value, int) else
                        f'{name}="{value}"' if isinstance(value, str) else f"{name}={value!r}"
                        for name, value in fields.items())
        lines.append(f"soak,k={key[0]} {text} {key[1]}")
        values[key] = fields
    return "\n".join(lines) + "\n", values


def _process_writer(soak: Soak, writer: int) -> None:
    rng = random.Random(f"{SEED}:{writer}")
    n = 0
    while time.monotonic() < soak.deadline:
        n += 1
        text, values = _batch(rng, writer, n)
        for attempt in range(20):
            done = subprocess.run([IOX, "write", "--db", soak.db, "-"], input=text, capture_output=True, text=True,
                                  env=os.environ.copy(), timeout=300)
            if done.returncode == 75:  # documented retryable: the catalog connection dropped; write again
                with soak.lock:
                    soak.retried += 1
                continue
            break
        if done.returncode != 0:
            soak.fail(f"process writer {writer} write {n}: exit {done.returncode}: {done.stderr.strip()[:500]}")
            return
        found = ORDER_LINE.search(done.stdout)
        if found is None or int(found.group(1)) != len(values):
            soak.fail(f"process writer {writer} write {n}: unexpected output {done.stdout[:500]}")
            return
        with soak.lock:
            soak.writes.append(Write(int(found.group(2)), values))


def _thread_writer(soak: Soak, writer: int) -> None:
    rng = random.Random(f"{SEED}:{writer}")
    n = 0
    while time.monotonic() < soak.deadline:
        n += 1
        text, values = _batch(rng, writer, n)
        try:
            result = write_line_protocol(soak.catalog, soak.db, text)
        except CatalogUnavailableError:
            with soak.lock:
                soak.retried += 1
            continue
        except Exception as err:  # noqa: BLE001 - every failure is a finding
            soak.fail(f"thread writer {writer} write {n}: {type(err).__name__}: {err}")
            return
        (chunk,) = result.chunks
        with soak.lock:
            soak.writes.append(Write(chunk.order, values))


def _persist_loop(soak: Soak) -> None:
    while time.monotonic() < soak.deadline:
        try:
            persist(soak.catalog, soak.db)
            with soak.lock:
                soak.persists += 1
        except CatalogError as err:
            if "older than" in str(err):
                with soak.lock:
                    soak.refusals.append(str(err))
            elif "does not exist" not in str(err):  # before the first write lands
                soak.fail(f"persist: {err}")
        except Exception as err:  # noqa: BLE001
            soak.fail(f"persist: {type(err).__name__}: {err}")
        time.sleep(0.2)


def _compact_loop(soak: Soak) -> None:
    """Compaction of the one partition, over and over beside the persist loop: hot (L0 into L1) whenever persist
    left two files. A skip (another compactor, inputs changed meanwhile) is a normal outcome; an error is not."""
    from spark_jobs.session import shared_session
    from iox_planner.maintenance.compact.run import compact
    from iox_planner.maintenance.compact.settings import CompactSettings
    from spark_jobs.compact_job import spark_slice_runner

    run_slices = spark_slice_runner(shared_session())
    settings = CompactSettings(cold_seconds=10**6, target_rows=1_000_000, max_rows=1_000_000)
    while time.monotonic() < soak.deadline:
        try:
            report = compact(soak.catalog, soak.db, run_slices, settings=settings)
            with soak.lock:
                soak.compactions += len(report.compacted)
                soak.compaction_skips += len(report.outcomes) - len(report.compacted)
        except CatalogUnavailableError:
            with soak.lock:
                soak.retried += 1
        except CatalogError as err:
            if "does not exist" not in str(err):  # before the first write lands
                soak.fail(f"compact: {err}")
        except Exception as err:  # noqa: BLE001
            soak.fail(f"compact: {type(err).__name__}: {str(err)[:500]}")
        time.sleep(0.5)


def _query(soak: Soak) -> list[dict[str, Any]]:
    from spark_jobs.session import shared_session
    from iox_planner.config import warehouse
    from iox_planner.planner import plan_query
    from spark_jobs.execute import execute

    from iox_planner.output.formats import finish_columns

    plan = plan_query("SELECT * FROM soak", CatalogSource(soak.catalog, soak.db))
    table: pa.Table = execute(shared_session(), plan, warehouse()).result.toArrow()
    table, ns_cols = finish_columns(table)  # `time` as int64 nanoseconds, as the CLI's outputs give it
    assert "time" in ns_cols
    return table.to_pylist()


def _key_of(row: dict[str, Any]) -> tuple[str, int]:
    return row["k"], row["time"]


def _query_loop(soak: Soak) -> None:
    seen: dict[tuple[tuple[str, int], str], int] = {}
    while time.monotonic() < soak.deadline:
        try:
            rows = _query(soak)
        except IoxError as err:
            with soak.lock:
                started = bool(soak.writes)
            if started:
                soak.fail(f"query: {err}")
            time.sleep(0.5)
            continue
        except Exception as err:  # noqa: BLE001
            soak.fail(f"query: {type(err).__name__}: {str(err)[:500]}")
            return
        keys = [_key_of(r) for r in rows]
        if len(keys) != len(set(keys)):
            soak.fail(f"query {soak.queries}: a key appears more than once")
        for row, key in zip(rows, keys):
            for name, value in row.items():
                if re.fullmatch(r"c\d+", name) and value is not None:
                    if value < seen.get((key, name), 0):
                        soak.fail(f"query {soak.queries}: {key} {name} went back from {seen[(key, name)]} to {value}")
                    seen[(key, name)] = value
        with soak.lock:
            soak.queries += 1


def test_soak_writers_persist_compact_queries_on_one_partition(catalog: Catalog, spark: object) -> None:
    db = f"soak_{uuid.uuid4().hex[:10]}"
    soak = Soak(catalog, db, time.monotonic() + SECONDS)
    threads = [threading.Thread(target=_process_writer, args=(soak, w)) for w in range(PROCESS_WRITERS)]
    threads += [threading.Thread(target=_thread_writer, args=(soak, PROCESS_WRITERS + w))
                for w in range(THREAD_WRITERS)]
    threads += [threading.Thread(target=loop, args=(soak,)) for loop in (_persist_loop, _query_loop, _compact_loop)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SECONDS + 600)
        assert not thread.is_alive(), "a soak thread hung"

    assert soak.failures == [], soak.failures[:10]
    assert soak.refusals == [], soak.refusals[:3]
    orders = [w.order for w in soak.writes]
    assert len(orders) == len(set(orders)), "two writes reported the same order"
    # The partition can still be persisted, whatever the race left.
    persist(catalog, db)

    expected: dict[tuple[str, int], dict[str, Any]] = {}
    last_counter: dict[tuple[tuple[str, int], str], int] = {}
    for write in sorted(soak.writes, key=lambda w: w.order):
        for key, fields in write.values.items():
            expected.setdefault(key, {}).update(fields)
    for writer in range(PROCESS_WRITERS + THREAD_WRITERS):
        # Independent of orders: each writer's own writes commit one after another, so its counter's final value
        # at a key is the highest n it wrote there.
        for write in soak.writes:
            for key, fields in write.values.items():
                value = fields.get(f"c{writer}")
                if value is not None:
                    last_counter[(key, f"c{writer}")] = max(last_counter.get((key, f"c{writer}"), 0), value)

    rows = _query(soak)
    got = {}
    for row in rows:
        key = _key_of(row)
        assert key not in got, f"{key} found twice"
        got[key] = {n: v for n, v in row.items() if n not in ("k", "time") and v is not None}
    lost = set(expected) - set(got)
    assert not lost, f"{len(lost)} points lost"
    assert set(got) == set(expected), "points nobody wrote"
    assert got == expected, "a field is not its last non-null value"
    for (key, name), value in last_counter.items():
        assert got[key][name] == value, f"{key} {name}"
    per_writer = {w: sum(1 for x in soak.writes if any(f"c{w}" in f for f in x.values.values()))
                  for w in range(PROCESS_WRITERS + THREAD_WRITERS)}
    print(f"soak {SECONDS:.0f} s: {len(soak.writes)} writes ({PROCESS_WRITERS} processes, {THREAD_WRITERS} threads; "
          f"per writer {per_writer}), {soak.retried} retried, {soak.persists} persists, {soak.compactions} "
          f"compactions ({soak.compaction_skips} skipped), {soak.queries} queries, "
          f"0 lost points, 0 refusals, 0 failures")
