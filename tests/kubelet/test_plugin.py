"""The plugin as kubelet sees it: real gRPC over real unix sockets."""

from __future__ import annotations

import asyncio
import json
import stat

import msgspec

from tangram.events import ClaimPrepared, ClaimUnprepared, MigPlacement, PartitionApplied
from tangram.kubelet.servicers import PREPARE_SECONDS
from tests.kubelet.fakes import (
    GPU1,
    NODE,
    WatchedSource,
    mig_allocation,
    partition_applied,
    partition_failed,
    schema_validator,
    whole_gpu_allocation,
)
from tests.kubelet.harness import PluginHarness

UID_A = "0b6f6c55-3f0e-4c4e-9a59-2d3f2c1f7a01"
UID_B = "1c7a7d66-4a1f-4d5f-8b6a-3e4a3d2a8b02"
UID_M = "2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03"


async def test_kubelet_discovers_the_plugin_and_registers_it(harness: PluginHarness) -> None:
    kubelet = harness.kubelet
    assert kubelet.registration_sockets() == ["gpu.tangram.dev-reg.sock"]
    info = await kubelet.get_info("gpu.tangram.dev-reg.sock")
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.tangram.dev"
    assert info.endpoint == f"{harness.config.kubelet_root}/plugins/gpu.tangram.dev/dra.sock"
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    await kubelet.notify("gpu.tangram.dev-reg.sock", registered=True)
    assert harness.plugin is not None
    assert (harness.plugin.registration.registered, harness.plugin.registration.notifications) == (True, 1)
    await kubelet.notify("gpu.tangram.dev-reg.sock", registered=False, error="version mismatch")
    assert (harness.plugin.registration.registered, harness.plugin.registration.error) == (
        False,
        "version mismatch",
    )


async def test_sockets_and_plugin_dir_are_private(harness: PluginHarness) -> None:
    config = harness.config
    assert stat.S_IMODE(config.dra_socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.registration_socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.plugin_dir.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(config.dra_socket.stat().st_mode)


async def test_prepare_whole_gpu_writes_a_valid_spec(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_A, gpu=1))
    answers = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    assert answers[UID_A].error == ""
    assert answers[UID_A].devices == [
        (["gpu"], NODE, "gpu-1", [f"gpu.tangram.dev/claim={UID_A}-gpu-1"]),
    ]
    path = harness.spec_path(UID_A)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    spec = json.loads(path.read_text())
    assert list(schema_validator().iter_errors(spec)) == []
    assert spec["cdiVersion"] == "0.6.0"
    assert spec["kind"] == "gpu.tangram.dev/claim"
    assert spec["annotations"]["gpu.tangram.dev/claim-uid"] == UID_A
    assert spec["devices"] == [
        {"name": f"{UID_A}-gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}}
    ]
    assert spec["containerEdits"] == {
        "env": [f"NVIDIA_VISIBLE_DEVICES={GPU1}"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl"},
            {"path": "/dev/nvidia-uvm"},
            {"path": "/dev/nvidia-uvm-tools"},
        ],
    }
    assert [type(e) for e in harness.events] == [ClaimPrepared]
    event = harness.events[0]
    assert isinstance(event, ClaimPrepared)
    assert (event.key, event.node, event.uid, event.name) == ("node-a", NODE, UID_A, "train")
    assert event.devices[0].cdi_device_ids == [f"gpu.tangram.dev/claim={UID_A}-gpu-1"]


async def test_prepare_mig_waits_for_the_partition_result(harness: PluginHarness) -> None:
    harness.source.observe(mig_allocation(UID_M, start=2))
    call = asyncio.create_task(harness.kubelet.prepare(harness.endpoint, [("ml", "embed", UID_M)]))
    await asyncio.wait_for(harness.source.waiting.wait(), 30)
    assert not call.done()  # no MIG instance yet: the call waits for it
    harness.source.observe(partition_applied(UID_M, start=2))
    answers = await call
    assert answers[UID_M].error == ""
    assert answers[UID_M].devices == [
        (["mig"], NODE, "gpu-1-mig-1g10gb-2", [f"gpu.tangram.dev/claim={UID_M}-gpu-1-mig-1g10gb-2"])
    ]
    spec = json.loads(harness.spec_path(UID_M).read_text())
    assert list(schema_validator().iter_errors(spec)) == []
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3"},
        {"path": "/dev/nvidia-caps/nvidia-cap122"},
        {"path": "/dev/nvidia-caps/nvidia-cap123"},
    ]
    assert spec["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=MIG-00000002-aaaa-bbbb-cccc-dddddddddddd"
    ]


