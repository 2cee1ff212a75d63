"""The streamed write path against the exact parser: random line protocol (regular TSBS-like lines mixed with
hostile ones) parsed whole by `lineprotocol.parse`, and in random-sized blocks by `write.parse_blocks` (the
vectorized path where it takes a block, the exact parser elsewhere), must give the same rows per (table, day),
in the same order, with the same types and values, and the same errors.

The uniform-layout branch (every line of a block with the same field keys, read from the bytes) gets its own
inputs: uniform blocks with a few lines changed in ways it must notice, and blocks odd the same way on every line.

`IOX_LP_VECTOR_CASES` sets the number of random inputs (default 40 in CI; a quarter as many uniform ones).
"""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from typing import Any

import pytest

from iox_planner.ingest.blocks import text_blocks
from iox_planner.ingest.lineprotocol import Limits, StreamParser, parse
from iox_planner.ingest.lineprotocol.vectorized import Piece
from iox_planner.ingest.write import parse_blocks
from iox_planner.model import TIME, WRITE_SEQ, ColumnType
from iox_planner.timeutil import partition_of

CASES = int(os.environ.get("IOX_LP_VECTOR_CASES", "40"))
NOW = 1_700_000_000_000_000_000
T0 = 1_704_067_200_000_000_000
DAY = 86_400_000_000_000

# (value text, whether the scalar parser takes it as the column's usual type): hand-picked plain and odd forms.
FLOATS = ["1", "-1.5", ".5", "1.", "1e3", "-2.5E-3", "0.1000000000000000055511151231257827", "00.25",
          "123456789012345678901234567890", "1.7976931348623157e308", "4.9e-324", "1_000", "0x1p4", "+1",
          "1e400", "inf", "NaN", "1e", "-", "--1", ".", "1.2.3"]
INTS = ["0i", "-12i", "9223372036854775807i", "-9223372036854775808i", "9223372036854775808i", "123456789012345678i",
        "+1i", "1.5i", "i"]
UINTS = ["0u", "18446744073709551615u", "18446744073709551616u", "1234567890123456789u", "-1u"]
BOOLS = ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE", "tRue"]
STAMPS = [str(T0), str(T0 + 1), str(T0 + DAY - 1), str(T0 + DAY), "0", "-1", "-0", "0001", "9223372036854775807",
          "9223372036854775808", "-9223372036854775808", "+5", "12a", "1" * 25]


def regular_line(rng: random.Random, host: int, t: int, kinds: dict[str, str]) -> str:
    tags = f"cpu,hostname=host_{host},region=r{host % 3},rack={host % 5}"
    fields = []
    for name, kind in kinds.items():
        if rng.random() < 0.9:
            value = {"f": lambda: repr(round(rng.uniform(-100, 100), rng.randint(0, 17))),
                     "i": lambda: f"{rng.randint(-10**6, 10**6)}i", "u": lambda: f"{rng.randint(0, 10**6)}u",
                     "b": lambda: rng.choice(["t", "false", "True"])}[kind]()
            fields.append(f"{name}={value}")
    if not fields:
        fields.append("usage_user=1")
    return f"{tags} {','.join(fields)} {t}"


# Plain lines (no backslash, quote or C0 control: the fast and vectorized paths see them) with a name a query
# could not use, or a character no name or tag value may hold; and a string whose backslashes stay as written.
ODD_NAMES = ["__iox_scan_0,hostname=h usage_user=1", "__TIME_NS usage_user=1", "cpu,\u00a0=h usage_user=1",
             "cpu,hostname=h \u3000=1", "cpu,hostname=h\u0085 usage_user=1", "\ufeffcpu,hostname=h usage_user=1",
             "cpu,hostname=h usage\u2028user=1", "cpu,hostname=\u009b1m usage_user=1", "cpu,h\u00a0st=h usage_user=1",
             'cpu,hostname=h msg="a\\nb\\tc\\\\d"']


