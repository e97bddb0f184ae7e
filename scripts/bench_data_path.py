"""The data path at scale: preparation throughput, peak memory per process and a second launch's time to its first
step, on corpora made from Multi30k (train repeated, each copy's lines made distinct), with two CPU processes under
`accelerate launch`. Results go to a JSON file as they come (a rerun skips what it has).

    python scripts/bench_data_path.py --multi30k ../shared/data/multi30k --work runs/data-path \
        --output benchmarks/data-path-cpu.json

Measured:
* `prepare`: `mgsa-hf prepare` of an RHE recipe (spaCy parse + tokenizer) and a transformer's (tokenizer only) with
  `--workers` processes: seconds, CPU seconds of the whole process tree (per source word), the peak memory of each
  process, the prepared folder's peak and final size, and the processed splits' bytes a pair, as stored and in the
  earlier int64 layout;
* `tokenizer`: the tokenizer's training alone (`scripts/train_tokenizer.py`) at the prepare runs' sizes and at
  `--tokenizer-pairs`, whose CPU the WMT14 extrapolation counts at the share of pairs WMT14's recipe trains it on;
* with `--repeats N`, each prepare and tokenizer row is measured N times: the row is the run of median CPU time,
  with every run's CPU seconds beside it (`cpu_seconds_runs`);
* `launch`: for each corpus size, a first launch (the main process trains the tokenizer and prepares the tokenized
  corpus, the other waits) and a second one of the same recipe (`overwrite_output_dir=true`: both processes read what
  the first prepared), each process's seconds to its first training step and peak memory: a transformer (no parse)
  at every size, RHE (the main process parses) at the `--parse-sizes`.
"""

import argparse
import json
import os
import platform
import shutil
import sys
from itertools import pairwise, product
from pathlib import Path

import torch

from mgsa_hf.benchmarking.data import first_step_command, folder_bytes, make_corpus, measure_command
from mgsa_hf.tokenization_utils import read_lines


def int64_layout_bytes(processed: Path) -> int:
    """The bytes of a prepared folder's processed splits in the layout before the narrow types: every syntax field
    and the labels int64, the token ids int32, and the all-ones `attention_mask` (int8) stored."""
    import tempfile

    from datasets import Features, Sequence, Value

    from mgsa_hf.syntax_fields import LEVELLED_SYNTAX_FIELDS
    from mgsa_hf.training.corpus import load_processed

    total = 0
    for data in load_processed(processed).values():
        wide = Features({column: (Sequence(Sequence(Value("int64"))) if column in LEVELLED_SYNTAX_FIELDS else
                                  Sequence(Value("int32" if column == "input_ids" else "int64")))
                         for column in data.column_names})
        with_mask = Features({**wide, "attention_mask": Sequence(Value("int8"))})
        data = data.cast(wide).map(lambda rows: {"attention_mask": [[1] * len(ids) for ids in rows["input_ids"]]},
                                   batched=True, features=with_mask)
        with tempfile.TemporaryDirectory() as folder:
            data.save_to_disk(folder)
            total += sum(path.stat().st_size for path in Path(folder).glob("*.arrow"))
    return total


VOCAB_SIZE = 8000
RECIPE = [f"vocab_size={VOCAB_SIZE}", "max_eval_samples=8", "max_test_samples=8", "training.max_steps=1",
          "training.eval_strategy=no", "training.save_strategy=no", "training.per_device_train_batch_size=32",
          "reuse_cpu_memory=false"]


# WMT14 En-De's training corpus: 4.5M pairs, 116M English words (Luong et al., 2015)
WMT14_PAIRS, WMT14_SOURCE_WORDS = 4_500_000, 116_000_000


def source_words(corpus: Path) -> int:
    """The words of a made corpus's English training side."""
    return sum(len(line.split()) for line in read_lines(corpus / "train.en.gz"))


def slope(first: dict, second: dict) -> float:
    """CPU seconds a source word adds between two measured runs (the fixed start-up cancels)."""
    return (second["cpu_seconds"] - first["cpu_seconds"]) / (second["source_words"] - first["source_words"])


def tokenizer_sample_share() -> float:
    """The share of WMT14's pairs that its recipe trains the tokenizer on (`tokenizer_max_sentences`)."""
    import yaml

    from mgsa_hf.training.catalogue import recipe_path

    sample = yaml.safe_load(recipe_path("wmt14").read_text())["tokenizer_max_sentences"]
    return min(1.0, sample / WMT14_PAIRS)


