"""Runs the commit step (iox_planner.runs.commit `commit`) for one prepared run, as the DAGs' commit task would,
in a process of its own that the fault tests kill (or whose Postgres they restart). Exit status as the CLI's: 0,
1 for a failed run, 75 when it failed because the catalog was unreachable. Argument: a JSON spec (request, run
identity, handle); a request without `register_table` publishes only the output."""

from __future__ import annotations

import json
import sys

from iox_planner.errors import RunFailed
from iox_planner.output import OutputFormat, destination_of
from iox_planner.runs.commit import commit
from iox_planner.runs.request import QueryRequest, RegisterAs
from iox_planner.runs.staging import RunIdentity


def main() -> int:
    spec = json.loads(sys.argv[1])
    r = spec["request"]
    request = QueryRequest(db=r["db"], sql=r["sql"], output=destination_of(r["output"]),
                           format=OutputFormat(r["format"]),
                           time_start=r["time_start"], time_end=r["time_end"], definition=r["definition"],
                           register_as=(RegisterAs(r["register_table"], tuple(r["register_tags"]))
                                        if r.get("register_table") else None))
    try:
        outcome = commit(request, RunIdentity(spec["dag_id"], spec["run_id"]), spec["handle"])
    except RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code  # 75: the catalog was unreachable (the retryable error)
    print(json.dumps({"rows": outcome.rows, "registered": outcome.registered}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
