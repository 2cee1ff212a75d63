-- iox-batch catalog, version 9: publications on an object store (issue 32). Append-only: fix forward in a new file.

-- An output may be a key on an S3-compatible store under an output root there; its publications are recorded by
-- its URI, `s3://BUCKET/KEY` (never carrying a credential: such a URI is refused before anything is written).
--   fingerprint  of a store file: 'sha256:<size>:<hex>' as a local file's; of a store folder (a Parquet
--                publication): 'manifest:sha256:<hex>', the digest of its manifest, which names every file of it
ALTER TABLE iox_output_publication DROP CONSTRAINT iox_output_publication_path_check;
ALTER TABLE iox_output_publication ADD CONSTRAINT iox_output_publication_path_check
    CHECK (left(path, 1) = '/' OR (left(path, 5) = 's3://' AND position('@' IN path) = 0));
