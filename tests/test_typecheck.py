"""The package passes `mypy --strict` (configured in pyproject.toml), as the planner core must."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_imports_neither_spark_nor_airflow() -> None:
    """Everything but the query-running CLI commands and the runner stays free of Spark and Airflow."""
    code = (
        "import sys\n"
        "import iox_planner.catalog.store, iox_planner.ingest.write, iox_planner.ingest.scenario, iox_planner.planner, "
        "iox_planner.cli.main, iox_planner.cli.commands, iox_planner.output.formats, iox_planner.ingest.dedup, iox_planner.cli.show, "
        "iox_planner.ingest.register\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'airflow', 'py4j'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
