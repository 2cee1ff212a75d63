"""The `iox-batch` command: parse arguments, call the library, print. No logic lives only here."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Sequence

from iox_planner import __version__
from iox_planner.errors import BadInputError, IoxError, clip_message
from iox_planner.output.terminal import console, visible

if TYPE_CHECKING:
    from iox_planner.catalog.store import Catalog

# Every string is printed as text (output/terminal.py). `out` carries what a command is for (a table, a plan):
# failing to print it fails the command, which changed nothing. `report` tells what a command that changes
# things did, once it is committed: failing to print that must not make the committed work look failed.
out = console()
report = console(best_effort=True)
err = console(stderr=True, best_effort=True)


# --- commands ------------------------------------------------------------------------------------------------


def cmd_catalog_migrate(args: argparse.Namespace) -> int:
    from iox_planner.catalog.store import open_catalog

    with open_catalog(check_schema=False) as catalog:  # migrating is this command's work
        applied = catalog.migrate()
        version = catalog.schema_version()
    if applied:
        for m in applied:
            report.print(f"applied {m.version:04d}_{m.name}.sql")
    report.print(f"catalog schema at version {version}" + ("" if applied else " (nothing to apply)"))
    return 0


def cmd_write(args: argparse.Namespace) -> int:
    from iox_planner.ingest.blocks import line_blocks, open_input
    from iox_planner.ingest.write import write_line_blocks
    from iox_planner.ingest.lineprotocol import Precision

    if args.spark:
        from iox_planner.cli.runner import bulk_load

        result = bulk_load(args.db, args.file, Precision(args.precision), args.accept_partial, err.print)
        _print_write(result, args.db)
        return 0
    from iox_planner.catalog.store import open_catalog

    # Streamed: the input is read block by block while its chunks are written, never whole.
    stream, source = open_input(args.file)
    try:
        with open_catalog() as catalog:
            result = write_line_blocks(catalog, args.db, line_blocks(stream, source),
                                       precision=Precision(args.precision), accept_partial=args.accept_partial,
                                       source=source)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    _print_write(result, args.db)
    return 0


def _print_write(result: Any, db: str) -> None:
    for chunk in result.chunks:
        report.print(f"wrote ingester chunk {chunk.id}: {chunk.table} {chunk.partition}, {chunk.rows} rows, "
                     f"order {chunk.order}")
    report.print(f"{result.rows} rows in {len(result.chunks)} chunk(s) written to {db}")
    if result.rejected:
        err.print(f"rejected {len(result.rejected)} bad line(s): " + "; ".join(str(e) for e in result.rejected))


def cmd_persist(args: argparse.Namespace) -> int:
    from iox_planner.catalog.store import open_catalog
    from iox_planner.maintenance.compact.plan import left_overlapping
    from iox_planner.maintenance.persist import persist

    with open_catalog() as catalog:
        results = persist(catalog, args.db, table=args.table, warn=lambda note: err.print(f"warning: {note}"))
        overlapping = (left_overlapping(catalog, args.db, [r.partition_id for r in results])
                       if args.compact and results else [])
    for r in results:
        report.print(f"persisted {r.table} {r.partition}: {r.chunks_in} ingester chunk(s), {r.rows_in} rows -> "
                     f"file {r.file_id} with {r.rows_out} rows (order {r.order})")
    if not results:
        report.print("nothing to persist: no ingester chunks")
    if args.compact and results:
        if not overlapping:
            report.print("no persisted partition overlaps another file: nothing to compact now")
            return 0
        err.print(f"compacting the {len(overlapping)} partition(s) the persist left overlapping")
        _run_compaction(args.db, None, None, only=overlapping)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from iox_planner.catalog.store import open_catalog
    from iox_planner.maintenance.compact.plan import check_target, dry_run
    from iox_planner.maintenance.compact.report import describe_plan
    from iox_planner.maintenance.compact.settings import CompactSettings

    settings = CompactSettings.from_env()
    with open_catalog() as catalog:
        if args.dry_run:
            plans = dry_run(catalog, args.db, table=args.table, partition=args.partition, settings=settings)
            for item in plans:
                for line in describe_plan(item):
                    out.print(line)
            if not plans:
                out.print("nothing to compact")
            out.print("dry run: nothing was changed")
            return 0
        with catalog.engine.connect() as conn:  # unknown names fail here, before a Spark job starts
            check_target(catalog, conn, args.db, args.table, args.partition)
    _run_compaction(args.db, args.table, args.partition)
    return 0


def _run_compaction(db: str, table: str | None, partition: str | None, only: list[int] | None = None) -> None:
    """Compact `db` (or its `table`, its `partition`, or `only` these partition ids) as IOX_RUNNER says, and print
    the report: `compact` and `persist --compact`."""
    from iox_planner.cli.runner import compact
    from iox_planner.maintenance.compact.report import outcome_note

    t = compact(db, table, partition, err.print, only=only)
    for o in t["outcomes"]:
        note = outcome_note(o)
        if note is not None:
            report.print(note)
    if not t["outcomes"]:
        report.print("nothing to compact")
    else:
        report.print(f"compacted {t['partitions']} partition(s): {t['files_in']} file(s) in, {t['files_out']} "
                     f"out; {t['rows_in']:,} rows in, {t['rows_out']:,} out; {t['duplicates_removed']:,} duplicates "
                     f"removed; {t['files_promoted']} file(s) ({t['rows_promoted']:,} rows) promoted to L1 in place, "
                     "not rewritten" + (f"; {t['skipped']} skipped" if t["skipped"] else ""))


def cmd_generate(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from iox_planner.maintenance.persist import persist
    from iox_planner.ingest.write import write_line_protocol
    from iox_planner.timeutil import NS_PER_SECOND, parse_time
    from iox_planner.catalog.store import open_catalog
    from iox_planner.ingest.tsbs import generate_cpu

    if args.hosts < 1 or args.hours < 1 or not 0 <= args.rewrite_fraction <= 1:
        raise BadInputError("--hosts and --hours must be at least 1 and --rewrite-fraction between 0 and 1")
    start = parse_time(args.start, what="--start")
    batches = generate_cpu(hosts=args.hosts, start_ns=start, end_ns=start + args.hours * 3600 * NS_PER_SECOND,
                           interval_s=args.interval, seed=args.seed, rewrite_fraction=args.rewrite_fraction)
    total = args.hours + round(args.rewrite_fraction * args.hours)
    rows = 0
    with open_catalog() as catalog, Progress(console=err, transient=True) as progress:
        task = progress.add_task("writing cpu", total=total)
        for batch in batches:
            rows += write_line_protocol(catalog, args.db, batch.text, source=batch.label).rows
            progress.advance(task)
            if args.persist and not batch.rewrite:
                # Persist hour by hour, so regular hours become sorted files and rewrites overlap them later.
                persist(catalog, args.db, table="cpu")
    report.print(f"wrote {rows:,} cpu rows ({args.hosts} hosts, {args.hours} h, "
                 f"{args.rewrite_fraction:.0%} of hours rewritten) to {args.db}")
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from iox_planner.ingest.scenario import load_scenario, read_scenario

    from iox_planner.catalog.store import open_catalog

    scenario = read_scenario(args.scenario)
    with open_catalog() as catalog:
        db, loaded = load_scenario(catalog, scenario, args.db)
    for c in loaded:
        report.print(f"loaded {c.kind.value} chunk {c.id}: {c.table} {c.partition}, {c.rows} rows, order {c.order}")
    report.print(f"{len(loaded)} chunk(s) loaded into {db}")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    from iox_planner.catalog.drops import drop_database, drop_table
    from iox_planner.catalog.store import open_catalog

    if args.table is not None:
        if not args.yes:
            raise BadInputError(f"dropping table {args.table!r} of database {args.db!r} removes it from queries at "
                                "once and deletes its files after the grace period; add --yes to confirm")
        with open_catalog() as catalog:
            done = drop_table(catalog, args.db, args.table)
        report.print(f"dropped table {done.table} of database {done.db} (order {done.order}); {done.chunks} "
                     "chunk(s) retired, their files are deleted after the grace period")
        return 0
    if not args.yes:
        raise BadInputError(f"dropping database {args.db!r} deletes its catalog rows and files; add --yes to confirm")
    with open_catalog() as catalog:
        drop_database(catalog, args.db, warn=lambda note: err.print(f"warning: {note}"))
    report.print(f"dropped database {args.db}")
    return 0


def cmd_database(args: argparse.Namespace) -> int:
    from iox_planner.catalog.retention import create_database, describe_retention, parse_retention, set_retention

    from iox_planner.catalog.store import open_catalog

    if args.database_command == "create":
        retention = parse_retention(args.retention) if args.retention is not None else None
        with open_catalog() as catalog, catalog.engine.begin() as conn:
            create_database(conn, args.name, retention)
        report.print(f"created database {args.name} (retention {describe_retention(retention)})")
        return 0
    if args.retention is None:
        raise BadInputError("database update changes the retention: give --retention DURATION (e.g. 30d) or none")
    retention = parse_retention(args.retention)
    with open_catalog() as catalog, catalog.engine.begin() as conn:
        change = set_retention(conn, catalog.database_id(conn, args.name), args.name, retention)
    report.print(f"database {args.name}: retention {describe_retention(change.before)} -> "
                 f"{describe_retention(change.after)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from iox_planner.catalog.store import open_catalog
    from iox_planner.cli.show import show

    with open_catalog() as catalog:
        show(catalog, args.db, args.table, out)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from iox_planner.cli.commands import explain

    out.print(explain(args))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from iox_planner.cli.commands import query

    return query(args, report, err)


def cmd_materialized_status(args: argparse.Namespace) -> int:
    from iox_planner.cli.materialized import status

    return status(args, out)


def cmd_materialized_refresh(args: argparse.Namespace) -> int:
    from iox_planner.cli.materialized import refresh

    # A dry run's list is what it is for; a real run reports refreshes already committed.
    return refresh(args, out if args.dry_run else report, err)


def cmd_materialized_run(args: argparse.Namespace) -> int:
    from iox_planner.cli.materialized import run

    return run(args, report, err)


# --- argument parsing ----------------------------------------------------------------------------------------


def _add_db(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--db", required=required, help="database name ([A-Za-z0-9_-]{1,64})")


def _add_sql(p: argparse.ArgumentParser) -> None:
    p.add_argument("sql", metavar="SQL", nargs="?", help="the query (or use --sql-file)")
    p.add_argument("--sql-file", metavar="PATH|-",
                   help="read the query from this UTF-8 file, or - for standard input, instead of the SQL argument")


def _resolve_sql(args: argparse.Namespace) -> None:
    """Exactly one of the SQL argument and --sql-file; the file's text becomes `args.sql`."""
    if not hasattr(args, "sql_file"):
        return
    if args.sql_file is not None and args.sql is not None:
        raise BadInputError("give the query either as the SQL argument or with --sql-file, not both")
    if args.sql_file is None and args.sql is None:
        raise BadInputError("no query given: pass the SQL as an argument or with --sql-file PATH (- for standard "
                            "input)")
    if args.sql_file is not None:
        from iox_planner.planner.limits import read_sql_file

        args.sql = read_sql_file(args.sql_file)


