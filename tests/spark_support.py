"""Spark tests share one local SparkSession (JVM start-up costs about 10 s) and run queries the way the CLI does."""

from __future__ import annotations

import io
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.output import OutputFormat
from iox_planner.planner import plan_query
from iox_planner.planner.nodes import QueryPlan
from iox_planner.ingest.scenario import load_scenario, parse_scenario


def load(catalog: Catalog, db: str, chunks: list[dict[str, Any]]) -> None:
    load_scenario(catalog, parse_scenario({"chunks": chunks}), db)


def plan(catalog: Catalog, db: str, sql: str, **kw: Any) -> QueryPlan:
    return plan_query(sql, CatalogSource(catalog, db), **kw)


def write_plan(folder: Path, catalog: Catalog, db: str, sql: str, *, optimize: bool = True, **kw: Any) -> Path:
    """The plan of `sql` as the CLI hands it to a launcher: a JSON file (`folder/plan.json`)."""
    from iox_planner.planner.serde import plan_to_json

    plan_file = folder / "plan.json"
    plan_file.write_text(plan_to_json(plan_query(sql, CatalogSource(catalog, db), optimize=optimize, **kw)))
    return plan_file


def run_jsonl(spark: Any, catalog: Catalog, db: str, sql: str, *, optimize: bool = True,
              strategy: str | None = None, **kw: Any) -> list[dict[str, Any]]:
    """The rows a user gets from `iox-batch query --format jsonl` on the in-process runner, parsed (the connect
    runner's: `connect_support.ConnectLeg`)."""
    from iox_planner.cli.runner import print_result
    from iox_planner.spark.budget import query_timeout_s
    from iox_planner.spark.jobs import PlanJob
    from spark_jobs.launch import InProcessLauncher

    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="iox-test-") as tmp:
        plan_file = write_plan(Path(tmp), catalog, db, sql, optimize=optimize, **kw)
        table = InProcessLauncher().fetch(PlanJob(plan_file, Path(tmp) / "result.arrow", OutputFormat.ARROW,
                                                  query_timeout_s(), strategy=strategy))
    print_result(table, OutputFormat.JSONL, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def warehouse_path() -> Path:
    from iox_planner.config import warehouse

    return warehouse()


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, stdout: io.StringIO | None = None) -> CliResult:
    """Run `iox-batch` in this process (sharing the test session's SparkSession), capturing its output
    (standard output into `stdout` when given: one that says it is a terminal, say)."""
    import contextlib

    from iox_planner.cli import main as iox_cli

    out, err = stdout if stdout is not None else io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = iox_cli.main(list(args))
    return CliResult(code, out.getvalue(), err.getvalue())
