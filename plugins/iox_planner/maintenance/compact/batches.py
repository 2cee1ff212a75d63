"""A compaction run cut into batches (the `iox_compact` DAG's): the partitions that need work split into at most
a given number of Spark batches of about equal rows, or one in-process batch of promotions when none needs a
rewrite; one batch run (`compact_batch`, the body of the compaction job `spark_jobs/compact_job.py` and of the
promotions-only batch); and the batches' reports summed. Each batch's report lies at its `Batch.report`."""

from __future__ import annotations

import functools
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

from iox_planner import storage
from iox_planner.catalog.names import check_db_name
from iox_planner.catalog.store import open_catalog
from iox_planner.config import state_dir
from iox_planner.errors import BadInputError, InternalError, IoxError
from iox_planner.maintenance.compact.plan import PartitionPlan, dry_run
from iox_planner.maintenance.compact.report import Report, describe_plan, outcome_note, report_dict
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.slices import SliceResult, SliceRunner, SliceTask
from iox_planner.objectstore import Root

Target = tuple[str, tuple[int, ...]]
"""A database and the ids of its partitions a batch compacts."""


@dataclass(frozen=True)
class Batch:
    """One batch: where its report goes, and what it compacts."""

    report: Path
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Batches:
    """What the DAG's `find_work` task hands on: the batches to run on Spark, or the one in-process batch of
    promotions (None when there is none)."""

    spark: list[Batch]
    promote: Batch | None


def report_folder(run_id: str) -> Path:
    """Where the batches of one DAG run (`run_id`) write their reports: under the project's state folder."""
    return state_dir() / "compact" / re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:200]


def plan_batches(databases: Sequence[str], max_jobs: int, folder: Path,
                 only: Mapping[str, Sequence[int]] | None = None) -> Batches:
    """The batches of a run, each batch's report in `folder`. `only`: just these partitions of these databases (a
    compaction request's, `parse_requests`). Partitions of `databases` (none: every database) go to the batch with
    the fewest rows so far, largest first, so batches take about equal time; at most `max_jobs` batches. When no
    partition needs a rewrite, the one batch is `promote` instead: promotions are catalog updates, and a
    spark-submit (a JVM start, ten seconds or more) would start no Spark job anyway."""
    work: list[tuple[int, str, int]] = []
    with open_catalog() as catalog:
        with catalog.engine.connect() as conn:
            known = catalog.database_names(conn)
        names = list(databases) or known
        if only is not None:
            for db in sorted(set(only) - set(known)):
                print(f"{db}: compaction was requested, but the database no longer exists")
            # Only the databases this DAG compacts (IOX_COMPACT_DATABASES): a request does not widen them.
            names = sorted(set(only) & set(names) & set(known))
        for db in names:
            for item in dry_run(catalog, db, only=None if only is None else list(only[db])):
                print(f"{db}: " + "\n".join(describe_plan(item)))
                if isinstance(item, PartitionPlan):  # promotions only: a batch member costing no Spark task
                    work.append((item.rows_in, db, item.partition_id))
    if not work:
        print("nothing to compact")
        return Batches([], None)
    # Partitions needing promotions only (no rows to rewrite) cost a batch no Spark task: they ride along with the
    # others and make no extra spark-submit of their own.
    count = min(max_jobs, max(1, sum(1 for rows, _, _ in work if rows > 0)))
    loads = [0] * count
    members: list[dict[str, list[int]]] = [{} for _ in range(count)]
    for rows, db, pid in sorted(work, reverse=True):
        i = loads.index(min(loads))
        loads[i] += rows
        members[i].setdefault(db, []).append(pid)
    folder.mkdir(parents=True, exist_ok=True)
    out = [Batch(folder / f"batch-{i}.json", tuple((db, tuple(sorted(pids))) for db, pids in sorted(group.items())))
           for i, group in enumerate(members)]
    if not any(rows > 0 for rows, _, _ in work):
        print(f"{len(work)} partition(s) to compact, promotions only: no Spark job")
        return Batches([], out[0])
    print(f"{len(work)} partition(s) to compact in {count} Spark job(s)")
    return Batches(out, None)


MAX_REQUESTED_PARTITIONS = 10_000
"""At most this many partitions in one run's compaction requests: an event's extra is input like any other."""


