"""docker-compose.yml and the Dockerfile refer only to things that exist."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import yaml

from tests.deploy.settingsenv import MODULES, ROOT, settings_env_vars

SERVICES = {"allocator", "discovery", "partitioner", "cdi"}


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_settings_scan_finds_the_shared_variables() -> None:
    found = settings_env_vars()
    assert {"TANGRAM_NATS_URL", "TANGRAM_HEALTH_PORT", "TANGRAM_HEALTH_HOST", "TANGRAM_NODE_NAME"} <= found
    assert {"TANGRAM_SIM", "TANGRAM_CDI_DIR", "TANGRAM_POLICY"} <= found


def test_compose_runs_nats_with_jetstream_from_tangrams_image_unless_told() -> None:
    services = _compose()["services"]
    # the allocator's image, which carries the nats-server of the `embedded` extra
    assert services["nats"]["image"] == "${TANGRAM_NATS_IMAGE:-tangram-allocator:dev}"
    assert services["allocator"]["image"] == "tangram-allocator:dev"
    assert "embedded" in services["allocator"]["build"]["args"]["SERVICE_EXTRAS"].split(",")
    assert services["nats"]["environment"]["SERVICE"] == "nats"
    assert "-js" in services["nats"]["command"]
    assert set(services) >= SERVICES


def test_compose_builds_on_the_base_image_it_is_given() -> None:
    for name in ("allocator", "discovery"):
        args = _compose()["services"][name]["build"]["args"]
        assert args["BASE_IMAGE"] == "${TANGRAM_BASE_IMAGE:-python:3.11-slim}"


def test_compose_publishes_ports_on_the_hosts_loopback_only() -> None:
    # NATS runs without authentication here: nothing may listen on the host's other interfaces
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_compose_runs_a_three_server_nats_cluster_and_services_replicate_streams_on_it() -> None:
    services = _compose()["services"]
    servers = sorted(name for name in services if name.startswith("nats"))
    assert servers == ["nats", "nats-2", "nats-3"]
    routes = {f"nats-route://{name}:6222" for name in servers}
    names = set()
    for name in servers:
        command = services[name]["command"]
        assert set(command[command.index("--routes") + 1].split(",")) == routes
        assert command[command.index("--cluster_name") + 1] == "tangram"
        names.add(command[command.index("--server_name") + 1])
    assert len(names) == 3
    for name, service in services.items():
        if name.startswith("nats") or name == "driver-root":
            continue
        environment = service["environment"]
        assert set(environment["TANGRAM_NATS_URL"].split(",")) == {f"nats://{s}:4222" for s in servers}
        assert environment["TANGRAM_NATS_STREAM_REPLICAS"] == "3"


def test_compose_services_exist_and_set_only_known_variables() -> None:
    known = settings_env_vars()
    for name, service in _compose()["services"].items():
        if name.startswith("nats") or name == "driver-root":
            continue
        environment = service["environment"]
        module = environment["SERVICE"]
        assert (ROOT / "services" / module / "__main__.py").exists(), module
        unknown = {k for k in environment if k.startswith("TANGRAM_")} - known
        assert unknown == set(), f"{name} sets variables no settings module reads: {unknown}"
        assert "/healthz" in " ".join(service["healthcheck"]["test"])
        assert environment["TANGRAM_HEALTH_PORT"] == "8080"
        assert environment["TANGRAM_HEALTH_HOST"] == "0.0.0.0"


def test_compose_node_services_share_the_simulated_state_and_kubelet_dirs() -> None:
    services = _compose()["services"]
    volumes = {name: set(services[name]["volumes"]) for name in ("discovery", "partitioner", "cdi")}
    shared = "sim-state:/var/lib/tangram"
    assert all(shared in mounts for mounts in volumes.values())
    assert services["discovery"]["environment"]["TANGRAM_SIM_STATE_FILE"] == "/var/lib/tangram/sim-state.json"
    assert (
        services["partitioner"]["environment"]["TANGRAM_SIM_STATE_FILE"] == "/var/lib/tangram/sim-state.json"
    )
    assert {
        "kubelet-plugins:/var/lib/kubelet/plugins",
        "kubelet-registry:/var/lib/kubelet/plugins_registry",
        "cdi-specs:/var/run/cdi",
    } <= volumes["cdi"]
    node_names = {services[n]["environment"]["TANGRAM_NODE_NAME"] for n in volumes}
    assert node_names == {"sim-node-1"}


def test_compose_build_extras_exist_in_pyproject() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for service in _compose()["services"].values():
        build = service.get("build")
        if build is not None:
            assert set(build["args"]["SERVICE_EXTRAS"].split(",")) <= extras


def test_dockerfile_copies_existing_paths_and_runs_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE)
    sources = [source for line in copies for source in line.split()]
    assert sources, "no COPY lines found"
    for source in sources:
        assert (ROOT / source).exists(), source
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, flags=re.MULTILINE)
    assert re.findall(r"^FROM (.+)$", text, flags=re.MULTILINE) == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    assert re.search(r"^USER 10001:10001$", text, flags=re.MULTILINE)
    assert "ARG SERVICE_EXTRAS" in text
    entrypoint = (ROOT / "deploy/docker/entrypoint.sh").read_text()
    services = "allocator|discovery|partitioner|cdi|authcallout|admission|ui"
    assert f'{services}) module="services.$SERVICE"' in entrypoint
    assert 'exec nats-server "$@"' in entrypoint
    assert 'exec python -m "$module"' in entrypoint
    assert (ROOT / "deploy/docker/entrypoint.sh").stat().st_mode & 0o111


def test_manifest_environment_is_read_by_the_services() -> None:
    known = settings_env_vars() | {"TANGRAM_NATS_URL_FILE"}  # read by the image's entry point
    for path in (ROOT / "deploy/kubernetes").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            if document is None or document["kind"] not in ("Deployment", "DaemonSet"):
                continue
            for container in document["spec"]["template"]["spec"]["containers"]:
                names = {e["name"] for e in container.get("env", [])}
                service = next(e["value"] for e in container["env"] if e["name"] == "SERVICE")
                main = MODULES.get(service, ROOT / "services" / service / "__main__.py")
                assert main.exists(), service
                assert {n for n in names if n.startswith("TANGRAM_")} <= known, container["name"]
