"""Line protocol parse speed on TSBS-style cpu lines: `python benchmarks/bench_lineprotocol.py [LINES] [ROUNDS]`.

Prints lines per second of `lineprotocol.parse` (best of ROUNDS) over LINES generated lines (default 200,000),
as text and as bytes (the path `iox-batch write` takes: strict UTF-8 decoding included). Time is the process's
CPU time, which other work on a shared machine disturbs less than the wall clock."""

from __future__ import annotations

import sys
import time

from iox_planner.ingest import lineprotocol
from iox_planner.ingest.tsbs import generate_cpu

START = 1_704_067_200_000_000_000
HOUR = 3_600_000_000_000


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    lines: list[str] = []
    hours = 1
    while len(lines) < count:
        lines = [ln for batch in generate_cpu(hosts=200, start_ns=START, end_ns=START + hours * HOUR)
                 for ln in batch.lines]
        hours += 1
    text = "\n".join(lines[:count]) + "\n"
    data = text.encode()
    inputs: list[tuple[str, str | bytes]] = [("text", text)]
    inputs.append(("bytes", data))
    for name, payload in inputs:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.process_time()
            if isinstance(payload, bytes):
                result = lineprotocol.parse_bytes(payload, default_time=0)
            else:
                result = lineprotocol.parse(payload, default_time=0)
            best = min(best, time.process_time() - t0)
            assert not result.errors and len(result.points) == count
        print(f"{name}: {count:,} lines ({len(data) / 1e6:.1f} MB) in {best:.3f} s: {count / best:,.0f} lines/s")


if __name__ == "__main__":
    main()
