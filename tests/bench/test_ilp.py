"""The exact packing optimum on instances small enough to check by hand."""

from __future__ import annotations

from tangram.bench.packing import PackingGpu, PackingNode, optimal_admitted, packing_node
from tangram.bench.traces import ClaimShape, machine_hardware

# H100-style placements without the media-extensions profile: (compute, start, size)
H100 = (
    *((1, s, 1) for s in range(7)),
    *((1, s, 2) for s in (0, 2, 4, 6)),
    *((2, s, 2) for s in (0, 2, 4)),
    (3, 0, 4),
    (3, 4, 4),
    (4, 0, 4),
    (7, 0, 8),
)
WHOLE = ClaimShape("gpu", 1)
MIG_1G = ClaimShape("mig", compute=1, slices=1)
MIG_1G_2S = ClaimShape("mig", compute=1, slices=2)
MIG_3G = ClaimShape("mig", compute=3, slices=4)


def mig_gpu(index: int) -> PackingGpu:
    return PackingGpu(index=index, whole=True, slices=8, placements=H100)


def node(*gpus: PackingGpu, nvlinked: tuple[tuple[int, int], ...] = ()) -> PackingNode:
    return PackingNode(name="n", gpus=gpus, nvlinked=frozenset(nvlinked))


def test_a_gpu_used_whole_has_no_mig_devices() -> None:
    # whole GPU (1 claim) or two 3g instances at slices 0 and 4 (2 claims): the best is 2
    found = optimal_admitted([node(mig_gpu(0))], [WHOLE, MIG_3G, MIG_3G])
    assert (found.admitted, found.proven) == (2, True)


def test_seven_1g_instances_or_six_and_one_two_slice_instance() -> None:
    # 1g starts 0..6 give at most 7; a 1g.20gb at slice 6 plus 1g at 0..5 is also 7, never 8
    found = optimal_admitted([node(mig_gpu(0))], [MIG_1G] * 7 + [MIG_1G_2S])
    assert found.admitted == 7


def test_nvlink_claims_get_bridged_pairs_only() -> None:
    plain = [PackingGpu(index=i, whole=True, slices=0) for i in range(4)]
    bridged = node(*plain, nvlinked=((0, 1), (2, 3)))
    pair = ClaimShape("gpu", 2, nvlink=True)
    four = ClaimShape("gpu", 4, nvlink=True)
    assert optimal_admitted([bridged], [pair] * 3).admitted == 2
    assert optimal_admitted([bridged], [four]).admitted == 0
    assert optimal_admitted([bridged], [ClaimShape("gpu", 4)]).admitted == 1


def test_whole_claims_stay_on_one_node() -> None:
    two_nodes = [
        PackingNode(name=f"n{k}", gpus=(PackingGpu(index=0, whole=True, slices=0),), nvlinked=frozenset())
        for k in range(2)
    ]
    assert optimal_admitted(two_nodes, [ClaimShape("gpu", 2)]).admitted == 0
    assert optimal_admitted(two_nodes, [WHOLE, WHOLE, WHOLE]).admitted == 2


def test_mig_only_gpu_takes_no_whole_claim() -> None:
    mig_only = PackingGpu(index=0, whole=False, slices=8, placements=H100)
    assert optimal_admitted([node(mig_only)], [WHOLE, MIG_3G]).admitted == 1


def test_packing_node_follows_the_advertising_rules() -> None:
    # a100-pcie-2x2: GPU 0 with MIG off (Ampere: whole only), GPU 1 in MIG mode (MIG only)
    packed = packing_node(machine_hardware("a100-pcie-2x2"))
    by_index = {g.index: g for g in packed.gpus}
    assert (by_index[0].whole, by_index[0].slices, by_index[0].placements) == (True, 0, ())
    assert (by_index[1].whole, by_index[1].slices) == (False, 8)
    assert (3, 4, 4) in by_index[1].placements
    assert packed.nvlinked == frozenset({(0, 1), (2, 3)})
