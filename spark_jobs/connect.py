"""A Spark session over Spark Connect (`IOX_RUNNER=connect`): the client side of the project's own server
(`iox_planner/spark/server.py`) or of the one IOX_SPARK_REMOTE names.

What the in-process path reaches through py4j has a Connect counterpart here: the last gate's parse (the server's
own SQL parser, through its gate endpoint, `connect_server.py`: the same plan JSON, no analysis; the client fails
closed, no answer is no query), and a lost server, read as the retryable `SparkUnavailableError` (exit 75). The
query budget's tags are `budget.py`'s. `shared_remote` is the one Connect session of a process (the connect
launcher's, `launch.py`), `release_shared` ends it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import warnings
from pathlib import Path
from typing import Any

from iox_planner.errors import BadInputError, BadQueryError, IoxError, SparkUnavailableError, UnsupportedError
from iox_planner.spark.conf import session_conf
from iox_planner.spark.server import GATE_MAX_BYTES, GATE_PATH, GATE_TIMEOUT_S, GATE_TOKEN_ENV, Remote

# The client warns on standard error when it gives up; the lost server is reported in one paragraph instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

# A lost server is reported after a few quick retries (about 1 s in all), not after the client's default of
# 10 minutes of backoff: the error is retryable by whoever runs the command, who knows whether it is worth it.
_RETRIES = 3
_MAX_BACKOFF_MS = 1_000
# A plan's JSON is a few times its text; more than this is not an answer the gate gives.
_MAX_ANSWER = 16 * GATE_MAX_BYTES


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


_GATES: dict[int, tuple[Any, Remote]] = {}
"""Each Connect session this process made, with its server's gate (the session is held: its id stays its own)."""


def _channel(remote: Remote) -> Any:
    """How the session reaches `remote`: the server's token as a bearer token on every call, over TLS trusting
    `remote.ca` (or the system's CAs) when `remote.tls`, else over loopback only (gRPC's local credentials refuse
    any other peer). The token is a parameter of the builder, never in the URL (which messages quote) nor in this
    process's environment (which its children would inherit)."""
    import grpc  # type: ignore[import-untyped]
    from pyspark.sql.connect.client import DefaultChannelBuilder

    class Channel(DefaultChannelBuilder):
        def toChannel(self) -> Any:  # noqa: N802 - PySpark's name
            # PySpark's own would choose TLS for a token to any host but `localhost` (127.0.0.1 included), and
            # read a CA only from a process-wide gRPC variable.
            if remote.tls:
                roots = Path(remote.ca).read_bytes() if remote.ca else None
                channel = grpc.ssl_channel_credentials(root_certificates=roots)
            else:
                channel = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
            return self._secure_channel(self.endpoint, grpc.composite_channel_credentials(
                channel, grpc.access_token_call_credentials(remote.token)))

    builder = Channel(remote.url)
    builder.set(DefaultChannelBuilder.PARAM_TOKEN, remote.token)
    if remote.tls:
        builder.set(DefaultChannelBuilder.PARAM_USE_SSL, "true")
    return builder


def remote_session(remote: Remote) -> Any:
    """A Spark Connect session on `remote.url` (`sc://HOST:PORT`), with the server's token, with iox-batch's SQL
    settings set on it, each checked: the server may be one iox-batch did not start, and the security settings
    must hold whatever it defaults to. A server that does not answer is `SparkUnavailableError`."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession

    url = remote.url
    # As PySpark's own builder marks a process whose session is remote (`SparkSession.builder.remote`).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    spark = SparkSession.builder.channelBuilder(_channel(remote)).getOrCreate()
    # As session.py's: PySpark logs a failed query's context as JSON on standard error; iox-batch reports it.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    spark.client.set_retry_policies([DefaultPolicy(max_retries=_RETRIES, max_backoff=_MAX_BACKOFF_MS)])
    try:
        _set_checked(spark, {k: v for k, v in session_conf().items() if k.startswith("spark.sql.")})
    except Exception as err:  # noqa: BLE001 - one paragraph for any way the server fails to answer
        # Not left as the process's active session: the next `getOrCreate` (a task's retry) would return it, on
        # whatever server it was opened.
        _forget(spark)
        if isinstance(err, IoxError):
            raise
        raise token_refused(err, url) or server_lost(err, url) or IoxError(
            f"the Spark Connect server at {url} refused iox-batch's settings: "
            f"{str(err).splitlines()[0][:300] if str(err) else err!r}") from err
    _GATES[id(spark)] = (spark, remote)
    return spark


_SHARED: Any = None


def shared_remote(where: Remote | None = None) -> Any:
    """This process's one Connect session, opened on first use on `where` (an Airflow task's connection,
    `dags/iox_airflow/spark.py`), else on IOX_SPARK_REMOTE's server or the project's own (`spark/server.py`
    `remote`, which starts it when it is not running)."""
    global _SHARED
    if _SHARED is None:
        from iox_planner.spark.server import remote

        _SHARED = remote_session(where or remote())
    return _SHARED


def release_shared() -> bool:
    """End this process's Connect session if it opened one (see `release`); whether it had one."""
    global _SHARED
    if _SHARED is None:
        return False
    spark, _SHARED = _SHARED, None
    release(spark)
    return True


def _set_checked(spark: Any, settings: dict[str, str]) -> None:
    """Set `settings` on the session in one round trip and read them back in another (a setting per call was one
    round trip each): runtime SQL settings only, as a Connect session cannot change the server's JVM or core
    settings. One the server did not take (the security settings among them) fails the session."""
    from pyspark.sql.connect import proto

    pairs = [proto.KeyValue(key=key, value=value) for key, value in settings.items()]
    spark.client.config(proto.ConfigRequest.Operation(set=proto.ConfigRequest.Set(pairs=pairs)))
    got = spark.client.config(proto.ConfigRequest.Operation(get=proto.ConfigRequest.Get(keys=list(settings))))
    differ = sorted(key for key, value in got.pairs if settings.get(key) != value)
    if differ or len(got.pairs) != len(settings):
        raise IoxError(f"the Spark Connect server did not keep iox-batch's settings ({', '.join(differ)[:300]}); "
                       "it cannot run iox-batch's queries as they must run")


