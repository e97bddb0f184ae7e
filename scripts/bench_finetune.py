#!/usr/bin/env python
"""Upgrade a trained model with each encoder type and fine-tune it: test 2016 BLEU at step 0 and after fine-tuning.

What a practitioner does with an opus-mt model, on the default `mgsa-hf train` model (`runs/mgsa-multi30k`): convert
it to every encoder type (the variant's new modules start as an identity where the variant allows,
`load_as_mgsa`), score the converted model as it is (step 0), then fine-tune each, the plain
`transformer` too, for the same steps with ``recipe=finetune`` and score again (beam 4, sacreBLEU).

    python scripts/bench_finetune.py convert                      # the converted folders, seconds
    python scripts/bench_finetune.py run --seeds 1 --step0 &      # step-0 scores, then seed 1 of every type
    python scripts/bench_finetune.py run --seeds 2                # seed 2, beside it (one thread each)
    python scripts/bench_finetune.py report                       # -> benchmarks/finetune-cpu.json

Every finished score is a record file under `<root>/records/`, so an interrupted `run` skips what is done.
"""

import argparse
import json
import sys
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
ENCODER_TYPES = ["transformer", "hybrid", "rhe", "phrase_representation", "phrase_memory"]
FINETUNE_CONFIG = REPO / "src" / "mgsa_hf" / "training" / "recipes" / "finetune.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["convert", "run", "report"])
    parser.add_argument("--source", default="runs/mgsa-multi30k", help="the trained model folder to upgrade")
    parser.add_argument("--root", default="runs/bench-finetune", help="converted folders, runs and records")
    parser.add_argument("--types", nargs="*", default=ENCODER_TYPES)
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--step0", action="store_true", help="also score each converted model before fine-tuning")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--overrides", nargs="*", default=[], help="more finetune.yaml overrides, key=value")
    parser.add_argument("--output", default="benchmarks/finetune-cpu.json")
    return parser.parse_args(argv)


def convert(args) -> None:
    from mgsa_hf.training.conversion import convert_checkpoint

    for encoder_type in args.types:
        report = convert_checkpoint(args.source, Path(args.root) / encoder_type / "converted", encoder_type)
        print(encoder_type, "new modules:", len(report["new_modules"]), "parameters:", report["parameters"])


def score_converted(args, encoder_type: str) -> dict:
    """Test 2016 scores of a converted folder as it is, decoded as the recipe scores (beam 4, max_length 64)."""
    from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor
    from mgsa_hf.evaluation import decode_token_ids, translation_scores
    from mgsa_hf.tokenization_utils import read_lines

    folder = Path(args.root) / encoder_type / "converted"
    model = MgsaForConditionalGeneration.from_pretrained(folder).eval()
    processor = MgsaProcessor.from_pretrained(folder)
    sources = list(read_lines(Path(args.data) / "test_2016_flickr.en.gz"))
    references = list(read_lines(Path(args.data) / "test_2016_flickr.de.gz"))
    predictions = []
    with torch.no_grad():
        for start in range(0, len(sources), 100):
            batch = processor(sources[start : start + 100], return_tensors="pt", truncation=True, max_length=64)
            predictions.extend(decode_token_ids(processor.tokenizer,
                                                model.generate(**batch, num_beams=4, max_length=64)))
    return translation_scores(predictions, references)


def finetune(args, encoder_type: str, seed: int) -> dict:
    from mgsa_hf.training.config import load_train_config
    from mgsa_hf.training.run import train

    output_dir = Path(args.root) / encoder_type / f"seed-{seed}"
    config = load_train_config(FINETUNE_CONFIG, [
        f"data={args.data}", f"init_from={Path(args.root) / encoder_type / 'converted'}", f"output_dir={output_dir}",
        f"training.seed={seed}", "overwrite_output_dir=true", *args.overrides,  # a job not recorded: again
    ])
    results, _ = train(config)
    test = next(row for row in results["scores"] if row["split"] == "test")
    return {**test, "global_step": results["global_step"], "train_loss": results["train_loss"]}


def run(args) -> None:
    torch.set_num_threads(args.threads)
    records = Path(args.root) / "records"
    records.mkdir(parents=True, exist_ok=True)
    jobs = [(encoder_type, "step-0") for encoder_type in args.types if args.step0]
    jobs += [(encoder_type, f"seed-{seed}") for seed in args.seeds for encoder_type in args.types]
    for encoder_type, name in jobs:
        record = records / f"{encoder_type}.{name}.json"
        if record.is_file():
            continue
        if name == "step-0":
            scores = score_converted(args, encoder_type)
        else:
            scores = finetune(args, encoder_type, int(name.split("-")[1]))
        scores = {key: value for key, value in scores.items() if key != "predictions"}
        record.write_text(json.dumps({"encoder_type": encoder_type, "run": name, "threads": args.threads,
                                      **scores}, indent=2) + "\n")
        print(f"{encoder_type} {name}: BLEU {scores['bleu']:.2f}, {scores['distinct_fraction']:.1%} distinct",
              flush=True)


def report(args) -> None:
    import subprocess

    from mgsa_hf.training.ownership import run_folder

    records = [json.loads(path.read_text()) for path in sorted((Path(args.root) / "records").glob("*.json"))]
    source_results = run_folder(args.source) / "results.json"
    source = json.loads(source_results.read_text()) if source_results.is_file() else None
    rows = []
    for encoder_type in args.types:
        mine = {record["run"]: record for record in records if record["encoder_type"] == encoder_type}
        after = [mine[f"seed-{seed}"] for seed in args.seeds if f"seed-{seed}" in mine]
        row = {"encoder_type": encoder_type, "step0_bleu": mine.get("step-0", {}).get("bleu"),
               "step0_distinct": mine.get("step-0", {}).get("distinct_fraction"),
               "finetuned_bleu": {record["run"]: record["bleu"] for record in after},
               "finetuned_distinct": {record["run"]: record["distinct_fraction"] for record in after}}
        if after:
            row["finetuned_bleu_mean"] = sum(record["bleu"] for record in after) / len(after)
        rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    signature = next((record["bleu_signature"] for record in records), None)
    summary = {
        "command": "python scripts/bench_finetune.py convert && python scripts/bench_finetune.py run --seeds 1 "
                   "--step0 & python scripts/bench_finetune.py run --seeds 2; python scripts/bench_finetune.py report",
        "commit": commit, "source": args.source, "source_scores": source and source.get("scores"),
        "finetune_config": str(FINETUNE_CONFIG.relative_to(REPO)), "overrides": args.overrides,
        "split": "test_2016_flickr (1000 sentences)", "beam": 4, "max_length": 64, "bleu_signature": signature,
        "seeds": args.seeds, "threads_per_run": sorted({record["threads"] for record in records}), "rows": rows,
    }
    Path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    for row in rows:
        after = " ".join(f"{bleu:.2f}" for bleu in row["finetuned_bleu"].values())
        step0 = "-" if row["step0_bleu"] is None else f"{row['step0_bleu']:.2f}"
        print(f"{row['encoder_type']:>22}: step 0 {step0}  fine-tuned {after}")


def main(argv=None) -> None:
    args = parse_args(argv)
    {"convert": convert, "run": run, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
