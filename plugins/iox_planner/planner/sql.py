"""The SQL front end: from a Spark SQL query to one scan request per table reference, and the query Spark runs.

The query must be one SELECT over catalog tables. Each table reference (a self-join has two) becomes a scan,
replaced in the SQL by a view (`__iox_scan_<n>`, aliased as the reference was). A scan gets the columns its
reference needs and the WHERE conjuncts that concern it alone; Spark evaluates the whole WHERE again on the
views, so a conjunct pushed into a scan only has to keep every row Spark would keep. When unsure, nothing is
pushed: correct first.

In a scan, `time` is the stored int64 nanoseconds; on the view Spark sees a TIMESTAMP of `floor(time / 1000)`
microseconds. A pushed comparison of `time` with a constant timestamp is rewritten over nanoseconds so that it
keeps exactly the rows Spark keeps (`time > TIMESTAMP '...'` keeps a row 1 ns after the literal only if Spark
does, which it does not: both see the same microsecond).

The view also has `__time_ns`, the exact int64 nanoseconds. A result column that is a table's `time` passed through
unchanged, row for row (`time_columns`), gets a companion `__iox_ns_<name>` selected at the top level, which the
output folds back into `<name>`: `<alias>.__time_ns` for a view, or a hidden item `__iox_tns_<k>` added to each
subquery or CTE the column passes through. An ORDER BY on such a column gets the nanoseconds as a tie-break right
after it. Where that is not safe (set operations, DISTINCT, GROUP BY, aggregates, windows, a subquery whose column
set a star or a column list would see change), the column keeps Spark's microseconds instead.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Mapping, ParamSpec, Sequence, TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope, traverse_scope
from sqlglot.schema import MappingSchema
from sqlglot.tokenizer_core import Token, TokenType

from iox_planner.errors import BadInputError, BadQueryError, UnsupportedError, check_text
from iox_planner.model import (
    HIDDEN_PREFIX, INTERNAL_NAMES, INTERNAL_PREFIX, NS_PREFIX, SPARK_SQL_TYPES, TIME, TIME_NS, VIEW_PREFIX,
    ColumnType, TableSchema,
)
from iox_planner.planner.functions import ALLOWED, HINTS, REFUSED, SYNTAX
from iox_planner.planner.limits import SqlLimits, check_size, depth_error, nodes_error
from iox_planner.planner.nodes import ParamValue
from iox_planner.planner.predicate import SPARK, Conjunct, column, identifier, split_conjuncts, to_sql
from iox_planner.planner.timebounds import combine, expression_time_bounds

_NODE = "iox_node"

TagOp = Literal["eq", "in", "gt", "gte", "lt", "lte"]


@dataclass(frozen=True)
class TagFilter:
    """A conjunct on a tag that tag min/max can prune by: `tag = 'x'`, `tag IN (...)`, `tag > 'x'` and the like."""

    column: str
    op: TagOp
    values: tuple[str, ...]


@dataclass(frozen=True)
class ScanRequest:
    """What one table reference needs from its scan."""

    view: str
    table: str
    alias: str
    columns: tuple[str, ...]
    """The columns the query reads from this reference, in `SELECT *` order (tags, fields, time)."""
    conjuncts: tuple[Conjunct, ...]
    """WHERE conjuncts over this reference alone, as Spark SQL over plain names, `time` in int64 ns."""
    time_min: int | None
    time_max: int | None
    """Inclusive nanosecond bounds the conjuncts put on `time` (None: open)."""
    tag_filters: tuple[TagFilter, ...]


@dataclass(frozen=True)
class AnalyzedQuery:
    sql: str
    spark_sql: str
    params: Mapping[str, ParamValue]
    scans: tuple[ScanRequest, ...]
    output_columns: tuple[str, ...]
    time_columns: tuple[str, ...]


_NOW_FUNCTIONS = frozenset({"now", "currenttimestamp", "localtimestamp", "getdate"})
_NOW_CLASSES = (exp.CurrentTimestamp, exp.CurrentTimestampLTZ, exp.Localtimestamp, exp.CurrentDatetime,
                exp.UtcTimestamp)

# Expression nodes a pushed conjunct may hold (after `time` comparisons were rewritten): deterministic, row-local.
_PUSHABLE = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.And, exp.Or, exp.Not,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is, exp.In,
    exp.Between, exp.Like, exp.ILike, exp.Escape, exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod,
    exp.Cast, exp.TryCast, exp.DataType, exp.DataTypeParam, exp.Lower, exp.Upper, exp.Coalesce, exp.Abs,
    exp.Length,
)
_TIMESTAMP_TYPES = frozenset({exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ,
                              exp.DataType.Type.TIMESTAMPLTZ, exp.DataType.Type.TIMESTAMPNTZ})
_INTERVAL_US = {
    "MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000, "MINUTE": 60_000_000, "HOUR": 3_600_000_000,
    "DAY": 86_400_000_000, "WEEK": 7 * 86_400_000_000,
}
# Timestamp text Spark reads the same way we do (a strict subset of what it accepts; zone-less means UTC).
_TS_TEXT = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?(Z|[+-]\d{2}:\d{2})?)?"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _within_limits(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Analysis with room on the stack for the nesting the limits allow (sqlglot's scopes, qualify and printing
    recurse once per level too); should a query still go deeper, an error saying so, not a RecursionError."""
    @functools.wraps(func)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        limits = SqlLimits.from_env()
        try:
            with _stack_for(limits):
                return func(*args, **kwargs)
        except RecursionError as err:
            raise BadQueryError(f"the SQL nests too deeply to analyze; flatten it (limit: IOX_MAX_SQL_DEPTH="
                                f"{limits.max_depth})") from err
    return guarded


@_within_limits
def analyze(sql: str, tables: Mapping[str, TableSchema], *, params: Mapping[str, object] | None = None,
            now_ns: int) -> AnalyzedQuery:
    """Check the query and derive, for each table reference, what its scan must produce."""
    statement = _parse(sql)
    _reject_outside(statement, tables)
    _reject_internal_names(statement)
    bound = _check_params(statement, params or {})
    refs = _tag_table_references(statement, tables)
    shape = _tag_nodes(statement)
    qualified = _qualify(statement, tables)
    front = _Analysis(qualified, tables, refs, bound, now_ns)
    scans = tuple(front.scan(i) for i in range(len(refs)))
    output = front.output_columns()
    nanos = _Nanoseconds(front, shape).edits()
    spark_sql = _rewrite(statement, refs, scans, now_ns, nanos, front)
    return AnalyzedQuery(sql, spark_sql, bound, scans, output, tuple(nanos.time_columns))


# ----------------------------------------------------------------------------------------------------------------
# Checks on the statement as written


