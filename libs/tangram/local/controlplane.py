"""A real Kubernetes control plane on loopback, for the tests and for local development.

The Go program in `tools/controlplane/` runs embedded etcd, kube-apiserver,
kube-controller-manager and kube-scheduler from one pinned `k8s.io/kubernetes` release in one
process. It is built per release (the newest Kubernetes Tangram is tested on and the oldest it
supports, `RELEASES`) into a cache directory keyed by the version and a hash of its source, so a
changed pin or program builds anew and an unchanged one is reused.

`ControlPlane` starts it on free loopback ports with a temporary data directory, reads readiness
from the program's own output (it prints one line once every component answers its health
check), and stops it by pid. Nodes are plain Node objects marked Ready: no kubelet runs.

`python -m tangram.local.controlplane build [VERSION...]` builds the binaries that are missing
(every release when no version is named) and prints their paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes_asyncio.client import CoreV1Api

from tangram.kubernetes.api.client import call, connect
from tangram.kubernetes.api.layout import layout_for_server
from tangram.kubernetes.objects.limits import K8sVersion
from tangram.local.gobuild import build_once, cache_root
from tangram.local.launch import end_process


@dataclass(frozen=True)
class Release:
    """A Kubernetes release the control plane is built for, and what its DRA features need.

    `modfile` is the Go module file that pins it in tools/controlplane/ (go.mod pins the newest;
    an older release has its own `k8s-<version>.mod` and `.sum`, given to the go command with
    -modfile)."""

    version: str  # "v1.37.2"
    modfile: str
    dra_alpha: bool  # partitionable devices and device taints are alpha (1.34) rather than on by default
    # the Workload API (scheduling.k8s.io PodGroups, pods' spec.schedulingGroup): beta and off by
    # default in 1.37 (GenericWorkload), turned on here so that groups of pods can be named by it
    workload_api: bool = False

    @property
    def minor(self) -> str:
        """ "1.37": the version as the slice layouts and schemas name it."""
        major, minor, _ = self.version.removeprefix("v").split(".")
        return f"{major}.{minor}"

    @property
    def layout(self) -> K8sVersion:
        """The ResourceSlice layout its API server validates."""
        return layout_for_server(*self.minor.split("."))

    def gates(self, *, partitionable: bool = True) -> dict[str, bool]:
        """Counter sets and devices consuming them (MIG placements) on or off; device taints on; the
        Workload API on where the release has it."""
        gates = {"DRAPartitionableDevices": partitionable, "DRADeviceTaints": True}
        if self.workload_api:
            gates["GenericWorkload"] = True
        return gates

    def runtime_config(self, gates: Mapping[str, bool]) -> str:
        """The API versions the gated features are served at. On 1.34 with device taints on,
        kube-scheduler and the controller manager watch DeviceTaintRules, served only at
        resource.k8s.io/v1alpha3: without it their caches never sync and no pod is ever scheduled.
        From 1.36 DeviceTaintRule is served by default. PodGroups are served at
        scheduling.k8s.io/v1beta1 in 1.37, not by default."""
        served = []
        if self.dra_alpha and gates.get("DRADeviceTaints"):
            served.append("resource.k8s.io/v1alpha3=true")
        if gates.get("GenericWorkload"):
            served.append("scheduling.k8s.io/v1beta1=true")
        return ",".join(served)


NEWEST = Release("v1.37.2", "go.mod", dra_alpha=False, workload_api=True)
OLDEST = Release("v1.34.4", "k8s-v1.34.4.mod", dra_alpha=True)
RELEASES: tuple[Release, ...] = (OLDEST, NEWEST)


_READY = "TANGRAM-CONTROLPLANE READY "
# measured: about 5 minutes per release on 2 idle cores (8 with the machine busy); over an hour at
# nice 10 on a shared, heavily loaded 2-core machine
_COLD_BUILD_HINT = "about 5 minutes on 2 idle cores the first time (module download and compile)"


class ControlPlaneError(RuntimeError):
    """The binary is missing or failed to build, start or become ready; the message says which."""


def release(version: str) -> Release:
    """The release by its version, "v1.37.2" or "1.37"; the message lists the ones built."""
    for known in RELEASES:
        if version in (known.version, known.minor, known.version.removeprefix("v")):
            return known
    built = ", ".join(r.version for r in RELEASES)
    raise ControlPlaneError(f"no control plane for Kubernetes {version}: the versions built are {built}")


def source_dir() -> Path:
    """The Go program's source, in the repository this package is installed from (editable)."""
    explicit = os.environ.get("TANGRAM_CONTROLPLANE_SRC")
    if explicit:
        return Path(explicit)
    return Path(__file__).resolve().parents[3] / "tools" / "controlplane"


def _source_files(rel: Release) -> tuple[str, ...]:
    # go.mod must be there (it marks the module root) even when -modfile names another file
    return ("main.go", "go.mod", rel.modfile, rel.modfile.removesuffix(".mod") + ".sum")


