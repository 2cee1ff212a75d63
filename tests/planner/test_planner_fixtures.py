"""The planner's fixture files, one parametrized test: `tests/fixtures/<pass>.yaml` holds titled cases (chunks, a
query, the expected EXPLAIN text after that pass); `<pass>__invalid.yaml` holds cases that must fail, with the
error they expect. Fixtures named after no pass run the whole pipeline (`initial_plan` runs none).

A case may give an `input` plan tree (plan JSON as YAML; sort keys as plain column lists, scan projections
default to every column) instead of a query: then only the file's pass runs on it, as in seed 000's before/after
pairs, and `plan` is the rendered result (notes follow as `note:` lines).

A case whose chunks all carry rows (`lines`) is also executed by the reference evaluator: the plan and the
naive initial plan must give the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from iox_planner import errors
from iox_planner.model import CHUNK_ORDER, Chunk
from iox_planner.planner import PASSES, PlannerSettings, plan_query, render
from iox_planner.planner.context import PassContext
from iox_planner.planner.explain import render_node
from iox_planner.planner.nodes import QueryPlan
from iox_planner.planner.serde import node_from_dict, plan_from_json, plan_to_dict, plan_to_json

from planner_support import fixture_files, load_chunks, read_fixture, source_of
from reference_support import PlanEvaluator, multiset

PASS_NAMES = {p.name for p in PASSES}


def _cases() -> list[Any]:
    out = []
    for path in fixture_files():
        for case in read_fixture(path)["cases"]:
            out.append(pytest.param(path, case, id=f"{path.stem}: {case['title']}"))
    return out


def _plan(path: Path, case: dict[str, Any], *, naive: bool = False) -> tuple[QueryPlan, dict[str, Any]]:
    doc = read_fixture(path)
    chunks, rows = load_chunks(case["chunks"], doc["defaults"])
    source = source_of(chunks, case.get("sort_keys"))
    stem = path.stem.split("__")[0]
    stop_after = case.get("stop_after", stem if stem in PASS_NAMES else None)
    start, end = case.get("time_range", [None, None])
    plan = plan_query(
        case["query"], source, params=case.get("params"), time_start=start, time_end=end,
        settings=PlannerSettings(**case.get("settings", {})), now_ns=case.get("now", 0),
        optimize=not naive and stem != "initial_plan", stop_after=None if naive else stop_after,
    )
    return plan, rows


def _expand(spec: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """Plan JSON from a fixture's shorthand."""
    out = dict(spec)
    for key in ("sort_key", "sort", "output_ordering"):
        if isinstance(out.get(key), list):
            out[key] = [{"column": c, "descending": False, "nulls_first": True} if isinstance(c, str) else c
                        for c in out[key]]
    if out["node"] in ("ParquetExec", "RecordBatchesExec"):
        out.setdefault("projection", columns)
        out.setdefault("store", "file://")
    out["children"] = [_expand(c, columns) for c in spec.get("children", [])]
    return out


def _run_pass(path: Path, case: dict[str, Any]) -> str:
    doc = read_fixture(path)
    chunks, _ = load_chunks(case["chunks"], doc["defaults"])
    source = source_of(chunks, case.get("sort_keys"))
    (table, schema), = source.tables().items()
    columns = [CHUNK_ORDER, *schema.star_columns]
    by_id: dict[str, Chunk] = {c.id: c for c in chunks}
    tree = node_from_dict(_expand(case["input"], columns), by_id)
    ctx = PassContext(PlannerSettings(**case.get("settings", {})), schema, source.sort_keys(table), "scan")
    (entry,) = [p for p in PASSES if p.name == path.stem.split("__")[0]][:1]
    result = entry.run(tree, ctx)
    assert result.schema == tree.schema
    return render_node(result) + "\n" + "".join(f"note: {n}\n" for n in ctx.notes)


@pytest.mark.parametrize(("path", "case"), _cases())
def test_fixture(path: Path, case: dict[str, Any]) -> None:
    if path.stem.endswith("__invalid"):
        expected = case["error"]
        with pytest.raises(getattr(errors, expected["type"])) as info:
            _run_pass(path, case) if "input" in case else _plan(path, case)
        for fragment in expected.get("contains", []):
            assert fragment in str(info.value)
        return
    if "input" in case:
        assert _run_pass(path, case) == case["plan"]
        return
    plan, rows = _plan(path, case)
    assert render(plan) == case["plan"]
    assert plan_from_json(plan_to_json(plan)) == plan
    if rows and len(rows) == len(case["chunks"]):
        naive, _ = _plan(path, case, naive=True)
        got, want = plan_to_dict(plan), plan_to_dict(naive)
        for tree, naive_tree, scan in zip(got["children"], want["children"], plan.scans):
            columns = [c for c, _ in scan.columns]
            assert multiset(PlanEvaluator(got, rows).scan(tree), columns) == multiset(
                PlanEvaluator(want, rows).scan(naive_tree), columns)
        if "rows" in case:  # the scan rows a case states, in `SELECT *` order of the first scan
            columns = [c for c, _ in plan.scans[0].columns]
            stated = multiset(({c: v for c, v in zip(columns, r)} for r in case["rows"]), columns)
            assert multiset(PlanEvaluator(got, rows).scan(got["children"][0]), columns) == stated


def test_every_pass_has_a_fixture_file() -> None:
    stems = {p.stem for p in fixture_files()}
    missing = sorted(name for name in PASS_NAMES if name not in stems and f"{name}__invalid" not in stems)
    assert not missing, f"passes without fixture files: {missing}"
