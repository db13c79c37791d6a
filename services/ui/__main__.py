"""python -m services.ui"""

import sys

from services.ui.service import run
from services.ui.settings import parse_settings
from tangram.service import run_service


def main() -> int:
    settings = parse_settings()
    return run_service("ui", "ui", settings, lambda ctx: run(ctx, settings))


if __name__ == "__main__":
    sys.exit(main())