def _parse(sql: str, limits: SqlLimits | None = None) -> exp.Query:
    """The one SELECT of `sql`, within the limits: size and text before tokenizing, nesting before parsing (the
    parser recurses once per level), syntax nodes after. AND/OR chains come back balanced (see `_balance`)."""
    limits = limits or SqlLimits.from_env()
    if not isinstance(sql, str):
        raise BadQueryError(f"the SQL must be text, not {type(sql).__name__}")
    check_text(sql)
    check_size(sql, limits)
    try:
        tokens = SPARK.tokenize(sql)
    except sqlglot.errors.SqlglotError as err:
        raise BadQueryError(f"the SQL does not parse: {err}") from err
    _check_tokens(tokens, limits)
    try:
        with _stack_for(limits):
            statements = [s for s in SPARK.parser().parse(tokens, sql) if s is not None]
    except sqlglot.errors.ParseError as err:
        first = err.errors[0] if err.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first.get("line") else ""
        near = f" near {str(first.get('highlight'))[:80]!r}" if first.get("highlight") else ""
        why = first.get("description") or str(err)
        raise BadQueryError(f"the SQL does not parse{where}{near}: {why}") from err
    except RecursionError as err:
        raise BadQueryError(f"the SQL nests too deeply to parse; flatten it (limit: IOX_MAX_SQL_DEPTH="
                            f"{limits.max_depth})") from err
    except (sqlglot.errors.SqlglotError, ValueError, IndexError, KeyError, TypeError, AttributeError) as err:
        # sqlglot fails on some Spark-only shapes with a bare exception (MAP ... USING raises IndexError).
        raise BadQueryError(f"the SQL does not parse ({type(err).__name__}); iox-batch takes one plain SELECT "
                            "over catalog tables") from err
    if len(statements) != 1:
        raise BadQueryError(f"expected exactly one SQL statement, got {len(statements)}; send one SELECT")
    statement = statements[0]
    if not isinstance(statement, exp.Query):
        kind = type(statement).__name__.upper()
        raise BadQueryError(f"only a SELECT query can run here, not a {kind} statement")
    statement = _balance(statement)
    _check_tree(statement, limits)
    return statement


# Tokens that open and close a nesting level of the parser's recursion.
_OPENS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE}
_CLOSES = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END}
# A unary operator repeated (NOT NOT NOT x, - - - x) also recurses once per token.
_UNARY = {TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE}


def _check_tokens(tokens: Sequence[Token], limits: SqlLimits) -> None:
    """Nesting within the limit, and no script transform (`TRANSFORM|MAP|REDUCE ... USING 'script'`): a USING
    followed by a string is only ever a script (a join's USING takes a column list)."""
    depth = deepest = unary = 0
    for i, token in enumerate(tokens):
        kind = token.token_type
        if kind in _OPENS:
            depth += 1
            deepest = max(deepest, depth)
        elif kind in _CLOSES:
            depth = max(depth - 1, 0)
        unary = unary + 1 if kind in _UNARY else 0
        if deepest > limits.max_depth or unary > limits.max_depth:
            raise depth_error(max(deepest, unary), limits)
        if kind is TokenType.PARAMETER:
            raise UnsupportedError(f"{token.text}... at line {token.line}, column {token.col} is a variable "
                                   "reference (${...}, @@...), which iox-batch does not substitute; pass values "
                                   "as bound parameters (:name with --param name=value)")
        if kind is TokenType.USING and i + 1 < len(tokens) and tokens[i + 1].token_type is TokenType.STRING:
            raise UnsupportedError("SELECT TRANSFORM/MAP/REDUCE ... USING runs an external script and is not "
                                   "allowed; compute the columns with SQL functions instead")


@contextmanager
def _stack_for(limits: SqlLimits) -> Iterator[None]:
    """Room on the Python stack for the parser's recursion at the allowed depth (it takes about 25 frames per
    level, and CPython's default of 1,000 frames stops it near 40)."""
    needed = 2_000 + 40 * limits.max_depth
    saved = sys.getrecursionlimit()
    if saved < needed:
        sys.setrecursionlimit(needed)
    try:
        yield
    finally:
        sys.setrecursionlimit(saved)


def _balance(statement: exp.Query) -> exp.Query:
    """Each chain of ANDs (or of ORs) rebuilt as a balanced tree of the same operands in the same order.

    The parser builds `a OR b OR c ...` as a left-deep chain as deep as it is long; sqlglot's scope analysis
    walks from every column up to its SELECT, so 10,000 ORs cost 10,000 x 10,000 steps, and splitting conjuncts
    recursed once per AND. AND and OR are associative in SQL's three-valued logic and the operand order is kept,
    so the query means the same and prints the same (`a OR b OR c OR d`, no parentheses added)."""
    heads = [n for n in statement.walk() if isinstance(n, (exp.And, exp.Or)) and type(n.parent) is not type(n)]
    for head in heads:
        operands: list[exp.Expr] = []
        stack: list[exp.Expr] = [head]
        while stack:
            node = stack.pop()
            if type(node) is type(head) and not node.comments:
                stack.append(node.expression)
                stack.append(node.this)
            else:
                operands.append(node)
        if len(operands) > 3:
            balanced = _balanced(type(head), operands)
            balanced.comments = head.comments
            head.replace(balanced)
    return statement


def _balanced(kind: type[exp.Connector], operands: Sequence[exp.Expr]) -> exp.Expr:
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    return kind(this=_balanced(kind, operands[:middle]), expression=_balanced(kind, operands[middle:]))


