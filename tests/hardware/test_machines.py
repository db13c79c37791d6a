from pathlib import Path

import pytest

from tangram.hardware.machines import MachineError, list_machines, load_machine


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
