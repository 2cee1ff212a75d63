# Source me: `source scripts/env.sh`. Puts the project's virtualenv, Airflow settings and Spark settings in the
# shell. Creates nothing by itself; `make demo` or `make test` install the virtualenv first.
_iox_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
export IOX_HOME="$_iox_root"
if [ -f "$_iox_root/.venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$_iox_root/.venv/bin/activate"
else
    echo "iox-batch: no virtualenv yet in $_iox_root/.venv; run 'make demo' or 'make venv' first" >&2
fi
export AIRFLOW_HOME="${AIRFLOW_HOME:-$_iox_root/.iox/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$_iox_root/dags"
# The planner package is installed in the virtualenv; Airflow's plugin loader must not import its modules
# one by one, so Airflow gets a plugins folder of its own.
export AIRFLOW__CORE__PLUGINS_FOLDER="$_iox_root/.iox/airflow/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-2}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$_iox_root/.venv/bin/python}"
# The CLI's queries and the DAGs' Spark steps run on the project's own Spark Connect server (a warm Spark: no JVM
# per command or task), started on the first query or by `iox-batch spark start`, stopped by `iox-batch spark stop`.
# IOX_RUNNER=in-process runs the CLI's Spark in the command's own process instead (and the DAGs' through
# spark-submit); IOX_SPARK_REMOTE=sc://HOST:PORT names another server.
export IOX_RUNNER="${IOX_RUNNER:-connect}"
unset _iox_root
