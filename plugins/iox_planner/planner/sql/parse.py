"""Reading a query: the one SELECT of the text, within the limits, with the source positions the splicer needs.

sqlglot is the analyzer, never the writer: the query Spark runs is the user's text with the planner's edits spliced
in (`splice.py`), so the parse keeps, besides the tree, the tokens and where in the text each edited construct
starts and ends. sqlglot's tokens carry character offsets; a parser subclass records the few ends the tree lacks
(the end of a SELECT list, of an ORDER BY item, of a function call, the closing parenthesis of a subquery).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, ParamSpec, Sequence, TypeVar

import sqlglot
from sqlglot import exp
from sqlglot.tokenizer_core import Token, TokenType

from iox_planner.errors import BadQueryError, UnsupportedError, check_text
from iox_planner.planner.limits import SqlLimits, check_size, depth_error, nodes_error, values_error
from iox_planner.planner.predicate import SPARK

# sqlglot logs warnings that quote the SQL it was given ("... contains unsupported syntax"): with no handler of
# its own, Python's last-resort handler would print the user's text, escape bytes and all, to the terminal. The
# planner turns what matters into errors of its own, so sqlglot's log stays silent.
logging.getLogger("sqlglot").addHandler(logging.NullHandler())
logging.getLogger("sqlglot").propagate = False

ITEMS_END = "iox_items_end"
"""Meta of a SELECT's last item: the text offset right after the SELECT list (where items can be appended)."""
ORDER_END = "iox_order_end"
"""Meta of an ORDER BY item (`exp.Ordered`): the text offset right after it."""
CLOSE = "iox_close"
"""Meta of a derived table (`exp.Subquery`): the text offset right after its closing parenthesis."""
CALL = "iox_call"
"""Meta of a function call: (start, end) text offsets of the whole call, name to closing parenthesis."""
GUARD = "iox_guard"
"""Meta of a call whose size the splicer guards at run time (`guards.py`)."""


