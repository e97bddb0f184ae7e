"""The experiments behind the default CPU recipe (`scripts/probe_collapse.py`, `scripts/sweep_cpu_recipe.py`):
candidate recipes as overrides of the packaged `mgsa-hf train` config, each run in its own process; how often a recipe
leaves the model a target-side language model over seeds, and test BLEU against wall-clock minutes."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from statistics import median

from ..evaluation import translation_scores
from ..modeling_mgsa import MgsaForConditionalGeneration
from ..tokenization_utils import read_lines
from ..training.ownership import run_folder
from ..training.run import COLLAPSED_FRACTION


# ---------------------------------------------------------------------------------------------- the collapse probe

# each is the packaged default recipe (src/mgsa_hf/training/recipes/default.yaml) plus these overrides
COLLAPSE_CANDIDATES = {
    # 224-pair batches from the Trainer's length-grouped sampler: each run of 32 steps goes from the longest
    # sentences of a random 7168-pair chunk to the shortest
    "length-grouped-224": ["max_tokens_per_batch=null", "training.per_device_train_batch_size=224",
                           "training.train_sampling_strategy=group_by_length"],
    # batches of at most 4096 padded tokens (fairseq's --max-tokens), in random order
    "token-batches-4096": ["max_tokens_per_batch=4096"],
}


def parse_seeds(text: str) -> list[int]:
    """`1-10` or `1,3,5` → the seeds."""
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


LOADING = threading.Lock()  # `from_pretrained` initialises on the meta device, which is not safe across threads


def spread_of(model_folder: Path, sources: list[str], targets: list[str]) -> float:
    """[`encoder_token_spread`] of a saved model over the tokens of `sources`."""
    from transformers import AutoTokenizer

    from ..evaluation import encoder_token_spread

    with LOADING:
        tokenizer = AutoTokenizer.from_pretrained(model_folder)
        model = MgsaForConditionalGeneration.from_pretrained(model_folder)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True, truncation=True, max_length=64)
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return encoder_token_spread(model, dict(batch))


def collapse_run(candidate: str, seed: int, args, threads: int) -> dict:
    """Train one (candidate, seed) to `args.steps` and return its validation scores and training losses."""
    run_dir = Path(args.runs) / f"{candidate}-seed{seed}{f'-every{args.every}' if args.every else ''}"
    overrides = [
        *COLLAPSE_CANDIDATES[candidate], *args.set,
        f"data={args.data}", f"output_dir={run_dir}", f"training.seed={seed}",
        f"training.max_steps={args.steps}", "training.save_strategy=steps",
        f"training.save_steps={args.every or args.steps}", "training.save_total_limit=null",
        "training.logging_steps=10", "training.disable_tqdm=true", "training.eval_strategy=no",
        "collapse_check_step=null",  # the run is measured, not restarted
        "overwrite_output_dir=true",  # an unfinished run (no results.json) is trained again from its start
        f"max_eval_samples={args.validation_samples}", "max_test_samples=1", "examples=[]",
        *([f"tokenizer={args.tokenizer}"] if args.tokenizer else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_files = run_folder(run_dir)  # results and checkpoints, beside the model folder
    if not (run_files / "results.json").is_file():  # written last: a finished run is measured, not trained again
        with log.open("w") as stream:
            subprocess.run([sys.executable, "-m", "mgsa_hf.cli", "train", *overrides], env=env, check=True,
                           stdout=stream, stderr=subprocess.STDOUT)
    results = json.loads((run_files / "results.json").read_text())
    validation = next(row for row in results["scores"] if row["split"] == "validation")
    state = json.loads((run_files / "checkpoints" / f"checkpoint-{args.steps}" / "trainer_state.json").read_text())
    losses = {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}
    sources, targets = validation_pairs(args)
    record = {"candidate": candidate, "seed": seed, "threads": threads, "steps": args.steps, "every": args.every,
              "encoder_token_spread": round(spread_of(run_dir, sources, targets), 4),
              "validation_bleu": round(validation["bleu"], 2),
              "validation_distinct_fraction": validation["distinct_fraction"],
              "collapsed": validation["distinct_fraction"] < COLLAPSED_FRACTION,
              "loss": losses}
    if args.every:  # the spread at every saved step: when a run leaves the one-sentence stage, or collapses
        checkpoints = sorted((run_files / "checkpoints").glob("checkpoint-*"),
                             key=lambda p: int(p.name.split("-")[1]))
        record["encoder_token_spread_by_step"] = {
            int(checkpoint.name.split("-")[1]): round(spread_of(checkpoint, sources, targets), 4)
            for checkpoint in checkpoints}
    return record


def validation_pairs(args) -> tuple[list[str], list[str]]:
    """The first `--validation-samples` validation pairs: what the encoder token spread is measured on."""
    return (list(read_lines(Path(args.data) / "val.en.gz", args.validation_samples)),
            list(read_lines(Path(args.data) / "val.de.gz", args.validation_samples)))


def batch_statistics(tokenizer_folder: str, data: str, seed: int = 1) -> dict:
    """What one epoch of each batching gives the model, from the training corpus as the runs tokenize it: batches,
    sentences per batch, padded source and target tokens per batch, and the real target tokens of each of the first
    64 batches (the length-grouped batches fall from the longest to the shortest sentences of every 32-batch run)."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from transformers.trainer_pt_utils import get_length_grouped_indices

    from ..training.trainer import TokenBatchSampler

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    sources = list(read_lines(Path(data) / "train.en.gz"))
    targets = list(read_lines(Path(data) / "train.de.gz"))
    encoded = tokenizer(sources, text_target=targets, max_length=64, truncation=True)
    source_lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    target_lengths = np.array([len(ids) for ids in encoded["labels"]])
    # the Trainer's `group_by_length` groups by the model input's length (its LengthGroupedSampler)
    order = get_length_grouped_indices(source_lengths.tolist(), 224, generator=torch.Generator().manual_seed(seed))
    batchings = {"length-grouped-224": [order[start : start + 224] for start in range(0, len(order), 224)],
                 "token-batches-4096": list(TokenBatchSampler(source_lengths, target_lengths, 4096, seed))}
    statistics = {}
    for name, batches in batchings.items():
        batches = [np.array(batch) for batch in batches]
        statistics[name] = {
            "batches_per_epoch": len(batches),
            "sentences_per_batch": round(float(np.mean([len(batch) for batch in batches])), 1),
            "padded_source_tokens": round(float(np.mean([source_lengths[b].max() * len(b) for b in batches]))),
            "padded_target_tokens": round(float(np.mean([target_lengths[b].max() * len(b) for b in batches]))),
            "target_tokens_of_the_first_64_batches": [int(target_lengths[b].sum()) for b in batches[:64]],
        }
    return statistics


