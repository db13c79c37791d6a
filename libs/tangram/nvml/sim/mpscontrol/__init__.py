"""A stand-in for NVIDIA's `nvidia-cuda-mps-control`, for nodes whose GPUs are simulated.

Run as `python -m tangram.nvml.sim.mpscontrol`, it is driven like the real program:

- `-d` starts the control daemon in the background and returns once it listens on
  `$CUDA_MPS_PIPE_DIRECTORY/control` (a unix socket); it logs to `$CUDA_MPS_LOG_DIRECTORY/control.log`
  and keeps its pid in `$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid`. A second daemon on
  the same pipe directory is refused while the first lives; a dead one's leftovers are no obstacle.
- `-f` runs the daemon in the foreground, its log also on stdout.
- without options it reads commands from stdin, one a line, sends them to the daemon and prints
  the replies; with no daemon it prints "Cannot find MPS control daemon process" and exits 1.

Commands: `get_server_list`, `set_default_active_thread_percentage P`,
`get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV VALUE`,
`get_default_device_pinned_mem_limit DEV`, `quit`. The stand-in runs no MPS server, so the server
list is always empty. Anything else is refused with a one-line reason and exit status 1.
"""

from __future__ import annotations

CONTROL_SOCKET = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
LOG_FILE = "control.log"
# Where the real program looks when the variables are not set.
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108 - the documented default of the real program
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"

NO_DAEMON = "Cannot find MPS control daemon process"
ALREADY_RUNNING = "An instance of this daemon is already running"
