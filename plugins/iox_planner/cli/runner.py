"""The CLI's Spark work, launched the one way every caller launches a job (`spark_jobs/launch.py` `launcher`: in
this process by default, through spark-submit with `IOX_RUNNER=spark-submit`, on a Spark Connect server with
`IOX_RUNNER=connect`): a query's result printed or written, a compaction, a bulk load; and EXPLAIN ANALYZE, which
runs node by node on this process's session (the Connect one under `connect`). Every runner runs the same job
(`spark_jobs/job.py`) and gives identical results. Imported only by commands that run Spark."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from iox_planner import config
from iox_planner.config import warehouse_root
from iox_planner.objectstore import is_uri
from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import Precision
from iox_planner.output import Destination, OutputFormat
from iox_planner.output.formats import finish_columns, print_table, write_text_output
from iox_planner.planner.nodes import QueryPlan
from iox_planner.planner.serde import plan_to_json
from iox_planner.spark.budget import query_timeout_s
from iox_planner.spark.jobs import BulkLoadJob, CompactJob, PlanJob

PRINT_MAX_ROWS_ENV = config.PRINT_MAX_ROWS.name
PRINT_MAX_BYTES_ENV = config.PRINT_MAX_BYTES.name


def print_limits() -> tuple[int, int]:
    """The most rows, and Arrow bytes, a result printed to standard output may have. Rows: 100,000 (a terminal
    table of that many takes minutes to render on 2 loaded cores, and a few hundred MB). Bytes: 64 MiB, so a few
    rows of huge values cannot make the text rendering take the machine either. A file (`--output`) has neither
    bound: Parquet is written by Spark's executors and never passes through this process; csv and jsonl pass
    through the driver, bounded by spark.driver.maxResultSize."""
    return config.PRINT_MAX_ROWS.read(), config.PRINT_MAX_BYTES.read()


def check_printable(table: Any, max_rows: int, max_bytes: int) -> None:
    """`table` (at most max_rows + 1 rows: the query was cut there) fits standard output, or a one-paragraph
    error saying how to get the result anyway. Nothing was printed: a consumer of the text never sees a cut-off
    result."""
    advice = "write it to a file with --output PATH (csv, jsonl or parquet) instead, add a LIMIT, or raise"
    if table.num_rows > max_rows:
        raise BadInputError(f"the result has more than {max_rows:,} rows, the most a query prints to standard "
                            f"output ({PRINT_MAX_ROWS_ENV}); {advice} {PRINT_MAX_ROWS_ENV}")
    if table.nbytes > max_bytes:
        raise BadInputError(f"the result holds {table.nbytes:,} bytes, more than the {max_bytes:,} a query prints "
                            f"to standard output ({PRINT_MAX_BYTES_ENV}); {advice} {PRINT_MAX_BYTES_ENV}, or select "
                            "fewer or smaller values")


def run(plan: QueryPlan, fmt: OutputFormat, output: Destination | None, stdout: TextIO,
        timeout_s: int | None = None, progress: Callable[[str], None] | None = None) -> int:
    """Run the plan within its wall-time budget (`timeout_s` seconds, else IOX_QUERY_TIMEOUT_S) as a `PlanJob`:
    written at `output`, or fetched back (cut at the print bound) and printed. Returns the rows written or
    printed."""
    from spark_jobs.launch import launcher

    if fmt is OutputFormat.PARQUET and output is None:
        raise BadInputError("parquet output is a folder: give --output PATH")
    if fmt is OutputFormat.TABLE and output is not None:
        raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
    budget = query_timeout_s(timeout_s)
    launch = launcher() if progress is None else launcher(progress=progress)
    with tempfile.TemporaryDirectory(prefix="iox-run-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(plan_to_json(plan))
        if output is not None:
            return int(launch.run(PlanJob(plan_file, output, fmt, budget))["rows"])
        max_rows, max_bytes = print_limits()
        # A printed result comes back as Arrow (the job's format and output are the launcher's business).
        table = launch.fetch(PlanJob(plan_file, Path(tmp) / "result.arrow", OutputFormat.ARROW, budget,
                                     limit_rows=max_rows + 1))
    check_printable(table, max_rows, max_bytes)
    return print_result(table, fmt, stdout)


def print_result(table: Any, fmt: OutputFormat, stdout: TextIO) -> int:
    table, ns_cols = finish_columns(table)
    if fmt is OutputFormat.TABLE:
        print_table(table, ns_cols, stdout)
    else:
        write_text_output(table, ns_cols, fmt, None, stdout)
    return int(table.num_rows)


def compact(db: str, table: str | None, partition: str | None, progress: Callable[[str], None],
            only: Sequence[int] | None = None) -> dict[str, Any]:
    """`iox-batch compact` (and `persist --compact`, with `only` the partition ids to compact) as a `CompactJob`
    (the job the `iox_compact` DAG runs in batches): its report (`compact.report.report_dict`). Under spark-submit
    the job's progress stays in its own output, so each partition's outcome is told from the report instead."""
    from spark_jobs.launch import launcher

    from iox_planner.spark.launch import Runner

    launch = launcher(progress=progress)
    if launch.runner is Runner.SPARK_SUBMIT:
        progress("compacting through spark-submit")
    job = (CompactJob(db=db, table=table, partition=partition) if only is None
           else CompactJob(targets=((db, tuple(sorted(only))),)))
    done = launch.run(job)
    if launch.runner is Runner.SPARK_SUBMIT:
        for o in done["outcomes"]:
            if o["skipped"] is None:
                progress(f"{o['table']} {o['partition']}: L{o['level']}: {o['files_in']} file(s), "
                         f"{o['rows_in']:,} rows -> {o['files_out']} file(s), {o['rows_out']:,} rows; "
                         f"{o['files_promoted']} file(s) promoted in place")
    return done


def bulk_load(db: str, source: str, precision: Precision, accept_partial: bool,
              progress: Callable[[str], None]) -> Any:
    """`iox-batch write --spark`: a `BulkLoadJob` (the job the `iox_bulk_load` DAG runs), its report read back as
    the write's result."""
    from spark_jobs.launch import launcher

    from iox_planner.ingest.lineprotocol import LineError
    from iox_planner.ingest.write import WriteResult, WrittenChunk

    # An s3:// input is a URI, never a path relative to the current folder.
    given = source if is_uri(source) else str(Path(source).absolute())
    done = launcher(progress=progress).run(BulkLoadJob(db, given, precision, accept_partial))
    return WriteResult(tuple(WrittenChunk(**c) for c in done["chunks"]),
                       tuple(LineError(**e) for e in done["rejected"]))