def _check_argv(args: argparse.Namespace) -> None:
    """Arguments are text: an invalid UTF-8 byte in argv reaches Python as a lone surrogate, which Spark's JVM
    side would fail on with a traceback."""
    from iox_planner.errors import check_text  # not via the planner package: that would import sqlglot

    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                what = "the SQL argument" if name == "sql" else f"argument --{name.replace('_', '-')}"
                check_text(item, what)


DASHED_VALUES: set[str] = set()
"""Options whose value may start with `-` (a time, a duration, a watermark): argparse would read `--retention -1d`
as two options and answer with its usage line; `_attach_dashed_values` hands such a value to its option, whose
own check then refuses it in one paragraph."""


def _dashed(action: argparse.Action) -> argparse.Action:
    """Mark `action`'s options as taking a value that may start with `-`."""
    DASHED_VALUES.update(action.option_strings)
    return action


def _attach_dashed_values(argv: Sequence[str]) -> list[str]:
    """`--opt -value` as `--opt=-value` for the options in `DASHED_VALUES` (`--` alone still ends the options)."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] == "--":
            out += args[i:]
            break
        if args[i] in DASHED_VALUES and i + 1 < len(args) and args[i + 1].startswith("-") and args[i + 1] != "--":
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        # argparse quotes the offending value: a hostile one may be megabytes long, or hold terminal commands.
        super().error(visible(clip_message(message)))


def _whole(text: str) -> int:
    """A flag's whole number, by the registry's one rule (ASCII digits: argparse's `int` takes any script's)."""
    from iox_planner.config import whole_number

    value = whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number (digits 0-9)")
    return value


def _fraction(text: str) -> float:
    """A share from 0 to 1 in plain decimal ASCII (argparse's `float` takes `nan`, `1e-3` and any script's digits)."""
    import re

    if not re.fullmatch(r"(0|1)?(\.[0-9]{1,9})?", text.strip()) or not text.strip().strip("."):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a decimal number from 0 to 1 (as 0.25)")
    return float(text)


def _add_timeout(p: argparse.ArgumentParser, what: str) -> None:
    _dashed(p.add_argument("--timeout", metavar="SECONDS",
                   help=f"wall-time budget of {what}, planning included, whole seconds from 1 to 86400 "
                        "(default IOX_QUERY_TIMEOUT_S, or 3600); past it the query is cancelled, nothing is "
                        "published, exit status 124"))


def _add_query_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="bound parameter for :NAME in the SQL (repeatable)")
    _dashed(p.add_argument("--time-start", metavar="T", help="RFC 3339; rows with time >= T (half-open range)"))
    _dashed(p.add_argument("--time-end", metavar="T", help="RFC 3339; rows with time < T (half-open range)"))
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="settings",
                   help="planner setting, e.g. target_partitions=8 (also IOX_<NAME> variables)")


def build_parser() -> argparse.ArgumentParser:
    from iox_planner.ingest.lineprotocol import Precision

    parser = _Parser(
        prog="iox-batch",
        description="Batch SQL over IOx-style time-series data: catalog, ingest, planner, Spark execution.",
    )
    parser.add_argument("--version", action="version", version=f"iox-batch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    catalog = sub.add_parser("catalog", help="catalog administration")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    migrate = catalog_sub.add_parser("migrate", help="apply the catalog migrations not yet applied")
    migrate.set_defaults(func=cmd_catalog_migrate)

    write = sub.add_parser("write", help="write line protocol as ingester chunks")
    _add_db(write)
    write.add_argument("--precision", choices=Precision.choices(), default=Precision.NS.value,
                       help="unit of the timestamps (default ns)")
    write.add_argument("--accept-partial", action="store_true",
                       help="store the good lines and report the bad ones (default: reject the whole write)")
    write.add_argument("--spark", action="store_true",
                       help="bulk load on Spark: FILE or every regular file of a folder, cut into byte ranges "
                            "parsed in parallel, registered in one transaction (IOX_BULK_RANGE_BYTES)")
    write.add_argument("file", metavar="FILE|DIR|-",
                       help="line protocol file, or - for standard input; with --spark a file or a folder")
    write.set_defaults(func=cmd_write)

    persist = sub.add_parser("persist", help="persist ingester chunks as deduplicated, sorted Parquet files")
    _add_db(persist)
    persist.add_argument("--table", help="only this table")
    persist.add_argument("--compact", action="store_true",
                         help="then compact the partitions the persist left overlapping (as `compact` does)")
    persist.set_defaults(func=cmd_persist)

    compact = sub.add_parser("compact", help="rewrite overlapping Parquet files into non-overlapping ones (L0 -> L1 "
                             "hot, L1 -> L2 cold), on Spark")
    _add_db(compact)
    compact.add_argument("--table", help="only this table")
    compact.add_argument("--partition", metavar="YYYY-MM-DD", help="only this partition (a UTC day)")
    compact.add_argument("--dry-run", action="store_true",
                         help="print the compaction plan (files, level, why, time slices) and change nothing")
    compact.set_defaults(func=cmd_compact)

    load = sub.add_parser("load", help="load a scenario file's chunks into the catalog")
    load.add_argument("scenario", metavar="SCENARIO.yaml")
    _add_db(load, required=False)
    load.set_defaults(func=cmd_load)

    generate = sub.add_parser("generate", help="write a seeded TSBS-style cpu data set (hosts x 10 s samples)")
    _add_db(generate)
    generate.add_argument("--hosts", type=_whole, default=10)
    generate.add_argument("--hours", type=_whole, default=24)
    _dashed(generate.add_argument("--start", default="2024-01-01T00:00:00Z", help="RFC 3339 (default 2024-01-01)"))
    generate.add_argument("--interval", type=_whole, default=10, help="seconds between samples (default 10)")
    generate.add_argument("--rewrite-fraction", type=_fraction, default=0.0,
                          help="share of hours written again later, with changed and missing fields")
    generate.add_argument("--seed", type=_whole, default=0)
    generate.add_argument("--persist", action="store_true",
                          help="persist each regular hour as it is written (rewrites stay in the ingester)")
    generate.set_defaults(func=cmd_generate)

    show = sub.add_parser("show", help="tables, partitions and chunks of a database")
    _add_db(show)
    show.add_argument("table", nargs="?", metavar="TABLE")
    show.set_defaults(func=cmd_show)

    database = sub.add_parser("database", help="create a database, or change its retention period")
    db_sub = database.add_subparsers(dest="database_command", required=True, metavar="ACTION")
    for action, text in (("create", "a new, empty database (writes create one too, with no retention)"),
                         ("update", "change an existing database's retention")):
        p = db_sub.add_parser(action, help=text)
        p.add_argument("name", metavar="DB", help="database name ([A-Za-z0-9_-]{1,64})")
        _dashed(p.add_argument("--retention", metavar="DURATION|none",
                               help="keep rows newer than now minus this (1h to 36500d: s, m, h, d, w), or none to "
                                    "keep everything" + (" (default)" if action == "create" else "")))
        p.set_defaults(func=cmd_database)

    drop = sub.add_parser("drop", help="delete a database (its catalog rows and files), or one table of it")
    _add_db(drop)
    drop.add_argument("--table", help="drop only this table: gone from queries at once, its files deleted after "
                      "the grace period")
    drop.add_argument("--yes", action="store_true", help="confirm")
    drop.set_defaults(func=cmd_drop)

    explain = sub.add_parser("explain", help="show the optimized physical plan of a query")
    _add_db(explain, required=False)
    _add_sql(explain)
    explain.add_argument("--chunks", metavar="SCENARIO.yaml",
                         help="plan against this scenario's chunk metadata alone (no catalog, no Spark, no data)")
    explain.add_argument("--format", choices=["tree", "yaml", "json"], default="tree")
    explain.add_argument("--analyze", action="store_true", help="run the plan and show per-node metrics")
    _add_timeout(explain, "planning and --analyze's run")
    _add_query_options(explain)
    explain.set_defaults(func=cmd_explain)

    query = sub.add_parser("query", help="plan and run a query on Spark")
    _add_db(query)
    _add_sql(query)
    query.add_argument("--format", choices=["table", "csv", "jsonl", "parquet"], default="table")
    query.add_argument("--output", metavar="PATH",
                       help="write here (a file for csv/jsonl, a folder for parquet) instead of standard output; "
                            "s3://BUCKET/KEY under an output root on a store (IOX_OUTPUT_ROOT, IOX_OUTPUT_ROOTS)")
    _dashed(query.add_argument("--changes-since", metavar="WATERMARK|beginning",
                       help="only the current rows of the keys written after this watermark (printed on standard "
                            "error by the previous changes read; `beginning` for every key)"))
    _add_timeout(query, "the query")
    _add_query_options(query)
    query.set_defaults(func=cmd_query)

    materialized = sub.add_parser("materialized", help="materialized queries: what is stale, and refreshing it")
    mat_sub = materialized.add_subparsers(dest="materialized_command", required=True, metavar="ACTION")
    mstatus = mat_sub.add_parser("status", help="fresh or stale (and why), failed and never-run intervals")
    mstatus.add_argument("name", nargs="?", metavar="NAME", help="one definition (default: all)")
    mstatus.add_argument("--stale-only", action="store_true", help="show only stale intervals")
    mstatus.add_argument("--format", choices=["table", "json"], default="table")
    mstatus.set_defaults(func=cmd_materialized_status)
    mrefresh = mat_sub.add_parser("refresh", help="recompute exactly the stale intervals of NAME (then of what "
                                  "reads its registered table)")
    mrefresh.add_argument("name", metavar="NAME")
    _dashed(mrefresh.add_argument("--from", dest="from_", metavar="T", help="only intervals ending after T (RFC 3339)"))
    _dashed(mrefresh.add_argument("--to", metavar="T", help="only intervals starting before T (RFC 3339)"))
    mrefresh.add_argument("--dry-run", action="store_true", help="list what would be refreshed; change nothing")
    mrefresh.set_defaults(func=cmd_materialized_refresh)
    mrun = mat_sub.add_parser("run", help="publish every interval of NAME within [--from, --to), never-run ones "
                              "included, as a scheduled run would (a backfill without a scheduler)")
    mrun.add_argument("name", metavar="NAME")
    _dashed(mrun.add_argument("--from", dest="from_", metavar="T", required=True,
                              help="first interval start (RFC 3339); intervals starting at or after T"))
    _dashed(mrun.add_argument("--to", metavar="T", required=True, help="intervals ending at or before T (RFC 3339)"))
    mrun.set_defaults(func=cmd_materialized_run)

    from iox_planner.cli import spark

    spark.add_parser(sub, {"start": lambda a: spark.start(a, report), "stop": lambda a: spark.stop(a, report),
                           "status": lambda a: spark.status(a, out)})
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_attach_dashed_values(sys.argv[1:] if argv is None else argv))
    for stream in (out, report, err):
        stream.reset()
    code = _run(args)
    _settle_report()
    connect = sys.modules.get("spark_jobs.connect")
    if connect is not None and connect.release_shared() and argv is None:
        _end_now(code)
    return code


def _end_now(code: int) -> NoReturn:
    """End the `iox-batch` process once its work is done, output flushed and exit handlers run, without the
    interpreter's teardown of every module object: with the Spark Connect client loaded (pandas, pyarrow, gRPC) that
    teardown alone took 1 to 1.5 s of a warm query's 4 to 6 s, and does nothing a process about to end needs.
    Only for the process's own command (`main()` without argv): a caller of `main([...])` goes on running."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (`| head`) or a closed stream: nothing left to deliver
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    from iox_planner.config import DEBUG, check_environment

    func: Callable[[argparse.Namespace], int] = args.func
    debug = False
    try:
        debug = DEBUG.read()  # read first: a bad value is an error like any other
        check_environment()  # then every other: bad configuration stops a command before it does anything
        _check_argv(args)
        _resolve_sql(args)
        return func(args)
    except IoxError as error:
        err.print(clip_message(f"error: {error}"))
        return error.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        _detach_stdout()
        return 0
    except Exception as error:  # noqa: BLE001 - the last line of defence: one paragraph, no traceback
        from iox_planner.catalog.store import catalog_unavailable

        lost = catalog_unavailable(error)
        if lost is not None:
            err.print(clip_message(f"error: {lost}"))
            return lost.exit_code
        if debug:
            raise
        err.print(clip_message(f"internal error: {type(error).__name__}: {error}") + " (set IOX_DEBUG=1 for the "
                  "traceback, and please report it)")
        return 70


def _settle_report() -> None:
    """A report that could not be printed changes nothing about what its command did, nor its exit status: say
    so once (a reader that went away needs no word)."""
    lost = report.lost
    if lost is None:
        return
    _detach_stdout()
    if not isinstance(lost, BrokenPipeError):
        err.print(clip_message(f"warning: the work is done and committed, but its report could not be printed "
                               f"({type(lost).__name__}: {lost})"))


def _detach_stdout() -> None:
    """Standard output to /dev/null: Python's last flush at exit would fail on the same broken stream and turn
    the exit status into 120."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # closed, or not a real file (output captured in-process)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
