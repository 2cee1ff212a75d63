"""Materialized query definitions: one YAML file each in `dags/materialized/` (IOX_MATERIALIZED_DIR), one DAG
each. Reading them touches no database: a DAG file can build its DAGs at import time.

```yaml
name: cpu_hourly                  # DAG id materialize_cpu_hourly; lowercase letters, digits, '_'
description: Hourly CPU rollup    # optional
db: tsbs                          # the database the query reads
sql: |                            # any SELECT; the run's data interval is applied as its time range
  SELECT hostname, date_trunc('hour', time) AS time, avg(usage_user) AS usage_user
  FROM cpu GROUP BY hostname, date_trunc('hour', time)
args: {}                          # optional bound parameters (:name in the SQL)
schedule: "@hourly"               # a five-field cron expression or preset; each run covers one interval [start, end)
                                  # (one matching no date, as `0 0 30 2 *`, is refused)
start_date: 2024-01-01            # UTC; a date or an RFC 3339 time
end_date: null                    # optional
catchup: false                    # optional, default false
output: cpu_hourly/{start:%Y-%m-%dT%H}.parquet   # per interval: {start}, {end} (UTC datetimes, with a strftime
                                  # pattern), {name}; relative paths live under IOX_OUTPUT_ROOT; must use {start}
format: parquet                   # parquet (a folder, default), csv or jsonl (a file)
register_as:                      # optional: also write the result as a catalog table
  table: cpu_hourly               # in `db` unless `db:` is given here; new, or registered by this definition
  tags: [hostname]                # the result's columns that are tags; `time` is required; the rest are fields
max_spark_jobs: 2                 # optional fan-out override, 1 to 1,024 (IOX_MAX_SPARK_JOBS)
timeout_s: 1800                   # optional wall-time budget of each Spark job, seconds (IOX_QUERY_TIMEOUT_S)
retries: 1                        # optional Spark task retries, 0 to 10 (IOX_SPARK_RETRIES)
paused: true                      # optional: the DAG starts paused (false: not; absent: Airflow's default)
tags: [rollup]                    # optional Airflow tags
```
"""

from __future__ import annotations

import datetime as dt
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from iox_planner.catalog.names import check_db_name, name_problem
from iox_planner import config
from iox_planner.config import SCHEDULE_PRESETS, schedule_problem
from iox_planner.errors import BadInputError
from iox_planner.ingest.scenario import read_yaml
from iox_planner.objectstore import Root
from iox_planner.output import Destination, OutputFormat
from iox_planner.spark.budget import query_timeout_s
from iox_planner.timeutil import check_time, parse_time

from iox_planner.runs.request import QueryRequest, RegisterAs, check_args, run_format
from iox_planner.runs.settings import RunSettings

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
TEMPLATE_FIELDS = frozenset({"start", "end", "name"})
MAX_TEMPLATE_CHARS = 1024
"""An output template's length: a path (each name below the root is at most 200 characters, OUTPUT_NAME)."""
MAX_DEFINITION_BYTES = 2 * 1024 * 1024
"""A definition file's size: one query (IOX_MAX_SQL_BYTES, 1 MiB by default) and its settings. Read no further:
the DAG files read every definition at every parse."""
MAX_DEFINITION_DEPTH = 4
"""Nesting of YAML collections in a definition file (it needs 3: the file, `register_as`, its `tags`)."""
KEYS = frozenset({
    "name", "description", "db", "sql", "args", "schedule", "start_date", "end_date", "catchup", "output",
    "format", "register_as", "max_spark_jobs", "retries", "paused", "tags", "timeout_s",
})
_SAMPLE = (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
           dt.datetime(2024, 1, 2, 4, 4, 5, tzinfo=dt.timezone.utc))