def extrapolate(results: dict, args) -> None:
    """WMT14's processed step (tokens, and the parse for a type that reads syntax) from the CPU time a source word
    costs: the slope between the two largest `--parse-pairs` runs (what a word adds, without the fixed start-up), on
    one node of 16 cores and on 8 such nodes, assuming the work spreads evenly over the workers of every node. The
    tokenizer's training, measured alone at the same sizes, trains there on every pair; WMT14's recipe trains it on a
    sample (`tokenizer_sample_share`), so its slope counts at that share, at the larger of its two measured slopes
    (the cost a word grows with the sample)."""
    sizes = sorted(args.parse_pairs)[-2:]
    if len(sizes) < 2:
        return
    trainings = [results.get(f"tokenizer/{pairs}") for pairs in sorted({*sizes, *args.tokenizer_pairs})]
    tokenizer_slope = tokenizer_wmt14 = 0.0
    if None not in trainings and len(trainings) >= 2:
        tokenizer_slope = slope(*[results[f"tokenizer/{pairs}"] for pairs in sizes])
        largest = max(slope(first, second) for first, second in pairwise(trainings))
        tokenizer_wmt14 = largest * tokenizer_sample_share()
    for encoder_type, workers in product(args.prepare_types, args.workers):
        runs = [results.get(f"prepare/{encoder_type}/{pairs}/workers-{workers}") for pairs in sizes]
        if None in runs:
            continue
        per_word = slope(*runs)
        cpu_minutes = (per_word - tokenizer_slope + tokenizer_wmt14) * WMT14_SOURCE_WORDS / 60
        results[f"extrapolation/{encoder_type}/workers-{workers}"] = {
            "cpu_ms_per_source_word": round(1000 * per_word, 4),
            "tokenizer_cpu_ms_per_source_word": round(1000 * tokenizer_slope, 4),
            "wmt14_cpu_ms_per_source_word": round(1000 * (per_word - tokenizer_slope + tokenizer_wmt14), 4),
            "wmt14_cpu_minutes": round(cpu_minutes, 1),
            "one_node_16_cores_minutes": round(cpu_minutes / 16, 1),
            "eight_nodes_minutes": round(cpu_minutes / 128, 1),
            "bytes_per_pair": runs[1]["processed_bytes_per_pair"],
            "bytes_per_pair_int64": runs[1]["processed_bytes_per_pair_int64"],
            "wmt14_processed_gb": round(runs[1]["processed_bytes_per_pair"] * WMT14_SOURCE_WORDS
                                        / runs[1]["source_words"] * runs[1]["pairs"] / 1e9, 2),
        }


