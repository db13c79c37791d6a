"""CDI content: device nodes, env, kind and names, the lowest cdiVersion, and schema validity."""

from __future__ import annotations

import json
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
import pytest

from tangram.cdi import (
    CdiKind,
    CdiSpecWriter,
    ClaimRef,
    InvalidCdiSpec,
    InvalidName,
    ResolvedAllocation,
    ResolvedDevice,
    build_spec,
    minimum_version,
    validate_claim_uid,
    validate_spec,
    validate_spec_bytes,
)
from tangram.cdi.devices import ImexGrant
from tangram.cdi.driver import DriverFiles
from tangram.cdi.spec import allocation_from_spec
from tangram.cdi.validation import schema_problems
from tests.kubelet.fakes import schema_validator

TESTDATA = Path(__file__).parent / "testdata"
KIND = CdiKind(vendor="gpu.tangram.dev", cls="claim")
UID = "2d8b8e77-5b2a-4e6a-9c7b-4f5b4e3b9c03"


def two_device_claim() -> ResolvedAllocation:
    return ResolvedAllocation(
        claim=ClaimRef(namespace="ml", name="mixed", uid=UID),
        devices=[
            ResolvedDevice(
                request="big", pool="n", device="gpu-0", gpu_index=0, gpu_uuid="GPU-a", gpu_minor=0
            ),
            ResolvedDevice(
                request="small",
                pool="n",
                device="gpu-2-mig-3g40gb-4",
                gpu_index=2,
                gpu_uuid="GPU-c",
                gpu_minor=2,
                mig_uuid="MIG-x",
                profile="3g.40gb",
                gi_cap_minor=30,
                ci_cap_minor=31,
            ),
        ],
    )


@pytest.mark.parametrize("path", sorted((TESTDATA / "good").glob("*.json")), ids=lambda p: p.name)
def test_official_good_examples_validate(path: Path) -> None:
    spec = validate_spec_bytes(path.read_bytes())
    assert spec["kind"] == "vendor.com/device"
    assert list(schema_validator().iter_errors(spec)) == []


@pytest.mark.parametrize("path", sorted((TESTDATA / "bad").glob("*.json")), ids=lambda p: p.name)
def test_official_bad_examples_are_rejected(path: Path) -> None:
    with pytest.raises(InvalidCdiSpec):
        validate_spec_bytes(path.read_bytes())


def test_spec_of_a_gpu_and_a_mig_instance() -> None:
    spec = build_spec(two_device_claim(), kind=KIND)
    assert spec["cdiVersion"] == "0.6.0"  # annotations need 0.6.0
    assert spec["devices"] == [
        {"name": f"{UID}-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {
            "name": f"{UID}-gpu-2-mig-3g40gb-4",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia2"},
                    {"path": "/dev/nvidia-caps/nvidia-cap30"},
                    {"path": "/dev/nvidia-caps/nvidia-cap31"},
                ]
            },
        },
    ]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-a,MIG-x"]
    assert spec["annotations"]["gpu.tangram.dev/claim"] == "ml/mixed"
    validate_spec(spec)
    assert list(schema_validator().iter_errors(spec)) == []


def test_a_claim_of_an_nvlink_domain_gets_the_domains_imex_channel_and_reads_back_with_it() -> None:
    grant = ImexGrant(domain="ml/train", channel=5, nodes=["tray-1", "tray-2"])
    allocation = msgspec.structs.replace(two_device_claim(), imex=grant)
    spec = build_spec(allocation, kind=KIND)
    assert spec["containerEdits"]["deviceNodes"][-1] == {"path": "/dev/nvidia-caps-imex-channels/channel5"}
    validate_spec(spec)
    assert list(schema_validator().iter_errors(spec)) == []
    assert allocation_from_spec(spec, kind=KIND).imex == grant
    plain = build_spec(two_device_claim(), kind=KIND)
    assert not any("imex" in n["path"] for n in plain["containerEdits"]["deviceNodes"])
    # with the driver's files, whose control nodes are the ones found, the channel stays
    driver = DriverFiles(
        version="580.95.05",
        library_dir="/usr/lib",
        libraries=(),
        binaries=(),
        firmware=(),
        control_nodes=("/dev/nvidiactl",),
    )
    nodes = build_spec(allocation, kind=KIND, driver=driver)["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == ["/dev/nvidiactl", "/dev/nvidia-caps-imex-channels/channel5"]


def test_driver_root_becomes_host_paths() -> None:
    spec = build_spec(two_device_claim(), kind=KIND, driver_root=PurePosixPath("/run/nvidia/driver"))
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}
    ]
    assert spec["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidiactl",
        "hostPath": "/run/nvidia/driver/dev/nvidiactl",
    }
    validate_spec(spec)


