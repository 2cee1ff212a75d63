"""`iox-batch materialized status|refresh`: which materialized intervals are stale because data arrived after they
ran, and recomputing exactly those by hand (no scheduler needed). The definitions and the refresh steps are the
run domain's (`iox_planner.runs.definitions`, `refresh`), the same ones `iox_refresh` calls, so the CLI and the DAG
cannot drift apart; the CLI only chooses how Spark runs (IOX_RUNNER, cli/runner.py `staged_runner`)."""

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
from iox_planner.runs.settings import AirflowSettings
from iox_planner.runs.staging import RunIdentity
from iox_planner.timeutil import format_time, parse_time


def _definitions(name: str | None) -> list[MaterializedQuery]:
    found = load_definitions(AirflowSettings.from_env().materialized_dir)
    if name is not None:
        found = [refresh_mod.pick(found, name)]
    return found


def status(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.catalog.store import Catalog

    chosen = _definitions(args.name)
    catalog = Catalog()
    catalog.require_schema()
    try:
        report = [refresh_mod.status(catalog, d) for d in chosen]
    finally:
        catalog.dispose()
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


def refresh(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.catalog.store import Catalog

    settings = AirflowSettings.from_env()
    every = load_definitions(settings.materialized_dir)
    refresh_mod.pick(every, args.name)
    lo = parse_time(args.from_, what="--from") if args.from_ else None
    hi = parse_time(args.to, what="--to") if args.to else None
    if lo is not None and hi is not None and lo >= hi:
        raise BadInputError(f"--from {args.from_} is not before --to {args.to}")
    # The definition, then whatever reads its registered table, in chain order: a rollup of a rollup goes stale
    # only once its parent's intervals are re-registered, so each level's stale intervals are found after the
    # level before has been refreshed.
    chain = refresh_mod.with_dependants(every, args.name)
    catalog = Catalog()
    catalog.require_schema()
    run_spark: refresh_mod.RunSpark | None = None  # chosen at the first interval to run (IOX_RUNNER)
    who = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
    failed = refreshed = 0
    try:
        for level in refresh_mod.refresh_levels(chain):
            for definition in level:
                # The named definition honours --from/--to; its dependants refresh whatever went stale.
                window = (lo, hi) if definition.name == args.name else (None, None)
                todo = [i for i in refresh_mod.status(catalog, definition, start=window[0], end=window[1]).intervals
                        if refresh_mod.needs_refresh(i)]
                for state in todo:
                    when = f"[{format_time(state.start)}, {format_time(state.end)})"
                    if args.dry_run:
                        console.print(f"would refresh {definition.name} {when}: {'; '.join(state.reasons)}")
                        continue
                    if run_spark is None:
                        from iox_planner.cli.runner import staged_runner

                        run_spark = staged_runner()
                    run = RunIdentity("iox-batch", f"refresh:{definition.name}:{format_time(state.start)}:{who}")
                    result = refresh_mod.refresh_interval(definition, state.start, state.end, run, settings,
                                                          run_spark=run_spark)
                    console.print(refresh_mod.describe(result))
                    refreshed += result.ok
                    failed += not result.ok
                if args.dry_run and todo:
                    console.print(f"(dependants of {definition.name} may go stale once it is refreshed)")
    finally:
        catalog.dispose()
    if args.dry_run:
        return 0
    if failed:
        raise BadInputError(f"{failed} interval(s) failed to refresh and stay stale with their old output "
                            f"({refreshed} refreshed); see the messages above")
    console.print(f"{refreshed} interval(s) refreshed" if refreshed else "nothing is stale")
    return 0
