"""The Spark job on a real standalone cluster (a master and a worker started here) gives the rows local mode
gives."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from common_support import free_port, run_cli
from iox_planner.catalog.store import Catalog
from spark_support import cli, load

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T0 = 1_704_067_200_000_000_000


def _wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spark_class = Path(sys.executable).parent / "spark-class"
    logs = tmp_path_factory.mktemp("cluster")
    port, web, worker_web = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / "work")}
    url = f"spark://127.0.0.1:{port}"
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(web)], stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True))
        _wait_for_port(port, time.monotonic() + 90)
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--cores", "2", "--memory", "2g",
             "--webui-port", str(worker_web)], stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT,
            env=env, start_new_session=True))
        deadline = time.monotonic() + 90
        while "registered with master" not in (logs / "worker.log").read_text().lower():
            if time.monotonic() > deadline:
                raise TimeoutError("the Spark worker did not register: " + (logs / "worker.log").read_text()[-2000:])
            time.sleep(0.5)
        yield url
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)


SQL = "SELECT t, v, w, time FROM m ORDER BY t"
EXPECTED = [("a", 10.0, 1.0), ("b", 2.0, 21.0), ("c", 3.0, None), ("d", 4.0, None)]


def _load(catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "F1", "kind": "parquet", "lines": f"m,t=a v=1,w=1 {T0}\nm,t=b v=2 {T0 + 1}\nm,t=c v=3 {T0 + 2}"},
        {"id": "F2", "kind": "parquet", "lines": f"m,t=a v=10 {T0}\nm,t=d v=4 {T0 + 3}"},
        {"id": "I3", "kind": "ingester", "lines": f"m,t=b w=20 {T0 + 1}\nm,t=b w=21 {T0 + 1}"},
    ])


def test_standalone_cluster_gives_the_same_rows_as_local(cluster: str, spark: Any, catalog: Catalog, db: str,
                                                         tmp_path: Path) -> None:
    _load(catalog, db)
    local_out, cluster_out = tmp_path / "local.jsonl", tmp_path / "cluster.jsonl"
    local = cli("query", "--db", db, SQL, "--format", "jsonl", "--output", str(local_out))
    assert local.returncode == 0, local.stderr
    remote = run_cli("query", "--db", db, SQL, "--format", "jsonl", "--output", str(cluster_out),
                     env={"IOX_SPARK_MASTER": cluster, "IOX_RUNNER": "spark-submit"})
    assert remote.returncode == 0, remote.stderr
    rows = [json.loads(line) for line in cluster_out.read_text().splitlines()]
    assert rows == [json.loads(line) for line in local_out.read_text().splitlines()]
    assert [(r["t"], r["v"], r["w"]) for r in rows] == EXPECTED


def test_standalone_cluster_writes_parquet_where_nobody_else_can_repoint_it(cluster: str, catalog: Catalog, db: str,
                                                                           tmp_path: Path) -> None:
    """The executors write the Parquet folder by name (they cannot use the driver's descriptors): allowed here,
    below folders only this user and root can change, and published like any other output."""
    import pyarrow.parquet as pq

    _load(catalog, db)
    out = tmp_path / "cluster.parquet"
    remote = run_cli("query", "--db", db, SQL, "--format", "parquet", "--output", str(out),
                     env={"IOX_SPARK_MASTER": cluster, "IOX_RUNNER": "spark-submit"})
    assert remote.returncode == 0, remote.stderr
    rows = sorted((r["t"], r["v"], r["w"]) for r in pq.read_table(out).to_pylist())
    assert rows == EXPECTED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.parquet"]  # no staging or lock left beside it


def test_standalone_cluster_reads_an_s3_warehouse_with_the_workers_own_credentials(
        cluster: str, catalog: Catalog, db: str, tmp_path: Path, s3_warehouse: str) -> None:
    """The chunk files are read by the cluster's executors, with the AWS settings of the worker's environment:
    the query's own process (the driver, in-process: its result comes back without an output file) runs without
    any, since nothing on the driver reads the store, so no credential can have travelled with the job."""
    from s3_support import CREDENTIALS

    _load(catalog, db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"IOX_SPARK_MASTER": cluster, "IOX_RUNNER": "in-process"})
    remote = subprocess.run([str(Path(sys.executable).parent / "iox-batch"), "query", "--db", db, SQL, "--format",
                             "jsonl"], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr
    assert [(r["t"], r["v"], r["w"]) for r in map(json.loads, remote.stdout.splitlines())] == EXPECTED
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in remote.stdout + remote.stderr
