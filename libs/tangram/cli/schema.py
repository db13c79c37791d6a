"""`tangram schema`: the event catalogue as one AsyncAPI 3 document on stdout."""

from __future__ import annotations

import argparse
import json

from tangram.events.schema import asyncapi_document


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--indent", type=int, default=2, help="JSON indentation (default 2)")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncapi_document(), indent=args.indent, sort_keys=False))
    return 0
