"""What a query may not do, checked on the query as written: only catalog tables, only functions that read nothing
but their arguments (by the name Spark resolves, which is the name as written: the text Spark runs is the user's),
no names iox-batch reserves, parameters that match, and no call whose constant size would take the machine."""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Mapping, overload

from sqlglot import exp
from sqlglot.tokenizer_core import Token, TokenType

from iox_planner.errors import BadInputError, BadQueryError, UnsupportedError, check_text
from iox_planner.model import INTERNAL_NAMES, INTERNAL_PREFIX, TableSchema
from iox_planner.planner.functions import (
    ALLOWED, CONTEXT_WORDS, GENERATORS, HINTS, PARTITION_HINTS, REFUSED, SYNTAX,
)
from iox_planner.planner.limits import SqlLimits, alloc_error, partitions_error
from iox_planner.planner.nodes import ParamValue
from iox_planner.planner.regex import REGEX_ARGUMENTS, like_problem, pattern_problem
from iox_planner.planner.sizing import SIZED, Bound
from iox_planner.planner.predicate import SPARK
from iox_planner.planner.sql.parse import CALL, Source, call_name

def reject_outside(statement: exp.Query, source: Source, tables: Mapping[str, TableSchema]) -> None:
    """Only catalog tables and functions that read nothing but their arguments (`functions.ALLOWED`, checked on
    the name Spark resolves in every spelling); no JVM calls, files, paths, scripts, variables, UDFs or INTO."""
    columns = {c for schema in tables.values() for c in schema.columns}
    # A hint's arguments are not calls (REPARTITION(3) names a hint, not a function): the hint list checks them.
    for node in statement.walk(prune=lambda n: isinstance(n, exp.Hint)):
        if isinstance(node, exp.Select) and node.args.get("into"):
            raise UnsupportedError("SELECT ... INTO would create a table; iox-batch runs read-only queries: drop "
                                   "INTO and write the result with --output (or a materialized definition's "
                                   "register_as)")
        if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier):
            # Spark reads a bare `user` or `current_schema` that names no column as a call of that function
            # (and sqlglot does not check every place a column can stand, HAVING and QUALIFY among them).
            if node.name.lower() in CONTEXT_WORDS:
                raise UnsupportedError(f"a bare {node.name[:80]!r} is read by Spark as the function "
                                       f"{node.name.lower()}() wherever its own query block has no column of that "
                                       "name (in a subquery, even when an outer table has one), and that function "
                                       f"is not in the allowed list; to mean a column, qualify it (t.{node.name[:80]})")
            if node.name.lower() in REFUSED and node.name not in columns:
                raise UnsupportedError(f"{node.name[:80]!r} is not a column of the query's tables, and Spark would "
                                       f"call the function {node.name.lower()}() for it, which is not in the "
                                       "allowed list; name a column (qualify it: t.col) or rename the alias")
        elif isinstance(node, exp.Func):
            _check_function(node, source)
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            raise UnsupportedError(f"function name {_shorten(node)} is qualified; call Spark built-in functions "
                                   "by their bare name (e.g. abs(x), not system.builtin.abs(x))")
        elif isinstance(node, exp.QueryTransform):
            raise UnsupportedError("SELECT TRANSFORM ... USING runs an external script and is not allowed")
        elif isinstance(node, (exp.Parameter, exp.SessionParameter)):
            raise UnsupportedError(f"{_shorten(node)} is a variable reference, which iox-batch does not "
                                   "substitute; pass values as bound parameters (:name with --param name=value)")
        elif isinstance(node, exp.Hint):
            for hint in node.expressions:
                if isinstance(hint, (exp.JoinHint, exp.Anonymous)):
                    name = hint.name
                elif isinstance(hint, exp.Func):
                    name = call_name(hint, source) or hint.sql_name()
                else:
                    name = hint.sql(dialect=SPARK)
                if str(name).lower() not in HINTS:
                    raise UnsupportedError(f"hint {str(name)[:80]!r} is not allowed; allowed hints: "
                                           f"{', '.join(sorted(h.upper() for h in HINTS))}")
                if str(name).lower() in PARTITION_HINTS:
                    _check_partitions(str(name), hint)
        elif isinstance(node, exp.Lateral) and not isinstance(node.this, (exp.Func, exp.Subquery)):
            raise UnsupportedError(f"LATERAL {_shorten(node.this)} is not allowed; LATERAL takes a subquery or "
                                   "a generator function such as explode(...)")
        elif isinstance(node, exp.Table):
            _check_table(node, source, tables)


