from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram.kubelet import PluginConfig
from tests.kubelet.fakes import NODE, TestKubelet, WatchedSource, inventory
from tests.kubelet.harness import PluginHarness


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    # unix socket paths must stay under 108 bytes: pytest's tmp_path is too deep for them.
    root = Path(tempfile.mkdtemp(prefix="tk-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_config(kubelet_root: Path, tmp_path: Path) -> Any:
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("3f0c6d2e-boot-one\n")

    def make(**overrides: Any) -> PluginConfig:
        settings: dict[str, Any] = {
            "node_name": NODE,
            "kubelet_root": kubelet_root,
            "cdi_dir": tmp_path / "cdi",
            "boot_id_path": boot_id,
            "resolve_timeout_s": 10.0,
            "registration_check_interval_s": 0.02,
        }
        settings.update(overrides)
        return PluginConfig(**settings)

    return make


@pytest.fixture
async def harness(
    no_leaked_tasks: None, make_config: Any, kubelet_root: Path
) -> AsyncIterator[PluginHarness]:
    # Depends on the leak guard so that the guard looks only after the plugin's servers have stopped.
    source = WatchedSource(NODE)
    source.observe(inventory())
    kubelet = TestKubelet(kubelet_root)
    env = PluginHarness(config=make_config(), source=source, kubelet=kubelet)
    await env.start()
    try:
        yield env
    finally:
        await kubelet.close()
        await env.stop()
