-- iox-batch catalog, version 2: what the Airflow DAGs need. Append-only: fix forward in a new numbered file.

-- One query-run row per Airflow DAG run: a rerun of the same DAG run (a retry, a cleared task, a backfill that
-- reprocesses it) updates its row with INSERT ... ON CONFLICT instead of adding another. CLI runs (dag_id NULL)
-- are not constrained.
CREATE UNIQUE INDEX iox_query_run_dag_run ON iox_query_run (dag_id, run_id) WHERE dag_id IS NOT NULL;

-- Run locks: at most one run at a time computes a given (definition, interval), so two runs of one interval
-- (a scheduled run and a backfill, two backfills) cannot both publish. A run takes the lock when it plans and
-- checks it, in the same transaction, when it publishes; it releases it when it finishes, whatever the outcome.
-- A lock whose holder died is taken over once it expires, or at once when the holder's query run has finished.
CREATE TABLE iox_run_lock (
    definition      TEXT NOT NULL,
    interval_start  BIGINT NOT NULL,
    interval_end    BIGINT NOT NULL,
    holder          TEXT NOT NULL,
    query_run_id    BIGINT REFERENCES iox_query_run (id) ON DELETE SET NULL,
    acquired_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (definition, interval_start, interval_end),
    CHECK (interval_start < interval_end)
);
