"""A recorded demo run, replayed offline: zero divergences, an altered decision found, claims explained."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def tangram(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tangram.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("demo") / "demo.tlog.gz"
    run = tangram("demo", "--duration", "3", "--json", "--record", str(path), timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    yield path


def read_lines(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as source:
        return [json.loads(line) for line in source]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)


def decisions(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        line
        for line in lines[1:]
        if line["stream"] == "TANGRAM_CLAIMS"
        and line["payload"]["type"] in ("claim.allocated", "claim.failed")
    ]


def test_the_record_is_a_portable_log_of_the_three_streams(recorded: Path) -> None:
    lines = read_lines(recorded)
    header = lines[0]
    assert header["format"] == "tangram-log" and header["format_version"] == 1
    assert header["tangram_version"] == "0.1.0"
    assert {s["name"] for s in header["streams"]} == {"TANGRAM_INVENTORY", "TANGRAM_CLAIMS", "TANGRAM_NODES"}
    records = lines[1:]
    assert {r["subject"] for r in records if r["stream"] == "TANGRAM_INVENTORY"} == {
        "tangram.inventory.node-a",
        "tangram.inventory.node-b",
    }
    claims = [r["seq"] for r in records if r["stream"] == "TANGRAM_CLAIMS"]
    assert claims == sorted(claims) and len(claims) == len(set(claims))
    assert any(r["subject"].startswith("tangram.node.node-a.partition.") for r in records)


def test_replaying_a_demo_run_finds_no_divergence(recorded: Path) -> None:
    run = tangram("replay", str(recorded), "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["divergences"] == []
    # Every claim the demo submitted was decided again: as many as the log holds decisions for.
    assert report["claims_decided"] == len({d["payload"]["uid"] for d in decisions(read_lines(recorded))})
    assert report["claims_decided"] >= 5
    text = tangram("replay", str(recorded))
    assert text.returncode == 0 and "no divergence" in text.stdout


def test_an_altered_decision_is_exactly_the_divergence_found(recorded: Path, tmp_path: Path) -> None:
    lines = read_lines(recorded)
    allocated = [d for d in decisions(lines) if d["payload"]["type"] == "claim.allocated"]
    # The last decision of the run: nothing decided after it can depend on it.
    target = allocated[-1]["payload"]
    original = [d["device"] for d in target["devices"]]
    target["devices"][0]["device"] = "gpu-7-edited"
    altered = tmp_path / "altered.tlog.gz"
    write_lines(altered, lines)

    run = tangram("replay", str(altered), "--json")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert len(report["divergences"]) == 1
    divergence = report["divergences"][0]
    assert divergence["claim"] == f"{target['namespace']}/{target['name']}"
    assert divergence["uid"] == target["uid"]
    assert divergence["differs"] == ["devices"]
    assert divergence["recorded"]["devices"] == ["gpu-7-edited", *original[1:]]
    assert divergence["recomputed"]["devices"] == original
    text = tangram("replay", str(altered))
    assert text.returncode == 1
    assert f"DIVERGENCE {target['namespace']}/{target['name']}" in text.stdout
    assert "gpu-7-edited" in text.stdout


def test_explain_a_claim_that_failed(recorded: Path) -> None:
    failed = next(d["payload"] for d in decisions(read_lines(recorded)) if d["payload"]["name"] == "too-big")
    run = tangram("explain", "ml/too-big", "--log", str(recorded), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    # 16 GPUs asked of two 8-GPU nodes: the reason is the allocator's own, word for word.
    assert report["recorded"] == {"status": "failed", "node": None, "devices": [], "reason": failed["reason"]}
    assert report["recomputed"]["reason"] == failed["reason"]
    assert failed["reason"].startswith("0/2 nodes fit: 2 nodes: ")
    assert report["understood"]["requests"][0]["alternatives"][0]["count"] == 16
    assert report["understood"]["requests"][0]["alternatives"][0]["device_class"] == "gpu.tangram.dev"
    # The engine's explanation gives the same rejection as the failure message, word for word.
    assert "only 8 devices of this hardware match (needs 16)" in json.dumps(report["candidates"])
    assert report["devices"] == [] and report["commands"] == []
    assert [s["step"] for s in report["steps"]] == ["requested", "decided"]
    text = tangram("explain", "ml/too-big", "--log", str(recorded))
    assert f"failed: {failed['reason']}" in text.stdout


def test_explain_a_claim_that_got_four_nvlink_gpus(recorded: Path) -> None:
    run = tangram("explain", "ml/llm-tensor-parallel", "--log", str(recorded), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    # Only node-a (HGX H200, NVSwitch) has four pairwise NVLink-connected GPUs.
    assert report["recorded"]["status"] == "allocated" and report["recorded"]["node"] == "node-a"
    assert report["recomputed"] == report["recorded"]
    assert len(report["devices"]) == 4
    assert report["understood"]["topology"][0]["interconnect"] == "NVLink"
    assert "node-a" in json.dumps(report["candidates"])
    assert report["scores"]["set_score"] == report["scores"]["ideal_set_score"] > 0
    steps = [s["step"] for s in report["steps"]]
    assert steps[:2] == ["requested", "decided"] and "prepared" in steps
    times = [s["after_ms"] for s in report["steps"]]
    assert times == sorted(times)


def test_explain_names_a_claim_missing_from_the_log(recorded: Path) -> None:
    run = tangram("explain", "ml/nothing-like-it", "--log", str(recorded))
    assert run.returncode == 2
    assert "no claim ml/nothing-like-it in the log" in run.stderr
