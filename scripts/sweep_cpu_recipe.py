"""Chooses the recipe of the default `mgsa-hf train` run: BLEU against wall-clock minutes for candidate recipes.

Each candidate is `mgsa-hf train` (the packaged default config plus the candidate's overrides) in its own process,
with a checkpoint saved every `--every` steps. After the run every checkpoint is scored on test 2016 (greedy, the
tokenizer alone: the candidates are plain transformers), and its minute is the checkpoint's time since the process
started, so the curve counts everything a user waits for (tokenizer training, tokenisation, training). The run's own
final score (beam 4, written by `mgsa-hf train`) is reported beside it.

    python scripts/sweep_cpu_recipe.py --threads 2 --every 65 --output benchmarks/cpu-recipe-sweep.json default

Results are written after each candidate; a candidate already in the output file is skipped (resume). After the
runs the script prints the curves as a markdown table and draws them (`--plot`).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training import run_folder


# The candidates measured for the default recipe (benchmarks/BENCHMARKS.md, "The default CPU recipe"); each is the
# packaged default config (128 wide, 4+4 layers, 4 heads, FFN 256, shared embeddings) plus these overrides. The
# earlier ones batch a fixed number of length-grouped sentence pairs.
SENTENCE_BATCHES = ["max_tokens_per_batch=null", "training.train_sampling_strategy=group_by_length"]
SMALL_BATCHES = SENTENCE_BATCHES + [
    "model.dropout=0.2", "training.learning_rate=0.004", "training.warmup_steps=200",
    "training.per_device_train_batch_size=96", "training.max_steps=1200"]
LARGE_BATCHES = SENTENCE_BATCHES + ["training.per_device_train_batch_size=224"]
CANDIDATES = {
    "b96-do0.2": SMALL_BATCHES,
    "b96-do0.2-init0.088": SMALL_BATCHES + ["model.init_std=0.088"],
    "b96-do0.1-init0.088": SMALL_BATCHES + ["model.init_std=0.088", "model.dropout=0.1"],
    "b96-do0.1-init0.088-linear": SMALL_BATCHES + [
        "model.init_std=0.088", "model.dropout=0.1", "training.lr_scheduler_type=linear",
        "training.learning_rate=0.005"],
    "b224-do0.1-init0.088": LARGE_BATCHES + ["model.init_std=0.088", "training.max_steps=520"],
    "b224-do0.1": LARGE_BATCHES + ["training.max_steps=520"],  # the default until it had the time for 600 steps
    "b224-do0.1-600": LARGE_BATCHES + ["training.max_steps=600"],  # the default until token-count batches
    "default": [],  # the packaged config as it is (benchmarks/cpu-recipe-sweep.json holds it at 520 grouped steps)
    "tokens-4096": ["max_tokens_per_batch=4096", "training.max_steps=700"],  # the default since token batches
}


def score_checkpoints(run_dir: Path, started: float, test_sources: list[str], test_references: list[str]) -> list:
    """Greedy test BLEU of every checkpoint of a run, with its minute since the run started."""
    import torch
    from transformers import AutoTokenizer

    from mgsa_hf import MgsaForConditionalGeneration
    from mgsa_hf.evaluation import translation_scores

    run_files = run_folder(run_dir)  # the trained tokenizer and the checkpoints, beside the model folder
    tokenizer = AutoTokenizer.from_pretrained(run_files / "tokenizer")
    checkpoints = sorted((run_files / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    curve = []
    for checkpoint in checkpoints:
        minute = ((checkpoint / "model.safetensors").stat().st_mtime - started) / 60
        model = MgsaForConditionalGeneration.from_pretrained(checkpoint).eval()
        hypotheses = []
        with torch.no_grad():
            for start in range(0, len(test_sources), 200):
                batch = tokenizer(test_sources[start : start + 200], return_tensors="pt", padding=True)
                output = model.generate(**batch, num_beams=1, max_new_tokens=64)
                hypotheses += [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)]
        scores = translation_scores(hypotheses, test_references)
        curve.append({"step": int(checkpoint.name.split("-")[-1]), "minutes": round(minute, 2),
                      "test_bleu_greedy": round(scores["bleu"], 2),
                      "distinct": len(set(hypotheses))})
        print(f"  {checkpoint.name}: {minute:.1f} min, greedy test BLEU {scores['bleu']:.2f}, "
              f"{len(set(hypotheses))} distinct", flush=True)
    return curve


def render(results: dict, plot: Path | None) -> str:
    """The curves as a markdown table (greedy test BLEU at each checkpoint's minute), and as a plot."""
    lines = ["| candidate | overrides | checkpoints: minutes → greedy test BLEU (distinct outputs) | final (beam 4) |",
             "| --- | --- | --- | --- |"]
    for name, run in results["runs"].items():
        points = ", ".join(f"{p['minutes']:.1f} → {p['test_bleu_greedy']:.1f} ({p['distinct']})" for p in run["curve"])
        final = next((s for s in run["final_scores"] or [] if s["split"] == "test"), None)
        final_text = f"{final['bleu']:.2f}" if final else "cut at the time limit"
        lines.append(f"| `{name}` | `{' '.join(run['overrides'])}` | {points} | {final_text} |")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 4))
        for name, run in results["runs"].items():
            axis.plot([p["minutes"] for p in run["curve"]], [p["test_bleu_greedy"] for p in run["curve"]], "o-",
                      label=name)
        axis.set(xlabel="minutes since `mgsa-hf train` started (2 cores)", ylabel="test 2016 BLEU (greedy)")
        axis.grid(alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(plot, dpi=100)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="*", default=list(CANDIDATES), help=f"of {sorted(CANDIDATES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=10.0, help="training steps are cut at this wall clock")
    parser.add_argument("--max-steps", type=int, help="override every candidate's max_steps")
    parser.add_argument("--every", type=int, default=200, help="checkpoint interval (steps)")
    parser.add_argument("--data", default="../shared/data/multi30k")
    parser.add_argument("--runs", default="runs/cpu-recipe-sweep")
    parser.add_argument("--output", default="benchmarks/cpu-recipe-sweep.json")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every candidate")
    parser.add_argument("--plot", default="benchmarks/cpu-recipe-sweep.png")
    args = parser.parse_args()

    output = Path(args.output)
    results = json.loads(output.read_text()) if output.is_file() else {"command": " ".join(sys.argv), "runs": {}}
    data = Path(args.data)
    test_sources = list(read_lines(data / "test_2016_flickr.en.gz"))
    test_references = list(read_lines(data / "test_2016_flickr.de.gz"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    for name in args.candidates:
        if name in results["runs"]:
            print(f"{name}: done already")
            continue
        run_dir = Path(args.runs) / name
        overrides = CANDIDATES[name] + [
            f"data={args.data}", f"output_dir={run_dir}",
            *([f"training.max_steps={args.max_steps}"] if args.max_steps else []),
            "training.eval_strategy=no", "training.save_strategy=steps", f"training.save_steps={args.every}",
            "training.save_total_limit=null", "training.disable_tqdm=true", "training.logging_steps=50",
            *args.set,
        ]
        command = [sys.executable, "-m", "mgsa_hf.cli", "train", *overrides]
        print(f"{name}: {' '.join(command[3:])}", flush=True)
        started = time.time()
        # the wall-clock cut: the run is stopped from outside at `--minutes`; its last checkpoint is what it reached
        try:
            subprocess.run(command, env=env, check=True, timeout=args.minutes * 60)
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        wall = time.time() - started
        curve = score_checkpoints(run_dir, started, test_sources, test_references)
        final = json.loads((run_folder(run_dir) / "results.json").read_text()) if finished else None
        results["runs"][name] = {"overrides": CANDIDATES[name], "threads": args.threads, "wall_seconds": round(wall),
                                 "finished": finished, "curve": curve,
                                 "final_scores": final["scores"] if final else None}
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results, Path(args.plot) if args.plot else None))


if __name__ == "__main__":
    main()
