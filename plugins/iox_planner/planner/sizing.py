"""Which arguments of the allowed functions set the size of what a call builds, and how each is bounded.

Every function of `functions.ALLOWED` is classified here, once (a test fails until a new one is):
- `UNSIZED`: no argument sets a size; what the call builds is at most a small multiple of its inputs (`concat`,
  `overlay`, `elt`, `to_char`, `mask`...), a fixed size (`bitmap_construct_agg`: 4 KiB), or grows with the rows,
  not with an argument (`collect_list`, `string_agg`: bounded by the budget and Spark's memory, not here);
- `SIZED`: the argument positions that set a size, and how they are bounded:
  - `GUARDED`: a constant is checked when planning, within `IOX_MAX_SQL_ALLOC`; a size computed from the data gets
    a guard spliced around it (`sql/guards.py`) that fails the query with one paragraph past the same limit;
  - `CONSTANT`: the size must be a constant the planner computes (Spark also wants a constant there), and what it
    builds (`measure`) stays within `IOX_MAX_SQL_ALLOC`;
  - `LITERAL`: one string literal whose widths the planner adds up (`format_string`'s format).

Spark's own bounds, where they are tighter, stay in force (`hll_sketch_agg`'s lgConfigK 4 to 21, KLL's k 8 to
65,535, `approx_top_k`'s 1,000,000 items, lgNomEntries 4 to 26); the measures below bound what Spark allows.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence


class Bound(enum.Enum):
    GUARDED = "a constant checked when planning, a size from the data guarded at run time"
    CONSTANT = "a constant, checked when planning"
    LITERAL = "one string literal, checked when planning"


Values = Sequence[float | None]
"""The sized arguments' constant values, in the order of `Sized.positions` (None: not given)."""


def _count(values: Values) -> float:
    return abs(values[0] or 0.0)


def _power_of_two(values: Values) -> float:
    """Sketches sized by a log-base-2 argument (lgConfigK, lgNomEntries) hold 2^n entries."""
    return float(2.0 ** min(abs(values[0] or 0.0), 64.0))


def _count_min(values: Values) -> float:
    """Spark's CountMinSketchImpl: a table of depth x width longs, width = ceil(2 / eps) and depth =
    ceil(-ln(1 - confidence) / ln 2)."""
    eps, confidence = values[0], values[1]
    if eps is None or confidence is None or eps <= 0 or not 0 < confidence < 1:
        return 0  # Spark refuses these itself, before building anything
    return math.ceil(2 / eps) * math.ceil(-math.log(1 - confidence) / math.log(2))


def _relative_sd(values: Values) -> float:
    """HyperLogLog++ (approx_count_distinct): 2^p registers, p = ceil(2 log2(1.106 / relativeSD))."""
    sd = values[0]
    if sd is None or sd <= 0:
        return 0
    return float(2.0 ** min(math.ceil(2 * math.log2(1.106 / sd)), 64))


@dataclass(frozen=True)
class Sized:
    bound: Bound
    positions: tuple[int, ...]
    """The 0-based argument positions that set the size."""
    what: str
    """What the size counts, for the error message."""
    measure: Callable[[Values], float] = _count
    """What the call builds, from the sized arguments' constant values."""


_COUNT = "characters or elements"
_LENGTH = "characters"


def _guarded(position: int, what: str = _COUNT) -> Sized:
    return Sized(Bound.GUARDED, (position,), what)


def _constant(position: int, what: str, measure: Callable[[Values], float] = _count) -> Sized:
    return Sized(Bound.CONSTANT, (position,), what, measure)


_LG_NOM = "sketch entries (2^lgNomEntries)"

