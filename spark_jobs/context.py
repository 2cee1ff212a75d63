"""What a Spark job's body gets from the one job wrapper (`job.py`): its spec, its plan (query jobs), the session
(built on first use), and where its progress lines go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from iox_planner.spark.jobs import JobSpec


@dataclass
class JobContext:
    """What a job's body gets: its spec, its plan (query jobs), the session (built on first use), and where its
    progress lines go (standard error under spark-submit; the caller's console in its own process)."""

    job: JobSpec
    progress: Callable[[str], None]
    make_session: Callable[[], Any]
    plan: Any = None
    _session: Any = field(default=None, init=False)

    def session(self) -> Any:
        if self._session is None:
            self._session = self.make_session()
        return self._session

    def query_plan(self) -> Any:
        assert self.plan is not None, "only a query job has a plan"
        return self.plan
