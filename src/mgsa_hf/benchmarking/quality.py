"""Translation quality of every encoder type under one protocol, with seeds and significance against the plain
Transformer.

Multi30k en→de, one prepared corpus per budget (a joint tokenizer and every syntax field, parsed once), the same
recipe for every row (only the variant's own config fields differ), equal steps, several seeds, the average of the
last checkpoints, beam search, sacreBLEU BLEU and chrF on validation and test 2016, the number of distinct test
outputs, and of each row against `transformer` on test 2016 a t-test over seeds (`evaluation.seed_level_test`: the
null is "the same recipe, another seed") with the paired bootstrap's test-set interval beside it. Training is
`mgsa_hf.training.prepared`: it needs only torch, transformers and sacreBLEU, so the `train` step runs on a GPU
machine without spaCy or `datasets`; `prepare` runs where the package is installed.

    # the CPU table: 3 seeds of the five defaults and each paper's best row at two learning rates, two runs at a
    # time with one thread each, every row at the rate of its better validation BLEU (a selection budget)
    python scripts/bench_quality.py all --budget cpu --rows defaults best --seeds 1 2 3 --jobs 2 --threads 1
    # the GPU table: prepare here, carry runs/bench-quality/base/prepared to the GPU machine, train there
    python scripts/bench_quality.py prepare --budget base
    python scripts/bench_quality.py train --budget base --rows defaults best --seeds 1 2 3 --jobs 5   # on the GPU
    python scripts/bench_quality.py report --budget base
    # a selection again from its budgets' reported results (benchmarks/quality-cpu-lr-*.json), training nothing
    python scripts/bench_quality.py report --budget cpu
    # gold (or another parser's) trees instead of the derived ones: one PTB tree per source line, empty: derived
    python scripts/bench_quality.py prepare --budget cpu --train-trees trees/train.ptb --validation-trees trees/val.ptb

Budgets are JSON files in `configs/quality/` (`prepare` settings and the `Recipe`). Runs live in
`<root>/<budget>/<row>/seed-<seed>/`; a finished run is reused and an interrupted one resumes from its last
checkpoint. A finished run's record (its `run.json`, `result.json`, `log.jsonl`, test translations and the prepared
corpus's manifest) is also kept beside the results, in `benchmarks/quality-<budget>.runs/<row>/seed-<seed>/`, with
the corpus's tokenizer in `benchmarks/quality-<budget>.runs/tokenizer/`: a fresh checkout (or another machine) with
that folder prepares the same corpus, trains only the runs it lacks, and `report` reads the kept runs too; a table
longer than one sitting is finished over several. `report` writes
`benchmarks/quality-<budget>.json` (one record per run under `runs`), the test hypotheses beside it, a plot of
validation loss against steps, and the budget's table in `benchmarks/BENCHMARKS.md`.

A selection budget (`"select": {"from": [budgets], "by": "validation_bleu"}`) keeps for every row the budget with the
best mean validation score over the seeds they share (the same rule for every row, the transformer included: a
learning rate tuned per row on validation, say) and tests the rows chosen against the transformer chosen. Its
`prepare` and `train` run those steps for each of its budgets (one prepared corpus, `<root>/<selection>/prepared`,
when they prepare alike; their runs in one queue); `all` also reports each of them; its `report` reads their reported
results (`benchmarks/quality-<budget>.json` and the test hypotheses beside them).
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..evaluation import mean_std, paired_bootstrap, seed_level_test
from ..training.catalogue import default_data
from ..training.config import positive_int
from .quality_report import (  # noqa: F401  (the report's functions, read as this module's by the tests)
    PAPER_RESULTS,
    SELECTION_METRICS,
    SIGNIFICANCE,
    plot_curves,
    render_budget,
    replace_section,
    update_markdown,
    with_seed_tests,
)
from .rows import (
    BASELINE,
    REPOSITORY,
    job_gpus,
    least_busy_gpu,
    package_environment,
    portable_path,
    recorded_command,
    resolve_rows,
)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of `scripts/bench_quality.py` (and of its `run-one` processes)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "train", "report", "all", "run-one"])
    parser.add_argument("--budget", default="cpu", help="a name in configs/quality/ or a budget JSON file")
    parser.add_argument("--data", default=default_data(REPOSITORY),
                        help="the corpus folder (prepare; default: $MGSA_HF_DATA/multi30k, else "
                             "../shared/data/multi30k beside the checkout)")
    parser.add_argument("--root", default="runs/bench-quality", help="folder of the prepared corpus and the runs")
    parser.add_argument("--prepared", help="the prepared corpus folder (default: <root>/<budget>/prepared)")
    for split in ("train", "validation", "test"):
        parser.add_argument(f"--{split}-trees", metavar="FILE",
                            help=f"prepare: PTB trees of the {split} source sentences, one line per sentence of the "
                                 "whole split (an empty line: the processor's own tree); also the budget's "
                                 "`prepare.trees`")
    parser.add_argument("--tree-column", help="prepare: the field of the JSONL records holding each source "
                                              "sentence's PTB tree")
    parser.add_argument("--rows", nargs="+", default=["defaults"], metavar="ROW",
                        help="`defaults` (the five encoder types), `best` (each paper's best row), encoder types, "
                             "or JSON files of MgsaConfig fields; `transformer` always runs")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    # at least 1: `--jobs 0` would start no run and wait for one forever
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs trained at once (processes)")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads per run")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--max-steps", type=int, help="override the recipe's max_steps")
    parser.add_argument("--at-common-step", action="store_true",
                        help="train: finish every run at the last checkpoint step that all of them reached (a "
                             "comparison cut short by a time limit, still at equal steps; needs the budget's "
                             "`keep_checkpoints`)")
    parser.add_argument("--results", help="results JSON (default: benchmarks/quality-<budget>.json)")
    parser.add_argument("--markdown", help="markdown file whose quality section is rewritten "
                                           "(default: benchmarks/BENCHMARKS.md)")
    # run-one (internal: one run in its own process)
    parser.add_argument("--row-json", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--keep-run", help=argparse.SUPPRESS)
    parser.add_argument("--kept-runs", help=argparse.SUPPRESS)  # the budget's kept runs, where the tokenizer goes
    return parser.parse_args(argv)


def load_budget(spec: str) -> tuple[str, dict]:
    """`(name, budget)` of a budget: a name in `configs/quality/` or a JSON file; an unknown one stops the run."""
    path = Path(spec) if spec.endswith(".json") else REPOSITORY / "configs" / "quality" / f"{spec}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (REPOSITORY / "configs" / "quality").glob("*.json"))
        raise SystemExit(f"budget {spec!r}: no file {path}; known budgets: {known}.")
    return path.stem, json.loads(path.read_text())


def recipe_of(budget: dict, max_steps: int | None):
    """The budget's training `Recipe`, with `--max-steps` when given (a selection budget has none)."""
    from ..training.prepared import Recipe

    if "select" in budget:
        raise SystemExit(f"a selection budget has no recipe of its own: name one of {budget['select']['from']}.")
    recipe = Recipe(**{k: (tuple(v) if k == "adam_betas" else v) for k, v in budget["recipe"].items()})
    if max_steps is not None:
        recipe.max_steps = max_steps
    clash = sorted(set(recipe.model) & {"encoder_type"})
    if clash:
        raise SystemExit(f"the budget's model section may not set {clash}: rows set them.")
    return recipe


