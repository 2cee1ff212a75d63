"""Exact nanoseconds for time columns passed through.

On the views Spark reads, `time` is a TIMESTAMP of `floor(time / 1000)` microseconds; each view also carries the
exact int64 nanoseconds in a column of its own (`model.time_ns_column`, unique per view, so a NATURAL JOIN never
joins on it). A result column that is a table's `time` passed through unchanged, row for row, gets a companion
`__iox_ns_<name>` selected at the top level, which the output folds back into `<name>`: the view's nanosecond
column, or a hidden item `__iox_tns_<k>` added to each subquery or CTE the column passes through. An ORDER BY on
such a column gets the nanoseconds as a tie-break right after it. Where that is not safe (set operations,
DISTINCT, GROUP BY, aggregates, windows, a subquery whose column set a column list would see change), the column
keeps Spark's microseconds instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from iox_planner.model import TIME, VIEW_PREFIX, ColumnType, HIDDEN_PREFIX, time_ns_column
from iox_planner.planner.predicate import identifier
from iox_planner.planner.sql.scans import NODE, REF, Analysis, own_nodes


def shape_of(statement: exp.Query) -> Shape:
    """Facts about the query as written that `qualify` does not keep: its stars and column lists."""
    shape = Shape()
    for select in statement.find_all(exp.Select):
        k = int(select.meta[NODE])
        holder = select.parent
        alias = holder.args.get("alias") if isinstance(holder, (exp.Subquery, exp.CTE)) else None
        if isinstance(alias, exp.TableAlias) and alias.columns:
            shape.column_lists.add(k)
        for node in own_nodes(select):
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


@dataclass
class Shape:
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
class NsEdits:
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


class Nanoseconds:
    """Finds, on the qualified query, where the exact nanoseconds of each time column come from."""

    def __init__(self, front: Analysis, shape: Shape) -> None:
        self.front = front
        self.shape = shape
        self.out = NsEdits()
        self.scopes: list[Scope] = list(front.root.traverse()) if front.root is not None else []
        counts: dict[int, int] = {}
        for node in front.qualified.find_all(exp.Select, exp.Subquery):
            if NODE in node.meta:
                counts[int(node.meta[NODE])] = counts.get(int(node.meta[NODE]), 0) + 1
        self.unique = {k for k, n in counts.items() if n == 1}
        self.extendable_memo: dict[int, bool] = {}

    def edits(self) -> NsEdits:
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
        if node is None or NODE not in node.meta:
            return None
        k = int(node.meta[NODE])
        return k if k in self.unique else None

    def _ns(self, col: exp.Column, scope: Scope) -> exp.Expr | None:
        """The exact nanoseconds of `col` (a column of `scope`'s SELECT) if it is a table's `time` passed through
        unchanged, as an expression over that SELECT's sources as written; None if it is not or cannot be."""
        select = scope.expression
        if not _passes_rows(select) or not col.table:
            return None
        source = scope.sources.get(col.table)
        if isinstance(source, exp.Table):
            if REF not in source.meta or col.name != TIME:
                return None
            i = int(source.meta[REF])
            if self.front.tables[self.front.table_of[i]].columns.get(TIME, ColumnType.TIME) is not ColumnType.TIME:
                return None
            return exp.Column(this=identifier(time_ns_column(f"{VIEW_PREFIX}{i}")), table=identifier(self.front.alias_of[i]))
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
                if any(isinstance(n, exp.Pivot) for n in own_nodes(reader.expression)):
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
            if isinstance(target, exp.Literal) and not target.is_string and str(target.this).isdigit() \
                    and str(target.this).isascii():
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
    return not any(isinstance(n, (exp.AggFunc, exp.Window, exp.Pivot)) for n in own_nodes(select))