async def test_second_prepare_returns_the_same_answer(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_A))
    first = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    second = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    assert first == second
    assert first[UID_A].devices == [(["gpu"], NODE, "gpu-0", [f"gpu.tangram.dev/claim={UID_A}-gpu-0"])]
    assert len(harness.events) == 1  # the repeat changed nothing, so it announced nothing


async def test_fifty_claims_prepared_concurrently(harness: PluginHarness) -> None:
    uids = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(50)]
    for i, uid in enumerate(uids):
        harness.source.observe(whole_gpu_allocation(uid, gpu=i % 2, name=f"job-{i}"))
    calls = [
        harness.kubelet.prepare(harness.endpoint, [("default", f"job-{i}", uid)])
        for i, uid in enumerate(uids)
    ]
    results = await asyncio.gather(*calls)
    assert [r[uid].error for r, uid in zip(results, uids, strict=True)] == [""] * 50
    assert sorted(p.name for p in harness.config.cdi_dir.glob("*.json")) == sorted(
        f"gpu.tangram.dev-claim_{uid}.json" for uid in uids
    )
    validator = schema_validator()
    for uid in uids:
        assert list(validator.iter_errors(json.loads(harness.spec_path(uid).read_text()))) == []
    errors = await harness.kubelet.unprepare(
        harness.endpoint, [("default", f"job-{i}", u) for i, u in enumerate(uids)]
    )
    assert errors == dict.fromkeys(uids, "")
    assert list(harness.config.cdi_dir.glob("*.json")) == []


async def test_restart_keeps_prepared_claims(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_A))
    before = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    await harness.kubelet.close()
    await harness.stop()

    await harness.start(WatchedSource(NODE))  # knows nothing: the answer must come from disk
    after = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    assert after == before
    assert harness.spec_path(UID_A).is_file()
    assert await harness.kubelet.unprepare(harness.endpoint, [("default", "train", UID_A)]) == {UID_A: ""}
    assert not harness.spec_path(UID_A).exists()


async def test_unprepare_is_idempotent_and_unknown_claims_succeed(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_A))
    await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)])
    assert await harness.kubelet.unprepare(harness.endpoint, [("default", "train", UID_A)]) == {UID_A: ""}
    assert await harness.kubelet.unprepare(harness.endpoint, [("default", "train", UID_A)]) == {UID_A: ""}
    assert await harness.kubelet.unprepare(harness.endpoint, [("default", "never", UID_B)]) == {UID_B: ""}
    assert [type(e) for e in harness.events] == [ClaimPrepared, ClaimUnprepared]


async def test_failed_partition_fails_only_its_claim(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_A))
    harness.source.observe(mig_allocation(UID_M, start=4, command_id="cmd-9"))
    harness.source.observe(partition_failed(UID_M, start=4, command_id="cmd-9"))
    answers = await harness.kubelet.prepare(
        harness.endpoint, [("default", "train", UID_A), ("ml", "embed", UID_M)]
    )
    assert answers[UID_A].error == ""
    assert answers[UID_A].devices[0][2] == "gpu-0"
    assert (
        "could not be created: the placement is taken (NVML_ERROR_INSUFFICIENT_RESOURCES)"
        in answers[UID_M].error
    )
    assert answers[UID_M].devices == []
    assert not harness.spec_path(UID_M).exists()


