"""Query-side commands shared by the CLI and the DAGs: plan (explain) and run (query)."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any, Iterator, Sequence

from iox_planner.errors import BadInputError
from iox_planner.timeutil import parse_range


def plan_from_args(args: argparse.Namespace, timeout_s: int) -> Any:
    """Plan the query the arguments describe, within the query's budget: planning past `timeout_s` ends with the
    budget's error (exit status 124), as a Spark job past it does."""
    from iox_planner.planner.deadline import deadline
    from iox_planner.spark.budget import timeout_error

    with deadline(timeout_s, lambda: timeout_error(timeout_s)):
        return _plan(args)


def _plan(args: argparse.Namespace) -> Any:
    from iox_planner.planner import PlannerSettings, plan_query

    settings = PlannerSettings.from_env(parse_assignments(args.settings, "--set"))
    params = parse_assignments(args.param, "--param")
    from iox_planner.catalog.names import check_name

    for name in params:
        check_name(name, "--param name")
    lo, hi = parse_range(args.time_start, args.time_end)
    since = getattr(args, "changes_since", None)
    if since is not None:
        from iox_planner.catalog.changes import read_watermark

        read_watermark(since)  # its shape before any catalog is open; the catalog checks the rest

    def plan(source: Any) -> Any:
        # Taken before any chunk list (catalog/changes.py): every write inside the window is in every table's list.
        changes = source.change_window(since) if since is not None else None
        return plan_query(args.sql, source, params=params, time_start=lo, time_end=hi, settings=settings,
                          changes=changes)

    if getattr(args, "chunks", None):
        from iox_planner.ingest.scenario import read_scenario, scenario_source

        return plan(scenario_source(read_scenario(args.chunks)))
    if not args.db:
        raise BadInputError("explain needs --db DB (or --chunks SCENARIO.yaml to plan without a catalog)")
    from iox_planner.catalog.store import CatalogSource, open_catalog

    with open_catalog() as catalog:
        return plan(CatalogSource(catalog, args.db))


def explain(args: argparse.Namespace) -> str:
    from iox_planner.planner import render
    from iox_planner.spark.budget import query_timeout_s

    timeout_s = query_timeout_s(args.timeout, "--timeout")  # checked before planning: a bad value costs nothing
    if args.analyze:
        if args.chunks:
            raise BadInputError("--analyze runs the plan, which needs the data: use it with --db, not --chunks")
        if args.format != "tree":
            raise BadInputError("--analyze shows its metrics in the tree format; drop --format or use tree")
        from iox_planner.cli.runner import analyze

        started = time.monotonic()
        plan = plan_from_args(args, timeout_s)
        with _whole_budget(timeout_s):
            return analyze(plan, _left(timeout_s, started))
    return str(render(plan_from_args(args, timeout_s), args.format))


def _left(timeout_s: int, started: float) -> int:
    """What is left of the budget once planning took its share, to the nearest second (budgets are whole
    seconds: rounding up a planning step of 0.1 s would take a whole second off the query), at least one."""
    return max(1, round(timeout_s - (time.monotonic() - started)))


@contextlib.contextmanager
def _whole_budget(timeout_s: int) -> Iterator[None]:
    """The Spark part runs on what planning left of the budget; stopped, it names the budget the user gave."""
    from iox_planner.errors import QueryTimeoutError
    from iox_planner.spark.budget import timeout_error

    try:
        yield
    except QueryTimeoutError as err:
        raise timeout_error(timeout_s) from err


def query(args: argparse.Namespace, console: Any, err: Any) -> int:
    """Plan against the catalog and run on Spark; print or write the result. A changes read then prints the
    watermark to pass next time on standard error (`err`), once the result is out."""
    import sys
    from pathlib import Path

    from iox_planner.output import OutputFormat, shown
    from iox_planner.cli.runner import run
    from iox_planner.spark.budget import query_timeout_s

    fmt = OutputFormat(args.format)
    timeout_s = query_timeout_s(args.timeout, "--timeout")  # checked before planning: a bad value costs nothing
    output = None
    if args.output is not None and fmt is OutputFormat.TABLE:
        raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
    if args.output is not None:
        from iox_planner.output.publish import check_destination

        # Checked before planning and Spark start: a refused path fails in a moment, with nothing run.
        if not args.output.strip():
            raise BadInputError("--output is empty; give a file (csv, jsonl) or folder (parquet) to write, or "
                                "leave --output out to print text formats")
        output = check_destination(args.output, folder=fmt is OutputFormat.PARQUET)
    started = time.monotonic()
    plan = plan_from_args(args, timeout_s)
    with _whole_budget(timeout_s):
        rows = run(plan, fmt, output, sys.stdout, timeout_s=_left(timeout_s, started))
    if output is not None:
        what = f"{rows} rows" if rows >= 0 else "result"
        console.print(f"{what} written to {shown(output)} ({fmt.value})")
    if plan.changes is not None:
        err.print(f"watermark: {plan.changes.watermark}")
    return 0


def parse_assignments(items: Sequence[str], what: str) -> dict[str, str]:
    """`name=value` pairs from repeated options, names taken exactly (` name` is not `name`)."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise BadInputError(f"{what} {item!r} is not NAME=VALUE")
        pairs[name] = value
    return pairs
