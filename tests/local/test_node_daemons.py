"""A local cluster's simulated nodes take their daemons with them: an IMEX daemon outlives its cdi
service on purpose (a restarted service adopts it), so stopping the cluster stops it."""

from __future__ import annotations

from pathlib import Path

from tangram.cdi.devices import ImexGrant
from tangram.imex import ImexDomains
from tangram.imex.domains import PID_FILE, SIMULATED_DAEMON_COMMAND
from tangram.local.processes import LocalCluster, SimNode
from tangram.sharing.daemons import process_alive
from tests.support.polling import until


async def test_stopping_the_cluster_stops_an_imex_daemon_its_cdi_service_left(tmp_path: Path) -> None:
    cluster = LocalCluster([SimNode("tray-1", "gb200-tray", rack="rack-a")], workdir=tmp_path)
    grant = ImexGrant(domain="team/train", channel=0, nodes=["tray-1"])
    domains = ImexDomains(
        node="tray-1",
        root=cluster.imex_root("tray-1"),
        dev_root=tmp_path / "root",
        command=SIMULATED_DAEMON_COMMAND,
        simulated=True,
    )
    await domains.join("claim-a", grant)  # as a cdi service killed before its claim's unprepare
    pid = int((cluster.imex_root("tray-1") / grant.directory_name / PID_FILE).read_text())
    assert process_alive(pid)
    cluster.stop()
    await until("the IMEX daemon gone with the cluster", lambda: not process_alive(pid))
