"""spark-submit entry point of a bulk load (`iox_planner/spark/jobs.py` `BulkLoadJob`, run by `job.py`):
`iox-batch write --spark` with `IOX_RUNNER=spark-submit`, and the `iox_bulk_load` DAG.

    spark-submit run_bulk_load.py --db DB [--precision ns|us|ms|s] [--report REPORT.json] [--accept-partial] \
        [--root DIR] -- FILE|DIR

Loads FILE or DIR as `ingest/bulk.py` `bulk_write` does (one Spark task per byte range, one catalog transaction),
progress on standard error, and writes the chunks it registered and the lines it rejected at `--report`. Exit
status 0 on success; on failure a one-paragraph `error: ...` on standard error and the error's own status (2: bad
input, such as a bad line; 75: the catalog was unreachable, retry), nothing registered.
"""

import sys

from spark_jobs.job import main

if __name__ == "__main__":
    sys.exit(main("run_bulk_load.py"))