def base_spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/device",
        "devices": [{"name": "dev", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}],
    }
    spec.update(extra)
    return spec


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (base_spec(), "0.3.0"),
        (
            base_spec(containerEdits={"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}),
            "0.4.0",
        ),
        (base_spec(devices=[{"name": "0dev", "containerEdits": {}}]), "0.5.0"),
        (base_spec(containerEdits={"deviceNodes": [{"path": "/dev/x", "hostPath": "/h/dev/x"}]}), "0.5.0"),
        (base_spec(annotations={"a": "b"}), "0.6.0"),
        (base_spec(kind="vendor.com/dev.class"), "0.6.0"),
        (base_spec(devices=[{"name": "d", "annotations": {"a": "b"}, "containerEdits": {}}]), "0.6.0"),
        (base_spec(containerEdits={"additionalGids": [5]}), "0.7.0"),
        (base_spec(containerEdits={"intelRdt": {"closID": "c"}}), "0.7.0"),
        (base_spec(containerEdits={"netDevices": [{"hostInterfaceName": "eth1", "name": "n"}]}), "1.1.0"),
    ],
    ids=[
        "base",
        "mount-type",
        "digit-name",
        "host-path",
        "annotations",
        "dotted-class",
        "device-annotations",
        "gids",
        "rdt",
        "net",
    ],
)
def test_minimum_cdi_version(spec: dict[str, Any], version: str) -> None:
    assert minimum_version(spec) == version


def test_version_older_than_the_fields_need_is_invalid() -> None:
    with pytest.raises(InvalidCdiSpec, match=r"0.3.0 is too old for the fields used \(needs 0.6.0\)"):
        validate_spec(base_spec(annotations={"a": "b"}))


def test_duplicate_and_malformed_device_names_are_invalid() -> None:
    spec = base_spec(
        cdiVersion="0.6.0",
        devices=[
            {"name": "a", "containerEdits": {}},
            {"name": "a", "containerEdits": {}},
            {"name": "-x", "containerEdits": {}},
        ],
    )
    with pytest.raises(InvalidCdiSpec) as raised:
        validate_spec(spec)
    assert "duplicate device name 'a'" in str(raised.value)
    assert "'-x' is not a valid CDI device name" in str(raised.value)


@pytest.mark.parametrize("uid", [UID, "claim-7", "a"])
def test_claim_uids_accepted(uid: str) -> None:
    assert validate_claim_uid(uid) == uid


@pytest.mark.parametrize("uid", ["", "..", "../x", "a/b", "a\x00b", "A-B", "x" * 64, "-a", "a.b", " a"])
def test_claim_uids_refused(uid: str) -> None:
    with pytest.raises(InvalidName):
        validate_claim_uid(uid)


def test_writer_writes_readable_specs_atomically(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi", kind=KIND)
    path = writer.write(two_device_claim())
    assert path == (tmp_path / "cdi" / f"gpu.tangram.dev-claim_{UID}.json").resolve()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [path.name]  # no temp file left behind
    assert writer.read(UID) == two_device_claim()
    assert json.loads(path.read_text())["kind"] == "gpu.tangram.dev/claim"
    assert writer.remove(UID) is True
    assert writer.remove(UID) is False


def test_writer_refuses_a_symlinked_spec_path(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    outside = tmp_path / "elsewhere.json"
    (cdi / f"gpu.tangram.dev-claim_{UID}.json").symlink_to(outside)
    with pytest.raises(InvalidName, match="would leave"):
        CdiSpecWriter(cdi, kind=KIND).write(two_device_claim())
    assert not outside.exists()


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, replacement) for every place in a spec: a value of another JSON type, and for
    object members also their removal (the replacement `_REMOVED`)."""
    found: list[tuple[tuple[Any, ...], Any]] = []
    if path:
        wrong: Any = 7 if isinstance(value, str) else "seven"
        found.append((path, wrong))
        if isinstance(path[-1], str):
            found.append((path, _REMOVED))
        if isinstance(value, list):
            found.append((path, {}))
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    )
    for key, child in children:
        found.extend(_mutations(child, (*path, key)))
    return found


_REMOVED = object()


def _mutated(spec: dict[str, Any], path: tuple[Any, ...], replacement: Any) -> dict[str, Any]:
    copy: Any = json.loads(json.dumps(spec))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    if replacement is _REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    result: dict[str, Any] = copy
    return result


def test_the_compiled_schema_and_the_reference_validator_agree_on_every_mutation_of_a_spec() -> None:
    # the compiled schema decides alone for a valid spec: it must refuse exactly what the
    # reference validator of the official schema refuses
    grant = ImexGrant(domain="ml/train", channel=5, nodes=["tray-1"])
    files = DriverFiles(
        version="580.95.05",
        library_dir="/usr/lib/x86_64-linux-gnu",
        libraries=("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",),
        binaries=("/usr/bin/nvidia-smi",),
        firmware=("/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin",),
        control_nodes=("/dev/nvidiactl",),
    )
    allocation = msgspec.structs.replace(two_device_claim(), imex=grant)
    spec = build_spec(
        allocation, kind=KIND, driver=files, hook_path=PurePosixPath("/usr/bin/nvidia-cdi-hook")
    )
    assert schema_problems(spec) == []
    reference = schema_validator()
    mutations = _mutations(spec)
    refused = 0
    for path, replacement in mutations:
        mutated = _mutated(spec, path, replacement)
        expected = [e.message for e in reference.iter_errors(mutated)]
        found = schema_problems(mutated)
        assert bool(found) == bool(expected), (path, replacement, found, expected)
        refused += bool(expected)
    assert len(mutations) > 100 and refused > 80
