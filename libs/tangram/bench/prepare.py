"""`tangram bench prepare`: kubelet NodePrepare/NodeUnprepare latency over real unix-socket gRPC.

Baseline in the same run: the same preparer (checkpoint + CDI spec writes) called directly, without
gRPC, so the ratio shows what the RPC layer adds. `--warmup` claims go through both paths first, and
the warm-up's prepare latencies are reported apart (they include opening the connection).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from tangram.cdi.devices import ClaimRef
from tangram.events import AllocatedDevice, ClaimAllocated, GpuInfo, NodeHardware, NodeInventory
from tangram.kubelet.allocations import InMemoryAllocationSource
from tangram.kubelet.config import PluginConfig
from tangram.kubelet.plugin import build_plugin
from tangram.kubelet.preparer import ClaimPreparer
from tangram.kubelet.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tangram.stats import percentiles

NODE = "bench-node"
GPUS = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=int, default=200, help="claims prepared and unprepared per phase")
    parser.add_argument("--concurrency", type=int, default=50, help="calls in flight at once")
    parser.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="claims prepared and unprepared through each path before the timed phases (reported apart)",
    )


def _feed(source: InMemoryAllocationSource, uids: Sequence[str]) -> None:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-bench-{i}",
            name="NVIDIA H100 80GB HBM3",
            product="H100-SXM5-80GB",
            architecture="hopper",
            cuda_compute_capability="9.0",
            pci_bus_id=f"00000000:{i + 16:02x}:00.0",
            minor=i,
            memory_mib=81559,
            multiprocessors=132,
        )
        for i in range(GPUS)
    ]
    source.observe(
        NodeInventory(key=NODE, hardware=NodeHardware(node=NODE, driver_version="580.95.5", gpus=gpus))
    )
    for n, uid in enumerate(uids):
        gpu = n % GPUS
        device = AllocatedDevice(
            request="gpu", driver="gpu.tangram.dev", pool=NODE, device=f"gpu-{gpu}", gpu_index=gpu,
            gpu_uuid=f"GPU-bench-{gpu}",
        )  # fmt: skip
        source.observe(
            ClaimAllocated(key=uid, namespace="bench", name=f"c{n}", uid=uid, node=NODE, devices=[device])
        )


async def _timed(calls: Sequence[Callable[[], Awaitable[None]]], concurrency: int) -> list[float]:
    gate = asyncio.Semaphore(concurrency)
    samples: list[float] = []

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            started = time.perf_counter()
            await call()
            samples.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(one(call) for call in calls))
    return samples


def _claim_uids(prefix: int, count: int) -> list[str]:
    return [f"{prefix:08x}-0000-4000-8000-{n:012x}" for n in range(count)]


async def _grpc_phase(stub: Any, uids: Sequence[str], concurrency: int, *, prepare: bool) -> list[float]:
    def call(uid: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            claim = dra_v1_pb2.Claim(namespace="bench", name="c", uid=uid)
            if prepare:
                response = await stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
                )
            else:
                response = await stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
                )
            if response.claims[uid].error:
                raise RuntimeError(response.claims[uid].error)

        return run

    return await _timed([call(uid) for uid in uids], concurrency)


async def _direct_phase(
    preparer: ClaimPreparer, uids: Sequence[str], concurrency: int, *, prepare: bool
) -> list[float]:
    def call(uid: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            claim = ClaimRef(namespace="bench", name="c", uid=uid)
            if prepare:
                outcome = (await preparer.prepare([claim]))[uid]
                if outcome.error:
                    raise RuntimeError(outcome.error)
            elif error := (await preparer.unprepare([claim]))[uid]:
                raise RuntimeError(error)

        return run

    return await _timed([call(uid) for uid in uids], concurrency)


async def _bench(claims: int, concurrency: int, warmup: int = 0) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
    try:
        boot_id = root / "boot_id"
        boot_id.write_text("bench-boot\n")
        config = PluginConfig(
            node_name=NODE, kubelet_root=root / "k", cdi_dir=root / "cdi", boot_id_path=boot_id
        )
        source = InMemoryAllocationSource(NODE)
        rpc_uids, direct_uids = _claim_uids(1, claims), _claim_uids(2, claims)
        warm_rpc, warm_direct = _claim_uids(3, warmup), _claim_uids(4, warmup)
        _feed(source, [*rpc_uids, *direct_uids, *warm_rpc, *warm_direct])
        plugin = await build_plugin(config, source)
        async with plugin, grpc.aio.insecure_channel(f"unix://{config.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            # The first calls also open kubelet's connection and run code paths for the first
            # time; a kubelet pays that once, so it is measured apart from the steady state.
            warm_prepare_rpc = await _grpc_phase(stub, warm_rpc, concurrency, prepare=True)
            await _grpc_phase(stub, warm_rpc, concurrency, prepare=False)
            await _direct_phase(plugin.preparer, warm_direct, concurrency, prepare=True)
            await _direct_phase(plugin.preparer, warm_direct, concurrency, prepare=False)
            prepare_rpc = await _grpc_phase(stub, rpc_uids, concurrency, prepare=True)
            unprepare_rpc = await _grpc_phase(stub, rpc_uids, concurrency, prepare=False)
            prepare_direct = await _direct_phase(plugin.preparer, direct_uids, concurrency, prepare=True)
            unprepare_direct = await _direct_phase(plugin.preparer, direct_uids, concurrency, prepare=False)
        result: dict[str, Any] = {
            "benchmark": "prepare",
            "claims": claims,
            "concurrency": concurrency,
            "warmup_claims": warmup,
            "warmup_prepare_grpc": percentiles(warm_prepare_rpc) if warm_prepare_rpc else None,
            "prepare_grpc": percentiles(prepare_rpc),
            "unprepare_grpc": percentiles(unprepare_rpc),
            "prepare_direct": percentiles(prepare_direct),
            "unprepare_direct": percentiles(unprepare_direct),
        }
        for phase in ("prepare", "unprepare"):
            rpc, direct = result[f"{phase}_grpc"]["p50_ms"], result[f"{phase}_direct"]["p50_ms"]
            result[f"{phase}_p50_grpc_over_direct"] = round(rpc / direct, 3) if direct else None
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if args.claims < 1 or args.concurrency < 1 or args.warmup < 0:
        raise SystemExit(
            "tangram bench prepare: --claims and --concurrency must be at least 1, --warmup at least 0"
        )
    print(json.dumps(asyncio.run(_bench(args.claims, args.concurrency, args.warmup))))
    return 0
