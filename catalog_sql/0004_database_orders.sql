-- iox-batch catalog, version 4: chunk orders per database. Append-only: fix forward in a new numbered file.

-- Chunk orders were taken from one global sequence, which a scenario could move to 2^63-1: every later write into
-- ANY database then failed. Orders now count per database, so no input of one database can touch another's.
-- The Spark executor packs (order << 32) | write position into one int64, so an order stays below 2^31.
-- A write takes its orders with UPDATE ... RETURNING on its database's row, whose row lock it holds until it
-- commits: two writes into one database commit in the order of their chunk orders (a persist between them can
-- no longer see the newer one without the older one: issue 11).
CREATE TABLE iox_database_order (
    database_id  BIGINT PRIMARY KEY REFERENCES iox_database (id) ON DELETE CASCADE,
    last_order   BIGINT NOT NULL CHECK (last_order >= 0 AND last_order < 2147483648)
);

-- Existing databases continue from the highest order they hold (orders already >= 2^31 cannot be carried over:
-- such a database keeps its data but its counter starts at the bound, so its writes fail until it is reloaded).
INSERT INTO iox_database_order (database_id, last_order)
SELECT d.id, LEAST(GREATEST(
        COALESCE((SELECT max(f.chunk_order) FROM iox_parquet_file f JOIN iox_table t ON t.id = f.table_id
                  WHERE t.database_id = d.id), 0),
        COALESCE((SELECT max(c.chunk_order) FROM iox_ingester_chunk c JOIN iox_table t ON t.id = c.table_id
                  WHERE t.database_id = d.id), 0)), 2147483647)
FROM iox_database d;
