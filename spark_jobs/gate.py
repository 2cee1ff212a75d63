"""The last gate: the exact text Spark is about to run, read by Spark's own parser, must be one read-only query over
the plan's views that calls only allowed functions. Anything else fails here, before any job starts.

The planner's front end already refuses all of this on sqlglot's reading of the query; this gate reads the text
the way Spark will, so a slip of the front end (a construct sqlglot reads differently) stays harmless. It works
on Spark's unresolved plan, as JSON (`TreeNode.toJSON`): a closed list of plan nodes (any other node, such as
a command, CREATE, INSERT, CACHE or SET, is refused), every function and generator by its name on the allow-list,
every relation one of the plan's views or a CTE of the query, hints on the hint list (a partitioning hint's count
within `IOX_MAX_HINT_PARTITIONS`), every regular expression a literal `planner/regex.py` finds safe (as Spark
reads the literal), `raise_error` only as the planner's size guard (`GUARD_MARKER`), and no bare word Spark would
resolve to a refused function (`current_user`, ...).
"""

from __future__ import annotations

import json
from typing import Any, Collection, Iterator

from iox_planner.errors import BadQueryError, UnsupportedError
from iox_planner.planner.functions import ALLOWED, CONTEXT_WORDS, GENERATORS, HINTS, PARTITION_HINTS, REFUSED, SYNTAX
from iox_planner.planner.limits import SqlLimits, partitions_error
from iox_planner.planner.regex import REGEX_ARGUMENTS, like_problem, pattern_problem
from iox_planner.planner.sql.guards import GUARD_MARKER

_LOGICAL = "org.apache.spark.sql.catalyst.plans.logical."
_ANALYSIS = "org.apache.spark.sql.catalyst.analysis."
_EXPRESSIONS = "org.apache.spark.sql.catalyst.expressions."

# The plan nodes Spark's parser builds for a read-only query. A closed list: a node Spark adds in a later version
# is refused until it is reviewed here.
_QUERY_PLANS = frozenset({
    *(_LOGICAL + name for name in """Project Filter Aggregate Join SubqueryAlias UnresolvedWith Union Intersect
        Except Distinct Sort GlobalLimit LocalLimit Offset Generate Pivot Unpivot Sample OneRowRelation
        WithWindowDefinition RepartitionByExpression RebalancePartitions UnresolvedHint LateralJoin Window Tail
        Expand GroupingSets Deduplicate LocalRelation""".split()),
    *(_ANALYSIS + name for name in """UnresolvedRelation UnresolvedInlineTable UnresolvedTableValuedFunction
        UnresolvedTVFAliases UnresolvedSubqueryColumnAliases UnresolvedHaving UnresolvedQualify""".split()),
})
# The expressions Spark's parser itself builds (everything else it leaves as UnresolvedFunction, checked against
# the allow-list): operators, literals, casts, subqueries, windows, grouping sets. A closed list, gathered from the
# parse of every documented example and syntax form (tests/planner/test_sql_fidelity.py runs them all through this
# gate); `current_path`, which the parser builds directly as CurrentPath, is left out, as is anything new.
_PARSED_EXPRESSIONS = frozenset(_EXPRESSIONS + name for name in """Add Alias And AttributeReference BitwiseAnd
    BitwiseNot BitwiseOr BitwiseXor CaseWhen Cast Coalesce Collate Concat CreateNamedStruct Cube CurrentRow$ Divide
    EqualNullSafe EqualTo Exists GreaterThan GreaterThanOrEqual GroupingSets ILike In InSubquery IntegralDivide
    IsNotNull IsNull IsUnknown$$anon$1 IsNotUnknown$$anon$1 LambdaFunction LateralSubquery LessThan LessThanOrEqual
    Like LikeAll LikeAny ListQuery Literal Lower Multiply NamePlaceholder$ NamedArgumentExpression Not NotLikeAll
    NotLikeAny Or Overlay RLike Remainder Rollup ScalarSubquery ShiftLeft ShiftRight ShiftRightUnsigned SortOrder
    SpecifiedWindowFrame StringLocate StringTrim StringTrimLeft StringTrimRight Substring Subtract TimestampAdd
    TimestampDiff UnaryMinus UnaryPositive UnboundedFollowing$ UnboundedPreceding$ UnresolvedCollation
    UnresolvedNamedLambdaVariable UnresolvedWindowExpression UnspecifiedFrame$ WindowExpression WindowSpecDefinition
    aggregate.AggregateExpression aggregate.AnyValue aggregate.First aggregate.Last""".split())
# Expression classes outside the expressions package that the parser uses in queries.
_ANALYSIS_EXPRESSIONS = frozenset(_ANALYSIS + name for name in """UnresolvedAttribute UnresolvedFunction
    UnresolvedAlias UnresolvedStar UnresolvedStarExceptOrReplace UnresolvedGenerator UnresolvedExtractValue
    UnresolvedOrdinal UnresolvedRegex UnresolvedNamedLambdaVariable NamedParameter PosParameter""".split())