def request_extra(targets: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """A compaction request as an Airflow asset event's extra (plain JSON): `{"targets": {db: [ids]}}`."""
    return {"targets": {db: sorted(set(ids)) for db, ids in sorted(targets.items()) if ids}}


def parse_requests(extras: Sequence[Any]) -> dict[str, list[int]]:
    """The partitions the compaction requests ask for (`request_extra`'s form, several events merged), checked:
    database names as `check_db_name` allows, partition ids positive integers, at most
    `MAX_REQUESTED_PARTITIONS` in all. Anything else is refused whole, in one paragraph."""
    out: dict[str, set[int]] = {}
    for extra in extras:
        targets = extra.get("targets") if isinstance(extra, Mapping) else None
        if not isinstance(targets, Mapping):
            raise BadInputError('a compaction request is not {"targets": {DB: [PARTITION_ID, ...]}}')
        for db, ids in targets.items():
            if not isinstance(db, str):
                raise BadInputError("a compaction request names a database that is not a string")
            check_db_name(db)
            if not isinstance(ids, list) or not all(type(i) is int and i >= 1 for i in ids):
                raise BadInputError(f"a compaction request for database {db!r} does not list positive partition "
                                    "ids")
            out.setdefault(db, set()).update(ids)
            if sum(len(v) for v in out.values()) > MAX_REQUESTED_PARTITIONS:
                raise BadInputError(f"the compaction requests name more than {MAX_REQUESTED_PARTITIONS:,} "
                                    "partitions")
    return {db: sorted(ids) for db, ids in sorted(out.items())}


def compact_batch(targets: Sequence[tuple[str, Sequence[int] | None]], run_slices: SliceRunner, *,
                  table: str | None = None, partition: str | None = None, rewrites: bool = True,
                  progress: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """One batch: compact each target database's partitions (None: whatever of it needs compaction; `run.compact`,
    with `run_slices` for the rewrites; `rewrites=False`: promotions only). Returns the batch's report
    (`report_dict`). Progress lines go to `progress(db, line)` (default: standard error, each after its
    database)."""
    say = progress or (lambda db, line: _say(sys.stderr, db, line))
    total = Report()
    with open_catalog() as catalog:
        for db, pids in targets:
            report = compact(catalog, db, run_slices, only=None if pids is None else list(pids), table=table,
                             partition=partition, rewrites=rewrites, progress=functools.partial(say, db))
            total.outcomes.extend(report.outcomes)
    return report_dict(total)


def _say(out: IO[str], db: str, line: str) -> None:
    print(f"{db}: {line}", file=out, flush=True)


def promote_batch(batch: Batch) -> dict[str, Any]:
    """Run a promotions-only batch in this process (`plan_batches`' `promote`): each partition's promotions as
    `iox-batch compact` makes them (its compaction lock, one catalog transaction), the report written where a
    Spark batch writes its own. A partition that needs a rewrite by now (a persist since `plan_batches`) promotes
    what it can and its rewrite waits for the next run: this starts no Spark job."""
    # A report left by an earlier try of this batch (a cleared task) must not stand for this one if it fails.
    batch.report.unlink(missing_ok=True)
    data = compact_batch(batch.targets, _no_spark, rewrites=False,
                         progress=lambda db, line: _say(sys.stdout, db, line))
    storage.write_json_atomic(data, batch.report)
    return data


def _no_spark(tasks: Sequence[SliceTask], root: Root) -> Sequence[SliceResult]:
    if tasks:  # compact(rewrites=False) plans no slice
        raise InternalError(f"a promotions-only batch planned {len(tasks)} slice(s) to rewrite")
    return []


def sum_reports(reports: Sequence[Path]) -> dict[str, Any]:
    """The run's report: the batches' totals (every batch's report, the promotions-only batch's included) summed
    and printed. A batch without a report failed: the run fails after reporting the others (their swaps are done
    and stay)."""
    keys = ("partitions", "skipped", "files_in", "files_out", "rows_in", "rows_out", "duplicates_removed",
            "files_promoted", "rows_promoted")
    total = dict.fromkeys(keys, 0)
    failed = []
    for path in reports:
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
