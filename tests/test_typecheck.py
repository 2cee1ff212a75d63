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
        "import iox_planner.catalog.store, iox_planner.catalog.schema, iox_planner.catalog.migrations, iox_planner.ingest.write, iox_planner.ingest.scenario, iox_planner.planner, "
        "iox_planner.cli.main, iox_planner.cli.commands, iox_planner.output.formats, iox_planner.output.publish, iox_planner.ingest.dedup, iox_planner.cli.show, "
        "iox_planner.ingest.register, iox_planner.catalog.runs, iox_planner.spark.conf, iox_planner.spark.jobs, "
        "iox_planner.spark.launch, iox_planner.spark.submit, iox_planner.catalog.locks, "
        "iox_planner.storage, iox_planner.ingest.bulk, iox_planner.maintenance.persist, iox_planner.maintenance.sweeps, "
        "iox_planner.maintenance.compact.run, iox_planner.maintenance.compact.batches\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'airflow', 'py4j'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


# --- layers ---------------------------------------------------------------------------------------------------------
# Each module's layer, bottom first: a module may import its own layer or one below, never one above. The order is
# written out here (not derived from the code) so that a new upward import fails this test.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("iox_planner", "iox_planner.errors", "iox_planner.timeutil", "iox_planner.model",
              "iox_planner.config", "iox_planner.objectstore", "iox_planner.slicing", "iox_planner.faults", "iox_planner.userfiles",
              # Spark's settings, a query's budget and spark-submit's run: no pyspark, below everything.
              "iox_planner.spark.conf", "iox_planner.spark.budget", "iox_planner.spark.submit")),
    ("catalog", ("iox_planner.catalog",)),
    ("storage", ("iox_planner.storage",)),
    ("ingest", ("iox_planner.ingest",)),
    ("maintenance", ("iox_planner.maintenance",)),
    ("planner", ("iox_planner.planner",)),
    ("output", ("iox_planner.output",)),
    ("spark seam", ("iox_planner.spark",)),  # the job specs and launchers: what every caller starts jobs with
    ("runs", ("iox_planner.runs",)),
    ("spark_jobs", ("spark_jobs",)),
    ("entry points", ("iox_planner.cli", "iox_airflow")),
]
PACKAGES = {"iox_planner": ROOT / "plugins" / "iox_planner", "spark_jobs": ROOT / "spark_jobs",
            "iox_airflow": ROOT / "dags" / "iox_airflow"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file, lazy imports inside functions included:
    they are dependencies too), read with `ast` so nothing is imported."""
    import ast

    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: relative import (the layers use absolute imports)"
                base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _layer(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer): the longest matching prefix decides
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best[1]


def test_the_import_graph_is_acyclic() -> None:
    graph = _import_graph()
    assert len(graph) > 50  # the walk found the packages
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_dependencies_point_down_the_layers() -> None:
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
              for m, targets in _import_graph().items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert upward == []


def test_no_library_or_dag_code_imports_a_spark_submit_script() -> None:
    """`spark_jobs/run_*.py` are entry points: what a script and another caller share lives in the library or in
    the one job wrapper (`spark_jobs/job.py`)."""
    scripts = {m for m in _modules() if m.startswith("spark_jobs.run_")}
    assert len(scripts) >= 4
    assert [f"{m} imports {t}" for m, targets in _import_graph().items() if not m.startswith("spark_jobs.")
            for t in sorted(targets & scripts)] == []


def test_the_layering_check_sees_an_upward_import() -> None:
    """The check itself: the catalog importing the CLI would be reported."""
    assert _layer("iox_planner.cli.main") > _layer("iox_planner.catalog.store")
    assert _layer("iox_airflow.pipeline") > _layer("spark_jobs.execute") > _layer("iox_planner.runs.planning")
    assert _layer("iox_planner.runs.refresh") > _layer("iox_planner.output.formats") > _layer("iox_planner.planner")
    assert _layer("iox_planner.spark.conf") == 0 < _layer("iox_planner.output") < _layer("iox_planner.spark.jobs")
    assert _layer("iox_planner.spark.launch") < _layer("iox_planner.runs.refresh")
    assert _layer("iox_planner.catalog.locks") < _layer("iox_planner.storage") < _layer("iox_planner.ingest.write")
    assert _layer("iox_planner.ingest.bulk") < _layer("iox_planner.maintenance.sweeps") < _layer("iox_planner.planner")


def test_the_cli_and_the_dags_never_import_each_other() -> None:
    """Both entry points call the run domain (`iox_planner.runs`); neither reaches into the other (the DAG files
    included, read with `ast` like the packages)."""
    import ast

    graph = _import_graph()
    crossing = [f"{m} imports {t}" for m, targets in graph.items() for t in sorted(targets)
                if (m.startswith("iox_planner.cli") and t.startswith("iox_airflow"))
                or (m.startswith("iox_airflow") and t.startswith("iox_planner.cli"))]
    for path in sorted((ROOT / "dags").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            crossing += [f"dags/{path.name} imports {n}" for n in names if n.startswith("iox_planner.cli")]
    assert crossing == []


HEAVY = ("pyarrow", "numpy", "sqlalchemy", "pyspark", "sqlglot")


def _heavy_project_modules() -> set[str]:
    """Project modules that import a HEAVY package at module level (so importing them costs it)."""
    import ast

    heavy = set()
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(n.split(".")[0] in HEAVY for n in names):
                heavy.add(name)
    return heavy


def test_dag_files_import_nothing_heavy_at_parse_time(tmp_path: Path) -> None:
    """The scheduler parses every DAG file over and over: each one, imported in a fresh interpreter, must load
    none of pyarrow, numpy, SQLAlchemy, PySpark and sqlglot beyond what Airflow itself loads (Airflow's own
    SDK imports SQLAlchemy), and no project module that imports one of them at module level."""
    import os

    dags = ROOT / "dags"
    files = sorted(dags.glob("*.py"))
    assert {f.name for f in files} >= {"iox_query.py", "iox_materialized.py", "iox_maintenance.py"}
    heavy_modules = _heavy_project_modules()
    assert {"iox_planner.catalog.store", "iox_planner.ingest.register", "spark_jobs.execute"} <= heavy_modules
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dags), str(ROOT / "plugins"), str(ROOT)]),
           "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "IOX_HOME": str(ROOT)}
    report = (f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
              f"print(','.join(sorted(set(sys.modules) & set({sorted(heavy_modules)!r}))))\n"
              "print('airflow' in sys.modules)\n")

    def run(code: str, what: str) -> list[str]:
        result = subprocess.run([sys.executable, "-c", "import runpy, sys\n" + code + report], capture_output=True,
                                text=True, timeout=300, env=env, cwd=ROOT)
        assert result.returncode == 0, f"{what}: {result.stderr[-2000:]}"
        return result.stdout.split("\n")[-4:-1]

    airflow_own = set(run("import airflow.sdk\n"
                          "import airflow.providers.apache.spark.operators.spark_submit\n", "airflow")[0].split(","))
    for dag_file in files:
        heavy, ours, airflow = run(f"runpy.run_path({str(dag_file)!r}, run_name='dag_parse')\n", dag_file.name)
        assert (dag_file.name, set(heavy.split(",")) - airflow_own, ours, airflow) == (dag_file.name, set(), "", "True")


def test_the_tests_mirror_the_package() -> None:
    """tests/<area>/ for each area of iox_planner (and spark_jobs, the DAGs' airflow), plus the two suites that
    cut across them; every module that is not a test, a conftest or a subprocess driver is a `*_support.py`."""
    areas = {p.name for p in (ROOT / "plugins" / "iox_planner").iterdir() if p.is_dir() and not p.name.startswith("_")}
    allowed = areas | {"spark_jobs", "airflow", "security", "faults", "fixtures"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= allowed, sorted(folders - allowed)
    drivers = {"dagtest_runner.py", "commit_driver.py"}  # run as processes of their own, never imported
    odd = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
           if not p.name.startswith("test_") and p.name != "conftest.py" and p.name not in drivers
           and not p.name.endswith("_support.py")]
    assert odd == [], odd
