"""A local Tangram: embedded nats-server (one, or a JetStream cluster) plus every service as its
own OS process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from tangram.cdi.simroot import lay_out_driver_root
from tangram.hardware.machines import MachineSpec, load_machine, rack_tray
from tangram.imex.domains import PID_FILE as IMEX_PID_FILE
from tangram.local.natsserver import NatsCluster, NatsServer
from tangram.natsauth.credentials import write_secret
from tangram.natsauth.permissions import ADMIN_USER, ALLOCATOR_USER, build_users, node_user, render_users
from tangram.nvml.sim.mpscontrol import PID_FILE as MPS_PID_FILE

# What the streams Job of the Kubernetes manifests runs, as the NATS admin user: with permissions,
# the services may check the streams but only the admin may create them.
_CREATE_STREAMS = """
import asyncio, os
from tangram.bus import Bus, BusConfig
async def main():
    config = BusConfig(
        servers=tuple(os.environ["TANGRAM_NATS_URL"].split(",")),
        name="streams",
        producer="streams",
        stream_replicas=int(os.environ.get("TANGRAM_NATS_STREAM_REPLICAS", "1")),
    )
    bus = await Bus.connect(config, wait_s=30)
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()
asyncio.run(main())
"""


@dataclass(frozen=True)
class SimNode:
    """A simulated node. With `rack`, the machine (a tray with an NVLink fabric, `gb200-tray`) is a
    tray of that GB200 NVL rack, in the clique of fabric-manager partition `partition`; its fabric
    registration may never have completed (`fabric_state`) or its bandwidth be degraded."""

    name: str
    machine: str
    rack: str | None = None
    partition: int | None = None
    fabric_state: Literal["completed", "in-progress", "not-started"] = "completed"
    degraded_bandwidth: bool = False

    def machine_spec(self) -> MachineSpec:
        machine = load_machine(self.machine)
        if self.rack is None:
            return machine
        return rack_tray(
            machine,
            node=self.name,
            rack=self.rack,
            partition=self.partition,
            state=self.fabric_state,
            degraded_bandwidth=self.degraded_bandwidth,
        )


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    module_args: list[str]
    env: dict[str, str]
    user: str | None = None
    log_start: int = 0  # the log's size when this run of the service began (the log is appended)

    def serving(self) -> bool:
        """Whether this run has logged its start (health port open, SIGTERM a graceful stop): until
        then a SIGTERM meets the interpreter's default action, an exit by the signal."""
        try:
            logged_health_port(self.log_path, since=self.log_start)
        except (LookupError, OSError, ValueError):  # ValueError: a start line half written
            return False
        return True


