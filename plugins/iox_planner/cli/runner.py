"""Run a plan on Spark: in this process (a local SparkSession, the CLI's default) or through spark-submit
(`IOX_RUNNER=spark-submit`, and the Airflow DAGs). Both paths run the same executor and give identical results.
Imported only by commands that run queries: everything else stays free of Spark."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, TextIO

from iox_planner.config import env_int, warehouse
from iox_planner.errors import BadInputError
from iox_planner.output import OutputFormat
from iox_planner.output.formats import finish_columns, print_table, write_text_output
from iox_planner.planner.nodes import QueryPlan
from iox_planner.planner.serde import plan_to_json
from iox_planner.sparkconf import TIMEOUT_ARG, query_timeout_s, run_submit, spark_master, spark_submit_command

if TYPE_CHECKING:
    from iox_planner.runs.planning import PlanOutcome
    from iox_planner.runs.refresh import RunSpark
    from iox_planner.runs.request import QueryRequest

_SESSION: Any = None


def session() -> Any:
    """One SparkSession per process, built on first use. The JVM's own chatter goes to `.iox/spark.log`, not to
    the user's terminal: errors come back as exceptions and are reported as iox-batch errors."""
    global _SESSION
    if _SESSION is None:
        from spark_jobs.session import build_session

        from iox_planner.config import state_dir

        path = state_dir() / "spark.log"
        root = logging.getLogger()
        if not root.handlers:
            # py4j logs a lost JVM connection on the root logger (which would configure itself to print the
            # traceback on standard error); the error is reported in one paragraph, the details go to the log.
            root.addHandler(logging.FileHandler(path))
        log = open(path, "ab")
        sys.stdout.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        try:
            # The JVM inherits these descriptors as its standard output and error: its chatter (and a dying JVM's
            # last words) must not land in a result printed to standard output.
            for fd in saved:
                os.dup2(log.fileno(), fd)
            _SESSION = build_session(spark_master())
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            log.close()
    return _SESSION


PRINT_MAX_ROWS_ENV = "IOX_PRINT_MAX_ROWS"
PRINT_MAX_BYTES_ENV = "IOX_PRINT_MAX_BYTES"


def print_limits() -> tuple[int, int]:
    """The most rows, and Arrow bytes, a result printed to standard output may have. Rows: 100,000 (a terminal
    table of that many takes minutes to render on 2 loaded cores, and a few hundred MB). Bytes: 64 MiB, so a few
    rows of huge values cannot make the text rendering take the machine either. A file (`--output`) has neither
    bound: Parquet is written by Spark's executors and never passes through this process; csv and jsonl pass
    through the driver, bounded by spark.driver.maxResultSize."""
    return (env_int(PRINT_MAX_ROWS_ENV, 100_000, 1, 100_000_000),
            env_int(PRINT_MAX_BYTES_ENV, 64 * 2**20, 1024, 2**30))


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


def run_in_process(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO,
                   strategy: str | None = None, timeout_s: int | None = None) -> int:
    """Run on this process's SparkSession within the query's budget; a text result without `output` is collected
    (cut at the print bound) and printed."""
    from spark_jobs.budget import query_budget
    from spark_jobs.errors import spark_errors
    from spark_jobs.execute import execute
    from spark_jobs.load import result_to_arrow, write_result

    spark = session()
    max_rows, max_bytes = print_limits()
    with spark_errors(plan), query_budget(spark, query_timeout_s(timeout_s)):
        execution = execute(spark, plan, warehouse(), strategy=strategy)
        if output is not None:
            return write_result(execution.result, fmt.value, output, stdout)
        table = result_to_arrow(execution.result.limit(max_rows + 1))
    check_printable(table, max_rows, max_bytes)
    return print_result(table, fmt, stdout)


def run_plan_command(plan_file: Path, fmt: str, output: Path, strategy: str | None = None,
                     timeout_s: int | None = None, limit_rows: int | None = None) -> list[str]:
    """The spark-submit invocation of run_plan.py for a plan file."""
    args = ["--plan", str(plan_file), "--warehouse", str(warehouse()), "--format", fmt, "--output", str(output),
            TIMEOUT_ARG, str(query_timeout_s(timeout_s))]
    if strategy is not None:
        args += ["--strategy", strategy]
    if limit_rows is not None:
        args += ["--limit-rows", str(limit_rows)]
    return spark_submit_command("run_plan.py", args)


