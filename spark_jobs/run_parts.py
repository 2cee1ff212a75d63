"""spark-submit entry point of a fanned-out plan's part and merge (`iox_planner/spark/jobs.py` `PartJob`,
`MergeJob`, run by `job.py`; see plugins/iox_planner/planner/fanout.py).

    spark-submit run_parts.py part  --plan part-0.json --warehouse DIR --output PARTS/0 --report r.json
    spark-submit run_parts.py merge --plan plan.json --warehouse DIR --parts PARTS --format jsonl --output OUT \
                                    --report r.json

`part` evaluates the scan trees of a part plan (the deduplication happens here) and publishes each scan's rows,
time still int64 nanoseconds, as Parquet under `OUTPUT/<view>/`. `merge` reads every part of every scan back as
that scan's view and runs the query's SQL over them, writing the result as run_plan.py does. Each takes the
query's budget, `--timeout-s N`. Exit status 0 on success; on failure a one-paragraph `error: ...` on standard
error and the error's own status, with nothing written at `--output`.
"""

import sys

from spark_jobs.job import main

if __name__ == "__main__":
    sys.exit(main("run_parts.py"))
