"""What every service shares: settings, structured logs, health and metrics, graceful shutdown."""

from tangram.service.runner import ServiceContext, ServiceMain, bus_config, run_service, serve
from tangram.service.settings import (
    NodeSettings,
    ServiceSettings,
    add_service_arguments,
    env_flag,
    service_fields,
    validated,
)
from tangram.service.tasks import first, follow_all, reached, settle

__all__ = [
    "NodeSettings",
    "ServiceContext",
    "ServiceMain",
    "ServiceSettings",
    "add_service_arguments",
    "bus_config",
    "env_flag",
    "first",
    "follow_all",
    "reached",
    "run_service",
    "serve",
    "service_fields",
    "settle",
    "validated",
]
