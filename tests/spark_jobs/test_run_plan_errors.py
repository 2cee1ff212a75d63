"""The spark-submit entry points' own input: a plan file that is missing, not JSON or not a plan is one clipped
paragraph and exit status 2 (a bad input, as the CLI exits for one), never a traceback (no Spark session starts: the plan is read first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iox_planner.errors import MAX_MESSAGE_CHARS

ROOT = Path(__file__).resolve().parents[2]

PLANS: dict[str, bytes | None] = {
    "missing": None,
    "not JSON, long": b"{" + b"x" * 200_000,
    "JSON, not a plan, long value": json.dumps({"scans": "A" * 200_000}).encode(),
    "a JSON list": json.dumps(["not", "an", "object"]).encode(),
    "not UTF-8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("script", ["run_plan", "run_parts"])
@pytest.mark.parametrize("name", list(PLANS))
def test_bad_plan_file_is_one_clipped_paragraph(tmp_path: Path, script: str, name: str) -> None:
    plan = tmp_path / "plan.json"
    content = PLANS[name]
    if content is not None:
        plan.write_bytes(content)
    out = tmp_path / "out"
    common = ["--plan", str(plan), "--warehouse", str(tmp_path), "--output", str(out)]
    args = (common + ["--format", "jsonl"] if script == "run_plan"
            else ["part", *common, "--report", str(tmp_path / "report.json")])
    done = subprocess.run([sys.executable, str(ROOT / "spark_jobs" / f"{script}.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("error: --plan ") and "is not a plan iox-batch wrote" in message, message[:500]
    assert "\n" not in message
    assert len(message) <= MAX_MESSAGE_CHARS
    assert not out.exists()
