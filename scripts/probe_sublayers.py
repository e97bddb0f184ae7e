#!/usr/bin/env python
"""How each sub-layer's output compares with its input while a model trains: the training loss and, per attention
sub-layer (self-attention, cross-attention, PR's phrase combination), the RMS of what it adds to the residual stream
over the RMS of its input, averaged over `--every` steps.

It trains the rows of a quality budget on its prepared corpus (`bench_quality.py prepare`), with the budget's recipe
and the same step function as `bench_quality.py`, for `--steps` steps without evaluating. A sub-layer whose output
grows to the size of its input in a post-LN model shrinks the rest of the residual stream at every LayerNorm; this is
how PR's uncentred Eq. 8 was found to slow learning at the CPU recipe:

    python scripts/probe_sublayers.py --budget cpu-lr-0.005 --prepared runs/bench-quality/cpu/prepared \
        --rows transformer phrase_representation phrase_representation/max_attn_ta_uncentred \
        --steps 300 --jobs 3 --threads 1
"""

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.quality import load_budget, prepared_folder, recipe_of  # noqa: E402
from mgsa_hf.benchmarking.rows import REPOSITORY, recorded_command, resolve_rows  # noqa: E402


PROBED = ("self_attn", "encoder_attn", "phrase_combination")


def probe_row(label: str, prepared: str, recipe, row: dict, seed: int, steps: int, every: int,
              threads: int | None) -> dict:
    from mgsa_hf.training.prepared import PreparedCorpus, build_model, epoch_batches, make_optimizer, training_step

    if threads:
        torch.set_num_threads(threads)
    corpus = PreparedCorpus(prepared)
    train = corpus.split("train")
    model = build_model(corpus, recipe, row, seed).train()
    optimizer, scheduler = make_optimizer(model, recipe)
    ratios = {}

    def record(name):
        def hook(module, args, kwargs, output):
            inputs = args[0] if args else kwargs["hidden_states"]
            output = output[0] if isinstance(output, tuple) else output
            ratios.setdefault(name, []).append(float(output.detach().pow(2).mean().sqrt()
                                                     / inputs.detach().pow(2).mean().sqrt()))
        return hook

    for name, module in model.named_modules():
        if name.split(".")[-1] in PROBED and ".layers." in name:
            module.register_forward_hook(record(name.removeprefix("model.")), with_kwargs=True)
    curve, epoch, batches, position, losses, started = [], 0, None, 0, [], time.perf_counter()
    for step in range(1, steps + 1):
        if batches is None or position == len(batches):
            batches, position = epoch_batches(train, recipe, seed, epoch), 0
            epoch += 1
        losses.append(training_step(model, train.batch(batches[position]), recipe, optimizer, scheduler))
        position += 1
        if step % every == 0:
            curve.append({"step": step, "loss": round(float(np.mean(losses)), 4),
                          "output_over_input_rms": {name: round(float(np.mean(values)), 3)
                                                    for name, values in ratios.items()}})
            losses = []
            for values in ratios.values():
                values.clear()
            print(f"[probe_sublayers] {label} step {step}: loss {curve[-1]['loss']}", file=sys.stderr, flush=True)
    return {"row": row, "seed": seed, "seconds": round(time.perf_counter() - started, 1), "curve": curve}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="cpu-lr-0.005",
                        help="a name in configs/quality/ or a budget JSON file (one with a recipe)")
    parser.add_argument("--root", default="runs/bench-quality", help="folder of the prepared corpus")
    parser.add_argument("--prepared", help="the prepared corpus folder (default: <root>/<budget>/prepared)")
    parser.add_argument("--rows", nargs="+", default=["transformer"], metavar="ROW",
                        help="encoder types or row JSON files (see bench_quality.py)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--jobs", type=int, default=1, help="rows trained at once (processes)")
    parser.add_argument("--threads", type=int, help="torch CPU threads per row")
    parser.add_argument("--output", help="results JSON (default: benchmarks/sublayer-probe-<budget>.json)")
    args = parser.parse_args(argv)
    name, budget = load_budget(args.budget)
    recipe = recipe_of(budget, None)
    rows = resolve_rows(args.rows)
    prepared = str(prepared_folder(args, name))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {label: pool.submit(probe_row, label, prepared, recipe, fields, args.seed, args.steps, args.every,
                                      args.threads) for label, fields in rows.items()}
        results = {label: future.result() for label, future in futures.items()}
    report = {"command": recorded_command("scripts/probe_sublayers.py", sys.argv[1:] if argv is None else argv),
              "budget": name, "recipe": budget["recipe"], "threads": args.threads, "rows": results}
    output = Path(args.output) if args.output else REPOSITORY / "benchmarks" / f"sublayer-probe-{name}.json"
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[probe_sublayers] wrote {output}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
