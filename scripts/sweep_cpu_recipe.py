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

from mgsa_hf.benchmarking.recipes import RECIPE_CANDIDATES, render_recipe_sweep, score_checkpoints
from mgsa_hf.benchmarking.rows import recorded_command
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.ownership import run_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="*", default=list(RECIPE_CANDIDATES),
                        help=f"of {sorted(RECIPE_CANDIDATES)}")
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
    command = recorded_command("scripts/sweep_cpu_recipe.py", sys.argv[1:])
    results = json.loads(output.read_text()) if output.is_file() else {"command": command, "runs": {}}
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
        overrides = RECIPE_CANDIDATES[name] + [
            f"data={args.data}", f"output_dir={run_dir}",
            *([f"training.max_steps={args.max_steps}"] if args.max_steps else []),
            "training.eval_strategy=no", "training.save_strategy=steps", f"training.save_steps={args.every}",
            "training.save_total_limit=null", "training.disable_tqdm=true", "training.logging_steps=50",
            "overwrite_output_dir=true",  # a candidate not recorded as done is trained again from its start
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
        results["runs"][name] = {"overrides": RECIPE_CANDIDATES[name], "threads": args.threads,
                                 "wall_seconds": round(wall), "finished": finished, "curve": curve,
                                 "final_scores": final["scores"] if final else None}
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
    print(render_recipe_sweep(results, Path(args.plot) if args.plot else None))


if __name__ == "__main__":
    main()