def binary_path(rel: Release = NEWEST, source: Path | None = None) -> Path:
    """Where the binary for this release and source lives:
    `<cache>/<version>-<hash of the source>/controlplane`."""
    source = source or source_dir()
    digest = hashlib.sha256(_version_ldflags(rel).encode() + b"\0")
    for name in dict.fromkeys(_source_files(rel)):
        try:
            digest.update(name.encode() + b"\0" + (source / name).read_bytes() + b"\0")
        except OSError as error:
            raise ControlPlaneError(f"control plane source incomplete in {source}: {error}") from error
    return cache_root("controlplane") / f"{rel.version}-{digest.hexdigest()[:12]}" / "controlplane"


def find_binary(rel: Release = NEWEST) -> Path:
    """$TANGRAM_CONTROLPLANE_<major>_<minor> (e.g. TANGRAM_CONTROLPLANE_1_37), else the cached
    build of the current source; never builds."""
    explicit = os.environ.get(binary_variable(rel))
    if explicit:
        return Path(explicit)
    path = binary_path(rel)
    if not path.exists():
        raise ControlPlaneError(f"control plane binary {path} not built yet: run `make controlplane`")
    return path


def binary_variable(rel: Release) -> str:
    return "TANGRAM_CONTROLPLANE_" + rel.minor.replace(".", "_")


def build(rel: Release = NEWEST, *, out: Any = sys.stderr) -> Path:
    """Build the release's binary into its cache directory unless it is there already; returns its path."""
    source = source_dir()
    modfile = [] if rel.modfile == "go.mod" else [f"-modfile={rel.modfile}"]
    return build_once(
        binary_path(rel, source),
        lambda staging: [
            "build",
            *modfile,
            "-trimpath",
            f"-ldflags=-s -w {_version_ldflags(rel)}",
            "-o",
            str(staging / "controlplane"),
            ".",
        ],
        what=f"the Kubernetes {rel.version} control plane",
        hint=_COLD_BUILD_HINT,
        error=ControlPlaneError,
        cwd=source,
        out=out,
    )


