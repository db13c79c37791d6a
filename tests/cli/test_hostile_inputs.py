"""Every `tangram` command over hostile input: one line naming the problem, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import tangram
from tests.support.machinegen import write_machine

FLEET = "- {name: n, machine: l40s-8}\n"
CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: %s, namespace: ml%s}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tangram.dev, count: %d}
"""


def claim(name: str, count: int = 1, uid: str = "") -> str:
    return CLAIM % (name, f", uid: {uid!r}" if uid else "", count)


TEXTS = {
    "fleet": FLEET,
    "trace": claim("a"),
    "deep": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-block": "".join(" " * i + "- \n" for i in range(5000)),
    "laughs": "a: &a [x,x,x,x,x,x,x,x,x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)),
    "recursive": "- &a [1, *a]\n",
    "count": "- {name: n, machine: l40s-8, count: 100000000}\n",
    "bad-name": "- {name: ../../x, machine: l40s-8}\n",
    "dup-spec": claim("a", 1) + "---\n" + claim("b") + "---\n" + claim("a", 2),
    "dup-uid": claim("a", 1, "u-1") + "---\n" + claim("b", 1, "u-1"),
    "not-a-mapping": "- 1\n- 2\n",
    "syntax": "a: [1,\n",
    "text": "just words\n",
    "control": "\x1f- {name: n, machine: l40s-8}\n",
}