async def test_mig_instance_that_never_comes_times_out_with_a_reason(
    harness: PluginHarness, make_config: object
) -> None:
    await harness.kubelet.close()
    await harness.stop()
    harness.config = make_config(resolve_timeout_s=0.1)  # type: ignore[operator]
    await harness.start()
    harness.source.observe(mig_allocation(UID_M, start=5))
    answers = await harness.kubelet.prepare(harness.endpoint, [("ml", "embed", UID_M)])
    assert answers[UID_M].error.startswith("timed out after 0.1 s waiting for MIG instance 1g.10gb")


async def test_path_like_claim_uids_are_rejected(harness: PluginHarness) -> None:
    bad = ["../../etc/cron.d/x", "a/b", "..", "x\x00y", "UPPER/../case"]
    answers = await harness.kubelet.prepare(harness.endpoint, [("default", "evil", uid) for uid in bad])
    assert sorted(answers) == sorted(bad)
    for uid in bad:
        assert "neither an RFC 4122 UUID nor a DNS label" in answers[uid].error
    errors = await harness.kubelet.unprepare(harness.endpoint, [("default", "evil", uid) for uid in bad])
    assert all("neither an RFC 4122 UUID nor a DNS label" in errors[uid] for uid in bad)
    assert list(harness.config.cdi_dir.iterdir()) == []


async def test_plugin_registers_again_when_its_socket_is_deleted(harness: PluginHarness) -> None:
    assert harness.plugin is not None
    harness.config.registration_socket.unlink()  # what kubelet does to plugins_registry on restart
    async with asyncio.timeout(10):
        await harness.plugin.wait_for_registrations(2)
    assert harness.config.registration_socket.is_socket()
    info = await harness.kubelet.get_info("gpu.tangram.dev-reg.sock")
    assert (info.name, info.endpoint) == ("gpu.tangram.dev", str(harness.config.dra_socket))
    assert harness.plugin.registrations_served == 2


async def test_v1beta1_service_prepares_like_v1(harness: PluginHarness) -> None:
    harness.source.observe(whole_gpu_allocation(UID_B, gpu=1))
    beta = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_B)], version="v1beta1")
    v1 = await harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_B)], version="v1")
    assert beta == v1
    assert beta[UID_B].devices == [(["gpu"], NODE, "gpu-1", [f"gpu.tangram.dev/claim={UID_B}-gpu-1"])]
    assert await harness.kubelet.unprepare(
        harness.endpoint, [("default", "train", UID_B)], version="v1beta1"
    ) == {UID_B: ""}


async def test_whole_gpu_still_in_mig_mode_waits_until_mig_is_off(harness: PluginHarness) -> None:
    allocation = whole_gpu_allocation(UID_A, gpu=1)
    device = msgspec.structs.replace(allocation.devices[0], partition_command="off-1")
    harness.source.observe(msgspec.structs.replace(allocation, devices=[device], partitions=["off-1"]))
    call = asyncio.create_task(harness.kubelet.prepare(harness.endpoint, [("default", "train", UID_A)]))
    await asyncio.wait_for(harness.source.waiting.wait(), 30)
    assert not call.done()  # MIG mode still on: the call waits for the partitioner
    harness.source.observe(
        PartitionApplied(
            key=NODE,
            command_id="off-1",
            node=NODE,
            action="disable-mig",
            gpu_uuid=GPU1,
            gpu_index=1,
            profile="",
            placement=MigPlacement(start=0, size=8),
            claim_uid=UID_A,
        )
    )
    answers = await call
    assert answers[UID_A].error == ""
    assert answers[UID_A].devices == [(["gpu"], NODE, "gpu-1", [f"gpu.tangram.dev/claim={UID_A}-gpu-1"])]


async def test_each_prepare_call_is_timed(harness: PluginHarness) -> None:
    # the dashboard's prepare latency: one observation per NodePrepareResources call
    def count() -> float:
        return next(
            s.value for m in PREPARE_SECONDS.collect() for s in m.samples if s.name.endswith("_count")
        )

    before = count()
    harness.source.observe(whole_gpu_allocation(UID_B, gpu=1))
    await harness.kubelet.prepare(harness.endpoint, [("default", "a", UID_B)])
    await harness.kubelet.prepare(harness.endpoint, [("default", "a", UID_B)])
    assert count() == before + 2