# ---------------------------------------------------------------------------------------------------- the steps


def prepare(args, name: str, budget: dict) -> Path:
    """The prepared corpus of the budget (`prepare_corpus` with its `prepare` settings and the tree options); an
    existing one is reused when it was prepared with the same trees (given ones, and what derived the others)."""
    from ..training.prepared import prepare_corpus

    settings = dict(budget.get("prepare", {}))
    trees = {split: getattr(args, f"{split}_trees") for split in ("train", "validation", "test")}
    settings["trees"] = {**settings.get("trees", {}), **{split: path for split, path in trees.items() if path}}
    if args.tree_column:
        settings["tree_column"] = args.tree_column
    folder = prepared_folder(args, name)
    kept_tokenizer = kept_runs_folder(args, name) / "tokenizer"
    if kept_tokenizer.is_dir() and "tokenizer" not in settings:  # the tokenizer of the kept runs' corpus
        settings["tokenizer"] = str(kept_tokenizer)
    if (folder / "manifest.json").is_file():
        from ..processing_mgsa import derived_tree_source

        manifest = json.loads((folder / "manifest.json").read_text())
        processor_kwargs = settings.get("processor_kwargs") or {}
        wanted = {"trees": {split: str(path) for split, path in settings["trees"].items()},
                  "tree_column": settings.get("tree_column"),
                  # a corpus whose derived trees came from another conversion (or rules, or plug-in) is stale
                  "derived_trees": derived_tree_source(processor_kwargs.get("tree_parser"))
                  if manifest.get("with_syntax", True) else None}
        found = {key: manifest.get(key, {} if key == "trees" else None) for key in wanted}
        if found != wanted:
            raise SystemExit(f"prepared corpus {folder} was prepared with {found}, not {wanted}: remove it, or "
                             "name another folder with --prepared.")
        print(f"[bench_quality] prepared corpus {folder} exists", flush=True)
        return folder
    if settings.get("tokenizer") == str(kept_tokenizer):
        print(f"[bench_quality] preparing with the tokenizer of the kept runs, {kept_tokenizer}", flush=True)
    return prepare_corpus(args.data, folder, **settings)


