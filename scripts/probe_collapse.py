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
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mgsa_hf.benchmarking.recipes import (
    COLLAPSE_CANDIDATES,
    batch_statistics,
    collapse_run,
    collapse_summary,
    parse_seeds,
    spread_of,
    validation_pairs,
)
from mgsa_hf.benchmarking.rows import recorded_command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="*", default=list(COLLAPSE_CANDIDATES),
                        help=f"of {sorted(COLLAPSE_CANDIDATES)}")
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
    unknown = sorted(set(args.candidates) - set(COLLAPSE_CANDIDATES))
    if unknown:
        parser.error(f"unknown candidates {unknown}; known: {sorted(COLLAPSE_CANDIDATES)}")

    output = Path(args.output)
    command = recorded_command("scripts/probe_collapse.py", sys.argv[1:])
    record = json.loads(output.read_text()) if output.is_file() else {"command": command, "runs": []}
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
        run = collapse_run(*item, args, threads)
        with lock:
            record["runs"].append(run)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(record, indent=1) + "\n")
            last = run["loss"][max(run["loss"], key=int)]
            print(f"{run['candidate']} seed {run['seed']}: validation BLEU {run['validation_bleu']:.2f}, "
                  f"{run['validation_distinct_fraction']:.0%} distinct, loss {last:.3f}", flush=True)

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(work, todo))
    print(collapse_summary(record["runs"]))


if __name__ == "__main__":
    main()
