"""The demo's live fleet view: the same picture as `tangram status`, redrawn as events flow."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from tangram.events import Event
from tangram.fleetview.model import FleetView
from tangram.fleetview.terminal import fleet

REDRAW_EVERY_S = 0.25  # the eye does not need more, and a busy bus must not spend its time drawing


class LiveFleet:
    """Folds every event into a FleetView and redraws from the event loop's own thread.

    rich's auto-refresh would draw from a thread of its own while the loop changes the view, so
    drawing is driven here, at most every REDRAW_EVERY_S, and once more at the end.
    """

    def __init__(self, console: Console | None = None, *, started: float | None = None) -> None:
        self.view = FleetView()
        self.started = time.monotonic() if started is None else started
        self._drawn_at = 0.0
        self._live = Live(console=console, auto_refresh=False, transient=False, screen=False)

    def renderable(self) -> RenderableType:
        elapsed = time.monotonic() - self.started
        header = Text(f"tangram demo  +{elapsed:6.1f}s  {self.view.events} events", style="bold")
        return Group(header, fleet(self.view))

    def on_event(self, event: Event) -> None:
        self.view.apply(event)
        now = time.monotonic()
        if now - self._drawn_at >= REDRAW_EVERY_S:
            self._drawn_at = now
            self._live.update(self.renderable(), refresh=True)

    def __enter__(self) -> LiveFleet:
        self._live.start()
        self._live.update(self.renderable(), refresh=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._live.update(self.renderable(), refresh=True)
        self._live.stop()
