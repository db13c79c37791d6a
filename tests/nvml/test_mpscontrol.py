"""The MPS control stand-in, driven as a real process over its real socket."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tangram.nvml.sim.mpscontrol import ALREADY_RUNNING, NO_DAEMON
from tangram.nvml.sim.mpscontrol.commands import DaemonSettings, execute

CONTROL = [sys.executable, "-m", "tangram.nvml.sim.mpscontrol"]


class Pipe:
    """One pipe and log directory pair, and the stand-in run against it."""

    def __init__(self, root: Path) -> None:
        self.pipe, self.log = root / "pipe", root / "log"
        self.env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log),
        }

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CONTROL, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )

    def ask(self, *commands: str) -> subprocess.CompletedProcess[str]:
        return self.run(stdin="".join(f"{c}\n" for c in commands))

    def pid(self) -> int:
        return int((self.pipe / "nvidia-cuda-mps-control.pid").read_text())


def _alive(pid: int) -> bool:
    """Running, and not a zombie left for an init that does not reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pid: int) -> None:
    """Poll, bounded, until `pid` has exited: never a claim on how long that took."""
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid), f"process {pid} still runs"


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    # Short paths: a unix socket path has at most 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    here = Pipe(root)
    try:
        yield here
    finally:
        pid_file = here.pipe / "nvidia-cuda-mps-control.pid"
        if pid_file.exists() and pid_file.read_text().strip():
            pid = int(pid_file.read_text())
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def test_without_a_daemon_every_command_fails(pipe: Pipe) -> None:
    result = pipe.ask("get_server_list")
    assert (result.returncode, result.stdout) == (1, f"{NO_DAEMON}\n")
    assert pipe.run().returncode == 1  # even with no command at all


def test_daemon_starts_in_the_background_answers_and_quits(pipe: Pipe) -> None:
    started = pipe.run("-d")
    assert (started.returncode, started.stdout, started.stderr) == (0, "", "")
    assert (pipe.pipe / "control").is_socket()
    pid = pipe.pid()
    assert _alive(pid) and pid != os.getpid()
    assert os.getsid(pid) != os.getsid(0)  # detached: a session of its own

    listed = pipe.ask("get_server_list")
    assert (listed.returncode, listed.stdout) == (0, "")  # no client ever asked for a server

    result = pipe.ask("quit")
    assert (result.returncode, result.stdout) == (0, "")
    assert not (pipe.pipe / "control").exists()
    assert not (pipe.pipe / "nvidia-cuda-mps-control.pid").exists()
    _wait_gone(pid)  # it answers quit, then exits
    assert pipe.ask("get_server_list").stdout == f"{NO_DAEMON}\n"

    log = (pipe.log / "control.log").read_text().splitlines()
    assert f"Control {pid:>5}] Starting control daemon using socket {pipe.pipe}/control" in log[0]
    assert log[1].endswith(f"set env CUDA_MPS_PIPE_DIRECTORY={pipe.pipe}")
    assert [line.partition("] ")[2] for line in log[-4:]] == ["NEW UI", "Cmd:quit", "UI closed", "Exit"]


def test_second_daemon_on_the_same_pipe_directory_is_refused(pipe: Pipe) -> None:
    assert pipe.run("-d").returncode == 0
    first = pipe.pid()
    again = pipe.run("-d")
    assert (again.returncode, again.stdout) == (1, f"{ALREADY_RUNNING}\n")
    assert pipe.pid() == first and _alive(first)
    assert pipe.ask("get_server_list").returncode == 0
    pipe.ask("quit")


def test_a_killed_daemon_leaves_nothing_that_stops_the_next(pipe: Pipe) -> None:
    assert pipe.run("-d").returncode == 0
    first = pipe.pid()
    os.kill(first, signal.SIGKILL)
    _wait_gone(first)
    assert (pipe.pipe / "control").exists()  # stale socket
    assert pipe.ask("get_server_list").stdout == f"{NO_DAEMON}\n"
    assert pipe.run("-d").returncode == 0
    assert pipe.pid() != first
    assert pipe.ask("get_default_active_thread_percentage").stdout == "100.0\n"  # settings start afresh
    pipe.ask("quit")


def test_settings_are_kept_until_quit(pipe: Pipe) -> None:
    pipe.run("-d")
    result = pipe.ask(
        "get_default_active_thread_percentage",
        "set_default_active_thread_percentage 25",
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit 0 10G",
        "set_default_device_pinned_mem_limit GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26 512M",
        "get_default_device_pinned_mem_limit 0",
        "get_default_device_pinned_mem_limit GPU-6f1c2a4e-51b9-4d2e-9a57-7e0c3b8d1f26",
        "get_default_device_pinned_mem_limit 1",
    )
    assert (result.returncode, result.stdout.splitlines()) == (0, ["100.0", "25.0", "10G", "512M", "0M"])
    assert pipe.ask("get_default_active_thread_percentage").stdout == "25.0\n"  # a new connection
    pipe.ask("quit")
    pipe.run("-d")
    assert pipe.ask("get_default_active_thread_percentage").stdout == "100.0\n"
    pipe.ask("quit")


