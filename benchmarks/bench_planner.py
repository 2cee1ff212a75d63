"""Planner benchmark: plan one table of N chunks over N/100 day partitions, for N = 10,000 and 100,000.

Targets (issue 3): 100,000 chunks over 1,000 partitions planned in at most 1 s, and at most 13 times the time of
10,000 chunks (n log n gives 12.5). Run `python benchmarks/bench_planner.py` from the repository root.

Two shapes of table, 100 chunks per day partition:
- `typical`: what IOx's compactor leaves behind. Every partition holds disjoint compacted files; one partition in
  ten also holds two fresh files of late data, each over three compacted files; the two newest partitions hold
  three fresh files and an ingester chunk.
- `overlap`: every partition is like the newest ones (3 fresh files and an ingester chunk), so 4,000 dedups at
  100,000 chunks: a harder case, reported too.
Times are the best of several runs, wall clock and CPU (this machine may be shared: CPU time is the steadier).
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from iox_planner.model import Chunk, ChunkKind, ColumnType, StaticSource  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402
from iox_planner.timeutil import NS_PER_DAY, partition_of  # noqa: E402

COLUMNS = {"host": ColumnType.TAG, "region": ColumnType.TAG, "usage_user": ColumnType.FLOAT,
           "usage_system": ColumnType.FLOAT, "time": ColumnType.TIME}
QUERY = "SELECT host, avg(usage_user) FROM cpu WHERE region = 'eu' AND usage_system > 10 GROUP BY host"
START = 1_704_067_200 * 1_000_000_000  # 2024-01-01T00:00:00Z


def day_chunks(day: int, per_day: int, fresh: int, ingester: bool, order: list[int]) -> list[Chunk]:
    """One day: compacted disjoint files, `fresh` files each over three of them, maybe an ingester chunk."""
    base = START + day * NS_PER_DAY
    partition = partition_of(base)
    compacted = per_day - fresh - int(ingester)
    span = NS_PER_DAY // compacted
    out: list[Chunk] = []

    def add(kind: ChunkKind, lo: int, hi: int) -> None:
        order[0] += 1
        out.append(Chunk(f"c{order[0]}", kind, "cpu", partition, order[0], lo, hi, COLUMNS, rows=1000))

    for i in range(compacted):
        add(ChunkKind.PARQUET, base + i * span, base + (i + 1) * span - 1)
    for j in range(fresh):
        lo = base + (10 + 20 * j) * span + span // 2
        add(ChunkKind.PARQUET, lo, lo + 2 * span)
    if ingester:
        add(ChunkKind.INGESTER, base + (compacted - 1) * span, base + NS_PER_DAY - 1)
    return out


def source(chunks: int, shape: str) -> StaticSource:
    partitions = chunks // 100
    order = [0]
    out: list[Chunk] = []
    for day in range(partitions):
        if shape == "overlap" or day >= partitions - 2:
            out.extend(day_chunks(day, 100, 3, True, order))
        elif day % 10 == 5:
            out.extend(day_chunks(day, 100, 2, False, order))
        else:
            out.extend(day_chunks(day, 100, 0, False, order))
    return StaticSource(tuple(out))


def measure(chunks: int, shape: str, repeat: int) -> tuple[float, float, int, int]:
    """Best wall-clock and CPU seconds over `repeat` runs, the plan's size and its number of dedups."""
    src = source(chunks, shape)
    walls, cpus = [], []
    for _ in range(repeat):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        plan = plan_query(QUERY, src, now_ns=START)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    nodes = [n for tree in plan.children for n in tree.walk()]
    return min(walls), min(cpus), len(nodes), sum(1 for n in nodes if n.name == "DeduplicateExec")


def reference_loop() -> float:
    """CPU seconds of a fixed pure-Python loop, to compare machines."""
    start, x = time.process_time(), 0
    for i in range(5_000_000):
        x += i
    return time.process_time() - start


def main() -> None:
    print(f"{'shape':>8} {'chunks':>8} {'partitions':>10} {'wall (s)':>9} {'cpu (s)':>8} {'nodes':>6} {'dedups':>6}")
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for shape in ("typical", "overlap"):
        for chunks in (10_000, 100_000):
            wall, cpu, nodes, dedups = measure(chunks, shape, repeat=7 if chunks <= 10_000 else 5)
            results[shape, chunks] = (wall, cpu)
            print(f"{shape:>8} {chunks:>8} {chunks // 100:>10} {wall:>9.3f} {cpu:>8.3f} {nodes:>6} {dedups:>6}")
    for shape in ("typical", "overlap"):
        (w1, c1), (w2, c2) = results[shape, 10_000], results[shape, 100_000]
        print(f"{shape}: 100,000 chunks in {w2:.3f} s wall / {c2:.3f} s cpu (target <= 1 s); "
              f"100,000 / 10,000 = {w2 / w1:.2f} wall / {c2 / c1:.2f} cpu (target <= 13)")
    print(f"reference: a 5,000,000-step Python loop takes {reference_loop():.3f} s cpu on this machine")


if __name__ == "__main__":
    main()
