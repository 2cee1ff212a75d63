"""spark-submit entry point of a compaction (`iox_planner/spark/jobs.py` `CompactJob`, run by `job.py`): a batch of
the `iox_compact` DAG, or `iox-batch compact` under `IOX_RUNNER=spark-submit`.

    spark-submit run_compact.py --report REPORT.json --target DB=PARTITION_ID,PARTITION_ID ... [--target ...]
    spark-submit run_compact.py --report REPORT.json --db DB [--table TABLE] [--partition YYYY-MM-DD]

Compacts the listed partitions of each database (or whatever of one database, table or partition needs it) as
`maintenance/compact/batches.py` `compact_batch` does (each partition's compaction lock, one Spark job for all
slices of a database, one catalog transaction per partition) and writes the run's report (partitions, files and
rows in and out, duplicates removed, each partition's outcome) at `--report`. Exit status 0 on success; on failure
a one-paragraph `error: ...` on standard error and the error's own status (75: the catalog's Postgres was
unreachable or dropped the connection, retry), with every swap not yet done left undone.
"""

import sys

from spark_jobs.job import main

if __name__ == "__main__":
    sys.exit(main("run_compact.py"))
