"""The node's IMEX daemon of the NVLink domain it serves, run as the simulator's stand-in for
`nvidia-imex`: started with exactly the domain's nodes, shared by the domain's claims on the node,
stopped after the last, adopted or started again after a restart of the service."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from tangram.imex import ImexDomains, ImexError, ImexGrant
from tangram.imex.domains import CONFIG_FILE, NODES_FILE, PID_FILE, SIMULATED_DAEMON_COMMAND
from tangram.nvml.sim.imexd import STATUS_FILE
from tangram.sharing.daemons import process_alive
from tests.support.polling import until

TRAIN = ImexGrant(domain="team/train", channel=3, nodes=["tray-1", "tray-2"])


@pytest.fixture
async def domains(tmp_path: Path) -> AsyncIterator[ImexDomains]:
    node = ImexDomains(
        node="tray-1",
        root=tmp_path / "imex",
        dev_root=tmp_path / "root",
        command=SIMULATED_DAEMON_COMMAND,
        simulated=True,
    )
    yield node
    await node.recover({})  # whatever a test left running is stopped


def status(domains: ImexDomains, grant: ImexGrant) -> dict[str, object]:
    return dict(json.loads((domains.root / grant.directory_name / STATUS_FILE).read_text()))


def pid_of(domains: ImexDomains, grant: ImexGrant) -> int:
    return int((domains.root / grant.directory_name / PID_FILE).read_text())


async def test_the_daemon_serves_exactly_the_domains_nodes_until_its_last_claim_leaves(
    domains: ImexDomains,
) -> None:
    await domains.join("claim-a", TRAIN)
    directory = domains.root / TRAIN.directory_name
    assert (directory / NODES_FILE).read_text() == "tray-1\ntray-2\n"
    assert f"IMEX_NODE_CONFIG_FILE={directory / NODES_FILE}" in (directory / CONFIG_FILE).read_text()
    assert status(domains, TRAIN)["nodes"] == ["tray-1", "tray-2"]  # what the daemon read
    channel = domains.dev_root / "dev/nvidia-caps-imex-channels/channel3"
    assert channel.exists()
    pid = pid_of(domains, TRAIN)
    assert process_alive(pid)

    await domains.join("claim-b", TRAIN)  # a second claim of the domain on the node: same daemon
    assert pid_of(domains, TRAIN) == pid
    await domains.leave("claim-a")
    assert process_alive(pid) and channel.exists()
    await domains.leave("claim-b")
    await until("the daemon gone", lambda: not process_alive(pid))
    assert not directory.exists() and not channel.exists()


async def test_a_node_outside_the_domain_or_serving_another_refuses(domains: ImexDomains) -> None:
    elsewhere = ImexGrant(domain="team/other", channel=0, nodes=["tray-7", "tray-8"])
    with pytest.raises(ImexError, match=r"for nodes tray-7, tray-8, not for this node \(tray-1\)"):
        await domains.join("claim-x", elsewhere)
    await domains.join("claim-a", TRAIN)
    second = ImexGrant(domain="team/second", channel=1, nodes=["tray-1"])
    with pytest.raises(ImexError, match="serves the NVLink domain team/train; it cannot serve team/second"):
        await domains.join("claim-y", second)
    assert domains.serving() == TRAIN


async def test_a_domain_that_grows_restarts_its_daemon_with_the_new_nodes(domains: ImexDomains) -> None:
    await domains.join("claim-a", TRAIN)
    before = pid_of(domains, TRAIN)
    grown = ImexGrant(domain="team/train", channel=3, nodes=["tray-1", "tray-2", "tray-3"])
    await domains.join("claim-b", grown)
    assert status(domains, grown)["nodes"] == ["tray-1", "tray-2", "tray-3"]
    assert pid_of(domains, grown) != before and not process_alive(before)


async def test_recovery_starts_a_dead_daemon_again_and_stops_one_no_claim_needs(
    domains: ImexDomains, tmp_path: Path
) -> None:
    await domains.join("claim-a", TRAIN)
    first = pid_of(domains, TRAIN)
    os.kill(first, signal.SIGKILL)
    await until("the daemon dead", lambda: not process_alive(first))
    # a new process of the service: the checkpoint says claim-a is prepared
    restarted = ImexDomains(
        node="tray-1",
        root=domains.root,
        dev_root=domains.dev_root,
        command=SIMULATED_DAEMON_COMMAND,
        simulated=True,
    )
    await restarted.recover({"claim-a": TRAIN})
    second = pid_of(restarted, TRAIN)
    assert second != first and process_alive(second)
    # and again, with the claim gone meanwhile: its daemon stops, its directory goes
    again = ImexDomains(
        node="tray-1",
        root=domains.root,
        dev_root=domains.dev_root,
        command=SIMULATED_DAEMON_COMMAND,
        simulated=True,
    )
    await again.recover({})
    await until("the daemon gone", lambda: not process_alive(second))
    assert not (domains.root / TRAIN.directory_name).exists()


async def test_a_daemon_that_cannot_start_is_reported_with_its_own_words(tmp_path: Path) -> None:
    failing = ImexDomains(
        node="tray-1",
        root=tmp_path / "imex",
        dev_root=tmp_path / "root",
        command=(sys.executable, "-c", "import sys; print('no fabric manager'); sys.exit(3)"),
        simulated=True,
    )
    with pytest.raises(ImexError, match="exited at start: no fabric manager"):
        await failing.join("claim-a", TRAIN)
    assert failing.serving() is None and not (tmp_path / "imex" / TRAIN.directory_name).exists()


def test_the_stand_in_refuses_a_nodes_config_without_nodes_or_with_a_bad_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes_config.cfg"
    config = tmp_path / "config.cfg"
    config.write_text(f"SERVER_PORT=50000\nIMEX_NODE_CONFIG_FILE={nodes}\n")
    for text, said in (("\n# none\n", "lists no node"), ("tray-1\nrm -rf /\n", "is no address or host name")):
        nodes.write_text(text)
        run = subprocess.run(
            [*SIMULATED_DAEMON_COMMAND, "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 1 and said in run.stderr, run.stderr
    config.write_text("SERVER_PORT=50000\n")
    run = subprocess.run(
        [*SIMULATED_DAEMON_COMMAND, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1 and "IMEX_NODE_CONFIG_FILE is not set" in run.stderr


async def test_peers_are_listed_by_the_addresses_the_resolver_gives_and_an_unknown_one_fails(
    tmp_path: Path,
) -> None:
    asked: list[list[str]] = []

    async def addresses(names: Sequence[str]) -> list[str]:
        asked.append(list(names))
        if "tray-2" in names and len(asked) > 1:
            raise LookupError("Node tray-2 not found")
        return [f"10.0.0.{name.rsplit('-', 1)[1]}" for name in names]

    def node(root: str) -> ImexDomains:
        return ImexDomains(
            node="tray-1",
            root=tmp_path / root,
            dev_root=tmp_path / "root",
            command=SIMULATED_DAEMON_COMMAND,
            simulated=True,
            addresses=addresses,
        )

    resolved = node("imex")
    await resolved.join("claim-a", TRAIN)
    directory = resolved.root / TRAIN.directory_name
    assert (directory / NODES_FILE).read_text() == "10.0.0.1\n10.0.0.2\n"
    assert status(resolved, TRAIN)["nodes"] == ["10.0.0.1", "10.0.0.2"]
    await resolved.leave("claim-a")

    unknown = node("imex-2")
    with pytest.raises(
        ImexError, match="addresses of nodes tray-1, tray-2 are unknown: Node tray-2 not found"
    ):
        await unknown.join("claim-a", TRAIN)
    assert unknown.serving() is None and not (unknown.root / TRAIN.directory_name).exists()
