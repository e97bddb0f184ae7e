#!/usr/bin/env python
"""The cost of each encoder variant's own attention, undiluted by the rest of the model, as a ratio to the same
sub-layers of the plain Transformer.

A variant of MG-SA, hybrid or RHE changes the self-attention of one or two encoder layers of twelve, so its cost
hides in the noise of a whole training step (`bench_speed.py`). Here the timed region is only what the variant
changes: the per-forward preparation of its syntax inputs (`variant_inputs`: MG-SA's phrase partition, RHE's
relations) and the self-attention sub-layers of its `config.variant_layers`, forward and backward (MG-SA's tag loss
included), each from the hidden states that reach it in an encoder forward. The transformer row runs the same
sub-layers of a plain model. Batches are those of `bench_length.py`: sentences of exactly 16 ... 256 tokens cut from
Multi30k and run through `MgsaProcessor` (spaCy parse included), the same number of source tokens at every length;
the variants are interleaved step by step and every figure is a median over `--steps` steps.

    python scripts/bench_layer.py --threads 1      # writes benchmarks/layer-cpu.json and its table (layer-cpu.md)
    python scripts/bench_layer.py --inputs gpu-data/length-inputs.pt --device cuda   # batches of bench_length.py
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking.layers import VariantAttention  # noqa: E402
from mgsa_hf.benchmarking.rows import REPOSITORY, recorded_command, rows_named  # noqa: E402
from mgsa_hf.benchmarking.speed import (  # noqa: E402
    SIZES,
    add_batch_arguments,
    build_length_inputs,
    build_model,
    select_device,
    synchronize,
    to_device,
)


# the speed table's rows whose variant changes only some encoder self-attentions, and two bounds for RHE: how many
# heads RHE-prune drops depends on the model's attention (with random weights most heads come out redundant), so a
# fixed gate of 0 (every head important, Eq. 10) gives each mode's cost when no head is pruned or replaced
LAYER_VARIANTS = {
    **rows_named(["phrase_memory/ngram_sans_layer_0", "phrase_memory", "hybrid", "rhe", "rhe/dea_rhe",
                  "rhe/rhe_prune"]),
    "rhe (every head important)": {"encoder_type": "rhe", "rhe_fixed_gate": 0.0},
    "rhe (prune, every head important)": {"encoder_type": "rhe", "rhe_mode": "rhe_prune", "rhe_fixed_gate": 0.0},
}


def log(message: str) -> None:
    print(f"[bench_layer {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def time_layers(runners: dict, batch: dict, steps: int, warmup: int, device) -> tuple[dict, dict]:
    """`({runner: median seconds of its step on batch}, {runner: RHE's important fraction or None})`, the runners
    interleaved step by step."""
    inputs = {name: runner.inputs(batch) for name, runner in runners.items()}
    times, important = {name: [] for name in runners}, {}
    for step in range(warmup + steps):
        for name, runner in runners.items():
            synchronize(device)
            start = time.perf_counter()
            important[name] = runner.step(*inputs[name])
            synchronize(device)
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, important


def markdown(result: dict) -> str:
    lengths = list(result["lengths"])
    lines = [f"Command: `{result['command']}`", "",
             "| variant | layers | " + " | ".join(f"{length} tokens" for length in lengths) + " |",
             "| --- | --- |" + " --- |" * len(lengths)]
    for name in result["variants"]:
        cells = []
        for length in lengths:
            row = result["lengths"][length][name]
            important = f" ({100 * row['important_heads']:.0f}% heads important)" if "important_heads" in row else ""
            cells.append(f"{row['variant_ms']:.1f} / {row['transformer_ms']:.1f} ms = {row['ratio']:.3f}{important}")
        lines.append(f"| {name} | {', '.join(map(str, result['layers'][name]))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser, tokens=1024)
    parser.add_argument("--variants", nargs="*", default=list(LAYER_VARIANTS), choices=list(LAYER_VARIANTS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--output", help="results JSON (default: benchmarks/layer-<device>.json, a table beside it)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    inputs = torch.load(args.inputs, weights_only=True) if args.inputs else build_length_inputs(args)
    reference = build_model(inputs["vocab"], "marian", args.size, {"encoder_type": "transformer"}, device).train()
    runners, layers = {}, {}
    for name in args.variants:
        model = build_model(inputs["vocab"], "marian", args.size, LAYER_VARIANTS[name], device).train()
        layers[name] = list(model.config.variant_layers)
        runners[name] = VariantAttention(model, layers[name])
        runners[f"transformer {layers[name]}"] = VariantAttention(reference, layers[name])
    lengths = {}
    for length, batch in inputs["batches"].items():
        log(f"length {length}: timing")
        seconds, important = time_layers(runners, to_device(batch, device), args.steps, args.warmup, device)
        lengths[str(length)] = {}
        for name, indices in layers.items():
            variant, plain = seconds[name], seconds[f"transformer {indices}"]
            lengths[str(length)][name] = {"variant_ms": round(1e3 * variant, 3),
                                          "transformer_ms": round(1e3 * plain, 3), "ratio": round(variant / plain, 4)}
            if important[name] is not None:
                lengths[str(length)][name]["important_heads"] = round(important[name], 4)
        log("  " + ", ".join(f"{name} {row['ratio']:.3f}" for name, row in lengths[str(length)].items()))
    result = {
        "command": recorded_command("scripts/bench_layer.py", sys.argv[1:] if argv is None else argv),
        "size": f"marian {args.size}", "config": SIZES["marian"][args.size], "tokens": args.tokens,
        "device": args.device, "threads": torch.get_num_threads(), "machine": platform.platform(),
        "torch": torch.__version__, "steps": args.steps, "warmup": args.warmup, "variants": args.variants,
        "layers": layers, "lengths": lengths,
    }
    out = Path(args.output) if args.output else REPOSITORY / "benchmarks" / f"layer-{args.device}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    log(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