def prepared_folder(args, name: str) -> Path:
    """The budget's prepared corpus folder: `--prepared`, or `<root>/<budget>/prepared`."""
    return Path(args.prepared) if args.prepared else Path(args.root) / name / "prepared"


def train(args, name: str, budget: dict) -> None:
    """Every row × seed, `--jobs` processes at a time; finished runs are skipped, interrupted ones resume."""
    run_pending(args, record_trainings(args, pending_runs(args, name, budget)))


def pending_runs(args, name: str, budget: dict) -> list[tuple[str, Path, list[str]]]:
    """`(label, run folder, command)` of every row × seed of the budget not finished yet."""
    rows = resolve_rows(args.rows)
    if args.at_common_step:
        args.max_steps = common_step([Path(args.root) / name / row / f"seed-{seed}" for row in rows
                                      for seed in args.seeds])
        print(f"[bench_quality] every run finishes at step {args.max_steps}", flush=True)
    recipe = recipe_of(budget, args.max_steps)  # validate before starting anything
    pending = []
    for row, fields in rows.items():
        for seed in args.seeds:
            run_dir = Path(args.root) / name / row / f"seed-{seed}"
            kept = kept_runs_folder(args, name) / row / f"seed-{seed}"
            restore_run(kept, run_dir, prepared_folder(args, name), recipe, fields)
            if (run_dir / "result.json").is_file():
                trained = json.loads((run_dir / "result.json").read_text()).get("row")
                if trained != fields:
                    raise SystemExit(f"{run_dir} holds a run of {trained}, not of row {row!r} ({fields}): move it "
                                     "away to train this row.")
                print(f"[bench_quality] {name}: {row} seed {seed}: finished already", flush=True)
                continue
            command = [sys.executable, "-m", "mgsa_hf.benchmarking.quality", "run-one", "--budget", args.budget,
                       "--root", args.root, "--prepared", str(prepared_folder(args, name)),
                       "--row-json", json.dumps(fields), "--run-dir", str(run_dir), "--seeds", str(seed),
                       "--keep-run", str(kept), "--kept-runs", str(kept_runs_folder(args, name))]
            command += ["--threads", str(args.threads)] if args.threads else []
            command += ["--device", args.device] if args.device else []
            command += ["--max-steps", str(args.max_steps)] if args.max_steps else []
            pending.append((f"{name}: {row} seed {seed}", run_dir, command))
    return pending


TRAINED_BY = "trained_by.jsonl"


def record_trainings(args, pending: list[tuple[str, Path, list[str]]]) -> list[tuple[str, Path, list[str]]]:
    """Append this command, the commit and the runs it starts (`pending_runs`) to each budget's `trained_by.jsonl`
    (in its kept runs' folder), which `report` shows: a table whose seeds came from several commands names all of
    them. Returns `pending`."""
    by_folder = {}
    for label, _, command in pending:  # label: "<budget>: <row> seed <seed>"
        row, seed = label.split(": ", 1)[1].rsplit(" seed ", 1)
        runs = by_folder.setdefault(Path(command[command.index("--kept-runs") + 1]), {})
        runs.setdefault(row, []).append(int(seed))
    argv = getattr(args, "argv", sys.argv[1:])
    entry = {"command": recorded_command("scripts/bench_quality.py", argv), "commit": git_commit()}
    for folder, runs in by_folder.items():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / TRAINED_BY, "a") as log:
            log.write(json.dumps({**entry, "runs": runs}, ensure_ascii=False) + "\n")
    return pending


def trainings(folder: Path) -> list[dict]:
    """The records of [`record_trainings`] in a kept runs' folder, oldest first."""
    path = folder / TRAINED_BY
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_pending(args, pending: list[tuple[str, Path, list[str]]]) -> None:
    """Run the commands of `pending_runs`, `--jobs` processes at a time, each writing its run folder's stdout.log;
    on GPUs each process goes to the one that the fewest running processes use ([`least_busy_gpu`])."""
    pending, gpus = list(pending), job_gpus(args.device)
    env = {**package_environment(), "TOKENIZERS_PARALLELISM": "false"}
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    running, failed = [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            label, run_dir, command = pending.pop(0)
            run_dir.mkdir(parents=True, exist_ok=True)
            log, gpu = open(run_dir / "stdout.log", "a"), least_busy_gpu(gpus, [entry[-1] for entry in running])
            print(f"[bench_quality] start {label} → {run_dir}{f' on GPU {gpu}' if gpu else ''}", flush=True)
            job_env = env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu}
            running.append((label, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=job_env), log,
                            time.time(), gpu))
        time.sleep(1)
        for entry in list(running):
            label, process, log, started, _ = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            log.close()
            status = "done" if process.returncode == 0 else f"FAILED (exit {process.returncode})"
            print(f"[bench_quality] {status}: {label} in {(time.time() - started) / 60:.1f} min", flush=True)
            if process.returncode:
                failed.append(label)
    if failed:
        raise SystemExit(f"runs failed: {failed} (see their stdout.log)")


