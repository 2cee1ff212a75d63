"""Stale materialized intervals, and recomputing exactly those: what `iox-batch materialized status|refresh` and
the `iox_refresh` DAG share. No Airflow import: plain functions of definitions and the catalog.

- `status`: per definition, every interval it has materialized (fresh, or stale and why: catalog/freshness.py),
  the intervals whose latest run failed, and the scheduled intervals never run (as ranges).
- `refresh_levels`: definitions in refresh order. A definition that reads another's `register_as` table comes
  after it (its intervals go stale when that table's intervals are re-registered), so a chain refreshes parents
  first; definitions in one level are independent.
- `refresh_interval`: one interval through the same plan and commit steps as a materialize run (planning.py,
  commit.py): run lock, atomic publication, `register_as` replacing the interval, and what it read recorded in the
  publishing transaction. A failure publishes nothing, so the old output and its stale mark stay. Its Spark jobs
  run through the launcher the caller passes (`iox_planner/spark/launch.py`): this module starts no Spark itself.
- `run_intervals`: many intervals of one definition, one by one (`iox-batch materialized run|refresh`): an
  interval's own failure (its lock held, its query failing on its data) lets the others go on; a failure that is
  not its own (the database unknown, the definition unable to plan, the catalog or Spark unreachable) stops the
  whole command at once, as does asking for more intervals than IOX_MAX_RUN_INTERVALS.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from iox_planner.errors import BadInputError, IoxError, RunFailed, error_for_status
from iox_planner.timeutil import format_time

from iox_planner.spark.launch import Launcher

from iox_planner.runs.definitions import MaterializedQuery, to_ns
from iox_planner.runs.planning import PlanOutcome
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunIdentity

MAX_SCHEDULED = 1_000_000  # intervals one status walks through, at most (a minutely schedule over two years)
PROGRESS_EVERY_S = 10.0
"""A long `run_intervals` says how far it got at most this often (a short one says nothing)."""
UNAVAILABLE = 75
"""The exit status of a catalog or Spark that could not be reached (errors.py): no interval's own failure."""


@dataclass(frozen=True)
class IntervalState:
    start: int
    end: int
    state: str
    """stale (data arrived after the published output was computed; `error` if a rerun since failed) | fresh |
    failed (the newest run failed; `materialized`: an older output is still published) | running"""
    reasons: tuple[str, ...] = ()
    late: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    materialized: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"start": format_time(self.start), "end": format_time(self.end), "state": self.state,
                "materialized": self.materialized, "reasons": list(self.reasons), "late": list(self.late),
                "error": self.error}


@dataclass(frozen=True)
class DefinitionStatus:
    name: str
    db: str
    intervals: tuple[IntervalState, ...]
    never_run: tuple[tuple[int, int, int], ...] = ()
    """Scheduled intervals without a run: (first start, last end, how many), consecutive ones merged."""

    @property
    def stale(self) -> list[IntervalState]:
        return [i for i in self.intervals if i.state == "stale"]

    def as_json(self, stale_only: bool = False) -> dict[str, Any]:
        shown = self.stale if stale_only else list(self.intervals)
        out: dict[str, Any] = {"name": self.name, "db": self.db, "intervals": [i.as_json() for i in shown],
                               "stale": len(self.stale)}
        if not stale_only:
            out["never_run"] = [{"start": format_time(a), "end": format_time(b), "intervals": n}
                                for a, b, n in self.never_run]
        return out


def scheduled_intervals(definition: MaterializedQuery, now: dt.datetime) -> Iterable[tuple[int, int]]:
    """The definition's data intervals from its start date up to `now` (and its end date), as Airflow's cron data
    interval timetable makes them: [tick, next tick)."""
    stop = min(now, definition.end_date) if definition.end_date else now
    ticks = definition.ticks()
    start = ticks.get_next(dt.datetime)
    for _ in range(MAX_SCHEDULED):
        end = ticks.get_next(dt.datetime)
        if end > stop:
            return
        yield to_ns(start), to_ns(end)
        start = end


UNTRACKED = ("materialized before iox-batch recorded what runs read (catalog migration 0006); refresh it once "
             "so that late data can be noticed")