def hostile_line(rng: random.Random, t: int) -> str:
    choice = rng.randint(0, 20)
    if choice == 0:
        return f"cpu,hostname=host\\ 1 usage_user=1 {t}"  # escape
    if choice == 1:
        return f'cpu,hostname=h msg="a\nb",usage_user=2 {t}'  # string spanning lines
    if choice == 2:
        return f"cpu,hostname=h usage_user=3 {t}\r"  # CRLF
    if choice == 3:
        return f"cpu,hostname=h  usage_user=4 {t}"  # double space
    if choice == 4:
        return "cpu,hostname=h usage_user=5"  # no timestamp: now
    if choice == 5:
        return f"cpu,hostname=h usage_user={rng.choice(FLOATS)} {t}"
    if choice == 6:
        return f"cpu,hostname=h count={rng.choice(INTS)} {t}"
    if choice == 7:
        return f"cpu,hostname=h total={rng.choice(UINTS)} {t}"
    if choice == 8:
        return f"cpu,hostname=h up={rng.choice(BOOLS)} {t}"
    if choice == 9:
        return f"cpu,hostname=h usage_user=1 {rng.choice(STAMPS)}"
    if choice == 10:
        return f"cpu,time=x usage_user=1 {t}"  # reserved
    if choice == 11:
        return f"cpu,hostname=h __x=1 {t}"
    if choice == 12:
        return f"cpu,usage_user=tag usage_idle=1 {t}"  # a field name as a tag
    if choice == 13:
        return f"cpu,hostname=h hostname=1 {t}"  # a tag name as a field
    if choice == 14:
        return f"cpu,hostname=h usage_user=1i {t}"  # another type for a float field
    if choice == 15:
        return rng.choice(["", "# a comment", f"#cpu,hostname=h usage_user=9 {t}", " ", "\t", "cpu", "cpu,hostname=h", "cpu usage_user=1,", "=1 2",
                           f"cpu,a=1,a=2 v=1 {t}", f"cpu v=1,v=2 {t}", f"cpu,a= v=1 {t}", f"cpu,=a v=1 {t}"])
    if choice == 16:
        return f"mém,hôte=é val=1.5,n=2i {t}"  # non-ASCII names
    if choice == 17:
        return f"mem,host=a used={rng.randint(0, 99)}u,free={rng.random()!r} {t + rng.choice([0, DAY, -DAY])}"
    if choice == 18:
        return f"cpu,hostname=h usage_user=1 {t} extra"
    if choice == 19:
        return f"{rng.choice(ODD_NAMES)} {t}"
    return f"cpu,hostname=h usage_user=1,usage_user2=x=1 {t}"


def random_text(rng: random.Random) -> str:
    kinds = {"usage_user": "f", "usage_idle": "f", "count": "i", "total": "u", "up": "b"}
    lines = []
    t = T0 + rng.randint(-5, 5) * 3_600_000_000_000
    hostile = rng.choice([0.0, 0.0, 0.01, 0.1, 0.5])
    for _ in range(rng.randint(1, 400)):
        t += rng.choice([0, 1, 10_000_000_000, 3_600_000_000_000])
        if rng.random() < hostile:
            lines.append(hostile_line(rng, t))
        else:
            lines.append(regular_line(rng, rng.randint(0, 20), t, kinds))
    # A byte order mark opens some inputs: skipped at the very start by both paths (and only there).
    return rng.choice(["", "", "", "\ufeff"]) + "\n".join(lines) + rng.choice(["", "\n", "\n\n"])


def _norm(kind: ColumnType, value: Any) -> Any:
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else (kind.value, value.hex())
    return (kind.value, value)


def exact_rows(text: str) -> tuple[dict[tuple[str, str], list[Any]], list[Any]]:
    result = parse(text, default_time=NOW)
    rows: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for p in result.points:
        rows[(p.measurement, partition_of(p.time))].append(
            (tuple(sorted(p.tags.items())), tuple(sorted((k, _norm(t, v)) for k, (t, v) in p.fields.items())), p.time))
    return dict(rows), [(e.line, e.column, e.message) for e in result.errors]


