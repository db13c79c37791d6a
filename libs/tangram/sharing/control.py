"""The one way the node talks to MPS: the control program, `nvidia-cuda-mps-control` on a real node
(or the simulator's stand-in), run as a subprocess with the device's directories in its environment.

Every failure of the program (missing, timed out, non-zero exit) becomes MpsControlError with what
it printed, so the caller deals with one exception type.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tangram.sharing.devices import DeviceDirs

REAL_CONTROL_COMMAND = ("nvidia-cuda-mps-control",)
SIMULATED_CONTROL_COMMAND = (sys.executable, "-m", "tangram.nvml.sim.mpscontrol")
MAX_OUTPUT = 64 * 1024
# Variables of the node's own environment that would steer the daemon or its servers: the manager
# sets the ones it means, and none other leaks in.
_MPS_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


class MpsControlError(RuntimeError):
    """The MPS control program failed; the message says how and what it printed."""


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    output: str  # stdout and stderr, as printed


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CUDA_MPS_") and name not in _MPS_VARIABLES
    }
    env.update(extra)
    return env


@dataclass(frozen=True, slots=True)
class MpsControl:
    """Runs the control program; `argv` is the program and its leading arguments."""

    argv: Sequence[str] = REAL_CONTROL_COMMAND
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(arg, str) and arg for arg in self.argv):
            raise ValueError("the MPS control command must be a non-empty list of non-empty strings")

    async def _run(self, args: Sequence[str], env: Mapping[str, str], stdin: str) -> Outcome:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=_environment(env),
            )
        except OSError as error:
            raise MpsControlError(f"cannot run {self.argv[0]}: {error.strerror or error}") from None
        try:
            out, _ = await asyncio.wait_for(process.communicate(stdin.encode("utf-8")), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise MpsControlError(
                f"{self.argv[0]} {' '.join(args)} did not finish in {self.timeout_s:g} s"
            ) from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        returncode = process.returncode
        assert returncode is not None
        return Outcome(returncode=returncode, output=out[:MAX_OUTPUT].decode("utf-8", "replace"))

    async def start(self, dirs: DeviceDirs) -> None:
        """`-d`: a control daemon for the device, which is the only device it and its servers see."""
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
            "CUDA_VISIBLE_DEVICES": dirs.uuid,
        }
        outcome = await self._run(["-d"], env, "")
        if outcome.returncode != 0:
            raise MpsControlError(
                f"starting the MPS control daemon of {dirs.uuid} failed "
                f"(exit {outcome.returncode}): {outcome.output.strip()[:500]}"
            )

    async def ask(self, dirs: DeviceDirs, *commands: str) -> Outcome:
        """Send commands to the device's daemon; the outcome, whatever it is."""
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}
        return await self._run([], env, "".join(f"{command}\n" for command in commands))

    async def command(self, dirs: DeviceDirs, *commands: str) -> str:
        """Send commands that must succeed; their output."""
        outcome = await self.ask(dirs, *commands)
        if outcome.returncode != 0:
            raise MpsControlError(
                f"MPS control daemon of {dirs.uuid} refused {' / '.join(commands)!r} "
                f"(exit {outcome.returncode}): {outcome.output.strip()[:500]}"
            )
        return outcome.output

    async def running(self, dirs: DeviceDirs) -> bool:
        """Whether a control daemon answers on the device's pipe directory."""
        return (await self.ask(dirs, "get_server_list")).returncode == 0
