-- iox-batch catalog: which materialized query a registered table belongs to. Append-only: fix forward in a new
-- numbered file.

-- `register_as` may replace the intervals only of a table its own definition registered. The owner used to be
-- inferred from succeeded query runs, but a rerun resets its run row to `running`, so a backfill reprocessing every
-- interval at once found no owner and refused its own table. The owner is now a property of the table, set in the
-- transaction that first registers it and checked in every registering transaction after:
--   registered_by  the materialized query (definition name) whose runs register this table; NULL for a table
--                  ingest created or a registration no definition made (nobody's to replace)
ALTER TABLE iox_table ADD COLUMN registered_by TEXT;

-- Tables registered before this migration: the one definition whose succeeded runs registered them, if exactly
-- one did (the rule the planner applied until now).
UPDATE iox_table t SET registered_by = owners.definition
FROM iox_database d,
     (SELECT params->'register_as'->>'db' AS db, params->'register_as'->>'table' AS tbl,
             min(definition) AS definition, count(DISTINCT definition) AS owners
      FROM iox_query_run
      WHERE status = 'success' AND definition IS NOT NULL AND jsonb_typeof(params->'register_as') = 'object'
      GROUP BY 1, 2) owners
WHERE t.database_id = d.id AND d.name = owners.db AND t.name = owners.tbl AND owners.owners = 1;
