"""docker-compose.yml cannot run here (no Docker engine): check that it parses and that its services, images,
volumes and environment agree with each other and with the code's settings: the lake in a bucket of the minio
service that minio-init makes, every iox-batch process given the standard AWS_* settings in its environment (no
secret written in the file, none on a command line), and no shared data volume."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from airflow_support import ROOT
from iox_airflow.spark import connect_connection, spark_connection

COMPOSE = ROOT / "docker-compose.yml"
AIRFLOW = ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor")
SPARK = ("spark-master", "spark-worker", "spark-connect")
TLS = ("spark-tls-init", "spark-tls-proxy")
STORE = ("minio", "minio-init")
STORE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL")
TEMPLATE = ROOT / "scripts" / "spark-tls-proxy.conf.template"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume name."""
    out = {}
    for item in service.get("volumes", []):
        source, target = str(item).split(":")[:2]
        out[target] = source
    return out


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", *AIRFLOW, *SPARK, *TLS, *STORE}
    assert services["postgres"]["image"].startswith("postgres:")
    images = {services[name]["image"] for name in (*AIRFLOW, *SPARK, "spark-tls-init")}
    assert images == {"iox-batch:local"}, "every Airflow and Spark container runs the one project image"
    dockerfile = services["airflow-scheduler"]["build"]["dockerfile_inline"]
    airflow_version = version("apache-airflow")
    assert re.search(rf"^FROM apache/airflow:{re.escape(airflow_version)}-python3\.11$", dockerfile, re.M)
    assert "requirements.lock" in dockerfile and "openjdk-17" in dockerfile
    assert "grep -E '^pyspark=='" in dockerfile  # pyspark put back over pyspark-client (ENVIRONMENT.md)
    assert "pip install --no-cache-dir --no-deps -e /opt/iox" in dockerfile
    assert [command_of(services[s])[:2] for s in AIRFLOW[1:]] == [
        ["airflow", "api-server"], ["airflow", "scheduler"], ["airflow", "dag-processor"]]
    init = " ".join(command_of(services["airflow-init"]))
    assert "airflow db migrate" in init and "iox-batch catalog migrate" in init
    assert "mkdir -p /tls && chown -R airflow:root /tls" in dockerfile and "/data" not in dockerfile


def test_environment_agrees_with_the_code_and_across_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg = env_of(services["postgres"])
    master_cmd = command_of(services["spark-master"])
    master = f"spark://{master_cmd[master_cmd.index('--host') + 1]}:{master_cmd[master_cmd.index('--port') + 1]}"
    assert command_of(services["spark-worker"])[:3] == ["spark-class", "org.apache.spark.deploy.worker.Worker",
                                                        master]
    for name in (*AIRFLOW, *SPARK):
        env = env_of(services[name])
        # The catalog: the postgres service's own user, password and database.
        url = sa.engine.make_url(env["IOX_CATALOG_URL"])
        assert url.drivername == "postgresql+psycopg2"
        assert (url.host, url.port, url.username, url.password, url.database) == (
            "postgres", 5432, pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
        # Spark: the master the cluster runs, and spark_default derived from it exactly as the code derives it.
        assert env["IOX_SPARK_MASTER"] == master
        assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == json.loads(spark_connection(master))
        # The warehouse and the outputs are in the bucket, reached with the standard settings; no data volume.
        assert set(mounts(services[name]).values()) <= {"iox-tls"}, name
        assert {k: env[k] for k in STORE_ENV} == {k: env_of(services["airflow-scheduler"])[k] for k in STORE_ENV}
        assert env["IOX_HOME"] == "/opt/iox" and env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/iox/dags"
        # Airflow's metadata: the same Postgres, database `airflow` (created by the postgres entrypoint), with
        # asyncpg for Airflow 3's async engine.
        meta = sa.engine.make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        meta_async = sa.engine.make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"])
        assert (meta.host, meta.database, meta_async.host, meta_async.database) == (
            "postgres", "airflow", "postgres", "airflow")
        assert meta_async.drivername == "postgresql+asyncpg"
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] != "/opt/iox/plugins"  # never import iox_planner one by one
    assert "CREATE DATABASE airflow" in " ".join(command_of({"command": services["postgres"]["entrypoint"]}))
    assert command_of(services["airflow-api-server"])[-2:] == ["--port", "8080"]
    assert "8080:8080" in services["airflow-api-server"]["ports"]
    scheduler_conf = env_of(services["airflow-scheduler"])["IOX_SPARK_CONF"]
    assert "spark.driver.host=airflow-scheduler" in scheduler_conf
    assert set(compose["volumes"]) == {"postgres-data", "minio-data", "iox-tls"}
    # The server listens on its container's loopback only (no --host), its gate on the port after; the CLI in
    # every container reaches both through the TLS proxy, with one token that has no default, trusting the CA in
    # the iox-tls volume; the image needs a JRE only (no code compiled at start).
    connect_cmd = " ".join(command_of(services["spark-connect"]))
    assert "iox-batch spark start --port 15002 " in connect_cmd and "--host" not in connect_cmd
    for name in (*AIRFLOW, *SPARK):
        env = env_of(services[name])
        assert (env["IOX_RUNNER"], env["IOX_SPARK_REMOTE"], env["IOX_SPARK_GATE_PORT"]) == (
            "connect", "sc://spark-connect:15443", "15444")
        assert env["IOX_SPARK_GATE_TOKEN"].startswith("${IOX_SPARK_GATE_TOKEN:?")
        assert env["IOX_SPARK_TLS_CA"] == "/tls/ca.pem" and mounts(services[name])["/tls"] == "iox-tls"
    # The DAGs' Spark steps run on the same server (IOX_RUNNER=connect in the Airflow services), named by the
    # connection as the code reads it: the proxy's host and port, its gate's port, TLS; the token from
    # IOX_SPARK_GATE_TOKEN.
    for name in AIRFLOW:
        conn = json.loads(env_of(services[name])["AIRFLOW_CONN_IOX_SPARK_CONNECT"])
        assert conn == json.loads(connect_connection("spark-connect", 15443, 15444, use_ssl=True))
    assert "openjdk-17-jre-headless" in services["spark-connect"]["build"]["dockerfile_inline"]
    assert "-jdk" not in services["spark-connect"]["build"]["dockerfile_inline"]


