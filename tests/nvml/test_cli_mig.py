from pathlib import Path

import pytest

from tangram.cli import main
from tangram.nvml import calls
from tangram.nvml.sim import SimNvml


def test_mig_show_diagram(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "show", "--sim", "hgx-h200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "GPU 0 H200-141GB 143771 MiB: MIG on"
    assert out[2].split() == ["0", "1", "2", "3", "4", "5", "6", "7"]
    assert out[3].replace(" ", "") == "[3g.71gb][1g.18gb][free][free][free]"
    assert out[4] == "GPU 1 H200-141GB 143771 MiB: MIG off (8 memory slices available once enabled)"


def test_mig_show_follows_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s.json"
    sim = SimNvml.from_machine("a30-4", state_file=state)
    sim.nvmlInit()
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    gi = calls.create_gpu_instance(sim, dev, 14, 0, 1)
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    sim.sim_attach_process(
        0,
        gpu_instance_id=sim.nvmlGpuInstanceGetInfo(gi).id,
        compute_instance_id=sim.nvmlComputeInstanceGetInfo(ci).id,
    )
    assert main(["mig", "show", "--sim", "a30-4", "--state-file", str(state)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].replace(" ", "") == "[1g.6gb*][free][2g.12gb]"
    assert lines[4] == "GPU 1 A30 24576 MiB: MIG off (4 memory slices available once enabled)"


def test_mig_show_bad_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "show", "--sim", "/nonexistent.yaml"]) == 1
    assert "no machine named '/nonexistent.yaml'" in capsys.readouterr().err
