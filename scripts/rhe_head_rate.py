#!/usr/bin/env python
"""How often a trained RHE model labels its heads redundant (Eq. 10), per RHE layer and head, over one split of a
prepared corpus: the runs of `bench_quality.py`, with the row and recipe of their `run.json` and the weights they were
scored with (the mean of their last `average_last` checkpoints up to `max_steps`).

The rate says what RHE does in practice: a head labelled redundant gets the syntax-enhanced attention (`"rhe"`) or
is dropped (`"rhe_prune"`), so a rate near 100% makes RHE act as SEA on every head and RHE-prune drop the layer's
attention.

    python scripts/rhe_head_rate.py runs/bench-quality/cpu-lr-0.005/rhe/seed-* \
        --prepared runs/bench-quality/cpu/prepared
"""

import argparse
import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.rows import recorded_command  # noqa: E402
from mgsa_hf.evaluation.analysis import prepared_run_head_rate  # noqa: E402
from mgsa_hf.training.prepared import PreparedCorpus  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders of bench_quality.py (run.json, checkpoints/)")
    parser.add_argument("--prepared", required=True, help="the prepared corpus the runs trained on")
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--initial", action="store_true",
                        help="also the rates of each run's model as built, before training (the same seed)")
    parser.add_argument("--output", help="results JSON (default: print only)")
    args = parser.parse_args(argv)
    corpus = PreparedCorpus(args.prepared)
    results = {}
    for run_dir in map(Path, args.runs):
        for initial in (True, False) if args.initial else (False,):
            name = f"{run_dir} (initialisation)" if initial else str(run_dir)
            results[name] = rate = prepared_run_head_rate(run_dir, corpus, args.split, args.batch_size, initial)
            for layer, heads in zip(rate["layers"], rate["redundant"], strict=True):
                cells = " ".join(f"{100 * value:5.1f}%" for value in heads)
                print(f"{name} layer {layer}: redundant {cells} (mean {100 * sum(heads) / len(heads):.1f}%) over "
                      f"{rate['sentences']} {args.split} sentences")
    if args.output:
        command = recorded_command("scripts/rhe_head_rate.py", sys.argv[1:] if argv is None else argv)
        Path(args.output).write_text(json.dumps({"command": command, "split": args.split, "runs": results},
                                                indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
