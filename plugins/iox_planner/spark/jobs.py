"""The Spark jobs iox-batch runs, as typed specs: what each reads and writes (a plan, its output and format and the
query's budget; a compaction's targets; a bulk load's input), the script spark-submit starts for it, and its
command-line arguments, written (`args`) and read back (`parse_job`) here alone. The CLI's launchers, the run
domain (a run's planned jobs) and the DAGs all build jobs from these, so a job gets the same arguments whoever
starts it; the one job wrapper (`spark_jobs/job.py`) reads them. Every job may leave a report (JSON) at `report`.

    run_plan.py            PlanJob       a plan's result, written in a format
    run_parts.py part      PartJob       a fanned-out plan's part: each scan's rows (planner/fanout.py)
    run_parts.py merge     MergeJob      the query's SQL over the parts
    run_compact.py         CompactJob    compaction of some partitions (a DAG batch) or of a database
    run_bulk_load.py       BulkLoadJob   a bulk load of a file or folder
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from iox_planner import config
from iox_planner.catalog.names import check_db_name
from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol.precision import Precision
from iox_planner.objectstore import Root, parse_root
from iox_planner.output import JOB_FORMATS, Destination, OutputFormat, destination_of, shown
from iox_planner.spark.budget import TIMEOUT_ARG, query_timeout_s
from iox_planner.spark.conf import jobs_dir


class _Parser(argparse.ArgumentParser):
    """A job's arguments are its input: a wrong one is a BadInputError (one paragraph, exit 2), not argparse's exit."""

    def error(self, message: str) -> Any:
        raise BadInputError(f"{self.prog}: {message[:500]}")


@dataclass(frozen=True)
class JobSpec:
    """What every job has: its script (and mode), where its report goes, whether its JVM starts for latency (set by
    the plan step for small plans; not an argument: the launcher or the operator applies it)."""

    script: ClassVar[str]
    mode: ClassVar[str | None] = None
    app: ClassVar[str]
    """The Spark application's name."""

    @property
    def application(self) -> Path:
        return jobs_dir() / self.script

    def budget(self) -> int | None:
        """The query's wall-time budget in seconds, for the jobs that run a query; None for the others."""
        return None

    def report_path(self) -> Path | None:
        raise NotImplementedError

    def args(self) -> list[str]:
        raise NotImplementedError

    def starts_fast(self) -> bool:
        return False

    def operator_kwargs(self) -> dict[str, Any]:
        """The job as the DAGs' operator takes it (a mapped task's keyword arguments, which go through XCom)."""
        return {"application": str(self.application), "application_args": self.args(),
                "fast_start": self.starts_fast()}

    @classmethod
    def parse(cls, argv: Sequence[str]) -> JobSpec:
        raise NotImplementedError


def _opt(flag: str, value: object | None) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _query_args(parser: argparse.ArgumentParser, *, with_format: bool) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON file (iox-batch explain --format json)")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--output", required=True)
    if with_format:
        parser.add_argument("--format", required=True, choices=[f.value for f in JOB_FORMATS])
    parser.add_argument("--report", help="write {\"rows\": N} here as JSON")
    parser.add_argument(TIMEOUT_ARG, dest="timeout_s", metavar="SECONDS",
                        help="wall-time budget of the query (default IOX_QUERY_TIMEOUT_S)")


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def _warehouse(value: str) -> Root:
    """A job's `--warehouse`: the warehouse's URI text (an absolute folder or s3://BUCKET/PREFIX), never a
    credential (each process builds its filesystem from its own AWS_* environment)."""
    return parse_root(value, what="--warehouse")


class _QueryJob(JobSpec):
    """The jobs that run a query (a plan, a part, a merge): their budget, report and fast start are fields of
    theirs of those names."""

    timeout_s: int
    report: Path | None
    fast_start: bool

    def budget(self) -> int:
        return self.timeout_s

    def report_path(self) -> Path | None:
        return self.report

    def starts_fast(self) -> bool:
        return self.fast_start


