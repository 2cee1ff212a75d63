"""The settings registry: every `IOX_*` environment variable iox-batch reads, declared once here (name, kind,
default, bounds, one line of doc), parsed by one rule per kind and read through its declaration; and the places
they lead to (the project, its state folder, the warehouse). An invalid value fails where it is read, in one
paragraph naming the variable and what it allows. README's configuration table is `markdown_table()` (a test holds
them equal)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from iox_planner.errors import BadInputError, UnsupportedError
from iox_planner.model import DB_NAME, MAX_WRITE_POSITION
from iox_planner.objectstore import Root, is_uri, local_root, parse_root, uri_problem

T = TypeVar("T")

_WHOLE = re.compile(r"[0-9]+(?:_[0-9]+)*")
"""A whole number as Python writes one (`1_000_000`): ASCII digits, single underscores between them, no sign."""
_MAX_DIGITS = 40
_FLAG_ON = frozenset({"1", "true"})
_FLAG_OFF = frozenset({"0", "false"})
SCHEDULE_PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
                     "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@quarterly": "0 0 1 */3 *",
                     "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}
PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
"""A TCP port, 1 to 65535, as a regular expression."""
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
"""How a URL starts (`s3:`, `file:`, `http:`): a path never does."""
OBJECT_STORAGE = ("object storage is not supported yet, and a URL (s3://, gs://, file://, http://, ...) is not a "
                  "folder: the warehouse and the outputs are local folders (a shared file system mounted as one "
                  "included), given as absolute paths such as /data/warehouse")


def whole_number(text: str) -> int | None:
    """`text` as a whole number by the one rule every setting and flag of whole numbers follows (ASCII digits,
    single underscores between them as Python writes `1_000_000`; nothing around them, no sign), else None."""
    if not isinstance(text, str) or len(text) > _MAX_DIGITS or not _WHOLE.fullmatch(text):
        return None
    return int(text)


def path_problem(text: str, *, storage: bool = False) -> str | None:
    """Why `text` is not a folder a setting may name (an absolute local path, written out), or None. `storage`:
    the warehouse and output roots, whose URL gets object storage's word."""
    if _SCHEME.match(text) or "://" in text:
        return OBJECT_STORAGE if storage else "it is a URL, where a local folder is meant: give its absolute path"
    if text.startswith("~"):
        return "`~` is not expanded here (a shell expands it, a setting does not): write the absolute path"
    if not text.startswith("/"):
        return ("it is a relative path, which would mean another folder in every folder a command runs from: give "
                "an absolute path")
    return None


def _database_problem(text: str) -> str | None:
    if not DB_NAME.fullmatch(text):
        return f"{text[:80]!r} is not a database name ([A-Za-z0-9_-]{{1,64}})"
    return None


def _point_problem(text: str) -> str | None:
    if not re.fullmatch(r"[a-z_]+(?:\.[a-z_]+)+", text):
        return f"{text[:80]!r} is not a kill point's name (as write.before_commit)"
    return None


_SECRET = frozenset({"IOX_SPARK_GATE_TOKEN"})
"""Settings whose value is never repeated in a message, not even in part."""
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def _shown(text: str) -> str:
    """A refused value as a message repeats it: at most 40 characters, without what may be a credential (a URL's
    user and password, Spark Connect's `;key=value` parameters such as `;token=`, a URL's query or fragment, where a
    presigned URL carries its signature and token)."""
    text = _USERINFO.sub("***@", text)
    cut = min([40, *(text.find(mark) for mark in ";?#" if mark in text)])
    return repr(text[:cut] + ("..." if len(text) > cut else ""))


