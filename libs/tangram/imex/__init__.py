"""The node's side of NVLink domains: IMEX channels and the IMEX daemon of the domain it serves."""

from tangram.cdi.devices import ImexGrant
from tangram.imex.domains import ImexDomains, ImexError

__all__ = ["ImexDomains", "ImexError", "ImexGrant"]
