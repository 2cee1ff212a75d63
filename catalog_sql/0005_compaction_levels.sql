-- iox-batch catalog, version 5: compaction levels. Append-only: fix forward in a new numbered file.

-- Each Parquet file's compaction level, as in IOx: 0 when written by persist (or loaded; may overlap anything in
-- its partition), 1 when written by hot compaction (no two live L1 files of a partition overlap in time), 2 when
-- written by cold compaction (large; no two live L2 files of a partition overlap in time). Existing files were all
-- written by persist or a scenario load: level 0.
ALTER TABLE iox_parquet_file
    ADD COLUMN compaction_level SMALLINT NOT NULL DEFAULT 0 CHECK (compaction_level IN (0, 1, 2));

-- Finding work: "partitions with two or more live L0 files" and "the live files of one level in a partition" are
-- range scans on this index instead of reading every live file of a database.
CREATE INDEX iox_parquet_file_level ON iox_parquet_file (compaction_level, partition_id) WHERE to_delete IS NULL;
