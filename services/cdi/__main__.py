"""python -m services.cdi"""

import sys

from services.cdi.service import run
from services.cdi.settings import parse_settings
from tangram.service import run_service


def main() -> int:
    settings = parse_settings()
    return run_service("cdi", f"cdi@{settings.node_name}", settings, lambda ctx: run(ctx, settings))


if __name__ == "__main__":
    sys.exit(main())
