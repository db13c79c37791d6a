"""The authorization generator and `tangram nats-config`, without a server."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tangram.cli import main
from tangram.local.natsserver import find_nats_server
from tangram.natsauth.jwt import public_key_of
from tangram.natsauth.permissions import (
    NatsAuthError,
    TlsFiles,
    build_users,
    node_permissions,
    node_user,
    render_authorization,
)


def test_node_users_are_named_by_subject_token() -> None:
    assert node_user("gpu-7.rack2.example") == "node-gpu-7_rack2_example"
    with pytest.raises(NatsAuthError, match="Bad/Node"):
        node_user("Bad/Node")


def test_node_permissions_name_only_its_own_subjects() -> None:
    permissions = node_permissions("gpu-a", others=["gpu-b"])
    assert permissions.publish_allow[:3] == (
        "tangram.inventory.gpu-a",
        "tangram.node.gpu-a.>",
        "tangram.deadletter.partitioner-gpu-a",
    )
    assert not any("partition.requested" in s for s in permissions.publish_deny)  # its own: allowed
    assert "$JS.API.CONSUMER.INFO.TANGRAM_NODES.partitioner-gpu-b" in permissions.publish_deny
    assert not any("gpu-b" in s for s in permissions.publish_allow + permissions.subscribe_allow)
    assert not any(
        s.startswith(("tangram.claim", "$JS.API.STREAM.CREATE")) for s in permissions.publish_allow
    )


def test_passwords_are_random_and_hidden_from_repr() -> None:
    first = {u.name: u.password for u in build_users(["a"])}
    second = {u.name: u.password for u in build_users(["a"])}
    assert list(first) == ["admin", "allocator", "node-a"]
    assert all(first[name] != second[name] for name in first)
    user = build_users(["a"])[2]
    assert user.password not in repr(user)


def test_given_passwords_are_used_and_checked() -> None:
    text = render_authorization(["a"], passwords={"node-a": "p" * 20})
    assert '"password": ' not in text and 'password: "' + "p" * 20 + '"' in text
    with pytest.raises(NatsAuthError, match="node-a"):
        build_users(["a"], {"node-a": 'short"'})
    with pytest.raises(NatsAuthError, match="unknown users: node-z"):
        build_users(["a"], {"node-z": "p" * 20})
    with pytest.raises(NatsAuthError, match="twice"):
        build_users(["a.b", "a_b"])


def test_tls_block_is_rendered_and_checked(tmp_path: Path) -> None:
    tls = TlsFiles(tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem", verify_clients=True)
    text = render_authorization(["a"], tls=tls)
    assert text.startswith("tls {\n") and "  verify: true\n" in text
    with pytest.raises(NatsAuthError, match="CA"):
        render_authorization(["a"], tls=TlsFiles(tmp_path / "c", tmp_path / "k", verify_clients=True))


def test_cli_writes_a_valid_config_and_private_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, creds = tmp_path / "nats.conf", tmp_path / "creds"
    args = ["nats-config", "--node", "gpu-a", "--node", "gpu-b.lab", "--out", str(out)]
    args += ["--credentials-dir", str(creds), "--server-url", "nats://nats.tangram:4222"]
    assert main(args) == 0
    files = sorted(p.name for p in creds.iterdir())
    assert files == [
        "admin.password", "admin.url", "allocator.password", "allocator.url",
        "node-gpu-a.password", "node-gpu-a.url", "node-gpu-b_lab.password", "node-gpu-b_lab.url",
    ]  # fmt: skip
    for path in [out, *creds.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    password = (creds / "node-gpu-a.password").read_text().strip()
    assert (creds / "node-gpu-a.url").read_text().strip() == f"nats://node-gpu-a:{password}@nats.tangram:4222"
    printed = capsys.readouterr()
    assert password not in printed.out + printed.err
    command = [find_nats_server(), "-t", "-c", str(out)]
    check = subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    assert "is valid" in check.stdout + check.stderr

    # A second run (a node added) keeps the existing passwords.
    assert main([*args, "--node", "gpu-c"]) == 0
    assert (creds / "node-gpu-a.password").read_text().strip() == password
    assert (creds / "node-gpu-c.url").exists()


def test_cli_refuses_to_print_passwords(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    creds = tmp_path / "creds"
    assert main(["nats-config", "--node", "a", "--credentials-dir", str(creds)]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.count("\n") == 1 and "--out FILE is required" in printed.err
    assert not creds.exists()  # nothing half-written either


def test_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--out", str(tmp_path / "nats.conf"), "--credentials-dir", str(tmp_path)]
    assert main(["nats-config", "--node", "Bad/Node", *out]) == 2
    assert "Bad/Node" in capsys.readouterr().err
    assert main(["nats-config", "--node", "a", *out, "--tls-cert", "c"]) == 2
    assert "--tls-key" in capsys.readouterr().err
    (tmp_path / "node-a.password").write_text("has spaces in it, too short\n")
    assert main(["nats-config", "--node", "a", *out]) == 2
    assert "node-a" in capsys.readouterr().err


def test_cli_callout_config_lists_no_node_and_keeps_its_issuer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, creds = tmp_path / "nats.conf", tmp_path / "creds"
    args = ["nats-config", "--callout", "--out", str(out), "--credentials-dir", str(creds)]
    assert main(args) == 0
    files = sorted(p.name for p in creds.iterdir())
    assert files == [
        "admin.password", "admin.url", "allocator.password", "allocator.url",
        "authcallout.password", "authcallout.url", "callout-issuer.seed",
    ]  # fmt: skip
    for path in [out, *creds.iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    seed = (creds / "callout-issuer.seed").read_text().strip()
    issuer = public_key_of(seed)
    config = out.read_text()
    assert f'issuer: "{issuer}"' in config and "node-" not in config
    assert seed not in capsys.readouterr().err
    check = subprocess.run(
        [find_nats_server(), "-t", "-c", str(out)], check=False, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stderr
    # a second run keeps the issuer: a new one would refuse every node user issued before
    assert main(args) == 0
    assert (creds / "callout-issuer.seed").read_text().strip() == seed
    assert main([*args, "--node", "gpu-a"]) == 2
    assert "list no --node" in capsys.readouterr().err
    assert main(["nats-config", "--out", str(out), "--credentials-dir", str(creds)]) == 2
    assert "--callout" in capsys.readouterr().err
