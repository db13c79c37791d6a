"""`tangram bench sharing`: the exact optimum on instances small enough to check by hand, and a
report whose policies never beat it."""

from __future__ import annotations

import argparse
import json

import pytest

from tangram.bench import sharing
from tangram.bench.sharing import optimal_sharing, replay, sharing_node
from tangram.bench.traces import Arrival, ClaimShape, machine_hardware, shipped_classes
from tangram.events.inventory import renamed_machine

L40S = sharing_node(renamed_machine(machine_hardware("l40s-8"), "l40s"))  # 8 GPUs of 46068 MiB
H100_NVL = sharing_node(renamed_machine(machine_hardware("h100-nvl-4x2"), "nvl"))


def share(gib: int, percent: int = 0) -> ClaimShape:
    return ClaimShape("share", memory_gib=gib, percent=percent)


def test_two_20gib_shares_fit_an_l40s_and_a_third_does_not() -> None:
    # 2 x 20 GiB = 40 GiB <= 44.99 GiB per GPU; 3 do not: 16 of 17 on 8 GPUs
    found = optimal_sharing([L40S], [share(20)] * 17)
    assert (found.admitted, found.proven) == (16, True)


def test_a_gpu_held_whole_hosts_no_share() -> None:
    # 7 exclusive GPUs leave one GPU: two of the three 20 GiB shares
    found = optimal_sharing([L40S], [ClaimShape("gpu", 1)] * 7 + [share(20)] * 3)
    assert (found.admitted, found.proven) == (9, True)


def test_compute_percentages_are_counted_per_host() -> None:
    # 60% + 60% never meet on one device: 8 GPUs hold 8 of 9 such shares (memory would allow more)
    found = optimal_sharing([L40S], [share(2, percent=60)] * 9)
    assert (found.admitted, found.proven) == (8, True)


def test_a_share_larger_than_any_mig_host_takes_a_whole_gpu_host() -> None:
    # H100 NVL, 8 GPUs of 95830 MiB (93.58 GiB): two 47 GiB shares need 94 GiB, and the largest MIG
    # host smaller than the GPU (4 slices) holds less than 47 GiB: one per GPU, 8 of 16
    found = optimal_sharing([H100_NVL], [share(47)] * 16)
    assert (found.admitted, found.proven) == (8, True)


def test_whole_gpu_allocation_gives_each_share_a_gpu_and_strands_the_rest() -> None:
    nodes = [renamed_machine(machine_hardware("l40s-8"), "l40s")]
    ops = [Arrival(f"s{i}", share(4)) for i in range(9)]
    whole = replay(nodes, list(ops), shipped_classes(), "whole-gpu")
    shared = replay(nodes, list(ops), shipped_classes(), "tangram")
    assert (whole["claims"], whole["failed"], whole["gpus_used"]) == (8, True, 8)
    # 8 GPUs of 46068 MiB less 8 x 4 GiB
    assert whole["memory_stranded_gib"] == pytest.approx(8 * 46068 / 1024 - 32, abs=0.01)
    assert (shared["claims"], shared["failed"], shared["gpus_used"]) == (9, False, 1)
    assert shared["memory_stranded_gib"] == pytest.approx(46068 / 1024 - 36, abs=0.01)


def test_the_report_never_beats_the_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    sharing.add_arguments(parser)
    args = parser.parse_args(
        ["--instances", "1", "--churn-claims", "30", "--saturation", "1.2", "--seed", "5"]
    )
    assert sharing.run(args) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object: the solver's banner went elsewhere
    [instance] = report["instances"]
    assert instance["fleet"] == {"l40s-8": 3, "h100-nvl-4x2": 2}
    assert instance["node_names"] != sorted(
        f"{m}-{n}" for m, c in instance["fleet"].items() for n in range(c)
    )
    assert instance["optimum"]["proven"] is True
    for figures in instance["policies"].values():
        assert figures["claims"] <= instance["optimum"]["claims"]
    policies = report["summary"]["policies"]
    assert set(policies) == {"tangram", "first-fit", "whole-gpu"}
    assert policies["whole-gpu"]["claims"] < policies["tangram"]["claims"]
    assert set(report["summary"]["ratios"]) == {
        "claims_vs_whole_gpu",
        "claims_vs_first_fit",
        "claims_vs_optimum",
        "stranded_vs_first_fit",
        "stranded_vs_whole_gpu",
    }