def _check_partitions(name: str, hint: exp.Expr) -> None:
    """A partitioning hint's number (Spark takes a whole-number literal, in parentheses or not, as the count of
    partitions; anything else is a partitioning expression) within `IOX_MAX_HINT_PARTITIONS`: REPARTITION(2147483647)
    ended the shared server's JVM, and each partition is a task scheduled on it."""
    limits = SqlLimits.from_env()
    for node in hint.walk():
        if isinstance(node, exp.Literal) and not node.is_string:
            try:
                count = int(float(node.this))
            except (ValueError, OverflowError):
                continue
            if count > limits.max_partitions:
                raise partitions_error(name.upper(), count, limits)


def _check_table(node: exp.Table, source: Source, tables: Mapping[str, TableSchema]) -> None:
    if node.args.get("db") or node.args.get("catalog"):
        raise UnsupportedError(f"table {_shorten(node)} names a database, a file format or a path; only catalog "
                               "tables are allowed, named without a prefix (e.g. FROM h2o, FROM `sys.cpu`)")
    if not isinstance(node.this, exp.Identifier):
        function = node.this
        name = call_name(function, source) if isinstance(function, exp.Func) else None
        if name is not None and name.lower() in GENERATORS:
            return  # a generator in FROM reads nothing but its arguments, as in SELECT or LATERAL VIEW
        shown = name or (function.name if isinstance(function, exp.Anonymous) else _shorten(function))
        raise UnsupportedError(f"table function {str(shown)[:80]}() is not allowed in FROM; only catalog tables "
                               f"and generators ({', '.join(sorted(GENERATORS))}) are allowed there")
    if node.args.get("version") or node.args.get("when"):
        raise UnsupportedError(f"table {_shorten(node)} asks for an earlier version (time travel), which catalog "
                               "tables do not have; filter on time instead")
    if node.name not in tables and (any(ch in node.name for ch in "/:\\") or not node.name.strip()):
        raise UnsupportedError(f"{node.name[:80]!r} looks like a path; only catalog tables are allowed in FROM")


def _check_function(node: exp.Func, source: Source) -> None:
    if isinstance(node.parent, exp.Dot) and node.arg_key == "expression":
        raise UnsupportedError(f"function name {_shorten(node.parent)} is qualified; call Spark built-in "
                               "functions by their bare name (e.g. abs(x), not system.builtin.abs(x))")
    name = call_name(node, source)
    if name is None:
        return  # syntax (CAST ... AS, CASE ... END, an operator): no name for Spark to resolve
    if name.lower() not in ALLOWED and name.lower() not in SYNTAX:
        why = " (it reaches outside the query's data)" if name.lower() in REFUSED else ""
        raise UnsupportedError(f"function {name[:80]}() is not in the allowed list of Spark built-in "
                               f"functions{why}; queries may call only functions that read nothing but their "
                               "arguments (see iox_planner/planner/functions.py)")


def _shorten(node: exp.Expr) -> str:
    text = node.sql(dialect=SPARK)
    return repr(text if len(text) <= 80 else text[:80] + "...")


# ----------------------------------------------------------------------------------------------------------------
# Reserved names and parameters


def is_internal_name(name: str) -> bool:
    """Whether `name` is, or could be mistaken for, a column or view iox-batch itself adds (any case: Spark's
    case sensitivity is a setting, so a name that differs only in case is refused too)."""
    lowered = name.lower()
    return lowered in INTERNAL_NAMES or lowered.startswith(INTERNAL_PREFIX)