def streamed_rows(text: str, block_bytes: int) -> tuple[dict[tuple[str, str], list[Any]], list[Any], int]:
    parser = StreamParser(default_time=NOW, limits=Limits())
    rows: dict[tuple[str, str], list[Any]] = defaultdict(list)
    vectorized = 0
    for parsed in parse_blocks(text_blocks(text, block_bytes=block_bytes), parser):
        for item in parsed:
            if isinstance(item, Piece):
                vectorized += 1
                tags = [c for c, t in item.columns.items() if t is ColumnType.TAG]
                fields = [c for c, t in item.columns.items() if t.is_field]
                assert item.table[WRITE_SEQ].to_pylist() == list(range(item.table.num_rows))
                for r in item.table.to_pylist():
                    rows[(item.measurement, item.partition)].append((
                        tuple(sorted((k, r[k]) for k in tags if r[k] is not None)),
                        tuple(sorted((k, _norm(item.columns[k], r[k])) for k in fields if r[k] is not None)),
                        r[TIME]))
            else:
                rows[(item.measurement, partition_of(item.time))].append(
                    (tuple(sorted(item.tags.items())),
                     tuple(sorted((k, _norm(t, v)) for k, (t, v) in item.fields.items())), item.time))
    return dict(rows), [(e.line, e.column, e.message) for e in parser.errors], vectorized


