"""The fleet picture in a terminal: `tangram status`'s drawing and the demo's live view, rendered to text."""

from __future__ import annotations

import io

from rich.console import Console

from tangram.demo.live import LiveFleet
from tangram.fleetview import FleetView
from tangram.fleetview.terminal import fleet, to_text
from tests.fleetview.pictures import NODE, fleet_events


def picture() -> FleetView:
    view = FleetView()
    for event in fleet_events():
        view.apply(event)
    return view


def test_claims_are_counted_by_state() -> None:
    assert picture().counts() == {"pending": 0, "allocated": 1, "ready": 2, "failed": 1, "released": 0}


def test_who_holds_what_on_each_gpu() -> None:
    uses = picture().uses(NODE)
    assert uses[0].instances == {0: "ml/embedder", 4: "ml/reranker"}
    assert uses[0].warm == [2]
    assert uses[1].whole == "ml/llm" and uses[2].whole == "ml/llm"
    assert uses[3].whole is None and uses[3].instances == {}


def test_the_drawing_shows_slices_holders_whole_gpus_and_nvlink() -> None:
    text = to_text(fleet(picture()), width=160)
    lines = text.splitlines()
    layout = next(i for i, line in enumerate(lines) if "[1g.18gb ]" in line)
    # The row under the slices names who holds each instance; the warm one says so.
    assert "embedder" in lines[layout + 1] and "warm" in lines[layout + 1] and "reranker" in lines[layout + 1]
    assert "[  free  ]" in lines[layout]
    assert "GPU 1 H200-141GB" in text and "whole GPU held by ml/llm" in text
    assert f"NVLink domains: {NODE}/nvswitch-0: GPUs 0, 1, 2, 3, 4, 5, 6, 7" in text
    assert "ready 2" in text and "failed 1" in text
    assert "not enough free GPUs or MIG slices" in text


def test_the_live_view_redraws_as_events_arrive() -> None:
    screen = io.StringIO()
    console = Console(file=screen, width=160, force_terminal=True, color_system=None)
    with LiveFleet(console) as live:
        for event in fleet_events():
            live.on_event(event)
    drawn = screen.getvalue()
    assert live.view.events == len(fleet_events())
    # The last drawing is the whole picture (the first drew an empty fleet).
    assert "no node inventory on the bus yet" in drawn
    final = drawn.rsplit("tangram demo", 1)[1]
    assert "embedder" in final and "whole GPU held by ml/llm" in final and "ready 2" in final
