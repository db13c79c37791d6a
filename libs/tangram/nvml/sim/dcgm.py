"""A stand-in for NVIDIA's DCGM exporter on nodes whose GPUs are simulated.

Run as `python -m tangram.nvml.sim.dcgm --machine M --state-file F --hostname H --port P`, it
serves `/metrics` as dcgm-exporter does: the same metric names and labels (`gpu`, `UUID`,
`pci_bus_id`, `device`, `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, and `GPU_I_PROFILE`,
`GPU_I_ID` for MIG devices), read from the simulated GPUs at every scrape. A whole GPU has its
utilization, framebuffer used and free, power and graphics engine activity; a MIG device its
framebuffer and engine activity (DCGM reports no utilization or power per MIG device); a GPU in
MIG mode its power. What the simulated processes keep busy is what the series say
(`SimNvml.sim_attach_process(..., sm_percent=)`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

import pynvml
from aiohttp import web

from tangram.events import GpuInfo
from tangram.nvml.inventory import read_node_hardware
from tangram.nvml.sim.backend import SimNvml

# name -> (help, what it counts); the exporter's default counters Tangram's rules and dashboard use
METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
}


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    quoted = (
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs
    )
    return "{" + ",".join(quoted) + "}"


def exporter_text(nvml: SimNvml, hostname: str) -> str:
    """The exposition dcgm-exporter would serve for these GPUs now."""
    driver = nvml.nvmlSystemGetDriverVersion()
    hardware = read_node_hardware(nvml, hostname)
    samples: dict[str, list[str]] = {name: [] for name in METRICS}
    for gpu in hardware.gpus:
        base = [
            ("gpu", str(gpu.index)),
            ("UUID", gpu.uuid),
            ("pci_bus_id", gpu.pci_bus_id),
            ("device", f"nvidia{gpu.minor}"),
            ("modelName", gpu.name),
            ("Hostname", hostname),
            ("DCGM_FI_DRIVER_VERSION", driver),
        ]
        with contextlib.suppress(pynvml.NVMLError):  # a GPU off the bus has no fields, as in DCGM
            _gpu_samples(nvml, gpu, base, samples)
    lines = []
    for name, help_text in METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples[name]]
    return "\n".join(lines) + "\n"


def _gpu_samples(
    nvml: SimNvml, gpu: GpuInfo, base: list[tuple[str, str]], samples: dict[str, list[str]]
) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
    power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
    samples["DCGM_FI_DEV_POWER_USAGE"].append(f"DCGM_FI_DEV_POWER_USAGE{_labels(base)} {power_w:.3f}")
    if gpu.mig_enabled:
        mig_handles = {}
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            with contextlib.suppress(pynvml.NVMLError):
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                mig_handles[nvml.nvmlDeviceGetGpuInstanceId(mig)] = mig
        for instance in gpu.mig_instances:
            if instance.gpu_instance_id not in mig_handles:
                continue  # a GPU instance without its compute instance is no MIG device yet
            labels = _labels(
                [*base, ("GPU_I_PROFILE", instance.profile), ("GPU_I_ID", str(instance.gpu_instance_id))]
            )
            memory = nvml.nvmlDeviceGetMemoryInfo(mig_handles[instance.gpu_instance_id])
            used, free = memory.used // 2**20, memory.free // 2**20
            active = nvml.sim_engine_activity(gpu.index, instance.gpu_instance_id)
            samples["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{labels} {used}")
            samples["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{labels} {free}")
            samples["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(
                f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{labels} {active:.6f}"
            )
        return
    labels = _labels(base)
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    samples["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{labels} {rates.gpu}")
    samples["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{labels} {memory.used // 2**20}")
    samples["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{labels} {memory.free // 2**20}")
    active = nvml.sim_engine_activity(gpu.index)
    samples["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{labels} {active:.6f}")


async def serve(nvml: SimNvml, hostname: str, host: str, port: int, stop: asyncio.Event) -> None:
    async def metrics(_: web.Request) -> web.Response:
        text = await asyncio.to_thread(exporter_text, nvml, hostname)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tangram.nvml.sim.dcgm", description=__doc__)
    parser.add_argument("--machine", required=True, help="simulated machine name or YAML file")
    parser.add_argument("--state-file", type=Path, required=True, help="the node's simulated GPU state")
    parser.add_argument("--hostname", required=True, help="the node's name, as the Hostname label")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9400)
    args = parser.parse_args(argv)
    nvml = SimNvml.from_machine(args.machine, state_file=args.state_file)
    nvml.nvmlInit()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(nvml, args.hostname, args.host, args.port, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