@dataclass
class LocalCluster:
    nodes: list[SimNode]
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tgm-", dir="/tmp")))
    nats: NatsServer | None = None
    processes: list[ServiceProcess] = field(default_factory=list)
    # More than one: a JetStream cluster of that many servers, streams replicated on each.
    nats_servers: int = 1
    nats_cluster: NatsCluster | None = None
    # With `auth`, NATS runs the authorization `tangram nats-config` generates and every service
    # connects as its own user (the allocator, node-<node>), as in production.
    auth: bool = False
    passwords: dict[str, str] = field(default_factory=dict, repr=False)
    # With a kubeconfig, discovery publishes ResourceSlices and cdi reads claims from that API server.
    kubeconfig: Path | None = None
    # With a kubeconfig too, the allocator decides the cluster's claims of pods held by the gate.
    decide_in_kubernetes: bool = False
    # Allocators started ("allocator", "allocator-2", ...): one leads, the others stand by.
    allocators: int = 1
    crashed: set[str] = field(default_factory=set)  # services killed by crash() and not restarted
    # Extra arguments for the allocator process (e.g. its Kubernetes mode).
    allocator_args: tuple[str, ...] = ()

    def kubelet_root(self, node: str) -> Path:
        return self.workdir / node / "kubelet"

    def cdi_dir(self, node: str) -> Path:
        return self.workdir / node / "cdi"

    def mps_root(self, node: str) -> Path:
        return self.workdir / node / "mps"

    def state_file(self, node: str) -> Path:
        return self.workdir / node / "gpus.json"

    def imex_root(self, node: str) -> Path:
        return self.workdir / node / "imex"

    def driver_root(self, node: str) -> Path:
        return self.workdir / node / "driver-root"

    def machine_source(self, node: SimNode) -> str:
        """What the node's services simulate: the shipped machine's name, or the file of a rack's
        tray (its own GPU UUIDs and the rack's fabric), written on first use."""
        if node.rack is None:
            return node.machine
        path = self.workdir / node.name / "machine.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(node.machine_spec().model_dump(mode="json"), sort_keys=False))
        return str(path)

    def dra_socket(self, node: str, driver: str = "gpu.tangram.dev") -> Path:
        return self.kubelet_root(node) / "plugins" / driver / "dra.sock"

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def urls(self) -> tuple[str, ...]:
        if self.nats_cluster is not None:
            return self.nats_cluster.urls
        assert self.nats is not None
        return (self.nats.url,)

    @property
    def stream_replicas(self) -> int:
        return self.nats_servers

    def url_for(self, user: str | None) -> str:
        """The NATS URL a user connects with (the plain URL without `auth`); the first server's."""
        return self.urls_for(user)[0]

    def urls_for(self, user: str | None) -> tuple[str, ...]:
        """Every server's URL as a user connects to it."""
        servers = self.nats_cluster.servers if self.nats_cluster is not None else [self.nats]
        found = []
        for server in servers:
            assert server is not None
            if user is None or not self.auth:
                found.append(server.url)
            else:
                found.append(f"nats://{user}:{self.passwords[user]}@{server.host}:{server.port}")
        return tuple(found)

    def start(self) -> None:
        config = None
        if self.auth:
            users = build_users([node.name for node in self.nodes])
            self.passwords = {user.name: user.password for user in users}
            config = self.workdir / "nats-auth.conf"
            write_secret(config, render_users(users))
        if self.nats_servers > 1:
            self.nats_cluster = NatsCluster(
                self.workdir / "nats", size=self.nats_servers, config_file=config
            ).start()
        else:
            self.nats = NatsServer(self.workdir / "nats", config_file=config).start()
        if self.auth:
            subprocess.run(
                [sys.executable, "-c", _CREATE_STREAMS],
                env=dict(
                    os.environ,
                    TANGRAM_NATS_URL=",".join(self.urls_for(ADMIN_USER)),
                    TANGRAM_NATS_STREAM_REPLICAS=str(self.stream_replicas),
                ),
                check=True,
                timeout=60,
                capture_output=True,
            )
        deciding = (
            ["--kubernetes", "--kubeconfig", str(self.kubeconfig)]
            if self.kubeconfig and self.decide_in_kubernetes
            else []
        )
        for index in range(self.allocators):
            name = "allocator" if index == 0 else f"allocator-{index + 1}"
            self._spawn(name, ["services.allocator", *deciding, *self.allocator_args], {}, ALLOCATOR_USER)
        for node in self.nodes:
            self._start_node(node)

    def add_node(self, node: SimNode) -> None:
        """A node joins the running cluster (as one cluster-autoscaler adds): its services start.
        Without NATS authorization only: the users are made for the nodes known at start."""
        if self.auth:
            raise ValueError(f"node {node.name} cannot join: NATS users are made at start")
        self.nodes.append(node)
        self._start_node(node)

    def _start_node(self, node: SimNode) -> None:
        (self.workdir / node.name).mkdir(parents=True, exist_ok=True)
        # A simulated node has no driver install; lay one out so its CDI specs are complete.
        driver_root = lay_out_driver_root(
            self.driver_root(node.name), load_machine(node.machine).driver_version
        )
        env = {"TANGRAM_NODE_NAME": node.name}
        user = node_user(node.name)
        sim = ["--sim", self.machine_source(node), "--state-file", str(self.state_file(node.name))]
        kube = ["--kubernetes", "--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []
        self._spawn(
            f"discovery@{node.name}", ["services.discovery", *sim, "--refresh", "2", *kube], env, user
        )
        self._spawn(f"partitioner@{node.name}", ["services.partitioner", *sim], env, user)
        self._spawn(
            f"cdi@{node.name}",
            [
                "services.cdi",
                "--kubelet-root",
                str(self.kubelet_root(node.name)),
                "--cdi-dir",
                str(self.cdi_dir(node.name)),
                "--driver-root",
                str(driver_root),
                *sim,
                "--mps-root",
                str(self.mps_root(node.name)),
                "--imex-root",
                str(self.imex_root(node.name)),
                *kube,
            ],
            env,
            user,
        )

    def _spawn(self, name: str, module_args: list[str], env: dict[str, str], user: str) -> None:
        self.processes.append(self._launch(name, module_args, env, user))

    def _launch(
        self, name: str, module_args: list[str], env: dict[str, str], user: str | None
    ) -> ServiceProcess:
        log_path = self.workdir / "logs" / f"{name.replace('@', '-')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_start = log_path.stat().st_size if log_path.exists() else 0
        full_env = dict(
            os.environ,
            TANGRAM_NATS_URL=",".join(self.urls_for(user)),
            TANGRAM_NATS_STREAM_REPLICAS=str(self.stream_replicas),
            TANGRAM_LOG_LEVEL="info",
            **env,
        )
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *module_args],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ServiceProcess(name, process, log_path, module_args, env, user, log_start)

    def service(self, name: str) -> ServiceProcess:
        return next(p for p in self.processes if p.name == name)

    @contextlib.contextmanager
    def frozen(self, name: str) -> Iterator[None]:
        """The service stopped in its tracks (SIGSTOP) while the block runs, then let go (SIGCONT):
        a process descheduled for a while, its connections still open."""
        process = self.service(name).process
        if process.poll() is not None:
            yield
            return
        os.kill(process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(process.pid, signal.SIGCONT)

    def crash(self, name: str) -> None:
        """kill -9, as a node losing power or the OOM killer would."""
        service = self.service(name)
        service.process.kill()
        service.process.wait()
        self.crashed.add(name)

    def restart(self, name: str) -> None:
        service = self.service(name)
        self.crashed.discard(name)
        self.processes[self.processes.index(service)] = self._launch(
            name, service.module_args, service.env, service.user
        )

    async def until_serving(self, timeout_s: float) -> bool:
        """Wait until every service's current run is serving (a restarted one may still be
        importing, when a SIGTERM would kill it rather than stop it); False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while not all(service.serving() for service in self.processes):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user and system) each kind of process has used so far, summed over the
        processes of the kind: `allocator`, `discovery`, `partitioner`, `cdi`, `nats-server`.
        Processes that are gone are left out."""
        pids = [(service.name.split("@")[0].split("-")[0], service.process.pid) for service in self.processes]
        servers = self.nats_cluster.servers if self.nats_cluster is not None else [self.nats]
        pids.extend(("nats-server", server.pid) for server in servers if server is not None and server.pid)
        used: dict[str, float] = {}
        for kind, pid in pids:
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                used[kind] = used.get(kind, 0.0) + seconds
        return used

    def dead(self) -> list[str]:
        """Services that exited on their own, with the last line they logged."""
        gone = []
        for service in self.processes:
            if service.process.poll() is not None:
                lines = service.log_path.read_text(errors="replace").strip().splitlines()
                gone.append(
                    f"{service.name} exited {service.process.returncode}: {lines[-1] if lines else ''}"
                )
        return gone

    def stop(self) -> dict[str, int]:
        """SIGTERM every service (graceful), then the NATS server; returns each exit code."""
        for service in self.processes:
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        codes: dict[str, int] = {}
        for service in self.processes:
            try:
                codes[service.name] = service.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                service.process.kill()
                codes[service.name] = service.process.wait()
        self._stop_node_daemons()
        if self.nats is not None:
            self.nats.stop()
        if self.nats_cluster is not None:
            self.nats_cluster.stop()
        return codes

    def _stop_node_daemons(self) -> None:
        """MPS control daemons and IMEX daemons outlive the cdi service on purpose (a restarted node
        adopts them); the simulated node they ran for is gone with the cluster, so they go too."""
        for node in self.nodes:
            pid_files = [
                *self.mps_root(node.name).glob(f"*/pipe/{MPS_PID_FILE}"),
                *self.imex_root(node.name).glob(f"*/{IMEX_PID_FILE}"),
            ]
            for pid_file in sorted(pid_files):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)