# IDENTIFIER(<expression>): a table, column or function named by a string Spark evaluates while it analyzes the
# query, after every check here. A name must be written as a name.
_BY_STRING = frozenset(_ANALYSIS + name for name in "ExpressionWithUnresolvedIdentifier PlanWithUnresolvedIdentifier".split())


def check_query_text(spark: Any, text: str, views: Collection[str], columns: Collection[str]) -> None:
    """Refuse `text` unless Spark parses it as a read-only query over `views` (and the query's own CTEs) calling
    only allowed functions. `columns`: the views' columns (a bare word that is one is a column, not a call)."""
    tree = _parsed(spark, text)
    guards = _check_arguments(tree)
    nodes = list(_nodes(tree))
    ctes = _cte_names(nodes)
    allowed_relations = {f"[{name}]" for name in (*views, *ctes)}
    for node in nodes:
        kind = str(node.get("class", ""))
        if kind in _PARSED_EXPRESSIONS:
            continue
        if kind.startswith(_EXPRESSIONS):
            raise UnsupportedError(f"Spark reads part of this query as the expression {kind[len(_EXPRESSIONS):]}, "
                                   "which is not among the expressions iox-batch allows (operators, literals, "
                                   "casts, subqueries, windows); call an allowed function instead")
        if kind in _ANALYSIS_EXPRESSIONS:
            if id(node) not in guards:
                _check_expression(kind, node, columns)
        elif kind in _BY_STRING:
            raise UnsupportedError("IDENTIFIER(...) names a table, column or function by a string Spark reads only "
                                   "while it runs the query, after iox-batch's checks; write the name itself "
                                   "(quoted with backticks if needed)")
        elif kind not in _QUERY_PLANS:
            raise UnsupportedError(f"Spark reads this SQL as {kind.rsplit('.', 1)[-1]}, not as a read-only query; "
                                   "iox-batch runs one SELECT over catalog tables")
        elif kind == _ANALYSIS + "UnresolvedRelation":
            name = str(node.get("multipartIdentifier"))
            if name not in allowed_relations or node.get("isStreaming"):
                raise UnsupportedError(f"Spark would read relation {name.strip('[]')[:80]!r}, which is not a table "
                                       "of this query's plan; only catalog tables are allowed in FROM")
        elif kind == _ANALYSIS + "UnresolvedTableValuedFunction":
            function = _single_name(node.get("name"))
            if function is None or function.lower() not in GENERATORS:
                raise UnsupportedError(f"table function {str(node.get('name'))[:80]} is not allowed in FROM; only "
                                       f"catalog tables and generators ({', '.join(sorted(GENERATORS))}) are")
        elif kind == _LOGICAL + "UnresolvedHint":
            if str(node.get("name", "")).lower() not in HINTS:
                raise UnsupportedError(f"hint {str(node.get('name'))[:80]!r} is not allowed")


def _check_arguments(tree: Any) -> set[int]:
    """The checks that read a node's arguments: regular expressions, partitioning hints' counts, and the
    planner's size guards, whose `raise_error` calls (their ids) it returns as allowed."""
    limits = SqlLimits.from_env()
    guards: set[int] = set()
    for node, children in _with_children(tree):
        kind = str(node.get("class", ""))
        name = (_single_name(node.get("nameParts")) or "").lower() if kind == _ANALYSIS + "UnresolvedFunction" else ""
        if name == "raise_error":
            message = _string_literal(children[0][0]) if len(children) == 1 else None
            if message is not None and message.startswith(GUARD_MARKER):
                guards.add(id(node))
        elif name in REGEX_ARGUMENTS or kind == _EXPRESSIONS + "RLike":
            for position in REGEX_ARGUMENTS.get(name, (1,)):
                if position < len(children):
                    _check_pattern(name or "RLIKE", _string_literal(children[position][0]))
        elif kind in (_EXPRESSIONS + "Like", _EXPRESSIONS + "ILike") and len(children) == 2:
            pattern = _string_literal(children[1][0])
            why = None if pattern is None else like_problem(pattern, str(node.get("escapeChar") or "\\")[:1])
            if why is not None:
                raise UnsupportedError(f"the LIKE pattern {str(pattern)[:80]!r}, as Spark reads it, is refused: {why}")
        elif kind == _LOGICAL + "UnresolvedHint" and str(node.get("name", "")).lower() in PARTITION_HINTS:
            for parameter in node.get("parameters") or []:
                for item in parameter if isinstance(parameter, list) else []:
                    if isinstance(item, dict) and item.get("class") == _EXPRESSIONS + "Literal" \
                            and str(item.get("dataType")) in ("integer", "long") \
                            and int(str(item.get("value"))) > limits.max_partitions:
                        raise partitions_error(str(node.get("name")), int(str(item.get("value"))), limits)
    return guards


def _check_pattern(shown: str, pattern: str | None) -> None:
    if pattern is None:
        raise UnsupportedError(f"Spark reads the regular expression of {shown} as something other than one string "
                               "literal; write the pattern as '...'")
    why = pattern_problem(pattern)
    if why is not None:
        raise UnsupportedError(f"the regular expression {pattern[:80]!r} of {shown}, as Spark reads it, is refused: "
                               f"{why}")


