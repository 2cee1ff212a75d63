-- iox-batch catalog: the life of data (issue 26): retention periods, dropped tables, reading what changed.
-- Append-only: fix forward in a new numbered file.

-- A database's retention period in nanoseconds (NULL: none, data is kept forever). Queries never return a row
-- whose time is at or before `now - retention_ns` (now fixed when the query is planned), as IOx does; maintenance
-- retires the partitions wholly past it.
ALTER TABLE iox_database ADD COLUMN retention_ns BIGINT CHECK (retention_ns IS NULL OR retention_ns > 0);

-- A dropped table keeps its row (and its columns and partitions) while its retired chunk rows wait out the grace
-- period; only live tables hold a name, so a table of the same name can be created again at once (a new id).
ALTER TABLE iox_table ADD COLUMN dropped_at TIMESTAMPTZ;
ALTER TABLE iox_table DROP CONSTRAINT iox_table_database_id_name_key;
CREATE UNIQUE INDEX iox_table_live_name ON iox_table (database_id, name) WHERE dropped_at IS NULL;

-- A dropped table, like a dropped database (iox_database_drop): every materialized interval that read it with a
-- watermark below drop_order is stale. drop_order is taken from the database's order counter in the dropping
-- transaction, so a run that read a table of the same name created after the drop is not stale by it. No foreign
-- keys: the marker outlives the table's rows.
CREATE TABLE iox_table_drop (
    table_id     BIGINT PRIMARY KEY,
    database_id  BIGINT NOT NULL,
    table_name   TEXT NOT NULL,
    drop_order   BIGINT NOT NULL,
    dropped_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX iox_table_drop_name ON iox_table_drop (database_id, table_name, drop_order);

-- Reading what changed since a watermark (an order of the database's counter) takes the keys whose newest write
-- has a higher order: persisted and compacted files keep each row's write order in the column __write_order.
-- A watermark inside [from_order, to_order) of one of these rows cannot be answered exactly and is refused:
--   upgrade  files persisted before this migration hold no per-row orders (every database counted so far);
--   load     a scenario load gave its chunks explicit orders at or below the counter (data written "in the past").
CREATE TABLE iox_changes_gap (
    id           BIGSERIAL PRIMARY KEY,
    database_id  BIGINT NOT NULL,
    from_order   BIGINT NOT NULL,
    to_order     BIGINT NOT NULL,
    reason       TEXT NOT NULL CHECK (reason IN ('upgrade', 'load')),
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (from_order < to_order)
);
CREATE INDEX iox_changes_gap_database ON iox_changes_gap (database_id, from_order);
INSERT INTO iox_changes_gap (database_id, from_order, to_order, reason)
SELECT database_id, 1, last_order, 'upgrade' FROM iox_database_order WHERE last_order > 1;

-- "What was written into database D after order W": the write log by order.
CREATE INDEX iox_write_event_order ON iox_write_event (database_id, write_order);

-- This catalog's identity: a watermark carries a check over it, so one issued by another catalog is refused.
CREATE TABLE iox_catalog_identity (
    singleton   BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    catalog_id  UUID NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO iox_catalog_identity DEFAULT VALUES;

-- The watermark a changes read handed on, recorded with its run (NULL for every other run).
ALTER TABLE iox_query_run ADD COLUMN changes_watermark TEXT;
