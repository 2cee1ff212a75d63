"""The Airflow layer of iox-batch, Airflow code only: the Spark operator, the query pipeline's tasks, the DAGs'
Spark connection and Airflow's set-up. What the tasks do is the run domain's (`iox_planner.runs`: requests,
definitions, plan, commit, refresh, settings). The DAG files import this package cheaply at parse time; everything
that touches the catalog or Spark is imported inside tasks."""
