"""`iox-batch materialized status|refresh`: which materialized intervals are stale because data arrived after they
ran, and recomputing exactly those by hand (no scheduler needed). The definitions and the refresh steps are the
run domain's (`iox_planner.runs.definitions`, `refresh`), the same ones `iox_refresh` calls, so the CLI and the DAG
cannot drift apart; the CLI only chooses how Spark runs (IOX_RUNNER, `spark_jobs/launch.py` `launcher`)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from typing import Any

from iox_planner.errors import BadInputError
from iox_planner.runs import refresh as refresh_mod
from iox_planner.runs.definitions import MaterializedQuery, load_definitions
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunIdentity
from iox_planner.timeutil import format_time, parse_range
from iox_planner.spark.launch import Launcher


def _definitions(name: str | None) -> list[MaterializedQuery]:
    found = load_definitions(RunSettings.from_env().materialized_dir)
    if name is not None:
        found = [refresh_mod.pick(found, name)]
    return found


def status(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.catalog.store import open_catalog

    chosen = _definitions(args.name)
    with open_catalog() as catalog:
        report = [refresh_mod.status(catalog, d) for d in chosen]
    if args.format == "json":
        doc = {"definitions": [r.as_json(args.stale_only) for r in report]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    from iox_planner.output.terminal import PlainTable

    for r in report:
        table = PlainTable(title=f"{r.name} (database {r.db}): {len(r.stale)} stale", title_justify="left")
        for column in ("interval start", "interval end", "state", "why"):
            table.add_column(column)
        for i in (r.stale if args.stale_only else r.intervals):
            why = "; ".join(i.reasons)
            if i.error:
                why = (why + "; " if why else "") + f"last run failed: {i.error}"
            table.add_row(format_time(i.start), format_time(i.end), i.state, why or "-")
        if not args.stale_only:
            for lo, hi, n in r.never_run:
                table.add_row(format_time(lo), format_time(hi), "never run", f"{n} interval(s)")
        console.print(table)
    return 0


def refresh(args: argparse.Namespace, console: Any, err: Any) -> int:
    from iox_planner.catalog.store import open_catalog

    lo, hi = parse_range(args.from_, args.to, start_what="--from", end_what="--to")
    settings = RunSettings.from_env()
    every = load_definitions(settings.materialized_dir)
    refresh_mod.pick(every, args.name)
    # The definition, then whatever reads its registered table, in chain order: a rollup of a rollup goes stale
    # only once its parent's intervals are re-registered, so each level's stale intervals are found after the
    # level before has been refreshed.
    chain = refresh_mod.with_dependants(every, args.name)
    runner = _Runner("refresh", settings)
    failed = refreshed = 0
    with open_catalog() as catalog:
        for level in refresh_mod.refresh_levels(chain):
            for definition in level:
                # The named definition honours --from/--to; its dependants refresh whatever went stale.
                window = (lo, hi) if definition.name == args.name else (None, None)
                todo = [i for i in refresh_mod.status(catalog, definition, start=window[0], end=window[1]).intervals
                        if refresh_mod.needs_refresh(i)]
                if args.dry_run:
                    for state in todo:
                        when = f"[{format_time(state.start)}, {format_time(state.end)})"
                        console.print(f"would refresh {definition.name} {when}: {'; '.join(state.reasons)}")
                    if todo:
                        console.print(f"(dependants of {definition.name} may go stale once it is refreshed)")
                    continue
                ok, bad = runner.run_all(definition, [(i.start, i.end) for i in todo], console, err, "refreshed")
                refreshed += ok
                failed += bad
    if args.dry_run:
        return 0
    if failed:
        raise BadInputError(f"{failed} interval(s) failed to refresh and stay stale with their old output "
                            f"({refreshed} refreshed); see the messages above")
    console.print(f"{refreshed} interval(s) refreshed" if refreshed else "nothing is stale")
    return 0


class _Runner:
    """Runs intervals one by one through `refresh_mod.refresh_interval` (the plan, commit, lock and record of an
    Airflow run), as `iox-batch` runs identified by the user, host and process; the launcher is chosen at the first
    interval run (IOX_RUNNER, `spark_jobs/launch.py` `launcher`)."""

    def __init__(self, kind: str, settings: RunSettings) -> None:
        self.kind = kind
        self.settings = settings
        self.who = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        self.launch: Launcher | None = None

    def run(self, definition: MaterializedQuery, start: int, end: int) -> refresh_mod.RefreshResult:
        if self.launch is None:
            from spark_jobs.launch import launcher

            self.launch = launcher()
        run = RunIdentity("iox-batch", f"{self.kind}:{definition.name}:{format_time(start)}:{self.who}")
        return refresh_mod.refresh_interval(definition, start, end, run, self.settings, launcher=self.launch)

    def run_all(self, definition: MaterializedQuery, intervals: list[tuple[int, int]], console: Any, err: Any,
                done: str) -> tuple[int, int]:
        """`intervals` of `definition` through `refresh_mod.run_intervals`: each result on `console`, progress of
        a long run on `err`. Returns (published, failed)."""
        return refresh_mod.run_intervals(
            definition, intervals, lambda start, end: self.run(definition, start, end), self.settings,
            report=lambda result: console.print(refresh_mod.describe(result, done)), progress=err.print)


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    """`iox-batch materialized run NAME --from T --to T`: publish every scheduled interval of NAME lying within
    [T, T) that has ended, never-run, fresh or stale alike (a backfill without a scheduler), oldest first. An
    interval's own failure (another run holds its lock, its query fails on its data) fails it alone and the others
    go on; any other failure stops the command at once (`refresh_mod.run_intervals`)."""
    import datetime as dt

    lo, hi = parse_range(args.from_, args.to, start_what="--from", end_what="--to")
    settings = RunSettings.from_env()
    definition = refresh_mod.pick(load_definitions(settings.materialized_dir), args.name)
    now = dt.datetime.now(dt.timezone.utc)
    todo = [(a, b) for a, b in refresh_mod.scheduled_intervals(definition, now)
            if (lo is None or lo <= a) and (hi is None or b <= hi)]
    if not todo:
        raise BadInputError(f"no scheduled interval of {definition.name} ({definition.cron}, from "
                            f"{definition.start_date:%Y-%m-%dT%H:%M:%SZ}) lies within [{args.from_}, {args.to}) "
                            "and has ended; nothing was run")
    _, failed = _Runner("run", settings).run_all(definition, todo, console, err, "published")
    if failed:
        raise BadInputError(f"{failed} of {len(todo)} interval(s) failed and published nothing; see the messages "
                            "above (rerun the same command: published intervals are simply published again)")
    console.print(f"{len(todo)} interval(s) published")
    return 0