SIZED: dict[str, Sized] = {
    # the value built is that count (or width) of characters or elements
    "repeat": _guarded(1),
    "space": _guarded(0, _LENGTH),
    "lpad": _guarded(1, _LENGTH),
    "rpad": _guarded(1, _LENGTH),
    "array_repeat": _guarded(1),
    # a position past the end pads the array with NULLs up to it
    "array_insert": _guarded(1),
    # the count of (stop - start) / step + 1: constant bounds are counted when planning (refusals.py), integer
    # bounds from the data guarded (guards.py), anything else refused
    "sequence": Sized(Bound.GUARDED, (0, 1, 2), _COUNT),
    "randstr": _constant(0, _LENGTH),
    "format_number": _constant(1, "digits"),
    "format_string": Sized(Bound.LITERAL, (0,), _LENGTH),
    "printf": Sized(Bound.LITERAL, (0,), _LENGTH),
    "count_min_sketch": Sized(Bound.CONSTANT, (1, 2), "sketch cells (depth x width)", _count_min),
    "histogram_numeric": _constant(1, "histogram bins"),
    "approx_percentile": _constant(2, "summary entries (accuracy)"),
    "percentile_approx": _constant(2, "summary entries (accuracy)"),
    "approx_count_distinct": _constant(1, "HyperLogLog registers", _relative_sd),
    "hll_sketch_agg": _constant(1, "sketch registers (2^lgConfigK)", _power_of_two),
    **{f"kll_sketch_agg_{t}": _constant(1, "KLL items (k)") for t in ("bigint", "double", "float")},
    **{f"kll_merge_agg_{t}": _constant(1, "KLL items (k)") for t in ("bigint", "double", "float")},
    "theta_sketch_agg": _constant(1, _LG_NOM, _power_of_two),
    "theta_union_agg": _constant(1, _LG_NOM, _power_of_two),
    "theta_union": _constant(2, _LG_NOM, _power_of_two),
    **{f"tuple_sketch_agg_{t}": _constant(2, _LG_NOM, _power_of_two) for t in ("double", "integer")},
    **{f"tuple_union_agg_{t}": _constant(1, _LG_NOM, _power_of_two) for t in ("double", "integer")},
    **{f"tuple_union_{t}": _constant(2, _LG_NOM, _power_of_two) for t in ("double", "integer")},
    **{f"tuple_union_theta_{t}": _constant(2, _LG_NOM, _power_of_two) for t in ("double", "integer")},
    "approx_top_k": Sized(Bound.CONSTANT, (1, 2), "tracked items", lambda v: max(abs(x or 0) for x in v)),
    "approx_top_k_accumulate": _constant(1, "tracked items"),
    "approx_top_k_combine": _constant(1, "tracked items"),
    "approx_top_k_estimate": _constant(1, "items"),
}

