"""The GPU hardware model: product catalogue, topology scoring, simulated machines, MIG diagrams.

Pure: no NVML, no network. NVML-backed reading lives in `tangram.nvml`.
"""

from tangram.hardware.catalogue import PRODUCTS, GiProfileSpec, GpuProduct, NvlinkSpec, product
from tangram.hardware.topology import PairFacts, Topology, compute_links, nvlink_domains, pair_score

__all__ = [
    "PRODUCTS",
    "GiProfileSpec",
    "GpuProduct",
    "NvlinkSpec",
    "PairFacts",
    "Topology",
    "compute_links",
    "nvlink_domains",
    "pair_score",
    "product",
]