@dataclass(frozen=True)
class PlanJob(_QueryJob):
    """A plan's result in `format` at `output` (`arrow`: the Arrow IPC file a caller reads back to print or convert);
    at most `limit_rows` rows when given (the CLI's bound on printed results)."""

    script: ClassVar[str] = "run_plan.py"
    app: ClassVar[str] = "iox-batch run_plan"

    plan: Path
    output: Destination
    """A local path, or a key on a store (`s3://`, text in argv: a URI never carries a credential)."""
    format: OutputFormat
    timeout_s: int
    warehouse: Root = field(default_factory=config.warehouse_root)
    report: Path | None = None
    strategy: str | None = None
    limit_rows: int | None = None
    fast_start: bool = field(default=False, compare=False)

    def args(self) -> list[str]:
        return ["--plan", str(self.plan), "--warehouse", self.warehouse.uri, "--format", self.format.value,
                "--output", shown(self.output), *_opt("--report", self.report), TIMEOUT_ARG, str(self.timeout_s),
                *_opt("--strategy", self.strategy), *_opt("--limit-rows", self.limit_rows)]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> PlanJob:
        parser = _Parser(prog=cls.script)
        _query_args(parser, with_format=True)
        parser.add_argument("--strategy", choices=config.DEDUP_STRATEGY.choices,
                            help="how dedups run (default: IOX_DEDUP_STRATEGY or arrow)")
        parser.add_argument("--limit-rows", metavar="N", help="at most this many result rows")
        a = parser.parse_args(list(argv))
        limit = None if a.limit_rows is None else config.whole_number(a.limit_rows)
        if a.limit_rows is not None and not limit:
            raise BadInputError(f"{cls.script}: --limit-rows {a.limit_rows[:40]!r} is not a whole number above 0")
        return PlanJob(Path(a.plan), destination_of(a.output), OutputFormat(a.format),
                       query_timeout_s(a.timeout_s, TIMEOUT_ARG),
                       _warehouse(a.warehouse), _path(a.report), a.strategy, limit)


@dataclass(frozen=True)
class PartJob(_QueryJob):
    """A fanned-out plan's part: each scan's rows (deduplicated, time still int64 nanoseconds) as Parquet under
    `output/<view>/`, which the merge reads back."""

    script: ClassVar[str] = "run_parts.py"
    mode: ClassVar[str | None] = "part"
    app: ClassVar[str] = "iox-batch part"

    plan: Path
    output: Path
    timeout_s: int
    warehouse: Root = field(default_factory=config.warehouse_root)
    report: Path | None = None
    fast_start: bool = field(default=False, compare=False)

    def args(self) -> list[str]:
        return ["part", "--plan", str(self.plan), "--warehouse", self.warehouse.uri, "--output", str(self.output),
                *_opt("--report", self.report), TIMEOUT_ARG, str(self.timeout_s)]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> PartJob:
        parser = _Parser(prog=f"{cls.script} part")
        _query_args(parser, with_format=False)
        a = parser.parse_args(list(argv))
        return PartJob(Path(a.plan), Path(a.output), query_timeout_s(a.timeout_s, TIMEOUT_ARG), _warehouse(a.warehouse),
                       _path(a.report))


@dataclass(frozen=True)
class MergeJob(_QueryJob):
    """The query's SQL over the parts in `parts/<k>/`, each scan's view the union of its parts; the result as
    `PlanJob` writes it."""

    script: ClassVar[str] = "run_parts.py"
    mode: ClassVar[str | None] = "merge"
    app: ClassVar[str] = "iox-batch merge"

    plan: Path
    parts: Path
    output: Path
    format: OutputFormat
    timeout_s: int
    warehouse: Root = field(default_factory=config.warehouse_root)
    report: Path | None = None
    fast_start: bool = field(default=False, compare=False)

    def args(self) -> list[str]:
        return ["merge", "--plan", str(self.plan), "--warehouse", self.warehouse.uri, "--parts", str(self.parts),
                "--format", self.format.value, "--output", str(self.output), *_opt("--report", self.report),
                TIMEOUT_ARG, str(self.timeout_s)]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> MergeJob:
        parser = _Parser(prog=f"{cls.script} merge")
        _query_args(parser, with_format=True)
        parser.add_argument("--parts", required=True, help="the folder holding every part's output")
        a = parser.parse_args(list(argv))
        return MergeJob(Path(a.plan), Path(a.parts), Path(a.output), OutputFormat(a.format),
                        query_timeout_s(a.timeout_s, TIMEOUT_ARG), _warehouse(a.warehouse), _path(a.report))


Target = tuple[str, tuple[int, ...]]
"""A database and the ids of the partitions of it a compaction batch compacts."""


