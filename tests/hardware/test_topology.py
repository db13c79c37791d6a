import pytest

from tangram.events.inventory import GpuLink
from tangram.hardware.topology import Topology, nvlink_domains, pair_score


@pytest.mark.parametrize(
    ("level", "nvlinks", "expected"),
    [
        (50, 0, 10),
        (40, 0, 20),
        (30, 0, 30),
        (20, 0, 40),
        (10, 0, 50),
        (0, 0, 60),
        (40, 18, 1820),
        (10, 12, 1250),
    ],
)
def test_pair_score(level: int, nvlinks: int, expected: int) -> None:
    assert pair_score(level, nvlinks) == expected


def test_pair_score_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="unknown PCIe topology level 35"):
        pair_score(35, 0)


def _four_gpu_links() -> list[GpuLink]:
    # 0-1 bridged (NV12, PIX), 2-3 bridged (NV12, NODE), cross pairs SYS.
    return [
        GpuLink(a=0, b=1, nvlinks=12, bandwidth_gbps=600.0, pcie_level=10),
        GpuLink(a=0, b=2, nvlinks=0, bandwidth_gbps=0.0, pcie_level=50),
        GpuLink(a=0, b=3, nvlinks=0, bandwidth_gbps=0.0, pcie_level=50),
        GpuLink(a=1, b=2, nvlinks=0, bandwidth_gbps=0.0, pcie_level=50),
        GpuLink(a=1, b=3, nvlinks=0, bandwidth_gbps=0.0, pcie_level=50),
        GpuLink(a=2, b=3, nvlinks=12, bandwidth_gbps=600.0, pcie_level=40),
    ]


def test_topology_lookups_and_set_score() -> None:
    topo = Topology([0, 1, 2, 3], _four_gpu_links())
    assert topo.pair_score(1, 0) == 1250
    assert topo.pair_score(2, 3) == 1220
    assert topo.bandwidth_gbps(3, 2) == 600.0
    assert topo.nvlinks(0, 2) == 0
    assert topo.set_score([0, 1, 2]) == 1250 + 10 + 10
    assert topo.set_score([0, 1, 2, 3]) == 1250 + 1220 + 4 * 10
    assert topo.min_bandwidth_gbps([0, 1, 2]) == 0.0
    with pytest.raises(KeyError, match="no link facts between GPU 0 and GPU 9"):
        topo.pair_score(0, 9)


def test_domains_for_bridged_pairs_and_switches() -> None:
    domains = nvlink_domains("n1", [0, 1, 2, 3], _four_gpu_links())
    assert domains == {0: "n1/nvlink-0-1", 1: "n1/nvlink-0-1", 2: "n1/nvlink-2-3", 3: "n1/nvlink-2-3"}
    switched = nvlink_domains("n1", [0, 1], [], switch_groups={0: "0", 1: "0"})
    assert switched == {0: "n1/nvswitch-0", 1: "n1/nvswitch-0"}


def test_chain_that_is_not_a_clique_gets_no_domain() -> None:
    chain = [
        GpuLink(a=0, b=1, nvlinks=4, bandwidth_gbps=200.0, pcie_level=50),
        GpuLink(a=1, b=2, nvlinks=4, bandwidth_gbps=200.0, pcie_level=50),
        GpuLink(a=0, b=2, nvlinks=0, bandwidth_gbps=0.0, pcie_level=50),
    ]
    assert nvlink_domains("n", [0, 1, 2], chain) == {0: None, 1: None, 2: None}
