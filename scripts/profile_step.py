"""Where a training step's time goes, per layer part, for each encoder variant against the plain Transformer.

Every direct child of every encoder and decoder layer (self-attention, feed-forward linears, layer norms, and a
variant's own parts: PR's phrase pooling, attentive combination, Transparent Attention) gets forward hooks that time
its forward pass (CPU, so the clock is the work); the parts of all layers are summed by name, side (encoder/decoder)
and step. The rest of the forward (embeddings, the output projection and loss, residuals, dropout, activations) is
"other", the backward pass and the optimizer step are timed whole. Batches are those of `scripts/bench_speed.py`
(`--inputs` from its `--save-inputs`, or built here with the spaCy parse: 32-pair batches, as in its CPU table).

    python scripts/profile_step.py --variants transformer phrase_representation --threads 1

writes `benchmarks/profile-cpu.json` and a table beside it (`profile-cpu.md`).
"""

import argparse
import json
import sys
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # the GPU machine has the repository only

from mgsa_hf.benchmarking import speed as bench_speed  # noqa: E402  (the batches, model sizes and rows)
from mgsa_hf.benchmarking.layers import profile  # noqa: E402
from mgsa_hf.benchmarking.rows import recorded_command  # noqa: E402


def markdown(results: dict, command: str) -> str:
    variants = list(results)
    keys = sorted({key for times in results.values() for key in times}, key=lambda k: (k == "total", k))
    lines = [f"Command: `{command}`", "", "| part (ms per step, median) | " + " | ".join(variants) + " |",
             "| --- |" + " --- |" * len(variants)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(f"{results[v].get(key, 0.0):.1f}" for v in variants) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["transformer", "phrase_representation"],
                        help=f"rows of the speed table: {list(bench_speed.VARIANTS)}")
    parser.add_argument("--backbone", default="marian", choices=["marian"],
                        help="the Marian family (T5 blocks nest their parts one level deeper)")
    parser.add_argument("--size", default="base", choices=["small", "base", "big"])
    parser.add_argument("--inputs", help="batches saved by `bench_speed.py --save-inputs` (else built here)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "profile-cpu.json"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.variants if name not in bench_speed.VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: choose from {list(bench_speed.VARIANTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.inputs:
        inputs = torch.load(args.inputs, weights_only=True)
    else:
        inputs = bench_speed.build_inputs(bench_speed.parse_args(["--data", args.data, "--batch-size", "32"]))
    results = {}
    for name in args.variants:
        model = bench_speed.build_model(inputs["vocab"], args.backbone, args.size, bench_speed.VARIANTS[name],
                                        torch.device("cpu"))
        results[name] = profile(model, inputs["train_batches"], args.steps, args.warmup)
        print(f"[profile_step] {name}: {results[name]['total']:.0f} ms per step", file=sys.stderr, flush=True)
    command = recorded_command("scripts/profile_step.py", sys.argv[1:] if argv is None else argv)
    output = Path(args.output)
    output.write_text(json.dumps({"command": command, "backbone": args.backbone, "size": args.size,
                                  "threads": torch.get_num_threads(), "torch": torch.__version__,
                                  "results": results}, indent=2) + "\n")
    output.with_suffix(".md").write_text(markdown(results, command))
    print(markdown(results, command))


if __name__ == "__main__":
    main()
