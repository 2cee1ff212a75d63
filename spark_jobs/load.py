"""THE one result writer: every Spark job (run_plan.py, run_parts.py) and the CLI's in-process runner write a
result through `write_result`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from iox_planner.errors import BadInputError
from iox_planner.model import NS_PREFIX
from spark_jobs.connect import executors_share_this_machine
from spark_jobs.transform import q


def result_to_arrow(result: DataFrame) -> Any:
    """The whole result on the driver as an Arrow table (for text formats and the terminal)."""
    return result.toArrow()


def write_result(result: DataFrame, fmt: str, output: Path | None, stdout: Any) -> int:
    """Write the result in `fmt` to `output` (atomically) or to `stdout`. Returns rows written. `arrow` is the
    Arrow IPC file a spark-submit job hands back to the CLI, which prints it."""
    from iox_planner.output import OutputFormat
    from iox_planner.output.formats import finish_columns, print_table, write_text_output

    kind = OutputFormat(fmt)
    if kind is OutputFormat.ARROW:
        if output is None:
            raise BadInputError("arrow output is a file: give --output PATH")
        import pyarrow as pa

        from iox_planner.output.publish import staged_file

        arrow = result_to_arrow(result)
        with staged_file(output) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, arrow.schema) as writer:
                writer.write_table(arrow)
        return int(arrow.num_rows)
    if kind is OutputFormat.PARQUET:
        if output is None:
            raise BadInputError("parquet output is a folder: give --output PATH")
        from iox_planner.output.publish import staged

        # Only the planner's nanosecond helpers go: a user's own `__v` is a result column like any other.
        cols = [c for c in result.columns if not c.startswith(NS_PREFIX)]
        final = result.select(*[q(c) for c in cols])
        spark = result.sparkSession
        with staged(output, folder=True) as stage:
            # A local master's executors are threads of this driver's JVM (or its children, local-cluster): they
            # reach the staging folder through this process's descriptor, which no folder swap can re-point. A
            # cluster's may run on another machine, so they get its name, refused where others could re-point it.
            local = executors_share_this_machine(spark)
            where = str(stage.result if local else stage.shared_result())
            final.write.parquet(where)
            return int(spark.read.parquet(where).count())
    table, ns_cols = finish_columns(result_to_arrow(result))
    if kind is OutputFormat.TABLE:
        if output is not None:
            raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
        print_table(table, ns_cols, stdout)
        return int(table.num_rows)
    write_text_output(table, ns_cols, kind, output, stdout)
    return int(table.num_rows)
