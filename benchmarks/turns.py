"""How every benchmark here times its variants: taking turns in each round (`interleaved`), the medians and the
per-round ratios of those rounds, the CPU seconds of a whole process tree, and the load the figures were taken
under. One module that the benchmarks import and that imports none of them."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence


def interleaved(variants: dict[str, Callable[[], Any]], setup: dict[str, Callable[[], None]],
                repeat: int, cpu: Callable[[], float] | None = None) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Each variant's time in each of `repeat` rounds after a warm-up round. The variants take turns in every
    round, in reverse order every other round, so a burst of load on a shared machine, or what one variant leaves
    behind (garbage, a warm cache), hits all of them alike; `setup[name]` runs untimed before it. With `cpu` (a
    clock of CPU seconds), each round also holds each variant's CPU seconds under `"<name> cpu"`."""
    rounds: list[dict[str, float]] = []
    results: dict[str, Any] = {}
    names = list(variants)
    for round_ in range(repeat + 1):
        times: dict[str, float] = {}
        for name in (names if round_ % 2 == 0 else names[::-1]):
            if name in setup:
                setup[name]()
            cpu_started = cpu() if cpu is not None else 0.0
            started = time.perf_counter()
            results[name] = variants[name]()
            times[name] = time.perf_counter() - started
            if cpu is not None:
                times[f"{name} cpu"] = cpu() - cpu_started
        if round_:
            rounds.append(times)
    return rounds, results


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system, with reaped children's) of this process and every process under it: the
    Spark JVM of a local session and its Python workers. On a shared machine a variant's CPU seconds, unlike its
    wall time, do not grow with the other users' load: rows per CPU second is the per-core figure."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in stats:
            # Fields after the name: utime, stime, cutime, cstime are the 12th to 15th.
            total += sum(int(v) for v in stats[pid][11:15]) / ticks
        todo.extend(children.get(pid, []))
    return total


def median_of(rounds: Sequence[Mapping[str, float]], name: str) -> float:
    return statistics.median(r[name] for r in rounds)


def median_ratio(rounds: Sequence[Mapping[str, float]], top: str, bottom: str) -> float:
    """The median over rounds of one round's ratio: the two variants of a round ran back to back, under the same
    load, so their ratio is steadier than a ratio of two separately taken figures."""
    return statistics.median(r[top] / r[bottom] for r in rounds)


def load_report(start: Sequence[float]) -> str:
    """The load average at a benchmark's start (`os.getloadavg()` then) and now: what the figures were taken
    under on a shared machine."""
    end = os.getloadavg()
    return (f"load average (1, 5, 15 min) at the start {start[0]:.1f} {start[1]:.1f} {start[2]:.1f}, at the end "
            f"{end[0]:.1f} {end[1]:.1f} {end[2]:.1f}, {os.cpu_count()} cores")
