"""Configuration of the read-only web view."""

from __future__ import annotations

import argparse
import os

from tangram.fleetview.web import DEFAULT_LISTEN
from tangram.service import ServiceSettings, add_service_arguments, service_fields


class UiSettings(ServiceSettings):
    # Loopback unless told: the view shows the whole fleet and every claim's name.
    listen: str = DEFAULT_LISTEN


def parse_settings(argv: list[str] | None = None) -> UiSettings:
    parser = argparse.ArgumentParser(prog="python -m services.ui", description=__doc__)
    add_service_arguments(parser)
    env = os.environ.get
    parser.add_argument("--listen", default=env("TANGRAM_UI_LISTEN", DEFAULT_LISTEN), metavar="HOST:PORT")
    args = parser.parse_args(argv)
    return UiSettings(**service_fields(args), listen=args.listen)  # type: ignore[arg-type]
