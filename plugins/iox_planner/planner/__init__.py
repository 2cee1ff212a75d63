"""The IOx query planner: SQL and chunk metadata in, an optimized IOx-style physical plan out.

Imports neither Spark nor Airflow. `plan_query` plans, `render` shows a plan as EXPLAIN tree text, seed 000's
YAML or the plan JSON the Spark job executes (`serde.plan_from_json` reads it back).
"""

from __future__ import annotations

from iox_planner.planner.api import plan_query, render
from iox_planner.planner.nodes import (
    DeduplicateExec, EmptyExec, FilterExec, ParquetExec, PlanNode, ProjectionExec, QueryExec, QueryPlan,
    RecordBatchesExec, ScanInfo, ScanPruning, SortExec, SortItem, SortPreservingMergeExec, UnionExec,
)
from iox_planner.planner.optimizer import PASSES
from iox_planner.planner.settings import PlannerSettings

__all__ = [
    "PASSES", "DeduplicateExec", "EmptyExec", "FilterExec", "ParquetExec", "PlanNode", "PlannerSettings",
    "ProjectionExec", "QueryExec", "QueryPlan", "RecordBatchesExec", "ScanInfo", "ScanPruning", "SortExec",
    "SortItem", "SortPreservingMergeExec", "UnionExec", "plan_query", "render",
]
