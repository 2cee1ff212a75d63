"""`iox-batch materialized status|refresh`: which materialized intervals are stale because data arrived after they
ran, and recomputing exactly those by hand (no scheduler needed). The definitions and the refresh steps are the
DAGs' own (`dags/iox_airflow/definitions.py`, `refresh.py`), imported from the project's dags/ folder, so the CLI
and `iox_refresh` cannot drift apart."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from typing import Any

from iox_planner.config import project_root
from iox_planner.errors import BadInputError
from iox_planner.timeutil import format_time, parse_time


def _airflow_side() -> tuple[Any, Any, Any]:
    """The definitions, settings and refresh modules of dags/iox_airflow (plain Python: no Airflow import)."""
    dags = str(project_root() / "dags")
    if dags not in sys.path:
        sys.path.append(dags)
    from iox_airflow import definitions, refresh, settings  # type: ignore[import-not-found]  # dags/, not installed

    return definitions, refresh, settings.AirflowSettings.from_env()


def _definitions(name: str | None) -> tuple[list[Any], Any, Any]:
    definitions, refresh, settings = _airflow_side()
    found = definitions.load_definitions(settings.materialized_dir)
    if name is not None:
        found = [refresh.pick(found, name)]
    return found, refresh, settings


def status(args: argparse.Namespace, console: Any) -> int:
    from iox_planner.catalog.store import Catalog

    chosen, refresh, _ = _definitions(args.name)
    catalog = Catalog()
    catalog.require_schema()
    try:
        report = [refresh.status(catalog, d) for d in chosen]
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

    definitions, refresh_mod, settings = _airflow_side()
    every = definitions.load_definitions(settings.materialized_dir)
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
    executor = os.environ.get("IOX_RUNNER", "in-process")
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
                    run = refresh_mod.RunIdentity(
                        "iox-batch", f"refresh:{definition.name}:{format_time(state.start)}:{who}")
                    result = refresh_mod.refresh_interval(definition, state.start, state.end, run, settings,
                                                          executor=executor)
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
