#!/usr/bin/env python
"""Speed and memory of every encoder variant as ratios to the plain Transformer, measured in the same run: the command
line of [`mgsa_hf.benchmarking.speed`], whose docstring says what is measured and how.

    python scripts/bench_speed.py --backbones marian --sizes base   # writes benchmarks/speed-cpu-marian-base.json
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.speed import main  # noqa: E402


if __name__ == "__main__":
    main()