PERCENT = "set_default_active_thread_percentage"
LIMIT = "set_default_device_pinned_mem_limit"
BAD_PERCENT = "invalid percentage {!r} (a number from 1 to 100)"
BAD_LIMIT = "invalid limit {!r} (a positive integer followed by G or M)"


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        ("start_sever -uid 0", "Unrecognized command: 'start_sever'"),
        (f"{PERCENT} 0", f"{PERCENT}: " + BAD_PERCENT.format("0")),
        (f"{PERCENT} 100.5", f"{PERCENT}: " + BAD_PERCENT.format("100.5")),
        (f"{PERCENT} fifty", f"{PERCENT}: " + BAD_PERCENT.format("fifty")),
        (f"{PERCENT} -5", f"{PERCENT}: " + BAD_PERCENT.format("-5")),
        (PERCENT, f"{PERCENT}: takes 1 argument, got 0"),
        (f"{LIMIT} 0 10", f"{LIMIT}: " + BAD_LIMIT.format("10")),
        (f"{LIMIT} 0 10GB", f"{LIMIT}: " + BAD_LIMIT.format("10GB")),
        (f"{LIMIT} 0 0M", f"{LIMIT}: " + BAD_LIMIT.format("0M")),
        (f"{LIMIT} 0 1.5G", f"{LIMIT}: " + BAD_LIMIT.format("1.5G")),
        (
            f"{LIMIT} ../../etc 1G",
            f"{LIMIT}: invalid device '../../etc' (a device ordinal or a GPU-/MIG- UUID)",
        ),
        (f"{LIMIT} 10G", f"{LIMIT}: takes 2 arguments, got 1"),
        (
            "get_default_device_pinned_mem_limit",
            "get_default_device_pinned_mem_limit: takes 1 argument, got 0",
        ),
        ("get_server_list now", "get_server_list: takes no arguments, got 1"),
        ("quit -t 5", "quit: takes no arguments, got 2"),
    ],
)
def test_refusals(pipe: Pipe, command: str, reply: str) -> None:
    pipe.run("-d")
    result = pipe.ask(command, "get_default_active_thread_percentage")
    assert (result.returncode, result.stdout) == (1, f"{reply}\n100.0\n")  # refused, nothing changed
    assert pipe.ask("get_server_list").returncode == 0  # the daemon lives on
    pipe.ask("quit")


def test_a_refused_word_is_echoed_bounded_and_printable() -> None:
    reply = execute(DaemonSettings(), "x" * 500 + "\x1b[2J")
    assert not reply.ok and reply.text == f"Unrecognized command: '{'x' * 64}...'"
    reply = execute(DaemonSettings(), "bad\x1b[2J")
    assert reply.text == "Unrecognized command: 'bad\\x1b[2J'"


def test_unknown_option_is_a_usage_error(pipe: Pipe) -> None:
    result = pipe.run("-x")
    assert result.returncode == 1 and result.stderr.startswith("usage:")
    assert not pipe.pipe.exists()


def test_foreground_daemon_logs_to_stdout_and_exits_on_quit(pipe: Pipe) -> None:
    daemon = subprocess.Popen([*CONTROL, "-f"], env=pipe.env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (
            not (pipe.pipe / "control").is_socket() and daemon.poll() is None and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert pipe.pid() == daemon.pid
        assert pipe.ask("quit").returncode == 0
        out, _ = daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0
    assert "Starting control daemon using socket" in out and out.rstrip().endswith("Exit")


def test_a_daemon_that_cannot_start_says_why_before_detaching(pipe: Pipe) -> None:
    pipe.log.parent.mkdir(parents=True, exist_ok=True)
    pipe.log.write_text("a file where the log directory should be")
    result = pipe.run("-d")
    assert result.returncode == 1 and f"Cannot use {pipe.log}" in result.stderr
    assert pipe.ask("get_server_list").stdout == f"{NO_DAEMON}\n"


def test_a_socket_path_too_long_is_refused_by_the_daemon_and_unreachable_for_the_client(pipe: Pipe) -> None:
    deep = pipe.pipe / ("x" * 100)
    env = {**pipe.env, "CUDA_MPS_PIPE_DIRECTORY": str(deep)}
    result = subprocess.run(
        [*CONTROL, "-d"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 1 and f"Cannot listen on {deep}/control" in result.stderr
    ask = subprocess.run(
        CONTROL, input="get_server_list\n", capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert (ask.returncode, ask.stdout) == (1, f"{NO_DAEMON}\n")
