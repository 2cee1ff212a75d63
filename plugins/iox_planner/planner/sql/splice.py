"""The query Spark runs: the user's text, byte for byte, with the planner's own edits spliced in at their source
positions. sqlglot never writes the user's expressions (its reading of a query is not always Spark's, and its
printing is not the identity: `percentile_cont` became `PERCENTILE_APPROX`, `SELECT ... INTO t` a CREATE TABLE);
it only tells where each edit goes. Where an edit cannot be placed exactly, the query is refused.

The edits, and nothing else:
- each catalog table reference becomes its view, keeping the alias (`FROM h2o` -> `FROM __iox_scan_0 AS h2o`);
  under a PIVOT, a subquery of the view without its nanosecond column (a PIVOT groups by every other column);
- each star that would see a column iox-batch adds gets `EXCEPT (...)` naming those columns;
- pinned clocks become the planning time (`clocks.py`);
- time columns passed through get their exact nanoseconds (`nanoseconds.py`): hidden items appended to SELECT
  lists, tie-breaks after ORDER BY items, an alias for a derived table that had none;
- sizes computed from the data get their run-time guard (`guards.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlglot import exp
from sqlglot.optimizer.scope import Scope
from sqlglot.tokenizer_core import TokenType

from iox_planner.errors import UnsupportedError
from iox_planner.model import NS_PREFIX, TIME, time_ns_column
from iox_planner.planner.predicate import identifier, to_sql
from iox_planner.planner.sql.clocks import CLOCK, clock_text
from iox_planner.planner.sql.nanoseconds import NsEdits
from iox_planner.planner.sql.parse import CALL, CLOSE, GUARD, ITEMS_END, ORDER_END, Source, span
from iox_planner.planner.sql.scans import NODE, REF, Analysis, ScanRequest, own_nodes

# Several insertions at one offset go in this order.
_STAR_EXCEPT, _HIDDEN_ITEM, _OUTPUT_ITEM = 0, 1, 2


@dataclass(frozen=True)
class Edit:
    """Replace text offsets [start, end) by `text` (an insertion when start == end)."""

    start: int
    end: int
    text: str
    rank: int = 0


def apply(sql: str, edits: Sequence[Edit]) -> str:
    """`sql` with the edits made; edits never overlap (an InternalError-worthy bug if they did)."""
    ordered = sorted(edits, key=lambda e: (e.start, e.end > e.start, e.rank))
    out: list[str] = []
    position = 0
    for edit in ordered:
        if edit.start < position:
            raise UnsupportedError("the planner's edits of this query overlap, so it cannot be sent to Spark as "
                                   "written; simplify the query around its table references, stars and clocks")
        out.append(sql[position:edit.start])
        out.append(edit.text)
        position = edit.end
    out.append(sql[position:])
    return "".join(out)


class Splicer:
    """Works out the edits of one analyzed query."""

    def __init__(self, statement: exp.Query, source: Source, front: Analysis, scans: Sequence[ScanRequest],
                 nanos: NsEdits, now_ns: int, guards: Sequence[Edit] = ()) -> None:
        self.statement = statement
        self.source = source
        self.front = front
        self.scans = scans
        self.nanos = nanos
        self.now_ns = now_ns
        self.guards = tuple(guards)
        self.written: dict[int, exp.Expr] = {}
        for node in statement.find_all(exp.Select, exp.Subquery):
            if NODE in node.meta:
                self.written.setdefault(int(node.meta[NODE]), node)
        self.scope_of: dict[int, Scope] = {}
        for scope in front.scopes:
            if NODE in scope.expression.meta:
                self.scope_of.setdefault(int(scope.expression.meta[NODE]), scope)

    def spark_sql(self, *, clocks: bool = True, guards: bool = True) -> str:
        edits = [*self._views(), *self._stars(), *self._nanoseconds()]
        if clocks:
            edits += self._clocks()
        if guards:
            edits += self.guards
        return apply(self.source.sql, edits)

    def clock_in_unnamed_output(self) -> bool:
        """Whether a pinned clock or a size guard sits in a result column Spark names after its text (no alias):
        its name would change with the edit, so the job takes the names from the text without those edits."""
        first: exp.Expr = self.statement
        while isinstance(first, exp.SetOperation):
            first = first.this
        if not isinstance(first, exp.Select):
            return False
        return any(not isinstance(item, exp.Alias) and any(CLOCK in n.meta or GUARD in n.meta for n in item.walk())
                   for item in first.expressions)

    # -- table references ------------------------------------------------------------------------------------

    def _views(self) -> list[Edit]:
        edits = []
        for ref in self.front.refs:
            i = int(ref.meta[REF])
            scan = self.scans[i]
            where = span(ref.this) if isinstance(ref.this, exp.Identifier) else None
            if where is None:
                raise UnsupportedError(f"the reference to table {ref.name!r} cannot be located in the SQL text; "
                                       "write it as a plain name")
            if ref.args.get("pivots"):
                hidden = f" EXCEPT ({time_ns_column(scan.view)})" if TIME in scan.columns else ""
                edits.append(Edit(*where, f"(SELECT *{hidden} FROM {scan.view})"))
            else:
                edits.append(Edit(*where, scan.view))
            if not ref.alias:
                edits.append(Edit(self._alias_position(where[1]), self._alias_position(where[1]),
                                  f" AS {self.source.sql[where[0]:where[1]]}"))
        return edits

    def _alias_position(self, after_name: int) -> int:
        """Where a table's alias goes: after its name, or after its TABLESAMPLE clause (Spark reads the sample
        before the alias)."""
        tokens = self.source.tokens
        i = next((j for j, t in enumerate(tokens) if t.start >= after_name), len(tokens))
        if i < len(tokens) and tokens[i].token_type is TokenType.TABLE_SAMPLE and i + 1 < len(tokens):
            last = self.source.group_end(i + 1)
            if last + 2 < len(tokens) and tokens[last + 1].text.upper() == "REPEATABLE":
                last = self.source.group_end(last + 2)
            return tokens[last].end + 1
        return after_name

    # -- stars -------------------------------------------------------------------------------------------------

    def _stars(self) -> list[Edit]:
        edits = []
        for select in self.statement.find_all(exp.Select):
            k = select.meta.get(NODE)
            for node in own_nodes(select):
                if not isinstance(node, exp.Star) or isinstance(node.parent, exp.Count):
                    continue
                qualifier = node.parent.table if isinstance(node.parent, exp.Column) else None
                internal = self._internal_columns(int(k) if k is not None else None, qualifier or None)
                if internal:
                    edits.append(self._except(node, internal))
        return edits

    def _internal_columns(self, k: int | None, qualifier: str | None) -> list[str]:
        """The columns iox-batch adds that a star of SELECT `k` would expand to (over source `qualifier`, or
        all its sources)."""
        scope = self.scope_of.get(k) if k is not None else None
        if scope is None:
            if any(REF in t.meta for t in self._written_sources(k)):
                raise UnsupportedError("a `*` in this query cannot be matched to the tables it covers; list the "
                                       "columns explicitly")
            return []
        names: list[str] = []
        for alias, (_, source) in scope.selected_sources.items():
            if qualifier is not None and alias != qualifier:
                continue
            if isinstance(source, exp.Table) and REF in source.meta:
                scan = self.scans[int(source.meta[REF])]
                if TIME in scan.columns and not source.args.get("pivots"):
                    names.append(time_ns_column(scan.view))
            elif isinstance(source, Scope) and NODE in source.expression.meta:
                names.extend(name for name, _ in self.nanos.hidden.get(int(source.expression.meta[NODE]), []))
        return names

    def _written_sources(self, k: int | None) -> list[exp.Table]:
        select = self.written.get(k) if k is not None else None
        return list(select.find_all(exp.Table)) if select is not None else list(self.statement.find_all(exp.Table))

    def _except(self, star: exp.Star, names: list[str]) -> Edit:
        where = span(star)
        tokens = self.source.tokens
        i = None if where is None else self.source.token_index(where[0])
        if where is None or i is None or tokens[i].token_type is not TokenType.STAR:
            # A star the user did not write: a query with no SELECT list (`FROM t`, `FROM t UNION ALL FROM u`)
            # selects every column, and there is no `*` in the text to keep iox-batch's own columns off.
            raise UnsupportedError("a query with no SELECT list (FROM t alone) reads every column, iox-batch's "
                                   "internal ones included; write SELECT * FROM t")
        listed = ", ".join(to_sql(identifier(n)) for n in names)
        if i + 2 < len(tokens) and tokens[i + 1].token_type is TokenType.EXCEPT \
                and tokens[i + 2].token_type is TokenType.L_PAREN:
            close = tokens[self.source.group_end(i + 2)]
            return Edit(close.start, close.start, f", {listed}", _STAR_EXCEPT)
        return Edit(where[1], where[1], f" EXCEPT ({listed})", _STAR_EXCEPT)

    # -- clocks ------------------------------------------------------------------------------------------------

    def _clocks(self) -> list[Edit]:
        edits = []
        for node in self.statement.walk():
            if CLOCK in node.meta:
                start, end = node.meta[CALL]
                edits.append(Edit(int(start), int(end), clock_text(str(node.meta[CLOCK]), self.now_ns)))
        return edits

    # -- nanoseconds -------------------------------------------------------------------------------------------

    def _nanoseconds(self) -> list[Edit]:
        edits = []
        for k, alias in self.nanos.aliases.items():
            subquery = self.written[k]
            if subquery.alias:
                continue
            if subquery.args.get("pivots") or subquery.args.get("sample") or CLOSE not in subquery.meta:
                raise UnsupportedError("a derived table whose time column the result passes through needs an "
                                       "alias here; give the subquery one: (SELECT ...) AS s")
            at = int(subquery.meta[CLOSE])
            edits.append(Edit(at, at, f" AS {to_sql(identifier(alias))}"))
        for k, items in self.nanos.hidden.items():
            at = self._items_end(k)
            for name, ns in items:
                edits.append(Edit(at, at, f", {to_sql(ns)} AS {to_sql(identifier(name))}", _HIDDEN_ITEM))
        for k, ties in self.nanos.order.items():
            order = self.written[k].args["order"]
            for position, ns in ties.items():
                ordered = order.expressions[position]
                at = int(ordered.meta[ORDER_END])
                direction = " DESC" if ordered.args.get("desc") else ""
                edits.append(Edit(at, at, f", {to_sql(ns)}{direction}"))
        if self.nanos.outputs:
            at = self._items_end(int(self.statement.meta[NODE]))
            for name, ns in self.nanos.outputs:
                edits.append(Edit(at, at, f", {to_sql(ns)} AS {to_sql(identifier(NS_PREFIX + name))}",
                                  _OUTPUT_ITEM))
        return edits

    def _items_end(self, k: int) -> int:
        select = self.written[k]
        last = select.expressions[-1] if isinstance(select, exp.Select) and select.expressions else None
        if last is None or ITEMS_END not in last.meta:
            raise UnsupportedError("the end of a SELECT list cannot be located in the SQL text; list the columns "
                                   "explicitly")
        return int(last.meta[ITEMS_END])