def release(spark: Any) -> None:
    """End `spark`'s session on the server (its views go at once, not at the server's idle timeout) and close
    the connection. Nothing is reported: the command's work is done and its result written."""
    _GATES.pop(id(spark), None)
    # Whatever of this session still runs there (an operation a budget's interrupt reached before it had
    # started) stops with the command, rather than holding the server's cores for the next one. Each call on its
    # own: a failed interrupt must not keep the session from being released (releasing it interrupts its
    # operations too), nor a failed release leave the interrupt untried.
    for end in (spark.interruptAll, spark.client.release_session):
        try:
            end()
        except Exception:  # noqa: BLE001 - a server gone by now has nothing left to release
            pass
    _forget(spark)


def _forget(spark: Any) -> None:
    """Close `spark`'s connection (its session released, or its server gone) and have PySpark forget it as the
    process's default and active session (`stop` does both): a process that goes on (an Airflow task's retry under
    `dag.test`, a caller of the CLI's `main`) must get a new session from `getOrCreate`, not this one (and a
    successor of a closed one would find no active session)."""
    spark.release_session_on_close = False
    spark.stop()


def gate_plan_json(spark: Any, text: str) -> str:
    """The JSON of the plan the server's SQL parser builds for `text` (nothing analyzed or run), from its gate
    endpoint; `BadQueryError` when it does not parse. Fails closed: a session without a known gate, a gate that
    does not answer in time, refuses the token or answers anything but a plan, and the query does not run."""
    entry = _GATES.get(id(spark))
    if entry is None:
        raise UnsupportedError("this Spark Connect session has no gate endpoint to read the query with its server's "
                               "parser, so the query does not run; open it with spark_jobs.connect.remote_session")
    remote = entry[1]
    where = f"{remote.gate_host}:{remote.gate_port}"
    data = text.encode("utf-8")
    if len(data) > GATE_MAX_BYTES:
        raise BadQueryError(f"the query is {len(data):,} bytes, more than the {GATE_MAX_BYTES:,} the last gate reads")
    conn = (http.client.HTTPSConnection(remote.gate_host, remote.gate_port, timeout=GATE_TIMEOUT_S,
                                        context=ssl.create_default_context(cafile=remote.ca))
            if remote.tls else http.client.HTTPConnection(remote.gate_host, remote.gate_port, timeout=GATE_TIMEOUT_S))
    try:
        conn.request("POST", GATE_PATH, body=data, headers={"Authorization": f"Bearer {remote.token}",
                                                            "Content-Type": "text/plain; charset=utf-8"})
        response = conn.getresponse()
        status, body = response.status, response.read(_MAX_ANSWER + 1)
    except (OSError, http.client.HTTPException) as err:
        raise SparkUnavailableError(
            f"the last gate of the Spark Connect server (its parse endpoint at {where}) did not answer "
            f"({type(err).__name__}), so the query was not run: nothing ran and nothing was published. Run it again "
            "once the server is up (`iox-batch spark status`; with IOX_SPARK_REMOTE, the gate listens on "
            "IOX_SPARK_GATE_PORT, by default the Connect port + 1)") from err
    finally:
        conn.close()
    if status == 401:
        raise BadInputError(f"the last gate of the Spark Connect server at {where} refused the token, so the query "
                            "was not run; IOX_SPARK_GATE_TOKEN must be the token the server was started with")
    answer = _json_object(body) if len(body) <= _MAX_ANSWER else None
    if status == 503 and answer is not None and answer.get("error") == "busy":
        raise SparkUnavailableError(f"the last gate of the Spark Connect server at {where} is busy with other "
                                    "queries' parses, so the query was not run: nothing ran and nothing was "
                                    "published. Run it again in a moment")
    if status == 200 and answer is not None and isinstance(answer.get("plan"), str):
        return str(answer["plan"])
    if status == 200 and answer is not None and answer.get("error") == "parse":
        raise BadQueryError(str(answer.get("message", "the query does not parse in Spark"))[:2000])
    raise UnsupportedError(f"the last gate of the Spark Connect server at {where} gave no plan (HTTP {status}"
                           f"{', ' + str(answer.get('error'))[:40] if answer else ''}), so the query was not run; "
                           "is that address an iox-batch Spark Connect server (iox-batch spark start)?")


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def token_refused(err: BaseException, url: str) -> BadInputError | None:
    """The user's error when `err` is the server refusing the session's token (gRPC's UNAUTHENTICATED), else
    None: the server runs nothing without the token it was started with."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    if not (isinstance(err, SparkConnectGrpcException) and err.getGrpcStatusCode().name == "UNAUTHENTICATED"):
        return None
    return BadInputError(f"the Spark Connect server at {url} refused the token, so nothing was run; "
                         f"{GATE_TOKEN_ENV} (or the iox_spark_connect connection's password) must be the token the "
                         "server was started with (the project's own server's is in .iox/spark-connect.json)")


def server_lost(err: BaseException, url: str | None = None) -> SparkUnavailableError | None:
    """The retryable error when `err` (or what caused it) is the server gone or unreachable (gRPC's UNAVAILABLE,
    after the client's retries) or restarted (it no longer knows this session), else None. Read from the gRPC
    status and Spark's error condition, never from message text (which may quote the user's query)."""
    import grpc
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
