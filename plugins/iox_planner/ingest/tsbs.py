"""Seeded TSBS-style `cpu` line protocol for demos and benchmarks, with optional late rewrites of earlier hours.

The shape follows the TSBS devops use case: one `cpu` point per host per interval, ten host tags fixed per host,
ten usage fields, each a random walk clamped to [0, 100]. Output is a pure function of the arguments.

Late rewrites model data that arrives again after the fact (a backfill, a resent batch): the same series and
timestamps as an earlier hour, with some fields changed, some rewritten unchanged and some left out, so that
deduplication has something to merge (a newer row with a missing field must not erase the older value).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from iox_planner.errors import BadInputError
from iox_planner.timeutil import NS_PER_SECOND, format_time

NS_PER_HOUR = 3600 * NS_PER_SECOND
MEASUREMENT = "cpu"

FIELDS = (
    "usage_user",
    "usage_system",
    "usage_idle",
    "usage_nice",
    "usage_iowait",
    "usage_irq",
    "usage_softirq",
    "usage_steal",
    "usage_guest",
    "usage_guest_nice",
)

TAGS = (
    "hostname",
    "region",
    "datacenter",
    "rack",
    "os",
    "arch",
    "team",
    "service",
    "service_version",
    "service_environment",
)

# The value lists of TSBS's devops hosts (pkg/data/usecases/devops/host.go).
_REGIONS: dict[str, tuple[str, ...]] = {
    "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1e"),
    "us-west-1": ("us-west-1a", "us-west-1b"),
    "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c"),
    "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
    "eu-central-1": ("eu-central-1a", "eu-central-1b"),
    "ap-southeast-1": ("ap-southeast-1a", "ap-southeast-1b"),
    "ap-southeast-2": ("ap-southeast-2a", "ap-southeast-2b"),
    "ap-northeast-1": ("ap-northeast-1a", "ap-northeast-1c"),
    "sa-east-1": ("sa-east-1a", "sa-east-1b", "sa-east-1c"),
}
_OS = ("Ubuntu16.10", "Ubuntu16.04LTS", "Ubuntu15.10")
_ARCH = ("x64", "x86")
_TEAMS = ("SF", "NYC", "LON", "CHI")
_ENVIRONMENTS = ("production", "staging", "test")

# Chance per field of a rewritten line: left out, rewritten with a changed value; otherwise rewritten unchanged.
_OMIT = 0.3
_CHANGE = 0.4


@dataclass(frozen=True)
class CpuBatch:
    """One batch of lines: all points of one UTC hour (`hour_start_ns`), or a late rewrite of such an hour.

    `label` is "cpu <hour>" for regular batches and "rewrite <hour>" for rewrites, the hour in RFC 3339.
    Regular batches come first, in time order; rewrites (`rewrite=True`) follow, also in hour order.
    """

    label: str
    rewrite: bool
    hour_start_ns: int
    lines: list[str]

    @property
    def text(self) -> str:
        """The lines as one line protocol text, ready for `lineprotocol.parse`."""
        return "\n".join(self.lines) + "\n"


def host_tags(index: int) -> dict[str, str]:
    """The fixed tags of host `index`: drawn from the TSBS lists by a generator seeded with the index alone, so a
    host keeps its tags whatever the seed and the number of hosts."""
    rng = random.Random(index)
    region = rng.choice(sorted(_REGIONS))
    return {
        "hostname": f"host_{index}",
        "region": region,
        "datacenter": rng.choice(_REGIONS[region]),
        "rack": str(rng.randrange(100)),
        "os": rng.choice(_OS),
        "arch": rng.choice(_ARCH),
        "team": rng.choice(_TEAMS),
        "service": str(rng.randrange(20)),
        "service_version": str(rng.randrange(2)),
        "service_environment": rng.choice(_ENVIRONMENTS),
    }


def _series_head(index: int) -> str:
    # TSBS tag values need no escaping: no spaces, commas or equals signs.
    tags = host_tags(index)
    return MEASUREMENT + "".join(f",{name}={tags[name]}" for name in TAGS)


def _format(value: float) -> str:
    # Three decimals keep lines short; repr of a value in [0, 100] rounded so never uses an exponent.
    return repr(round(value, 3))


def _samples(rng: random.Random, values: list[list[float]], heads: list[str],
             times: range) -> Iterator[tuple[int, str, list[float]]]:
    """Advance every host's walks through `times`, yielding (time, series head, walk) after each step.

    The walk list is updated in place: use it before taking the next sample.
    """
    gauss = rng.gauss
    width = range(len(FIELDS))
    for t in times:
        for head, walk in zip(heads, values):
            for j in width:
                v = walk[j] + gauss(0.0, 1.0)
                walk[j] = 0.0 if v < 0.0 else 100.0 if v > 100.0 else v
            yield t, head, walk


def _regular_lines(samples: Iterator[tuple[int, str, list[float]]]) -> list[str]:
    return [
        f"{head} {','.join(f'{name}={_format(v)}' for name, v in zip(FIELDS, walk))} {t}"
        for t, head, walk in samples
    ]


def _changed(rng: random.Random, value: float) -> float:
    return min(100.0, max(0.0, value + rng.uniform(-10.0, 10.0)))


def _rewrite_lines(samples: Iterator[tuple[int, str, list[float]]], rng: random.Random) -> list[str]:
    lines: list[str] = []
    for t, head, walk in samples:
        parts: list[str] = []
        for name, v in zip(FIELDS, walk):
            r = rng.random()
            if r < _OMIT:
                continue
            parts.append(f"{name}={_format(_changed(rng, v) if r < _OMIT + _CHANGE else v)}")
        if not parts:
            # A point needs at least one field: keep the first one, changed.
            parts.append(f"{FIELDS[0]}={_format(_changed(rng, walk[0]))}")
        lines.append(f"{head} {','.join(parts)} {t}")
    return lines


def _hours(start_ns: int, end_ns: int, interval_ns: int) -> list[range]:
    """The sample times `start_ns + k * interval_ns` in `[start_ns, end_ns)`, cut at UTC hour boundaries."""
    out: list[range] = []
    t = start_ns
    while t < end_ns:
        stop = min((t // NS_PER_HOUR + 1) * NS_PER_HOUR, end_ns)
        count = -(-(stop - t) // interval_ns)
        out.append(range(t, t + count * interval_ns, interval_ns))
        t += count * interval_ns
    return out


def generate_cpu(
    *,
    hosts: int,
    start_ns: int,
    end_ns: int,
    interval_s: int = 10,
    seed: int = 0,
    rewrite_fraction: float = 0.0,
) -> Iterator[CpuBatch]:
    """Yield TSBS-style `cpu` lines for `hosts` hosts, one point per host every `interval_s` seconds in the
    half-open `[start_ns, end_ns)`, as one `CpuBatch` per UTC hour in time order.

    Then, if `rewrite_fraction > 0`, that fraction of the hours (rounded, chosen by the seed) is yielded again as
    rewrite batches: every point of the hour with the same tags and timestamp, each field independently left
    out, rewritten with a changed value, or rewritten unchanged. The regular batches do not depend on
    `rewrite_fraction`. Same arguments, same output.
    """
    if hosts < 1:
        raise BadInputError(f"hosts must be at least 1, not {hosts}")
    if interval_s < 1:
        raise BadInputError(f"interval_s must be at least 1 second, not {interval_s}")
    if start_ns >= end_ns:
        raise BadInputError(f"start_ns {start_ns} must be before end_ns {end_ns} (the range is half-open)")
    if not 0.0 <= rewrite_fraction <= 1.0:
        raise BadInputError(f"rewrite_fraction must be between 0 and 1, not {rewrite_fraction}")

    hours = _hours(start_ns, end_ns, interval_s * NS_PER_SECOND)
    # A separate generator picks the rewrites, so that the regular data is the same whatever the fraction.
    picker = random.Random(f"iox-batch tsbs rewrites {seed}")
    chosen = set(picker.sample(range(len(hours)), round(rewrite_fraction * len(hours))))

    rng = random.Random(seed)
    heads = [_series_head(i) for i in range(hosts)]
    values = [[rng.uniform(0.0, 100.0) for _ in FIELDS] for _ in range(hosts)]

    # Rewrites replay an hour from a snapshot of the generator and walks instead of keeping its values around:
    # a few hundred integers per chosen hour rather than every sample.
    snapshots: dict[int, tuple[tuple[object, ...], list[list[float]]]] = {}
    for index, times in enumerate(hours):
        if index in chosen:
            snapshots[index] = (rng.getstate(), [list(walk) for walk in values])
        lines = _regular_lines(_samples(rng, values, heads, times))
        hour = times.start // NS_PER_HOUR * NS_PER_HOUR
        yield CpuBatch(f"{MEASUREMENT} {format_time(hour)}", False, hour, lines)

    changer = random.Random(f"iox-batch tsbs rewrite values {seed}")
    for index in sorted(snapshots):
        state, walks = snapshots[index]
        replay = random.Random()
        replay.setstate(state)
        times = hours[index]
        lines = _rewrite_lines(_samples(replay, walks, heads, times), changer)
        hour = times.start // NS_PER_HOUR * NS_PER_HOUR
        yield CpuBatch(f"rewrite {format_time(hour)}", True, hour, lines)
