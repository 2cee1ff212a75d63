"""The one Arrow IOx dedup (`ingest/dedup.py` `deduplicate_table`) on small tables: key order, all-NULL tags,
dictionary-encoded tags."""

from __future__ import annotations


def test_the_arrow_dedup_sorts_on_the_keys_given_and_takes_an_all_null_tag() -> None:
    """Tags are ranked by their sorted dictionary (NULL first), so the merged rows come out in key order; a tag
    whose values are all NULL has an empty dictionary (this broke a query once)."""
    import numpy as np
    import pyarrow as pa

    from iox_planner.ingest.dedup import deduplicate_table

    table = pa.table({"t": pa.array(["b", None, "a", "b", "a"]), "u": pa.array([None] * 5, pa.string()),
                      "time": [2, 1, 1, 1, 1], "f": [1.0, 2.0, 3.0, None, 4.0]})
    merged, _ = deduplicate_table(table, ["t", "u", "time"], np.arange(5))
    assert merged.to_pylist() == [
        {"t": None, "u": None, "time": 1, "f": 2.0}, {"t": "a", "u": None, "time": 1, "f": 4.0},
        {"t": "b", "u": None, "time": 1, "f": None}, {"t": "b", "u": None, "time": 2, "f": 1.0}]
    merged, _ = deduplicate_table(table, ["time", "t", "u"], np.arange(5))
    assert [(r["time"], r["t"]) for r in merged.to_pylist()] == [(1, None), (1, "a"), (1, "b"), (2, "b")]


def test_the_arrow_dedup_treats_a_repeated_dictionary_value_as_one_tag() -> None:
    """A dictionary may hold a value twice (`unify_dictionaries` leaves a single chunk's as it is): the two rows
    below are one key, the later write wins, and the merged row sorts as its value does."""
    import numpy as np
    import pyarrow as pa

    from iox_planner.ingest.dedup import deduplicate_table

    host = pa.DictionaryArray.from_arrays(pa.array([0, 2, 1], pa.int32()), pa.array(["b", "a", "b"]))
    table = pa.table({"host": host, "time": [5, 5, 5], "v": [1, 2, 3]})
    merged, order = deduplicate_table(table, ["host", "time"], np.array([10, 30, 20]))
    assert [(r["host"], r["v"]) for r in merged.to_pylist()] == [("a", 3), ("b", 2)]
    assert order.tolist() == [20, 30]