@pytest.mark.parametrize("seed", range(CASES))
def test_streamed_equals_exact(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("IOX_LP_MAX_LINE_BYTES", "IOX_LP_MAX_COLUMNS", "IOX_LP_MAX_NAME_BYTES", "IOX_LP_MAX_BAD_LINES"):
        monkeypatch.delenv(var, raising=False)
    rng = random.Random(seed)
    text = random_text(rng)
    want_rows, want_errors = exact_rows(text)
    got_rows, got_errors, _ = streamed_rows(text, rng.choice([64, 1000, 4096, 1 << 20]))
    assert got_errors == want_errors
    assert got_rows == want_rows


def test_the_vectorized_path_is_taken_and_exact_on_regular_input() -> None:
    """Regular input must really go through the vectorized path (else the test above checks one path twice)."""
    rng = random.Random(1)
    kinds = {"usage_user": "f", "count": "i", "total": "u", "up": "b"}
    text = "\n".join(regular_line(rng, h % 50, T0 + h * 1_000_000_000, kinds) for h in range(3000))
    want_rows, want_errors = exact_rows(text)
    got_rows, got_errors, vectorized = streamed_rows(text, 8192)
    assert vectorized > 10 and got_errors == want_errors == [] and got_rows == want_rows


def test_a_string_spanning_blocks_is_carried_over() -> None:
    text = "m v=1 1\n" + 'm s="' + "x\n" * 500 + '" 2\nm v=3 3\n'
    for size in (16, 100, 1000):
        got_rows, got_errors, _ = streamed_rows(text, size)
        assert (got_rows, got_errors) == exact_rows(text)[0:2]
        assert [r[2] for r in got_rows[("m", "1970-01-01")]] == [1, 2, 3]


def test_a_commented_out_line_is_a_comment_on_both_paths() -> None:
    """A line starting with `#` is a comment even when the rest is a regular line (once stored as table `#cpu`)."""
    text = "".join(f"cpu,hostname=h{n % 3} usage_user={n}.5 {T0 + n}\n" for n in range(200))
    text += f"#cpu,hostname=h usage_user=9 {T0 + 500}\n#cpu v=1 {T0 + 501}\n"
    want_rows, want_errors = exact_rows(text)
    assert list(want_rows) == [("cpu", partition_of(T0))] and want_errors == []
    for size in (64, 1 << 20):
        got_rows, got_errors, _ = streamed_rows(text, size)
        assert (got_rows, got_errors) == (want_rows, want_errors)


# --- the uniform-layout branch (`vectorized._uniform_fields`): blocks whose lines all share one field layout ----

UNIFORM_KEYS = ["usage_user", "usage_system", "usage_idle", "n"]


def uniform_line(rng: random.Random, host: int, t: int) -> str:
    values = [repr(round(rng.uniform(-100, 100), rng.randint(0, 6))) for _ in UNIFORM_KEYS[:-1]]
    values.append(rng.choice(["1", "-2.5", "3e2", ".5", "7.", "-0", "0.000001"]))
    body = ",".join(f"{k}={v}" for k, v in zip(UNIFORM_KEYS, values))
    measurement = "cpu" if host % 5 else "disk"  # two tables sharing one field layout in a block
    return f"{measurement},hostname=host_{host},rack={host % 4} {body} {t}"


def mutated_line(rng: random.Random, line: str) -> str:
    """One line of a uniform block changed in a way the uniform branch must notice (or take correctly)."""
    head, body, stamp = line.split(" ")
    items = body.split(",")
    j = rng.randrange(len(items))
    key, _, value = items[j].partition("=")
    choice = rng.randint(0, 15)
    if choice == 0:  # a key of the same length, one byte off
        items[j] = key[:-1] + ("x" if key[-1] != "x" else "y") + "=" + value
    elif choice == 1:  # the same keys in another order
        rng.shuffle(items)
    elif choice == 2:  # delimiters swapped: key,value=key=value
        k2 = (j + 1) % len(items)
        a, b = items[j], items[k2]
        items[j], items[k2] = a.replace("=", ","), b.replace("=", "=", 1)
    elif choice == 3:  # an '=' inside a value, with a field missing so the count still matches
        items = [f"{items[0]}={items[1]}", *items[2:]] if len(items) > 1 else items
    elif choice == 4:
        items[j] = f"{key}="  # empty value
    elif choice == 5:
        items[j] = f"{key}=+{value.lstrip('-')}"  # a leading plus
    elif choice == 6:
        items[j] = f"{key}={rng.choice(['1e400', '-1e999', '1e-400', '0x1p4', '1_0', 'inf', 'NaN', '1e', '--1', '.'])}"
    elif choice == 7:
        items[j] = f"{key}={rng.choice(['1i', '2u', 't', 'false'])}"  # another type in a float column
    elif choice == 8:
        items[j] = f"time={value}"  # a reserved key
    elif choice == 9:
        items[j] = f"{items[0].partition('=')[0]}={value}"  # a key given twice
    elif choice == 10:
        items[j] = f"{key}é={value}"  # a non-ASCII key (another layout)
    elif choice == 11:
        items[j] = f"{key}={value}é"  # a non-ASCII value
    elif choice == 12:
        items.append("extra=1")  # one more field
    elif choice == 13:
        items = items[:-1] or items  # one field less
    elif choice == 14:
        items[j] = f"hostname={value}"  # a tag's name as a field
    else:
        items[j] = f"{key}={value},"  # a trailing comma
    return f"{head} {','.join(items)} {stamp}"


def test_the_uniform_branch_is_taken_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regular input with every field present goes through the uniform branch (counted), rows equal to the exact
    parser's, and a column whose values are all integers (12i) in one block is typed there too."""
    from iox_planner.ingest.lineprotocol import vectorized

    taken = []
    real = vectorized._uniform_fields
    monkeypatch.setattr(vectorized, "_uniform_fields", lambda body, lim: taken.append(real(body, lim)) or taken[-1])
    rng = random.Random(7)
    lines = [uniform_line(rng, h % 30, T0 + h * 1_000_000_000) for h in range(1200)]
    lines += [f"mem,host=h{k % 3} used={k}i,free={k}u,up=t {T0 + k}" for k in range(200)]
    text = "\n".join(lines)
    want_rows, want_errors = exact_rows(text)
    got_rows, got_errors, _ = streamed_rows(text, 8192)
    assert sum(1 for t in taken if t is not None) > 10
    assert got_errors == want_errors == [] and got_rows == want_rows


@pytest.mark.parametrize("seed", range(max(CASES // 4, 1)))
def test_uniform_blocks_with_one_odd_line_equal_exact(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("IOX_LP_MAX_LINE_BYTES", "IOX_LP_MAX_COLUMNS", "IOX_LP_MAX_NAME_BYTES", "IOX_LP_MAX_BAD_LINES"):
        monkeypatch.delenv(var, raising=False)
    rng = random.Random(1000 + seed)
    t = T0 + rng.randint(-5, 5) * 3_600_000_000_000
    lines = []
    for _ in range(rng.randint(50, 400)):
        t += rng.choice([0, 1, 10_000_000_000])
        lines.append(uniform_line(rng, rng.randint(0, 20), t))
    for _ in range(rng.choice([1, 1, 2, 5])):
        at = rng.randrange(len(lines))
        lines[at] = mutated_line(rng, lines[at])
    text = "\n".join(lines) + rng.choice(["", "\n"])
    want_rows, want_errors = exact_rows(text)
    for size in (rng.choice([512, 2048]), 1 << 20):
        got_rows, got_errors, _ = streamed_rows(text, size)
        assert got_errors == want_errors
        assert got_rows == want_rows


def test_arrow_float_cast_agrees_with_the_exact_parser_over_the_float_bytes() -> None:
    """The uniform branch parses float values with one Arrow cast once every byte is one of `0-9 . e E + -` and no
    value starts with '+'. That is right only while Arrow's cast accepts exactly Go's float tokens over those
    bytes, with the same values: checked here against the exact parser on every short token and random long
    ones (a pyarrow upgrade that changes its float parser fails here)."""
    import itertools
    import struct

    import pyarrow as pa
    import pyarrow.compute as pc

    from iox_planner.ingest.lineprotocol.values import parse_float

    rng = random.Random(3)
    tokens = {"".join(p) for n in range(1, 5) for p in itertools.product("09.eE+-", repeat=n)}
    for _ in range(2_000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
        cut = rng.randint(0, len(digits))
        tokens.add(rng.choice(["", "-"]) + digits[:cut] + rng.choice([".", ""]) + digits[cut:]
                   + rng.choice(["", f"e{rng.randint(-400, 400)}", f"E+{rng.randint(0, 30)}", "e-07", "e" + "0" * 25 + "1"]))
        tokens.add("".join(rng.choice("0123456789.eE+-") for _ in range(rng.choice([2, 5, 9, 20]))))
    for token in sorted(tokens):
        if token.startswith("+"):
            continue
        try:
            got = pc.cast(pa.array([token]), pa.float64())[0].as_py()
        except pa.ArrowInvalid:
            got = None
        want = parse_float(token) if token[0] in "-.0123456789" else None
        assert (got is None) == (want is None), token
        if got is not None:
            assert struct.pack("<d", got) == struct.pack("<d", want), token


@pytest.mark.parametrize("body", [
    "a,{v}=b=2",         # delimiters in the wrong order on every line: the first line is no model
    "a={v}=1,b",         # an '=' in a value and a field without one
    "a={v},b=",          # an empty value everywhere
    "a=+{v},b=1",        # a leading plus everywhere
    "a={v}e400,b=1",     # out of range everywhere
    "a={v}i,b={v}u",     # integers and unsigned: typed column by column
    "a=t,b=FALSE",       # booleans
    "a=x{v},b=1",        # no known type
    "a={v},a=1",         # one key twice
    "a={v},time=1",      # a reserved key
    "a={v},__b=1",       # a reserved key
    "a={v},\u00a0=1",    # a key of whitespace only
    "a\u0085={v},b=1",   # a C1 control in a key
])
def test_a_block_odd_the_same_way_on_every_line_equals_exact(body: str) -> None:
    text = "\n".join(f"m,h=h{k % 3} {body.format(v=k + 1)} {T0 + k}" for k in range(300))
    want_rows, want_errors = exact_rows(text)
    for size in (1000, 1 << 20):
        assert streamed_rows(text, size)[:2] == (want_rows, want_errors)


@pytest.mark.parametrize("head", [
    "__iox_scan_0,h=h{v}",   # a measurement the planner reserves
    "__Seq,h=h{v}",          # an internal column's prefix, in another case
    "\u3000,h=h{v}",         # a measurement of whitespace only
    "m,h=h{v}\u0085",        # a C1 control in a tag value
    "m\ufeff,h=h{v}",        # a byte order mark inside a name
    "m,__h=h{v}",            # a reserved tag key
])
def test_a_block_with_an_unusable_name_on_every_line_equals_exact(head: str) -> None:
    text = "\n".join(f"{head.format(v=k % 3)} a={k}.5 {T0 + k}" for k in range(300))
    want_rows, want_errors = exact_rows(text)
    assert want_rows == {} and len(want_errors) == 300
    for size in (1000, 1 << 20):
        assert streamed_rows(text, size)[:2] == (want_rows, want_errors)


def test_a_byte_order_mark_counts_only_at_the_start_of_the_input() -> None:
    """Skipped at the very start by the exact parser and the streamed path alike (not at the start of a later
    block), and refused where a later line starts with one."""
    lines = [f"cpu,hostname=h{k % 3} usage_user={k}.5 {T0 + k}" for k in range(400)]
    text = "\ufeff" + "\n".join(lines) + "\n\ufeff" + lines[0]
    want_rows, want_errors = exact_rows(text)
    assert len(want_rows[("cpu", partition_of(T0))]) == 400
    assert [(line, column) for line, column, _ in want_errors] == [(401, 1)]
    for size in (64, 1000, 1 << 20):
        assert streamed_rows(text, size)[:2] == (want_rows, want_errors)
