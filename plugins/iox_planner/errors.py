"""The project's error tree: small and flat, each message naming the thing, what was allowed and how to fix it; and
its one mapping to exit statuses (each class's `exit_code`), which the CLI, the Spark jobs and the run steps all
exit with, read back from a job's status and error line by `error_for_status`."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 2_000
"""A user-facing error message is cut to this many characters: one that quotes a whole hostile input (a query of
a megabyte, say) helps nobody and floods logs and the catalog's run records."""


def clip_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut at `limit` characters, with a note saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit - 60
    return text[:keep] + f" ... [message cut: {len(text) - keep:,} more characters]"


class IoxError(Exception):
    """Base of every error iox-batch raises on purpose. The CLI prints its message as one paragraph, and no
    message is longer than `MAX_MESSAGE_CHARS`, wherever it is shown (CLI, Spark job, Airflow run records)."""

    exit_code = 1

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(clip_message(str(message)), *args)


class BadInputError(IoxError):
    """The user's input is wrong: line protocol, scenario file, parameters, time range, names."""

    exit_code = 2


class BadQueryError(BadInputError):
    """The SQL is wrong: it does not parse, names an unknown table or column, or is not a SELECT."""


class CatalogError(IoxError):
    """The catalog cannot do what was asked: unknown database, conflicting state, a missing or corrupt file."""

    exit_code = 3


class CatalogUnavailableError(CatalogError):
    """Retryable: the catalog's Postgres could not be reached, or the connection dropped mid-command (a restart,
    a network cut). Every catalog change is one transaction, so the command changed all or nothing; running it
    again is safe (a write that committed just before the drop and is written again deduplicates to the same
    points). Exit status 75 (EX_TEMPFAIL) so scripts can tell it from a real error."""

    exit_code = 75


class SparkUnavailableError(IoxError):
    """Retryable: the Spark Connect server a query runs on could not be reached, or went away mid-query (stopped,
    restarted, killed). A query publishes nothing until its result is complete, so nothing changed; running it
    again once the server is back is safe. Exit status 75 (EX_TEMPFAIL), as a lost catalog."""

    exit_code = 75


class StoreUnavailableError(IoxError):
    """Retryable: the object store holding the warehouse or an output root did not answer (connection refused, a
    timeout, a server error). Files are put once under fresh names and a catalog transaction is the only commit,
    so a command that failed so registered nothing and published nothing; what it had put is an object no row
    names, which the grace-period sweep removes. Exit status 75 (EX_TEMPFAIL), as a lost catalog."""

    exit_code = 75


class UnsupportedError(IoxError):
    """Valid, but not something iox-batch does (yet): a function that reaches outside the catalog, say."""

    exit_code = 4


class QueryTimeoutError(IoxError):
    """The query ran past its wall-time budget (IOX_QUERY_TIMEOUT_S, `--timeout`, a run's `timeout_s`): its Spark
    jobs were cancelled and nothing was published. Exit status 124, the status timeout(1) uses, so scripts can tell
    a query that needed more time from a wrong one."""

    exit_code = 124


class RunFailed(IoxError):
    """A run step (plan, commit) failed and has already recorded it: the run marked failed, its lock released, its
    staging folder removed. It carries its cause's message and exit status, whichever error that was (a bad
    query: 2; 75: the catalog was unreachable, retry the run), so it sits directly under the base."""

    def __init__(self, message: object = "", exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class InternalError(IoxError):
    """A bug: an invariant of iox-batch broke. The message carries what is needed to report it."""

    exit_code = 70


def _tree() -> list[type[IoxError]]:
    """Every class of the tree, most general first (breadth first from IoxError)."""
    found: list[type[IoxError]] = [IoxError]
    for cls in found:
        found.extend(sub for sub in cls.__subclasses__() if sub.__module__ == __name__ and sub not in found)
    return found


def error_for_status(status: int, message: str) -> IoxError:
    """The error a child process (a spark-submit job) reported as its `error: ` line `message` and exit `status`:
    the most general class of the tree that exits with that status (a bad query exits as a bad input, 2), IoxError
    for a status no class has. So a job's bad input stays a bad input, and a caller exits as it would have had the
    job run in its own process."""
    by_status: dict[int, type[IoxError]] = {}
    for cls in _tree():
        if cls is not RunFailed:  # its status is its cause's
            by_status.setdefault(cls.exit_code, cls)
    return by_status.get(status, IoxError)(message)


def error_named(name: str) -> type[IoxError] | None:
    """The class of the tree called `name` (a Spark worker's error line names its class), if any."""
    return next((cls for cls in _tree() if cls.__name__ == name), None)


def check_text(text: str, what: str = "the SQL") -> None:
    """Text that came from outside: no NUL, and valid UTF-8 (a lone surrogate is what Python makes of an invalid
    byte in argv or a file read with `surrogateescape`; Spark's JVM side fails on it with a traceback)."""
    nul = text.find("\x00")
    if nul >= 0:
        raise BadInputError(f"{what} contains a NUL character at offset {nul}; remove it")
    for offset, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raw = ord(ch) - 0xDC00 if "\udc80" <= ch <= "\udcff" else None
            byte = f" (byte 0x{raw:02x})" if raw is not None else ""
            raise BadInputError(f"{what} is not valid UTF-8{byte} at character {offset}; send UTF-8 text")
