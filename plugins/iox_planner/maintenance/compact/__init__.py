"""Compaction: which partitions need it and the plan of each (`plan.py`: inputs, level, time slices), one slice's
merge (`slices.py`, run in Spark's Python workers, several slices per Spark task), the catalog swap (`swap.py`), a
whole run (`run.py`), its report (`report.py`), its settings (`settings.py`), and a run cut into batches for the
`iox_compact` DAG (`batches.py`). The Spark side is `spark_jobs/compact_job.py`; nothing here imports pyspark.

Levels, as in IOx: persist writes L0 files (may overlap anything). Hot compaction promotes a partition's L0 files
that overlap no other file to L1 in place (a catalog update of the level: same file, order and rows) and rewrites
the other L0 files (with the L1 files they overlap) into L1 files, in independent groups; L1 files never overlap
each other; cold compaction rewrites the L1 files
of a partition quiet for `IOX_COMPACT_COLD_SECONDS` into L2 files of about `IOX_COMPACT_TARGET_ROWS` rows.

Exactness: the inputs are merged with PRODUCT.md's dedup (`files.deduplicate`), cut by time (`slicing.time_slices`,
the planner's rule; rows of different nanoseconds are never duplicates, so slices merge alone) and every output
takes the newest input's order. That is only right when no chunk left outside has an order between the inputs'
orders and a time range overlapping them (the merge would lift old input rows above it): such a file is pulled
into the compaction, such an ingester chunk (persist's job, never ours) makes the partition's rewrite wait;
its promotions, which give no row a new order, go ahead alone (`plan_partition` says why that is exact).

Atomicity: one partition's outputs are staged as `<uuid>.compacted.parquet` files, then ONE transaction re-checks
that the inputs are still live and nothing misordered appeared, registers the outputs and retires the inputs (the
grace period keeps them readable for queries planned before). That transaction runs in the session holding the
partition's compaction lock and first checks it still does: the lock is what keeps the stray sweep off the staged
outputs. Otherwise nothing is registered and the staged outputs are deleted. A killed compaction leaves strays
only, swept under the partition's compaction lock by the next compaction or persist
(`maintenance/sweeps.py` `sweep_compaction_strays`).
"""

from __future__ import annotations


