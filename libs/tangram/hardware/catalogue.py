"""GPU product facts: the one table the simulator, the inventory and the allocator read them from.

Values come from real machines (nvidia-smi / NVML, see the reference notes) unless a row says
`derived`: then they follow the same product's observed pattern and should be replaced when a
real reading is available. MiB sizes are NVML's `memorySizeMB`; the GiB that `nvidia-smi mig -lgip`
prints is that value / 1024 rounded to two decimals (9984 MiB -> "9.75").

NVLink bandwidth is per link and bidirectional (NVLink3/4: 50 GB/s, NVLink5: 100 GB/s), so an
HGX H100 pair with 18 links is 900 GB/s; `nvidia-smi nvlink -s` prints the per-direction figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# NVML_GPU_INSTANCE_PROFILE_* index constants (pynvml values; kept here so this module stays pure).
GI_INDEX_1_SLICE = 0
GI_INDEX_2_SLICE = 1
GI_INDEX_3_SLICE = 2
GI_INDEX_4_SLICE = 3
GI_INDEX_7_SLICE = 4
GI_INDEX_1_SLICE_REV1 = 7  # 1g+me on 8-slice GPUs, 1g.6gb+me on A30
GI_INDEX_2_SLICE_REV1 = 8  # 2g.12gb+me on A30
GI_INDEX_1_SLICE_REV2 = 9  # 1g with two memory slices (1g.20gb on H100)

# NVML_COMPUTE_INSTANCE_PROFILE_* index by compute-slice count; the CI profile id equals the index.
CI_INDEX_BY_SLICES: dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

Architecture = str  # "ampere" | "hopper" | "blackwell" | "ada"


@dataclass(frozen=True, slots=True)
class GiProfileSpec:
    """One GPU-instance profile of one product (`nvidia-smi mig -lgip` / `-lgipp`)."""

    profile_id: int
    profile_index: int
    name: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    instance_count: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpeg: int
    ofa: int
    media_extensions: bool = False


@dataclass(frozen=True, slots=True)
class NvlinkSpec:
    generation: int
    links: int  # NVLink links per GPU
    gbps_per_link: float  # bidirectional

    @property
    def total_gbps(self) -> float:
        return self.links * self.gbps_per_link


@dataclass(frozen=True, slots=True)
class GpuProduct:
    key: str
    nvml_name: str
    pci_device_id: int
    memory_mib: int
    multiprocessors: int
    architecture: Architecture
    cuda_compute_capability: tuple[int, int]
    nvlink: NvlinkSpec | None
    memory_slices: int = 0
    compute_slices: int = 0
    mig_profiles: tuple[GiProfileSpec, ...] = field(default=())
    mig_toggle_needs_reset: bool = False
    source: str = "observed"

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def max_mig_devices(self) -> int:
        return self.compute_slices

    @property
    def compute_capability_text(self) -> str:
        return f"{self.cuda_compute_capability[0]}.{self.cuda_compute_capability[1]}"

    def profile_by_id(self, profile_id: int) -> GiProfileSpec | None:
        return next((p for p in self.mig_profiles if p.profile_id == profile_id), None)

    def profile_by_index(self, profile_index: int) -> GiProfileSpec | None:
        return next((p for p in self.mig_profiles if p.profile_index == profile_index), None)

    def profile_by_name(self, name: str) -> GiProfileSpec | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


def _eight_slice(
    names: tuple[str, str, str, str, str, str],
    mib: tuple[int, int, int, int, int, int],
    sms: tuple[int, int, int, int, int, int],
) -> tuple[GiProfileSpec, ...]:
    """The seven GI profiles of an 8-memory-slice GPU, in `nvidia-smi mig -lgip` order.

    names/mib/sms are for 1g, 1g with two memory slices, 2g, 3g, 4g, 7g; the +me profile
    shares the 1g row. Ids, placements and engine counts are identical on A100, H100, H200, B200.
    """
    n1, n1x2, n2, n3, n4, n7 = names
    m1, m1x2, m2, m3, m4, m7 = mib
    s1, s1x2, s2, s3, s4, s7 = sms
    return (
        GiProfileSpec(19, GI_INDEX_1_SLICE, n1, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, m1, s1, 1, 1, 1, 0),
        GiProfileSpec(
            20, GI_INDEX_1_SLICE_REV1, f"{n1}+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, m1, s1, 1, 1, 1, 1, True
        ),
        GiProfileSpec(15, GI_INDEX_1_SLICE_REV2, n1x2, 1, 2, (0, 2, 4, 6), 4, m1x2, s1x2, 1, 1, 1, 0),
        GiProfileSpec(14, GI_INDEX_2_SLICE, n2, 2, 2, (0, 2, 4), 3, m2, s2, 2, 2, 2, 0),
        GiProfileSpec(9, GI_INDEX_3_SLICE, n3, 3, 4, (0, 4), 2, m3, s3, 3, 3, 3, 0),
        GiProfileSpec(5, GI_INDEX_4_SLICE, n4, 4, 4, (0,), 1, m4, s4, 4, 4, 4, 0),
        GiProfileSpec(0, GI_INDEX_7_SLICE, n7, 7, 8, (0,), 1, m7, s7, 8, 7, 7, 1),
    )


_A30_PROFILES: tuple[GiProfileSpec, ...] = (
    GiProfileSpec(14, GI_INDEX_1_SLICE, "1g.6gb", 1, 1, (0, 1, 2, 3), 4, 5952, 14, 1, 0, 0, 0),
    GiProfileSpec(21, GI_INDEX_1_SLICE_REV1, "1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, 5952, 14, 1, 1, 1, 1, True),
    GiProfileSpec(5, GI_INDEX_2_SLICE, "2g.12gb", 2, 2, (0, 2), 2, 11968, 28, 2, 2, 0, 0),
    GiProfileSpec(6, GI_INDEX_2_SLICE_REV1, "2g.12gb+me", 2, 2, (0, 2), 1, 11968, 28, 2, 2, 1, 1, True),
    GiProfileSpec(0, GI_INDEX_4_SLICE, "4g.24gb", 4, 4, (0,), 1, 24000, 56, 4, 4, 1, 1),
)

_A100_SMS = (14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 26, 32, 60, 64, 132)
_NVLINK3 = 50.0
_NVLINK4 = 50.0
_NVLINK5 = 100.0


PRODUCTS: dict[str, GpuProduct] = {
    p.key: p
    for p in (
        # 40537 MiB was seen on a 450 driver; 40960 is what current drivers report (derived).
        GpuProduct(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            0x20B010DE,
            40960,
            108,
            "ampere",
            (8, 0),
            NvlinkSpec(3, 12, _NVLINK3),
            8,
            7,
            _eight_slice(
                ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
                (4864, 9984, 9984, 20096, 20096, 40448),
                _A100_SMS,
            ),
            mig_toggle_needs_reset=True,
            source="observed; total MiB derived",
        ),
        GpuProduct(
            "A100-PCIE-40GB",
            "NVIDIA A100-PCIE-40GB",
            0x20F110DE,
            40960,
            108,
            "ampere",
            (8, 0),
            NvlinkSpec(3, 12, _NVLINK3),
            8,
            7,
            _eight_slice(
                ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
                (4864, 9984, 9984, 20096, 20096, 40448),
                _A100_SMS,
            ),
            mig_toggle_needs_reset=True,
            source="derived from A100-SXM4-40GB",
        ),
        GpuProduct(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            0x20B210DE,
            81920,
            108,
            "ampere",
            (8, 0),
            NvlinkSpec(3, 12, _NVLINK3),
            8,
            7,
            _eight_slice(
                ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                (9728, 19968, 19968, 40448, 40448, 81152),
                _A100_SMS,
            ),
            mig_toggle_needs_reset=True,
            source="observed; 1g.20gb MiB derived from 2g.20gb",
        ),
        GpuProduct(
            "A100-PCIE-80GB",
            "NVIDIA A100 80GB PCIe",
            0x20B510DE,
            81920,
            108,
            "ampere",
            (8, 0),
            NvlinkSpec(3, 12, _NVLINK3),
            8,
            7,
            _eight_slice(
                ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                (9728, 19968, 19968, 40192, 40192, 80896),
                _A100_SMS,
            ),
            mig_toggle_needs_reset=True,
            source="observed; 1g.20gb MiB derived",
        ),
        # A30: 4 memory and 4 compute slices; bridge of 4 NVLink3 links (200 GB/s). Total MiB derived.
        GpuProduct(
            "A30",
            "NVIDIA A30",
            0x20B710DE,
            24576,
            56,
            "ampere",
            (8, 0),
            NvlinkSpec(3, 4, _NVLINK3),
            4,
            4,
            _A30_PROFILES,
            mig_toggle_needs_reset=True,
            source="observed profiles; name and total MiB derived",
        ),
        GpuProduct(
            "H100-SXM5-80GB",
            "NVIDIA H100 80GB HBM3",
            0x233010DE,
            81559,
            132,
            "hopper",
            (9, 0),
            NvlinkSpec(4, 18, _NVLINK4),
            8,
            7,
            _eight_slice(
                ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                (9984, 20096, 20096, 40448, 40448, 81152),
                _HOPPER_SMS,
            ),
        ),
        # H100 NVL: bridged in pairs, 12 NVLink4 links = 600 GB/s per pair.
        GpuProduct(
            "H100-NVL",
            "NVIDIA H100 NVL",
            0x232110DE,
            95830,
            132,
            "hopper",
            (9, 0),
            NvlinkSpec(4, 12, _NVLINK4),
            8,
            7,
            _eight_slice(
                ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
                (11008, 22144, 22144, 47488, 47488, 95360),
                _HOPPER_SMS,
            ),
        ),
        GpuProduct(
            "H200-141GB",
            "NVIDIA H200",
            0x233510DE,
            143771,
            132,
            "hopper",
            (9, 0),
            NvlinkSpec(4, 18, _NVLINK4),
            8,
            7,
            _eight_slice(
                ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
                (16384, 33024, 33024, 71168, 71168, 143104),
                _HOPPER_SMS,
            ),
        ),
        # B200: 1g/1g.45gb/2g rows observed; 3g/4g/7g rows derived from them.
        GpuProduct(
            "B200",
            "NVIDIA B200",
            0x290110DE,
            183359,
            148,
            "blackwell",
            (10, 0),
            NvlinkSpec(5, 18, _NVLINK5),
            8,
            7,
            _eight_slice(
                ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
                (22528, 45312, 45312, 90624, 90624, 181248),
                (18, 30, 36, 54, 72, 144),
            ),
            source="observed; 3g/4g/7g profile rows derived",
        ),
        # GB200: 1g.47gb/2g.47gb observed; the rest derived.
        GpuProduct(
            "GB200",
            "NVIDIA GB200",
            0x294110DE,
            189471,
            152,
            "blackwell",
            (10, 0),
            NvlinkSpec(5, 18, _NVLINK5),
            8,
            7,
            _eight_slice(
                ("1g.24gb", "1g.47gb", "2g.47gb", "3g.95gb", "4g.95gb", "7g.186gb"),
                (23296, 46592, 46592, 93184, 93184, 186368),
                (20, 32, 38, 58, 76, 148),
            ),
            source="observed; 1g, 3g, 4g, 7g profile rows derived",
        ),
        GpuProduct("L40S", "NVIDIA L40S", 0x26B910DE, 46068, 142, "ada", (8, 9), None),
        GpuProduct("L4", "NVIDIA L4", 0x27B810DE, 23034, 58, "ada", (8, 9), None),
    )
}


class UnknownProduct(KeyError):
    def __str__(self) -> str:
        return f"unknown GPU product {self.args[0]!r}; known: {', '.join(sorted(PRODUCTS))}"


def product(key: str) -> GpuProduct:
    try:
        return PRODUCTS[key]
    except KeyError:
        raise UnknownProduct(key) from None


def product_by_nvml_name(nvml_name: str) -> GpuProduct | None:
    """The catalogue entry for an NVML name; older drivers omit the "NVIDIA " prefix."""
    bare = nvml_name.removeprefix("NVIDIA ").strip()
    return next((p for p in PRODUCTS.values() if p.nvml_name.removeprefix("NVIDIA ") == bare), None)


def product_by_pci_device_id(pci_device_id: int) -> GpuProduct | None:
    return next((p for p in PRODUCTS.values() if p.pci_device_id == pci_device_id), None)