class Files:
    """The hostile files of the table, each made when a case first names it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def __getitem__(self, name: str) -> Path:
        path = self.tmp / name
        if name in TEXTS and not path.exists():
            path.write_text(TEXTS[name])
        elif name == "non-utf8" and not path.exists():
            path.write_bytes(b"- {name: n, machine: \xff\xfe}\n")
        elif name == "dir":
            path.mkdir(exist_ok=True)
        elif name == "fifo" and not path.exists():
            os.mkfifo(path)
        elif name == "file-as-dir":
            return self["trace"] / "credentials"
        elif name == "machine-129" and not path.exists():
            write_machine(path, 129)
        elif name == "fleet-129" and not path.exists():
            path.write_text(f"- {{name: n, machine: {self['machine-129']}}}\n")
        return path


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Files], list[str]]
    message: str  # a part of the one line that names the problem


def allocate(fleet: str, trace: str) -> Callable[[Files], list[str]]:
    return lambda f: ["allocate", "--fleet", str(f[fleet]), "--trace", str(f[trace])]


def nats(*extra: str, creds: str = "") -> Callable[[Files], list[str]]:
    def argv(f: Files) -> list[str]:
        out = str(f["dir"] / "nats.conf")
        credentials = str(f[creds]) if creds else str(f["dir"] / "creds")
        resolved = [str(f[a[1:]]) if a.startswith("@") else a for a in extra]
        return ["nats-config", "--node", "a", "--credentials-dir", credentials, "--out", out, *resolved]

    return argv


CASES = [
    Case("allocate-non-utf8-fleet", allocate("non-utf8", "trace"), "not UTF-8 text (byte 0xff at offset 21)"),
    Case("allocate-deep-trace", allocate("fleet", "deep"), "nested deeper than 100 levels"),
    Case("allocate-deep-block-trace", allocate("fleet", "deep-block"), "nested deeper than 100 levels"),
    Case("allocate-alias-bomb", allocate("fleet", "laughs"), "expands to more than 2000000 nodes"),
    Case("allocate-recursive-alias", allocate("recursive", "trace"), "a recursive alias"),
    Case(
        "allocate-dev-zero-trace",
        lambda f: ["allocate", "--fleet", str(f["fleet"]), "--trace", "/dev/zero"],
        "trace /dev/zero: larger than the limit of 16 MiB",
    ),
    Case("allocate-fleet-count", allocate("count", "trace"), "more than 10000 nodes"),
    Case("allocate-fleet-bad-name", allocate("bad-name", "trace"), "is not a Kubernetes node name"),
    Case("allocate-fleet-directory", allocate("dir", "trace"), "is a directory, not a file"),
    Case("allocate-missing-trace", allocate("fleet", "missing"), "missing: no such file"),
    Case("allocate-fifo-fleet", allocate("fifo", "trace"), "expected a non-empty YAML list of nodes"),
    Case("allocate-fleet-not-nodes", allocate("not-a-mapping", "trace"), "needs name (string) and machine"),
    Case("allocate-trace-syntax", allocate("fleet", "syntax"), "not valid YAML"),
    Case("allocate-control-character", allocate("control", "trace"), "special characters are not allowed"),
    Case("allocate-trace-text", allocate("fleet", "text"), "document [0] (line 1): expected a mapping"),
    Case(
        "allocate-duplicate-name",
        allocate("fleet", "dup-spec"),
        "document [2] (line 22): claim ml/a was already given with another spec by document [0] (line 2)",
    ),
    Case(
        "allocate-duplicate-uid",
        allocate("fleet", "dup-uid"),
        "document [1] (line 12): claim ml/b has uid 'u-1', which document [0] (line 2) gave to claim ml/a",
    ),
    Case("discover-dev-zero", lambda f: ["discover", "--sim", "/dev/zero"], "larger than the limit of 1 MiB"),
    Case(
        "discover-machine-over-bound",
        lambda f: ["discover", "--sim", str(f["machine-129"])],
        "machine-129: 129 GPUs, more than the limit of 128 per machine",
    ),
    Case(
        "mig-machine-over-bound",
        lambda f: ["mig", "show", "--sim", str(f["machine-129"])],
        "machine-129: 129 GPUs, more than the limit of 128 per machine",
    ),
    Case(
        "allocate-machine-over-bound",
        allocate("fleet-129", "trace"),
        "machine-129: 129 GPUs, more than the limit of 128 per machine",
    ),
    Case(
        "demo-machine-over-bound",
        lambda f: ["demo", "--node", f"a={f['machine-129']}"],
        "129 GPUs, more than the limit of 128 per machine",
    ),
    Case("discover-deep-machine", lambda f: ["discover", "--sim", str(f["deep"])], "nested deeper than"),
    Case("discover-non-utf8", lambda f: ["discover", "--sim", str(f["non-utf8"])], "not UTF-8 text"),
    Case("discover-directory", lambda f: ["discover", "--sim", str(f["dir"])], "is a directory"),
    Case("discover-unknown", lambda f: ["discover", "--sim", "no-such-machine"], "no machine named"),
    Case(
        "discover-state-dev-zero",
        lambda f: ["discover", "--sim", "l40s-8", "--state-file", "/dev/zero"],
        "state file /dev/zero: larger than the limit",
    ),
    Case(
        "discover-state-directory",
        lambda f: ["discover", "--sim", "l40s-8", "--state-file", str(f["dir"])],
        "is a directory, not a file",
    ),
    Case(
        "mig-state-garbage",
        lambda f: ["mig", "show", "--sim", "l40s-8", "--state-file", str(f["non-utf8"])],
        "is not a simulator state",
    ),
    Case("mig-dev-zero", lambda f: ["mig", "show", "--sim", "/dev/zero"], "larger than the limit"),
    Case("nats-unwritable-credentials", nats(creds="file-as-dir"), "cannot write"),
    Case("nats-bad-ipv6", nats("--server-url", "nats://[::1"), "is not a NATS URL: Invalid IPv6 URL"),
    Case("nats-bad-port", nats("--server-url", "nats://h:99999"), "is not a NATS URL: Port out of range"),
    Case("nats-not-a-url", nats("--server-url", "http://h"), "is not a NATS URL"),
    Case(
        "nats-verify-without-ca",
        nats("--tls-verify", "--tls-cert", "@fleet", "--tls-key", "@fleet"),
        "--tls-verify needs --tls-ca",
    ),
    Case("nats-missing-cert", nats("--tls-cert", "@missing", "--tls-key", "@fleet"), "--tls-cert"),
    Case("nats-bad-node", nats("--node", "../a"), "is not a valid node name"),
    Case(
        "nats-out-directory",
        lambda f: [
            "nats-config",
            "--node",
            "a",
            "--credentials-dir",
            str(f["dir"] / "c"),
            "--out",
            str(f["dir"]),
        ],
        "is a directory",
    ),
    Case("demo-nan-duration", lambda f: ["demo", "--duration", "nan"], "--duration must be from 0"),
    Case("demo-bad-machine", lambda f: ["demo", "--node", "a=/dev/zero"], "larger than the limit"),
    Case("demo-bad-node", lambda f: ["demo", "--node", "A/B=l40s-8"], "is not a valid node name"),
    Case("demo-not-pair", lambda f: ["demo", "--node", "x"], "is not NAME=MACHINE"),
    Case("bench-allocator-nodes", lambda f: ["bench", "allocator", "--nodes", "-1"], "must be positive"),
    Case("bench-prepare-zero", lambda f: ["bench", "prepare", "--concurrency", "0"], "must be at least 1"),
    Case("bench-rebuild-claims", lambda f: ["bench", "rebuild", "--claims", "-1"], "must be positive"),
    Case("unknown-command", lambda f: ["explode"], "invalid choice: 'explode'"),
    Case("allocate-missing-flag", lambda f: ["allocate", "--fleet", str(f["fleet"])], "--trace"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_gets_one_clear_line(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tangram(capsys, *case.argv(Files(tmp_path)))
    assert code != 0
    assert "Traceback" not in err and "unexpected error" not in err
    assert case.message in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv",
    [
        ["allocate", "--fleet", "/dev/zero", "--trace", "/dev/zero"],
        ["discover", "--sim", "l40s-8", "--state-file", "/dev/zero"],
        ["nats-config", "--node", "a", "--server-url", "nats://[::1", "--out", "/dev/null/x"],
    ],
    ids=["allocate-dev-zero", "state-dev-zero", "nats-bad-url"],
)
def test_the_real_command_exits_with_one_line(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tangram.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("- {name: n, machine: l40s-8, count: 100}\n")
    trace = tmp_path / "many.yaml"
    trace.write_text("---\n".join(claim(f"c{i}") for i in range(30)))
    # With --explain each line names the 100 nodes: more than a pipe holds once the reader is gone.
    argv = ["allocate", "--fleet", str(fleet), "--trace", str(trace), "--explain"]
    reader = subprocess.Popen(
        [sys.executable, "-m", "tangram.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.readline()
    reader.stdout.close()  # like `| head -1`
    with reader.stderr:
        err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 141, err
    assert err == ""