def process_cpu_seconds(pid: int) -> float | None:
    """The user and system CPU time a running process has used (Linux /proc); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # the fields after the command's closing parenthesis start at the 3rd; utime and stime are
    # the 14th and 15th, in clock ticks
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def leading_allocator(cluster: LocalCluster) -> str | None:
    """The allocator process that holds the lease now (it runs, and since it last started it
    logged acquiring the lease last: a process killed and started again appends to the same log)."""
    for service in cluster.processes:
        if not service.name.startswith("allocator") or service.process.poll() is not None:
            continue
        text = service.log_path.read_text(errors="replace")
        text = text[text.rfind('"service starting"') :]
        if text.rfind("leadership acquired") > text.rfind("leadership released"):
            return service.name
    return None


def logged_health_port(log: Path, since: int = 0) -> int:
    """The health port a service logged last in `log` past byte `since` (it picks a free one at
    each start, and a restarted service appends to the same log); LookupError while it has logged
    none (it is still starting)."""
    with log.open("rb") as file:
        file.seek(since)
        lines = file.read().decode(errors="replace").splitlines()
    port = next(
        (
            json.loads(line)["health_port"]
            for line in reversed(lines)
            if line.startswith("{") and "health_port" in line
        ),
        None,
    )
    if port is None:
        raise LookupError(f"no health port logged in {log} yet")
    return int(port)
