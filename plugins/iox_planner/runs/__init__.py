"""The run domain: what a query run computes (`request`), materialized definitions (`definitions`), the run's
staging folder (`staging`), its lifecycle (`planning`, `commit`, `failure`: plan, publish, record a failure) and
refreshing stale intervals (`refresh`), with the settings they read (`settings`). No Airflow import: the DAGs and
the `iox-batch materialized` commands both call these, and never each other."""
