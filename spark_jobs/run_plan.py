"""spark-submit entry point of a plan's result (`iox_planner/spark/jobs.py` `PlanJob`, run by `job.py`).

    spark-submit spark_jobs/run_plan.py --plan plan.json --warehouse DIR --format jsonl --output out.jsonl \
        [--report report.json] [--timeout-s N] [--strategy arrow|shared|window|node] [--limit-rows N]

`--format arrow` writes an Arrow IPC file (how a printed result comes back to `iox-batch query`); `--limit-rows N`
cuts the result at N rows. `--timeout-s N` is the query's wall-time budget (default IOX_QUERY_TIMEOUT_S): past it
the job's Spark jobs are cancelled (`spark_jobs/budget.py`). `--report` gets `{"rows": N}`. Exit status 0 on
success; on failure a one-paragraph `error: ...` on standard error and the error's own status (2 bad input, 124
past its budget, 75 the catalog unreachable...), with nothing published.
"""

import sys

from spark_jobs.job import main

if __name__ == "__main__":
    sys.exit(main("run_plan.py"))
