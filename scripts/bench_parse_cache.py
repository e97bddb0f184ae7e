"""The parse cache's saving: the CPU time of the processed step of an RHE recipe prepared a first time (spaCy parses
every source sentence into `parsed-<key>`, then the fields are made) and a second time with another `vocab_size` in
the same `prepared_dir` (the parses are read back: only the tokenizer and the fields run). Each preparation runs in
its own process (`mgsa-hf prepare`'s `prepare`, one worker).

    python scripts/bench_parse_cache.py --multi30k ../shared/data/multi30k --pairs 2000 \
        --output benchmarks/parse-cache-cpu.json

CPU seconds are `time.process_time()` of the preparing process, plus those of its children (the parse process that
spaCy runs in beside the fields, [`~mgsa_hf.syntax_parse_ahead.ParseProcess`]); on a shared machine they are the
figure to quote, not the wall seconds.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


RECIPE = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"


def children_cpu() -> float:
    """CPU seconds of this process's children: those still running (the parse process) and those waited for."""
    import psutil

    alive = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        alive += times.user + times.system
    ended = os.times()
    return alive + ended.children_user + ended.children_system


def timed(function, steps: dict, name: str):
    """`function`, recording its CPU seconds (this process, its children) and wall seconds in `steps[name]`."""

    def wrapper(*args, **kwargs):
        cpu, children, wall = time.process_time(), children_cpu(), time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            steps[name] = {"cpu_s": round(time.process_time() - cpu, 2),
                           "children_cpu_s": round(children_cpu() - children, 2),
                           "wall_s": round(time.perf_counter() - wall, 2)}

    return wrapper


def prepare_once(overrides: list[str]) -> dict:
    """Prepare the recipe with `overrides` in this process; the CPU and wall seconds of each step built."""
    import mgsa_hf.training.corpus as corpus
    from mgsa_hf.training.config import load_train_config

    steps = {}
    corpus.build_parsed = timed(corpus.build_parsed, steps, "parsed")
    corpus.build_processed = timed(corpus.build_processed, steps, "processed")
    config = load_train_config(str(RECIPE), overrides)
    started = time.process_time()
    _, processor, processed = corpus.prepare(config, is_main=True, num_proc=1)
    return {"steps": steps, "prepare_cpu_s": round(time.process_time() - started, 2),
            "process_cpu_s": round(time.process_time(), 2), "rows": len(processed["train"]),
            "vocabulary": len(processor.tokenizer)}


def run(overrides: list[str]) -> dict:
    """[`prepare_once`] in a fresh process (spaCy and the tokenizer loaded there, as by `mgsa-hf prepare`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(overrides)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k", default="../shared/data/multi30k")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--vocab-sizes", type=int, nargs=2, default=[1000, 1500])
    parser.add_argument("--output", default="benchmarks/parse-cache-cpu.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(prepare_once(json.loads(args.child))))
        return
    work = Path(tempfile.mkdtemp(prefix="parse-cache-"))
    try:
        common = [f"data={Path(args.multi30k).resolve()}", "model.encoder_type=rhe",
                  f"max_train_samples={args.pairs}", f"prepared_dir={work / 'prepared'}"]
        first = run([*common, f"output_dir={work / 'first'}", f"vocab_size={args.vocab_sizes[0]}"])
        second = run([*common, f"output_dir={work / 'second'}", f"vocab_size={args.vocab_sizes[1]}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def step_cpu(result, *names):
        return sum(result["steps"][name]["cpu_s"] + result["steps"][name]["children_cpu_s"]
                   for name in names if name in result["steps"])

    first_cpu, second_cpu = step_cpu(first, "parsed", "processed"), step_cpu(second, "parsed", "processed")
    first_self = sum(first["steps"][name]["cpu_s"] for name in ("parsed", "processed"))
    second_self = sum(second["steps"][name]["cpu_s"] for name in ("parsed", "processed") if name in second["steps"])
    result = {
        "command": f"python scripts/bench_parse_cache.py --multi30k {args.multi30k} --pairs {args.pairs} "
                   f"--vocab-sizes {args.vocab_sizes[0]} {args.vocab_sizes[1]} --output {args.output}",
        "recipe": "tiny.yaml, model.encoder_type=rhe (validation and test: 8 pairs each), one worker",
        "pairs": args.pairs,
        "first": first,
        "second": second,
        "processed_step_cpu_s": {"first": round(first_cpu, 2), "second": round(second_cpu, 2)},
        "second_over_first_cpu": round(second_cpu / first_cpu, 3),
        "second_over_first_process_time": round(second_self / first_self, 3),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "note": "shared with other work while measured: CPU seconds, not wall seconds, are the figure"},
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