def _form_problem(text: str, newlines: bool = False) -> str | None:
    """What every value is refused for, whatever its kind: taken exactly, a value is never empty, never has
    spaces around it, and holds no control character (newlines only where `newlines` lets items be separated)."""
    if not text:
        return "it is empty"
    if text != text.strip():
        return "it has spaces around it, and a value is taken exactly"
    if any((ord(ch) < 32 and not (newlines and ch == "\n")) or 127 <= ord(ch) < 160 for ch in text):
        return "it holds a control character"
    return None


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: its name, a line saying what it does, its default as README shows it. `read` gives the value
    (the default when unset); `parse` reads a value given some other way (`--set name=value`). Every value is
    taken exactly: empty, with spaces around it or with control characters, it is refused, never read as the
    default or as something near it."""

    name: str
    doc: str

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        text = (os.environ if environ is None else environ).get(self.name)
        if text is None:
            return self.default_value()
        return self.parse(text)

    def default_value(self) -> T:
        raise NotImplementedError

    def parse(self, text: str, what: str | None = None) -> T:
        raise NotImplementedError

    @property
    def shown_default(self) -> str:
        raise NotImplementedError

    @property
    def allowed(self) -> str:
        raise NotImplementedError

    def refusal(self, value: object, what: str | None = None, subject: str | None = None,
                why: str | None = None) -> BadInputError:
        """The one paragraph for a value this setting does not allow, given as `what` (default: the variable) for
        `subject` (default: the variable; a planner setting's `--set` name, say), saying `why` where known."""
        shown = (f"<{len(value)} characters, not shown>" if self.name in _SECRET and isinstance(value, str) else
                 _shown(value) if isinstance(value, str) else repr(value)[:40])
        undo = "unset it" if what is None else "leave it out"
        because = f" ({why})" if why else ""
        return BadInputError(f"{what or self.name}={shown} is not allowed{because}: {subject or self.name} takes "
                             f"{self.allowed} ({self.doc}); {undo} for the default, {self.shown_default}")

    def checked(self, text: str, what: str | None = None, subject: str | None = None,
                newlines: bool = False) -> str:
        """`text` if its form is one any value may have (`_form_problem`), else the one paragraph."""
        problem = _form_problem(text, newlines) if isinstance(text, str) else "it is not text"
        if problem is not None:
            raise self.refusal(text, what, subject, problem)
        return text


@dataclass(frozen=True)
class Whole(Setting[int]):
    """A whole number from `low` to `high`."""

    default: int = 0
    low: int = 0
    high: int = 0

    def default_value(self) -> int:
        return self.default

    def parse(self, text: str, what: str | None = None, subject: str | None = None) -> int:
        number = whole_number(self.checked(text, what, subject))
        if number is None:
            raise self.refusal(text, what, subject)
        return self.check(number, what, subject, shown=text)

    def check(self, value: object, what: str | None = None, subject: str | None = None, *,
              shown: object = None) -> int:
        """`value` (an int from a field, a param, JSON) within bounds, or the one paragraph."""
        if not isinstance(value, int) or isinstance(value, bool) or not self.low <= value <= self.high:
            raise self.refusal(value if shown is None else shown, what, subject)
        return value

    @property
    def shown_default(self) -> str:
        return f"{self.default:,}"

    @property
    def allowed(self) -> str:
        return f"a whole number from {self.low:,} to {self.high:,}"


@dataclass(frozen=True)
class Choice(Setting[str]):
    """One of a few words, exactly as written."""

    default: str = ""
    choices: tuple[str, ...] = ()

    def default_value(self) -> str:
        return self.default

    def parse(self, text: str, what: str | None = None) -> str:
        if self.checked(text, what) not in self.choices:
            raise self.refusal(text, what)
        return text

    @property
    def shown_default(self) -> str:
        return f"`{self.default}`"

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(f"`{c}`" for c in self.choices)


@dataclass(frozen=True)
class Flag(Setting[bool]):
    """On or off; unset is off."""

    def default_value(self) -> bool:
        return False

    def parse(self, text: str, what: str | None = None) -> bool:
        if self.checked(text, what) not in _FLAG_ON | _FLAG_OFF:
            raise self.refusal(text, what)
        return text in _FLAG_ON

    @property
    def shown_default(self) -> str:
        return "off"

    @property
    def allowed(self) -> str:
        return "1 or true; 0 or false"


@dataclass(frozen=True)
class Text(Setting[str | None]):
    """Text of one form (a URL, a Spark master, `key=value` pairs): `pattern`, which `form` says in words; None
    when unset."""

    default: str = ""
    """What README shows for the default (the code decides it when the variable is unset)."""
    pattern: str = ""
    """A regular expression the whole value must match."""
    form: str = ""
    newlines: bool = False
    """Whether newlines may separate items of the value."""

    def default_value(self) -> str | None:
        return None

    def parse(self, text: str, what: str | None = None) -> str:
        if not re.fullmatch(self.pattern, self.checked(text, what, newlines=self.newlines)):
            raise self.refusal(text, what)
        return text

    @property
    def shown_default(self) -> str:
        return self.default

    @property
    def allowed(self) -> str:
        return self.form


@dataclass(frozen=True)
class Folder(Setting[Path | None]):
    """An absolute path, written out (no `~`, no URL), None when unset. `storage`: a folder object storage would
    replace one day (the warehouse, the output roots), whose URL is refused with that word."""

    default: str = ""
    storage: bool = False

    def default_value(self) -> Path | None:
        return None

    def parse(self, text: str, what: str | None = None) -> Path:
        problem = path_problem(self.checked(text, what), storage=self.storage)
        if problem is not None:
            raise self.refusal(text, what, why=problem)
        return Path(text)

    @property
    def shown_default(self) -> str:
        return self.default

    @property
    def allowed(self) -> str:
        return "an absolute path"


@dataclass(frozen=True)
class Location(Setting[Root | None]):
    """Where files live: an absolute local folder (as `Folder`) or `s3://BUCKET/PREFIX` on an S3-compatible store
    (`objectstore.uri_problem` says what a URI may be: no credentials, no port, no query); None when unset."""

    default: str = ""

    def default_value(self) -> Root | None:
        return None

    def parse(self, text: str, what: str | None = None) -> Root:
        checked = self.checked(text, what)
        problem = uri_problem(checked) if is_uri(checked) else path_problem(checked)
        if problem is not None:
            # An `@` may end a secret anywhere before it (`s3://KEY:SE/CRET@bucket`): then nothing is shown.
            raise self.refusal("<not shown: it holds `@`>" if "@" in text else text, what, why=problem)
        return parse_root(checked)

    @property
    def shown_default(self) -> str:
        return self.default

    @property
    def allowed(self) -> str:
        return "an absolute path or `s3://BUCKET/PREFIX`"


def split_locations(text: str) -> list[str]:
    """`text`, a list of locations separated by `os.pathsep` (`:`), as its items. `s3://...` holds that separator
    itself, so an item `s3` followed by an item starting `//` is one location again (`s3://BUCKET/PREFIX`); nothing
    else is rejoined, so every other item is what it looks like (an absolute path is refused unless it starts with
    `/`, a `gs://` or `s3:bucket` stays in pieces that are refused)."""
    pieces = text.split(os.pathsep)
    items: list[str] = []
    k = 0
    while k < len(pieces):
        if pieces[k] == "s3" and k + 1 < len(pieces) and pieces[k + 1].startswith("//"):
            items.append(f"s3:{pieces[k + 1]}")
            k += 2
        else:
            items.append(pieces[k])
            k += 1
    return items


@dataclass(frozen=True)
class Locations(Setting[tuple[Root, ...]]):
    """Locations (`Location`'s form: an absolute local folder or `s3://BUCKET/PREFIX`) separated by `os.pathsep`
    (`:`), read by `split_locations`; () when unset."""

    default: str = ""

    def default_value(self) -> tuple[Root, ...]:
        return ()

    def parse(self, text: str, what: str | None = None) -> tuple[Root, ...]:
        self.checked(text, what)
        if "@" in text:
            # Before splitting: a secret may hold `:` and `/` (`s3://KEY:SE/CRET@bucket`), and no piece is shown.
            raise self.refusal("<not shown: it holds `@`>", what, why=(
                "it carries credentials: credentials come from the standard AWS settings (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the default credential chain), never from a location"))
        roots = []
        for item in split_locations(text):
            problem = _form_problem(item) or (uri_problem(item) if is_uri(item) else path_problem(item))
            if problem is not None:
                raise self.refusal(text, what, why=f"item {_shown(item)}: {problem}" if item else "an empty item")
            roots.append(parse_root(item))
        return tuple(roots)

    @property
    def shown_default(self) -> str:
        return self.default

    @property
    def allowed(self) -> str:
        return "absolute paths or `s3://BUCKET/PREFIX` locations separated by `os.pathsep` (`:`)"


@dataclass(frozen=True)
class Listed(Setting[tuple[str, ...]]):
    """Items separated by `separator`, each taken exactly and checked by `problem`; () when unset. `storage`: the
    items are output roots, absolute paths (`path_problem`), and a URL anywhere gets object storage's word (its
    `://` would be cut at the `:` separator into parts that look like paths)."""

    default: str = ""
    separator: str = ","
    item: str = "names"
    """What each item is, in words."""
    problem: Callable[[str], str | None] | None = None
    storage: bool = False

    def default_value(self) -> tuple[str, ...]:
        return ()

    def parse(self, text: str, what: str | None = None) -> tuple[str, ...]:
        if "://" in self.checked(text, what) and self.storage:
            raise self.refusal(text, what, why=OBJECT_STORAGE)
        items = text.split(self.separator)
        for item in items:
            problem = _form_problem(item) or (path_problem(item, storage=True) if self.storage else
                                              self.problem(item) if self.problem else None)
            if problem is not None:
                raise self.refusal(text, what, why=f"item {_shown(item)}: {problem}" if item else "an empty item")
        return tuple(items)

    @property
    def shown_default(self) -> str:
        return self.default

    @property
    def allowed(self) -> str:
        sep = "`os.pathsep` (`:`)" if self.separator == os.pathsep else f"`{self.separator}`"
        return f"{self.item} separated by {sep}"


@dataclass(frozen=True)
class Schedule(Setting[str]):
    """When a DAG runs: a five-field cron expression or a preset."""

    default: str = ""

    def default_value(self) -> str:
        return self.default

    def parse(self, text: str, what: str | None = None) -> str:
        if schedule_problem(self.checked(text, what)):
            raise self.refusal(text, what)
        return text

    @property
    def shown_default(self) -> str:
        return f"`{self.default}`"

    @property
    def allowed(self) -> str:
        return "a cron expression of five fields or a preset (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`)"


def schedule_problem(text: str) -> str | None:
    """Why `text` is not a schedule (a five-field cron expression or a preset), or None. croniter also reads a sixth
    field (seconds) and a seventh (year); a schedule of seconds would start a run every second, so neither is one
    here. The one rule for `IOX_*_SCHEDULE` and a materialized definition's `schedule`."""
    if text in SCHEDULE_PRESETS:
        return None
    from croniter import croniter

    if len(text.split()) != 5 or not croniter.is_valid(text):
        return (f"{text[:80]!r} is not a cron expression of five fields (minute hour day month weekday; once a "
                "minute at most) or a preset (@hourly, @daily, @weekly, @monthly, @yearly), e.g. '*/15 * * * *'")
    return None


# --- the registry -----------------------------------------------------------------------------------------------------
# Grouped as README's table is. Bounds: past them a value is a mistake (1e21 seconds is not a budget), or would cost
# more than a clear error (a parser's recursion, an index's key size, an allocation sized by the setting).

MiB = 1024 * 1024
SETTINGS: dict[str, Setting[Any]] = {}
"""Every variable, by name, in declaration order."""
S = TypeVar("S", bound=Setting[Any])


def _declare(declared: S) -> S:
    assert declared.name not in SETTINGS, declared.name
    SETTINGS[declared.name] = declared
    return declared


# Where things are
HOME = _declare(Folder(
    "IOX_HOME",
    "the project checkout (catalog_sql/, dags/, spark_jobs/)",
    "the checkout this package runs from"))
WAREHOUSE = _declare(Location(
    "IOX_WAREHOUSE",
    "where the Parquet chunk files live: a local folder, or `s3://BUCKET/PREFIX` on an S3-compatible store "
    "(endpoint, region and credentials from the standard `AWS_*` settings)",
    "`warehouse/` in the project"))
CATALOG_URL = _declare(Text(
    "IOX_CATALOG_URL",
    "the catalog's SQLAlchemy URL",
    "the project's own local Postgres, started on demand (state in `.iox/postgres.json`; as root its data lives "
    "under `/var/tmp/iox-batch/`, owned by `postgres`)",
    pattern=r"postgresql(\+[a-z0-9_]+)?://[^\s]+",
    form="a Postgres URL, `postgresql+psycopg2://USER:PASSWORD@HOST:PORT/DATABASE`"))
PG_BIN = _declare(Folder(
    "IOX_PG_BIN",
    "the folder of the local Postgres' `initdb` and `pg_ctl`",
    "`/usr/lib/postgresql/{15,16,17}/bin`, then `PATH`"))
OUTPUT_ROOT = _declare(Location(
    "IOX_OUTPUT_ROOT",
    "where triggered and materialized runs' relative output paths go; an output root: a local folder, or "
    "`s3://BUCKET/PREFIX` on an S3-compatible store (as IOX_WAREHOUSE)",
    "`output/` in the project"))
OUTPUT_ROOTS = _declare(Locations(
    "IOX_OUTPUT_ROOTS",
    "every output root runs (and `query --output s3://...`) may write under; the first takes relative paths "
    "unless IOX_OUTPUT_ROOT is set",
    "`IOX_OUTPUT_ROOT`"))
MATERIALIZED_DIR = _declare(Folder(
    "IOX_MATERIALIZED_DIR",
    "the folder of materialized query definitions (`*.yaml`)",
    "`dags/materialized/` in the project"))
BULK_LOAD_ROOT = _declare(Folder(
    "IOX_BULK_LOAD_ROOT",
    "the only folder whose files and subfolders `iox_bulk_load` may read; a `folder` param resolving elsewhere is "
    "refused",
    "`bulk/` in the project"))

# Spark
SPARK_MASTER = _declare(Text(
    "IOX_SPARK_MASTER",
    "the Spark master of every session and spark-submit",
    "`local[*]`",
    pattern=rf"local(\[(\*|[1-9][0-9]{{0,3}})(,[0-9]{{1,3}})?\])?|spark://{_HOST}:{PORT}(,{_HOST}:{PORT})*"
            rf"|yarn|k8s://https?://{_HOST}(:{PORT})?",
    form="`local`, `local[N]`, `local[*]`, `spark://host:port[,host:port...]`, `yarn` or `k8s://https://host:port`"))
SPARK_CONF = _declare(Text(
    "IOX_SPARK_CONF",
    "extra Spark settings, `key=value` separated by commas, semicolons or newlines",
    "none",
    pattern=r"[A-Za-z][A-Za-z0-9_.-]*=[^,;\n]*(?:[,;\n][A-Za-z][A-Za-z0-9_.-]*=[^,;\n]*)*",
    form="`key=value` pairs (a key of letters, digits, `.`, `_`, `-`) separated by `,`, `;` or newlines",
    newlines=True))
RUNNER = _declare(Choice(
    "IOX_RUNNER",
    "how the CLI runs Spark jobs: one SparkSession in its own process, spark-submit, or a session on a warm Spark "
    "Connect server (`scripts/env.sh` sets `connect`; README: Spark Connect); all run the same job and give the same "
    "rows. The DAGs' Spark steps run over Connect with `connect` (the `iox_spark_connect` connection, dags/README.md), "
    "else through spark-submit",
    "in-process",
    ("in-process", "spark-submit", "connect")))
SPARK_REMOTE = _declare(Text(
    "IOX_SPARK_REMOTE",
    "with IOX_RUNNER=connect: the Spark Connect server, `sc://HOST:PORT` and nothing else",
    "the project's own server (`iox-batch spark start`, or started on the first query; state in "
    "`.iox/spark-connect.json`)",
    pattern=rf"sc://(?:{_HOST}|\[[0-9A-Fa-f:.]+\]):{PORT}/?",
    form="`sc://HOST:PORT` (a port from 1 to 65535)"))
SPARK_GATE_TOKEN = _declare(Text(
    "IOX_SPARK_GATE_TOKEN",
    "the Connect server's token, one for both its ports: Spark Connect's own (`spark.connect.authenticate.token`) "
    "and its gate endpoint's (the last gate's parse); a client without it runs nothing there. Required with "
    "IOX_SPARK_REMOTE, and the one `iox-batch spark start` gives its server when set; 32 to 512 printable ASCII "
    "characters, no spaces (`openssl rand -hex 32`)",
    "for the project's own server a random one per start, in `.iox/spark-connect.json` (mode 0600)",
    pattern=r"[!-~]{32,512}",
    form="32 to 512 printable ASCII characters, no spaces"))
SPARK_TLS_CA = _declare(Folder(
    "IOX_SPARK_TLS_CA",
    "with IOX_SPARK_REMOTE: reach that server over TLS (gRPC, and HTTPS for its gate), through a TLS-terminating "
    "proxy in front of both ports, trusting this PEM CA file (the system's bundle for a public CA). Required for a "
    "server not on this machine, so its token never travels in clear",
    "unset: plain, for a server on this machine only"))
SPARK_GATE_PORT = _declare(Whole(
    "IOX_SPARK_GATE_PORT",
    "with IOX_SPARK_REMOTE: the port of that server's gate endpoint, on the same host (0: the Connect port + 1)",
    0,
    0,
    65_535))
QUERY_TIMEOUT_S = _declare(Whole(
    "IOX_QUERY_TIMEOUT_S",
    "wall-time budget of a query (planning, then Spark), in seconds; `--timeout`, a run's or a definition's "
    "`timeout_s` win (README: Budgets)",
    3600,
    1,
    86_400))
DEDUP_STRATEGY = _declare(Choice(
    "IOX_DEDUP_STRATEGY",
    "how Spark deduplicates: each overlap group merged in a Python worker (`arrow`), one `groupBy` over all "
    "groups, window functions, one `groupBy` per dedup; results never depend on it",
    "arrow",
    ("arrow", "shared", "window", "node")))
MAX_SPARK_JOBS = _declare(Whole(
    "IOX_MAX_SPARK_JOBS",
    "fan-out: the most Spark jobs a run's plan is split into, and `iox_compact`'s batches (Airflow maps at most "
    "1,024 task instances by default)",
    1,
    1,
    1024))
SPARK_RETRIES = _declare(Whole(
    "IOX_SPARK_RETRIES",
    "retries of a DAG's failed Spark task (each reruns cleanly)",
    1,
    0,
    10))
SPARK_RETRY_DELAY_S = _declare(Whole(
    "IOX_SPARK_RETRY_DELAY_S",
    "seconds between those retries",
    30,
    0,
    86_400))
SPARK_FAST_START_ROWS = _declare(Whole(
    "IOX_SPARK_FAST_START_ROWS",
    "a DAG's Spark job over at most this many rows starts its JVM for latency (0: never)",
    1_000_000,
    0,
    10**12))

# What one query or result may cost
PRINT_MAX_ROWS = _declare(Whole(
    "IOX_PRINT_MAX_ROWS",
    "the most rows of a result printed to standard output (README: Budgets)",
    100_000,
    1,
    100_000_000))
PRINT_MAX_BYTES = _declare(Whole(
    "IOX_PRINT_MAX_BYTES",
    "the most Arrow bytes of a result printed to standard output",
    64 * MiB,
    1024,
    2**30))
MAX_SQL_BYTES = _declare(Whole(
    "IOX_MAX_SQL_BYTES",
    "the most UTF-8 bytes of a query's SQL",
    MiB,
    64,
    64 * MiB))
MAX_SQL_DEPTH = _declare(Whole(
    "IOX_MAX_SQL_DEPTH",
    "how deep parentheses, brackets and CASE may nest in a query, brackets inside a string literal included (the "
    "parser's recursion)",
    64,
    4,
    256))
MAX_SQL_NODES = _declare(Whole(
    "IOX_MAX_SQL_NODES",
    "the most syntax-tree nodes of a query",
    500_000,
    64,
    20_000_000))
MAX_SQL_LIST = _declare(Whole(
    "IOX_MAX_SQL_LIST",
    "the most rows of one VALUES list and values of one IN list",
    10_000,
    16,
    1_000_000))
MAX_SQL_ALLOC = _declare(Whole(
    "IOX_MAX_SQL_ALLOC",
    "what one call may build in one value (`repeat`, `lpad`, `sequence`, format widths, sketch sizes...): checked "
    "when planning where the size is a constant, by a guard at run time where it comes from the data",
    16_777_216,
    1024,
    2**31 - 1))
MAX_HINT_PARTITIONS = _declare(Whole(
    "IOX_MAX_HINT_PARTITIONS",
    "the most partitions a query's hint may ask for (`REPARTITION(n)`, `COALESCE(n)`, `REPARTITION_BY_RANGE(n)`, "
    "`REBALANCE(n)`): each is a task on the shared Spark server",
    2048,
    1,
    1_000_000))

# The planner (also `--set name=value`; PRODUCT.md's planner section)
TARGET_PARTITIONS = _declare(Whole(
    "IOX_TARGET_PARTITIONS",
    "Parquet files are dealt into this many file groups where their order does not matter",
    4,
    1,
    10_000))
MAX_DEDUP_PARTITION_SPLIT = _declare(Whole(
    "IOX_MAX_DEDUP_PARTITION_SPLIT",
    "more partitions than this under one dedup keep one dedup over all of them",
    10_000,
    1,
    1_000_000))
MAX_DEDUP_TIME_SPLIT = _declare(Whole(
    "IOX_MAX_DEDUP_TIME_SPLIT",
    "more time groups than this under one dedup keep it whole",
    100,
    1,
    100_000))
MAX_PARQUET_FANOUT = _declare(Whole(
    "IOX_MAX_PARQUET_FANOUT",
    "under a dedup, files get a sorted group each up to this many",
    40,
    1,
    100_000))
MAX_DEDUP_ROWS_PER_SLICE = _declare(Whole(
    "IOX_MAX_DEDUP_ROWS_PER_SLICE",
    "a dedup group estimated above this many rows is cut into time slices merged as separate tasks",
    1_000_000,
    1,
    2**62))

# Line protocol (every write, the bulk load, scenario files)
LP_MAX_LINE_BYTES = _declare(Whole(
    "IOX_LP_MAX_LINE_BYTES",
    "the most bytes of one line (a string spanning lines counts whole); a longer one is a bad line",
    MiB,
    1,
    2**31))
LP_MAX_COLUMNS = _declare(Whole(
    "IOX_LP_MAX_COLUMNS",
    "the most tags plus fields on one line",
    1000,
    1,
    2**31))
LP_MAX_NAME_BYTES = _declare(Whole(
    "IOX_LP_MAX_NAME_BYTES",
    "the most bytes of a measurement, tag or field name (at most the 2,048 the catalog's indexes hold)",
    256,
    1,
    2048))
LP_MAX_BAD_LINES = _declare(Whole(
    "IOX_LP_MAX_BAD_LINES",
    "past this many bad lines reading stops and the write is refused",
    1000,
    1,
    2**31))
LP_ERRORS_SHOWN = _declare(Whole(
    "IOX_LP_ERRORS_SHOWN",
    'bad lines an error lists before "and K more"',
    5,
    1,
    2**31))
LP_EXCERPT_BYTES = _declare(Whole(
    "IOX_LP_EXCERPT_BYTES",
    "the most bytes of the input one message quotes",
    64,
    1,
    2**31))
WRITE_CHUNK_ROWS = _declare(Whole(
    "IOX_WRITE_CHUNK_ROWS",
    "rows of one ingester chunk of a write (all full but the newest of a table and day): what a write keeps in "
    "memory",
    250_000,
    1,
    MAX_WRITE_POSITION + 1))
# What one write may add to the catalog (catalog/limits.py): checked before anything is written.
DB_MAX_TABLES = _declare(Whole(
    "IOX_DB_MAX_TABLES",
    "the most live tables of one database, those it already has included (IOx's and InfluxDB Clustered's default)",
    500,
    1,
    1_000_000))
TABLE_MAX_COLUMNS = _declare(Whole(
    "IOX_TABLE_MAX_COLUMNS",
    "the most columns of one table (tags, fields and time), those it already has included (InfluxDB 3 Core's and "
    "Enterprise's default)",
    500,
    2,
    1_000_000))
WRITE_MAX_PARTITIONS = _declare(Whole(
    "IOX_WRITE_MAX_PARTITIONS",
    "the most partitions (table and UTC day) one write, bulk load, scenario load or `register_as` registration may "
    "touch (InfluxDB Cloud Serverless allows 5,000 days per database in 15 minutes)",
    5000,
    1,
    100_000_000))
BULK_RANGE_BYTES = _declare(Whole(
    "IOX_BULK_RANGE_BYTES",
    "`write --spark`: about the bytes of input one Spark task parses and holds",
    64 * MiB,
    4096,
    1024 * MiB))
SCENARIO_MAX_BYTES = _declare(Whole(
    "IOX_SCENARIO_MAX_BYTES",
    "the most bytes of a scenario file",
    16 * MiB,
    1,
    1024 * MiB))
SCENARIO_MAX_CHUNKS = _declare(Whole(
    "IOX_SCENARIO_MAX_CHUNKS",
    "the most entries of a scenario's `chunks:`",
    10_000,
    1,
    1_000_000))
SCENARIO_MAX_LINES = _declare(Whole(
    "IOX_SCENARIO_MAX_LINES",
    "the most line-protocol lines of a scenario, all chunks together",
    1_000_000,
    1,
    100_000_000))
SCENARIO_MAX_DEPTH = _declare(Whole(
    "IOX_SCENARIO_MAX_DEPTH",
    "the deepest nesting of YAML collections in a scenario (it needs 4)",
    20,
    1,
    100))

# Maintenance
COMPACT_COLD_SECONDS = _declare(Whole(
    "IOX_COMPACT_COLD_SECONDS",
    "a partition this quiet (no new chunk) is cold: its L1 files may become L2",
    4 * 3600,
    0,
    10 * 365 * 86_400))
COMPACT_TARGET_ROWS = _declare(Whole(
    "IOX_COMPACT_TARGET_ROWS",
    "rows of an L2 file, and below which an L1 file is small",
    5_000_000,
    1,
    2**40))
COMPACT_MAX_ROWS = _declare(Whole(
    "IOX_COMPACT_MAX_ROWS",
    "the most input rows one compaction slice holds (a task's memory budget: it merges its slices one at a time)",
    2_000_000,
    1,
    2**40))
COMPACT_MIN_SLICES = _declare(Whole(
    "IOX_COMPACT_MIN_SLICES",
    "a large partition is cut into at least this many time slices, run as parallel Spark tasks, while each keeps "
    "65,536 rows or more",
    2,
    1,
    4096))
COMPACT_DRIVER_ROWS = _declare(Whole(
    "IOX_COMPACT_DRIVER_ROWS",
    "a compaction run rewriting at most this many rows merges them in the driver's process, with no Spark job (a "
    "job costs about 0.2 CPU-seconds of its own); 0: always on Spark",
    500_000,
    0,
    2**40))
COMPACT_SCHEDULE = _declare(Schedule(
    "IOX_COMPACT_SCHEDULE",
    "when `iox_compact` looks for compaction work",
    "@hourly"))
COMPACT_DATABASES = _declare(Listed(
    "IOX_COMPACT_DATABASES",
    "the databases `iox_compact` compacts",
    "all",
    item="database names",
    problem=_database_problem))
PERSIST_SCHEDULE = _declare(Schedule(
    "IOX_PERSIST_SCHEDULE",
    "when `iox_persist` looks for piled-up ingester chunks",
    "*/30 * * * *"))
PERSIST_CHUNK_THRESHOLD = _declare(Whole(
    "IOX_PERSIST_CHUNK_THRESHOLD",
    "`iox_persist` persists a partition once it has this many ingester chunks",
    10,
    1,
    1_000_000))
PERSIST_DATABASES = _declare(Listed(
    "IOX_PERSIST_DATABASES",
    "the databases `iox_persist` looks at",
    "all",
    item="database names",
    problem=_database_problem))

# Runs
RUN_LOCK_TTL_S = _declare(Whole(
    "IOX_RUN_LOCK_TTL_S",
    "a run lock whose holder died is taken over after this many seconds (at once when its Airflow DAG run has "
    "ended)",
    6 * 3600,
    1,
    30 * 86_400))
REFRESH_SCHEDULE = _declare(Schedule(
    "IOX_REFRESH_SCHEDULE",
    "when `iox_refresh` looks for stale materialized intervals",
    "*/15 * * * *"))
MAX_RUN_INTERVALS = _declare(Whole(
    "IOX_MAX_RUN_INTERVALS",
    "the most intervals of a definition one `iox-batch materialized run` or `refresh` takes (a year of hourly "
    "ones: 8,760); more are refused before any runs",
    10_000,
    1,
    1_000_000))
REFRESH_CONCURRENCY = _declare(Whole(
    "IOX_REFRESH_CONCURRENCY",
    "how many stale intervals `iox_refresh` recomputes at once",
    2,
    1,
    1024))

# Debugging and the fault tests
DEBUG = _declare(Flag(
    "IOX_DEBUG",
    "show a traceback for an internal error"))
FAULT_KILL_AT = _declare(Text(
    "IOX_FAULT_KILL_AT",
    "fault tests only: the kill point (`faults.py`) where the process kills its own group",
    "none",
    pattern=r"[a-z_]+(?:\.[a-z_]+)+",
    form="a kill point's name, as `write.before_commit`"))
FAULT_PAUSE_AT = _declare(Listed(
    "IOX_FAULT_PAUSE_AT",
    "fault tests only: the kill points where the process stops itself until continued",
    "none",
    item="kill points' names",
    problem=_point_problem))


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every variable set in the environment read once, the first bad value refused with its one paragraph: a
    command starts only with a configuration it can honour, whatever part of it the command would use."""
    for setting in SETTINGS.values():
        setting.read(environ)


def markdown_table(settings: Sequence[Setting[Any]] | None = None) -> str:
    """README's configuration table: variable, default, what it allows, what it does."""
    rows = ["| variable | default | allowed | what |", "|---|---|---|---|"]
    for s in settings or list(SETTINGS.values()):
        rows.append(f"| `{s.name}` | {s.shown_default} | {s.allowed} | {s.doc} |")
    return "\n".join(rows) + "\n"


# --- where things are -------------------------------------------------------------------------------------------------


def project_root() -> Path:
    """The checkout this package runs from (IOX_HOME overrides): holds catalog_sql/, dags/, spark_jobs/."""
    home = HOME.read()
    if home is not None:
        if not (home / "catalog_sql").is_dir():
            # Without its migrations the catalog would look up to date and every command fail on a missing table.
            raise BadInputError(f"IOX_HOME={str(home)[:200]!r} is not an iox-batch checkout (it has no catalog_sql/ "
                                "folder); point it at the checkout, or unset it")
        return home.resolve()
    here = Path(__file__).resolve().parents[2]
    if (here / "catalog_sql").is_dir():
        return here
    return Path.cwd().resolve()


def state_dir() -> Path:
    """Project-local state (the local Postgres state file, locks). Not committed."""
    path = project_root() / ".iox"
    path.mkdir(parents=True, exist_ok=True)
    return path


def warehouse_root() -> Root:
    """Where Parquet lives: IOX_WAREHOUSE (a local folder or `s3://BUCKET/PREFIX`), else the project's own
    `warehouse/` folder."""
    root = WAREHOUSE.read()
    return root if root is not None else local_root(project_root() / "warehouse")


def warehouse() -> Path:
    """The warehouse's folder on this disk, for tools that need one (the benchmarks, a few tests); an `s3://`
    warehouse is refused there with one paragraph. The product itself goes through `warehouse_root()`."""
    root = warehouse_root()
    if not root.is_local:
        raise UnsupportedError(f"this tool needs the warehouse on this disk (IOX_WAREHOUSE={root.uri}): give a "
                               "local folder")
    return root.local_path
