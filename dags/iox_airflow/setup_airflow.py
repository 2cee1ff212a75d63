"""Set up Airflow for this checkout: `make test` and `make demo` run it after `source scripts/env.sh`.

    python dags/iox_airflow/setup_airflow.py [--reserialize]

- Airflow's metadata DB is Airflow's default, a SQLite file in AIRFLOW_HOME (`.iox/airflow/airflow.db` with
  scripts/env.sh): enough for `airflow dags test`. Set AIRFLOW__DATABASE__SQL_ALCHEMY_CONN (and, for Postgres,
  AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC with asyncpg) to use another; docker-compose.yml uses Postgres.
- `airflow db migrate` runs only when needed: a stamp file in AIRFLOW_HOME records the Airflow version and the
  DB it migrated; a missing SQLite file or another version or DB migrates again (about 5 s).
- The plugins folder (kept apart from `plugins/`, see scripts/env.sh) and the output root are created.
- `--reserialize` also writes the DAGs into the metadata DB (a scheduler needs them serialized; a dag-processor
  does it too, `airflow dags test` does not need it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

STAMP = ".iox-db-migrated"


def airflow_env() -> dict[str, str]:
    env = dict(os.environ)
    if "AIRFLOW_HOME" not in env:
        raise SystemExit("AIRFLOW_HOME is not set: run `source scripts/env.sh` first")
    return env


def _airflow(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "airflow"
    return subprocess.run([str(exe), *args], env=airflow_env(), capture_output=True, text=True)


def metadata_url(home: Path) -> str:
    return os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") or f"sqlite:///{home / 'airflow.db'}"


def needs_migration(home: Path) -> bool:
    from importlib.metadata import version

    url = metadata_url(home)
    stamp = home / STAMP
    wanted = hashlib.sha1(f"{version('apache-airflow-core')}\0{url}".encode()).hexdigest()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return True
    return not stamp.exists() or stamp.read_text().strip() != wanted


def mark_migrated(home: Path) -> None:
    from importlib.metadata import version

    wanted = hashlib.sha1(f"{version('apache-airflow-core')}\0{metadata_url(home)}".encode()).hexdigest()
    (home / STAMP).write_text(wanted + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="setup_airflow.py", description=__doc__.splitlines()[0])
    parser.add_argument("--reserialize", action="store_true", help="also serialize the DAGs into the DB")
    args = parser.parse_args(argv)
    env = airflow_env()
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    plugins = env.get("AIRFLOW__CORE__PLUGINS_FOLDER")
    if plugins:
        Path(plugins).mkdir(parents=True, exist_ok=True)
    if needs_migration(home):
        print(f"airflow: migrating the metadata DB in {home}")
        done = _airflow("db", "migrate")
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            print("error: `airflow db migrate` failed (output above)", file=sys.stderr)
            return 1
        mark_migrated(home)
    else:
        print(f"airflow: metadata DB in {home} is up to date")
    if args.reserialize:
        done = _airflow("dags", "reserialize")
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            print("error: `airflow dags reserialize` failed (output above)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