def collapse_summary(runs: list[dict]) -> str:
    """Per candidate: collapsed runs, validation BLEU and the encoder token spread at the probe's last step over the
    seeds; then the spread by step of the runs measured at every checkpoint (`--every`)."""
    lines = ["| candidate | runs | collapsed | validation BLEU, median (min-max) | encoder token spread, median "
             "(min) | seeds that collapsed |", "| --- | --- | --- | --- | --- | --- |"]
    for candidate in dict.fromkeys(run["candidate"] for run in runs if not run.get("every")):
        rows = [run for run in runs if run["candidate"] == candidate and not run.get("every")]
        bleus = [run["validation_bleu"] for run in rows]
        spreads = [run["encoder_token_spread"] for run in rows if "encoder_token_spread" in run]
        spread_text = f"{median(spreads):.3f} ({min(spreads):.3f})" if spreads else "-"
        collapsed = [str(run["seed"]) for run in rows if run["collapsed"]]
        lines.append(f"| `{candidate}` | {len(rows)} | {len(collapsed)} | {median(bleus):.2f} ({min(bleus):.2f}-"
                     f"{max(bleus):.2f}) | {spread_text} | {', '.join(collapsed) or '-'} |")
    for run in (run for run in runs if run.get("every")):
        curve = ", ".join(f"{step}: {spread:.3f}" for step, spread in run["encoder_token_spread_by_step"].items())
        lines.append(f"\n`{run['candidate']}` seed {run['seed']}, encoder token spread by step: {curve}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ the CPU recipe sweep

# The candidates measured for the default recipe (benchmarks/HISTORY.md, "Earlier runs of the previous recipe");
# each is the packaged default config (128 wide, 4+4 layers, 4 heads, FFN 256, shared embeddings) plus these
# overrides. The earlier ones batch a fixed number of length-grouped sentence pairs.
SENTENCE_BATCHES = ["max_tokens_per_batch=null", "training.train_sampling_strategy=group_by_length"]
SMALL_BATCHES = SENTENCE_BATCHES + [
    "model.dropout=0.2", "training.learning_rate=0.004", "training.warmup_steps=200",
    "training.per_device_train_batch_size=96", "training.max_steps=1200"]
LARGE_BATCHES = SENTENCE_BATCHES + ["training.per_device_train_batch_size=224"]
RECIPE_CANDIDATES = {
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


def render_recipe_sweep(results: dict, plot: Path | None) -> str:
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
