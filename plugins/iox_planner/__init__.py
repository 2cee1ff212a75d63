"""iox-batch: batch SQL over IOx-style time-series data lakes (catalog, ingest, planner).

The core of this package imports neither Airflow nor Spark; only the CLI's query-running commands load the
Spark runner.
"""

from __future__ import annotations

__version__ = "0.1.0"
