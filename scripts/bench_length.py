#!/usr/bin/env python
"""How each variant's training step grows with sentence length, as a ratio to the plain Transformer at each length.

Sentences of exactly 16 ... 256 source and target tokens are cut from joined consecutive Multi30k captions and run
through `MgsaProcessor` (spaCy parse included, so every syntax field is real); each batch holds the same number of
source tokens (`--tokens`), so a flat line means cost linear in length. Step = forward + backward + AdamW step,
median of `--steps` after `--warmup`, the variants interleaved step by step
(`mgsa_hf.benchmarking.speed.time_training`).

    python scripts/bench_length.py --threads 1        # writes benchmarks/length-cpu.json and length-cpu.png
    python scripts/bench_length.py --save-inputs gpu-data/length-inputs.pt   # parse here ...
    python scripts/bench_length.py --inputs gpu-data/length-inputs.pt --device cuda --dtype bf16   # ... time there
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.rows import REPOSITORY, recorded_command, rows_named  # noqa: E402
from mgsa_hf.benchmarking.speed import (  # noqa: E402
    SIZES,
    VARIANTS,
    add_batch_arguments,
    build_length_inputs,
    build_model,
    select_device,
    time_training,
)


LENGTH_VARIANTS = [
    "transformer", "phrase_memory/ngram_sans_layer_0", "phrase_memory", "phrase_representation", "hybrid", "rhe",
]


def log(message: str) -> None:
    print(f"[bench_length {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (absolute, ratio) = plt.subplots(1, 2, figsize=(11, 4))
    lengths = [int(length) for length in result["lengths"]]
    for name in result["variants"]:
        rows = [result["lengths"][str(length)][name] for length in lengths]
        absolute.plot(lengths, [row["train_step_s"] * 1e3 / result["tokens"] * 1e3 for row in rows], marker="o",
                      label=name)
        ratio.plot(lengths, [row["train_step_ratio"] for row in rows], marker="o", label=name)
    absolute.set(xscale="log", xlabel="sentence length (tokens)", ylabel="ms per 1000 source tokens",
                 title="training step per token")
    ratio.set(xscale="log", xlabel="sentence length (tokens)", ylabel="step time / transformer",
              title="ratio to the transformer")
    for axis in (absolute, ratio):
        axis.minorticks_off()
        axis.set_xticks(lengths, [str(length) for length in lengths])
        axis.grid(alpha=0.3)
    ratio.legend(fontsize=7)
    figure.suptitle(f"{result['size']}, {result['device']}, {result['threads']} thread(s), "
                    f"{result['tokens']} source tokens per batch")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser, tokens=2048)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    parser.add_argument("--save-inputs", metavar="FILE", help="parse and save the batches, then stop")
    parser.add_argument("--variants", nargs="*", default=LENGTH_VARIANTS, choices=list(VARIANTS),
                        help="rows of the speed table (mgsa_hf.benchmarking.rows.SPEED_ROWS)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--output", help="results JSON (default: benchmarks/length-<device>.json, a plot beside it)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.inputs:
        inputs = torch.load(args.inputs, weights_only=True)
    else:
        inputs = build_length_inputs(args)
        if args.save_inputs:
            Path(args.save_inputs).parent.mkdir(parents=True, exist_ok=True)
            torch.save(inputs, args.save_inputs)
            log(f"saved {args.save_inputs}")
            return
    device = select_device(args.device)
    models = {name: build_model(inputs["vocab"], "marian", args.size, fields, device)
              for name, fields in rows_named(args.variants).items()}
    lengths = {}
    for length, batch in inputs["batches"].items():
        log(f"length {length}: timing")
        seconds = time_training(models, [batch], args.steps, args.warmup, device, args.dtype == "bf16")
        reference = seconds[args.variants[0]]
        lengths[str(length)] = {name: {"train_step_s": value, "train_step_ratio": value / reference}
                                for name, value in seconds.items()}
        log("  " + ", ".join(f"{name} {row['train_step_ratio']:.3f}" for name, row in lengths[str(length)].items()))
    result = {
        "command": recorded_command("scripts/bench_length.py", sys.argv[1:] if argv is None else argv),
        "size": f"marian {args.size}", "config": SIZES["marian"][args.size], "tokens": args.tokens,
        "device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "machine": platform.platform(), "torch": torch.__version__, "variants": args.variants, "lengths": lengths,
    }
    out = Path(args.output) if args.output else REPOSITORY / "benchmarks" / f"length-{args.device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