@dataclass(frozen=True)
class MaterializedQuery:
    name: str
    db: str
    sql: str
    schedule: str
    start_date: dt.datetime
    output: str
    format: OutputFormat = OutputFormat.PARQUET
    catchup: bool = False
    end_date: dt.datetime | None = None
    args: Mapping[str, Any] = field(default_factory=dict)
    register_as: RegisterAs | None = None
    max_spark_jobs: int | None = None
    timeout_s: int | None = None
    retries: int | None = None
    paused: bool | None = None
    """True/false: the DAG starts paused or not; None (absent): Airflow's dags_are_paused_at_creation."""
    description: str = ""
    tags: tuple[str, ...] = ()
    source: str = ""

    @property
    def dag_id(self) -> str:
        return f"materialize_{self.name}"

    @property
    def cron(self) -> str:
        return SCHEDULE_PRESETS.get(self.schedule, self.schedule)

    def ticks(self) -> Any:
        """The schedule's ticks from the start date on (a tick at the start date itself included), as a croniter:
        each interval is [tick, next tick), as Airflow's cron data interval timetable makes them."""
        return _ticks(self.cron, self.start_date)

    def output_path(self, start: dt.datetime, end: dt.datetime, settings: RunSettings) -> Destination:
        """The output of the interval [start, end)."""
        return settings.resolve_output(self.output.format_map({"start": _utc(start), "end": _utc(end),
                                                               "name": self.name}))

    def output_pattern(self, settings: RunSettings) -> Path | str:
        """Every interval's output: the template with its fields as `*` (the Asset's URI): a path, or under an
        output root on a store its `s3://` text (a pattern, which no key check would take)."""
        parts = []
        for literal, name, _, _ in string.Formatter().parse(self.output):
            parts.append(literal)
            if name is not None:
                parts.append("*")
        pattern = "".join(parts)
        if isinstance(settings.output_root, Root) and not pattern.startswith("/"):
            return f"{settings.output_root.uri}/{pattern}"
        local = settings.resolve_output(pattern)
        assert isinstance(local, Path)  # an absolute template is refused, so this lies under a local root
        return local

    def request(self, start: dt.datetime, end: dt.datetime, settings: RunSettings) -> QueryRequest:
        """What the run of the interval [start, end) computes: the query over exactly that time range."""
        lo, hi = to_ns(start), to_ns(end)
        return QueryRequest(
            db=self.db, sql=self.sql, output=self.output_path(start, end, settings), format=self.format,
            args=dict(self.args), time_start=lo, time_end=hi, definition=self.name, register_as=self.register_as,
            max_spark_jobs=self.max_spark_jobs, timeout_s=self.timeout_s,
        )


def to_ns(value: dt.datetime) -> int:
    """A datetime (naive = UTC) as nanoseconds since the epoch, exactly."""
    delta = _utc(value) - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def load_definitions(folder: Path) -> list[MaterializedQuery]:
    """Every `*.yaml` definition of `folder`, in file-name order; names must be unique."""
    if not folder.is_dir():
        return []
    found: list[MaterializedQuery] = []
    names: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        definition = read_definition(path)
        if definition.name in names:
            raise BadInputError(f"{path}: name {definition.name!r} is already used by {names[definition.name]}; "
                                "each materialized query needs its own name")
        names[definition.name] = str(path)
        found.append(definition)
    return found


def read_definition(path: Path) -> MaterializedQuery:
    """One definition file, read as scenario files are (ingest/scenario.py `read_yaml`): bounded in size and
    nesting, plain YAML types only, no anchors or aliases (a few hundred bytes of aliases expand to gigabytes, at
    every DAG parse)."""
    doc = read_yaml(path, "materialized query definition", max_bytes=MAX_DEFINITION_BYTES,
                    size_note="; a definition holds one query and its settings", max_depth=MAX_DEFINITION_DEPTH,
                    depth_note=f"; a definition needs {MAX_DEFINITION_DEPTH - 1}")
    return parse_definition(doc, str(path))


