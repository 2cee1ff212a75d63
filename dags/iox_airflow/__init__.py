"""The Airflow layer of iox-batch: settings, the run steps the DAGs call (plan, commit), the Spark operator, and
the materialized-query definitions. The DAG files import this package cheaply at parse time; everything that
touches the catalog or Spark is imported inside tasks."""