def _string_literal(node: dict[str, Any]) -> str | None:
    if node.get("class") == _EXPRESSIONS + "Literal" and node.get("dataType") == "string":
        value = node.get("value")
        return value if isinstance(value, str) else None
    return None


def _with_children(tree: Any) -> Iterator[tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]]:
    """Every node of the JSON with its children, each as (node, its children): the JSON lists a tree's nodes in
    pre-order, each with its `num-children` (rebuilt iteratively: a chain of ANDs is as deep as it is long)."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            if item and all(isinstance(x, dict) and "num-children" in x for x in item):
                yield from _rebuilt(item)
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(v for v in item.values() if isinstance(v, (list, dict)))


def _rebuilt(items: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]]:
    entries: list[tuple[dict[str, Any], list[Any]]] = [(node, []) for node in items]
    open_parents: list[list[int]] = []  # [index, children still to come]
    for i, (node, _) in enumerate(entries):
        if open_parents:
            parent = open_parents[-1]
            entries[parent[0]][1].append(entries[i])
            parent[1] -= 1
        count = int(node.get("num-children", 0) or 0)
        if count:
            open_parents.append([i, count])
        while open_parents and open_parents[-1][1] == 0:
            open_parents.pop()
    yield from entries


def _parsed(spark: Any, text: str) -> Any:
    """Spark's unresolved plan of `text` as JSON, from the parser of the session that will run it: this process's
    JVM, or over Spark Connect the server's, through its gate endpoint (`connect.gate_plan_json`), which answers
    with `parsed_plan_json` run there. Either way the checks above are the ones that read it."""
    from spark_jobs.connect import gate_plan_json, is_remote

    return json.loads(gate_plan_json(spark, text) if is_remote(spark) else parsed_plan_json(spark, text))


def parsed_plan_json(spark: Any, text: str) -> str:
    """The JSON of the plan the SQL parser of `spark` (a session with a JVM in this process) builds for `text`: a
    parse only, nothing resolved or run. `BadQueryError` when it does not parse."""
    from pyspark.errors import PySparkException

    from spark_jobs.errors import sanitize_spark_message

    try:
        return str(spark._jsparkSession.sessionState().sqlParser().parsePlan(text).toJSON())
    except PySparkException as err:
        raise BadQueryError(f"the query does not parse in Spark: {sanitize_spark_message(str(err))}") from err
    except Exception as err:  # noqa: BLE001 - py4j's own error type carries Spark's ParseException
        lines = [line for line in str(err).splitlines() if line.strip()]
        raise BadQueryError("the query does not parse in Spark: "
                            f"{sanitize_spark_message(lines[1] if len(lines) > 1 else str(err))}") from err


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every tree node of the JSON (plan nodes, expressions, subquery plans), iteratively."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if "class" in item:
                yield item
            stack.extend(v for v in item.values() if isinstance(v, (list, dict)))


def _cte_names(nodes: list[dict[str, Any]]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if node.get("class") == _LOGICAL + "UnresolvedWith":
            for relation in node.get("cteRelations") or []:
                name = relation.get("_1") if isinstance(relation, dict) else None
                if not isinstance(name, str) or any(ch in name for ch in "[],"):
                    # "[a, b]" is how the JSON shows a two-part relation name: a CTE name of that shape could
                    # pass for one.
                    raise UnsupportedError(f"the CTE name {str(name)[:80]!r} holds brackets or commas; rename it")
                names.add(name)
    return names


def _single_name(parts: Any) -> str | None:
    """The one name of a `[name]` list as the JSON shows name parts; None for a qualified name."""
    if isinstance(parts, dict):  # a FunctionIdentifier
        if parts.get("database") or parts.get("catalog"):
            return None
        parts = parts.get("funcName")
        return parts if isinstance(parts, str) else None
    text = str(parts)
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return None if ", " in text else text


def _check_expression(kind: str, node: dict[str, Any], columns: Collection[str]) -> None:
    if kind == _ANALYSIS + "UnresolvedFunction":
        name = _single_name(node.get("nameParts"))
        if name is None or node.get("isInternal") or (name.lower() not in ALLOWED and name.lower() not in SYNTAX):
            shown = str(node.get("nameParts")).strip("[]")[:80]
            raise UnsupportedError(f"function {shown}() is not in the allowed list of Spark built-in functions; "
                                   "queries may call only functions that read nothing but their arguments")
    elif kind == _ANALYSIS + "UnresolvedGenerator":
        name = _single_name(node.get("name"))
        if name is None or name.lower() not in ALLOWED:
            raise UnsupportedError(f"generator {str(name or node.get('name'))[:80]}() is not in the allowed list of "
                                   "Spark built-in functions")
    elif kind == _ANALYSIS + "UnresolvedAttribute":
        name = _single_name(node.get("nameParts"))
        if name is not None and (name.lower() in CONTEXT_WORDS or (name.lower() in REFUSED and name not in columns)):
            # CONTEXT_WORDS: Spark calls the function for them wherever their own block lacks the column
            raise UnsupportedError(f"Spark would call the function {name.lower()}() for the bare word "
                                   f"{name[:80]!r}, which is not in the allowed list; name a column (qualified: t.col)")