def status(catalog: Any, definition: MaterializedQuery, *, now: dt.datetime | None = None,
           start: int | None = None, end: int | None = None, never_run: bool = True) -> DefinitionStatus:
    """Every interval of one definition: fresh or stale (and why), failed, running; the scheduled ones never run."""
    from iox_planner.catalog import freshness

    now = now or dt.datetime.now(dt.timezone.utc)
    with catalog.engine.connect() as conn:
        done = freshness.materialized_intervals(conn, definition.name, start, end)
        stale = freshness.stale_reads(conn, definition.name, start, end)
        last = freshness.last_runs(conn, definition.name, start, end)
    states: list[IntervalState] = []
    for key in sorted(set(done) | set(last)):
        run = last.get(key)
        late = stale.get(key, [])
        reasons = tuple(d.describe() for d in late)
        detail = tuple({"db": d.db, "table": d.table, "chunks": d.chunks, "rows": d.rows,
                        "partitions": list(d.partitions), "dropped": d.dropped,
                        "table_dropped": d.table_dropped} for d in late)
        # A newest run that did not publish leaves the output (if any) of an older run, judged by what that one
        # read: stale stays stale (with the failure shown), a fresh or missing output shows the failure.
        error = run.error if run is not None and run.status == "failed" else None
        if key in done and late:
            states.append(IntervalState(key[0], key[1], "stale", reasons, detail, error))
        elif run is not None and run.status in ("failed", "running"):
            states.append(IntervalState(key[0], key[1], run.status, (), (), error, key in done))
        elif key in done:
            states.append(IntervalState(key[0], key[1], "fresh"))
        elif run is not None and run.status == "success":
            # Published before the catalog recorded what runs read (migration 0006): its inputs cannot be checked,
            # so it counts as stale until one refresh records them.
            states.append(IntervalState(key[0], key[1], "stale", (UNTRACKED,), ()))
    never: list[tuple[int, int, int]] = []
    seen = set(done) | set(last)
    for lo, hi in (scheduled_intervals(definition, now) if never_run else ()):
        if (start is not None and hi <= start) or (end is not None and lo >= end) or (lo, hi) in seen:
            continue
        if never and never[-1][1] == lo:
            never[-1] = (never[-1][0], hi, never[-1][2] + 1)
        else:
            never.append((lo, hi, 1))
    return DefinitionStatus(definition.name, definition.db, tuple(states), tuple(never))


def needs_refresh(state: IntervalState) -> bool:
    """Stale intervals (a failed refresh leaves its interval stale, so it is tried again)."""
    return state.state == "stale"


# --- order ---------------------------------------------------------------------------------------------------------


def depends_on(child: MaterializedQuery, parent: MaterializedQuery) -> bool:
    """Whether `child` reads `parent`'s registered table. Read from the SQL text without parsing it (the DAG file
    calls this at parse time): any word equal to the table name counts, so a column of that name adds an edge too.
    Such an extra edge only orders two refreshes that need no order; what is stale is decided by what runs read."""
    target = parent.register_as
    if target is None or child.name == parent.name or (target.db or parent.db) != child.db:
        return False
    return re.search(rf"(?<![\w$]){re.escape(target.table)}(?![\w$])", child.sql) is not None


def refresh_levels(definitions: Sequence[MaterializedQuery]) -> list[list[MaterializedQuery]]:
    """Definitions in refresh order: level k reads only tables registered by levels below k. Definitions caught in
    a cycle of registered tables (a misconfiguration) go last, together."""
    remaining = {d.name: d for d in definitions}
    parents = {d.name: {p.name for p in definitions if depends_on(d, p)} for d in definitions}
    levels: list[list[MaterializedQuery]] = []
    done: set[str] = set()
    while remaining:
        ready = sorted((n for n in remaining if parents[n] <= done))
        if not ready:
            levels.append([remaining[n] for n in sorted(remaining)])
            break
        levels.append([remaining[n] for n in ready])
        done.update(ready)
        for n in ready:
            del remaining[n]
    return levels


def pick(definitions: Sequence[MaterializedQuery], name: str) -> MaterializedQuery:
    found = [d for d in definitions if d.name == name]
    if not found:
        known = ", ".join(sorted(d.name for d in definitions)) or "none"
        raise BadInputError(f"no materialized query named {name!r} (definitions: {known})")
    return found[0]


def with_dependants(definitions: Sequence[MaterializedQuery], name: str) -> list[MaterializedQuery]:
    """`name` and every definition reading its registered table, directly or down a chain."""
    chosen = {pick(definitions, name).name}
    grew = True
    while grew:
        grew = False
        for d in definitions:
            if d.name not in chosen and any(depends_on(d, p) for p in definitions if p.name in chosen):
                chosen.add(d.name)
                grew = True
    return [d for d in definitions if d.name in chosen]


# --- recomputing one interval -----------------------------------------------------------------------------------------


@dataclass
class RefreshResult:
    definition: str
    start: int
    end: int
    ok: bool
    rows: int = 0
    spark_jobs: int = 0
    """Spark jobs run (0 when one of them failed)."""
    error: str | None = None
    registered: dict[str, Any] | None = field(default=None)
    exit_code: int = 0
    """The failure's exit status (errors.py; 0: none)."""


