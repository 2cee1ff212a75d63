"""A wall-time limit on planning: the query's budget covers planning as well as running.

Planning is pure Python on the caller's thread (sqlglot's analysis, the passes), so no cancellation reaches it the
way one reaches Spark jobs. `deadline(seconds, error)` arms a real-time interval timer: at the deadline SIGALRM
raises `error()` in the main thread, wherever planning is, and again every `REPEAT_S` should something on the way
swallow it, until the block is left; an error that leaves the block after the deadline is the budget's
error (what was raised was the deadline, whatever wrapped it on the way). Only the main thread receives signals: on another thread the block runs
without a limit (the caller's own budget, a Spark job's watchdog or Airflow's execution timeout, still applies).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

REPEAT_S = 1.0


@contextmanager
def deadline(seconds: float, error: Callable[[], BaseException]) -> Iterator[None]:
    """Run the block within `seconds` of wall time; past them, raise `error()` inside it."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield  # a deadline (ours or the caller's) is already armed; a second would disarm it on the way out
        return

    fired = threading.Event()

    def expire(signum: int, frame: Any) -> None:
        fired.set()
        raise error()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    try:
        yield
    except Exception as err:
        if fired.is_set():
            # Code on the way may have wrapped it (sqlglot's tokenizer turns any exception into a TokenError).
            raise error() from err
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
