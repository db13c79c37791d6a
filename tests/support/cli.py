"""Running the `tangram` command in-process, as a person at a shell would see it."""

from __future__ import annotations

import sys
from typing import NamedTuple

import pytest

from tangram.cli import main


class Ran(NamedTuple):
    code: int
    out: str
    err: str


def tangram(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """The exit status and what was printed. argparse (and a few commands) end with SystemExit: its
    code is the status, and a message in it is what the shell would have shown on stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return Ran(code, out, err)
