"""Writes and scenario loads against the real Postgres catalog and a real warehouse folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest.write import write_line_protocol
from iox_planner.ingest.scenario import load_scenario, parse_scenario

from common_support import catalog_counts, live_chunks, read_rows, warehouse_files

DAY = 86_400_000_000_000
T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z


def write(catalog: Catalog, db: str, text: str, **kw: object) -> object:
    return write_line_protocol(catalog, db, text, **kw)  # type: ignore[arg-type]


# --- write --------------------------------------------------------------------------------------------------


def test_write_registers_one_chunk_per_table_and_day(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, "\n".join([
        f"cpu,host=b,region=eu usage=1.5 {T0 + 10}",
        f"cpu,host=a usage=2.5,count=3i {T0 + 5}",
        f"mem,host=a free=10u {T0 + 7}",
        f"cpu,host=c usage=0.5 {T0 + DAY + 1}",
    ]))
    chunks = live_chunks(catalog, db)
    summary = [(c["kind"], c["table_name"], c["partition_key"], c["min_time"], c["max_time"], c["row_count"])
               for c in chunks]
    assert sorted(summary) == [
        ("ingester", "cpu", "2024-01-01", T0 + 5, T0 + 10, 2),
        ("ingester", "cpu", "2024-01-02", T0 + DAY + 1, T0 + DAY + 1, 1),
        ("ingester", "mem", "2024-01-01", T0 + 7, T0 + 7, 1),
    ]
    by_key = {(c["table_name"], c["partition_key"]): c for c in chunks}
    first = by_key[("cpu", "2024-01-01")]
    assert set(first["column_names"]) == {"host", "region", "usage", "count", "time"}
    assert first["tag_ranges"] == {"host": ["a", "b"], "region": ["eu", "eu"]}
    # One write takes one order per chunk, all distinct and increasing, newer than anything before.
    orders = sorted(c["chunk_order"] for c in chunks)
    assert len(set(orders)) == 3
    write(catalog, db, f"cpu,host=a usage=9 {T0 + 5}")
    newest = live_chunks(catalog, db)[-1]
    assert newest["chunk_order"] > orders[-1]
    # Paths are built from catalog ids, never from names.
    parts = Path(first["path"]).parts
    assert len(parts) == 4 and all(p.isdigit() for p in parts[:3]) and parts[3].endswith(".parquet")
    assert (warehouse / first["path"]).is_file()


def test_ingester_chunk_keeps_rows_exactly_as_written(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m,t=a v=1 {T0}\nm,t=a v=2 {T0}\nm v=3 {T0}\nm,t=a u=18446744073709551615u {T0}")
    (chunk,) = live_chunks(catalog, db)
    rows = read_rows(warehouse / chunk["path"])
    assert rows == [
        {"t": "a", "u": None, "v": 1.0, "time": T0, "__seq": 0},
        {"t": "a", "u": None, "v": 2.0, "time": T0, "__seq": 1},
        {"t": None, "u": None, "v": 3.0, "time": T0, "__seq": 2},
        {"t": "a", "u": 18446744073709551615, "v": None, "time": T0, "__seq": 3},
    ]


def test_field_type_conflict_with_catalog_is_rejected_whole(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m,t=a f=1.5 {T0}")
    before_files, before_rows = warehouse_files(warehouse), catalog_counts(catalog)
    with pytest.raises(BadInputError) as info:
        write(catalog, db, f"m,t=b g=2.5 {T0}\nm,t=c f=3i {T0}")
    message = str(info.value)
    assert "line 2" in message and "float" in message and "integer" in message
    assert "line 1" not in message
    with pytest.raises(BadInputError) as info:
        write(catalog, db, f"m,t=b g=2.5 {T0}\nm,f=x g=1 {T0}")
    message = str(info.value)
    assert "line 2" in message and "tag" in message and "line 1" not in message
    assert warehouse_files(warehouse) == before_files
    assert catalog_counts(catalog) == before_rows


def test_accept_partial_stores_good_lines_and_reports_bad(catalog: Catalog, db: str) -> None:
    write(catalog, db, f"m,t=a f=1.5 {T0}")
    result = write(catalog, db, f"m,t=b f=2.5 {T0}\nm,t=c f=3i {T0}\nbroken line\nm,t=d f=4 {T0}",
                   accept_partial=True)
    assert result.rows == 2  # type: ignore[attr-defined]
    assert sorted(e.line for e in result.rejected) == [2, 3]  # type: ignore[attr-defined]
    assert sum(c["row_count"] for c in live_chunks(catalog, db)) == 3


def test_bad_lines_reject_the_whole_write_listing_every_error(catalog: Catalog, db: str, warehouse: Path) -> None:
    before_files, before_rows = warehouse_files(warehouse), catalog_counts(catalog)
    with pytest.raises(BadInputError) as info:
        write(catalog, db, f"m,t=a f=1 {T0}\nm,t=a\nm,t=a f=1 {T0}\nm f=\"open {T0}")
    message = str(info.value)
    assert "2 bad lines" in message and "line 2" in message and "line 4" in message
    assert warehouse_files(warehouse) == before_files
    assert catalog_counts(catalog) == before_rows


FIRST_NS = -9_223_286_400_000_000_000  # 1677-09-22T00:00:00Z, the first whole day of int64 nanoseconds
LAST_NS = 9_223_286_399_999_999_999   # 2262-04-10T23:59:59.999999999Z, the last
EDGE_LINES = [  # every line of the probes that ended as "bigint out of range", and the nanosecond past each bound
    "m v=1i -9223372036854775808", "m v=1i -9223372036854775807", "m v=1i -9223372036854775000",
    "m v=1i 9223372036854775807", "m v=1i 9223372036854775806",
    f"m v=1i {FIRST_NS - 1}", f"m v=1i {LAST_NS + 1}",
]


@pytest.mark.parametrize("line", EDGE_LINES)
def test_a_time_outside_the_stored_days_is_a_bad_line_in_writes_and_scenarios(
        catalog: Catalog, db: str, warehouse: Path, line: str) -> None:
    """Data lives in UTC day partitions whose first and last nanosecond the catalog stores as bigint: the partial
    days at the ends of int64 (1677-09-21, 2262-04-11) have bounds no bigint holds."""
    before_files, before_rows = warehouse_files(warehouse), catalog_counts(catalog)
    with pytest.raises(BadInputError, match="line 2, column 8: timestamp .* is out of range: data may have times "
                                            "from 1677-09-22T00:00:00Z to 2262-04-10T23:59:59.999999999Z"):
        write(catalog, db, f"m v=1i {T0}\n{line}")
    with pytest.raises(BadInputError, match="chunk A: field `lines`: line 2, column 8: timestamp .* out of range"):
        load_scenario(catalog, parse_scenario({"chunks": [
            {"id": "A", "kind": "ingester", "lines": f"m v=1i {T0}\n{line}"}]}), db)
    assert warehouse_files(warehouse) == before_files
    assert catalog_counts(catalog) == before_rows


@pytest.mark.parametrize("partition", ["1677-09-21", "2262-04-11"])
def test_a_scenario_chunk_in_a_partial_day_of_int64_is_refused(catalog: Catalog, db: str, partition: str) -> None:
    with pytest.raises(BadInputError, match=f"chunk A: field `partition`: partition '{partition}' is outside the "
                                            "days data may have: 1677-09-22 to 2262-04-10"):
        parse_scenario({"chunks": [{"id": "A", "kind": "parquet", "table": "m", "partition": partition,
                                    "columns": {"time": "time", "v": "float"}}]})


def test_the_first_and_last_stored_nanoseconds_are_written(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m v=1i {FIRST_NS}\nm v=2i {LAST_NS}")
    chunks = sorted(live_chunks(catalog, db), key=lambda c: c["min_time"])
    assert [(c["min_time"], c["max_time"]) for c in chunks] == [(FIRST_NS, FIRST_NS), (LAST_NS, LAST_NS)]
    assert [r["time"] for c in chunks for r in read_rows(warehouse / c["path"])] == [FIRST_NS, LAST_NS]


# --- load ---------------------------------------------------------------------------------------------------


def test_load_a_chunk_spanning_two_days(catalog: Catalog, db: str, warehouse: Path) -> None:
    scenario = parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "lines": f"m,t=b v=1 {T0 + 5}\nm,t=a v=2 {T0 + 5}\nm,t=a v=3 {T0 + DAY}"},
        {"id": "I2", "kind": "ingester", "lines": f"m,t=a v=4 {T0 + 5}\nm,t=a v=5 {T0 + 5}"},
    ]})
    name, loaded = load_scenario(catalog, scenario, db)
    assert name == db
    assert [(c.id, c.partition, c.rows, c.order) for c in loaded] == [
        ("F1.1", "2024-01-01", 2, 1), ("F1.2", "2024-01-02", 1, 1), ("I2", "2024-01-01", 2, 2)]
    chunks = {c["label"]: c for c in live_chunks(catalog, db)}
    # A Parquet chunk from lines is deduplicated and sorted like a persisted file; an ingester one is kept as is.
    assert read_rows(warehouse / chunks["F1.1"]["path"]) == [
        {"t": "a", "v": 2.0, "time": T0 + 5}, {"t": "b", "v": 1.0, "time": T0 + 5}]
    assert [r["v"] for r in read_rows(warehouse / chunks["I2"]["path"])] == [4.0, 5.0]
    # Loading more counts orders on from the highest the database holds; the order sequence moved past them.
    _, more = load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "I3", "kind": "ingester", "lines": f"m,t=z v=9 {T0}"}]}), db)
    assert more[0].order == 3
    result = write(catalog, db, f"m,t=y v=1 {T0}")
    assert result.chunks[0].order > 3  # type: ignore[attr-defined]


def test_load_is_all_or_nothing(catalog: Catalog, db: str, warehouse: Path) -> None:
    before_files, before_rows = warehouse_files(warehouse), catalog_counts(catalog)
    scenario = parse_scenario({"chunks": [
        {"id": "A", "kind": "parquet", "lines": f"m,t=a v=1 {T0}"},
        {"id": "B", "kind": "ingester", "lines": f"m,t=a v=1i {T0}"},  # v changes type: refused
    ]})
    with pytest.raises(BadInputError, match="chunk B: .*line 1"):
        load_scenario(catalog, scenario, db)
    assert warehouse_files(warehouse) == before_files
    assert catalog_counts(catalog) == before_rows


@pytest.mark.parametrize(("lines", "words"), [
    (f"__iox_scan_0 v=1 {T0}", "chunk A: field `lines`: line 1, column 1: measurement name '__iox_scan_0' starts "
                               "with '__', which is reserved"),
    (f"m v=1 {T0}\n\\  v=1 {T0}", "chunk A: field `lines`: line 2, column 1: measurement name ' ' is only whitespace"),
    (f"m v=1 {T0}\nm,t=a\u0085 v=2 {T0}", "chunk A: field `lines`: line 2, column 6: the control character U+0085"),
    # A YAML "\ud800" escape makes a lone surrogate, which no UTF-8 (and no Parquet file) can hold.
    (f"m,t=a s=\"x\ud800\" {T0}", "chunk A: field `lines`: it is not Unicode text: line 1, column 11: a lone "
                                   "surrogate U+D800"),
])
def test_a_scenario_follows_the_write_paths_name_rules(catalog: Catalog, db: str, lines: str, words: str) -> None:
    before = catalog_counts(catalog)
    with pytest.raises(BadInputError) as info:
        load_scenario(catalog, parse_scenario({"chunks": [{"id": "A", "kind": "ingester", "lines": lines}]}), db)
    assert words in str(info.value)
    assert catalog_counts(catalog) == before


def test_a_registered_result_follows_the_write_paths_name_rules(catalog: Catalog, db: str) -> None:
    """A materialized result written as a table takes only names a query can use (the rule of `iox-batch write`)."""
    import pyarrow as pa

    from iox_planner.ingest.register import register_interval

    def result(**columns: list[object]) -> pa.Table:
        return pa.table({"time": pa.array([T0 // 1000], pa.timestamp("us", "UTC")),
                         **{k: pa.array(v) for k, v in columns.items()}})

    before = catalog_counts(catalog)
    for table, data, words in [
        ("__iox_scan_0", result(v=[1.0]), "starts with '__'"),
        ("\u3000", result(v=[1.0]), "only whitespace"),
        ("rollup\n", result(v=[1.0]), "a newline"),
        ("rollup", result(**{"a\u2028b": [1.0]}), "a line separator (U+2028)"),
        ("rollup", result(**{"__chunk_order": [1]}), "starts with '__'"),
        ("é" * 2000, result(v=[1.0]), "longer than 2048 bytes"),  # 4000 bytes: the catalog could not index it
    ]:
        with pytest.raises(BadInputError, match=words.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
            register_interval(catalog, db, table, data, tags=[], interval=(T0, T0 + DAY))
    assert catalog_counts(catalog) == before
    ok = register_interval(catalog, db, "sys.cpu", result(**{"host.name": ["a"], "it's `x`": [2.0]}),
                           tags=["host.name"], interval=(T0, T0 + DAY))
    assert ok.rows == 1


def test_load_refuses_duplicate_orders(catalog: Catalog, db: str) -> None:
    scenario = parse_scenario({"chunks": [
        {"id": "A", "kind": "parquet", "order": 4, "lines": f"m,t=a v=1 {T0}"},
        {"id": "B", "kind": "ingester", "order": 4, "lines": f"m,t=a v=2 {T0}"},
    ]})
    with pytest.raises(BadInputError, match="both have order 4"):
        load_scenario(catalog, scenario, db)


def test_tag_ranges_of_dictionary_tags_count_only_the_values_rows_use() -> None:
    import pyarrow as pa

    from iox_planner.ingest.files import tag_ranges
    from iox_planner.model import ColumnType

    # Two chunks with their own dictionaries, each holding values no row uses ("a", "zz"), and a NULL.
    first = pa.DictionaryArray.from_arrays(pa.array([1, None, 2], pa.int32()), pa.array(["a", "m", "q"]))
    second = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["c", "zz"]))
    table = pa.table({"host": pa.chunked_array([first, second]), "empty": pa.array([None] * 5, pa.string())})
    columns = {"host": ColumnType.TAG, "empty": ColumnType.TAG}
    assert tag_ranges(table, columns) == {"host": ("c", "q")}
    assert tag_ranges(table.cast(pa.schema([("host", pa.string()), ("empty", pa.string())])), columns) == {
        "host": ("c", "q")}
