"""Issue 8 through a triggered `iox_query` run: hostile SQL fails in the plan task, names what it refused, runs
nothing, publishes nothing, and the run's recorded error is one short paragraph (tests/security holds the rest)."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow_support import DagRunner, leftovers, locks, query_runs

from iox_planner.catalog.store import Catalog

pytestmark = [pytest.mark.airflow]

PWNED = Path("/tmp/iox_sec_airflow_pwned")


def test_hostile_sql_fails_in_the_plan_task(dag_runner: DagRunner, catalog: Catalog, h2o_db: str,
                                            tmp_path: Path) -> None:
    PWNED.unlink(missing_ok=True)
    cases = {
        "reflect": (f"SELECT `reflect`('org.apache.spark.util.Utils', 'checkCommandAvailable', 'x; id > {PWNED}') "
                    "FROM h2o", "reflect()"),
        "java_method": ("SELECT city FROM h2o WHERE `JAVA_METHOD`('org.apache.spark.util.Utils', "
                        "'getPropertiesFromFile', '/etc/passwd') IS NOT NULL", "JAVA_METHOD()"),
        "script": (f"SELECT MAP(city) USING 'touch {PWNED}' FROM h2o", "external script"),
        "variable": ("SELECT ${env:HOME} FROM h2o", "variable reference"),
        # sqlglot's re-printing once made this a CREATE TABLE that wrote every row outside the output roots
        "into": ("SELECT * INTO pwned FROM h2o", "SELECT ... INTO"),
        "huge": ("SELECT nope_" + "x" * 100_000 + " FROM h2o", "message cut"),
        # issue 31: this hint ended the shared Spark server's JVM; refused in the same planner path as the CLI
        "hint": ("SELECT /*+ REPARTITION(2147483647) */ count(*) AS c FROM h2o", "IOX_MAX_HINT_PARTITIONS"),
    }
    specs = [{"dag_id": "iox_query", "conf": {"db": h2o_db, "sql": sql, "output": str(tmp_path / f"{name}.jsonl"),
                                              "format": "jsonl"}}
             for name, (sql, _) in cases.items()]
    results = dag_runner.run(specs)
    for (name, (_, needle)), result in zip(cases.items(), results):
        assert result.get("state") == "failed", (name, result.get("error"), result["log"][-3000:])
        assert result["tasks"]["plan"] == "failed", (name, result["tasks"])
        assert not (tmp_path / f"{name}.jsonl").exists(), name
        [run] = query_runs(catalog, dag_id="iox_query", run_id=result["run_id"])
        assert run["status"] == "failed", name
        assert needle in run["error"], (name, run["error"][:500])
        assert len(run["error"]) <= 2_000 and "Traceback" not in run["error"], name
    assert not PWNED.exists()
    assert leftovers(tmp_path) == []
    assert locks(catalog) == []
