"""What one run computes, validated: a `QueryRequest`, built from `iox_query`'s params or from a materialized
definition and a data interval. No Airflow and no catalog here: building a request only checks its shape."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from iox_planner.catalog.names import check_db_name
from iox_planner.errors import BadInputError
from iox_planner.model import RunKey
from iox_planner.objectstore import Root
from iox_planner.output import RUN_FORMATS, Destination, OutputFormat, shown
from iox_planner.spark.budget import query_timeout_s
from iox_planner.timeutil import INT64_MAX, INT64_MIN, check_range, format_time, parse_range

from iox_planner.runs.settings import RunSettings

PARAM_NAMES = ("db", "sql", "args", "time_start", "time_end", "output", "format", "timeout_s", "changes_since")

# Each folder and file name of an output below its root: no leading dot (no dotfiles such as .bashrc, no hidden
# folders, no `..`), no spaces, quotes, control characters or shell metacharacters.
OUTPUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,=+@:-]{0,199}")
# What the last name must end in, per format: a file that a Python site loader (`*.pth`), a shell or anything
# else would execute cannot be named. A Parquet output is a folder: `name` or `name.parquet`.
OUTPUT_SUFFIXES = {OutputFormat.CSV: (".csv",), OutputFormat.JSONL: (".jsonl",), OutputFormat.PARQUET: ("", ".parquet")}


def run_format(value: object, where: str = "format") -> OutputFormat:
    """A run's output format, from a param or a definition: one of `RUN_FORMATS`."""
    found = next((f for f in RUN_FORMATS if f.value == value), None)
    if found is None:
        allowed = ", ".join(f.value for f in RUN_FORMATS)
        raise BadInputError(f"{where} {value!r} is not an output format; use one of {allowed}")
    return found


def check_args(args: Mapping[Any, Any]) -> None:
    """Bound parameters (a request's `args`, a definition's): names are identifiers, values are strings, finite
    numbers, booleans or null (NaN and infinities have no SQL literal; JSON and YAML can spell them)."""
    for name, value in args.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise BadInputError(f"bound parameter name {name!r} is not a valid name (letters, digits, '_')")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise BadInputError(f"bound parameter :{name} must be a string, number, boolean or null, not "
                                f"{type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInputError(f"bound parameter :{name} is {value!r}, which SQL has no literal for; pass a finite "
                                "number")


@dataclass(frozen=True)
class RegisterAs:
    """Also write the result as catalog table `table` (in `db`, default the query's database)."""

    table: str
    tags: tuple[str, ...] = ()
    db: str | None = None