def refresh_interval(definition: MaterializedQuery, start: int, end: int, run: RunIdentity,
                     settings: RunSettings, *, launcher: Launcher,
                     holder_state: Callable[[str, str], str] | None = None) -> RefreshResult:
    """Recompute [start, end) of `definition` and publish it like a materialize run would, its Spark jobs run by
    `launcher` (`iox_refresh`: Spark Connect under IOX_RUNNER=connect, else spark-submit; `iox-batch
    materialized refresh`: the one IOX_RUNNER names). Returns what happened; a failure has been recorded (run
    failed, nothing published) and is in the result.
    `holder_state`: as for `planning.plan` (in a task: `ti.get_dagrun_state`)."""
    from iox_planner.runs.commit import commit
    from iox_planner.runs.failure import fail
    from iox_planner.runs.planning import plan

    request = definition.request(_dt(start), _dt(end), settings)
    try:
        outcome = plan(request, run, settings, holder_state=holder_state)
    except RunFailed as err:
        return RefreshResult(definition.name, start, end, False, error=str(err), exit_code=err.exit_code)
    try:
        jobs = run_jobs(outcome, launcher)
    except BaseException as err:
        # Whatever stopped the job: the run is recorded failed, its lock released, its staging removed.
        reason = str(err) if isinstance(err, IoxError) else f"internal error while running Spark: {err!r}"
        message = fail(request, run, outcome.handle(), reason)
        if not isinstance(err, IoxError):
            raise
        return RefreshResult(definition.name, start, end, False, error=message, exit_code=err.exit_code)
    try:
        done = commit(request, run, outcome.handle())
    except RunFailed as err:
        return RefreshResult(definition.name, start, end, False, spark_jobs=jobs, error=str(err),
                             exit_code=err.exit_code)
    return RefreshResult(definition.name, start, end, True, done.rows, jobs, registered=done.registered)


def check_definition(definition: MaterializedQuery, start: int, end: int, settings: RunSettings) -> None:
    """What every interval of `definition` needs, checked on [start, end) without recording a run: the database
    exists, the query plans against the catalog, the output lies under the output roots, the `register_as` target
    is its own (planning.py `checked_plan`). A failure here is no interval's own."""
    from iox_planner.catalog.store import open_catalog
    from iox_planner.runs.planning import checked_plan

    with open_catalog() as catalog:
        checked_plan(catalog, definition.request(_dt(start), _dt(end), settings), settings)


def run_intervals(definition: MaterializedQuery, intervals: Sequence[tuple[int, int]],
                  run_one: Callable[[int, int], RefreshResult], settings: RunSettings, *,
                  report: Callable[[RefreshResult], None],
                  progress: Callable[[str], None] | None = None) -> tuple[int, int]:
    """Run each of `intervals` (oldest first) with `run_one`, `report`ing each result; returns (published,
    failed). An interval's own failure lets the others go on. Stopped at once, with one paragraph naming how far
    it got: more intervals than `settings.max_run_intervals` (before any runs); a definition that fails its check
    (`check_definition`, before the first interval and again after a failure: a database dropped meanwhile, say);
    a catalog or Spark that could not be reached. A long run says how far it got on `progress`."""
    total = len(intervals)
    if total > settings.max_run_intervals:
        raise BadInputError(f"{definition.name}: {total:,} intervals to run, more than the "
                            f"{settings.max_run_intervals:,} one command takes (IOX_MAX_RUN_INTERVALS); nothing was "
                            "run: narrow --from/--to, or raise IOX_MAX_RUN_INTERVALS")
    ok = failed = 0

    def stop(cause: IoxError) -> IoxError:
        done = f"after {ok + failed:,} of {total:,} interval(s) ({ok:,} published, {failed:,} failed)"
        return error_for_status(cause.exit_code, f"{definition.name}: stopped {done} by a failure that is not "
                                                 f"any interval's own: {cause}")

    def check(start: int, end: int) -> None:
        try:
            check_definition(definition, start, end, settings)
        except IoxError as err:
            raise stop(err) from err

    if intervals:
        check(*intervals[0])
    shown = time.monotonic()
    for start, end in intervals:
        result = run_one(start, end)
        report(result)
        ok += result.ok
        failed += not result.ok
        if not result.ok:
            if result.exit_code == UNAVAILABLE:
                raise stop(error_for_status(UNAVAILABLE, result.error or "unreachable"))
            check(start, end)
        if progress is not None and time.monotonic() - shown >= PROGRESS_EVERY_S and ok + failed < total:
            shown = time.monotonic()
            progress(f"{definition.name}: {ok + failed:,} of {total:,} interval(s) done ({failed:,} failed)")
    return ok, failed


def run_jobs(outcome: PlanOutcome, launcher: Launcher) -> int:
    """A planned run's Spark jobs one after the other, then its merge (when fanned out), through `launcher`: what
    the DAG's run and merge tasks do, in this process's task. Each job carries the run's budget and leaves its
    report in the run's staging folder for the commit step. Returns how many jobs ran."""
    for job in outcome.jobs:
        launcher.run(job)
    if outcome.merge is not None:
        launcher.run(outcome.merge)
    return len(outcome.jobs) + (outcome.merge is not None)


def _dt(ns: int) -> dt.datetime:
    seconds, rest = divmod(ns, 10**9)
    if rest:
        raise BadInputError(f"interval bound {ns} is not a whole second")
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def describe(result: RefreshResult, done: str = "refreshed") -> str:
    when = f"[{format_time(result.start)}, {format_time(result.end)})"
    if result.ok:
        return f"{result.definition} {when}: {done}, {result.rows} rows ({result.spark_jobs} Spark job(s))"
    return f"{result.definition} {when}: FAILED, old output (if any) kept: {result.error}"
