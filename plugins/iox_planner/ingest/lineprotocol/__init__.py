"""InfluxDB line protocol, read as InfluxData's reference reads it, every bad line reported by line and column.

The exact parser (`parser.py`: `parse`, `parse_bytes`, `StreamParser`) hands each line to the fast path for
regular lines (`fast_path.py`) or to the character scanner (`scanner.py`, which states the grammar), over values
(`values.py`), names (`names.py`), units (`precision.py`), limits (`limits.py`) and bad-line reports
(`bad_lines.py`); `decoding.py` makes an input text. The vectorized path for blocks of regular lines
(`vectorized.py`, Arrow and numpy) is imported on its own, so that the exact parser stays light.
"""

from __future__ import annotations

from iox_planner.ingest.lineprotocol.bad_lines import LineError, describe_errors
from iox_planner.ingest.lineprotocol.decoding import BOM, check_text, decode_utf8, skip_bom
from iox_planner.ingest.lineprotocol.limits import Limits
from iox_planner.ingest.lineprotocol.parser import ParseResult, StreamParser, parse, parse_bytes
from iox_planner.ingest.lineprotocol.points import Point
from iox_planner.ingest.lineprotocol.precision import Precision

__all__ = ["BOM", "LineError", "Limits", "ParseResult", "Point", "Precision", "StreamParser", "check_text",
           "decode_utf8", "describe_errors", "parse", "parse_bytes", "skip_bom"]
