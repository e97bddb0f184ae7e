"""How often a CPU recipe leaves the model a target-side language model: `mgsa-hf train` stopped early, over seeds.

Every small Transformer of the default recipe first writes one sentence for every input (it has learnt German, not yet
to read English) and normally leaves that stage at steps 130-200 of the 300-step warm-up; now and then a run stays
in it (`benchmarks/BENCHMARKS.md`, "The default CPU recipe"). One failing run says nothing about a recipe change, since
any change re-draws the early training; this script measures a rate. Each run is the packaged default config plus a
candidate's overrides and a seed, stopped at `--steps`; its validation sentences are translated (beam 4) and a run
whose translations are under half distinct is counted as collapsed. The training loss every 10 steps is kept, so
that the runs' escape from the one-sentence stage can be compared, not only counted.

    python scripts/probe_collapse.py --seeds 1-10 --steps 250 --parallel 2 \
        --tokenizer runs/mgsa-multi30k-run/tokenizer --output benchmarks/collapse-probe.json

With `--tokenizer` every run shares one joint vocabulary, so runs differ by their seed alone (initialisation, batch
order, dropout). Results are written after every run; a (candidate, seed) already in the output is skipped (resume).
`--parallel 2` runs two processes of one thread each: timings of such runs are not the default's, their losses are.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

from mgsa_hf.training import COLLAPSED_FRACTION, run_folder


# each is the packaged default config (src/mgsa_hf/default_train_config.yaml) plus these overrides
CANDIDATES = {
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

    from mgsa_hf import MgsaForConditionalGeneration
    from mgsa_hf.evaluation import encoder_token_spread

    with LOADING:
        tokenizer = AutoTokenizer.from_pretrained(model_folder)
        model = MgsaForConditionalGeneration.from_pretrained(model_folder)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True, truncation=True, max_length=64)
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return encoder_token_spread(model, dict(batch))


def run_one(candidate: str, seed: int, args, threads: int) -> dict:
    """Train one (candidate, seed) to `args.steps` and return its validation scores and training losses."""
    run_dir = Path(args.runs) / f"{candidate}-seed{seed}{f'-every{args.every}' if args.every else ''}"
    overrides = [
        *CANDIDATES[candidate], *args.set,
        f"data={args.data}", f"output_dir={run_dir}", f"training.seed={seed}",
        f"training.max_steps={args.steps}", "training.save_strategy=steps",
        f"training.save_steps={args.every or args.steps}", "training.save_total_limit=null",
        "training.logging_steps=10", "training.disable_tqdm=true", "training.eval_strategy=no",
        "collapse_check_step=null",  # the run is measured, not restarted
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
    from mgsa_hf.tokenization_utils import read_lines

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

    from mgsa_hf.tokenization_utils import read_lines
    from mgsa_hf.trainer_mgsa import TokenBatchSampler

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


def summary(runs: list[dict]) -> str:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="*", default=list(CANDIDATES), help=f"of {sorted(CANDIDATES)}")
    parser.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,4,7")
    parser.add_argument("--steps", type=int, default=250, help="each run stops here")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, one thread each when over 1")
    parser.add_argument("--tokenizer", help="one joint tokenizer for every run (default: each run trains its own)")
    parser.add_argument("--validation-samples", type=int, default=200)
    parser.add_argument("--data", default="../shared/data/multi30k")
    parser.add_argument("--runs", default="runs/collapse-probe")
    parser.add_argument("--output", default="benchmarks/collapse-probe.json")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--every", type=int, help="save every N steps and measure the encoder spread at each")
    parser.add_argument("--backfill", action="store_true",
                        help="add the encoder spread to recorded runs that lack it, from their saved models")
    parser.add_argument("--batches", action="store_true",
                        help="only describe one epoch of each batching (needs --tokenizer) and add it to the output")
    args = parser.parse_args()
    unknown = sorted(set(args.candidates) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown candidates {unknown}; known: {sorted(CANDIDATES)}")

    output = Path(args.output)
    record = json.loads(output.read_text()) if output.is_file() else {"command": " ".join(sys.argv), "runs": []}
    if args.batches:
        if not args.tokenizer:
            parser.error("--batches needs --tokenizer")
        record["batches"] = batch_statistics(args.tokenizer, args.data)
        output.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["batches"], indent=1))
        return
    if args.backfill:
        sources, targets = validation_pairs(args)
        for run in record["runs"]:
            folder = Path(args.runs) / f"{run['candidate']}-seed{run['seed']}"
            if "encoder_token_spread" not in run and (folder / "config.json").is_file():
                run["encoder_token_spread"] = round(spread_of(folder, sources, targets), 4)
        output.write_text(json.dumps(record, indent=1) + "\n")
    done = {(run["candidate"], run["seed"], run.get("every")) for run in record["runs"]}
    # seeds outermost, so that an interrupted probe has compared the candidates on the same seeds
    todo = [(candidate, seed) for seed in parse_seeds(args.seeds) for candidate in args.candidates
            if (candidate, seed, args.every) not in done]
    threads = 1 if args.parallel > 1 else (os.cpu_count() or 1)
    lock = threading.Lock()

    def work(item):
        run = run_one(*item, args, threads)
        with lock:
            record["runs"].append(run)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(record, indent=1) + "\n")
            last = run["loss"][max(run["loss"], key=int)]
            print(f"{run['candidate']} seed {run['seed']}: validation BLEU {run['validation_bleu']:.2f}, "
                  f"{run['validation_distinct_fraction']:.0%} distinct, loss {last:.3f}", flush=True)

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(work, todo))
    print(summary(record["runs"]))


if __name__ == "__main__":
    main()