def common_step(run_dirs: list[Path]) -> int:
    """The last checkpoint step that every run has reached (its checkpoint still on disk)."""
    from ..training.prepared import checkpoint_steps

    reached = []
    for run_dir in run_dirs:
        steps = set(checkpoint_steps(run_dir))
        if not steps:
            raise SystemExit(f"{run_dir} has no checkpoint: nothing to finish at.")
        reached.append(steps)
    common = set.intersection(*reached)
    if not common:
        raise SystemExit("the runs share no checkpoint step: raise the budget's keep_checkpoints.")
    return max(common)


# ------------------------------------------------------------------------------------------ kept runs


def kept_runs_folder(args, name: str) -> Path:
    """Where a budget keeps its finished runs' records: beside its results, `benchmarks/quality-<budget>.runs/`."""
    return results_file(args, name).with_suffix(".runs")


def kept_files(prepared: Path) -> list[str]:
    """The files of a run folder that a kept run holds: what `report` reads of it (not its checkpoints)."""
    target_lang = json.loads((prepared / "manifest.json").read_text())["target_lang"]
    # `result.json` last: it marks a run folder finished, so a copy cut short leaves a run that is not
    return ["run.json", "log.jsonl", f"test.hyp.{target_lang}", "result.json"]


def keep_run(run_dir: Path, kept: Path, prepared: Path, kept_runs: Path) -> None:
    """Copy a finished run's record to `kept` (`<kept_runs>/<row>/seed-<seed>`, where a row may be a path such as
    `phrase_representation/max_attn_ta_parse`), with the prepared corpus's manifest as `prepared.json` (its corpus
    folder relative to the repository, [`portable_path`]: no machine's paths in benchmarks/); written in a
    folder beside it and renamed, so a kept run is whole or absent. The first run kept of a budget also keeps the
    corpus's tokenizer (`<kept_runs>/tokenizer`), which `prepare` reads on a checkout without the prepared corpus."""
    partial = kept.with_name(f".{kept.name}.partial")  # not a `seed-*` folder: `report` reads none
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for file in kept_files(prepared):
        shutil.copyfile(run_dir / file, partial / file)
    manifest = json.loads((prepared / "manifest.json").read_text())
    if manifest.get("data"):
        manifest["data"] = portable_path(str(manifest["data"]))
    (partial / "prepared.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)
    # the corpus's tokenizer, once per budget: `prepare` on another checkout makes the same corpus with it
    tokenizer = kept_runs / "tokenizer"
    if not tokenizer.is_dir():
        shutil.copytree(prepared / "tokenizer", partial)
        try:
            partial.rename(tokenizer)
        except OSError:  # a run finishing beside this one kept it first
            shutil.rmtree(partial)


def restore_run(kept: Path, run_dir: Path, prepared: Path, recipe, row: dict | None = None) -> bool:
    """Copy a kept run into `run_dir` when that has no finished run: the run is then finished, not trained again.

    The kept run must have trained this recipe (and `row`, when given) on a corpus prepared as `prepared` was (the
    same manifest, wherever the corpus was read from); one that did not stops the queue rather than joining a table
    it does not belong to. Returns whether a run was restored."""
    if (run_dir / "result.json").is_file() or not (kept / "result.json").is_file():
        return False

    def manifest(path: Path) -> dict:
        return {k: v for k, v in json.loads(path.read_text()).items() if k != "data"}

    trained = json.loads((kept / "run.json").read_text())
    found = {"recipe": trained["recipe"], "prepared": manifest(kept / "prepared.json")}
    wanted = {"recipe": json.loads(json.dumps(asdict(recipe))), "prepared": manifest(prepared / "manifest.json")}
    if row is not None:
        found["row"], wanted["row"] = trained["row"], row
    differing = sorted(key for key in wanted if found[key] != wanted[key])
    if differing:
        named = {"recipe": "recipe", "row": "row", "prepared": "prepared corpus"}
        raise SystemExit(f"{kept} keeps a run of another {' and '.join(named[key] for key in differing)} than this "
                         "one: remove it to train this run again.")
    run_dir.mkdir(parents=True, exist_ok=True)
    for file in kept_files(prepared):
        shutil.copyfile(kept / file, run_dir / file)
    print(f"[bench_quality] restored the finished run kept in {kept}", flush=True)
    return True


def run_one(args, name: str, budget: dict) -> None:
    """The `run-one` step: train and score one row × seed in `--run-dir`; prints its scores."""
    from ..training.prepared import PreparedCorpus, train_run

    corpus = PreparedCorpus(prepared_folder(args, name))
    result = train_run(corpus, args.run_dir, recipe_of(budget, args.max_steps), json.loads(args.row_json),
                       args.seeds[0], device=args.device, threads=args.threads)
    if args.keep_run:
        keep_run(Path(args.run_dir), Path(args.keep_run), prepared_folder(args, name), Path(args.kept_runs))
    print(json.dumps({split: {k: result[split][k] for k in ("bleu", "chrf", "distinct_fraction")}
                      for split in ("validation", "test")}), flush=True)


# ------------------------------------------------------------------------------------------ scores and the test


def read_hypotheses(path: Path) -> list[str]:
    """The lines of a one-sentence-per-line file, empty ones included (a model may translate a sentence as nothing)."""
    text = path.read_text(encoding="utf-8")
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def collect_runs(root: Path) -> list[dict]:
    """Every finished run under a budget's folder, as its `result.json` plus where it lives."""
    runs = []
    for path in sorted(root.glob("**/seed-*/result.json")):
        record = json.loads(path.read_text())
        record["name"] = str(path.parent.parent.relative_to(root))
        record["run_dir"] = str(path.parent)
        runs.append(record)
    return runs


def hypotheses_path(record: dict, target_lang: str) -> Path:
    """A run's test translations: beside its result, or (a run read back from a reported budget) the report's copy."""
    return Path(record["test_hypotheses"]) if "test_hypotheses" in record else \
        Path(record["run_dir"]) / f"test.hyp.{target_lang}"


def summarize(runs: list[dict]) -> dict:
    """Per row: BLEU, chrF per split and distinct test outputs (mean ± std over seeds); steps, steps/s, parameters."""
    summary = {}
    for name in sorted({r["name"] for r in runs}, key=lambda n: (n != BASELINE, n)):
        records = [r for r in runs if r["name"] == name]
        row = {"seeds": sorted(r["seed"] for r in records), "steps": records[0]["steps"],
               "parameters": records[0]["parameters"],
               "steps_per_second": mean_std([r["steps_per_second"] for r in records]),
               "train_minutes": mean_std([r["train_seconds"] / 60 for r in records])}
        hosts = sorted({host for r in records for host in r.get("hosts", [])})
        if hosts:  # runs written before `hosts` was recorded have none
            row["hosts"] = hosts
        for split in ("validation", "test"):
            for metric in ("bleu", "chrf", "distinct_fraction"):
                row[f"{split}_{metric}"] = mean_std([r[split][metric] for r in records])
        summary[name] = row
    return summary


def significance(runs: list[dict], references: list[str], target_lang: str) -> dict:
    """Every row against the baseline on test: the t-test over seeds (`<metric>_seeds`, over every seed each
    finished: the table's p and interval) and the paired bootstrap over test sentences (`<metric>`, over the seeds
    both finished: how far another test set could move the difference, blind to training variance)."""
    from sacrebleu.metrics import BLEU, CHRF

    def hypotheses(name):
        return {r["seed"]: read_hypotheses(hypotheses_path(r, target_lang)) for r in runs if r["name"] == name}

    def seed_scores(name, metric_name):
        return [r["test"][metric_name] for r in runs if r["name"] == name]

    baseline = hypotheses(BASELINE)
    tests = {}
    for name in sorted({r["name"] for r in runs} - {BASELINE}):
        system = hypotheses(name)
        seeds = sorted(set(baseline) & set(system))
        if not seeds:
            continue
        tests[name] = {"seeds": seeds}
        for metric_name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
            tests[name][metric_name] = paired_bootstrap([baseline[s] for s in seeds], [system[s] for s in seeds],
                                                        references, metric)
            tests[name][f"{metric_name}_seeds"] = seed_level_test(seed_scores(BASELINE, metric_name),
                                                                  seed_scores(name, metric_name))
    return tests


def git_commit() -> str | None:
    """The repository's HEAD commit, or None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def report(args, name: str, budget: dict, argv) -> dict:
    """The `report` step of a budget: its finished runs summarized and tested, written as results JSON and markdown."""
    from ..training.prepared import PreparedCorpus

    root = Path(args.root) / name
    kept_root, trained = kept_runs_folder(args, name), recipe_of(budget, args.max_steps)
    for kept in sorted(kept_root.glob("**/seed-*")):
        restore_run(kept, root / kept.relative_to(kept_root), prepared_folder(args, name), trained)
    runs = collect_runs(root)
    if not runs:
        raise SystemExit(f"no finished runs under {root}: run the train step first.")
    corpus = PreparedCorpus(prepared_folder(args, name))
    target_lang = corpus.manifest["target_lang"]
    recipe = budget["recipe"]
    model = recipe.get("model", {})
    results_path = results_file(args, name)
    first = runs[0]
    result = {
        **result_header(args, name, argv),
        "protocol": f"{model.get('d_model')}d {model.get('encoder_layers')}+{model.get('decoder_layers')} layers, "
                    f"{first['steps']} steps of ≤ {recipe.get('max_tokens')} tokens, lr {recipe.get('learning_rate')} "
                    f"after {recipe.get('warmup_steps')} warm-up steps, label smoothing "
                    f"{recipe.get('label_smoothing')}, last {recipe.get('average_last')} checkpoints averaged, beam "
                    f"{first['num_beams']}, vocabulary {corpus.manifest['vocab_size']}",
        "environment": {"device": f"{first['device']}, {first['threads']} torch thread(s) per run"
                        if first["device"] == "cpu" else first["device"],
                        "python": platform.python_version()},
        "signatures": {"bleu": first["test"]["bleu_signature"], "chrf": first["test"]["chrf_signature"],
                       "significance": SIGNIFICANCE},
        "summary": summarize(runs),
        "significance": significance(runs, corpus.references("test"), target_lang),
        "papers": {k: v for k, v in PAPER_RESULTS.items() if k in {r["name"] for r in runs}},
        "runs": [{k: v for k, v in r.items() if k != "run_dir"} for r in runs],
        "trained_by": trainings(kept_root),
    }
    result["plot"] = plot_curves(runs, results_path.with_suffix("").parent / f"quality-{name}-curves.png")
    if result["plot"]:
        result["plot"] = os.path.relpath(result["plot"], results_path.parent)
    shutil.rmtree(results_path.with_suffix(""), ignore_errors=True)
    for record in runs:
        target = kept_hypotheses(results_path, record, target_lang)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(record["run_dir"]) / f"test.hyp.{target_lang}", target)
    write_results(args, result, results_path)
    return result


def results_file(args, name: str) -> Path:
    """The budget's results JSON: `--results`, or `benchmarks/quality-<budget>.json`."""
    return Path(args.results) if args.results else REPOSITORY / "benchmarks" / f"quality-{name}.json"


def result_header(args, name: str, argv) -> dict:
    """What every results JSON opens with: the budget, the command that made it, the commit and the budget file."""
    return {"budget": name,
            "command": recorded_command("scripts/bench_quality.py", argv or sys.argv[1:]),
            "commit": git_commit(),
            "budget_file": os.path.relpath(load_budget_path(args.budget), REPOSITORY)}


def kept_hypotheses(results_path: Path, record: dict, target_lang: str) -> Path:
    """Where a report keeps a run's test translations: `<results minus .json>/<row>.seed-<seed>.test.hyp.<lang>`."""
    name = record["name"].replace("/", "-")
    return results_path.with_suffix("") / f"{name}.seed-{record['seed']}.test.hyp.{target_lang}"


def write_results(args, result: dict, results_path: Path) -> None:
    """The results JSON, and the quality section of BENCHMARKS.md with every reported budget's table."""
    results_path.parent.mkdir(parents=True, exist_ok=True)
    with_seed_tests(result)  # the p-values adjusted over the table's rows (`holm`) go into the JSON too
    results_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    markdown = Path(args.markdown) if args.markdown else REPOSITORY / "benchmarks" / "BENCHMARKS.md"
    others = sorted(p for p in results_path.parent.glob("quality-*.json") if p != results_path)
    # each table links its results file (`results_file`, relative to the markdown; not written into the JSON)
    reports = [{**report, "results_file": Path(os.path.relpath(path, markdown.parent)).as_posix()} for report, path in
               [(result, results_path), *((json.loads(p.read_text()), p) for p in others if args.markdown is None)]]
    update_markdown(markdown, sorted(reports, key=lambda report: report["budget"]))  # the same order every time
    print(render_budget(result))


# ------------------------------------------------------------------------------------------ selection budgets


# a selection's criterion → (split, metric) of the run records, and how tables name it


def reported_runs(results_path: Path, target_lang: str) -> tuple[dict, list[dict]]:
    """A reported budget's results JSON and its runs, each pointing at its test translations ([`kept_hypotheses`])."""
    if not results_path.is_file():
        raise SystemExit(f"{results_path} does not exist: report that budget first.")
    reported = json.loads(results_path.read_text())
    runs = []
    for record in reported["runs"]:
        hypotheses = kept_hypotheses(results_path, record, target_lang)
        if not hypotheses.is_file():
            raise SystemExit(f"{hypotheses} is missing: the paired test needs every run's test translations.")
        runs.append({**record, "budget": reported["budget"], "test_hypotheses": str(hypotheses)})
    return reported, runs


def select_runs(runs_by_budget: dict[str, list[dict]], by: str) -> tuple[list[dict], dict]:
    """For every row that all the budgets ran, the runs of the budget with the highest mean `by` (validation BLEU or
    chrF) over the seeds the budgets share for that row (ties: the first budget); the transformer by the same rule.
    The choice reads only the shared seeds; the table then reads every seed the chosen budget ran (seeds added to a
    chosen row later count in its test, not in its choice).

    Returns the chosen runs and, per row, each budget's mean validation and test scores over the shared seeds and
    the choice."""
    split, metric, _ = SELECTION_METRICS[by]
    budgets = list(runs_by_budget)
    names = set.intersection(*({r["name"] for r in runs} for runs in runs_by_budget.values()))
    if BASELINE not in names:
        raise SystemExit(f"every selected budget needs `{BASELINE}` runs.")
    chosen, selection = [], {}
    for name in sorted(names, key=lambda n: (n != BASELINE, n)):
        # seed → this row's run, per budget: for the choice (shared seeds), the test between budgets and the table
        per_seed = {budget: {r["seed"]: r for r in runs if r["name"] == name}
                    for budget, runs in runs_by_budget.items()}
        seeds = sorted(set.intersection(*(set(runs) for runs in per_seed.values())))
        shared = {budget: [per_seed[budget][seed] for seed in seeds] for budget in budgets}
        scores = {budget: {"validation": round(float(np.mean([r[split][metric] for r in shared[budget]])), 2),
                           "test": round(float(np.mean([r["test"][metric] for r in shared[budget]])), 2)}
                  for budget in budgets}
        best = max(budgets, key=lambda budget: scores[budget]["validation"])  # max keeps the first of equals
        selection[name] = {"seeds": seeds, "by": by, "scores": scores, "chosen": best}
        if len(budgets) == 2:  # how sure the choice is: the t-test over the shared seeds, the other against the chosen
            other = next(budget for budget in budgets if budget != best)
            selection[name]["against_the_other"] = {
                part: seed_level_test([r[part][metric] for r in shared[best]],
                                      [r[part][metric] for r in shared[other]])["p_value"]
                for part in (split, "test")}
        chosen += list(per_seed[best].values())
    return chosen, selection


def recipe_differences(budgets: dict[str, dict]) -> dict[str, dict]:
    """Budget name → the recipe fields (`model.<field>`: the model's) the budgets differ in: what a selection picks."""

    def flat(recipe: dict) -> dict:
        model = {f"model.{key}": value for key, value in recipe.get("model", {}).items()}
        return {**{key: value for key, value in recipe.items() if key != "model"}, **model}

    recipes = {name: flat(budget.get("recipe", {})) for name, budget in budgets.items()}
    fields = sorted({key for recipe in recipes.values() for key in recipe})
    differing = [key for key in fields if len({json.dumps(recipe.get(key)) for recipe in recipes.values()}) > 1]
    return {name: {key: recipes[name].get(key) for key in differing} for name in budgets}


def selection_sources(name: str, budget: dict) -> dict[str, tuple[str, dict]]:
    """Name → (the budget as `select.from` names it, the budget) of every budget a selection budget chooses among;
    checks the selection's criterion too, before anything trains."""
    by = budget["select"].get("by", "validation_bleu")
    if by not in SELECTION_METRICS:
        raise SystemExit(f"budget {name}: `select.by` must be one of {sorted(SELECTION_METRICS)}, not {by!r}.")
    sources = {}
    for spec in budget["select"]["from"]:
        source, source_budget = load_budget(spec)
        if "select" in source_budget:
            raise SystemExit(f"budget {name}: a selection chooses among budgets that train, and {source} is none.")
        sources[source] = (spec, source_budget)
    return sources


def source_arguments(args, name: str, sources: dict[str, tuple[str, dict]]) -> dict[str, argparse.Namespace]:
    """The arguments each budget of a selection runs with: its own budget, the selection's prepared corpus when they
    all prepare alike (`--prepared`, or `<root>/<selection>/prepared`; otherwise each its own), and its results JSON
    beside the selection's, where `report_selection` reads it."""
    shared = len({json.dumps(budget.get("prepare", {}), sort_keys=True) for _, budget in sources.values()}) == 1
    results_folder = results_file(args, name).parent
    return {source: argparse.Namespace(**{
        **vars(args), "budget": spec, "results": str(results_folder / f"quality-{source}.json"),
        "prepared": str(prepared_folder(args, name)) if shared else None}) for source, (spec, _) in sources.items()}


def run_selection(args, name: str, budget: dict, argv) -> dict | None:
    """The steps of a selection budget. `prepare` and `train` run those steps for every budget it selects from (one
    prepared corpus when their `prepare` settings agree; the runs of all of them in one queue, `--jobs` at a time);
    `all` does both, reports each of those budgets, then the selection; `report` reports the selection from their
    reported results (`benchmarks/quality-<budget>.json` and the test translations beside them)."""
    sources = selection_sources(name, budget)
    arguments = source_arguments(args, name, sources)
    if args.step in ("prepare", "all"):
        for source, (_, source_budget) in sources.items():
            prepare(arguments[source], source, source_budget)
    if args.step in ("train", "all"):  # every source's runs listed (and its recipe checked) before any starts
        pending = [run for source, (_, source_budget) in sources.items()
                   for run in pending_runs(arguments[source], source, source_budget)]
        run_pending(args, record_trainings(args, pending))
    if args.step == "all":
        for source, (_, source_budget) in sources.items():
            report(arguments[source], source, source_budget, argv)
    if args.step in ("report", "all"):
        return report_selection(args, name, budget, argv)
    return None


def report_selection(args, name: str, budget: dict, argv) -> dict:
    """`report` of a selection budget: the chosen runs of its budgets' reported results, tested against the chosen
    transformer, written as a budget's results are (JSON, BENCHMARKS.md table) with the selection beside them."""
    budgets = {source: source_budget for source, (_, source_budget) in selection_sources(name, budget).items()}
    sources, by = list(budgets), budget["select"].get("by", "validation_bleu")
    results_path = results_file(args, name)
    target_lang = budgets[sources[0]].get("prepare", {}).get("target_lang", "de")
    reported, runs_by_budget = {}, {}
    for source in sources:
        reported[source], runs_by_budget[source] = reported_runs(
            results_path.parent / f"quality-{source}.json", target_lang)
    signatures = {json.dumps(report["signatures"], sort_keys=True) for report in reported.values()}
    if len(signatures) > 1:
        raise SystemExit(f"budgets {sources} were scored with different metrics: {sorted(signatures)}.")
    runs, selection = select_runs(runs_by_budget, by)
    settings = recipe_differences(budgets)
    for row in selection.values():
        row["recipe"] = settings[row["chosen"]]
    from ..tokenization_utils import read_lines
    from ..training.data import find_split_file
    from ..training.prepared import SPLITS

    # the references the budgets' prepared corpus kept: the first `max_samples` of the split, or all of it
    max_samples = budgets[sources[0]].get("prepare", {}).get("max_samples")
    references = list(read_lines(find_split_file(Path(args.data), SPLITS["test"], target_lang), max_samples))
    first = reported[sources[0]]
    described = [f"`{source}` ({', '.join(f'{k} {v}' for k, v in settings[source].items())})" for source in sources]
    choices = described[0] if len(described) == 1 else f"{', '.join(described[:-1])} and {described[-1]}"
    result = {
        **result_header(args, name, argv),
        "protocol": f"per row, whichever of {choices} has the higher mean {SELECTION_METRICS[by][2]} over their "
                    f"shared seeds; otherwise {first['protocol']}",
        "environment": first["environment"],
        "signatures": {**first["signatures"], "significance": SIGNIFICANCE},
        "sources": {source: {"commit": report.get("commit"), "command": report["command"]}
                    for source, report in reported.items()},
        "selection": selection,
        "summary": summarize(runs),
        "significance": significance(runs, references, target_lang),
        "papers": {k: v for k, v in PAPER_RESULTS.items() if k in {r["name"] for r in runs}},
        "runs": [{**{k: v for k, v in r.items() if k != "test_hypotheses"},
                  "test_hypotheses": os.path.relpath(r["test_hypotheses"], results_path.parent)} for r in runs],
        "plot": None,
    }
    write_results(args, result, results_path)
    return result


def load_budget_path(spec: str) -> Path:
    """The budget file that `--budget` names (a JSON file, or a name in `configs/quality/`)."""
    return Path(spec) if spec.endswith(".json") else REPOSITORY / "configs" / "quality" / f"{spec}.json"


def main(argv=None) -> dict | None:
    """Run the step of `scripts/bench_quality.py` the command line names; returns the report where it writes one."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `record_trainings` writes
    name, budget = load_budget(args.budget)
    if args.step == "run-one":
        return run_one(args, name, budget)
    if "select" in budget:
        return run_selection(args, name, budget, argv)
    if args.step in ("prepare", "all"):
        prepare(args, name, budget)
    if args.step in ("train", "all"):
        train(args, name, budget)
    if args.step in ("report", "all"):
        return report(args, name, budget, argv)
    return None


if __name__ == "__main__":  # the `run-one` processes of `run_pending`
    main()
