"""Floating-point operations of each encoder variant against the plain Transformer: the work that no implementation of
the same computation can skip, as a floor for the time ratios of `scripts/bench_speed.py`.

Counted with `torch.utils.flop_counter.FlopCounterMode` (matrix products, attention kernels and convolutions; the
element-wise work and the gathers it leaves out are a few percent of a step): a training step's forward and backward
pass over the benchmark's batches (summed), and beam-4 generation of the first generation batch forced to
`--gen-tokens` new tokens. Batches, model sizes and variant rows are `scripts/bench_speed.py`'s (`--inputs` from its
`--save-inputs`, or built here with the spaCy parse).

    python scripts/count_flops.py --inputs runs/speed-inputs.pt --output benchmarks/flops-cpu.json
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking import speed as bench_speed  # noqa: E402  (the batches, model sizes and rows)
from mgsa_hf.benchmarking.rows import recorded_command  # noqa: E402


def step_flops(model, batches: list[dict]) -> int:
    """Forward + backward FLOPs of a training step on each batch, summed."""
    model.train()
    with FlopCounterMode(display=False) as counter:
        for batch in batches:
            model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def generation_flops(model, batch: dict, new_tokens: int) -> int:
    """FLOPs of beam-4 generation of `new_tokens` tokens for the sentences of `batch`."""
    model.eval()
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.generate(**inputs, num_beams=4, min_new_tokens=new_tokens, max_new_tokens=new_tokens)
    return counter.get_total_flops()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="*", default=list(bench_speed.VARIANTS),
                        help="rows of the speed table")
    parser.add_argument("--backbone", default="marian", choices=list(bench_speed.SIZES))
    parser.add_argument("--size", default="base", choices=["small", "base", "big"])
    parser.add_argument("--inputs", help="batches saved by `bench_speed.py --save-inputs` (else built here)")
    parser.add_argument("--data", default=str(bench_speed.DEFAULT_DATA))
    parser.add_argument("--gen-tokens", type=int, default=20)
    parser.add_argument("--vocab-size", type=int, help="the models' vocabulary (default: the tokenizer's 8000); "
                        "e.g. 32000, the papers' WMT BPE vocabularies (see bench_speed.py --vocab-size)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "flops-cpu.json"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.variants if name not in bench_speed.VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: choose from {list(bench_speed.VARIANTS)}")
    variants = ["transformer", *(name for name in args.variants if name != "transformer")]
    if args.inputs:
        inputs = bench_speed.load_inputs(args.inputs, args.vocab_size)
    else:
        inputs = bench_speed.build_inputs(bench_speed.parse_args(["--data", args.data, "--batch-size", "32"]))
        bench_speed.with_vocab_size(inputs, args.vocab_size)
    rows = {}
    for name in variants:
        model = bench_speed.build_model(inputs["vocab"], args.backbone, args.size, bench_speed.VARIANTS[name],
                                        torch.device("cpu"))
        rows[name] = {"parameters": sum(parameter.numel() for parameter in model.parameters()),
                      "train_step_gflops": step_flops(model, inputs["train_batches"]) / 1e9,
                      "generation_gflops": generation_flops(model, inputs["gen_batches"][0], args.gen_tokens) / 1e9}
        print(f"[count_flops] {name}: {rows[name]}", file=sys.stderr, flush=True)
    for row in rows.values():
        row["train_step_ratio"] = row["train_step_gflops"] / rows["transformer"]["train_step_gflops"]
        row["generation_ratio"] = row["generation_gflops"] / rows["transformer"]["generation_gflops"]
    command = recorded_command("scripts/count_flops.py", sys.argv[1:] if argv is None else argv)
    vocab_size = inputs["vocab"]["vocab_size"]
    lines = [f"Command: `{command}`", "", f"**{args.backbone} {args.size}**, vocabulary {vocab_size}", "",
             "| variant | params | train step GFLOP | ratio | generation GFLOP | ratio |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['parameters'] / 1e6:.1f}M | {row['train_step_gflops']:.1f} | "
                     f"{row['train_step_ratio']:.3f} | {row['generation_gflops']:.1f} | "
                     f"{row['generation_ratio']:.3f} |")
    output = Path(args.output)
    output.write_text(json.dumps({"command": command, "backbone": args.backbone, "size": args.size,
                                  "vocab_size": vocab_size,
                                  "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
