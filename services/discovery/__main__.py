"""python -m services.discovery"""

import sys

from tangram.service import run_service

from services.discovery.service import run
from services.discovery.settings import parse_settings


def main() -> int:
    settings = parse_settings()
    return run_service(
        "discovery", f"discovery@{settings.node_name}", settings, lambda ctx: run(ctx, settings)
    )


if __name__ == "__main__":
    sys.exit(main())
