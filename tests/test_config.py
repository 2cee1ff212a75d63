"""The settings registry (`config.py`): every `IOX_*` variable the code reads is declared there and read through it,
README's configuration table is the registry's, one rule reads whole numbers everywhere (`1_000` included), and a
bad value of each kind fails where it is read, in one paragraph naming the variable and what it allows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from iox_planner import config
from iox_planner.errors import BadInputError
from iox_planner.objectstore import Root

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
    assert setting.read({setting.name: str(value)}) == value
    assert setting.read({}) == setting.default
    for bad in ("abc", "-1", "1e3", "1__000", "_1", "\u0663", "0x10", str(setting.high + 1), f" {value} ", ""):
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
    (config.DEBUG, "maybe", "1 or true; 0 or false"),
    (config.COMPACT_SCHEDULE, "* * *", "a cron expression of five fields"),
    (config.REFRESH_SCHEDULE, "* * * * * *", "a cron expression of five fields"),
    (config.SPARK_MASTER, "local\x1b[31m", "`local`, `local[N]`"),
    (config.SPARK_MASTER, "bogus", "`spark://host:port[,host:port...]`"),  # probe E33: Java's gateway error
    (config.SPARK_CONF, "a=1\x1b[2J", "`key=value` pairs"),
    (config.COMPACT_DATABASES, "a,\x00b", "database names separated by"),
    (config.WAREHOUSE, "/tmp/\x00x", "an absolute path"),
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


# --- every setting against hostile values -------------------------------------------------------------------------
# A value that is not what it looks like is refused with one paragraph naming the variable and what it allows, never
# read as the default or as something near it. Each kind has its hostile values; a Text or Listed setting brings
# its own (its form is its own), so a setting added later is covered, or this test names what it lacks.

GOOD: dict[str, str] = {
    "IOX_CATALOG_URL": "postgresql+psycopg2://iox:secret@db.example:5432/iox",
    "IOX_SPARK_MASTER": "spark://spark-master:7077",
    "IOX_SPARK_CONF": "spark.driver.memory=2g,spark.sql.shuffle.partitions=8",
    "IOX_SPARK_REMOTE": "sc://127.0.0.1:15002",
    "IOX_SPARK_GATE_TOKEN": "0123456789abcdef" * 4,
    "IOX_FAULT_KILL_AT": "write.before_commit",
    "IOX_COMPACT_DATABASES": "demo,cpu_db",
    "IOX_PERSIST_DATABASES": "demo",
    "IOX_FAULT_PAUSE_AT": "persist.before_sweeps,commit.start",
    "IOX_OUTPUT_ROOTS": "/data/out:s3://iox-bucket/out:/tmp/other",
}
OWN_HOSTILE: dict[str, list[str]] = {
    # a path where a URL is meant, another database system
    "IOX_CATALOG_URL": ["/var/run/postgresql", "sqlite:///catalog.db", "localhost:5432", "postgres"],
    # ports out of range, no port, a worker count of 0
    "IOX_SPARK_MASTER": ["spark://h:70000", "spark://h:0", "spark://h", "local[0]", "bogus", "k8s://https://h:99999"],
    "IOX_SPARK_CONF": ["spark.driver.memory", "a=1,,b=2", "=1", "a=1;"],
    "IOX_SPARK_REMOTE": ["127.0.0.1:15002", "sc://h:70000", "sc://h:0", "sc://h", "sc://h:1;token=x", "http://h:1"],
    "IOX_SPARK_GATE_TOKEN": ["short", "a" * 31, "a b " * 10, "\u00e9" * 40],
    "IOX_FAULT_KILL_AT": ["write", "Write.Before_Commit", "write.before_commit,x"],
    "IOX_COMPACT_DATABASES": ["a,,b", "a, b", "a,", ",", "bad name"],
    "IOX_PERSIST_DATABASES": ["a,,b", "a, b", "demo;x"],
    "IOX_FAULT_PAUSE_AT": ["a.b,,c.d", "a.b, c.d", "nope"],
    # a list split at `:`: only `s3` then `//...` is rejoined; every other piece must be an absolute path
    "IOX_OUTPUT_ROOTS": ["/tmp::/x", "/tmp:", ":/tmp", "/a:relative", "/a:~/b", "/a:s3:bucket/x", "/a:s3",
                         "/a:s3:/b/c", "/a:gs://b/c", "/a:S3://b/c", "/a:s3://b/c", "/a:s3:////b/c",
                         "/a:s3://bucket/x:y", "/a:s3://iox-bucket/p?x=1", "/a:s3://iox-bucket:9000/p",
                         "s3://AKIA:secret@iox-bucket/p", "/a:s3://AKIA:se/cret@iox-bucket/p", "/a:s3://iox-bucket/../p",
                         "/a:file:///tmp/x", "/a:http://h/x", "s3", "s3:"],
}
PATHS = ["relative/dir", "./x", "x", "~/data", "~", "s3://bucket/prefix", "file:///tmp/x", "gs://b/p",
         "http://host/x", "s3:bucket"]
KIND_HOSTILE: dict[type, list[str]] = {
    config.Whole: ["10s", "64MiB", "1e3", "1.5", "+1", "-1", "1,000", "yes", "\u0661\u0662"],
    config.Flag: ["yes", "on", "no", "off", "True", "TRUE", "2", "maybe"],
    config.Folder: PATHS,
    config.Location: [p for p in PATHS if p != "s3://bucket/prefix"] + [
        "s3://AKIA:secret@bucket/wh", "s3://bucket:9000/wh", "s3://bucket/wh?x=1", "s3://bucket/../wh",
        "s3://Bucket/wh", "s3:bucket/wh", "s3a://bucket/wh", "gs://bucket/wh"],
    config.Schedule: ["* * * * * *", "@hourly x", "@HOURLY", "hourly", "* * *"],
    config.Locations: [p for p in PATHS if p != "s3://bucket/prefix"],
}


def _good(setting: config.Setting[object]) -> str:
    if setting.name in GOOD:
        return GOOD[setting.name]
    if isinstance(setting, config.Whole):
        return str(max(setting.low, min(setting.high, setting.default)))
    if isinstance(setting, (config.Choice, config.Schedule)):
        return setting.default
    if isinstance(setting, config.Flag):
        return "1"
    if isinstance(setting, config.Folder):
        return "/tmp/iox-somewhere"
    if isinstance(setting, config.Location):
        return "s3://iox-bucket/somewhere"
    raise AssertionError(f"{setting.name}: give it a good value in GOOD and hostile ones in OWN_HOSTILE")


def _hostile(setting: config.Setting[object]) -> list[str]:
    good = _good(setting)
    # Whatever the kind: empty, blank, spaces around a good value, a control character inside one.
    found = ["", " ", "\t", f" {good}", f"{good} ", f"{good}\n", f"{good[:1]}\x1b[2J{good[1:]}", f"{good}\x7f"]
    found += OWN_HOSTILE.get(setting.name, [])
    for kind, values in KIND_HOSTILE.items():
        if isinstance(setting, kind):
            found += values
    if isinstance(setting, config.Whole):
        found += [str(setting.high + 1)] + ([str(setting.low - 1), "0"] if setting.low > 0 else [])
    if isinstance(setting, config.Choice):
        found += [setting.default.upper(), setting.default + "x", "yes", setting.default.replace("-", "_")]
    if isinstance(setting, config.Text) or (isinstance(setting, config.Listed) and not setting.storage):
        assert setting.name in OWN_HOSTILE, f"{setting.name}: give it hostile values of its own in OWN_HOSTILE"
    return [value for value in dict.fromkeys(found) if value != good]


@pytest.mark.parametrize("setting", list(config.SETTINGS.values()), ids=lambda s: s.name)
def test_every_setting_refuses_what_is_not_what_it_looks_like(setting: config.Setting[object]) -> None:
    setting.read({setting.name: _good(setting)})  # a good value is taken
    assert setting.read({}) == setting.default_value()  # unset: the default
    for bad in _hostile(setting):
        with pytest.raises(BadInputError) as raised:
            setting.read({setting.name: bad})
        message = str(raised.value)
        assert message.startswith(f"{setting.name}=") and " is not allowed" in message, (bad, message)
        assert setting.allowed in message and "\n" not in message, (bad, message)


@pytest.mark.parametrize("setting", [config.WAREHOUSE, config.OUTPUT_ROOT, config.OUTPUT_ROOTS],
                         ids=lambda s: s.name)
def test_a_location_with_credentials_is_refused_without_repeating_them(setting: config.Setting[object]) -> None:
    for value in ("s3://AKIAKEY:wJalrXUtnFEMI@bucket/wh", "s3://AKIAKEY:wJalrXU/tnFEMI@bucket/wh",
                  "s3://wJalrXUtnFEMI@bucket/wh"):
        for text in ([value] if setting is not config.OUTPUT_ROOTS else [value, f"/data/out:{value}"]):
            with pytest.raises(BadInputError) as raised:
                setting.read({setting.name: text})
            message = str(raised.value)
            assert "credentials" in message and "wJalrX" not in message and "tnFEMI" not in message, message


def test_output_roots_list_local_folders_and_store_prefixes_unambiguously() -> None:
    """IOX_OUTPUT_ROOTS is split at `:`, which `s3://` holds: an `s3` piece followed by `//...` is one location."""
    read = config.OUTPUT_ROOTS.read
    assert read({"IOX_OUTPUT_ROOTS": "/data/out:s3://iox-bucket/runs/out:/tmp/x"}) == (
        Root("/data/out"), Root("s3://iox-bucket/runs/out"), Root("/tmp/x"))
    assert read({"IOX_OUTPUT_ROOTS": "s3://iox-bucket/a:s3://iox-bucket/b/"}) == (
        Root("s3://iox-bucket/a"), Root("s3://iox-bucket/b"))
    assert config.OUTPUT_ROOT.read({"IOX_OUTPUT_ROOT": "s3://iox-bucket/out"}) == Root("s3://iox-bucket/out")
    assert config.split_locations("/a:s3://b/c:s3:x://y") == ["/a", "s3://b/c", "s3", "x", "//y"]


def test_a_relative_folder_or_tilde_is_refused_not_resolved_against_the_current_folder() -> None:
    for value, why in (("warehouse", "relative path"), ("~/warehouse", "`~` is not expanded")):
        with pytest.raises(BadInputError, match=why):
            config.WAREHOUSE.read({"IOX_WAREHOUSE": value})
    assert config.WAREHOUSE.read({"IOX_WAREHOUSE": "/data/wh"}) == Root("/data/wh")


def test_an_s3_warehouse_is_never_a_local_folder(tmp_path: Path, catalog_url: str) -> None:
    """Probe: `IOX_WAREHOUSE=s3://bucket/prefix` became a folder `s3:` in the current folder, every write in it."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "iox-batch"
    done = subprocess.run([str(exe), "write", "--db", "s3probe", "-"], input="m,t=a v=1 1704067200000000000\n",
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**__import__("os").environ, "IOX_WAREHOUSE": "s3://iox-no-such-bucket/prefix",
                               "IOX_CATALOG_URL": catalog_url})
    # The bucket does not exist (and is never created): the write fails, and nothing lands on the local disk.
    assert done.returncode != 0 and done.stderr.startswith("error: "), done.stderr
    assert "\n" not in done.stderr.strip() and list(tmp_path.iterdir()) == []


