"""The project's error tree: small and flat, each message naming the thing, what was allowed and how to fix it."""

from __future__ import annotations


class IoxError(Exception):
    """Base of every error iox-batch raises on purpose. The CLI prints its message as one paragraph."""

    exit_code = 1


class BadInputError(IoxError):
    """The user's input is wrong: line protocol, scenario file, parameters, time range, names."""

    exit_code = 2


class BadQueryError(BadInputError):
    """The SQL is wrong: it does not parse, names an unknown table or column, or is not a SELECT."""


class CatalogError(IoxError):
    """The catalog cannot do what was asked: unknown database, conflicting state, a missing or corrupt file."""

    exit_code = 3


class UnsupportedError(IoxError):
    """Valid, but not something iox-batch does (yet): a function that reaches outside the catalog, say."""

    exit_code = 4


class InternalError(IoxError):
    """A bug: an invariant of iox-batch broke. The message carries what is needed to report it."""

    exit_code = 70
