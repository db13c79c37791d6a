"""python -m services.partitioner"""

import sys

from services.partitioner.service import run
from services.partitioner.settings import parse_settings
from tangram.service import run_service


def main() -> int:
    settings = parse_settings()
    return run_service(
        "partitioner", f"partitioner@{settings.node_name}", settings, lambda ctx: run(ctx, settings)
    )


if __name__ == "__main__":
    sys.exit(main())
