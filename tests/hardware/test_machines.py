from pathlib import Path

import pytest

from tangram.hardware.machines import (
    MAX_GPUS_PER_MACHINE,
    MAX_MACHINE_BYTES,
    MAX_NVSWITCHES,
    MachineError,
    list_machines,
    load_machine,
    parse_machine,
)
from tests.support.machinegen import write_machine


def test_shipped_machines() -> None:
    assert list_machines() == [
        "a100-pcie-2x2",
        "a30-4",
        "dgx-h100",
        "gb200-tray",
        "h100-nvl-4x2",
        "hgx-h200",
        "l40s-8",
        "mixed",
    ]
    nvl = load_machine("h100-nvl-4x2")
    assert len(nvl.gpus) == 8 and nvl.nvlink.bridges == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert {g.numa_node for g in nvl.gpus} == {0, 1}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


BASE = (
    'name: t\ndriver_version: "550.1"\ngpus:\n  - product: {product}\n'
    '    pci_bus_id: "00000000:01:00.0"\n    pcie_root: pci0000:00\n'
)


def test_user_file_loads(tmp_path: Path) -> None:
    spec = load_machine(_write(tmp_path, BASE.format(product="L4")))
    assert spec.gpus[0].product == "L4"


def test_unknown_product_names_field_and_file(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE.format(product="H300"))
    with pytest.raises(MachineError, match=r"m\.yaml: gpus\.0: .*unknown GPU product 'H300'"):
        load_machine(path)


def test_bad_mig_placement_is_refused(tmp_path: Path) -> None:
    text = (
        BASE.format(product="H100-SXM5-80GB")
        + "    mig_enabled: true\n    mig_instances:\n      - {profile: 3g.40gb, start: 2}\n"
    )
    with pytest.raises(MachineError, match=r"3g\.40gb cannot start at memory slice 2"):
        load_machine(_write(tmp_path, text))


def test_bridge_to_gpu_without_nvlink_is_refused(tmp_path: Path) -> None:
    text = BASE.format(product="L4") + "nvlink:\n  bridges: [[0, 0]]\n"
    with pytest.raises(MachineError, match=r"GPU 0 \(L4\) has no NVLink"):
        load_machine(_write(tmp_path, text))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(MachineError, match="no machine named 'nope'"):
        load_machine("nope")
    with pytest.raises(MachineError, match="expected a mapping"):
        load_machine(_write(tmp_path, "- 1\n- 2\n"))


def test_a_machine_has_at_most_128_gpus(tmp_path: Path) -> None:
    assert MAX_GPUS_PER_MACHINE == 128
    spec = load_machine(write_machine(tmp_path / "big.yaml", 128))
    assert len(spec.gpus) == 128 and spec.switch_attached(127)
    path = write_machine(tmp_path / "huge.yaml", 129)
    with pytest.raises(MachineError) as refused:
        load_machine(path)
    assert str(refused.value) == (f"machine {path}: 129 GPUs, more than the limit of 128 per machine")


def test_the_gpu_bound_is_checked_before_each_gpu_is_validated() -> None:
    # Ten thousand GPUs that are each invalid: the count is what is refused, at once.
    data = {"name": "t", "driver_version": "550.1", "gpus": [{"product": "H300"}] * 10_000}
    with pytest.raises(MachineError, match=r"^machine m\.yaml: 10000 GPUs, more than the limit of 128"):
        parse_machine(data, source="m.yaml")


def test_a_machine_has_at_most_18_nvswitches(tmp_path: Path) -> None:
    assert MAX_NVSWITCHES == 18
    assert load_machine(write_machine(tmp_path / "a.yaml", 8, switches=18)).nvlink.switch is not None
    path = write_machine(tmp_path / "b.yaml", 8, switches=19)
    with pytest.raises(
        MachineError, match=r"nvlink\.switch\.switches: 19 NVSwitches, more than the limit of 18"
    ):
        load_machine(path)


def test_a_machine_file_is_at_most_1_mib(tmp_path: Path) -> None:
    assert MAX_MACHINE_BYTES == 1024 * 1024
    path = write_machine(tmp_path / "m.yaml", 8)
    with path.open("a") as f:  # a valid machine, padded with a comment past the limit
        f.write("#" + "x" * MAX_MACHINE_BYTES + "\n")
    with pytest.raises(MachineError, match=rf"machine {path}: larger than the limit of 1 MiB"):
        load_machine(path)


def test_a_gpu_listed_twice_on_the_switch_is_refused(tmp_path: Path) -> None:
    text = BASE.format(product="H100-SXM5-80GB") + "nvlink:\n  switch: {gpus: [0, 0], switches: 4}\n"
    with pytest.raises(MachineError, match=r"nvlink\.switch\.gpus: GPU 0 is listed twice"):
        load_machine(_write(tmp_path, text))