def analyze(plan: QueryPlan, timeout_s: int | None = None) -> str:
    """EXPLAIN ANALYZE: run the plan node by node and show each node's metrics in the tree, all of it within the
    query's wall-time budget (`timeout_s`, else IOX_QUERY_TIMEOUT_S)."""
    import time

    from spark_jobs.budget import query_budget
    from spark_jobs.errors import spark_errors
    from spark_jobs.execute import execute
    from spark_jobs.launch import analysis_session

    from iox_planner.planner.explain import render_tree
    from iox_planner.planner.nodes import DeduplicateExec, PlanNode

    started = time.perf_counter()
    spark = analysis_session()
    with spark_errors(plan), query_budget(spark, query_timeout_s(timeout_s)):
        execution = execute(spark, plan, warehouse_root(), analyze=True)
        rows = execution.result.count()
    elapsed = time.perf_counter() - started

    def annotate(node: PlanNode) -> str:
        m = execution.metrics.get(id(node))
        if m is None:
            return ""
        parts = [f"output_rows={m.rows_out}"]
        if isinstance(node, DeduplicateExec) and m.rows_in is not None:
            parts += [f"input_rows={m.rows_in}", f"duplicates_removed={m.duplicates_removed}"]
        if m.files is not None:
            parts.append(f"files={m.files}")
        if m.seconds is not None:
            parts.append(f"elapsed={m.seconds * 1000:.0f}ms")
        return "metrics=[" + ", ".join(parts) + "]"

    summary = (f"analyze: {rows} result rows, {elapsed:.2f} s in all (each node's elapsed time counts its own "
               "subtree, evaluated on its own)")
    return render_tree(plan, annotate, summary)
