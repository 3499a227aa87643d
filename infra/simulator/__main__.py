"""``python -m infra.simulator [flags]``: same as ``swarmload sim [flags]``."""

import sys

from infra.simulator import main

if __name__ == "__main__":
    sys.exit(main())
