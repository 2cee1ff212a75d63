-- iox-batch catalog, version 1: databases, tables, columns, partitions, chunks (Parquet files and ingester
-- chunks), the chunk order sequence and query runs. Append-only: fix forward in a new numbered file.

CREATE TABLE iox_database (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE iox_table (
    id           BIGSERIAL PRIMARY KEY,
    database_id  BIGINT NOT NULL REFERENCES iox_database (id),
    name         TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (database_id, name)
);

-- One row per column of a table; a name is a tag, a field of one type, or time, never two of these.
CREATE TABLE iox_column (
    id           BIGSERIAL PRIMARY KEY,
    table_id     BIGINT NOT NULL REFERENCES iox_table (id),
    name         TEXT NOT NULL,
    column_type  TEXT NOT NULL CHECK (column_type IN ('tag', 'float', 'integer', 'unsigned', 'boolean', 'string', 'time')),
    UNIQUE (table_id, name)
);

-- One partition per table per UTC day. The sort key is fixed at the first persist (NULL before).
CREATE TABLE iox_partition (
    id             BIGSERIAL PRIMARY KEY,
    table_id       BIGINT NOT NULL REFERENCES iox_table (id),
    partition_key  TEXT NOT NULL CHECK (partition_key ~ '^\d{4}-\d{2}-\d{2}$'),
    sort_key       TEXT[],
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (table_id, partition_key)
);

-- Chunk order: higher = newer. Writes take the next value; scenario loads move it past what they load.
CREATE SEQUENCE iox_chunk_order_seq;

-- Persisted Parquet files: sorted on sort_key, no duplicates. Paths are relative to the store's root.
-- Retired files keep their row (to_delete set) until the grace period ends, so running queries can still read them.
CREATE TABLE iox_parquet_file (
    id             BIGSERIAL PRIMARY KEY,
    object_id      UUID NOT NULL UNIQUE,
    label          TEXT,
    table_id       BIGINT NOT NULL REFERENCES iox_table (id),
    partition_id   BIGINT NOT NULL REFERENCES iox_partition (id),
    store          TEXT NOT NULL,
    path           TEXT NOT NULL,
    min_time       BIGINT NOT NULL,
    max_time       BIGINT NOT NULL,
    row_count      BIGINT NOT NULL,
    file_size      BIGINT NOT NULL,
    column_names   TEXT[] NOT NULL,
    sort_key       TEXT[] NOT NULL,
    tag_ranges     JSONB NOT NULL DEFAULT '{}'::jsonb,
    chunk_order    BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    to_delete      TIMESTAMPTZ,
    CHECK (min_time <= max_time)
);

-- Ingester chunks: unsorted, may hold duplicates; each row keeps its write position (column __seq).
CREATE TABLE iox_ingester_chunk (
    id             BIGSERIAL PRIMARY KEY,
    object_id      UUID NOT NULL UNIQUE,
    label          TEXT,
    table_id       BIGINT NOT NULL REFERENCES iox_table (id),
    partition_id   BIGINT NOT NULL REFERENCES iox_partition (id),
    store          TEXT NOT NULL,
    path           TEXT NOT NULL,
    min_time       BIGINT NOT NULL,
    max_time       BIGINT NOT NULL,
    row_count      BIGINT NOT NULL,
    file_size      BIGINT NOT NULL,
    column_names   TEXT[] NOT NULL,
    tag_ranges     JSONB NOT NULL DEFAULT '{}'::jsonb,
    chunk_order    BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    to_delete      TIMESTAMPTZ,
    CHECK (min_time <= max_time)
);

-- "Chunks of table T overlapping [t0, t1]": a chunk lies inside one day partition, so min_time > t0 - 1 day for
-- every chunk with max_time >= t0, and a range scan on (table_id, min_time) finds them.
CREATE INDEX iox_parquet_file_live_time ON iox_parquet_file (table_id, min_time) WHERE to_delete IS NULL;
CREATE INDEX iox_parquet_file_partition ON iox_parquet_file (partition_id) WHERE to_delete IS NULL;
CREATE INDEX iox_parquet_file_retired ON iox_parquet_file (to_delete) WHERE to_delete IS NOT NULL;
CREATE INDEX iox_ingester_chunk_live_time ON iox_ingester_chunk (table_id, min_time) WHERE to_delete IS NULL;
CREATE INDEX iox_ingester_chunk_partition ON iox_ingester_chunk (partition_id) WHERE to_delete IS NULL;
CREATE INDEX iox_ingester_chunk_retired ON iox_ingester_chunk (to_delete) WHERE to_delete IS NOT NULL;

-- Query runs, recorded by the Airflow DAGs (and the CLI): params, plan, outcome.
CREATE TABLE iox_query_run (
    id              BIGSERIAL PRIMARY KEY,
    database_name   TEXT NOT NULL,
    definition      TEXT,
    dag_id          TEXT,
    run_id          TEXT,
    interval_start  BIGINT,
    interval_end    BIGINT,
    params          JSONB NOT NULL DEFAULT '{}'::jsonb,
    plan            JSONB,
    output          TEXT,
    row_count       BIGINT,
    status          TEXT NOT NULL CHECK (status IN ('running', 'success', 'failed')),
    error           TEXT,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at     TIMESTAMPTZ,
    duration_s      DOUBLE PRECISION
);
CREATE INDEX iox_query_run_definition ON iox_query_run (definition, interval_start);
