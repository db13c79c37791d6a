"""The `python -m tangram.local.<tool> COMMAND` entry shared by the cached tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.local.gobuild import tool_main


class ToolError(RuntimeError):
    pass


def _failing() -> list[Path]:
    raise ToolError("the module proxy refused github.com/x/y@v1")


COMMANDS = {"build": lambda: [Path("/cache/tool")], "fetch": _failing}


def test_the_command_named_runs_and_prints_each_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert tool_main(["build"], prog="tangram.local.tool", commands=COMMANDS, errors=(ToolError,)) == 0
    assert capsys.readouterr().out == "/cache/tool\n"


def test_a_failure_is_one_line_and_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert tool_main(["fetch"], prog="tangram.local.tool", commands=COMMANDS, errors=(ToolError,)) == 1
    assert capsys.readouterr().err == "error: the module proxy refused github.com/x/y@v1\n"


@pytest.mark.parametrize("argv", [[], ["install"], ["build", "fetch"]])
def test_any_other_command_line_gets_the_usage_and_status_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool_main(argv, prog="tangram.local.tool", commands=COMMANDS, errors=(ToolError,)) == 2
    assert capsys.readouterr().err == "usage: python -m tangram.local.tool build|fetch\n"
