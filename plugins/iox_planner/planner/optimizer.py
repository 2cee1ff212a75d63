"""The optimizer: the passes of seed 000 in one ordered tuple, and the driver that checks each of them.

The driver runs every pass over one scan tree and requires the tree's output schema to be the same after each
pass as before it. The last pass changes nothing: it validates the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from iox_planner.errors import InternalError
from iox_planner.planner.context import PassContext
from iox_planner.planner.explain import render_node
from iox_planner.planner.nodes import PlanNode
from iox_planner.planner.passes.add_sorts import add_sorts
from iox_planner.planner.passes.clean_unions import clean_unions
from iox_planner.planner.passes.fuse_scans_without_dedup import fuse_scans_without_dedup
from iox_planner.planner.passes.group_files_by_sort import group_files_by_sort
from iox_planner.planner.passes.group_scans_by_type import group_scans_by_type
from iox_planner.planner.passes.push_down_predicates import push_down_predicates
from iox_planner.planner.passes.push_down_projections import push_down_projections
from iox_planner.planner.passes.remove_dedup_without_duplicates import remove_dedup_without_duplicates
from iox_planner.planner.passes.sanity_check import sanity_check
from iox_planner.planner.passes.slice_dedup_by_time import slice_dedup_by_time
from iox_planner.planner.passes.split_dedup_by_partition import split_dedup_by_partition
from iox_planner.planner.passes.split_dedup_by_time import split_dedup_by_time


@dataclass(frozen=True)
class Pass:
    run: Callable[[PlanNode, PassContext], PlanNode]
    reason: str
    """Why it stands where it stands."""

    @property
    def name(self) -> str:
        return self.run.__name__


PASSES: tuple[Pass, ...] = (
    Pass(split_dedup_by_partition,
         "first: partitions never share keys, and every later split works inside one partition"),
    Pass(split_dedup_by_time,
         "after the partition split, so it groups the chunks of one partition (and its limit counts per "
         "partition); before anything is pushed into the scans it regroups"),
    Pass(slice_dedup_by_time,
         "right after the time split, on its groups (overlap groups cannot be split further by key): cuts the "
         "large ones into time slices while their scans are still plain chunks"),
    Pass(clean_unions,
         "the splits nest unions (partitions of time groups): flatten them so the next passes see all groups as "
         "siblings"),
    Pass(remove_dedup_without_duplicates,
         "once the splits made dedups as small as they get: a dedup left over one duplicate-free chunk goes"),
    Pass(fuse_scans_without_dedup,
         "after dedups were removed: the groups left without one are put in order and adjacent ones fused"),
    Pass(group_scans_by_type,
         "after fusing: whatever same-kind scans remain side by side in a union become one per kind and store"),
    Pass(group_files_by_sort,
         "once every ParquetExec holds its final files: choose file groups and orderings for the dedup above"),
    Pass(push_down_predicates,
         "after the scans are final, so predicates land in each of them; before projections move, so filter "
         "columns are still there"),
    Pass(push_down_projections,
         "after the filters moved: a projection keeps what the filters it passes read"),
    Pass(clean_unions,
         "the removals and fusions can leave single-input unions behind: remove them before sorting"),
    Pass(add_sorts,
         "last change: a dedup's input is final only now, so its sorts and merges go in here"),
    Pass(sanity_check,
         "always last: changes nothing, checks the invariants of the finished plan"),
)


def optimize(tree: PlanNode, ctx: PassContext, *, stop_after: str | None = None) -> PlanNode:
    """Run PASSES over one scan tree (up to and including `stop_after`, if named)."""
    if stop_after is not None and stop_after not in {p.name for p in PASSES}:
        raise ValueError(f"no pass named {stop_after!r}; passes: {', '.join(p.name for p in PASSES)}")
    for entry in PASSES:
        before = tree.schema
        after = entry.run(tree, ctx)
        if after.schema != before:
            raise InternalError(
                f"pass {entry.name} changed the output schema of {ctx.label} from {list(before)} to "
                f"{list(after.schema)}; please report this bug with the plans before:\n{render_node(tree)}\n"
                f"and after:\n{render_node(after)}"
            )
        tree = after
        if entry.name == stop_after:
            break
    return tree