def reject_internal_names(statement: exp.Query) -> None:
    """No identifier of the query (column, alias, table, CTE, lambda variable) may name an internal column or
    view: the views Spark reads carry nanosecond columns, and the output drops the helpers the planner adds, so a
    user name among them would read hidden data or vanish from the result."""
    for node in statement.walk():
        name: str | None = None
        if isinstance(node, exp.Identifier):
            name = str(node.this)
        elif isinstance(node, exp.Anonymous) and str(node.this).lower() == "identifier":
            # IDENTIFIER('name') names a column by a string; the string must pass the same rule.
            name = next((str(a.this) for a in node.expressions if isinstance(a, exp.Literal) and a.is_string
                         and is_internal_name(str(a.this))), None)
        if name is not None and is_internal_name(name):
            raise BadQueryError(
                f"the query uses the name {name!r}, which iox-batch reserves for its internal columns and views "
                f"({', '.join(sorted(INTERNAL_NAMES))} and names starting with {INTERNAL_PREFIX!r}, in any case); "
                "a query reads the tables' tags, fields and time: rename the alias or column")


def check_params(statement: exp.Query, params: Mapping[str, object]) -> dict[str, ParamValue]:
    names: set[str] = set()
    for ph in statement.find_all(exp.Placeholder):
        if not ph.this:
            raise BadInputError("positional parameters (?) are not supported; name them (:name) and pass "
                                "--param name=value")
        names.add(str(ph.this))
    missing = sorted(names - set(params))
    extra = sorted(set(params) - names)
    if missing:
        raise BadInputError(f"the query uses parameter(s) {', '.join(':' + n for n in missing)} but no value was "
                            f"given; pass --param name=value for each")
    if extra:
        used = ", ".join(":" + n for n in sorted(names)) or "none"
        raise BadInputError(f"parameter(s) {', '.join(extra)} were given but the query does not use them "
                            f"(it uses: {used})")
    bound: dict[str, ParamValue] = {}
    limits = SqlLimits.from_env()
    for name in sorted(names):
        value = params[name]
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise BadInputError(f"parameter {name} has a value of type {type(value).__name__}; parameters are "
                                "strings, numbers, booleans or null")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInputError(f"parameter {name} is {value!r}, which Spark SQL has no literal for; pass a "
                                "finite number")
        if isinstance(value, str):
            check_text(value, f"the value of parameter {name}")
            if len(value.encode("utf-8")) > limits.max_bytes:
                raise BadInputError(f"the value of parameter {name} is longer than IOX_MAX_SQL_BYTES allows; "
                                    "shorten it or raise the limit")
        bound[name] = value
    return bound


# ----------------------------------------------------------------------------------------------------------------
# Sizes known before running

_FORMATTERS = frozenset({"format_string", "printf"})
_MULTIPLYING = frozenset({"repeat", "array_repeat"})
"""Calls whose result is their first argument's value that many times: what the sized calls inside their first
argument build multiplies by their count."""
# A Java format specifier's width and precision (`%-2000000000s`, `%.9999999f`). Java's `\d` is ASCII only, so
# these patterns are written with [0-9] (Python's `\d` would take any script's digits).
_SPECIFIER = re.compile(r"%(?:[0-9]+\$)?[-#+ 0,(<]*([0-9]+)?(?:\.([0-9]+))?[a-zA-Z%]")
# Java's Formatter, which format_string and printf run: `%[index$][flags][width][.precision][t]conversion`.
_JAVA_SPECIFIER = re.compile(r"%(?:([0-9]+)\$)?([-#+ 0,(<]*)([0-9]+)?(?:\.[0-9]+)?([tT])?(.?)", re.S)
_CONVERSIONS = set("bBhHsScCdoxXeEfgGaA%n")
_TIME_CONVERSIONS = set("HIklMSLNpzZsQBbhAaCYyjmdeRTrDFc")
_STRINGS = (TokenType.STRING, TokenType.RAW_STRING)


