#!/usr/bin/env python
"""Translation quality of every encoder type under one protocol, with seeds and significance against the plain
Transformer: the command line of [`mgsa_hf.benchmarking.quality`], whose docstring says what each step does.

    python scripts/bench_quality.py all --budget cpu --rows defaults best --seeds 1 2 3 --jobs 2 --threads 1
"""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.quality import main  # noqa: E402


if __name__ == "__main__":
    main()