def parse_definition(doc: Any, source: str) -> MaterializedQuery:
    def fail(key: str, message: str) -> BadInputError:
        return BadInputError(f"{source}: `{key}`: {message}")

    if not isinstance(doc, Mapping):
        raise BadInputError(f"{source}: a materialized query definition is a YAML mapping (name, db, sql, "
                            "schedule, start_date, output, ...)")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise BadInputError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}; allowed: "
                            f"{', '.join(sorted(KEYS))}")
    for key in ("name", "db", "sql", "schedule", "start_date", "output"):
        if doc.get(key) in (None, ""):
            raise fail(key, "is required")

    name = doc["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise fail("name", f"{name!r} must be lowercase letters, digits and '_', starting with a letter")
    try:
        db = check_db_name(str(doc["db"]))
    except BadInputError as err:
        raise fail("db", str(err)) from err
    sql = doc["sql"]
    if not isinstance(sql, str) or not sql.strip():
        raise fail("sql", "must be the text of a SELECT")
    schedule = _schedule(doc["schedule"], fail)
    start_date = _when(doc["start_date"], "start_date", fail)
    _check_fires(schedule, start_date, fail)
    end_date = _when(doc["end_date"], "end_date", fail) if doc.get("end_date") is not None else None
    if end_date is not None and end_date <= start_date:
        raise fail("end_date", "must be after start_date")
    output = doc["output"]
    if not isinstance(output, str):
        raise fail("output", "must be a path template such as cpu_hourly/{start:%Y-%m-%dT%H}.parquet")
    _check_template(output, fail)
    try:
        fmt = run_format(doc.get("format", "parquet"))
    except BadInputError as err:
        raise fail("format", str(err)) from err
    args = doc.get("args") or {}
    if not isinstance(args, Mapping):
        raise fail("args", "must be a mapping of bound parameters (name: value)")
    try:
        check_args(args)
    except BadInputError as err:
        raise fail("args", str(err)) from err
    catchup = doc.get("catchup", False)
    paused = doc.get("paused")
    for key, value in (("catchup", catchup), ("paused", paused)):
        if value is not None and not isinstance(value, bool):
            raise fail(key, f"must be true or false, not {value!r}")
    return MaterializedQuery(
        name=name, db=db, sql=sql, schedule=schedule, start_date=start_date, end_date=end_date, output=output,
        format=fmt, catchup=catchup, args=dict(args), register_as=_register_as(doc.get("register_as"), fail),
        max_spark_jobs=_count(doc.get("max_spark_jobs"), "max_spark_jobs", config.MAX_SPARK_JOBS, fail),
        timeout_s=_timeout(doc.get("timeout_s"), fail),
        retries=_count(doc.get("retries"), "retries", config.SPARK_RETRIES, fail), paused=paused,
        description=str(doc.get("description") or ""), tags=_tags(doc.get("tags"), fail), source=source,
    )


def _schedule(value: Any, fail: Any) -> str:
    if not isinstance(value, str) or value != value.strip():
        raise fail("schedule", f"{value!r} is not a schedule: give a cron expression or preset as text, with "
                               "nothing around it (as \"@hourly\" or \"*/15 * * * *\")")
    text = value
    problem = schedule_problem(text)
    if problem is not None:
        raise fail("schedule", f"{problem}; materialized queries run on a schedule")
    return text


def _ticks(cron: str, start_date: dt.datetime) -> Any:
    from croniter import croniter

    return croniter(cron, start_date - dt.timedelta(microseconds=1))


def _check_fires(schedule: str, start_date: dt.datetime, fail: Any) -> None:
    """A valid cron expression may match no date at all (`0 0 30 2 *`, the 30th of February): croniter then fails
    looking for the next tick, at every status call and DAG parse. The first interval must exist."""
    from croniter import CroniterBadDateError

    ticks = _ticks(SCHEDULE_PRESETS.get(schedule, schedule), start_date)
    try:
        ticks.get_next(dt.datetime)
        ticks.get_next(dt.datetime)
    except (CroniterBadDateError, ValueError, OverflowError):
        raise fail("schedule", f"{schedule[:80]!r} never fires from start_date {start_date:%Y-%m-%d} on: no date "
                               "before the year 10000 matches it (as the 30th of February); fix the day and month "
                               "fields or the start date") from None


def _when(value: Any, key: str, fail: Any) -> dt.datetime:
    """A date or time (YAML's own, or RFC 3339 text) within the times data may have: each interval's bounds
    become nanoseconds, recorded as the catalog's bigint."""
    try:
        if isinstance(value, dt.datetime):
            when = _utc(value)
        elif isinstance(value, dt.date):
            when = dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
        else:
            ns = parse_time(str(value), what=key)
            return dt.datetime.fromtimestamp(ns // 1_000_000_000, tz=dt.timezone.utc)
        check_time(to_ns(when), key, when.isoformat())
    except BadInputError as err:
        raise fail(key, str(err)) from err
    return when


def _check_template(template: str, fail: Any) -> None:
    """`{start}`, `{end}` and `{name}` as plain fields, `start` and `end` with a strftime pattern (`{start:%Y-%m}`)
    and nothing else: no attribute or index access, no conversion (`!r`), no format spec on `name` (`{name:>9999}`
    would pad to any size) and no nested field in a pattern. The template is bounded in length, and a strftime
    pattern renders to at most a few hundred times its own length."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise fail("output", f"the template is {len(template):,} characters long; an output path template holds at "
                             f"most {MAX_TEMPLATE_CHARS:,}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise fail("output", f"{template!r} is not a valid template: {err}") from err
    fields = {name for _, name, _, _ in parts if name is not None}
    unknown = sorted(f for f in fields if f not in TEMPLATE_FIELDS)
    if unknown:
        raise fail("output", f"unknown field(s) {', '.join('{' + f + '}' for f in unknown)}; use {{start}}, "
                             "{end} and {name}, e.g. {start:%Y-%m-%dT%H}")
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if conversion is not None:
            raise fail("output", f"{{{name}!{conversion}}}: a conversion is not allowed in an output template; write "
                                 f"{{{name}}}")
        if spec and name not in ("start", "end"):
            raise fail("output", f"{{{name}:...}}: only {{start}} and {{end}} take a pattern (strftime, as in "
                                 f"{{start:%Y-%m-%d}}); write {{{name}}}")
        if spec and ("{" in spec or "}" in spec):
            raise fail("output", f"{{{name}:...}}: a pattern may not hold another field; write the strftime pattern "
                                 "out, as in {start:%Y-%m-%d}")
    if "start" not in fields:
        raise fail("output", "must use {start} (e.g. {start:%Y-%m-%d}) so that each interval has its own output; "
                             "a rerun then replaces exactly its interval's output")
    try:
        rendered = template.format_map({"start": _SAMPLE[0], "end": _SAMPLE[1], "name": "x"})
    except (ValueError, KeyError, AttributeError, IndexError) as err:
        raise fail("output", f"{template!r} does not render: {err}") from err
    if not rendered.strip() or rendered.endswith("/"):
        raise fail("output", f"{template!r} must name a file (csv, jsonl) or folder (parquet), not end in '/'")
    if ".." in Path(rendered).parts:
        # Caught where the definition enters rather than only when a run plans (probe MD09): a template that
        # climbs out of the output root is never right.
        raise fail("output", f"{template[:200]!r} climbs out of its folder with '..'; an output template names a "
                             "path below the output root (IOX_OUTPUT_ROOT)")


def _register_as(value: Any, fail: Any) -> RegisterAs | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value.get("table"):
        raise fail("register_as", "must be a mapping with `table` (and `tags`, optionally `db`)")
    unknown = sorted(set(value) - {"table", "tags", "db"})
    if unknown:
        raise fail("register_as", f"unknown key(s) {', '.join(unknown)}; allowed: table, tags, db")
    table = value["table"]
    if not isinstance(table, str):
        raise fail("register_as", f"`table` must be a table name, not {type(table).__name__}")
    problem = name_problem("measurement", table)  # the rule every write's table names follow
    if problem is not None:
        raise fail("register_as", f"table: {problem}")
    tags = value.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise fail("register_as", "`tags` must be a list of column names")
    if "time" in tags:
        raise fail("register_as", "`time` cannot be a tag")
    for tag in tags:
        problem = name_problem("tag", tag)
        if problem is not None:
            raise fail("register_as", f"tags: {problem}")
    db = value.get("db")
    if db is not None:
        try:
            check_db_name(str(db))
        except BadInputError as err:
            raise fail("register_as", str(err)) from err
    return RegisterAs(table=table, tags=tuple(tags), db=str(db) if db is not None else None)


def _count(value: Any, key: str, bounds: config.Whole, fail: Any) -> int | None:
    """A count field, within the bounds of the variable whose default it overrides (`IOX_MAX_SPARK_JOBS`: Airflow
    maps at most 1,024 task instances by default; `IOX_SPARK_RETRIES`: each retry reruns the whole job, and beyond
    a few a failure is not transient)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not bounds.low <= value <= bounds.high:
        raise fail(key, f"must be a whole number from {bounds.low} to {bounds.high:,}, not {value!r}")
    return value


def _timeout(value: Any, fail: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail("timeout_s", f"must be whole seconds, not {value!r}")
    try:
        return query_timeout_s(value, "timeout_s")
    except BadInputError as err:
        raise fail("timeout_s", str(err)) from err


def _tags(value: Any, fail: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise fail("tags", "must be a list of strings")
    return tuple(value)
