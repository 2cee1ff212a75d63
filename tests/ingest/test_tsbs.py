"""TSBS-style cpu generator: reproducible, the right shape, and parseable by the line protocol parser."""

from __future__ import annotations

import pytest

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import parse
from iox_planner.model import ColumnType
from iox_planner.ingest.tsbs import FIELDS, TAGS, CpuBatch, generate_cpu

HOUR = 3600 * 10**9
START = 1704067200 * 10**9  # 2024-01-01T00:00:00Z


def batches(**kwargs: object) -> list[CpuBatch]:
    args: dict[str, object] = {"hosts": 3, "start_ns": START, "end_ns": START + 2 * HOUR, "seed": 7}
    args.update(kwargs)
    return list(generate_cpu(**args))  # type: ignore[arg-type]


def key(line: str) -> tuple[str, str]:
    """(measurement and tags, timestamp) of a plain TSBS line."""
    head, _, rest = line.partition(" ")
    return head, rest.rpartition(" ")[2]


def test_same_seed_same_output() -> None:
    first = batches(rewrite_fraction=0.5)
    second = batches(rewrite_fraction=0.5)
    assert first == second


def test_other_seed_changes_values_not_keys() -> None:
    a = batches(seed=1)
    b = batches(seed=2)
    assert [b_.lines for b_ in a] != [b_.lines for b_ in b]
    assert [[key(line) for line in batch.lines] for batch in a] == [[key(line) for line in batch.lines] for batch in b]


def test_one_batch_per_hour_with_hosts_times_samples_lines() -> None:
    result = batches()
    assert [(b.label, b.rewrite, b.hour_start_ns, len(b.lines)) for b in result] == [
        ("cpu 2024-01-01T00:00:00Z", False, START, 3 * 360),
        ("cpu 2024-01-01T01:00:00Z", False, START + HOUR, 3 * 360),
    ]
    first = result[0].lines
    assert key(first[0])[1] == "1704067200000000000"
    assert key(first[3])[1] == "1704067210000000000"
    assert key(result[1].lines[-1])[1] == "1704074390000000000"


def test_batches_are_cut_at_utc_hours() -> None:
    # Half past midnight to half past one, every 7 s: times 00:30:00 + 7k s. k = 0..257 fall before 01:00;
    # the first after it is k = 258, 01:00:06; the last is k = 514, 01:29:58.
    result = batches(hosts=1, start_ns=START + HOUR // 2, end_ns=START + 3 * HOUR // 2, interval_s=7)
    assert [(b.hour_start_ns, len(b.lines)) for b in result] == [(START, 258), (START + HOUR, 257)]
    assert key(result[1].lines[0])[1] == "1704070806000000000"


def test_tags_and_fields() -> None:
    line = batches(hosts=1)[0].lines[0]
    point = parse(line, default_time=0).points[0]
    assert point.measurement == "cpu"
    assert tuple(point.tags) == TAGS
    assert point.tags["hostname"] == "host_0"
    assert tuple(point.fields) == FIELDS
    assert FIELDS == (
        "usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait",
        "usage_irq", "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice",
    )


def test_host_tags_are_fixed_per_host() -> None:
    result = parse("".join(b.text for b in batches(hosts=4)), default_time=0)
    seen: dict[str, dict[str, str]] = {}
    for point in result.points:
        seen.setdefault(point.tags["hostname"], dict(point.tags))
        assert dict(point.tags) == seen[point.tags["hostname"]]
    assert sorted(seen) == ["host_0", "host_1", "host_2", "host_3"]
    # A host keeps its tags whatever the number of hosts and the seed.
    other = parse(batches(hosts=1, seed=99)[0].lines[0], default_time=0).points[0]
    assert dict(other.tags) == seen["host_0"]


def test_values_stay_within_0_and_100_and_parse_as_floats() -> None:
    result = parse("".join(b.text for b in batches(hosts=2, end_ns=START + 6 * HOUR)), default_time=0)
    assert result.errors == ()
    assert len(result.points) == 2 * 6 * 360
    values = [value for p in result.points for kind, value in p.fields.values() if kind is ColumnType.FLOAT]
    assert len(values) == 2 * 6 * 360 * 10
    assert all(isinstance(v, float) and 0.0 <= v <= 100.0 for v in values)


def test_rewrites_come_last_and_share_keys_with_earlier_lines() -> None:
    result = batches(end_ns=START + 4 * HOUR, rewrite_fraction=0.5)
    regular = [b for b in result if not b.rewrite]
    rewrites = [b for b in result if b.rewrite]
    assert [b.rewrite for b in result] == [False] * 4 + [True] * 2
    assert all(b.label.startswith("rewrite ") for b in rewrites)
    by_hour = {b.hour_start_ns: b for b in regular}
    omitted = changed = 0
    for batch in rewrites:
        original = by_hour[batch.hour_start_ns]
        assert batch.label == "rewrite " + original.label.removeprefix("cpu ")
        assert [key(line) for line in batch.lines] == [key(line) for line in original.lines]
        for new, old in zip(parse(batch.text, default_time=0).points, parse(original.text, default_time=0).points):
            assert set(new.fields) <= set(old.fields)
            assert new.fields
            omitted += len(old.fields) - len(new.fields)
            changed += sum(new.fields[name] != old.fields[name] for name in new.fields)
    assert omitted > 0
    assert changed > 0


def test_rewrites_parse_together_with_the_regular_data() -> None:
    text = "".join(b.text for b in batches(end_ns=START + 4 * HOUR, rewrite_fraction=0.25))
    result = parse(text, default_time=0)
    assert result.errors == ()
    assert len(result.points) == 3 * 360 * 5


def test_regular_data_does_not_depend_on_the_rewrite_fraction() -> None:
    plain = batches(end_ns=START + 4 * HOUR)
    with_rewrites = batches(end_ns=START + 4 * HOUR, rewrite_fraction=1.0)
    assert [b for b in with_rewrites if not b.rewrite] == plain
    assert len([b for b in with_rewrites if b.rewrite]) == 4


@pytest.mark.parametrize(
    "kwargs",
    [{"hosts": 0}, {"interval_s": 0}, {"end_ns": START}, {"rewrite_fraction": 1.5}, {"rewrite_fraction": -0.1}],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(BadInputError):
        batches(**kwargs)