def check_allocations(statement: exp.Query, source: Source, limits: SqlLimits,
                      params: Mapping[str, object] | None = None) -> None:
    """Calls whose size is a constant of the query stay within `IOX_MAX_SQL_ALLOC` (`sizing.SIZED` says which
    arguments set a size): `repeat('x', 2147483647)` or `count_min_sketch(c, 1e-8D, 0.9D, 1)` would take the
    driver's memory before any row is read, and nothing after planning could stop it cleanly. Repeats of repeats
    multiply: `repeat(repeat('x', 10000), 10000)` builds 10^8. A size computed from the data is left to the guard
    `guards.py` splices around it; where only a constant makes sense (a sketch's accuracy, a format), one is
    required."""
    repeats: dict[int, tuple[exp.Func, int]] = {}
    for node in statement.walk():
        if not isinstance(node, exp.Func) or CALL not in node.meta:
            continue
        name = (call_name(node, source) or "").lower()
        sized = SIZED.get(name)
        if sized is None:
            continue
        arguments = call_arguments(source, node.meta[CALL])
        if arguments is None:
            continue
        shown = f"{name}(...)"
        if sized.bound is Bound.LITERAL:
            _check_format_argument(name, shown, arguments, limits)
        elif name == "sequence":
            start, stop = constant(arguments, 0, params), constant(arguments, 1, params)
            step = constant(arguments, 2, params) if len(arguments) > 2 else 1
            if start is not None and stop is not None and step:
                count = abs(stop - start) // abs(step) + 1
                if count > limits.max_alloc:
                    raise alloc_error(shown, count, limits)
                repeats[id(node)] = (node, count)
        elif sized.bound is Bound.GUARDED:
            [position] = sized.positions
            size = constant(arguments, position, params)
            if size is None and position < len(arguments):
                _refuse_unknown_constant(shown, arguments[position])
            elif size is not None:
                if abs(size) > limits.max_alloc:
                    raise alloc_error(shown, abs(size), limits, sized.what)
                repeats[id(node)] = (node, abs(size))
        else:
            values: list[float | None] = []
            for position in sized.positions:
                tokens = arguments[position] if position < len(arguments) else []
                if not tokens or (name == "format_number" and len(tokens) == 1 and tokens[0].token_type in _STRINGS):
                    values.append(None)  # left to Spark's default, or format_number's pattern (as long as its text)
                    continue
                value = constant(arguments, position, params, real=True)
                if value is None:
                    raise BadQueryError(f"argument {position + 1} of {shown} sets how many {sized.what} it builds "
                                        "and must be a constant iox-batch can compute before running (a number "
                                        "literal, + - * /, casts or a bound parameter); write it as a number")
                values.append(value)
            measured = sized.measure(values)
            if measured > limits.max_alloc:
                raise alloc_error(shown, measured, limits, sized.what)
    totals: dict[int, int] = {}

    def built(node: exp.Func) -> int:
        """What a sized call builds: its own size, times, for a repeat, the most any sized call in its first
        argument builds (`repeat(space(n), m)` builds n * m)."""
        if id(node) not in totals:
            own = repeats[id(node)][1]
            if (call_name(node, source) or "").lower() in _MULTIPLYING:
                first = node.this if isinstance(node.this, exp.Expression) else next(iter(node.expressions), None)
                inner = [built(repeats[id(d)][0]) for d in (first.walk() if first is not None else ())
                         if id(d) in repeats and d is not node]
                own = min(own * max(inner, default=1), 10**40)
            totals[id(node)] = own
        return totals[id(node)]

    for node, _ in repeats.values():
        if built(node) > limits.max_alloc:
            raise alloc_error(f"{(call_name(node, source) or '').lower()}(...) of a sized value", built(node), limits)


def check_patterns(statement: exp.Query, source: Source) -> None:
    """Every regular expression a call or RLIKE/REGEXP gives Spark is one string literal that `regex.py` finds
    safe: Java's engine cannot be interrupted, so a pattern that backtracks for ever keeps a core of the shared
    server busy long after its query's budget ended."""
    for node in statement.walk():
        if isinstance(node, exp.Func) and CALL in node.meta:
            name = (call_name(node, source) or "").lower()
            positions = REGEX_ARGUMENTS.get(name, ())
            arguments = call_arguments(source, node.meta[CALL]) if positions else None
            for position in positions:
                if arguments is not None and position < len(arguments):
                    tokens = arguments[position]
                    one = len(tokens) == 1 and tokens[0].token_type in _STRINGS
                    _check_pattern(f"{name}(...)", tokens[0].text if one else None)
        if isinstance(node, exp.RegexpLike) and CALL not in node.meta:  # the RLIKE and REGEXP operators
            pattern = node.expression
            literal = isinstance(pattern, exp.Literal) and pattern.is_string
            _check_pattern("RLIKE", str(pattern.this) if literal else None)
        elif isinstance(node, (exp.Like, exp.ILike)):
            escape = node.parent.expression if isinstance(node.parent, exp.Escape) else None
            for pattern in _like_patterns(node.expression):
                _check_like(pattern, str(escape.this) if isinstance(escape, exp.Literal) else "\\")


