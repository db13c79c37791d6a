"""What the bus knows of the fleet, folded from events: for `tangram status`, the demo and `tangram ui`."""

from tangram.fleetview.model import ClaimView, FleetView, GpuUse, NodeView, ServiceHealth

__all__ = ["ClaimView", "FleetView", "GpuUse", "NodeView", "ServiceHealth"]