def test_every_command_checks_the_whole_configuration_first(tmp_path: Path) -> None:
    """A bad value of a setting the command would not read still stops it, before it does anything."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "iox-batch"
    done = subprocess.run([str(exe), "explain", "--chunks", str(tmp_path / "missing.yaml"), "SELECT 1"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**__import__("os").environ, "IOX_COMPACT_SCHEDULE": "@hourly "})
    assert done.returncode == 2 and done.stderr.startswith("error: IOX_COMPACT_SCHEDULE='@hourly ' is not allowed "
                                                           "(it has spaces around it"), done.stderr


@pytest.mark.parametrize(("setting", "value", "secret"), [
    (config.SPARK_GATE_TOKEN, "a" * 40 + "secretpart ", "secretpart"),
    (config.SPARK_GATE_TOKEN, "s3cr3t" * 6 + "\t", "s3cr3t"),
    (config.CATALOG_URL, "postgresql://user:hunter2@db.example/catalog ", "hunter2"),
    (config.SPARK_REMOTE, "sc://127.0.0.1:15002/;token=tok3n", "tok3n"),
])
def test_a_refused_value_never_repeats_a_credential(setting: config.Setting[object], value: str,
                                                    secret: str) -> None:
    """A token, a URL's password, a Spark Connect URL's `;token=`: refused in one paragraph that shows none of it
    (a message goes to logs, task logs and terminals)."""
    with pytest.raises(BadInputError) as err:
        setting.read({setting.name: value})
    assert setting.name in str(err.value)
    assert secret not in str(err.value)