def run_spark_submit(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO,
                     strategy: str | None = None, timeout_s: int | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="iox-run-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(plan_to_json(plan))
        to_print = fmt is OutputFormat.TABLE or output is None
        written = OutputFormat.ARROW if to_print else fmt  # a printed result comes back as Arrow, then is printed
        target = Path(tmp) / "result.arrow" if to_print else output
        assert target is not None
        max_rows, max_bytes = print_limits()
        run_submit(run_plan_command(plan_file, written.value, target, strategy, timeout_s,
                                    max_rows + 1 if to_print else None))
        if not to_print:
            return -1
        import pyarrow as pa

        with pa.memory_map(str(target)) as source:
            table = pa.ipc.open_file(source).read_all()
        check_printable(table, max_rows, max_bytes)
        return print_result(table, fmt, stdout)


def print_result(table: Any, fmt: OutputFormat, stdout: TextIO) -> int:
    table, ns_cols = finish_columns(table)
    if fmt is OutputFormat.TABLE:
        print_table(table, ns_cols, stdout)
    else:
        write_text_output(table, ns_cols, fmt, None, stdout)
    return int(table.num_rows)


def compact_spark_submit(db: str, table: str | None, partition: str | None,
                         only: Sequence[int] | None = None) -> dict[str, Any]:
    """`iox-batch compact` through spark-submit (`spark_jobs/run_compact.py`, the job the `iox_compact` DAG runs):
    its report (`compact.report_dict`), read from the file the job writes. `only`: these partition ids."""
    import json

    args = ["--db", db] if only is None else ["--target", f"{db}={','.join(str(p) for p in only)}"]
    if table is not None:
        args += ["--table", table]
    if partition is not None:
        args += ["--partition", partition]
    with tempfile.TemporaryDirectory(prefix="iox-compact-") as tmp:
        report = Path(tmp) / "report.json"
        run_submit(spark_submit_command("run_compact.py", ["--metrics", str(report), *args]))
        return dict(json.loads(report.read_text()))


def compacting_in_spark_submit() -> bool:
    return os.environ.get("IOX_RUNNER", "in-process") == "spark-submit"


def run(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO,
        timeout_s: int | None = None) -> int:
    """Run the plan within its wall-time budget (`timeout_s` seconds, else IOX_QUERY_TIMEOUT_S)."""
    if fmt is OutputFormat.PARQUET and output is None:
        raise BadInputError("parquet output is a folder: give --output PATH")
    if fmt is OutputFormat.TABLE and output is not None:
        raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
    if os.environ.get("IOX_RUNNER", "in-process") == "spark-submit":
        return run_spark_submit(plan, fmt, output, stdout, timeout_s=timeout_s)
    return run_in_process(plan, fmt, output, stdout, timeout_s=timeout_s)


RUNNERS = ("in-process", "spark-submit")


def staged_runner(name: str | None = None) -> RunSpark:
    """How `iox-batch materialized refresh` runs a planned interval's Spark work (`refresh.RunSpark`): the runner
    `name` (default IOX_RUNNER, else in-process) names: this process's SparkSession, or spark-submit of the run's
    jobs as `iox_refresh` does."""
    from iox_planner.runs.refresh import submit_jobs

    chosen = name if name is not None else os.environ.get("IOX_RUNNER", "in-process")
    if chosen == "spark-submit":
        return submit_jobs
    if chosen == "in-process":
        return run_staged_in_process
    raise BadInputError(f"unknown executor {chosen!r}; use one of {', '.join(RUNNERS)}")


def run_staged_in_process(outcome: PlanOutcome, request: QueryRequest) -> int:
    """The whole plan of a planned run in this process's SparkSession (`run_in_process`), within the run's budget,
    into the staging folder the commit step reads: the result and then `metrics.json`, exactly as run_plan.py
    leaves them. One Spark job, whatever fan-out the plan step prepared."""
    import json

    from iox_planner.planner.serde import plan_from_json
    from iox_planner.runs.planning import spark_format
    from iox_planner.runs.staging import Staging

    staging = Staging(Path(outcome.staging))
    fmt = spark_format(request)
    plan = plan_from_json(staging.plan_file.read_text())
    rows = run_in_process(plan, fmt, staging.result(fmt), sys.stdout, timeout_s=request.budget_s())
    staging.metrics.write_text(json.dumps({"rows": rows}))
    return 1


def bulk_load(catalog: Any, db: str, source: str, precision: Any, accept_partial: bool,
              progress: Any) -> Any:
    """`iox-batch write --spark`: the bulk load on this process's SparkSession, or through spark-submit of
    `run_bulk_load.py` with `IOX_RUNNER=spark-submit` (its report read back)."""
    from iox_planner.ingest.bulk import bulk_write

    if os.environ.get("IOX_RUNNER", "in-process") != "spark-submit":
        from spark_jobs.bulk_job import spark_range_runner

        spark = session()
        return bulk_write(catalog, db, source, spark_range_runner(spark), precision=precision,
                          accept_partial=accept_partial, progress=progress,
                          min_ranges=spark.sparkContext.defaultParallelism)
    import json

    from iox_planner.ingest.lineprotocol import LineError
    from iox_planner.ingest.write import WriteResult, WrittenChunk

    with tempfile.TemporaryDirectory(prefix="iox-bulk-") as tmp:
        report = Path(tmp) / "report.json"
        args = ["--db", db, "--precision", str(precision.value), "--report", str(report)]
        args += ["--accept-partial"] if accept_partial else []
        run_submit(spark_submit_command("run_bulk_load.py", [*args, "--", str(Path(source).absolute())]))
        done = json.loads(report.read_text())
    return WriteResult(tuple(WrittenChunk(**c) for c in done["chunks"]),
                       tuple(LineError(**e) for e in done["rejected"]))


def analyze(plan: QueryPlan, timeout_s: int | None = None) -> str:
    """EXPLAIN ANALYZE: run the plan node by node and show each node's metrics in the tree, all of it within the
    query's wall-time budget (`timeout_s`, else IOX_QUERY_TIMEOUT_S)."""
    import time

    from spark_jobs.budget import query_budget
    from spark_jobs.errors import spark_errors
    from spark_jobs.execute import execute

    from iox_planner.planner.explain import render_tree
    from iox_planner.planner.nodes import DeduplicateExec, PlanNode

    started = time.perf_counter()
    spark = session()
    with spark_errors(plan), query_budget(spark, query_timeout_s(timeout_s)):
        execution = execute(spark, plan, warehouse(), analyze=True)
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