UNSIZED = frozenset(
    """
    abs acos acosh add_months aes_decrypt aes_encrypt aggregate and any any_value array array_agg array_append
    array_compact array_contains array_distinct array_except array_intersect array_join array_max array_min
    array_position array_prepend array_remove array_size array_sort array_union arrays_overlap arrays_zip ascii
    asin asinh atan atan2 atanh avg base64 between bigint bin binary bit_and bit_count bit_get bit_length bit_or
    bit_xor bitmap_and_agg bitmap_bit_position bitmap_bucket_number bitmap_construct_agg bitmap_count
    bitmap_or_agg bool_and bool_or boolean bround btrim cardinality case cast cbrt ceil ceiling char char_length
    character_length chr coalesce collate collation collect_list collect_set collect_union concat concat_ws
    contains conv convert_timezone corr cos cosh cot count count_if counter_diff covar_pop covar_samp crc32 csc
    cume_dist curdate current_date current_time current_timestamp date date_add date_diff date_format
    date_from_unix_date date_part date_sub date_trunc dateadd datediff datepart day dayname dayofmonth dayofweek
    dayofyear decimal decode degrees dense_rank div double e element_at elt encode endswith equal_null every
    exists exp explode explode_outer expm1 extract factorial filter find_in_set first first_value flatten float
    floor forall from_base32 from_csv from_json from_unixtime from_utc_timestamp get get_json_object getbit
    greatest grouping grouping_id hash hex hll_sketch_estimate hll_union hll_union_agg hmac hour hypot if ifnull
    ilike in initcap inline inline_outer instr int is_valid_utf8 is_valid_variant is_variant_null isnan isnotnull
    isnull jaro_winkler_similarity json_array_length json_object_keys json_tuple kll_sketch_get_n_bigint
    kll_sketch_get_n_double kll_sketch_get_n_float kll_sketch_get_quantile_bigint kll_sketch_get_quantile_double
    kll_sketch_get_quantile_float kll_sketch_get_rank_bigint kll_sketch_get_rank_double kll_sketch_get_rank_float
    kll_sketch_merge_bigint kll_sketch_merge_double kll_sketch_merge_float kll_sketch_to_string_bigint
    kll_sketch_to_string_double kll_sketch_to_string_float kurtosis lag last last_day last_value lcase lead least
    left len length levenshtein like listagg ln localtime localtimestamp locate log log10 log1p log2 lower ltrim
    luhn_check make_date make_dt_interval make_interval make_time make_timestamp make_timestamp_ltz
    make_timestamp_ntz make_valid_utf8 make_ym_interval map map_concat map_contains_key map_entries map_filter
    map_from_arrays map_from_entries map_keys map_values map_zip_with mask max max_by md5 mean median min min_by
    minute mod mode month monthname months_between named_struct nanvl negative next_day not now nth_value ntile
    nullif nullifzero nvl nvl2 octet_length or overlay parse_json parse_url percent_rank percentile
    percentile_cont percentile_disc pi pmod posexplode posexplode_outer position positive pow power quarter quote
    radians rand randn random rank reduce regexp regexp_count regexp_extract regexp_extract_all regexp_instr
    regexp_like regexp_replace regexp_substr regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope
    regr_sxx regr_sxy regr_syy replace reverse right rint rlike round row_number rtrim schema_of_csv
    schema_of_json schema_of_variant schema_of_variant_agg sec second sentences session_window sha sha1 sha2
    shiftleft shiftright shiftrightunsigned shuffle sign signum sin sinh size skewness slice smallint some
    sort_array soundex split split_part sqrt st_asbinary st_geogfromwkb st_geomfromwkb st_setsrid st_srid stack
    startswith std stddev stddev_pop stddev_samp str_to_map string string_agg struct substr substring
    substring_index sum tan tanh theta_difference theta_intersection theta_intersection_agg theta_sketch_estimate
    time time_bucket time_diff time_from_micros time_from_millis time_from_seconds time_to_micros time_to_millis
    time_to_seconds time_trunc timestamp timestamp_micros timestamp_millis timestamp_nanos timestamp_seconds
    tinyint to_base32 to_binary to_char to_csv to_date to_json to_number to_time to_timestamp to_timestamp_ltz
    to_timestamp_ntz to_unix_timestamp to_utc_timestamp to_varchar to_variant_object transform transform_keys
    transform_values translate trim trunc try_add try_aes_decrypt try_avg try_divide try_element_at
    try_make_interval try_make_timestamp try_make_timestamp_ltz try_make_timestamp_ntz try_mod try_multiply
    try_parse_json try_parse_url try_subtract try_sum try_to_binary try_to_date try_to_number try_to_time
    try_to_timestamp try_url_decode try_validate_utf8 try_variant_array_append try_variant_get try_variant_insert
    try_variant_set tuple_difference_double tuple_difference_integer tuple_difference_theta_double
    tuple_difference_theta_integer tuple_intersection_agg_double tuple_intersection_agg_integer
    tuple_intersection_double tuple_intersection_integer tuple_intersection_theta_double
    tuple_intersection_theta_integer tuple_sketch_estimate_double tuple_sketch_estimate_integer
    tuple_sketch_summary_double tuple_sketch_summary_integer tuple_sketch_theta_double tuple_sketch_theta_integer
    typeof ucase unbase64 unhex uniform unix_date unix_micros unix_millis unix_nanos unix_seconds unix_timestamp
    upper url_decode url_encode uuid validate_utf8 var_pop var_samp variance variant_array_append variant_delete
    variant_explode variant_explode_outer variant_get variant_insert variant_set variant_strip_nulls vector_avg
    vector_cosine_similarity vector_inner_product vector_l2_distance vector_norm vector_normalize vector_sum
    weekday weekofyear when width_bucket window window_time xxhash64 year zeroifnull zip_with
    """.split()
)
"""Allowed functions no argument of which sets the size of what they build (see the module's docstring)."""

assert not UNSIZED & SIZED.keys()
