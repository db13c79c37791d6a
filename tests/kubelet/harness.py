"""A kubelet DRA plugin started for a test, with the kubelet stand-in that calls it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tangram.kubelet import ClaimEvent, KubeletPlugin, PluginConfig, build_plugin
from tests.kubelet.fakes import TestKubelet, WatchedSource


@dataclass
class PluginHarness:
    config: PluginConfig
    source: WatchedSource
    kubelet: TestKubelet
    plugin: KubeletPlugin | None = None
    events: list[ClaimEvent] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return str(self.config.dra_socket)

    async def record(self, event: ClaimEvent) -> None:
        self.events.append(event)

    async def start(self, source: WatchedSource | None = None) -> KubeletPlugin:
        if source is not None:
            self.source = source
        self.plugin = await build_plugin(self.config, self.source, on_event=self.record)
        await self.plugin.start()
        return self.plugin

    async def stop(self) -> None:
        if self.plugin is not None:
            await self.plugin.stop()
            self.plugin = None

    def spec_path(self, uid: str) -> Path:
        return self.config.cdi_dir / f"gpu.tangram.dev-claim_{uid}.json"
