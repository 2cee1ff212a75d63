"""A Spark session over Spark Connect (`IOX_RUNNER=connect`): the client side of the project's own server
(`iox_planner/sparkserver.py`) or of the one IOX_SPARK_REMOTE names.

What the in-process path reaches through py4j has a Connect counterpart here: the last gate's parse (the server's
own SQL parser, through the relation extension of `connect_plugin/ParsePlanPlugin.java`: the same plan JSON, no
analysis), and a lost server, read as the retryable `SparkUnavailableError` (exit 75). The query budget's tags are
`budget.py`'s.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from iox_planner.errors import IoxError, SparkUnavailableError
from iox_planner.sparkconf import session_conf

# The client warns on standard error when it gives up; the lost server is reported in one paragraph instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

# A lost server is reported after a few quick retries (about 1 s in all), not after the client's default of
# 10 minutes of backoff: the error is retryable by whoever runs the command, who knows whether it is worth it.
_RETRIES = 3
_MAX_BACKOFF_MS = 1_000


def is_remote(spark: Any) -> bool:
    """`spark` is a Spark Connect session (no JVM in this process, no sparkContext)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    return isinstance(spark, RemoteSession)


def executors_share_this_machine(spark: Any) -> bool:
    """The session's executors run on this machine, as this user: a local master in this process's JVM, or in a
    Connect server reached on loopback (the project's own). They can then open a path under /proc/<this pid>/fd
    (`output/publish.py` `fd_path`); a cluster's, or a server elsewhere, cannot."""
    if not is_remote(spark):
        return bool((spark.sparkContext.master or "").startswith("local"))
    loopback = spark.client.host in ("127.0.0.1", "localhost", "::1", "[::1]")
    return loopback and str(spark.conf.get("spark.master", "")).startswith("local")


def remote_session(url: str) -> Any:
    """A Spark Connect session on `url` (`sc://HOST:PORT`) with iox-batch's SQL settings set on it, each checked:
    the server may be one iox-batch did not start, and the security settings must hold whatever it defaults to.
    A server that does not answer is `SparkUnavailableError`."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark = SparkSession.builder.remote(url).getOrCreate()
    # As session.py's: PySpark logs a failed query's context as JSON on standard error; iox-batch reports it.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    spark.client.set_retry_policies([DefaultPolicy(max_retries=_RETRIES, max_backoff=_MAX_BACKOFF_MS)])
    try:
        # Runtime SQL settings only: a Connect session cannot change the server's JVM or core settings.
        for key, value in session_conf().items():
            if key.startswith("spark.sql."):
                spark.conf.set(key, value)
    except Exception as err:  # noqa: BLE001 - one paragraph for any way the server fails to answer
        raise server_lost(err, url) or IoxError(f"the Spark Connect server at {url} refused iox-batch's settings: "
                                                f"{str(err).splitlines()[0][:300] if str(err) else err!r}") from err
    return spark


def parsed_plan_json(spark: Any, text: str) -> str:
    """The JSON of the plan the server's SQL parser builds for `text` (nothing analyzed or run); Spark's
    ParseException when it does not parse. A server without the plugin fails: the gate never runs unchecked."""
    from google.protobuf import any_pb2  # type: ignore[import-untyped]
    from pyspark.sql.connect.dataframe import DataFrame
    from pyspark.sql.connect.plan import LogicalPlan

    from iox_planner.sparkserver import PLUGIN_TYPE_URL

    class ParsePlan(LogicalPlan):
        def __init__(self) -> None:
            super().__init__(None)

        def plan(self, session: Any) -> Any:
            relation = self._create_proto_relation()
            relation.extension.CopyFrom(any_pb2.Any(type_url=PLUGIN_TYPE_URL, value=text.encode("utf-8")))
            return relation

    rows = DataFrame(ParsePlan(), spark).collect()
    return str(rows[0][0])


def missing_plugin(err: BaseException) -> bool:
    """The server does not know the parse plugin's relation (a server iox-batch did not start)."""
    return "extension" in str(err).lower() and ("not supported" in str(err).lower() or
                                                "UNSUPPORTED" in str(err) or "unknown" in str(err).lower())


def server_lost(err: BaseException, url: str | None = None) -> SparkUnavailableError | None:
    """The retryable error when `err` (or what caused it) is the server gone or unreachable (gRPC's UNAVAILABLE,
    after the client's retries) or restarted (it no longer knows this session), else None. Read from the gRPC
    status and Spark's error condition, never from message text (which may quote the user's query)."""
    import grpc  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = current.code() if isinstance(current, grpc.RpcError) and hasattr(current, "code") else None
        condition = current.getCondition() if isinstance(current, PySparkException) else None
        if status == grpc.StatusCode.UNAVAILABLE or str(condition or "").startswith("INVALID_HANDLE.SESSION_"):
            where = f" at {url}" if url else ""
            return SparkUnavailableError(
                f"the Spark Connect server{where} could not be reached or went away during the command (stopped, "
                "restarted or killed); nothing was published. Run the command again once it is up: `iox-batch "
                "spark status` shows the project's own server and `iox-batch spark start` starts it (its log is "
                ".iox/spark-connect.log); or set IOX_RUNNER=in-process to run without it")
        current = current.__cause__ or current.__context__
    return None
