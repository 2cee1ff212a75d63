"""`iox_query`: a triggered query with params (PRODUCT.md "Interfaces").

    airflow dags test iox_query -c '{"db": "demo", "sql": "SELECT * FROM h2o WHERE city = :city",
                                     "args": {"city": "Boston"}, "output": "/tmp/boston.jsonl", "format": "jsonl"}'

Params are checked against their JSON schema when the run is created; everything else (the SQL, the time range,
the database and its tables, the output path) is checked by the plan task, which fails with the planner's message
and publishes nothing. Relative outputs resolve under IOX_OUTPUT_ROOT; every output must resolve (symlinks
included) inside an output root and carry its format's extension (dags/README.md, "Security model").
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import DAG, Param

from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.spark.budget import MAX_QUERY_TIMEOUT_S
from iox_planner.timeutil import RFC3339_PATTERN as RFC3339

from iox_airflow.pipeline import query_tasks

PARAMS = {
    "db": Param(type="string", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The database to query."),
    "sql": Param(type="string", minLength=1,
                 description="One SELECT in Spark SQL over the database's tables; :name marks a bound parameter."),
    "args": Param({}, type="object", description="Bound parameters: {\"name\": value} for each :name in the SQL."),
    "time_start": Param(None, type=["null", "string"], pattern=RFC3339,
                        description="Start of the half-open time range [time_start, time_end), RFC 3339."),
    "time_end": Param(None, type=["null", "string"], pattern=RFC3339,
                      description="End of the half-open time range, RFC 3339 (exclusive)."),
    "output": Param(type="string", minLength=1,
                    description="Where to write: a file for csv and jsonl, a folder for parquet."),
    "format": Param("parquet", type="string", enum=["parquet", "csv", "jsonl"], description="Output format."),
    "timeout_s": Param(None, type=["null", "integer"], minimum=1, maximum=MAX_QUERY_TIMEOUT_S,
                       description="Wall-time budget of each Spark job of the run, in seconds (default "
                                   "IOX_QUERY_TIMEOUT_S); past it the job is cancelled and nothing is published."),
    "changes_since": Param(None, type=["null", "string"], maxLength=64,
                           description="A changes read: only the current rows of the keys written after this "
                                       "watermark (`beginning`: every key); the plan task's result and the run's "
                                       "record carry the watermark to pass next time."),
}


def request_from_params(context: Mapping[str, Any], settings: RunSettings) -> QueryRequest:
    return QueryRequest.from_params(context["params"], settings)


with DAG(
    dag_id="iox_query",
    description="Run one SQL query over an iox-batch database on Spark and publish its result",
    schedule=None,
    params=PARAMS,
    tags=["iox-batch"],
    doc_md=__doc__,
):
    query_tasks(request_from_params, RunSettings.from_env())
