"""InfluxDB line protocol: the exact parser (`parser.py`) and the vectorized path for regular blocks
(`vectorized.py`)."""

from __future__ import annotations

from iox_planner.ingest.lineprotocol.parser import (BOM, LineError, Limits, ParseResult, Point, Precision,
                                                    StreamParser, check_text, decode_utf8, describe_errors, parse,
                                                    parse_bytes, skip_bom)

__all__ = ["BOM", "LineError", "Limits", "ParseResult", "Point", "Precision", "StreamParser", "check_text",
           "decode_utf8", "describe_errors", "parse", "parse_bytes", "skip_bom"]