def test_the_tls_proxy_fronts_the_servers_loopback_ports_with_the_ca_clients_trust(compose: dict[str, Any]) -> None:
    """spark-tls-proxy shares spark-connect's network (so it reaches the server's loopback ports and listens on
    the name clients use), fills the committed template with ports that match both sides, and serves the
    certificate spark-tls-init makes for that name, signed by the CA clients trust."""
    services = compose["services"]
    proxy, init = services["spark-tls-proxy"], services["spark-tls-init"]
    assert proxy["network_mode"] == "service:spark-connect" and "ports" not in proxy
    env = env_of(proxy)
    placeholders = set(re.findall(r"\$\{(\w+)\}", TEMPLATE.read_text()))
    assert placeholders and placeholders <= set(env)
    assert mounts(proxy)["/etc/nginx/templates/spark-tls-proxy.conf.template"] == "./" + str(
        TEMPLATE.relative_to(ROOT))
    assert mounts(proxy)["/tls"] == "iox-tls" and mounts(init)["/tls"] == "iox-tls"
    assert (env["IOX_PROXY_CONNECT_UPSTREAM"], env["IOX_PROXY_GATE_UPSTREAM"]) == ("127.0.0.1:15002",
                                                                                  "127.0.0.1:15003")
    client = env_of(services["airflow-scheduler"])
    assert f"sc://spark-connect:{env['IOX_PROXY_CONNECT_LISTEN']}" == client["IOX_SPARK_REMOTE"]
    assert env["IOX_PROXY_GATE_LISTEN"] == client["IOX_SPARK_GATE_PORT"]
    made = " ".join(command_of(init))
    assert "subjectAltName=DNS:spark-connect" in made and "-out ca.pem" in made
    assert {PurePosixPath(env["IOX_PROXY_CERT"]).name, PurePosixPath(env["IOX_PROXY_KEY"]).name} == {
        "proxy.pem", "proxy.key"} and "-out proxy.pem" in made and "-keyout proxy.key" in made
    assert client["IOX_SPARK_TLS_CA"] == "/tls/" + "ca.pem"
    assert {"condition": "service_healthy"} == proxy["depends_on"]["spark-connect"]


def test_compose_validates_where_a_compose_cli_exists(tmp_path: Path) -> None:
    cli = shutil.which("docker-compose")
    if cli is None:
        pytest.skip("no docker-compose CLI on this machine (the YAML checks above still ran)")
    done = subprocess.run([cli, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "IOX_SPARK_GATE_TOKEN": "0" * 64})
    assert done.returncode == 0, done.stderr


def test_the_lake_is_a_bucket_every_process_reaches_with_the_standard_aws_settings(compose: dict[str, Any]) -> None:
    """IOX_WAREHOUSE and IOX_OUTPUT_ROOT name the bucket minio-init makes (with MinIO's client, whose credentials
    come from its environment), on the endpoint of the minio service, with that service's credentials; the secret
    is never written here (it comes from `.env`, required) and is on no command line."""
    from iox_planner import config, objectstore

    services = compose["services"]
    minio, init = services["minio"], services["minio-init"]
    minio_env = env_of(minio)
    made = command_of({"command": init["entrypoint"]})
    assert made[:3] == ["mc", "mb", "--ignore-existing"]
    alias, bucket = made[3].split("/", 1)
    store = env_of(init)[f"MC_HOST_{alias}"]
    assert store.startswith("http://${IOX_S3_ACCESS_KEY:-iox-batch}:${IOX_S3_SECRET_KEY:?") and store.endswith(
        "@minio:9000")
    assert minio_env["MINIO_ROOT_PASSWORD"].startswith("${IOX_S3_SECRET_KEY:?")
    assert minio["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
    assert init["depends_on"]["minio"] == {"condition": "service_healthy"}
    assert services["airflow-init"]["depends_on"]["minio-init"] == {"condition": "service_completed_successfully"}
    assert mounts(minio)["/data"] == "minio-data"
    for name in (*AIRFLOW, *SPARK):
        env = env_of(services[name])
        warehouse = config.WAREHOUSE.parse(env["IOX_WAREHOUSE"])
        assert not warehouse.is_local and warehouse.bucket == bucket, name
        assert objectstore.uri_problem(env["IOX_OUTPUT_ROOT"]) is None
        assert objectstore.parse_root(env["IOX_OUTPUT_ROOT"]).bucket == bucket
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
        assert env["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]
        assert env["AWS_SECRET_ACCESS_KEY"].startswith("${IOX_S3_SECRET_KEY:?"), "no default secret"
        assert env["AWS_REGION"]
        command = " ".join(command_of(services[name]))
        assert "AWS_" not in command and "IOX_S3_SECRET_KEY" not in command and "fs.s3a" not in command, name
        assert "fs.s3a" not in env.get("IOX_SPARK_CONF", "") and "AWS_" not in env.get("IOX_SPARK_CONF", "")
