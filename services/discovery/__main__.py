"""python -m services.discovery"""

import sys

from services.discovery.service import run
from services.discovery.settings import parse_settings
from tangram.service import run_service


def main() -> int:
    settings = parse_settings()
    return run_service(
        "discovery", f"discovery@{settings.node_name}", settings, lambda ctx: run(ctx, settings)
    )


if __name__ == "__main__":
    sys.exit(main())
