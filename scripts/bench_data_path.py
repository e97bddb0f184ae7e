"""The data path at scale: preparation throughput, peak memory per process and a second launch's time to its first
step, on corpora made from Multi30k (train repeated, each copy's lines made distinct), with two CPU processes under
`accelerate launch`. Results go to a JSON file as they come (a rerun skips what it has).

    python scripts/bench_data_path.py --multi30k ../shared/data/multi30k --work runs/data-path \
        --output benchmarks/data-path-cpu.json

Measured:
* `prepare`: `mgsa-hf prepare` of an RHE recipe (spaCy parse + tokenizer) with 1 and 2 worker processes: seconds,
  CPU seconds, pairs per second, the peak memory of each process;
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
from pathlib import Path

import torch

from mgsa_hf.benchmarking.data import first_step_command, make_corpus, measure_command


RECIPE = ["vocab_size=8000", "max_eval_samples=8", "max_test_samples=8", "training.max_steps=1",
          "training.eval_strategy=no", "training.save_strategy=no", "training.per_device_train_batch_size=32",
          "reuse_cpu_memory=false"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", type=Path, required=True, help="folder of Multi30k's train/val/test files")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder for the corpora and runs")
    parser.add_argument("--output", type=Path, required=True, help="JSON results file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000, 290_000], help="corpus pairs")
    parser.add_argument("--parse-pairs", type=int, default=4000, help="pairs of the parse throughput runs")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker processes of the parse runs")
    parser.add_argument("--launch-types", nargs="+", default=["transformer", "rhe"],
                        help="encoder types of the launches (rhe: its corpus is parsed)")
    parser.add_argument("--parse-sizes", type=int, nargs="+", default=[20_000, 100_000],
                        help="corpus sizes of the launches of types that parse")
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

    corpus = make_corpus(args.multi30k, args.work / f"corpus-{args.parse_pairs}", args.parse_pairs)
    for workers in args.workers:
        key = f"prepare/rhe/{args.parse_pairs}/workers-{workers}"
        if key in results:
            continue
        run = args.work / f"prepare-{workers}"
        shutil.rmtree(run.parent / f"{run.name}-run", ignore_errors=True)
        measured = measure_command([sys.executable, "-m", "mgsa_hf.cli", "prepare", f"data={corpus}",
                                    f"output_dir={run}", "model.encoder_type=rhe", *RECIPE[:3], "--num-proc",
                                    str(workers)], env=env, cwd=args.work)
        measured.pop("output")
        results[key] = {**measured, "pairs_per_second": round(args.parse_pairs / measured["seconds"], 1),
                        "cpu_seconds_per_pair": round(measured["cpu_seconds"] / args.parse_pairs, 5)}
        save()
        print(key, results[key])
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
