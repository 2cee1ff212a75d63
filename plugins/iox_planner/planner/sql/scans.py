"""What each table reference needs from its scan: the columns it reads and the WHERE conjuncts that concern it
alone, translated to what a scan evaluates (`time` as int64 nanoseconds) when that keeps exactly the rows Spark
would keep. When unsure, nothing is pushed: correct first (Spark evaluates the whole WHERE again on the views)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope, traverse_scope
from sqlglot.schema import MappingSchema

from iox_planner.errors import BadQueryError
from iox_planner.model import SPARK_SQL_TYPES, TIME, VIEW_PREFIX, ColumnType, TableSchema
from iox_planner.planner.nodes import ParamValue
from iox_planner.planner.predicate import SPARK, Conjunct, column, split_conjuncts
from iox_planner.planner.sql.clocks import CLOCK, BARE_CLOCK_WORDS, clock_value_us
from iox_planner.planner.timebounds import combine, expression_time_bounds

NODE = "iox_node"
"""Meta id of every SELECT, subquery and table of the query as written; it survives `qualify` and `copy`, so what
the analysis finds on the qualified copy can be placed in the text as written."""
REF = "iox_ref"
"""Meta of a table node that references a catalog table: the index of its scan."""

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
# Timestamp text Spark reads the same way we do (a strict subset of what it accepts; zone-less means UTC). ASCII
# digits only, as Spark reads them (`\d` would take any script's digits, which Spark reads as no timestamp).
_TS_TEXT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[ T]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})?)?"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def tag_table_references(statement: exp.Query, tables: Mapping[str, TableSchema]) -> list[exp.Table]:
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
            if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
                if source.name not in tables:
                    known = ", ".join(sorted(tables)) or "none"
                    raise BadQueryError(f"unknown table {source.name!r}; known tables: {known} "
                                        "(names are case-sensitive)")
                catalog_refs.add(int(source.meta["iox_probe"]))
    refs: list[exp.Table] = []
    for i, node in enumerate(statement.find_all(exp.Table)):
        if i in catalog_refs:
            node.meta[REF] = len(refs)
            refs.append(node)
    for k, tagged in enumerate(statement.find_all(exp.Select, exp.Subquery, exp.Table)):
        tagged.meta[NODE] = k
    return refs


def own_nodes(select: exp.Expr) -> list[exp.Expr]:
    """The nodes of one SELECT, without those of the queries nested in it (but with a subquery's own PIVOT)."""
    def nested(node: exp.Expr) -> bool:
        return node is not select and isinstance(node, (exp.Select, exp.SetOperation))

    return [node for node in select.walk(prune=nested) if not nested(node)]


def sql_schema(tables: Mapping[str, TableSchema]) -> MappingSchema:
    """The tables' columns and their Spark SQL types, as sqlglot's analysis reads them."""
    mapping: dict[str, object] = {
        name: {c: SPARK_SQL_TYPES[schema.columns.get(c, ColumnType.TIME)] for c in schema.star_columns}
        for name, schema in tables.items()}
    return MappingSchema(mapping, dialect=SPARK, normalize=False)


def qualify_query(statement: exp.Query, tables: Mapping[str, TableSchema]) -> tuple[exp.Query, bool]:
    """The query with every column qualified by its source and every star expanded (for the analysis only).
    Returns (qualified, lenient): lenient when a column sqlglot cannot resolve is one Spark may still resolve (a
    field of a struct column, `window.start`), in which case every reference reads all its columns."""
    schema = sql_schema(tables)
    copy = _aliased(_clock_words_as_calls(statement.copy(), tables))
    try:
        return qualify(copy, dialect=SPARK, schema=schema, quote_identifiers=False, identify=False), False
    except sqlglot.errors.OptimizeError as err:
        text = str(err)
        if _spark_may_resolve(statement, text):
            lenient = qualify(_aliased(_clock_words_as_calls(statement.copy(), tables)), dialect=SPARK, schema=schema,
                              quote_identifiers=False, identify=False, validate_qualify_columns=False)
            return lenient, True
        match = re.search(r"Column '([^']*)' could not be resolved", text)
        used = sorted({t.name for t in statement.find_all(exp.Table) if t.name in tables})
        known = "; ".join(f"{t}: {', '.join(tables[t].star_columns)}" for t in used)
        if match:
            raise BadQueryError(f"unknown column {match.group(1)!r} ({text}); known columns: {known} "
                                "(names are case-sensitive)") from err
        raise BadQueryError(f"the query's columns cannot be resolved: {text}; known columns: {known}") from err


def _spark_may_resolve(statement: exp.Query, error: str) -> bool:
    """Whether a column sqlglot could not resolve is one Spark may resolve from what sqlglot does not model: a
    field of a struct column (`window.start`: its qualifier names no source), a lateral column alias, or a
    column a generator in FROM or a `window`/`session_window` grouping produces."""
    unknown_source = re.search(r"could not be resolved for table: '([^']*)'", error)
    if unknown_source:
        return unknown_source.group(1) not in _source_names(statement)
    column_name = re.search(r"Column '([^']*)' could not be resolved", error)
    if column_name and column_name.group(1) in {a.alias for a in statement.find_all(exp.Alias)}:
        return True
    for node in statement.walk():
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            return True
        if isinstance(node, exp.Anonymous) and str(node.this).lower() in ("window", "session_window"):
            return True
    return False


def _source_names(statement: exp.Query) -> set[str]:
    """Every name a column could be qualified by: tables, CTEs and their aliases."""
    names: set[str] = set()
    for node in statement.find_all(exp.Table, exp.Subquery, exp.CTE, exp.TableAlias):
        if isinstance(node, exp.TableAlias):
            names.add(node.name)
        else:
            names.add(node.alias_or_name)
    return names


def _aliased(tree: exp.Query) -> exp.Query:
    """Every table reference without an alias gets its own name as one, quoted: qualify would invent one from the
    name, and it strips what it takes for padding (`` ` lead` `` became `lead`), so a column qualified by the
    table's name would no longer resolve."""
    for table in tree.find_all(exp.Table):
        if isinstance(table.this, exp.Identifier) and not table.alias:
            table.set("alias", exp.TableAlias(this=exp.Identifier(this=table.name, quoted=True)))
    return tree


def _clock_words_as_calls(tree: exp.Query, tables: Mapping[str, TableSchema]) -> exp.Query:
    """A bare `current_time` or `localtime` that names no column is a call for Spark (as `current_date` is for
    sqlglot too): analyze it as one, so it is not taken for an unknown column."""
    columns = {c for schema in tables.values() for c in schema.columns}
    for col in list(tree.find_all(exp.Column)):
        if not col.table and col.name.lower() in BARE_CLOCK_WORDS and col.name not in columns:
            call = exp.Anonymous(this=col.name)
            call.meta.update(col.this.meta if isinstance(col.this, exp.Identifier) else {})
            col.replace(call)
    return tree


class Analysis:
    """The qualified query's scopes, and for each catalog reference the columns and conjuncts it needs."""

    def __init__(self, statement: exp.Query, qualified: exp.Query, lenient: bool, tables: Mapping[str, TableSchema],
                 refs: Sequence[exp.Table], params: Mapping[str, ParamValue], now_ns: int) -> None:
        self.except_stars: set[int] = set()
        """SELECTs (by id) with a `* EXCEPT (...)`: it reaches Spark as written, so the names it leaves out must
        exist in the views it covers."""
        for star in statement.find_all(exp.Star):
            select = star.find_ancestor(exp.Select)
            if (star.args.get("except_") or star.args.get("except")) and select is not None:
                self.except_stars.add(int(select.meta[NODE]))
        self.qualified = qualified
        self.tables = tables
        self.params = params
        self.now_ns = now_ns
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
                if isinstance(source, exp.Table) and REF in source.meta:
                    self.q_alias[int(source.meta[REF])] = alias
        self._collect_columns(lenient)
        for scope in self.scopes:
            self._collect_conjuncts(scope)

    def _refs_with_alias(self, alias: str) -> list[int]:
        return [i for i, a in self.q_alias.items() if a == alias]

    def _collect_columns(self, lenient: bool) -> None:
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
                if isinstance(source, exp.Table) and REF in source.meta:
                    i = int(source.meta[REF])
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
        # A star qualify could not expand (anything but count(*)) reads every column of every reference; so does
        # every reference when some column is left for Spark to resolve (lenient).
        everything = lenient or any(not isinstance(s.parent, exp.Count) for s in self.qualified.find_all(exp.Star))
        # A `* EXCEPT (...)` reaches Spark as written: the references it covers read every column, so the names it
        # leaves out exist in their views.
        for scope in self.scopes:
            if NODE in scope.expression.meta and int(scope.expression.meta[NODE]) in self.except_stars:
                for _, source in scope.selected_sources.values():
                    if isinstance(source, exp.Table) and REF in source.meta:
                        i = int(source.meta[REF])
                        self.columns[i].update(self.tables[self.table_of[i]].columns)
        for i, ref in enumerate(self.refs):
            if everything or ref.args.get("pivots") or i not in self.q_alias:
                # A PIVOT groups by every column it does not pivot; a reference no scope found pushes nothing.
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
            if not isinstance(source, exp.Table) or REF not in source.meta:
                continue
            position = next((p for p, s in enumerate(sources) if s is source), None)
            if position is None or position in unsafe:
                continue
            self.conjuncts[int(source.meta[REF])].append(conjunct)

    def scan(self, i: int) -> ScanRequest:
        schema = self.tables[self.table_of[i]]
        needed = tuple(c for c in schema.star_columns if c in self.columns[i]) or (TIME,)
        pushed: list[Conjunct] = []
        time_min: int | None = None
        time_max: int | None = None
        tag_filters: list[TagFilter] = []
        for conjunct in self.conjuncts[i]:
            translated = _Pushdown(schema, self.params, self.now_ns).translate(conjunct)
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


class _Pushdown:
    """Turns one WHERE conjunct into what a scan evaluates, or None when it cannot be pushed safely."""

    def __init__(self, schema: TableSchema, params: Mapping[str, ParamValue], now_ns: int) -> None:
        self.schema = schema
        self.params = params
        self.now_ns = now_ns

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
        if CLOCK in node.meta:
            # Only the clocks the splicer pins to the planning time, and only those of a timestamp or date type.
            return clock_value_us(str(node.meta[CLOCK]), self.now_ns)
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
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text.strip()):
        return None
    return _parse_timestamp_us(text)


def _interval_us(node: exp.Expr) -> int | None:
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    unit = node.args.get("unit")
    name = unit.name.upper().rstrip("S") if unit is not None else ""
    if name not in _INTERVAL_US or not re.fullmatch(r"-?[0-9]+", str(node.this.this).strip()):
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