@dataclass(frozen=True)
class CompactJob(JobSpec):
    """Compaction of the listed partitions of each database (`targets`: an `iox_compact` batch), or of whatever in
    `db` (its `table`, its `partition`) needs it (`iox-batch compact`). The report is the run's
    (`maintenance/compact/report.py` `report_dict`)."""

    script: ClassVar[str] = "run_compact.py"
    app: ClassVar[str] = "iox-batch compact"

    report: Path | None = None
    targets: tuple[Target, ...] = ()
    db: str | None = None
    table: str | None = None
    partition: str | None = None

    def __post_init__(self) -> None:
        if bool(self.targets) == bool(self.db) or (self.targets and (self.table or self.partition)):
            raise BadInputError(f"{self.script}: give either --target DB=PARTITION_ID[,...] (repeatable) or --db DB "
                                "[--table] [--partition]")
        for db in [self.db] if self.db else [t[0] for t in self.targets]:
            check_db_name(db)
        if any(not pids or min(pids) < 1 for _, pids in self.targets):
            raise BadInputError(f"{self.script}: a target names no partition, or one below 1")

    def report_path(self) -> Path | None:
        return self.report

    def args(self) -> list[str]:
        targets = [x for db, pids in self.targets for x in ("--target", f"{db}={','.join(map(str, pids))}")]
        return [*_opt("--report", self.report), *targets, *_opt("--db", self.db), *_opt("--table", self.table),
                *_opt("--partition", self.partition)]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> CompactJob:
        parser = _Parser(prog=cls.script)
        parser.add_argument("--report")
        parser.add_argument("--target", action="append", default=[], metavar="DB=PARTITION_ID[,PARTITION_ID...]")
        parser.add_argument("--db")
        parser.add_argument("--table")
        parser.add_argument("--partition")
        a = parser.parse_args(list(argv))
        return CompactJob(_path(a.report), tuple(parse_target(t) for t in a.target), a.db, a.table, a.partition)


def parse_target(text: str) -> Target:
    """A batch's `--target DB=PARTITION_ID[,PARTITION_ID...]`."""
    db, sep, ids = text.partition("=")
    check_db_name(db)
    pids = [config.whole_number(p) for p in ids.split(",") if p.strip()]
    if not sep or not pids or any(not p for p in pids):
        raise BadInputError(f"--target {text[:80]!r} is not DB=PARTITION_ID[,PARTITION_ID...]")
    return db, tuple(p for p in pids if p)


@dataclass(frozen=True)
class BulkLoadJob(JobSpec):
    """A bulk load of `source` (a file, or every regular file of a folder; or an `s3://` object or prefix) into
    `db`, all or nothing; `root`: the folder the input must lie in (a triggered load's IOX_BULK_LOAD_ROOT, checked
    again on what the job opens). The report lists the chunks registered and the lines rejected."""

    script: ClassVar[str] = "run_bulk_load.py"
    app: ClassVar[str] = "iox-batch write --spark"

    db: str
    source: str
    precision: Precision = Precision.NS
    accept_partial: bool = False
    report: Path | None = None
    root: Path | None = None

    def __post_init__(self) -> None:
        check_db_name(self.db)
        object.__setattr__(self, "precision", Precision(self.precision))
        from iox_planner.objectstore import is_uri, uri_problem

        if is_uri(self.source):
            # Checked before the source reaches a job's argv (a URI carrying credentials must never), and worded
            # without repeating it.
            problem = uri_problem(self.source)
            if problem is not None:
                raise BadInputError(f"the bulk load's input is refused: {problem}")

    def report_path(self) -> Path | None:
        return self.report

    def args(self) -> list[str]:
        return ["--db", self.db, "--precision", self.precision.value, *_opt("--report", self.report),
                *(["--accept-partial"] if self.accept_partial else []), *_opt("--root", self.root), "--",
                self.source]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> BulkLoadJob:
        parser = _Parser(prog=cls.script)
        parser.add_argument("--db", required=True)
        parser.add_argument("--precision", choices=Precision.choices(), default=Precision.NS.value)
        parser.add_argument("--accept-partial", action="store_true")
        parser.add_argument("--report")
        parser.add_argument("--root", help="the folder the input must lie in (a triggered load's "
                                           "IOX_BULK_LOAD_ROOT); checked again on what is opened")
        parser.add_argument("source", metavar="FILE|DIR")
        a = parser.parse_args(list(argv))
        return BulkLoadJob(a.db, a.source, Precision(a.precision), a.accept_partial, _path(a.report),
                           _path(a.root))


KINDS: tuple[type[JobSpec], ...] = (PlanJob, PartJob, MergeJob, CompactJob, BulkLoadJob)


def parse_job(application: str | Path, argv: Sequence[str]) -> JobSpec:
    """The job a script (`application`, a path or a name) is started with `argv` for: the same spec that wrote
    those arguments (`JobSpec.args`)."""
    script, args = Path(application).name, list(argv)
    for kind in KINDS:
        if kind.script != script:
            continue
        if kind.mode is None:
            return kind.parse(args)
        if args[:1] == [kind.mode]:
            return kind.parse(args[1:])
    modes = [k.mode for k in KINDS if k.script == script and k.mode]
    if modes:
        raise BadInputError(f"{script}: the first argument is one of {', '.join(modes)}, not {args[:1]!r}")
    raise BadInputError(f"{script[:80]!r} is no iox-batch job; the jobs are "
                        f"{', '.join(sorted({k.script for k in KINDS}))}")
