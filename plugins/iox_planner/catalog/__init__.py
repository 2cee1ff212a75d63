"""The Postgres catalog layer: table definitions and migrations, the Catalog store, the local Postgres,
query-run records and publications. Depends only on the base modules (errors, model, config, timeutil)."""

from __future__ import annotations
