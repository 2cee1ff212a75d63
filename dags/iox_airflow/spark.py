"""How the DAGs reach Spark. IOX_RUNNER=connect (the CLI's setting too): their Spark jobs run on a Spark Connect
server, the one the `iox_spark_connect` connection names, else the one the CLI uses (IOX_SPARK_REMOTE, or the
project's own server). Otherwise through spark-submit: the `spark_default` connection derived from
IOX_SPARK_MASTER, and the environment spark-submit runs in (iox_planner.spark.conf builds it). No Airflow import
at module level (docker-compose.yml's test checks its settings against these)."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from iox_planner.spark.server import Remote
    from spark_jobs.launch import ConnectLauncher

SPARK_CONN_ID = "spark_default"
CONNECT_CONN_ID = "iox_spark_connect"
GATE_PORT_EXTRA = "gate_port"
GATE_TOKEN_EXTRA = "gate_token"


def spark_connection(master: str) -> str:
    """`spark_default` for a Spark master (`local[*]`, `spark://host:7077`), in the JSON form Airflow reads from
    `AIRFLOW_CONN_SPARK_DEFAULT` (the URI form `spark://local[2]` would silently mean YARN)."""
    return json.dumps({"conn_type": "spark", "host": master})


def ensure_spark_connection(conn_id: str = SPARK_CONN_ID) -> None:
    """Derive the connection from IOX_SPARK_MASTER (unset: `local[*]`) unless the environment defines it
    explicitly (`AIRFLOW_CONN_SPARK_DEFAULT`, as docker-compose.yml does)."""
    from iox_planner.spark.conf import spark_master

    os.environ.setdefault(f"AIRFLOW_CONN_{conn_id.upper()}", spark_connection(spark_master()))


def uses_connect() -> bool:
    """The DAGs run their Spark jobs over Spark Connect: IOX_RUNNER=connect. Any other runner means spark-submit
    (an Airflow worker runs no Spark session of its own)."""
    from iox_planner.spark.launch import Runner, chosen_runner

    return chosen_runner() is Runner.CONNECT


def connect_connection(host: str, port: int, gate_port: int | None = None, gate_token: str | None = None) -> str:
    """`iox_spark_connect` in the JSON form Airflow reads from `AIRFLOW_CONN_IOX_SPARK_CONNECT`: the provider's
    `spark_connect` type (host and port), the server's gate in the extra (`gate_port`, default the Connect port + 1;
    `gate_token`, default IOX_SPARK_GATE_TOKEN; Airflow masks a field named like a token)."""
    extra = {k: v for k, v in ((GATE_PORT_EXTRA, gate_port), (GATE_TOKEN_EXTRA, gate_token)) if v is not None}
    return json.dumps({"conn_type": "spark_connect", "host": host, "port": port, **({"extra": extra} if extra else {})})


def connect_remote(conn_id: str = CONNECT_CONN_ID) -> Remote:
    """The Spark Connect server the DAGs' jobs run on: `conn_id` when it is defined (its URL as the provider's hook
    builds it, which must be plain `sc://HOST:PORT`: a user id, token or TLS setting is refused rather than passed
    on unread; the gate from the extra, else IOX_SPARK_GATE_PORT and IOX_SPARK_GATE_TOKEN), else the server the CLI
    uses (`spark/server.py` `remote`: IOX_SPARK_REMOTE, or the project's own, started when it is not running)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from iox_planner import config
    from iox_planner.errors import BadInputError
    from iox_planner.spark.server import named_remote, remote

    hook = SparkConnectHook(conn_id)
    try:
        conn = hook.get_connection(conn_id)
    except AirflowNotFoundException:
        return remote()
    what = f"the connection {conn_id}"
    extra: dict[str, Any] = conn.extra_dejson
    if conn.login or conn.password or extra.get(SparkConnectHook.PARAM_USE_SSL) is not None:
        raise BadInputError(f"{what} sets a user id, a token or use_ssl, which iox-batch does not pass on to Spark "
                            f"Connect: give its host and port only, and the server's gate token in the extra "
                            f"{GATE_TOKEN_EXTRA!r} (or {config.SPARK_GATE_TOKEN.name})")
    try:
        url = hook.get_connection_url()
    except (ValueError, AttributeError, TypeError):
        raise BadInputError(f"{what} names no Spark Connect server: give its host and port (sc://HOST:PORT)") from None
    gate_port = extra.get(GATE_PORT_EXTRA)
    if gate_port is not None and (isinstance(gate_port, bool) or not isinstance(gate_port, int)):
        gate_port = config.whole_number(str(gate_port)) or -1
    token = extra.get(GATE_TOKEN_EXTRA) or config.SPARK_GATE_TOKEN.read() or None
    return named_remote(url, gate_port or config.SPARK_GATE_PORT.read() or None,
                        str(token) if token else None, what=what,
                        gate_port_what=f"its extra {GATE_PORT_EXTRA!r} (or {config.SPARK_GATE_PORT.name})",
                        token_what=f"its extra {GATE_TOKEN_EXTRA!r} (or {config.SPARK_GATE_TOKEN.name})")


@contextmanager
def connect_launcher(conn_id: str = CONNECT_CONN_ID) -> Iterator[ConnectLauncher]:
    """The seam's Connect launcher on `conn_id`'s server (`connect_remote`), its progress in the task's log; the
    task's session on the server ends with the block, however it ends (a retry, or the next task in the same
    process, opens its own)."""
    from spark_jobs.connect import release_shared
    from spark_jobs.launch import ConnectLauncher

    try:
        yield ConnectLauncher(progress=print, remote=connect_remote(conn_id))
    finally:
        release_shared()