def _check_tree(statement: exp.Query, limits: SqlLimits) -> None:
    """Syntax nodes and their depth within the limits (iteratively: the tree may be deeper than the stack)."""
    nodes = 0
    # The syntax tree is several nodes deep per nesting level of the text (Paren, operator, Column, Identifier).
    max_tree_depth = 8 * limits.max_depth + 32
    stack: list[tuple[exp.Expr, int]] = [(statement, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise nodes_error(limits.max_nodes, limits)
        if depth > max_tree_depth:
            raise BadQueryError(f"the SQL's expressions nest over {max_tree_depth} levels deep (a long chain of "
                                f"+, || or comparisons, say); flatten it or raise IOX_MAX_SQL_DEPTH (now "
                                f"{limits.max_depth})")
        for child in node.iter_expressions():
            stack.append((child, depth + 1))


def _reject_outside(statement: exp.Query, tables: Mapping[str, TableSchema] | None = None) -> None:
    """Only catalog tables and functions that read nothing but their arguments (`functions.ALLOWED`, checked on
    the name Spark resolves in every spelling); no JVM calls, files, paths, scripts, variables or UDFs."""
    columns = {c for schema in (tables or {}).values() for c in schema.columns}
    for node in statement.walk():
        if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier):
            # Spark reads a bare `user` or `current_schema` that names no column as a call of that function
            # (and sqlglot does not check every place a column can stand, HAVING and QUALIFY among them).
            if node.name.lower() in REFUSED and node.name not in columns:
                raise UnsupportedError(f"{node.name[:80]!r} is not a column of the query's tables, and Spark would "
                                       f"call the function {node.name.lower()}() for it, which is not in the "
                                       "allowed list; name a column (qualify it: t.col) or rename the alias")
        elif isinstance(node, exp.Func):
            _check_function(node)
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
                name = hint.name if isinstance(hint, (exp.JoinHint, exp.Anonymous)) else hint.sql(dialect=SPARK)
                if str(name).lower() not in HINTS:
                    raise UnsupportedError(f"hint {str(name)[:80]!r} is not allowed; allowed hints: "
                                           f"{', '.join(sorted(h.upper() for h in HINTS))}")
        elif isinstance(node, exp.Lateral) and not isinstance(node.this, (exp.Func, exp.Subquery)):
            raise UnsupportedError(f"LATERAL {_shorten(node.this)} is not allowed; LATERAL takes a subquery or "
                                   "a generator function such as explode(...)")
        elif isinstance(node, exp.Table):
            if node.args.get("db") or node.args.get("catalog"):
                raise UnsupportedError(
                    f"table {_shorten(node)} names a database, a file format or a path; "
                    "only catalog tables are allowed, named without a prefix (e.g. FROM h2o)")
            if not isinstance(node.this, exp.Identifier):
                function = node.this
                name = function.name if isinstance(function, exp.Anonymous) else _shorten(function)
                raise UnsupportedError(f"table function {str(name)[:80]}() is not allowed in FROM; only catalog "
                                       "tables are allowed there")
            if any(ch in node.name for ch in "/:\\.") or not node.name.strip():
                raise UnsupportedError(f"{node.name[:80]!r} looks like a path; only catalog tables are allowed "
                                       "in FROM")


def _check_function(node: exp.Func) -> None:
    if isinstance(node.parent, exp.Dot) and node.arg_key == "expression":
        raise UnsupportedError(f"function name {_shorten(node.parent)} is qualified; call Spark built-in "
                               "functions by their bare name (e.g. abs(x), not system.builtin.abs(x))")
    for name in _spark_names(node):
        if name.lower() not in ALLOWED and name.lower() not in SYNTAX:
            why = (" (it reaches outside the query's data)" if name.lower() in REFUSED else "")
            raise UnsupportedError(f"function {name[:80]}() is not in the allowed list of Spark built-in "
                                   f"functions{why}; queries may call only functions that read nothing but "
                                   "their arguments (see iox_planner/planner/functions.py)")


def _spark_names(node: exp.Func) -> list[str]:
    """The function names Spark resolves for `node`: the name as written for a call sqlglot does not know, and
    for one it does, every name in the SQL it generates for it (a typed class may print as another function or
    as several), found by printing the node with its arguments stubbed out (cheap, and linear in the query)."""
    if isinstance(node, exp.Anonymous):
        return [node.name]
    stub = type(node)()
    for key, value in node.args.items():
        if isinstance(value, list):
            stub.set(key, [_stub(v) for v in value])
        else:
            stub.set(key, _stub(value))
    cached = _NAMES.get(stub)
    if cached is not None:
        return cached
    try:
        text = stub.sql(dialect=SPARK)
    except Exception:  # noqa: BLE001 - a stub some generator cannot print: print the node itself
        text = node.sql(dialect=SPARK)
    tokens = SPARK.tokenize(text)
    names = []
    for i, token in enumerate(tokens):
        word = token.text
        if not word or not (word[0].isalpha() or word[0] == "_") or token.token_type is TokenType.STRING:
            continue
        follows_paren = i + 1 < len(tokens) and tokens[i + 1].token_type is TokenType.L_PAREN
        if i == 0 and word != _STUB or follows_paren:
            names.append(word)
    if len(_NAMES) < 4_096:
        _NAMES[stub] = names
    return names


# Stubs print the same whenever they are equal (sqlglot compares trees by structure): the names of each stub
# shape, printed once per process. Bounded, since a stub keeps the small constants of its node.
_NAMES: dict[exp.Expr, list[str]] = {}
_STUB = "__iox_arg"


def _stub(value: object) -> object:
    """An argument as the stub keeps it: small constants that decide how a function prints, else a column."""
    if isinstance(value, (exp.Literal, exp.Var, exp.DataType, exp.Boolean, exp.Null, exp.Star, exp.Identifier)):
        return value.copy()
    if isinstance(value, exp.Array):  # MAP(keys, values) prints differently unless its arguments are arrays
        return exp.Array(expressions=[_stub(v) for v in value.expressions])
    if isinstance(value, exp.Expr):
        return exp.column(_STUB)
    return value


def _shorten(node: exp.Expr) -> str:
    text = node.sql(dialect=SPARK)
    return repr(text if len(text) <= 80 else text[:80] + "...")


def is_internal_name(name: str) -> bool:
    """Whether `name` is, or could be mistaken for, a column or view iox-batch itself adds (any case: Spark's
    case sensitivity is a setting, so a name that differs only in case is refused too)."""
    lowered = name.lower()
    return lowered in INTERNAL_NAMES or lowered.startswith(INTERNAL_PREFIX)


def _reject_internal_names(statement: exp.Query) -> None:
    """No identifier of the query (column, alias, table, CTE, lambda variable) may name an internal column or
    view: the views Spark reads carry `__time_ns`, and the output drops the helpers the planner adds, so a user
    name among them would read hidden data or vanish from the result."""
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


def _check_params(statement: exp.Query, params: Mapping[str, object]) -> dict[str, ParamValue]:
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
    for name in sorted(names):
        value = params[name]
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise BadInputError(f"parameter {name} has a value of type {type(value).__name__}; parameters are "
                                "strings, numbers, booleans or null")
        if isinstance(value, str):
            check_text(value, f"the value of parameter {name}")
            if len(value.encode("utf-8")) > SqlLimits.from_env().max_bytes:
                raise BadInputError(f"the value of parameter {name} is longer than IOX_MAX_SQL_BYTES allows; "
                                    "shorten it or raise the limit")
        bound[name] = value
    return bound


def _tag_table_references(statement: exp.Query, tables: Mapping[str, TableSchema]) -> list[exp.Table]:
    """Mark every reference to a catalog table (not to a CTE) with its index; unknown tables are an error."""
    probe = statement.copy()
    for i, node in enumerate(probe.find_all(exp.Table)):
        node.meta["iox_probe"] = i
    try:
        scopes = traverse_scope(probe)
    except sqlglot.errors.SqlglotError as err:
        raise BadQueryError(f"the query's structure cannot be analyzed: {err}") from err
    catalog_refs: set[int] = set()
    for scope in scopes:
        for source in scope.sources.values():
            if isinstance(source, exp.Table):
                if source.name not in tables:
                    known = ", ".join(sorted(tables)) or "none"
                    raise BadQueryError(f"unknown table {source.name!r}; known tables: {known} "
                                        "(names are case-sensitive)")
                catalog_refs.add(int(source.meta["iox_probe"]))
    refs: list[exp.Table] = []
    for i, node in enumerate(statement.find_all(exp.Table)):
        if i in catalog_refs:
            node.meta["iox_ref"] = len(refs)
            refs.append(node)
    return refs


def _tag_nodes(statement: exp.Query) -> _Shape:
    """Give every SELECT, subquery and table an id (it survives `qualify` and `copy`, so the analysis of the
    qualified query can edit the query as written), and note what `qualify` hides: stars and column lists."""
    shape = _Shape()
    for k, tagged in enumerate(statement.find_all(exp.Select, exp.Subquery, exp.Table)):
        tagged.meta[_NODE] = k
    for select in statement.find_all(exp.Select):
        k = int(select.meta[_NODE])
        holder = select.parent
        alias = holder.args.get("alias") if isinstance(holder, (exp.Subquery, exp.CTE)) else None
        if isinstance(alias, exp.TableAlias) and alias.columns:
            shape.column_lists.add(k)
        for node in _own_nodes(select):
            if isinstance(node, exp.Star):
                owner = node.parent
                if owner is select:
                    shape.stars.setdefault(k, set()).add(None)
                elif isinstance(owner, exp.Column) and owner.parent is select:
                    shape.stars.setdefault(k, set()).add(owner.table)
                elif not isinstance(owner, exp.Count):
                    shape.odd_stars.add(k)
            elif isinstance(node, exp.Join) and node.args.get("method"):
                shape.natural_joins.add(k)
    return shape


def _own_nodes(select: exp.Expr) -> Iterator[exp.Expr]:
    """The nodes of one SELECT, without those of the queries nested in it (but with a subquery's own PIVOT)."""
    def nested(node: exp.Expr) -> bool:
        return node is not select and isinstance(node, (exp.Select, exp.SetOperation))

    for node in select.walk(prune=nested):
        if not nested(node):
            yield node


def _qualify(statement: exp.Query, tables: Mapping[str, TableSchema]) -> exp.Query:
    mapping: dict[str, object] = {name: {c: SPARK_SQL_TYPES[schema.columns.get(c, ColumnType.TIME)] for c in schema.star_columns}
               for name, schema in tables.items()}
    schema = MappingSchema(mapping, dialect=SPARK, normalize=False)
    try:
        return qualify(statement.copy(), dialect=SPARK, schema=schema, quote_identifiers=False, identify=False)
    except sqlglot.errors.OptimizeError as err:
        text = str(err)
        match = re.search(r"Column '([^']*)' could not be resolved", text)
        used = sorted({t.name for t in statement.find_all(exp.Table) if t.name in tables})
        known = "; ".join(f"{t}: {', '.join(tables[t].star_columns)}" for t in used)
        if match:
            raise BadQueryError(f"unknown column {match.group(1)!r} ({text}); known columns: {known} "
                                "(names are case-sensitive)") from err
        raise BadQueryError(f"the query's columns cannot be resolved: {text}; known columns: {known}") from err


# ----------------------------------------------------------------------------------------------------------------
# What each reference needs


class _Analysis:
    def __init__(self, qualified: exp.Query, tables: Mapping[str, TableSchema], refs: Sequence[exp.Table],
                 params: Mapping[str, ParamValue], now_ns: int) -> None:
        self.qualified = qualified
        self.tables = tables
        self.params = params
        self.now_us = now_ns // 1_000
        self.count = len(refs)
        self.refs = list(refs)
        self.table_of = [r.name for r in refs]
        self.alias_of = [r.alias_or_name for r in refs]
        self.q_alias: dict[int, str] = {}
        self.columns: dict[int, set[str]] = {i: set() for i in range(self.count)}
        self.conjuncts: dict[int, list[exp.Expr]] = {i: [] for i in range(self.count)}
        self.scopes = traverse_scope(qualified)
        self.root: Scope | None = build_scope(qualified)
        for scope in self.scopes:
            for alias, source in scope.sources.items():
                if isinstance(source, exp.Table) and "iox_ref" in source.meta:
                    self.q_alias[int(source.meta["iox_ref"])] = alias
        self._collect_columns()
        for scope in self.scopes:
            self._collect_conjuncts(scope)

    def _refs_with_alias(self, alias: str) -> list[int]:
        return [i for i, a in self.q_alias.items() if a == alias]

    def _collect_columns(self) -> None:
        # Each column counts for the reference its scope (or an enclosing one, for a correlated column) resolves
        # its qualifier to.
        resolved: set[int] = set()
        for scope in self.scopes:
            for col in scope.columns:
                owner: Scope | None = scope
                while owner is not None and col.table not in owner.sources:
                    owner = owner.parent
                if not col.table or owner is None:
                    continue
                resolved.add(id(col))
                source = owner.sources[col.table]
                if isinstance(source, exp.Table) and "iox_ref" in source.meta:
                    i = int(source.meta["iox_ref"])
                    if col.name in self.tables[self.table_of[i]].columns:
                        self.columns[i].add(col.name)
        # Safety net for a column no scope accounts for: it counts for every reference of its qualifier (at
        # worst a column read for nothing).
        for col in self.qualified.find_all(exp.Column):
            if not col.table or id(col) in resolved:
                continue
            for i in self._refs_with_alias(col.table):
                if col.name in self.tables[self.table_of[i]].columns:
                    self.columns[i].add(col.name)
        # A star qualify could not expand (anything but count(*)) reads every column of every reference.
        for star in self.qualified.find_all(exp.Star):
            if not isinstance(star.parent, exp.Count):
                for i in range(self.count):
                    self.columns[i].update(self.tables[self.table_of[i]].columns)
        for i, ref in enumerate(self.refs):
            if ref.args.get("pivots"):  # a PIVOT groups by every column it does not pivot: read them all
                self.columns[i].update(self.tables[self.table_of[i]].columns)
        for i in range(self.count):
            if i not in self.q_alias:  # not found in any scope: read everything, push nothing
                self.columns[i].update(self.tables[self.table_of[i]].columns)

    def _collect_conjuncts(self, scope: Scope) -> None:
        select = scope.expression
        if not isinstance(select, exp.Select) or not select.args.get("where"):
            return
        from_ = select.args.get("from_") or select.args.get("from")
        if not isinstance(from_, exp.From) or select.args.get("pivots") or from_.this.args.get("pivots"):
            return
        joins = select.args.get("joins") or []
        sources = [from_.this] + [j.this for j in joins]
        unsafe: set[int] = set()
        for pos, join in enumerate(joins, start=1):
            side = (join.side or "").upper()
            kind = (join.kind or "").upper()
            if kind not in ("", "INNER", "CROSS", "OUTER") or join.args.get("method"):
                unsafe.update(range(len(sources)))  # semi, anti, natural, ...: push nothing here
            elif side == "LEFT":
                unsafe.add(pos)
            elif side == "RIGHT":
                unsafe.update(range(pos))
            elif side == "FULL":
                unsafe.update(range(pos + 1))
            elif side:
                unsafe.update(range(len(sources)))
        for conjunct in split_conjuncts(select.args["where"].this):
            aliases = {c.table for c in conjunct.find_all(exp.Column)}
            if len(aliases) != 1:
                continue
            source = scope.sources.get(aliases.pop())
            if not isinstance(source, exp.Table) or "iox_ref" not in source.meta:
                continue
            position = next((p for p, s in enumerate(sources) if s is source), None)
            if position is None or position in unsafe:
                continue
            self.conjuncts[int(source.meta["iox_ref"])].append(conjunct)

    def scan(self, i: int) -> ScanRequest:
        schema = self.tables[self.table_of[i]]
        needed = tuple(c for c in schema.star_columns if c in self.columns[i]) or (TIME,)
        pushed: list[Conjunct] = []
        time_min: int | None = None
        time_max: int | None = None
        tag_filters: list[TagFilter] = []
        for conjunct in self.conjuncts[i]:
            translated = _Pushdown(schema, self.params, self.now_us).translate(conjunct)
            if translated is None:
                continue
            for part in split_conjuncts(translated):
                pushed.append(Conjunct.of(part))
                time_min, time_max = combine([(time_min, time_max), expression_time_bounds(part)])
                tag = _tag_filter(part, schema)
                if tag is not None:
                    tag_filters.append(tag)
        unique = tuple(dict((c.sql, c) for c in pushed).values())
        return ScanRequest(f"{VIEW_PREFIX}{i}", self.table_of[i], self.alias_of[i], needed, unique,
                           time_min, time_max, tuple(tag_filters))

    def output_columns(self) -> tuple[str, ...]:
        names = list(self.qualified.named_selects)
        seen: set[str] = set()
        for name in names:
            if is_internal_name(name):
                raise BadQueryError(f"the result column {name!r} would clash with an internal column of iox-batch "
                                    f"(names starting with {INTERNAL_PREFIX!r} and {', '.join(sorted(INTERNAL_NAMES))} "
                                    "are reserved); give it another alias")
            if name in seen:
                raise BadQueryError(f"the result has two columns named {name!r}; give one of them an alias "
                                    f"(... AS {name}_2)")
            seen.add(name)
        return tuple(names)


# ----------------------------------------------------------------------------------------------------------------
# Exact nanoseconds for time columns passed through


@dataclass
class _Shape:
    """Facts about the query as written, by node id, that `qualify` does not keep."""

    column_lists: set[int] = field(default_factory=set)
    """SELECTs whose output columns a column list fixes (`(SELECT ...) AS s(a, b)`, `WITH x(a, b) AS ...`)."""
    stars: dict[int, set[str | None]] = field(default_factory=dict)
    """SELECT -> the qualifiers of its `*` items (None for a bare `*`)."""
    odd_stars: set[int] = field(default_factory=set)
    """SELECTs with a star somewhere else than as an item or in `count(*)` (`struct(*)`, ...)."""
    natural_joins: set[int] = field(default_factory=set)
    """SELECTs with a NATURAL (or other method) join, which joins on every common column."""


@dataclass
class _NsEdits:
    """What the query as written gets so that time columns keep their nanoseconds."""

    time_columns: list[str] = field(default_factory=list)
    outputs: list[tuple[str, exp.Expr]] = field(default_factory=list)
    """(result column, its nanoseconds over the top-level SELECT's sources): selected as `__iox_ns_<name>`."""
    hidden: dict[int, list[tuple[str, exp.Expr]]] = field(default_factory=dict)
    """SELECT id -> (hidden item name, nanoseconds over that SELECT's sources) to append to its items."""
    order: dict[int, dict[int, exp.Expr]] = field(default_factory=dict)
    """SELECT id -> ORDER BY position -> nanoseconds to sort by right after that item, in the same direction."""
    aliases: dict[int, str] = field(default_factory=dict)
    """Subquery id -> the alias it needs (it had none) so the outer query can name its hidden item."""
    names: dict[tuple[int, str], str] = field(default_factory=dict)
    """(SELECT id, item name) -> hidden item already passing that item's nanoseconds through."""


class _Nanoseconds:
    """Finds, on the qualified query, where the exact nanoseconds of each time column come from."""

    def __init__(self, front: _Analysis, shape: _Shape) -> None:
        self.front = front
        self.shape = shape
        self.out = _NsEdits()
        self.scopes: list[Scope] = list(front.root.traverse()) if front.root is not None else []
        counts: dict[int, int] = {}
        for node in front.qualified.find_all(exp.Select, exp.Subquery):
            if _NODE in node.meta:
                counts[int(node.meta[_NODE])] = counts.get(int(node.meta[_NODE]), 0) + 1
        self.unique = {k for k, n in counts.items() if n == 1}
        self.extendable_memo: dict[int, bool] = {}

    def edits(self) -> _NsEdits:
        root = self.front.root
        if root is None or not isinstance(root.expression, exp.Select):
            return self.out
        for projection in root.expression.selects:
            inner = projection.unalias()
            if isinstance(inner, exp.Column):
                ns = self._ns(inner, root)
                if ns is not None:
                    self.out.time_columns.append(projection.alias_or_name)
                    self.out.outputs.append((projection.alias_or_name, ns))
        for scope in self.scopes:
            self._order_ties(scope)
        return self.out

    def _id(self, node: exp.Expr | None) -> int | None:
        """The id of a node of the query as written, if the qualified query has it exactly once."""
        if node is None or _NODE not in node.meta:
            return None
        k = int(node.meta[_NODE])
        return k if k in self.unique else None

    def _ns(self, col: exp.Column, scope: Scope) -> exp.Expr | None:
        """The exact nanoseconds of `col` (a column of `scope`'s SELECT) if it is a table's `time` passed through
        unchanged, as an expression over that SELECT's sources as written; None if it is not or cannot be."""
        select = scope.expression
        if not _passes_rows(select) or not col.table:
            return None
        source = scope.sources.get(col.table)
        if isinstance(source, exp.Table):
            if "iox_ref" not in source.meta or col.name != TIME:
                return None
            i = int(source.meta["iox_ref"])
            if self.front.tables[self.front.table_of[i]].columns.get(TIME, ColumnType.TIME) is not ColumnType.TIME:
                return None
            return exp.Column(this=identifier(TIME_NS), table=identifier(self.front.alias_of[i]))
        if not isinstance(source, Scope) or not isinstance(source.expression, exp.Select):
            return None
        inner_select = source.expression
        projection = next((p for p in inner_select.selects if p.alias_or_name == col.name), None)
        if projection is None or not isinstance(projection.unalias(), exp.Column):
            return None
        k = self._id(inner_select)
        if k is None or not self._extendable(source):
            return None
        hidden = self.out.names.get((k, col.name))
        if hidden is None:
            passed = projection.unalias()
            inner = self._ns(passed, source) if isinstance(passed, exp.Column) else None
            if inner is None:
                return None
            hidden = f"{HIDDEN_PREFIX}{len(self.out.names)}"
            self.out.names[(k, col.name)] = hidden
            self.out.hidden.setdefault(k, []).append((hidden, inner))
        holder = inner_select.parent
        if isinstance(holder, exp.Subquery):
            subquery = self._id(holder)
            if subquery is None:
                return None
            self.out.aliases[subquery] = col.table
        return exp.Column(this=identifier(hidden), table=identifier(col.table))

    def _extendable(self, scope: Scope) -> bool:
        """Whether the SELECT of `scope` (a subquery or CTE) can get hidden items without any reader of it seeing
        a difference: no column list names its columns, and every star over it is in a SELECT that passes rows
        through and is itself extendable (or is the top level, whose `__` columns the output drops)."""
        key = id(scope)
        if key not in self.extendable_memo:
            self.extendable_memo[key] = False  # no cycles, but never loop
            self.extendable_memo[key] = self._check_extendable(scope)
        return self.extendable_memo[key]

    def _check_extendable(self, scope: Scope) -> bool:
        select = scope.expression
        k = self._id(select)
        if not isinstance(select, exp.Select) or k is None or k in self.shape.column_lists:
            return False
        holder = select.parent
        if not isinstance(holder, exp.CTE) and not (
                isinstance(holder, exp.Subquery) and isinstance(holder.parent, (exp.From, exp.Join))):
            return False
        for reader in self.scopes:
            for alias, (_, source) in reader.selected_sources.items():
                if source is not scope:
                    continue
                r = self._id(reader.expression)
                if r is None or r in self.shape.odd_stars or r in self.shape.natural_joins:
                    return False
                if any(isinstance(n, exp.Pivot) for n in _own_nodes(reader.expression)):
                    return False  # a PIVOT groups by every column it does not pivot, hidden ones too
                stars = self.shape.stars.get(r, set())
                if None in stars or alias in stars:
                    if not _passes_rows(reader.expression):
                        return False
                    if reader is not self.front.root and not self._extendable(reader):
                        return False
        return True

    def _order_ties(self, scope: Scope) -> None:
        """An ORDER BY item that is a time passed through gets its nanoseconds as the next sort key."""
        select = scope.expression
        if not isinstance(select, exp.Select):
            return
        order = select.args.get("order")
        k = self._id(select)
        if not isinstance(order, exp.Order) or k is None or not _passes_rows(select):
            return
        items = {p.alias_or_name: p.unalias() for p in select.selects}
        for position, ordered in enumerate(order.expressions):
            target: exp.Expr | None = ordered.this
            if isinstance(target, exp.Literal) and not target.is_string and str(target.this).isdigit():
                index = int(str(target.this)) - 1
                target = select.selects[index].unalias() if 0 <= index < len(select.selects) else None
            elif isinstance(target, exp.Column) and not target.table:
                target = items.get(target.name)
            if isinstance(target, exp.Column) and target.table:
                ns = self._ns(target, scope)
                if ns is not None:
                    self.out.order.setdefault(k, {})[position] = ns


def _passes_rows(select: exp.Expr) -> bool:
    """A SELECT whose items see each input row once, as is: no grouping, DISTINCT, aggregate, window or pivot
    (so adding an item changes nothing else)."""
    if not isinstance(select, exp.Select):
        return False
    if any(select.args.get(k) for k in ("group", "distinct", "having", "qualify")):
        return False
    return not any(isinstance(n, (exp.AggFunc, exp.Window, exp.Pivot)) for n in _own_nodes(select))


class _Pushdown:
    """Turns one WHERE conjunct into what a scan evaluates, or None when it cannot be pushed safely."""

    def __init__(self, schema: TableSchema, params: Mapping[str, ParamValue], now_us: int) -> None:
        self.schema = schema
        self.params = params
        self.now_us = now_us

    def translate(self, conjunct: exp.Expr) -> exp.Expr | None:
        if not any(True for _ in conjunct.find_all(exp.Column)):
            return None
        holder = exp.Paren(this=conjunct.copy())  # so the conjunct itself can be replaced
        for col in list(holder.find_all(exp.Column)):
            if col.name == TIME and not self._rewrite_time(col):
                return None
        for ph in list(holder.find_all(exp.Placeholder)):
            ph.replace(_literal(self.params[str(ph.this)]))
        for col in list(holder.find_all(exp.Column)):
            col.replace(column(col.name))
        tree: exp.Expr = holder.this
        if not all(isinstance(node, _PUSHABLE) for node in tree.walk()):
            return None
        for node in tree.find_all(exp.In):
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                return None
        return tree

    def _rewrite_time(self, col: exp.Column) -> bool:
        """Replace the comparison around a `time` column by its nanosecond form; False if it has none."""
        parent = col.parent
        if isinstance(parent, exp.Is):
            return True
        if isinstance(parent, exp.Between) and parent.this is col:
            low, high = self._timestamp_us(parent.args["low"]), self._timestamp_us(parent.args["high"])
            if low is None or high is None:
                return False
            parent.replace(_between(low * 1000, (high + 1) * 1000 - 1))
            return True
        ops: dict[type, str] = {exp.EQ: "=", exp.NullSafeEQ: "=", exp.NEQ: "<>", exp.GT: ">",
                                                exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
        if type(parent) not in ops:
            return False
        assert isinstance(parent, exp.Binary)
        op = ops[type(parent)]
        if parent.this is col:
            other = parent.expression
        else:
            other = parent.this
            op = {">": "<", ">=": "<=", "<": ">", "<=": ">="}.get(op, op)
        if isinstance(other, exp.Column):
            return False
        us = self._timestamp_us(other)
        if us is None:
            return False
        # Spark keeps a row when floor(time / 1000) <op> us; say the same over nanoseconds.
        lo, hi = us * 1000, us * 1000 + 999
        replacement: exp.Expr
        if op == ">=":
            replacement = exp.GTE(this=column(TIME), expression=exp.Literal.number(lo))
        elif op == ">":
            replacement = exp.GTE(this=column(TIME), expression=exp.Literal.number(hi + 1))
        elif op == "<":
            replacement = exp.LT(this=column(TIME), expression=exp.Literal.number(lo))
        elif op == "<=":
            replacement = exp.LTE(this=column(TIME), expression=exp.Literal.number(hi))
        elif op == "=":
            replacement = _between(lo, hi)
        else:
            replacement = exp.Not(this=_between(lo, hi))
        parent.replace(replacement)
        return True

    def _timestamp_us(self, node: exp.Expr) -> int | None:
        """The microseconds since the epoch of a constant timestamp expression Spark would compute, else None."""
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal) and node.this.is_string:
            target = node.to.this
            if target in _TIMESTAMP_TYPES:
                return _parse_timestamp_us(node.this.this)
            if target is exp.DataType.Type.DATE:
                return _parse_date_us(node.this.this)
            return None
        if isinstance(node, exp.Literal) and node.is_string:
            return _parse_timestamp_us(node.this)
        if isinstance(node, exp.Placeholder):
            value = self.params.get(str(node.this))
            return _parse_timestamp_us(value) if isinstance(value, str) else None
        if _is_now(node):
            return self.now_us
        if isinstance(node, exp.CurrentDate) and not node.args.get("this"):
            return self.now_us - self.now_us % 86_400_000_000
        if isinstance(node, (exp.Add, exp.Sub)):
            base, step = node.this, node.expression
            if isinstance(node, exp.Add) and isinstance(base, exp.Interval):
                base, step = step, base
            start = self._timestamp_us(base)
            delta = _interval_us(step)
            if start is None or delta is None:
                return None
            return start + delta if isinstance(node, exp.Add) else start - delta
        return None


def _is_now(node: exp.Expr) -> bool:
    """`now()`, `current_timestamp()` and their kin: the planning time."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower().replace("_", "") in _NOW_FUNCTIONS and not node.expressions
    return isinstance(node, _NOW_CLASSES)


def _between(lo: int, hi: int) -> exp.Between:
    return exp.Between(this=column(TIME), low=exp.Literal.number(lo), high=exp.Literal.number(hi))


def _literal(value: ParamValue) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        return exp.Cast(this=exp.Literal.string(repr(value)), to=exp.DataType.build("DOUBLE"))
    return exp.Literal.string(value)


def _parse_timestamp_us(text: str) -> int | None:
    match = _TS_TEXT.fullmatch(text.strip())
    if not match:
        return None
    y, mo, d, h, mi, s, frac, zone = match.groups()
    try:
        stamp = dt.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0),
                            tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    offset = 0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    seconds = (stamp - _EPOCH) // dt.timedelta(seconds=1) - offset
    return seconds * 1_000_000 + int((frac or "").ljust(6, "0") or 0)


def _parse_date_us(text: str) -> int | None:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text.strip()):
        return None
    return _parse_timestamp_us(text)


def _interval_us(node: exp.Expr) -> int | None:
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    unit = node.args.get("unit")
    name = unit.name.upper().rstrip("S") if unit is not None else ""
    if name not in _INTERVAL_US or not re.fullmatch(r"-?\d+", str(node.this.this).strip()):
        return None
    return int(str(node.this.this).strip()) * _INTERVAL_US[name]


def _tag_filter(part: exp.Expr, schema: TableSchema) -> TagFilter | None:
    """The tag min/max pruning a pushed conjunct allows, if it is `tag <op> 'text'` or `tag IN ('a', ...)`."""
    def tag_name(node: exp.Expr) -> str | None:
        if isinstance(node, exp.Column) and schema.columns.get(node.name) is ColumnType.TAG:
            return node.name
        return None

    def text(node: exp.Expr) -> str | None:
        return str(node.this) if isinstance(node, exp.Literal) and node.is_string else None

    if isinstance(part, exp.In) and tag_name(part.this) and not part.args.get("query"):
        values = [text(v) for v in part.expressions]
        if values and all(v is not None for v in values):
            return TagFilter(str(tag_name(part.this)), "in", tuple(v for v in values if v is not None))
        return None
    ops: dict[type, tuple[TagOp, TagOp]] = {
        exp.EQ: ("eq", "eq"), exp.GT: ("gt", "lt"), exp.GTE: ("gte", "lte"), exp.LT: ("lt", "gt"),
        exp.LTE: ("lte", "gte")}
    if type(part) in ops:
        assert isinstance(part, exp.Binary)
        forward, mirrored = ops[type(part)]
        name, value = tag_name(part.this), text(part.expression)
        if name and value is not None:
            return TagFilter(name, forward, (value,))
        name, value = tag_name(part.expression), text(part.this)
        if name and value is not None:
            return TagFilter(name, mirrored, (value,))
    return None


# ----------------------------------------------------------------------------------------------------------------
# The query Spark runs


def _rewrite(statement: exp.Query, refs: Sequence[exp.Table], scans: Sequence[ScanRequest], now_ns: int,
             nanos: _NsEdits | None = None, front: _Analysis | None = None) -> str:
    """Each table reference becomes its view (keeping its alias), every `*` becomes the columns it means
    (`front`), `now()` becomes the planning time, and time columns passed through get their exact nanoseconds
    (`nanos`)."""
    tree = statement.copy()
    if front is not None:
        _expand_stars(tree, front)
    if nanos is not None:
        _add_nanoseconds(tree, nanos)
    by_index = {int(t.meta["iox_ref"]): t for t in tree.find_all(exp.Table) if "iox_ref" in t.meta}
    for i, scan in enumerate(scans):
        original = by_index[i]
        view: exp.Expr = exp.Table(this=identifier(scan.view), alias=exp.TableAlias(this=identifier(scan.alias)))
        if original.args.get("pivots"):
            # A PIVOT groups by every input column it does not pivot: over the bare view that would include
            # `__time_ns`, so it pivots a subquery holding the table's columns only.
            inner = exp.select(*[column(c) for c in scan.columns]).from_(
                exp.Table(this=identifier(scan.view), alias=exp.TableAlias(this=identifier(scan.alias))))
            view = exp.Subquery(this=inner, alias=exp.TableAlias(this=identifier(scan.alias)))
        for key in ("joins", "laterals", "pivots", "hints", "sample", "version", "when"):
            if original.args.get(key):
                view.set(key, original.args[key])
        original.replace(view)
    now_us = now_ns // 1_000
    for node in list(tree.walk()):
        if _is_now(node):
            node.replace(exp.Anonymous(this="TIMESTAMP_MICROS", expressions=[exp.Literal.number(now_us)]))
        elif isinstance(node, exp.CurrentDate) and not node.args.get("this"):
            node.replace(exp.Anonymous(this="DATE_FROM_UNIX_DATE",
                                       expressions=[exp.Literal.number(now_us // 86_400_000_000)]))
    return to_sql(tree)


def _add_nanoseconds(tree: exp.Query, nanos: _NsEdits) -> None:
    nodes: dict[int, exp.Expr] = {}
    for node in tree.find_all(exp.Select, exp.Subquery):
        if _NODE in node.meta:
            nodes.setdefault(int(node.meta[_NODE]), node)
    for k, alias in nanos.aliases.items():
        subquery = nodes[k]
        if not subquery.alias:
            subquery.set("alias", exp.TableAlias(this=identifier(alias)))
    for k, items in nanos.hidden.items():
        for name, ns in items:
            nodes[k].append("expressions", exp.alias_(ns.copy(), identifier(name)))
    for k, ties in nanos.order.items():
        order = nodes[k].args["order"]
        expressions: list[exp.Expr] = []
        for position, ordered in enumerate(order.expressions):
            expressions.append(ordered)
            if position in ties:
                expressions.append(exp.Ordered(this=ties[position].copy(), desc=ordered.args.get("desc"),
                                               nulls_first=ordered.args.get("nulls_first")))
        order.set("expressions", expressions)
    for name, ns in nanos.outputs:
        tree.append("expressions", exp.alias_(ns.copy(), identifier(NS_PREFIX + name)))


# ----------------------------------------------------------------------------------------------------------------
# `*` as the columns it means


def _expand_stars(tree: exp.Query, front: _Analysis) -> None:
    """Replace every `*` and `t.*` item, and every NATURAL join, of the query as written by the explicit columns
    the qualified query resolved them to. The views Spark reads carry `__time_ns` next to the table's columns,
    so a `*` left to Spark would add it (and a NATURAL join would join on it): a UNION with an explicit side, a
    column list or a set operation would then see the wrong number of columns. `count(*)` stays as it is; a
    star anywhere else (`struct(*)`, `hash(*)`) is refused."""
    qualified: dict[int, exp.Select] = {}
    for select_node in front.qualified.find_all(exp.Select):
        if _NODE in select_node.meta:
            qualified.setdefault(int(select_node.meta[_NODE]), select_node)
    scope_of = {id(scope.expression): scope for scope in front.scopes}
    written_subqueries = {int(n.meta[_NODE]): n for n in tree.find_all(exp.Subquery) if _NODE in n.meta}
    for node in front.qualified.find_all(exp.Subquery):
        # A derived table qualify named (`_0`) gets that name in the query Spark runs, so expanded columns
        # qualified with it resolve.
        if _NODE in node.meta and node.alias and int(node.meta[_NODE]) in written_subqueries:
            written = written_subqueries[int(node.meta[_NODE])]
            if not written.alias and isinstance(written.parent, (exp.From, exp.Join)):
                written.set("alias", exp.TableAlias(this=identifier(node.alias)))
    for select in list(tree.find_all(exp.Select)):
        k = select.meta.get(_NODE)
        items = list(select.expressions)
        stars = [i for i, item in enumerate(items) if _is_star_item(item)]
        natural = [j for j, join in enumerate(select.args.get("joins") or []) if join.args.get("method")]
        if not stars and not natural:
            continue
        done = qualified.get(int(k)) if k is not None else None
        scope = scope_of.get(id(done)) if done is not None else None
        if done is None or scope is None:
            raise UnsupportedError("a `*` or NATURAL JOIN in this query cannot be resolved to the table columns it "
                                   "means; list the columns explicitly")
        if stars:
            select.set("expressions", _expanded_items(items, stars, list(done.expressions), scope, front))
        for j in natural:
            _natural_to_using(select.args["joins"][j], (done.args.get("joins") or [None] * (j + 1))[j])
    for select in list(tree.find_all(exp.Select)):
        k = select.meta.get(_NODE)
        found = qualified.get(int(k)) if k is not None else None
        scope = scope_of.get(id(found)) if found is not None else None
        for arg in list(_own_nodes(select)):
            starry = isinstance(arg, exp.Star) or (isinstance(arg, exp.Column) and isinstance(arg.this, exp.Star))
            if starry and isinstance(arg.parent, exp.Func) and not isinstance(arg.parent, exp.Count) \
                    and scope is not None:
                _expand_argument_star(arg, arg.parent, select, scope, front)
    for star in tree.find_all(exp.Star):
        owner = star.parent
        if isinstance(owner, exp.Count) and owner.this is star:
            continue
        where = f"{owner.sql_name()}(*)" if isinstance(owner, exp.Func) else "this position"
        raise UnsupportedError(f"`*` in {where} is not supported: it would have to mean the table's columns "
                               "inside an expression; list the columns (tags, fields, time) explicitly")


def _expand_argument_star(star: exp.Expr, function: exp.Func, select: exp.Select, scope: Scope,
                          front: _Analysis) -> None:
    """`struct(*)`, `hash(t.*)`: the star as the columns of the sources it covers, in FROM order. Joins that merge
    columns (USING, NATURAL) and lateral views change that list in ways Spark decides; there the star stays and is
    refused."""
    joins = select.args.get("joins") or []
    if select.args.get("laterals") or any(j.args.get("using") or j.args.get("method") for j in joins):
        return
    from_ = select.args.get("from_") or select.args.get("from")
    if not isinstance(from_, exp.From):
        return
    aliases = [from_.this.alias_or_name] + [j.this.alias_or_name for j in joins]
    if isinstance(star, exp.Column):
        aliases = [a for a in aliases if a == star.table]
    columns: list[exp.Expr] = []
    for alias in aliases:
        source = scope.sources.get(alias)
        if isinstance(source, exp.Table) and source.name in front.tables:
            names = front.tables[source.name].star_columns
        elif isinstance(source, Scope) and isinstance(source.expression, exp.Query):
            names = list(source.expression.named_selects)
        else:
            return
        columns.extend(exp.Column(this=identifier(n), table=identifier(alias)) for n in names)
    if not columns:
        return
    args = function.expressions if star in function.expressions else None
    if args is not None:
        position = args.index(star)
        function.set("expressions", args[:position] + columns + args[position + 1:])
    elif function.this is star and not function.expressions and len(columns) == 1:
        function.set("this", columns[0])
    elif function.this is star and isinstance(function, exp.Struct):
        function.set("this", None)
        function.set("expressions", columns)


def _is_star_item(item: exp.Expr) -> bool:
    return isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))


def _expanded_items(items: list[exp.Expr], stars: list[int], done: list[exp.Expr], scope: Scope,
                    front: _Analysis) -> list[exp.Expr]:
    """The SELECT items with each star replaced by its share of the qualified items (`done`, in which qualify
    expanded every star in place and left every other item one for one)."""
    total = len(done) - (len(items) - len(stars))
    counts: dict[int, int] = {}
    for i in stars:
        item = items[i]
        if isinstance(item, exp.Column) and item.table:
            counts[i] = _source_width(item, scope, front)
    bare = [i for i in stars if i not in counts]
    rest = total - sum(counts.values())
    if rest < 0 or (bare and rest % len(bare)) or (not bare and rest):
        raise UnsupportedError("the `*` items of this SELECT cannot be matched to the table columns they mean; "
                               "list the columns explicitly")
    for i in bare:
        counts[i] = rest // len(bare)
    pivoted = any(isinstance(node, exp.Pivot) for node in _own_nodes(scope.expression))
    out: list[exp.Expr] = []
    position = 0
    for i, item in enumerate(items):
        if i in counts:
            for expanded in done[position:position + counts[i]]:
                copied = _requote(expanded.copy())
                if pivoted:
                    # qualify names the pivot's output (`_0`); the SQL as written does not, and its columns
                    # are unique, so they go unqualified.
                    for col in copied.find_all(exp.Column):
                        col.set("table", None)
                out.append(copied)
            position += counts[i]
        else:
            out.append(item)
            position += 1
    return out


def _source_width(item: exp.Column, scope: Scope, front: _Analysis) -> int:
    """How many columns `t.*` stands for."""
    source = scope.sources.get(item.table)
    star = item.this
    dropped = len(star.args.get("except") or []) if isinstance(star, exp.Star) else 0
    if isinstance(source, exp.Table) and source.name in front.tables:
        return len(front.tables[source.name].star_columns) - dropped
    if isinstance(source, Scope) and isinstance(source.expression, exp.Query):
        return len(source.expression.named_selects) - dropped
    raise UnsupportedError(f"`{item.table}.*` cannot be resolved to the columns it means; list them explicitly")


def _natural_to_using(join: exp.Join, done: exp.Join | None) -> None:
    """A NATURAL join joins on the columns both sides share, as qualify found them: say so with USING."""
    names: list[str] = []
    condition = done.args.get("on") if done is not None else None
    if condition is not None:
        for part in split_conjuncts(condition):
            if not (isinstance(part, exp.EQ) and isinstance(part.this, exp.Column)
                    and isinstance(part.expression, exp.Column) and part.this.name == part.expression.name):
                raise UnsupportedError("this NATURAL JOIN cannot be resolved to the columns it joins on; write "
                                       "JOIN ... USING (columns)")
            names.append(part.this.name)
    join.set("method", None)
    if names:
        join.set("using", [identifier(n) for n in names])


def _requote(node: exp.Expr) -> exp.Expr:
    """Quote the identifiers of an expanded item the way Spark needs (reserved words, odd characters)."""
    for ident in list(node.find_all(exp.Identifier)):
        if not ident.quoted and identifier(str(ident.this)).quoted:
            ident.set("quoted", True)
    return node