def _like_patterns(pattern: exp.Expression) -> list[exp.Expression]:
    """The patterns of one LIKE/ILIKE: its one pattern, or each of LIKE ANY/ALL/SOME (...)'s."""
    if isinstance(pattern, (exp.Any, exp.All)):
        inner = pattern.this
        return list(inner.expressions) if isinstance(inner, exp.Tuple) else \
            [inner.this if isinstance(inner, exp.Paren) else inner]
    return [pattern]


def _check_like(pattern: exp.Expression, escape: str) -> None:
    """A LIKE pattern is one string literal `like_problem` finds safe: Spark compiles any other (computed from the
    data, a parameter, `concat('%a', ...)`) into a Java regular expression at run time, as uninterruptible as
    RLIKE's, so `LIKE concat('%a%a%a%a', '%b')` kept cores busy long after its query's budget."""
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise UnsupportedError("the pattern of LIKE/ILIKE must be one string literal ('...'): Spark runs a pattern "
                               "computed from the data or a parameter as a regular expression that cannot be "
                               "checked before running, and Java's engine, which cannot be interrupted, may "
                               "backtrack on it for ever")
    why = like_problem(str(pattern.this), escape)
    if why is not None:
        raise UnsupportedError(f"the LIKE pattern {str(pattern.this)[:80]!r} is refused: Spark runs it "
                               f"as a regular expression, and {why}; use fewer % wildcards")


def _check_pattern(shown: str, pattern: str | None) -> None:
    if pattern is None:
        raise UnsupportedError(f"the regular expression of {shown} must be one string literal ('...'): a pattern "
                               "computed from the data or a parameter cannot be checked before running, and Java's "
                               "engine, which cannot be interrupted, may backtrack on it for ever")
    why = pattern_problem(pattern)
    if why is not None:
        raise UnsupportedError(f"the regular expression {pattern[:80]!r} of {shown} is refused: {why}; write it "
                               "without nested or overlapping repetitions (Java's engine cannot be interrupted)")


def _check_format_argument(name: str, shown: str, arguments: list[list[Token]], limits: SqlLimits) -> None:
    """The format of format_string/printf: one string literal (a format computed from the data could ask for any
    width, `concat('%', n, 's')`), whose widths and precisions add up within the limit (eight specifiers of 16M
    each build 128M characters), in a form Java's Formatter takes."""
    if not arguments or len(arguments[0]) != 1 or arguments[0][0].token_type not in _STRINGS:
        raise BadQueryError(f"the format of {shown} must be one string literal (its widths set how much the call "
                            "builds, and a format computed from the data could ask for any width); write the "
                            "format as '...'")
    text = arguments[0][0].text
    size = sum(max(int(width or 0), int(precision or 0)) for width, precision in _SPECIFIER.findall(text))
    if size > limits.max_alloc:
        raise alloc_error(shown, size, limits, "characters")
    _check_format(name, text, len(arguments) - 1)


def _check_format(name: str, text: str, given: int) -> None:
    """A constant format of format_string/printf that Java's Formatter would refuse, said in its terms before
    running (Spark reports only Java's terse `Format specifier '%2$s'`)."""
    ordinary = highest = 0
    for match in _JAVA_SPECIFIER.finditer(text):
        index, flags, _, time, conversion = match.groups()
        if not conversion:
            raise BadQueryError(f"the format of {name}() ends inside a specifier ({match.group(0)!r}); write %% for "
                                "a percent sign")
        if (time and conversion not in _TIME_CONVERSIONS) or (not time and conversion not in _CONVERSIONS):
            raise BadQueryError(f"the format of {name}() has the specifier {match.group(0)!r}, which Java's "
                                "Formatter does not know; conversions are b h s c d o x e f g a t % n")
        if conversion in "%n" and not time:
            continue
        if index is not None:
            highest = max(highest, int(index))
        elif "<" not in flags:
            ordinary += 1
    needed = max(highest, ordinary)
    if needed > given:
        raise BadQueryError(f"the format of {name}() uses {needed} argument(s) but the call gives {given}; pass "
                            "one value per specifier (%2$s is the second value)")


