"""``python -m infra.targets.simulator [flags]``: same as ``swarmload sim [flags]``."""

import sys

from infra.targets.simulator import main

if __name__ == "__main__":
    sys.exit(main())
