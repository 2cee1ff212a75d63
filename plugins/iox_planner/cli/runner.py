"""Run a plan on Spark: in this process (a local SparkSession, the CLI's default) or through spark-submit
(`IOX_RUNNER=spark-submit`, and the Airflow DAGs). Both paths run the same executor and give identical results.
Imported only by commands that run queries: everything else stays free of Spark."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, TextIO

from iox_planner.config import warehouse
from iox_planner.errors import BadInputError
from iox_planner.output.formats import OutputFormat, finish_columns, print_table, write_text_output
from iox_planner.planner.nodes import QueryPlan
from iox_planner.planner.serde import plan_to_json
from iox_planner.sparkconf import run_submit, spark_master, spark_submit_command

_SESSION: Any = None


def session() -> Any:
    """One SparkSession per process, built on first use. The JVM's own chatter goes to `.iox/spark.log`, not to
    the user's terminal: errors come back as exceptions and are reported as iox-batch errors."""
    global _SESSION
    if _SESSION is None:
        from spark_jobs.session import build_session

        from iox_planner.config import state_dir

        log = open(state_dir() / "spark.log", "ab")
        saved = os.dup(2)
        try:
            os.dup2(log.fileno(), 2)  # the JVM inherits this descriptor as its standard error
            _SESSION = build_session(spark_master())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.close()
    return _SESSION


def run_in_process(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO,
                   strategy: str | None = None) -> int:
    from spark_jobs.errors import spark_errors
    from spark_jobs.execute import execute
    from spark_jobs.load import write_result

    with spark_errors(plan):
        execution = execute(session(), plan, warehouse(), strategy=strategy)
        return write_result(execution.result, fmt.value, output, stdout)


def run_plan_command(plan_file: Path, fmt: str, output: Path, strategy: str | None = None) -> list[str]:
    """The spark-submit invocation of run_plan.py for a plan file."""
    args = ["--plan", str(plan_file), "--warehouse", str(warehouse()), "--format", fmt, "--output", str(output)]
    if strategy is not None:
        args += ["--strategy", strategy]
    return spark_submit_command("run_plan.py", args)


def run_spark_submit(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO,
                     strategy: str | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="iox-run-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(plan_to_json(plan))
        to_print = fmt is OutputFormat.TABLE or output is None
        target = Path(tmp) / "result.arrow" if to_print else output
        assert target is not None
        run_submit(run_plan_command(plan_file, "arrow" if to_print else fmt.value, target, strategy))
        if not to_print:
            return -1
        import pyarrow as pa

        with pa.memory_map(str(target)) as source:
            table = pa.ipc.open_file(source).read_all()
        return print_result(table, fmt, stdout)


def print_result(table: Any, fmt: OutputFormat, stdout: TextIO) -> int:
    table, ns_cols = finish_columns(table)
    if fmt is OutputFormat.TABLE:
        print_table(table, ns_cols, stdout)
    else:
        write_text_output(table, ns_cols, fmt, None, stdout)
    return int(table.num_rows)


def compact_spark_submit(db: str, table: str | None, partition: str | None) -> dict[str, Any]:
    """`iox-batch compact` through spark-submit (`spark_jobs/run_compact.py`, the job the `iox_compact` DAG runs):
    its report (`compact.report_dict`), read from the file the job writes."""
    import json

    args = ["--db", db]
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


def run(plan: QueryPlan, fmt: OutputFormat, output: Path | None, stdout: TextIO) -> int:
    if fmt is OutputFormat.PARQUET and output is None:
        raise BadInputError("parquet output is a folder: give --output PATH")
    if fmt is OutputFormat.TABLE and output is not None:
        raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
    if os.environ.get("IOX_RUNNER", "in-process") == "spark-submit":
        return run_spark_submit(plan, fmt, output, stdout)
    return run_in_process(plan, fmt, output, stdout)



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


def analyze(plan: QueryPlan) -> str:
    """EXPLAIN ANALYZE: run the plan node by node and show each node's metrics in the tree."""
    import time

    from spark_jobs.errors import spark_errors
    from spark_jobs.execute import execute

    from iox_planner.planner.explain import render_tree
    from iox_planner.planner.nodes import DeduplicateExec, PlanNode

    started = time.perf_counter()
    with spark_errors(plan):
        execution = execute(session(), plan, warehouse(), analyze=True)
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
