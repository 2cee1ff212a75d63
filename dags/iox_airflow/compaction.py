"""The `iox_compact` DAG's steps: find the partitions that need compaction and batch them for at most
IOX_MAX_SPARK_JOBS Spark jobs (or, when none needs a rewrite, one in-process batch of promotions: no Spark job);
sum the batches' reports."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iox_planner.runs.settings import AirflowSettings


def report_folder(run_id: str) -> Path:
    from iox_planner.config import state_dir

    return state_dir() / "compact" / re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:200]


@dataclass(frozen=True)
class Batches:
    """What `find_work` hands on: the spark-submit argument lists, and the argument list of the in-process batch
    of promotions (the same form; empty when there is none)."""

    spark: list[list[str]]
    promote: list[str]


def batch_args(settings: AirflowSettings, run_id: str) -> Batches:
    """One spark-submit argument list per batch: `--metrics <report> --target DB=PID,PID ...`. Partitions go to
    the batch with the fewest rows so far, largest first, so batches take about equal time. When no partition
    needs a rewrite, the one batch is `promote` instead: promotions are catalog updates, and a spark-submit (a
    JVM start, ten seconds or more) would start no Spark job anyway."""
    from iox_planner.catalog.store import Catalog
    from iox_planner.ingest.compact import PartitionPlan, describe_plan, dry_run

    catalog = Catalog()
    work: list[tuple[int, str, int]] = []
    try:
        catalog.require_schema()
        with catalog.engine.connect() as conn:
            names = list(settings.compact_databases) or catalog.database_names(conn)
        for db in names:
            for item in dry_run(catalog, db):
                print(f"{db}: " + "\n".join(describe_plan(item)))
                if isinstance(item, PartitionPlan):  # promotions only: a batch member costing no Spark task
                    work.append((item.rows_in, db, item.partition_id))
    finally:
        catalog.dispose()
    if not work:
        print("nothing to compact")
        return Batches([], [])
    # Partitions needing promotions only (no rows to rewrite) cost a batch no Spark task: they ride along with the
    # others and make no extra spark-submit of their own.
    count = min(settings.max_spark_jobs, max(1, sum(1 for rows, _, _ in work if rows > 0)))
    loads = [0] * count
    members: list[dict[str, list[int]]] = [{} for _ in range(count)]
    for rows, db, pid in sorted(work, reverse=True):
        i = loads.index(min(loads))
        loads[i] += rows
        members[i].setdefault(db, []).append(pid)
    folder = report_folder(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, group in enumerate(members):
        args = ["--metrics", str(folder / f"batch-{i}.json")]
        for db, pids in sorted(group.items()):
            args += ["--target", f"{db}={','.join(str(p) for p in sorted(pids))}"]
        out.append(args)
    if not any(rows > 0 for rows, _, _ in work):
        print(f"{len(work)} partition(s) to compact, promotions only: no Spark job")
        return Batches([], out[0])
    print(f"{len(work)} partition(s) to compact in {count} Spark job(s)")
    return Batches(out, [])


def promote_batch(args: list[str]) -> dict[str, Any]:
    """Run a promotions-only batch in this process (`batch_args`' `promote`): each partition's promotions as
    `iox-batch compact` makes them (its compaction lock, one catalog transaction), the report written where a
    spark-submit batch writes its own (the same `run_compact.compact_batch`). A partition that needs a rewrite by
    now (a persist since `find_work`) promotes what it can and its rewrite waits for the next run: this task
    starts no Spark job."""
    import sys

    from spark_jobs.run_compact import compact_batch, parse_target

    targets: list[tuple[str, list[int] | None]] = [
        parse_target(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--target"]
    return compact_batch(targets, Path(args[args.index("--metrics") + 1]), _no_spark, rewrites=False,
                         log=sys.stdout)


def _no_spark(tasks: Any, root: Any) -> Any:
    from iox_planner.errors import InternalError

    if tasks:  # compact(rewrites=False) plans no slice
        raise InternalError(f"a promotions-only batch planned {len(tasks)} slice(s) to rewrite")
    return []


def sum_reports(batches: list[list[str]], promote: list[str] | None = None) -> dict[str, Any]:
    """The run's report: the batches' totals (and the promotions-only batch's) summed and printed. A batch without
    a report failed: the run fails after reporting the others (their swaps are done and stay)."""
    from iox_planner.errors import IoxError
    from iox_planner.ingest.compact import outcome_note

    keys = ("partitions", "skipped", "files_in", "files_out", "rows_in", "rows_out", "duplicates_removed",
            "files_promoted", "rows_promoted")
    total = dict.fromkeys(keys, 0)
    failed = []
    for args in [*batches, *([promote] if promote else [])]:
        path = Path(args[args.index("--metrics") + 1])
        if not path.is_file():
            failed.append(path.stem)
            continue
        data = json.loads(path.read_text())
        for k in keys:
            total[k] += int(data[k])
        for o in data["outcomes"]:
            note = outcome_note(o)
            if note is not None:
                print(note)
    print(f"compacted {total['partitions']} partition(s): {total['files_in']} file(s) in, {total['files_out']} out; "
          f"{total['rows_in']:,} rows in, {total['rows_out']:,} out; {total['duplicates_removed']:,} duplicates "
          f"removed; {total['files_promoted']} file(s) ({total['rows_promoted']:,} rows) promoted to L1 in place, "
          f"not rewritten; {total['skipped']} skipped")
    if failed:
        raise IoxError(f"compaction batch(es) {', '.join(failed)} failed (see their task logs); their partitions "
                       "are as before and the next run retries them")
    return total
