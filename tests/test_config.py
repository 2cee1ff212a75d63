"""The settings registry (`config.py`): every `IOX_*` variable the code reads is declared there and read through it,
README's configuration table is the registry's, one rule reads whole numbers everywhere (`1_000` included), and a
bad value of each kind fails where it is read, in one paragraph naming the variable and what it allows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from iox_planner import config
from iox_planner.errors import BadInputError

ROOT = Path(__file__).resolve().parents[1]
CODE = [ROOT / "plugins" / "iox_planner", ROOT / "spark_jobs", ROOT / "dags"]


def _code_files() -> list[Path]:
    return sorted(p for folder in CODE for p in folder.rglob("*.py"))


def test_readme_table_is_the_registry() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config.markdown_table() in readme, "README's configuration table differs from config.markdown_table()"
    documented = set(re.findall(r"^\| `(IOX_[A-Z0-9_]+)` \|", readme, flags=re.M))
    assert documented == set(config.SETTINGS)


def test_every_variable_the_code_names_is_declared() -> None:
    named = {m for p in _code_files() for m in re.findall(r"\bIOX_[A-Z0-9_]*[A-Z0-9]\b", p.read_text())}
    # Families named in prose (`IOX_LP_*`, `IOX_<NAME>`) are not variables.
    missing = sorted(n for n in named if n not in config.SETTINGS and not any(
        s.startswith(n + "_") for s in config.SETTINGS))
    assert missing == []
    for name in ("IOX_RUN_LOCK_TTL_S", "IOX_SPARK_RETRIES", "IOX_SPARK_RETRY_DELAY_S", "IOX_PERSIST_SCHEDULE",
                 "IOX_TARGET_PARTITIONS", "IOX_LP_MAX_LINE_BYTES", "IOX_RUNNER", "IOX_DEBUG"):
        assert name in config.SETTINGS


def test_no_code_reads_an_iox_variable_around_the_registry() -> None:
    raw = re.compile(r"""(environ(\.get)?\s*[\[(]|getenv\()\s*f?["']IOX_""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _code_files() if p.name != "config.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert found == []


WHOLE = [s for s in config.SETTINGS.values() if isinstance(s, config.Whole)]


@pytest.mark.parametrize("setting", WHOLE, ids=lambda s: s.name)
def test_whole_numbers_follow_one_rule(setting: config.Whole) -> None:
    value = max(setting.low, min(setting.high, 1000))
    assert setting.read({setting.name: f"{value:_}"}) == value
    assert setting.read({setting.name: f" {value} "}) == value
    assert setting.read({setting.name: ""}) == setting.default
    for bad in ("abc", "-1", "1e3", "1__000", "_1", "\u0663", "0x10", str(setting.high + 1)):
        with pytest.raises(BadInputError) as raised:
            setting.read({setting.name: bad})
        message = str(raised.value)
        assert message.startswith(f"{setting.name}=") and f"from {setting.low:,} to {setting.high:,}" in message
        assert "\n" not in message
    if setting.low > 0:
        with pytest.raises(BadInputError):
            setting.read({setting.name: str(setting.low - 1)})


@pytest.mark.parametrize("setting, bad, allowed", [
    (config.RUNNER, "bogus", "one of `in-process`, `spark-submit`"),
    (config.DEDUP_STRATEGY, "fastest", "one of `arrow`"),
    (config.DEBUG, "maybe", "1, true, yes or on"),
    (config.COMPACT_SCHEDULE, "* * *", "a cron expression of five fields"),
    (config.REFRESH_SCHEDULE, "* * * * * *", "a cron expression of five fields"),
    (config.SPARK_MASTER, "local\x1b[31m", "`local`, `local[N]`"),
    (config.SPARK_MASTER, "bogus", "`spark://host:port[,host:port...]`"),  # probe E33: Java's gateway error
    (config.SPARK_CONF, "a=1\x1b[2J", "text without control characters"),
    (config.COMPACT_DATABASES, "a,\x00b", "a list separated by"),
    (config.WAREHOUSE, "/tmp/\x00x", "a path"),
], ids=lambda v: v.name if isinstance(v, config.Setting) else None)
def test_a_bad_value_of_each_kind_is_one_paragraph(setting: config.Setting[object], bad: str, allowed: str) -> None:
    with pytest.raises(BadInputError) as raised:
        setting.read({setting.name: bad})
    message = str(raised.value)
    assert message.startswith(f"{setting.name}=") and allowed in message and "\n" not in message


def test_a_bogus_runner_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """IOX_RUNNER=bogus used to run in-process silently; now the one place that reads it refuses it."""
    from spark_jobs.launch import launcher

    from iox_planner.spark.launch import Runner, chosen_runner

    monkeypatch.setenv("IOX_RUNNER", "bogus")
    with pytest.raises(BadInputError, match=r"IOX_RUNNER='bogus' is not allowed.*`in-process`, `spark-submit`"):
        launcher()
    monkeypatch.setenv("IOX_RUNNER", "spark-submit")
    assert chosen_runner() is Runner.SPARK_SUBMIT
    monkeypatch.delenv("IOX_RUNNER")
    assert chosen_runner() is Runner.IN_PROCESS


def test_a_bogus_runner_fails_the_cli_with_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {"IOX_RUNNER": "bogus", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    scenario = tmp_path / "s.yaml"
    scenario.write_text("chunks: []\n")
    done = subprocess.run([sys.executable, "-m", "iox_planner.cli.main", "write", "--spark", "--db", "d",
                           str(scenario)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**env, "IOX_CATALOG_URL": "postgresql+psycopg2://x@127.0.0.1:1/x"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: IOX_RUNNER='bogus' is not allowed"), done.stderr


def test_every_reader_takes_underscored_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`1_000` everywhere: the run settings, the planner's, compaction's, the SQL and line-protocol limits, the
    print bounds and the query budget all read through the registry (seven parsers disagreed before)."""
    from iox_planner.cli.runner import print_limits
    from iox_planner.ingest.lineprotocol.limits import Limits
    from iox_planner.maintenance.compact.settings import CompactSettings
    from iox_planner.planner.limits import SqlLimits
    from iox_planner.planner.settings import PlannerSettings
    from iox_planner.runs.settings import RunSettings
    from iox_planner.spark.budget import query_timeout_s

    for name in ("IOX_MAX_SPARK_JOBS", "IOX_RUN_LOCK_TTL_S", "IOX_TARGET_PARTITIONS", "IOX_COMPACT_MAX_ROWS",
                 "IOX_MAX_SQL_NODES", "IOX_LP_MAX_COLUMNS", "IOX_PRINT_MAX_ROWS", "IOX_QUERY_TIMEOUT_S",
                 "IOX_PRINT_MAX_BYTES"):
        monkeypatch.setenv(name, "1_024")
    assert RunSettings.from_env().max_spark_jobs == 1024 and RunSettings.from_env().run_lock_ttl_s == 1024
    assert PlannerSettings.from_env().target_partitions == 1024
    assert PlannerSettings.from_env({"target_partitions": "2_000"}).target_partitions == 2000
    assert CompactSettings.from_env().max_rows == 1024
    assert SqlLimits.from_env().max_nodes == 1024
    assert Limits.from_env().max_columns == 1024
    assert print_limits() == (1024, 1024)
    assert query_timeout_s() == 1024 and query_timeout_s("1_000") == 1000
