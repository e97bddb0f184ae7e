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

import torch


def load_run(run_dir: Path, corpus, initial: bool = False):
    """`(model in eval mode, names of the averaged checkpoints)` of an RHE run of `bench_quality.py`; with `initial`,
    the run's model as it was built, before training (checkpoints `["initialisation"]`)."""
    from mgsa_hf.evaluation import average_checkpoints
    from mgsa_hf.prepared_training import Recipe, build_model, scored_checkpoints

    run = json.loads((run_dir / "run.json").read_text())
    if run["row"].get("encoder_type") != "rhe":
        raise SystemExit(f"{run_dir}: not an RHE run (row {run['row']})")
    recipe = Recipe(**run["recipe"])
    model = build_model(corpus, recipe, run["row"], run["seed"])
    if initial:
        return model.eval(), ["initialisation"]
    checkpoints = scored_checkpoints(run_dir, recipe)
    if not checkpoints:
        raise SystemExit(f"{run_dir}: no checkpoint up to step {recipe.max_steps}")
    model.load_state_dict(average_checkpoints(checkpoints))
    return model.eval(), [path.stem for path in checkpoints]


def head_rate(run_dir: Path, corpus, split_name: str, batch_size: int, initial: bool = False) -> dict:
    """`{"row", "checkpoints", "sentences", "layers", "redundant": [[rate per head] per RHE layer]}` for one run,
    counted on the prepared batches (the same fields as `mgsa_hf.analysis.redundant_head_rate` gets from the
    processor)."""
    model, checkpoints = load_run(run_dir, corpus, initial)
    split = corpus.split(split_name)
    redundant = torch.zeros(len(model.config.rhe_layers), model.config.encoder_attention_heads)
    with torch.no_grad():
        for start in range(0, len(split), batch_size):
            batch = split.batch(range(start, min(start + batch_size, len(split))), with_labels=False)
            output = model.get_encoder()(**batch)
            redundant += torch.stack([(labels == 0).sum(0) for labels in output.head_labels]).float()
    row = json.loads((run_dir / "run.json").read_text())["row"]
    return {"row": row, "checkpoints": checkpoints, "sentences": len(split),
            "layers": list(model.config.rhe_layers), "redundant": (redundant / len(split)).round(decimals=4).tolist()}


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
    from mgsa_hf.prepared_training import PreparedCorpus

    corpus = PreparedCorpus(args.prepared)
    results = {}
    for run_dir in map(Path, args.runs):
        for initial in (True, False) if args.initial else (False,):
            name = f"{run_dir} (initialisation)" if initial else str(run_dir)
            results[name] = rate = head_rate(run_dir, corpus, args.split, args.batch_size, initial)
            for layer, heads in zip(rate["layers"], rate["redundant"], strict=True):
                cells = " ".join(f"{100 * value:5.1f}%" for value in heads)
                print(f"{name} layer {layer}: redundant {cells} (mean {100 * sum(heads) / len(heads):.1f}%) over "
                      f"{rate['sentences']} {args.split} sentences")
    if args.output:
        command = "python scripts/rhe_head_rate.py " + " ".join(sys.argv[1:] if argv is None else argv)
        Path(args.output).write_text(json.dumps({"command": command, "split": args.split, "runs": results},
                                                indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