def call_arguments(source: Source, where: tuple[int, int]) -> list[list[Token]] | None:
    """The tokens of each argument of the call at text offsets `where` (split at its top-level commas)."""
    first = source.token_index(where[0])
    if first is None or first + 1 >= len(source.tokens) or source.tokens[first + 1].token_type is not TokenType.L_PAREN:
        return None
    close = source.group_end(first + 1)
    arguments: list[list[Token]] = [[]]
    depth = 0
    for token in source.tokens[first + 2:close]:
        kind = token.token_type
        if kind in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif kind in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        if kind is TokenType.COMMA and depth == 0:
            arguments.append([])
        else:
            arguments[-1].append(token)
    return arguments


@overload
def constant(arguments: list[list[Token]], position: int, params: Mapping[str, object] | None = None, *,
              real: Literal[False] = False) -> int | None: ...
@overload
def constant(arguments: list[list[Token]], position: int, params: Mapping[str, object] | None = None, *,
              real: Literal[True]) -> float | None: ...
def constant(arguments: list[list[Token]], position: int, params: Mapping[str, object] | None = None, *,
              real: bool = False) -> int | float | None:
    """The number an argument is when it is a constant of number literals and bound parameters (`_Folder`:
    signs, parentheses, + - * / div, casts, suffixes), else None: an integer (fractions truncated, as a size
    is), or with `real` the exact value (a sketch's accuracy, 1e-8D)."""
    if position >= len(arguments):
        return None
    value: int | float | None = _Folder(arguments[position], params or {}, real).value()
    return value


def _refuse_unknown_constant(shown: str, tokens: list[Token], what: str = "size") -> None:
    """A size (or format) that reads no column is a constant Spark computes on the driver before any row is
    read; one the folder cannot compute (CASE, coalesce(...), a string Spark casts) is refused rather than
    trusted. A size computed from the data is a run-time matter (the driver's memory bound ends it clearly)."""
    if not tokens or reads_a_column(tokens):
        return
    raise BadQueryError(f"the {what} of {shown} is a constant iox-batch cannot compute before running (only number "
                        f"literals, + - * /, casts and bound parameters are); write it as a number"
                        + (" or one string literal" if what == "format" else "")
                        + ", or compute it from the data")


_CONSTANT_TOKENS = frozenset(getattr(TokenType, n) for n in """NUMBER STRING L_PAREN R_PAREN L_BRACKET R_BRACKET
    COMMA PLUS DASH STAR SLASH DIV MOD LT GT LTE GTE EQ NEQ AND OR NOT CASE WHEN THEN ELSE END TRUE FALSE NULL
    DPIPE PIPE AMP CARET TILDA SELECT ALIAS DCOLON""".split() if hasattr(TokenType, n))


def reads_a_column(tokens: list[Token]) -> bool:
    """Whether an argument may read the rows: it has a token that is neither a constant's (literals, operators,
    CASE, a scalar SELECT), nor a call's name, nor a type after AS or ::, nor a bound parameter's name. Any other
    name (a column, a keyword used as one such as `temp`) counts as reading the rows."""
    for i, token in enumerate(tokens):
        kind = token.token_type
        if kind in _CONSTANT_TOKENS or kind is TokenType.COLON:
            continue
        after = tokens[i + 1].token_type if i + 1 < len(tokens) else None
        before = tokens[i - 1].token_type if i else None
        if after is TokenType.L_PAREN or before in (TokenType.COLON, TokenType.ALIAS, TokenType.DCOLON):
            continue
        return True
    return False


_CAST_WORDS = frozenset({"CAST", "TRY_CAST"})


