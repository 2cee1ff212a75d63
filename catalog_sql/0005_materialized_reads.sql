-- iox-batch catalog: what new data arrived, and what each materialized interval read. Append-only: fix forward in
-- a new numbered file.

-- The write log: one row per (write, table, partition) of NEW data, inserted in the write's own transaction by every
-- path that adds data (`iox-batch write`, scenario loads, `register_as` registrations) and never by persist or
-- compaction, which only move data. Live chunks cannot tell late data from moved data: a persisted file takes the
-- highest order of its inputs and the union of their time ranges. No foreign keys: the log outlives a dropped
-- database (iox_database_drop says it went).
--   write_order  an order taken from the database's counter (iox_database_order) in the write's transaction, so
--                it is above the committed counter any reader saw before the write committed (a scenario load
--                with explicit, lower chunk orders takes a fresh one for its events)
--   min_time, max_time  inclusive ns; inside one day partition (the staleness query relies on it)
--   chunks, row_count   what arrived (a registration that only removed rows has row_count 0)
CREATE TABLE iox_write_event (
    id             BIGSERIAL PRIMARY KEY,
    database_id    BIGINT NOT NULL,
    table_name     TEXT NOT NULL,
    partition_key  TEXT NOT NULL CHECK (partition_key ~ '^\d{4}-\d{2}-\d{2}$'),
    write_order    BIGINT NOT NULL,
    min_time       BIGINT NOT NULL,
    max_time       BIGINT NOT NULL,
    chunks         INTEGER NOT NULL CHECK (chunks >= 0),
    row_count      BIGINT NOT NULL CHECK (row_count >= 0),
    source         TEXT NOT NULL CHECK (source IN ('write', 'load', 'register')),
    written_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (min_time <= max_time AND max_time - min_time < 86400000000000)
);
-- "Events of table T overlapping [t0, t1)": an event lies inside one day, so min_time > t0 - 1 day, and a range
-- scan on (database_id, table_name, min_time) finds them; the included columns spare the heap.
CREATE INDEX iox_write_event_time ON iox_write_event (database_id, table_name, min_time)
    INCLUDE (max_time, write_order, row_count, chunks);

-- A dropped database: every interval that read it is stale (database ids are never reused).
CREATE TABLE iox_database_drop (
    database_id    BIGINT PRIMARY KEY,
    database_name  TEXT NOT NULL,
    dropped_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- What the run that produced an interval's current output read: per table, the database's committed order counter
-- in the same snapshot as the plan's chunk list. Replaced in the transaction that publishes the interval, so a run
-- that fails leaves the previous run's rows (and so its stale mark) in place.
CREATE TABLE iox_materialized_read (
    definition      TEXT NOT NULL,
    interval_start  BIGINT NOT NULL,
    interval_end    BIGINT NOT NULL,
    database_id     BIGINT NOT NULL,
    database_name   TEXT NOT NULL,
    table_name      TEXT NOT NULL,
    watermark       BIGINT NOT NULL,
    query_run_id    BIGINT REFERENCES iox_query_run (id) ON DELETE SET NULL,
    recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (definition, interval_start, interval_end, database_id, table_name),
    CHECK (interval_start < interval_end)
);
