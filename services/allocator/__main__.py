"""python -m services.allocator"""

import sys

from services.allocator.service import run
from services.allocator.settings import parse_settings
from tangram.service import run_service


def main() -> int:
    settings = parse_settings()
    return run_service("allocator", "allocator", settings, lambda ctx: run(ctx, settings))


if __name__ == "__main__":
    sys.exit(main())