def _version_ldflags(rel: Release) -> str:
    """The version the servers report (/version): a build from the module leaves it unset."""
    major, minor, _ = rel.version.removeprefix("v").split(".")
    package = "k8s.io/component-base/version"
    return " ".join(
        f"-X {package}.{name}={value}"
        for name, value in (
            ("gitVersion", rel.version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together while choosing, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def gates_flag(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))


@dataclass(frozen=True)
class Endpoints:
    server: str  # https://127.0.0.1:<port>
    kubeconfig: Path
    ca_file: Path
    token: str
    scheduler: str  # kube-scheduler's secure port (/metrics, /healthz): https://127.0.0.1:<port>


class ControlPlane:
    """One control plane process. Use as a context manager, or `start()` and `stop()`."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        binary: Path | None = None,
        release: Release = NEWEST,
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: str = "",
        controllers: Iterable[str] = (),
        startup_timeout: float = 120.0,
        client_qps: int | None = None,
    ) -> None:
        self._binary = binary
        self.release = release
        self._data_dir = data_dir
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        self.feature_gates = dict(release.gates() if feature_gates is None else feature_gates)
        self.runtime_config = runtime_config or release.runtime_config(self.feature_gates)
        self.controllers = tuple(controllers)
        # kube-apiserver, etcd (client, peer), kube-scheduler, kube-controller-manager: chosen at
        # the first start and kept, so that a restart serves where its clients look
        self._ports: tuple[int, ...] | None = None
        self.startup_timeout = startup_timeout
        # kube-controller-manager's and kube-scheduler's own request rate to the API server (their
        # defaults, 20 and 50 a second, when None): a benchmark of hundreds of pods at once lifts
        # them, as scheduler_perf runs its components unthrottled, or the controller that makes
        # each pod's claim would set the pace for every decider alike.
        self.client_qps = client_qps
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._ready_line: dict[str, Any] | None = None
        self._output: list[str] = []
        self._endpoints: Endpoints | None = None
        self.startup_s: float | None = None

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise ControlPlaneError("the control plane is not running")
        return self._endpoints

    @property
    def server(self) -> str:
        return self.endpoints.server

    @property
    def kubeconfig(self) -> Path:
        return self.endpoints.kubeconfig

    @property
    def token(self) -> str:
        return self.endpoints.token

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise ControlPlaneError("the control plane is not running")
        return self._data_dir

    @property
    def log_file(self) -> Path:
        return self.data_dir / "controlplane.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def client(self) -> Any:
        """A kubernetes_asyncio ApiClient authenticated as cluster admin; close it when done."""
        return await connect(kubeconfig=self.kubeconfig)

    def start(self) -> ControlPlane:
        if self._process is not None and self._process.poll() is None:
            raise ControlPlaneError("the control plane is already running")
        binary = self._binary or find_binary(self.release)
        if self._data_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="tangram-controlplane-")
            self._data_dir = Path(self._own_dir.name)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        if self._ports is None:
            self._ports = tuple(free_ports(5))
        apiserver, etcd, peer, scheduler, controllers = self._ports
        command = [
            str(binary),
            f"--data-dir={self._data_dir}",
            f"--apiserver-port={apiserver}",
            f"--etcd-port={etcd}",
            f"--etcd-peer-port={peer}",
            f"--scheduler-port={scheduler}",
            f"--controller-manager-port={controllers}",
            f"--feature-gates={gates_flag(self.feature_gates)}",
            f"--ready-timeout={int(self.startup_timeout)}s",
        ]
        if self.runtime_config:
            command.append(f"--runtime-config={self.runtime_config}")
        if self.controllers:
            command.append(f"--controllers={','.join(self.controllers)}")
        if self.client_qps is not None:
            limits = [f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={2 * self.client_qps}"]
            command += [f"--controller-manager-arg={flag}" for flag in limits]
            command += [f"--scheduler-arg={flag}" for flag in limits]
        self._ready.clear()
        self._ready_line = None
        self._output = []
        started = time.monotonic()
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
            )
        self._reader = threading.Thread(target=self._read_output, name="controlplane-output", daemon=True)
        self._reader.start()
        deadline = started + self.startup_timeout + 10
        while not self._ready.wait(0.05):
            if self._process.poll() is not None or time.monotonic() > deadline:
                why = (
                    "exited" if self._process.poll() is not None else f"not ready in {self.startup_timeout}s"
                )
                tail = self._log_tail()
                self._terminate()
                raise ControlPlaneError(f"control plane {why}; last log lines:\n{tail}")
        self.startup_s = time.monotonic() - started
        ready: dict[str, Any] = self._ready_line or {}
        self._endpoints = Endpoints(
            server=str(ready["server"]),
            kubeconfig=Path(ready["kubeconfig"]),
            ca_file=Path(ready["ca"]),
            token=Path(ready["token_file"]).read_text().strip(),
            scheduler=f"https://127.0.0.1:{scheduler}",
        )
        self._await_scheduler_synced(deadline)
        return self

    @property
    def scheduler_ca(self) -> Path:
        """The certificate kube-scheduler made for itself and serves its secure port with."""
        return self.data_dir / "pki" / "scheduler" / "kube-scheduler.crt"

    def _await_scheduler_synced(self, deadline: float) -> None:
        """Healthy is not ready: kube-scheduler binds nothing until its informers have synced
        (`/readyz`, check sched-handler-sync), which on a loaded machine took longer than a test
        waits for its first pod."""
        assert self._endpoints is not None
        context = ssl.create_default_context(cafile=str(self.scheduler_ca))
        context.check_hostname = False  # its certificate names no 127.0.0.1
        last = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(  # noqa: S310 - the scheduler's own https URL
                    f"{self._endpoints.scheduler}/readyz", context=context, timeout=5
                ) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError) as error:
                last = str(error)
            time.sleep(0.1)
        tail = self._log_tail()
        self._terminate()
        raise ControlPlaneError(f"kube-scheduler not ready ({last}); last log lines:\n{tail}")

    def _read_output(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        for line in process.stdout:
            self._output.append(line.rstrip())
            if line.startswith(_READY):
                self._ready_line = json.loads(line[len(_READY) :])
                self._ready.set()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        return "\n".join(self._output[-5:] + text[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """Graceful stop (SIGTERM) by pid, SIGKILL if it does not exit in time; removes its own data dir."""
        self._terminate(timeout)
        self._endpoints = None
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = None
            self._data_dir = None

    def crash_and_restart(self) -> float:
        """kill -9 of every component (etcd and kube-apiserver with them), then start again on the
        same data, ports and credentials, as a control-plane machine losing power and coming back;
        returns the seconds it took to be ready again."""
        process = self._process
        if process is None:
            raise ControlPlaneError("the control plane is not running")
        os.killpg(process.pid, signal.SIGKILL)
        self._terminate(timeout=10.0)
        started = time.monotonic()
        self.start()
        return time.monotonic() - started

    def _terminate(self, timeout: float = 20.0) -> None:
        process = self._process
        if process is None:
            return
        end_process(process, timeout=timeout, reader=self._reader, pipe=process.stdout)
        self._reader = None
        self._process = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


async def register_node(
    api: Any,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    pods: int = 110,
    address: str | None = None,
) -> Any:
    """Create a Node the scheduler can place pods on, as a kubelet would register it (with
    `address` as its InternalIP, as a kubelet reports it).

    No kubelet or node-lifecycle controller runs, so the not-ready taint the API server adds at
    creation is lifted here and the Ready condition and allocatable resources are set directly.
    """
    core = CoreV1Api(api)
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
    }
    await call(f"create Node {name}", core.create_node(body))
    await call(f"lift the not-ready taint of Node {name}", core.patch_node(name, {"spec": {"taints": None}}))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "64", "memory": "512Gi", "pods": str(pods)}
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "registered by Tangram's test kubelet",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }
    if address is not None:
        status["status"]["addresses"] = [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": name},
        ]
    return await call(f"mark Node {name} ready", core.patch_node_status(name, status))


def main(argv: list[str] | None = None) -> int:
    """`build [VERSION...]`: build the control plane for each version (all releases when none)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["build"]:
        print("usage: python -m tangram.local.controlplane build [VERSION...]", file=sys.stderr)
        return 2
    try:
        for rel in [release(v) for v in args[1:]] or list(RELEASES):
            print(build(rel))
    except ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
