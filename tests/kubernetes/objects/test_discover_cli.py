import json
from pathlib import Path

import pynvml
import pytest

from tangram.events import NodeInventory, decode
from tangram.nvml import open_backend
from tests.kubernetes.objects.schema import validate_strictly
from tests.support.cli import Ran, tangram


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    return tangram(capsys, "discover", *argv)


def test_inventory_of_a_simulated_machine(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "--sim", "dgx-h100", "--format", "inventory")
    assert (status, err) == (0, "")
    event = decode(out.encode())
    assert isinstance(event, NodeInventory)
    assert event.key == "dgx-h100"
    assert event.hardware.node == "dgx-h100"
    assert [g.name for g in event.hardware.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert json.loads(out)["type"] == "node.inventory"


def test_slices_of_a_simulated_machine(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(
        capsys,
        "--sim",
        "l40s-8",
        "--format",
        "slices",
        "--k8s-version",
        "1.34",
        "--node",
        "worker-7.example.com",
    )
    assert (status, err) == (0, "")
    [obj] = json.loads(out)
    validate_strictly(obj, "1.34")
    assert obj["metadata"]["name"] == "worker-7.example.com-gpu-tangram-dev-0"
    assert obj["spec"]["nodeName"] == "worker-7.example.com"
    assert [d["name"] for d in obj["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]


def test_slices_default_to_the_newest_version_and_honour_the_driver_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "--sim", "dgx-h100", "--format", "slices", "--driver", "gpu.example.com")
    assert status == 0
    slices = json.loads(out)
    assert "devices" not in slices[0]["spec"]  # 1.36: counter sets in a slice of their own
    assert {s["spec"]["driver"] for s in slices} == {"gpu.example.com"}
    for obj in slices:
        validate_strictly(obj, "1.36")


def test_machine_file_and_shared_state_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    machine = tmp_path / "one-l4.yaml"
    machine.write_text(
        "name: one-l4\ndriver_version: '550.90.07'\ngpus:\n"
        "  - product: L4\n    pci_bus_id: '00000000:01:00.0'\n    pcie_root: 'pci0000:00'\n",
        encoding="utf-8",
    )
    status, out, err = run(capsys, "--sim", str(machine), "--format", "inventory")
    assert (status, err) == (0, "")
    hardware = json.loads(out)["hardware"]
    assert hardware["node"] == "one-l4"
    assert [g["name"] for g in hardware["gpus"]] == ["NVIDIA L4"]

    state = tmp_path / "state.json"
    nvml = open_backend(sim="dgx-h100", state_file=state)
    try:
        nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(3), pynvml.NVML_DEVICE_MIG_ENABLE)
    finally:
        nvml.nvmlShutdown()
    status, out, _ = run(capsys, "--sim", "dgx-h100", "--state-file", str(state), "--format", "inventory")
    assert status == 0
    assert [g["mig_enabled"] for g in json.loads(out)["hardware"]["gpus"]] == [i == 3 for i in range(8)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sim", "no-such-machine"], "no machine named 'no-such-machine'"),
        (["--sim", "/nonexistent/machine.yaml"], "no such file"),
        (["--sim", "dgx-h100", "--node", "Not_A_Node"], "node name 'Not_A_Node' is not a valid"),
        (["--sim", "dgx-h100", "--generation", "-1"], "--generation must not be negative"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("tangram discover: ")
    assert message in err


def test_unreadable_machine_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [\n", encoding="utf-8")
    status, out, err = run(capsys, "--sim", str(broken))
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "broken.yaml" in err


def test_real_without_a_driver_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    status, out, err = run(capsys, "--real", "--format", "slices")
    assert status == 1
    assert out == ""
    assert err.count("\n") == 1
    assert "NVIDIA driver" in err


def test_sim_and_real_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "--sim", "dgx-h100", "--real")
    assert status == 2
    assert "not allowed with argument" in err
