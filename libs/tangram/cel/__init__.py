"""The Kubernetes DRA CEL environment: device selectors compiled once, evaluated per device.

sel = compile_selector('device.attributes["gpu.tangram.dev"].type == "mig"')
sel.matches(device)  # bool, or CelRuntimeError
"""

from tangram.cel.activation import DeviceActivation
from tangram.cel.analysis import MAX_COST, MAX_EXPRESSION_LENGTH
from tangram.cel.errors import CelCompileError, CelError, CelRuntimeError
from tangram.cel.selector import CelSelector, compile_selector, validate_selector

__all__ = [
    "MAX_COST",
    "MAX_EXPRESSION_LENGTH",
    "CelCompileError",
    "CelError",
    "CelRuntimeError",
    "CelSelector",
    "DeviceActivation",
    "compile_selector",
    "validate_selector",
]
