"""The plugin's readiness check follows what kubelet said and whether its registration socket is there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tangram.kubelet import InMemoryAllocationSource, build_plugin
from tests.kubelet.fakes import NODE, TestKubelet, inventory


async def test_registration_problems_are_reported_and_clear(
    no_leaked_tasks: None, make_config: Any, kubelet_root: Path
) -> None:
    # The watcher would serve a removed socket again within its interval; keep it out of the way.
    config = make_config(registration_check_interval_s=3600.0)
    source = InMemoryAllocationSource(NODE)
    source.observe(inventory())
    plugin = await build_plugin(config, source)
    assert plugin.registration_problem() == "kubelet plugin is not serving"
    kubelet = TestKubelet(kubelet_root)
    async with plugin:
        assert plugin.registration_problem() is None  # kubelet has not answered yet: not a fault
        [socket] = kubelet.registration_sockets()
        await kubelet.notify(socket, registered=False, error="unsupported version")
        assert plugin.registration_problem() == "kubelet refused the plugin registration: unsupported version"
        await kubelet.notify(socket, registered=True)
        assert plugin.registration_problem() is None
        config.registration_socket.unlink()  # what kubelet's restart does to plugins_registry
        problem = plugin.registration_problem()
        assert problem is not None and "registration socket" in problem and "is gone" in problem
        await kubelet.close()
