"""What the local cluster reads of its service processes: CPU time from /proc, as the benchmarks
account for each process, and whether a run of a service has started serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tangram.local.processes import ServiceProcess, process_cpu_seconds


def test_a_process_cpu_time_is_what_it_used_itself() -> None:
    # A child burns 0.3 s of CPU, then blocks on its stdin: /proc shows that much and the
    # interpreter's start, not seconds more.
    burn = "import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    with subprocess.Popen(
        [sys.executable, "-c", burn + "print('done', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        used = process_cpu_seconds(child.pid)
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
    assert used is not None and 0.3 <= used < 2.0


def test_a_process_that_is_gone_has_no_cpu_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=10)
    assert process_cpu_seconds(child.pid) is None  # reaped: its /proc entry is gone
    assert process_cpu_seconds(2**22 + 7) is None  # above the kernel's pid_max default


def test_a_restarted_service_serves_only_once_this_run_logged_its_start(tmp_path: Path) -> None:
    # The log is appended across runs: the last run's start line must not count for this one.
    log = tmp_path / "cdi-node-a.log"
    log.write_bytes(b'{"message": "service starting", "health_port": 41000}\n{"message": "stopping"}\n')
    with subprocess.Popen([sys.executable, "-c", "pass"]) as process:
        process.wait(timeout=10)
    service = ServiceProcess("cdi@node-a", process, log, [], {}, log_start=log.stat().st_size)
    assert not service.serving()
    with log.open("ab") as out:
        out.write(b"Traceback: a line that is not a start\n")
    assert not service.serving()
    with log.open("ab") as out:
        out.write(b'{"message": "service starting", "health_port": 41877}\n')
    assert service.serving()
    assert ServiceProcess("cdi@node-a", process, tmp_path / "absent.log", [], {}).serving() is False
