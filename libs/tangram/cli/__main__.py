"""python -m tangram.cli: the same as the `tangram` command."""

import sys

from tangram.cli import main

sys.exit(main())