class _Folder:
    """Folds one argument's tokens as Spark would compute a constant: `(2147483647)`, `2147483646 + 1`,
    `- -n`, `2147483647L`, `2147483647::int`, `CAST('2147483647' AS INT)`. Anything else (a column, a call, a
    string that is not a whole number) makes the whole argument unknown: None."""

    def __init__(self, tokens: list[Token], params: Mapping[str, object], real: bool = False) -> None:
        self.tokens = tokens
        self.params = params
        self.real = real
        self.at = 0

    def value(self) -> Any:
        try:
            result = self._sum()
        except _NotConstant:
            return None
        return result if self.at == len(self.tokens) else None

    def _peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self) -> Token:
        token = self._peek()
        if token is None:
            raise _NotConstant
        self.at += 1
        return token

    def _sum(self) -> float:
        total = self._product()
        while (token := self._peek()) is not None and token.token_type in (TokenType.PLUS, TokenType.DASH):
            self.at += 1
            right = self._product()
            total = total + right if token.token_type is TokenType.PLUS else total - right
        return total

    def _product(self) -> float:
        total = self._unary()
        while (token := self._peek()) is not None and token.token_type in (TokenType.STAR, TokenType.SLASH,
                                                                            TokenType.DIV):
            self.at += 1
            right = self._unary()
            if token.token_type is TokenType.STAR:
                total *= right
            elif right == 0:
                raise _NotConstant
            else:
                total = total / right if self.real else int(total / right)
            if abs(total) > 10**40:  # far past every bound: no need to build bigger numbers
                total = 10**40 if total > 0 else -10**40
        return total

    def _unary(self) -> float:
        token = self._peek()
        if token is not None and token.token_type in (TokenType.PLUS, TokenType.DASH):
            self.at += 1
            inner = self._unary()
            return -inner if token.token_type is TokenType.DASH else inner
        value = self._primary()
        while (token := self._peek()) is not None and token.token_type is TokenType.DCOLON:
            self.at += 1
            self._type()
        return value

    def _primary(self) -> float:
        token = self._take()
        if token.token_type is TokenType.NUMBER:
            return _number(token.text, self.real)
        if token.token_type is TokenType.COLON:  # a bound parameter: its value is known when the query plans
            value = self.params.get(self._take().text)
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise _NotConstant
            return _number(str(value).strip(), self.real)
        if token.token_type is TokenType.L_PAREN:
            value = self._sum()
            if self._take().token_type is not TokenType.R_PAREN:
                raise _NotConstant
            return value
        if token.text.upper() in _CAST_WORDS and self._take().token_type is TokenType.L_PAREN:
            inner = self._peek()
            if inner is not None and inner.token_type is TokenType.STRING:
                self.at += 1
                text = inner.text.strip()  # Spark's cast takes a sign and spaces around the digits
                value = (-_number(text[1:].strip(), self.real) if text.startswith("-")
                         else _number(text.removeprefix("+").strip(), self.real))
            else:
                value = self._sum()
            if self._take().token_type is not TokenType.ALIAS:
                raise _NotConstant
            self._type()
            if self._take().token_type is not TokenType.R_PAREN:
                raise _NotConstant
            return value
        raise _NotConstant

    def _type(self) -> None:
        """A type name, with its parameters if any (`DECIMAL(38, 0)`): what it is does not change a size's
        magnitude enough to matter for a bound."""
        token = self._take()
        if token.token_type in (TokenType.L_PAREN, TokenType.R_PAREN, TokenType.COMMA):
            raise _NotConstant
        if (nxt := self._peek()) is not None and nxt.token_type is TokenType.L_PAREN:
            while self._take().token_type is not TokenType.R_PAREN:
                pass


class _NotConstant(Exception):
    """The argument is not a constant `_Folder` can compute."""


def _number(text: str, real: bool = False) -> float:
    """A number literal's value, suffixes (`L`, `S`, `Y`, `BD`, `D`, `F`) dropped, fractions truncated (kept with
    `real`)."""
    text = text.rstrip("LlSsYyDdFf").removesuffix("B").removesuffix("b")
    if not re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]{1,4})?|\.[0-9]+([eE][-+]?[0-9]{1,4})?", text):
        raise _NotConstant
    try:
        if real:
            return float(text)
        return int(float(text)) if any(c in text for c in ".eE") else int(text)
    except (ValueError, OverflowError) as err:
        raise _NotConstant from err
