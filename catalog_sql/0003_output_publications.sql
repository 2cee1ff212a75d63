-- iox-batch catalog, version 3: what each publication wrote. Append-only: fix forward in a new numbered file.

-- An output path is only ever replaced when the thing at it still matches the latest row recorded for it here.
-- A marker file inside the output proved nothing (a query's own output, or anyone, could plant one); this table
-- sits where a query's output cannot write. Rows are only ever added: the newest row of a path is the current one.
--   path         the fully resolved path (symlinks followed) that was published
--   kind         'file' (csv, jsonl, arrow) or 'folder' (parquet)
--   fingerprint  'sha256:<size>:<hex>' for a file; for a folder 'stat:<hex>', a digest of every entry's
--                relative name, type, size, inode, mtime and ctime (see output.py: why ctime)
--   run          who published: 'cli:<user>@<host>:<pid>' or an Airflow '<dag id>/<run id>'
CREATE TABLE iox_output_publication (
    id            BIGSERIAL PRIMARY KEY,
    path          TEXT NOT NULL CHECK (left(path, 1) = '/'),
    kind          TEXT NOT NULL CHECK (kind IN ('file', 'folder')),
    fingerprint   TEXT NOT NULL,
    run           TEXT NOT NULL,
    published_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX iox_output_publication_path ON iox_output_publication (path, id);