@dataclass(frozen=True)
class QueryRequest:
    db: str
    sql: str
    output: Destination
    """A local path, or a key on a store (`Root`, `s3://BUCKET/KEY`) under an output root there."""
    format: OutputFormat = OutputFormat.PARQUET
    args: Mapping[str, Any] = field(default_factory=dict)
    time_start: int | None = None
    time_end: int | None = None
    definition: str | None = None
    """The materialized definition this run computes an interval of (None for triggered queries)."""
    register_as: RegisterAs | None = None
    max_spark_jobs: int | None = None
    timeout_s: int | None = None
    """The wall-time budget of each of the run's Spark jobs, in seconds (None: IOX_QUERY_TIMEOUT_S)."""
    changes_since: str | None = None
    """A changes read: the watermark (or `beginning`) whose later writes the run returns (catalog/changes.py)."""

    def __post_init__(self) -> None:
        check_db_name(self.db)
        run_format(self.format)
        if self.timeout_s is not None:
            object.__setattr__(self, "timeout_s", query_timeout_s(self.timeout_s, "timeout_s"))
        if not isinstance(self.sql, str) or not self.sql.strip():
            raise BadInputError("sql is empty; give the SELECT to run")
        if isinstance(self.output, Path) and not self.output.is_absolute():
            raise BadInputError(f"output {_short(self.output)} must be an absolute path")
        check_range(self.time_start, self.time_end)
        check_args(self.args)
        if self.register_as is not None and self.definition is None:
            raise BadInputError("register_as is for materialized queries (it replaces an interval of a table)")
        if self.changes_since is not None and self.definition is not None:
            raise BadInputError("changes_since is for triggered queries; a materialized interval is computed whole")
        if self.changes_since is not None:
            from iox_planner.catalog.changes import read_watermark  # SQLAlchemy: not at a DAG file's parse

            read_watermark(self.changes_since)  # its shape now; the catalog checks the rest when the run plans

    @staticmethod
    def from_params(params: Mapping[str, Any], settings: RunSettings) -> QueryRequest:
        """`iox_query`'s params (already checked against their JSON schema by Airflow; checked again here, since
        a request can also come from code)."""
        unknown = sorted(set(params) - set(PARAM_NAMES))
        if unknown:
            raise BadInputError(f"unknown param(s) {', '.join(unknown)}; iox_query takes {', '.join(PARAM_NAMES)}")
        for required in ("db", "sql", "output"):
            if not params.get(required):
                raise BadInputError(f"param {required!r} is required")
        # Text params are text: a value of another type is refused, never turned into text (`str()` of an object
        # would make a query of its repr).
        for name in ("db", "sql", "output", "format", "time_start", "time_end", "changes_since"):
            value = params.get(name)
            if value is not None and not isinstance(value, str):
                raise BadInputError(f"param {name!r} must be a string, not {type(value).__name__}")
        timeout = params.get("timeout_s")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)):
            # A number, as the DAG's param schema says: text ("60") is not read as one (nor any script's digits).
            raise BadInputError(f"param 'timeout_s' must be whole seconds (an integer), not {type(timeout).__name__}")
        args = params.get("args") or {}
        if not isinstance(args, Mapping):
            raise BadInputError(f"param 'args' must be an object of bound parameters, not {type(args).__name__}")
        start, end = parse_range(params.get("time_start"), params.get("time_end"), start_what="time_start",
                                 end_what="time_end")
        request = QueryRequest(
            db=params["db"],
            sql=params["sql"],
            output=settings.resolve_output(params["output"]),
            format=run_format(params.get("format") or "parquet", "param format"),
            args=dict(args),
            time_start=start,
            time_end=end,
            timeout_s=params.get("timeout_s"),
            changes_since=params.get("changes_since"),
        )
        request.check_output(settings)
        return request

    def check_output(self, settings: RunSettings) -> Destination:
        """An Airflow run writes only under the output roots (resolved: symlinks and `..` cannot lead out; a key on
        a store only under a root on a store, output/store.py's checks too), with names from `OUTPUT_NAME` and the
        format's suffix. Returns the resolved output."""
        if isinstance(self.output, Root):
            return self._check_store_output(settings)
        resolved = self.output.resolve()
        root = settings.root_of(resolved)
        if root is None:
            roots = ", ".join(shown(r) for r in settings.output_roots)
            raise BadInputError(
                f"output {_short(self.output)} resolves to {_short(resolved)}, outside the output roots ({roots}); "
                "a run writes only under IOX_OUTPUT_ROOT (or IOX_OUTPUT_ROOTS): give a path inside one"
            )
        assert isinstance(root, Path)
        self._check_names(resolved, resolved.relative_to(root).parts, "".join(resolved.suffixes[-1:]))
        return resolved

    def _check_store_output(self, settings: RunSettings) -> Root:
        from iox_planner.output.store import store_target

        assert isinstance(self.output, Root)
        roots = [r for r in settings.output_roots if isinstance(r, Root)]
        target = store_target(self.output.uri, roots)
        root = settings.root_of(target)
        assert isinstance(root, Root)
        names = target.uri[len(root.uri) + 1:].split("/")
        last = names[-1]
        self._check_names(target.uri, names, last[last.rfind("."):] if "." in last else "")
        return target

    def _check_names(self, resolved: object, parts: Sequence[str], suffix: str) -> None:
        for part in parts:
            if not OUTPUT_NAME.fullmatch(part):
                raise BadInputError(
                    f"output {_short(resolved)}: the name {_short(part)} is not allowed; names start with a letter, "
                    "digit or '_' and hold letters, digits and _ . , = + @ : - (no leading dot, no spaces)"
                )
        allowed = OUTPUT_SUFFIXES[self.format]
        if suffix not in allowed:
            endings = " or ".join(f"'{s}'" if s else "no extension" for s in allowed)
            raise BadInputError(f"output {_short(resolved)}: a {self.format.value} output must end in {endings} "
                                f"(it ends in {suffix!r}); rename it")

    def lock_key(self) -> RunKey:
        """Materialized runs lock (definition, interval); triggered runs lock their output path, so two runs
        never publish one output at once."""
        if self.definition is not None and self.time_start is not None and self.time_end is not None:
            return RunKey(self.definition, self.time_start, self.time_end)
        return RunKey(f"output:{shown(self.output)}", INT64_MIN, INT64_MAX)

    def as_params(self) -> dict[str, Any]:
        """The request as recorded in the query run (times as RFC 3339)."""
        out: dict[str, Any] = {
            "db": self.db, "sql": self.sql, "args": dict(self.args),
            "time_start": format_time(self.time_start) if self.time_start is not None else None,
            "time_end": format_time(self.time_end) if self.time_end is not None else None,
            "output": shown(self.output), "format": self.format.value,
        }
        if self.register_as is not None:
            out["register_as"] = {"db": self.register_as.db or self.db, "table": self.register_as.table,
                                  "tags": list(self.register_as.tags)}
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        if self.changes_since is not None:
            out["changes_since"] = self.changes_since
        return out

    def budget_s(self) -> int:
        """The budget each Spark job of the run gets: `timeout_s`, else IOX_QUERY_TIMEOUT_S (read when the run
        plans, so every job of the run has the same)."""
        return query_timeout_s(self.timeout_s, "timeout_s")


def _short(value: object, size: int = 120) -> str:
    text = repr(value.uri if isinstance(value, Root) else str(value))[1:-1]
    return text if len(text) <= size else text[: size - 3] + "..."
