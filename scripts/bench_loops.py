"""Subword loops of the default recipe's model, and what a repetition guard in the generation config does to them.

Trains the default recipe (`mgsa-hf train`, its own data and settings) once per seed, then translates test 2016 with
each `no_repeat_ngram_size` given (0: none) and the model's beam size. A loop is a run of at least five copies of one
to three word characters (`(\\w{1,3}?)\\1{4,}`: "erfärmmmmmmm", "stoligigigig"). For each guard: BLEU and chrF
(sacreBLEU), the share of translations with a loop and of distinct translations, per seed and their mean; and BLEU
against no guard, paired by seed (t-test over seeds). Results are written after every step and a rerun skips what is
done (a trained seed, a decoded guard).

    python scripts/bench_loops.py --seeds 42 43 44 --guards 0 4 --threads 2 --work runs/loops \
        --output benchmarks/loops-cpu.json
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from mgsa_hf.evaluation import SUBWORD_LOOP, loop_fraction, translation_scores


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_seed(seed: int, folder: Path, prepared: Path, threads: int, overrides: list[str]) -> dict:
    """The default recipe with `training.seed=seed` into `folder` (the corpus prepared once, in `prepared`)."""
    command = [sys.executable, "-m", "mgsa_hf.cli", "train", f"output_dir={folder}", f"training.seed={seed}",
               f"threads={threads}", f"prepared_dir={prepared}", *overrides]
    wall, cpu = time.perf_counter(), children_cpu_seconds()
    subprocess.run(command, check=True)
    results = json.loads((Path(f"{folder}-run") / "results.json").read_text())
    test = next(row for row in results["scores"] if row["split"] == "test")
    return {"train_wall_minutes": round((time.perf_counter() - wall) / 60, 2),
            "train_cpu_minutes": round((children_cpu_seconds() - cpu) / 60, 2), "run_test_bleu": test["bleu"]}


def decode(folder: Path, sources: list[str], guard: int, threads: int) -> list[str]:
    import torch
    from transformers import pipeline

    torch.set_num_threads(threads)
    translator = pipeline("translation", model=str(folder), device="cpu")
    rows = translator(sources, batch_size=100, truncation=True, no_repeat_ngram_size=guard)
    return [row["translation_text"] for row in rows]


def summary(results: dict, guards: list[int]) -> dict:
    seeds = sorted(results["seeds"])
    table = {}
    for guard in guards:
        rows = [results["seeds"][seed]["guards"].get(str(guard)) for seed in seeds]
        if None in rows:
            continue
        table[str(guard)] = {key: {"mean": round(float(np.mean([row[key] for row in rows])), 4),
                                   "std": round(float(np.std([row[key] for row in rows], ddof=1)), 4)
                                   if len(rows) > 1 else None, "values": [row[key] for row in rows]}
                             for key in ("bleu", "chrf", "loop_share", "distinct_fraction")}
        if guard != guards[0] and str(guards[0]) in table and len(rows) > 1:
            base = table[str(guards[0])]["bleu"]["values"]
            delta = [a - b for a, b in zip(table[str(guard)]["bleu"]["values"], base, strict=True)]
            test = stats.ttest_rel(table[str(guard)]["bleu"]["values"], base)
            table[str(guard)]["bleu_vs_first"] = {"delta_mean": round(float(np.mean(delta)), 3), "deltas": delta,
                                                  "p_value": round(float(test.pvalue), 4),
                                                  "test": "paired t-test over seeds, two-sided"}
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--guards", type=int, nargs="+", default=[0, 4], help="no_repeat_ngram_size values (0: none)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each training and decoding")
    parser.add_argument("--work", type=Path, default=Path("runs/loops"))
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the default recipe (e.g. data=...)")
    args = parser.parse_args()
    from mgsa_hf.tokenization_utils import read_lines
    from mgsa_hf.training.config import load_train_config
    from mgsa_hf.training.data import find_split_file

    config = load_train_config(None, args.overrides)
    split = config.splits["test"]
    sources, references = (list(read_lines(find_split_file(Path(config.data), split, lang)))
                           for lang in (config.source_lang, config.target_lang))
    results = json.loads(args.output.read_text()) if args.output.is_file() else {}
    results.update({
        "command": "python scripts/bench_loops.py " + " ".join(sys.argv[1:]),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "machine": {"platform": platform.platform(), "threads": args.threads},
        "recipe": {"name": next((item.split("=", 1)[1] for item in args.overrides if item.startswith("recipe=")),
                           "default"), "overrides": args.overrides, "split": split, "sentences": len(sources),
                   "num_beams": config.training.get("generation_num_beams"),
                   "generation": config.generation},
        "loop": SUBWORD_LOOP.pattern,
    })
    results.setdefault("seeds", {})
    results["references_loop_share"] = loop_fraction(references)

    def write():
        results["summary"] = summary(results, args.guards)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1) + "\n")

    for seed in args.seeds:
        folder = args.work / f"seed-{seed}"
        row = results["seeds"].setdefault(str(seed), {"guards": {}})
        if "run_test_bleu" not in row:
            row.update(train_seed(seed, folder, args.work / "prepared", args.threads, args.overrides))
            write()
        for guard in args.guards:
            if str(guard) in row["guards"]:
                continue
            started = time.perf_counter()
            translations = decode(folder, sources, guard, args.threads)
            (args.work / f"seed-{seed}.test.guard-{guard}.hyp.{config.target_lang}").write_text(
                "\n".join(translations) + "\n")
            scores = translation_scores(translations, references)
            row["guards"][str(guard)] = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                                         "loop_share": round(scores["loop_fraction"], 4),
                                         "distinct_fraction": round(scores["distinct_fraction"], 4),
                                         "decode_seconds": round(time.perf_counter() - started, 1),
                                         "bleu_signature": scores["bleu_signature"]}
            print(f"seed {seed} no_repeat_ngram_size={guard}: {row['guards'][str(guard)]}", flush=True)
            write()
    write()
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
