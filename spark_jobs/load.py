"""THE one result writer: every Spark job (run_plan.py, run_parts.py) and the CLI's in-process runner write a
result through `write_result`."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from iox_planner.errors import BadInputError
from iox_planner.model import NS_PREFIX
from iox_planner.objectstore import Root, parse_root
from iox_planner.output import Destination
from spark_jobs.connect import executors_share_this_machine
from spark_jobs.errors import worker_error
from spark_jobs.transform import has_variant, q, variants_as_json


def result_to_arrow(result: DataFrame) -> Any:
    """The whole result on the driver as an Arrow table (for text formats and the terminal). A VARIANT, at the top
    or inside an array, map or struct, comes as the JSON text Spark's own `to_json` makes of it, typed `arrow.json`
    (so the text formats write it as JSON, not as a string), never as its binary encoding."""
    fields = result.schema.fields
    if not any(has_variant(f.dataType) for f in fields):
        return result.toArrow()
    table = variants_as_json(result).toArrow()
    typed = [a.with_type(_json_typed(a.type, f.dataType)) for a, f in zip(table.schema, fields)]
    return table.cast(pa.schema(typed, metadata=table.schema.metadata))


def _json_typed(arrow: Any, spark: T.DataType) -> Any:
    """Arrow type `arrow` of a column `variants_as_json` made from Spark type `spark`, its variants' strings as
    `arrow.json`."""
    if isinstance(spark, T.VariantType):
        return pa.json_(arrow)
    if isinstance(spark, T.ArrayType):
        item = arrow.value_field
        return pa.list_(item.with_type(_json_typed(item.type, spark.elementType)))
    if isinstance(spark, T.MapType):
        return pa.map_(arrow.key_field.with_type(_json_typed(arrow.key_type, spark.keyType)),
                       arrow.item_field.with_type(_json_typed(arrow.item_type, spark.valueType)))
    if isinstance(spark, T.StructType):
        return pa.struct([arrow.field(i).with_type(_json_typed(arrow.field(i).type, f.dataType))
                          for i, f in enumerate(spark.fields)])
    return arrow


def write_result(result: DataFrame, fmt: str, output: Destination | None, stdout: Any) -> int:
    """Write the result in `fmt` to `output` (atomically: a local path, or a key on a store) or to `stdout`.
    Returns rows written. `arrow` is the Arrow IPC file a spark-submit job hands back to the CLI, which prints
    it."""
    from iox_planner.output import OutputFormat
    from iox_planner.output.formats import finish_columns, print_table, write_text_output

    kind = OutputFormat(fmt)
    if kind is OutputFormat.PARQUET and isinstance(output, Root):
        return _write_parquet_to_store(result, output)
    if kind is OutputFormat.ARROW:
        if output is None or isinstance(output, Root):
            raise BadInputError("arrow output is a local file: give --output PATH")
        from iox_planner.output.publish import staged_file

        arrow = result_to_arrow(result)
        with staged_file(output) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, arrow.schema) as writer:
                writer.write_table(arrow)
        return int(arrow.num_rows)
    if kind is OutputFormat.PARQUET:
        if output is None:
            raise BadInputError("parquet output is a folder: give --output PATH")
        assert not isinstance(output, Root)  # a store's: _write_parquet_to_store
        from iox_planner.output.publish import staged

        final = _without_helpers(result)
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


def _without_helpers(result: DataFrame) -> DataFrame:
    """The result without the planner's nanosecond helpers (a user's own `__v` is a result column like any
    other)."""
    return result.select(*[q(c) for c in result.columns if not c.startswith(NS_PREFIX)])


def _write_parquet_to_store(result: DataFrame, target: Root) -> int:
    """The result as a Parquet publication on a store (output/store.py): each Spark task writes its rows as one
    part file under the publication's fresh prefix, through pyarrow's S3 filesystem built in the task's own
    process from its own AWS settings (Spark's own writer would need Hadoop's S3 connector); the driver then puts
    the manifest, last. Only the tasks that succeeded report a file, so a retried task's first attempt is never
    named. Returns the rows written."""
    from iox_planner.output.store import staged_folder

    final = _without_helpers(result)
    with staged_folder(target) as stage:
        write = _part_writer(target.uri, stage.id)
        try:
            written = final.mapInArrow(write, "key string, size long, rows long").collect()
        except Exception as err:
            # A worker's own error (the store gone: StoreUnavailableError, exit 75) keeps its class and message;
            # anything else (the query's) is the caller's to word, as for the local writer.
            kind, message = worker_error(err)
            if kind is None:
                raise
            raise kind(message) from err
        for row in written:
            stage.add(row["key"], row["size"], row["rows"])
        if not written:  # no task had a row: one empty file keeps the result's columns
            stage.put_table(result_to_arrow(final.limit(0)))
        return sum(int(row["rows"]) for row in written)


def _part_writer(target_uri: str, publication: str) -> Any:
    """The function each task runs: its batches streamed into one Parquet object (a multipart upload past
    pyarrow's part size, which the store shows only once complete), reported as (key, size, rows). Only text
    crosses to the task: the target's URI and the publication's id, never a credential."""

    def write(batches: Any) -> Any:
        import itertools
        import uuid

        import pyarrow.parquet as pq
        from pyspark import TaskContext

        from iox_planner.objectstore import store_errors

        root = parse_root(target_uri)
        first = next(batches, None)
        if first is None:
            return
        task = TaskContext.get()
        index = task.partitionId() if task is not None else 0
        rel = f"{publication}/part-{index:05d}-{uuid.uuid4().hex}.parquet"
        rows = 0
        with store_errors(root, "write", rel):
            fs = root.filesystem()
            with fs.open_output_stream(root.path(rel), metadata={}) as sink, \
                    pq.ParquetWriter(sink, first.schema) as writer:
                for batch in itertools.chain([first], batches):
                    writer.write_batch(batch)
                    rows += batch.num_rows
            size = fs.get_file_info(root.path(rel)).size or 0
        yield pa.RecordBatch.from_pydict({"key": [rel], "size": [size], "rows": [rows]},
                                         schema=pa.schema([("key", pa.string()), ("size", pa.int64()),
                                                           ("rows", pa.int64())]))

    return write
