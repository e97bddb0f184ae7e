"""`python -m mgsa_hf.cli ...`: the `mgsa-hf` command (what `accelerate launch -m mgsa_hf.cli train` runs)."""

import sys

from . import main


if __name__ == "__main__":
    sys.exit(main())
