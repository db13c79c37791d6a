"""The demo's closing summary, as a person reads it: a table with units, not a Python dict."""

from __future__ import annotations

import re
from typing import Any

from tangram.demo.display import render_summary, render_table

SUMMARY: dict[str, Any] = {
    "nodes": {"node-a": "hgx-h200", "node-b": "h100-nvl-4x2"},
    "claims": 23,
    "allocated": 19,
    "failed": 4,
    "undecided": 0,
    "ready": 19,
    "prepare_failed": 0,
    "released": 19,
    "mig_created": 9,
    "mig_destroyed": 11,
    "mig_destroy_refused": 1,
    "mig_destroy_pending": 0,
    "churn": {"claims": 14, "releases": 8, "mig_created": 7, "mig_destroyed": 5},
    "claim_to_ready_ms": {"p50": 41.25, "p99": 812.5},
    "partition_command_to_applied_ms": {"p50": None, "p99": None},
    "events": {"claim.allocated": 19, "claim.requested": 23},
    "failure_reasons": ["ml/too-big: 0/2 nodes fit", "batch/job-3: no NVLink pair free"],
    "startup_s": 5.2,
    "claims_s": 8.4,
    "duration_s": 13.6,
    "services": {"allocator": 0, "cdi@node-a": 143},
    "clean_shutdown": False,
}


def rows_of(text: str) -> dict[str, str]:
    """label -> rest of the line, for the table's indented rows."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"  (\S+(?: \S+)*?) {2,}(.*)", line)
        if match:
            found[match[1]] = match[2]
    return found


def test_every_value_ends_in_the_same_column() -> None:
    text = render_summary(SUMMARY)
    table = text.split("\nWhy claims failed\n")[0]
    rows = [line for line in table.splitlines() if line.startswith("  ")]
    assert len(rows) >= 25
    value_ends = set()
    for line in rows:
        label_and_value = re.match(r"  .*?\s{2,}(\S+(?: \d+)?)", line)
        assert label_and_value is not None, line
        value_ends.add(label_and_value.end(1))
    assert len(value_ends) == 1, rows


def test_numbers_carry_their_units() -> None:
    rows = rows_of(render_summary(SUMMARY))
    assert rows["start-up"].split()[:2] == ["5.20", "s"]
    assert rows["claims"].split()[:2] == ["8.40", "s"]
    assert rows["submitted"].split() == ["23", "claims"]
    assert rows["failed"].split()[:2] == ["4", "claims"]
    assert rows["created"].split()[:4] == ["9", "instances", "7", "during"]
    assert rows["destroyed"].split()[:4] == ["11", "instances", "5", "during"]
    assert rows["destroy refused"].split() == ["1", "instances"]
    assert rows["claim to ready p50"].split() == ["41.2", "ms"]
    assert rows["claim to ready p99"].split() == ["812.5", "ms"]
    assert rows["partition applied p50"].split()[:2] == ["-", "ms"]  # no command was run
    assert rows["claim.requested"].split() == ["23", "events"]
    assert rows["cdi@node-a"].startswith("exit 143") and "not a clean stop" in rows["cdi@node-a"]
    assert rows["allocator"] == "exit 0"


def test_no_python_structure_is_printed_and_failures_are_listed() -> None:
    text = render_summary(SUMMARY)
    assert not set("{}[]'") & set(text)
    assert text.endswith("Why claims failed\n  ml/too-big: 0/2 nodes fit\n  batch/job-3: no NVLink pair free")


def test_a_summary_without_failures_has_no_failure_section() -> None:
    text = render_summary({**SUMMARY, "failure_reasons": []})
    assert "Why claims failed" not in text


def test_empty_sections_are_left_out() -> None:
    assert render_table([("A", [("x", "1", "s")]), ("B", [])]) == "A\n  x  1  s"