@dataclass(frozen=True)
class Source:
    """The query as written, with its tokens (character offsets into `sql`)."""

    sql: str
    tokens: Sequence[Token]
    _by_start: dict[int, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for i, token in enumerate(self.tokens):
            self._by_start.setdefault(token.start, i)

    def token_index(self, offset: int) -> int | None:
        """The index of the token starting at text offset `offset`, if one does."""
        return self._by_start.get(offset)

    def group_end(self, i: int) -> int:
        """For the `(` at token `i`, the index of its matching `)`."""
        depth = 0
        for j in range(i, len(self.tokens)):
            kind = self.tokens[j].token_type
            if kind is TokenType.L_PAREN:
                depth += 1
            elif kind is TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    return j
        raise BadQueryError("unbalanced parentheses in the SQL")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def call_name(node: exp.Expr, source: Source) -> str | None:
    """The function name as the user wrote it, for a call the parser positioned; None for syntax that is not a
    call by name (an operator, a keyword form such as CASE ... END). Spark resolves built-in names
    case-insensitively, by this very text: it runs the user's text, not sqlglot's reading of it."""
    if isinstance(node, exp.Anonymous):
        # `reflect`(...): a quoted name is still the name (Spark resolves it all the same).
        return str(node.this.this) if isinstance(node.this, exp.Identifier) else str(node.this)
    where = node.meta.get(CALL)
    if where is None:
        return None
    i = source.token_index(where[0])
    if i is None:
        return None
    token = source.tokens[i]
    if token.token_type is TokenType.IDENTIFIER:
        return token.text
    if token.token_type not in _LITERALS and _NAME.fullmatch(token.text):
        return token.text
    return None


_LITERALS = {TokenType.STRING, TokenType.NUMBER, TokenType.HEX_STRING, TokenType.BIT_STRING,
             TokenType.BYTE_STRING, TokenType.NATIONAL_STRING, TokenType.RAW_STRING}


def span(node: exp.Expr) -> tuple[int, int] | None:
    """The text offsets [start, end) of a node sqlglot positioned (identifiers, literals, stars, function names)."""
    start, end = node.meta.get("start"), node.meta.get("end")
    if start is None or end is None:
        return None
    return int(start), int(end) + 1


# ----------------------------------------------------------------------------------------------------------------
# Parsing

_P = ParamSpec("_P")
_R = TypeVar("_R")


def within_limits(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Analysis with room on the stack for the nesting the limits allow (sqlglot's scopes, qualify and printing
    recurse once per level too); should a query still go deeper, an error saying so, not a RecursionError."""
    @functools.wraps(func)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        limits = SqlLimits.from_env()
        try:
            with stack_for(limits):
                return func(*args, **kwargs)
        except RecursionError as err:
            raise BadQueryError(f"the SQL nests too deeply to analyze; flatten it (limit: IOX_MAX_SQL_DEPTH="
                                f"{limits.max_depth})") from err
    return guarded


@contextmanager
def stack_for(limits: SqlLimits) -> Iterator[None]:
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


def parse(sql: str, limits: SqlLimits | None = None) -> tuple[exp.Query, Source]:
    """The one SELECT of `sql` and its source, within the limits: size and text before tokenizing, nesting before
    parsing (the parser recurses once per level), syntax nodes and list lengths after. AND/OR chains come back
    balanced (see `_balance`)."""
    limits = limits or SqlLimits.from_env()
    if not isinstance(sql, str):
        raise BadQueryError(f"the SQL must be text, not {type(sql).__name__}")
    check_text(sql)
    check_size(sql, limits)
    try:
        tokens = _spark_tokens(SPARK.tokenize(sql))
    except sqlglot.errors.SqlglotError as err:
        raise BadQueryError(f"the SQL does not parse: {err}") from err
    _check_tokens(tokens, limits)
    if any(t.token_type is TokenType.PIPE_GT for t in tokens):
        # sqlglot rewrites a pipe into nested queries of its own making, whose parts no longer map back to the
        # text: the planner's edits would land in the wrong places (a view swapped for another, probe S89).
        raise UnsupportedError("pipe syntax (|>) is not supported: write the query as SELECT ... FROM ... "
                               "(subqueries and CTEs for the steps)")
    try:
        with stack_for(limits):
            statements = [s for s in _PositionedParser(dialect=SPARK).parse(tokens, sql) if s is not None]
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
    return statement, Source(sql, tokens)


class _PositionedParser(type(SPARK.parser())):  # type: ignore[misc]
    """Spark's parser, noting where the constructs the splicer edits end in the text, and not trying in vain to
    read a call as a type (see `_parse_types`)."""

    TYPE_ATTEMPTS_PER_TOKEN = 4
    """Type readings the parser may try per token of the text (a query tries at most 2; see `_parse_types`)."""

    def reset(self) -> None:
        super().reset()
        self._closing: dict[int, dict[int, int]] = {}
        self._type_attempts = 0

    def _parse_types(self, check_func: bool = False, schema: bool = False, allow_identifiers: bool = True,
                     with_collation: bool = False) -> Any:
        # sqlglot reads `int(...)` or `struct(...)` first as a type with parameters (`DECIMAL(10, 2) '1.5'` is a
        # typed literal), parsing the arguments as type sizes, and on failure parses them again as a call: twice
        # per level, so nesting cost 2^depth (30 nested int(...) took 5 minutes and 4.5 GB). With check_func
        # such a type only stands when a string, a placeholder, `<` or WITH[OUT] TIME ZONE follows its closing
        # parenthesis; when nothing of the kind does, the attempt would fail, so it is not made.
        if check_func and self._type_call_fails():
            return None
        # What still backtracks (nested `struct(...) 'x'`, which no query needs) ends here, in a moment.
        self._type_attempts += 1
        if self._type_attempts > self.TYPE_ATTEMPTS_PER_TOKEN * (len(self._tokens) + 16):
            raise BadQueryError("the SQL nests calls named like types (struct, int, decimal, ...) in a way that "
                                "takes the analyzer exponential time to read; write the nested values another "
                                "way (named_struct(...), CAST(... AS INT))")
        return super()._parse_types(check_func, schema, allow_identifiers, with_collation)

    def _type_call_fails(self) -> bool:
        """Whether the tokens ahead are a type name and a parenthesized group that no typed literal follows."""
        if self._curr.token_type not in self.TYPE_TOKENS or self._next.token_type is not TokenType.L_PAREN:
            return False
        close = self._closing_paren(self._index + 1)
        if close is None or close + 1 >= len(self._tokens):
            return close is not None
        after = self._tokens[close + 1]
        if after.token_type in self.STRING_PARSERS or after.token_type in self.PLACEHOLDER_PARSERS:
            return False
        return after.token_type is not TokenType.LT and after.text.upper() not in ("WITH", "WITHOUT")

    def _closing_paren(self, index: int) -> int | None:
        """The index of the `)` matching the `(` at `index` in the current statement's tokens (one pass over
        them, once per statement)."""
        tokens = self._tokens
        matches = self._closing.get(id(tokens))
        if matches is None:
            matches = {}
            opened: list[int] = []
            for i, token in enumerate(tokens):
                if token.token_type is TokenType.L_PAREN:
                    opened.append(i)
                elif token.token_type is TokenType.R_PAREN and opened:
                    matches[opened.pop()] = i
            self._closing[id(tokens)] = matches
        return matches.get(index)

    def _parse_projections(self) -> Any:
        projections, exclude = super()._parse_projections()
        if projections:
            projections[-1].meta[ITEMS_END] = self._prev.end + 1
        return projections, exclude

    def _parse_ordered(self, parse_method: Any = None) -> Any:
        node = super()._parse_ordered(parse_method)
        if node is not None:
            node.meta[ORDER_END] = self._prev.end + 1
        return node

    def _parse_subquery(self, this: Any, parse_alias: bool = True) -> Any:
        close = self._prev
        node = super()._parse_subquery(this, parse_alias)
        if node is not None and close is not None and close.token_type is TokenType.R_PAREN:
            node.meta[CLOSE] = close.end + 1
        return node

    def _parse_function(self, functions: Any = None, anonymous: bool = False, optional_parens: bool = True,
                        any_token: bool = False) -> Any:
        first = self._curr
        node = super()._parse_function(functions, anonymous, optional_parens, any_token)
        if node is not None and first is not None and CALL not in node.meta:
            node.meta[CALL] = (first.start, self._prev.end + 1)
        return node


def _spark_tokens(tokens: list[Token]) -> list[Token]:
    """Spark spellings sqlglot's Spark tokenizer reads otherwise, made into the tokens it reads right: `X 'F0'` (the
    binary literal written as a typed literal, with a space), `window(...)` (a function, not the WINDOW clause)
    and `>>>` (unsigned shift right, analyzed as `>>`: the analysis never evaluates or prints an operator, it only
    needs the expression's shape)."""
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if (token.token_type is TokenType.VAR and token.text.upper() == "X" and following is not None
                and following.token_type is TokenType.STRING):
            out.append(Token(TokenType.HEX_STRING, following.text, token.line, following.col, token.start,
                             following.end, following.comments))
            i += 2
            continue
        if (token.token_type is TokenType.WINDOW and following is not None
                and following.token_type is TokenType.L_PAREN):
            # `window(time, '1 hour')` is Spark's time-window function (its WINDOW clause is `WINDOW w AS (...)`);
            # sqlglot takes the keyword for the clause and fails on it first in a GROUP BY.
            out.append(Token(TokenType.VAR, token.text, token.line, token.col, token.start, token.end,
                             token.comments))
            i += 1
            continue
        if (token.token_type is TokenType.GT and len(out) >= 2 and out[-1].token_type is TokenType.GT
                and out[-2].token_type is TokenType.GT and out[-1].start == out[-2].end + 1
                and token.start == out[-1].end + 1):
            i += 1  # the third `>` of `>>>`
            continue
        out.append(token)
        i += 1
    return out


# Tokens that open and close a nesting level of the parser's recursion.
_OPENS = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE}
_CLOSES = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END}
# A unary operator repeated (NOT NOT NOT x, - - - x) also recurses once per token.
_UNARY = {TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE}


