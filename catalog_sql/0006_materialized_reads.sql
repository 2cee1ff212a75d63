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
-- "Events of table T overlapping [t0, t1)": a range scan on (database_id, table_name, min_time) from t0 minus the
-- longest an event can be. Most events (writes) are short, a few (a day's registration, a wide batch) are long:
-- two partial indexes, so the short ones are scanned from t0 - 1 hour and only the few long ones from t0 - 1 day
-- (an event lies inside one day). The included columns spare the heap.
CREATE INDEX iox_write_event_short ON iox_write_event (database_id, table_name, min_time)
    INCLUDE (max_time, write_order, row_count, chunks) WHERE max_time - min_time < 3600000000000;
CREATE INDEX iox_write_event_long ON iox_write_event (database_id, table_name, min_time)
    INCLUDE (max_time, write_order, row_count, chunks) WHERE max_time - min_time >= 3600000000000;

-- The write log summarized per hour: the highest write order of each (database, table, UTC hour) any event
-- overlaps, kept by the same transactions (writes into one database hold its order lock, so these upserts never
-- race). It lets the staleness query test each interval with one short index probe instead of scanning a day of
-- events; only the intervals it flags are then checked, and explained, against the log itself.
CREATE TABLE iox_write_hour (
    database_id  BIGINT NOT NULL,
    table_name   TEXT NOT NULL,
    hour_start   BIGINT NOT NULL CHECK (mod(hour_start, 3600000000000) = 0),
    max_order    BIGINT NOT NULL,
    PRIMARY KEY (database_id, table_name, hour_start)
);

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