def median_run(command: list[str], repeats: int, clear: Path | None = None, **options) -> dict:
    """`measure_command(command, **options)` run `repeats` times, each after removing the folder `clear`: the run of
    median CPU seconds, with every run's (`cpu_seconds_runs`, in order). This machine's CPU time varies by 10-30%
    between identical runs."""
    runs = []
    for _ in range(repeats):
        if clear is not None:
            shutil.rmtree(clear, ignore_errors=True)
        runs.append(measure_command(command, **options))
    median = sorted(runs, key=lambda run: run["cpu_seconds"])[(repeats - 1) // 2]
    return {**median, "cpu_seconds_runs": [run["cpu_seconds"] for run in runs]} if repeats > 1 else median


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", type=Path, required=True, help="folder of Multi30k's train/val/test files")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder for the corpora and runs")
    parser.add_argument("--output", type=Path, required=True, help="JSON results file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000, 290_000], help="corpus pairs")
    parser.add_argument("--parse-pairs", type=int, nargs="+", default=[5000, 20000],
                        help="pairs of the prepare runs (two sizes: the CPU a word is the slope between them)")
    parser.add_argument("--tokenizer-pairs", type=int, nargs="*", default=[100_000],
                        help="corpus pairs at which the tokenizer's training is timed alone, besides --parse-pairs")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker processes of the prepare runs")
    parser.add_argument("--prepare-types", nargs="+", default=["rhe", "transformer"],
                        help="encoder types of the prepare runs (rhe: its corpus is parsed)")
    parser.add_argument("--launch-types", nargs="*", default=["transformer", "rhe"],
                        help="encoder types of the launches (rhe: its corpus is parsed)")
    parser.add_argument("--parse-sizes", type=int, nargs="+", default=[20_000, 100_000],
                        help="corpus sizes of the launches of types that parse")
    parser.add_argument("--repeats", type=int, default=1,
                        help="times each prepare and tokenizer row is measured (the row: the run of median CPU time)")
    return parser.parse_args()


def main():
    args = parse_args()
    args.work = args.work.resolve()  # the launches run in it (`cwd`), and their paths are the scratch folder's
    results = json.loads(args.output.read_text()) if args.output.is_file() else {}
    results.setdefault("machine", {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "torch": torch.__version__, "threads_per_process": 1})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}

    def save():
        args.output.write_text(json.dumps(results, indent=2) + "\n")

    for (pairs, encoder_type, workers) in product(args.parse_pairs, args.prepare_types, args.workers):
        corpus = make_corpus(args.multi30k, args.work / f"corpus-{pairs}", pairs)
        words = source_words(corpus)
        key = f"prepare/{encoder_type}/{pairs}/workers-{workers}"
        if key in results:
            continue
        run = args.work / f"prepare-{encoder_type}-{pairs}-{workers}"
        prepared = run.parent / f"{run.name}-run" / "prepared"
        measured = median_run([sys.executable, "-m", "mgsa_hf.cli", "prepare", f"data={corpus}", f"output_dir={run}",
                               f"model.encoder_type={encoder_type}", *RECIPE[:3], "--num-proc", str(workers)],
                              args.repeats, clear=run.parent / f"{run.name}-run", env=env, cwd=args.work,
                              watch=prepared)
        measured.pop("output")
        processed = next(path for path in prepared.glob("processed-*") if (path / "prepared.json").is_file())
        rows = sum(json.loads((processed / "prepared.json").read_text())["rows"].values())
        results[key] = {**measured, "pairs": pairs, "source_words": words,
                        "pairs_per_second": round(pairs / measured["seconds"], 1),
                        "cpu_ms_per_source_word": round(1000 * measured["cpu_seconds"] / words, 4),
                        "final_disk_mb": round(folder_bytes(prepared) / 2**20, 1),
                        "processed_bytes_per_pair": round(folder_bytes(processed) / rows, 1),
                        "processed_bytes_per_pair_int64": round(int64_layout_bytes(processed) / rows, 1)}
        save()
        print(key, results[key])
    for pairs in sorted({*args.parse_pairs, *args.tokenizer_pairs}):
        key = f"tokenizer/{pairs}"
        if key in results:
            continue
        corpus = make_corpus(args.multi30k, args.work / f"corpus-{pairs}", pairs)
        command = [sys.executable, str(Path(__file__).parent / "train_tokenizer.py"), "--source",
                   str(corpus / "train.en.gz"), "--target", str(corpus / "train.de.gz"), "--output",
                   str(args.work / f"tokenizer-{pairs}"), "--vocab-size", str(VOCAB_SIZE)]
        measured = median_run(command, args.repeats, env=env, cwd=args.work)
        measured.pop("output")
        words = source_words(corpus)
        results[key] = {**measured, "pairs": pairs, "source_words": words}
        save()
        print(key, results[key])
    extrapolate(results, args)
    save()
    runs = [(encoder_type, size) for encoder_type in args.launch_types
            for size in (args.sizes if encoder_type in ("transformer", "hybrid") else args.parse_sizes)]
    for encoder_type, size in runs:
        corpus = make_corpus(args.multi30k, args.work / f"corpus-{size}", size)
        prepared = args.work / f"prepared-{encoder_type}-{size}"
        for launch in ("first", "second"):
            key = f"launch/{encoder_type}/{size}/{launch}"
            if key in results:
                continue
            if launch == "first":
                shutil.rmtree(prepared, ignore_errors=True)
            run = args.work / f"run-{encoder_type}-{size}"
            if launch == "first":
                for folder in (run, run.parent / f"{run.name}-run"):
                    shutil.rmtree(folder, ignore_errors=True)
            # the second launch repeats the first into its folders (replacing its model; the run's tokenizer and the
            # prepared corpus stay), as a relaunch of the recipe does
            again = ["overwrite_output_dir=true"] if launch == "second" else []
            recipe = [f"data={corpus}", f"output_dir={run}", f"prepared_dir={prepared}",
                      f"model.encoder_type={encoder_type}", *RECIPE, *again]
            records = run.parent / f"{run.name}-{launch}-records"
            shutil.rmtree(records, ignore_errors=True)
            measured = measure_command(first_step_command(records, recipe, 29581), env=env, cwd=args.work)
            ranks = [json.loads((records / f"rank{rank}.json").read_text()) for rank in (0, 1)]
            results[key] = {"seconds": measured["seconds"], "ranks": ranks}
            save()
            print(key, results[key])


if __name__ == "__main__":
    main()