def _check_tokens(tokens: Sequence[Token], limits: SqlLimits) -> None:
    """Nesting within the limit (also inside string literals: Spark parses type strings, JSON and CSV given as
    text, and nests as deeply as they do), and no script transform (`TRANSFORM|MAP|REDUCE ... USING 'script'`): a
    USING followed by a string is only ever a script (a join's USING takes a column list)."""
    depth = deepest = unary = 0
    for i, token in enumerate(tokens):
        kind = token.token_type
        if kind in _OPENS:
            depth += 1
            deepest = max(deepest, depth)
        elif kind in _CLOSES:
            depth = max(depth - 1, 0)
        elif kind is TokenType.STRING:
            inside = literal_depth(token.text)
            if inside > limits.max_depth:
                raise BadQueryError(
                    f"a string literal at line {token.line}, column {token.col} nests brackets {inside} levels "
                    f"deep, over the limit of {limits.max_depth} (Spark parses type strings, JSON and CSV text "
                    "as deeply as they nest); flatten it or raise IOX_MAX_SQL_DEPTH")
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


_SCAN = re.compile(r"""(?P<skip>\s+|--[^\n]*|/\*(?:[^*]|\*(?!/))*(?:\*/|\Z))
    |(?P<string>[rR]'[^']*(?:'|\Z)|[rR]"[^"]*(?:"|\Z)|'(?:[^'\\]|\\.)*(?:'|\Z)|"(?:[^"\\]|\\.)*(?:"|\Z))
    |(?P<name>`(?:[^`]|``)*(?:`|\Z)|[A-Za-z0-9_]+)
    |(?P<other>.)""", re.X | re.S)
