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
"""Where earlier releases read the token (still read when the password is empty)."""
USE_SSL_EXTRA = "use_ssl"
"""The provider's own extra (`SparkConnectHook.PARAM_USE_SSL`)."""


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


def connect_connection(host: str, port: int, gate_port: int | None = None, token: str | None = None,
                       use_ssl: bool = False) -> str:
    """`iox_spark_connect` in the JSON form Airflow reads from `AIRFLOW_CONN_IOX_SPARK_CONNECT`: the provider's
    `spark_connect` type (host and port; the server's token in its password, the field the provider's form calls
    Token and Airflow masks in logs; default IOX_SPARK_GATE_TOKEN), the gate's port in the extra (`gate_port`,
    default the Connect port + 1), and `use_ssl` for a server reached through a TLS proxy (its CA:
    IOX_SPARK_TLS_CA)."""
    extra: dict[str, Any] = {GATE_PORT_EXTRA: gate_port} if gate_port is not None else {}
    if use_ssl:
        extra[USE_SSL_EXTRA] = True
    return json.dumps({"conn_type": "spark_connect", "host": host, "port": port,
                       **({"password": token} if token is not None else {}), **({"extra": extra} if extra else {})})


def connect_remote(conn_id: str = CONNECT_CONN_ID) -> Remote:
    """The Spark Connect server the DAGs' jobs run on: `conn_id` when it is defined (host and port, `sc://HOST:PORT`
    as PySpark reads it; the server's token from its password, else the extra `gate_token` of earlier
    releases, else IOX_SPARK_GATE_TOKEN; the gate's port from the extra, else IOX_SPARK_GATE_PORT; TLS when its
    extra `use_ssl` is true, trusting IOX_SPARK_TLS_CA or the system's CAs; a user id is refused rather than passed
    on unread), else the server the CLI uses (`spark/server.py` `remote`: IOX_SPARK_REMOTE, or the project's own,
    started when it is not running). The token is read, never put in a URL or a message."""
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
    if conn.login:
        raise BadInputError(f"{what} sets a user id, which iox-batch does not pass on to Spark Connect: give its "
                            "host and port, the server's token as its password (Token), the gate's port in the "
                            f"extra {GATE_PORT_EXTRA!r}")
    use_ssl = extra.get(USE_SSL_EXTRA, False)
    if not isinstance(use_ssl, bool):
        use_ssl = str(use_ssl).strip().lower()
        if use_ssl not in ("true", "false"):
            raise BadInputError(f"{what}'s extra {USE_SSL_EXTRA!r} is neither true nor false")
        use_ssl = use_ssl == "true"
    host = str(conn.host or "")
    url = (host if "://" in host else f"sc://{host}") + (f":{conn.port}" if conn.port else "")
    gate_port = extra.get(GATE_PORT_EXTRA)
    if gate_port is not None and (isinstance(gate_port, bool) or not isinstance(gate_port, int)):
        gate_port = config.whole_number(str(gate_port)) or -1
    token = conn.password or extra.get(GATE_TOKEN_EXTRA) or config.SPARK_GATE_TOKEN.read() or None
    ca = config.SPARK_TLS_CA.read()
    return named_remote(url, gate_port or config.SPARK_GATE_PORT.read() or None,
                        str(token) if token else None, what=what,
                        gate_port_what=f"its extra {GATE_PORT_EXTRA!r} (or {config.SPARK_GATE_PORT.name})",
                        token_what=f"its password (Token) (or {config.SPARK_GATE_TOKEN.name})",
                        tls=use_ssl, ca=str(ca) if use_ssl and ca is not None else None,
                        tls_what=f"its extra {USE_SSL_EXTRA!r} to true (and {config.SPARK_TLS_CA.name} to the PEM "
                                 "file of the CA that signed the proxy's certificate)")


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
