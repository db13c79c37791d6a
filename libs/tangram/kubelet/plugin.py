"""Assembles the plugin from its configuration: CDI writer, checkpoint, preparer and servers."""

from __future__ import annotations

from pathlib import PurePosixPath

from tangram.cdi.checkpoint import CheckpointStore, read_boot_id
from tangram.cdi.driver import DriverFiles
from tangram.cdi.spec import CdiKind
from tangram.cdi.writer import CdiSpecWriter
from tangram.imex import ImexDomains
from tangram.kubelet.allocations import AllocationSource
from tangram.kubelet.config import PluginConfig
from tangram.kubelet.health import HealthBoard
from tangram.kubelet.preparer import ClaimPreparer, EventSink, StatusReporter
from tangram.kubelet.server import KubeletPlugin
from tangram.sharing import SharingManager


async def build_plugin(
    config: PluginConfig,
    source: AllocationSource,
    *,
    on_event: EventSink | None = None,
    producer: str = "cdi",
    driver: DriverFiles | None = None,
    health: HealthBoard | None = None,
    sharing: SharingManager | None = None,
    imex: ImexDomains | None = None,
    status: StatusReporter | None = None,
) -> KubeletPlugin:
    """A plugin whose prepared state is recovered and ready; call `start()` (or `async with`) to serve.

    With `driver`, specs also carry the driver's libraries, utilities and ldcache hooks; with
    `sharing`, claims holding shares of devices are prepared (MPS daemons, CDI edits per share);
    with `imex`, claims of an NVLink domain (the domain's IMEX daemon and channel); with `status`,
    what each claim was prepared as is reported to its readers (in Kubernetes, its status.devices),
    and reported again whenever the node's GPU health changes.
    """
    writer = CdiSpecWriter(
        config.cdi_dir,
        kind=CdiKind(vendor=config.driver_name, cls=config.cdi_class),
        driver_root=PurePosixPath(config.driver_root),
        driver=driver,
        hook_path=PurePosixPath(config.cdi_hook_path),
        share_root=PurePosixPath(sharing.root) if sharing is not None else None,
    )
    checkpoint = CheckpointStore(config.checkpoint_file, boot_id=read_boot_id(config.boot_id_path))
    preparer = ClaimPreparer(
        node=config.node_name,
        source=source,
        writer=writer,
        checkpoint=checkpoint,
        resolve_timeout_s=config.resolve_timeout_s,
        on_event=on_event,
        producer=producer,
        sharing=sharing,
        imex=imex,
        status=status,
    )
    await preparer.recover()
    return KubeletPlugin(config, preparer, health)