_SCAN_OPENS, _SCAN_CLOSES, _SCAN_UNARY = frozenset("([{"), frozenset(")]}"), frozenset("-+~!")
GATE_SLACK_DEPTH = 8
"""Levels the planner's edits may add to a query it accepted (a star's `EXCEPT (...)`, a PIVOT's subquery)."""
GATE_SLACK_TOKENS = 20_000
"""Tokens the planner's edits may add (hidden columns, `EXCEPT` lists)."""
TOKENS_PER_NODE = 3
"""Tokens a query may have per syntax node the planner allows: about 1 to 2 (commas and parentheses make no node)."""
GATE_SLACK_LIST = 1_000
"""Items the planner's edits may add to one bracketed list (an `EXCEPT` list of hidden columns)."""


def prescan(sql: str, limits: SqlLimits) -> None:
    """Refuse, without a parser, a text the planner would refuse: too big, nested too deep (brackets, CASE, a
    unary chain, brackets inside a string), a bracketed list longer than `limits.max_list` values (an IN list), or
    with more tokens than `limits.max_nodes` syntax nodes allow. For a
    text the planner made from an accepted query (the last gate's, `spark_jobs/connect_server.py`), with room for
    the planner's edits; a cheap regular scan that stops at the first limit, so Spark's parser never sees a text
    whose parse alone could take the server's memory or minutes of its time."""
    check_size(sql, SqlLimits(max_bytes=4 * limits.max_bytes))
    max_depth, max_tokens = limits.max_depth + GATE_SLACK_DEPTH, TOKENS_PER_NODE * limits.max_nodes + GATE_SLACK_TOKENS
    max_items = limits.max_list + GATE_SLACK_LIST
    depth = unary = tokens = 0
    commas = [0]  # per open bracket (the text's own level first): an IN list of millions is refused as one
    for found in _SCAN.finditer(sql):
        kind, text = found.lastgroup, found.group()
        if kind == "skip":
            continue
        tokens += 1
        word = text.upper() if kind == "name" else ""
        if text in _SCAN_OPENS or word == "CASE":
            depth += 1
            if text in _SCAN_OPENS:
                commas.append(0)
        elif text in _SCAN_CLOSES or word == "END":
            depth = max(depth - 1, 0)
            if text in _SCAN_CLOSES and len(commas) > 1:
                commas.pop()
        elif text == ",":
            commas[-1] += 1
            if commas[-1] >= max_items:
                raise values_error("bracketed", commas[-1] + 1, limits)
        elif kind == "string" and literal_depth(text) > max_depth:
            raise BadQueryError(f"a string literal nests brackets {literal_depth(text)} levels deep, over the limit "
                                f"of {limits.max_depth} (Spark parses type strings, JSON and CSV text as deeply as "
                                "they nest); flatten it or raise IOX_MAX_SQL_DEPTH")
        unary = unary + 1 if text in _SCAN_UNARY or word == "NOT" else 0
        if depth > max_depth or unary > max_depth:
            raise depth_error(max(depth, unary), limits)
        if tokens > max_tokens:
            raise nodes_error(limits.max_nodes, limits)


def literal_depth(text: str) -> int:
    """How deep brackets (`( [ { <`) nest inside a string literal's text."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{<":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in ")]}>" and depth:
            depth -= 1
    return deepest


def _balance(statement: exp.Query) -> exp.Query:
    """Each chain of ANDs (or of ORs) rebuilt as a balanced tree of the same operands in the same order.

    The parser builds `a OR b OR c ...` as a left-deep chain as deep as it is long; sqlglot's scope analysis
    walks from every column up to its SELECT, so 10,000 ORs cost 10,000 x 10,000 steps, and splitting conjuncts
    recursed once per AND. AND and OR are associative in SQL's three-valued logic and the operand order is kept,
    so the analysis sees the same query (the text Spark runs is the user's, never this tree)."""
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
            balanced.meta.update(head.meta)  # where the splicer finds a SELECT list's end, say
            head.replace(balanced)
    return statement


def _balanced(kind: type[exp.Connector], operands: Sequence[exp.Expr]) -> exp.Expr:
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    return kind(this=_balanced(kind, operands[:middle]), expression=_balanced(kind, operands[middle:]))


def _check_tree(statement: exp.Query, limits: SqlLimits) -> None:
    """Syntax nodes, their depth and the lengths of value lists within the limits (iteratively: the tree may be
    deeper than the stack)."""
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
        if isinstance(node, exp.Values) and len(node.expressions) > limits.max_list:
            raise values_error("VALUES", len(node.expressions), limits)
        if isinstance(node, exp.In) and len(node.expressions) > limits.max_list:
            raise values_error("IN", len(node.expressions), limits)
        for child in node.iter_expressions():
            stack.append((child, depth + 1))
