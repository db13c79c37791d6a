"""A local Tangram: embedded nats-server plus every service as its own OS process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tangram.natsserver import NatsServer


@dataclass(frozen=True)
class SimNode:
    name: str
    machine: str


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    module_args: list[str]
    env: dict[str, str]


@dataclass
class LocalCluster:
    nodes: list[SimNode]
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tgm-", dir="/tmp")))
    nats: NatsServer | None = None
    processes: list[ServiceProcess] = field(default_factory=list)
    # With a kubeconfig, discovery publishes ResourceSlices and cdi reads claims from that API server.
    kubeconfig: Path | None = None

    def kubelet_root(self, node: str) -> Path:
        return self.workdir / node / "kubelet"

    def cdi_dir(self, node: str) -> Path:
        return self.workdir / node / "cdi"

    def state_file(self, node: str) -> Path:
        return self.workdir / node / "gpus.json"

    def dra_socket(self, node: str, driver: str = "gpu.tangram.dev") -> Path:
        return self.kubelet_root(node) / "plugins" / driver / "dra.sock"

    @property
    def url(self) -> str:
        assert self.nats is not None
        return self.nats.url

    def start(self) -> None:
        self.nats = NatsServer(self.workdir / "nats").start()
        self._spawn("allocator", ["services.allocator"], {})
        for node in self.nodes:
            (self.workdir / node.name).mkdir(parents=True, exist_ok=True)
            env = {"TANGRAM_NODE_NAME": node.name}
            sim = ["--sim", node.machine, "--state-file", str(self.state_file(node.name))]
            kube = ["--kubernetes", "--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []
            self._spawn(f"discovery@{node.name}", ["services.discovery", *sim, "--refresh", "2", *kube], env)
            self._spawn(f"partitioner@{node.name}", ["services.partitioner", *sim], env)
            self._spawn(
                f"cdi@{node.name}",
                [
                    "services.cdi",
                    "--kubelet-root",
                    str(self.kubelet_root(node.name)),
                    "--cdi-dir",
                    str(self.cdi_dir(node.name)),
                    "--driver-root",
                    str(self.workdir / node.name / "driver-root"),
                    *kube,
                ],
                env,
            )

    def _spawn(self, name: str, module_args: list[str], env: dict[str, str]) -> None:
        self.processes.append(self._launch(name, module_args, env))

    def _launch(self, name: str, module_args: list[str], env: dict[str, str]) -> ServiceProcess:
        log_path = self.workdir / "logs" / f"{name.replace('@', '-')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ, TANGRAM_NATS_URL=self.url, TANGRAM_LOG_LEVEL="info", **env)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *module_args],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ServiceProcess(name, process, log_path, module_args, env)

    def service(self, name: str) -> ServiceProcess:
        return next(p for p in self.processes if p.name == name)

    def crash(self, name: str) -> None:
        """kill -9, as a node losing power or the OOM killer would."""
        service = self.service(name)
        service.process.kill()
        service.process.wait()

    def restart(self, name: str) -> None:
        service = self.service(name)
        self.processes[self.processes.index(service)] = self._launch(name, service.module_args, service.env)

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
        if self.nats is not None:
            self.nats.stop()
        return codes
