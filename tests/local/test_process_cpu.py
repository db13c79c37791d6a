"""CPU time read from /proc, as the benchmarks account for each process."""

from __future__ import annotations

import subprocess
import sys

from tangram.local.processes import process_cpu_seconds


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
