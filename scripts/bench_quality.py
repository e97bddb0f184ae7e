#!/usr/bin/env python
"""Translation quality of every encoder type under one protocol, with significance against the plain Transformer.

Multi30k en→de, one joint tokenizer trained once per budget and shared by every run, the same training config for
every variant (only `model.encoder_type` and that variant's own fields differ), `--seeds` seeds each. Every run
is `mgsa_hf.training.train`: it writes its model, `validation.hyp.de`, `test.hyp.de` and `results.json` under
`<output-root>/<budget>/<variant>/seed-<seed>/`. The script then reports sacreBLEU BLEU and chrF (with signatures)
on validation and test 2016 as mean ± std over seeds, and a paired bootstrap test (1000 resamples) of each variant
against `transformer` on test 2016.

    python scripts/bench_quality.py --budget cpu                  # configs/train/quality_cpu.yaml, 2 CPU cores
    python scripts/bench_quality.py --budget full --seeds 1 2 3   # configs/train/quality_full.yaml, a GPU
    python scripts/bench_quality.py --dry-run --output-root /tmp/q  # the tiny config: seconds, checks the plumbing

Results go to `benchmarks/quality-<budget>.json` (with the test hypotheses under `benchmarks/quality-<budget>/`)
and to the "Translation quality" section of `benchmarks/BENCHMARKS.md`. A finished run (same config, `results.json`
present) is reused, so an interrupted benchmark continues where it stopped; `--force` trains again.
"""

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np


REPO = Path(__file__).resolve().parents[1]
BUDGETS = {
    "cpu": REPO / "configs" / "train" / "quality_cpu.yaml",
    "full": REPO / "configs" / "train" / "quality_full.yaml",
    "dry-run": REPO / "configs" / "train" / "tiny.yaml",
}
BASELINE = "transformer"
DEFAULT_VARIANTS = ["transformer", "phrase_memory", "phrase_representation", "hybrid", "rhe"]
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacreBLEU's default SACREBLEU_SEED
SECTION = "## Translation quality"

# What the papers report for their own models (Transformer-base on WMT En→De, 4.5M sentence pairs): BLEU of the
# baseline and of the variant row closest to this package's default config, and training speed where given.
PAPER_RESULTS = {
    "phrase_memory": {
        "paper": "MG-SA (Hao et al., EMNLP 2019), WMT14 En→De, Table 3",
        "rows": [
            {"row": "n-gram phrases, SANs, bottom layer (this package's default)", "baseline_bleu": 27.31,
             "bleu": 27.83, "delta": 0.52, "speed": "1.28 → 1.28 steps/s"},
            {"row": "syntactic phrases + tag loss + ON-LSTM (the paper's best)", "baseline_bleu": 27.31,
             "bleu": 28.28, "delta": 0.97, "speed": "1.28 → 1.19 steps/s"},
        ],
    },
    "phrase_representation": {
        "paper": "PR (ACL 2020), WMT14 En→De, Table 2",
        "rows": [{"row": "Max + Attn + TA (this package's default)", "baseline_bleu": 27.38, "bleu": 28.67,
                  "delta": 1.29, "speed": "1.75× training time, 1.53× decoding time"}],
    },
    "hybrid": {
        "paper": "Hybrid local/global (Xu et al., ACL 2019), WMT14 En→De (Table 2 says WMT17), Tables 1-2",
        "rows": [{"row": "HYBRID (Gate), m = 1, lowest two layers (this package's default)", "baseline_bleu": 27.67,
                  "bleu": 28.31, "delta": 0.64, "speed": "not reported (+0.0M parameters)"}],
    },
    "rhe": {
        "paper": "RHE, WMT14 En→De, Table 1",
        "rows": [{"row": "LPEA + RHE (this package's default)", "baseline_bleu": 27.31, "bleu": 28.27,
                  "delta": 0.96, "speed": "1.21 → 1.17 steps/s"}],
    },
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=["cpu", "full"], default="cpu",
                        help="cpu: a short run for 2 CPU cores; full: the real comparison, for a GPU")
    parser.add_argument("--dry-run", action="store_true",
                        help="use the tiny test config instead of the budget's (seconds; writes no benchmark files "
                             "unless --results/--markdown are given)")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, metavar="VARIANT",
                        help="encoder types (their default config) or JSON files of MgsaConfig fields such as "
                             "configs/rhe/dea_rhe.json; `transformer` is always run as the reference")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="training seeds (every variant runs each)")
    parser.add_argument("--output-root", default="runs/bench-quality", help="folder of the runs and the tokenizer")
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="training config overrides applied to every run, e.g. data=/path/to/multi30k")
    parser.add_argument("--results", help="results JSON (default: benchmarks/quality-<budget>.json)")
    parser.add_argument("--markdown", help="markdown file whose quality section is rewritten "
                                           "(default: benchmarks/BENCHMARKS.md)")
    parser.add_argument("--force", action="store_true", help="train again even where a finished run exists")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the markdown section from the existing benchmarks/quality-*.json files")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice); on a CPU shared "
                                                    "with other jobs, 1 thread is often faster than 2")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------- the runs


def variant_fields(spec: str) -> tuple[str, dict]:
    """`(name, MgsaConfig fields)` of a variant given as an encoder type or a JSON file of config fields."""
    from mgsa_hf.configuration_mgsa import ENCODER_TYPES

    if spec in ENCODER_TYPES:
        return spec, {"encoder_type": spec}
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"variant {spec!r} is neither an encoder type {sorted(ENCODER_TYPES)} nor a JSON file.")
    fields = json.loads(path.read_text())
    if fields.get("encoder_type") not in ENCODER_TYPES:
        raise ValueError(f"{path} must set `encoder_type` to one of {sorted(ENCODER_TYPES)}.")
    name = fields["encoder_type"] if path.stem in ("baseline", fields["encoder_type"]) else \
        f"{fields['encoder_type']}/{path.stem}"
    return name, fields


def run_config(base, name: str, fields: dict, seed: int, tokenizer: Path, root: Path):
    """The budget's config with only the variant's fields and the seed changed."""
    import copy

    shared = sorted(set(fields) & set(base.model) - {"encoder_type"})
    if shared:
        raise ValueError(f"variant {name!r} changes {shared}, which the budget config fixes for every variant.")
    config = copy.deepcopy(base)
    config.model.update(fields)
    config.training["seed"] = seed
    config.tokenizer = str(tokenizer)
    config.output_dir = str(root / name / f"seed-{seed}")
    return config


def train_tokenizer(config, folder: Path) -> Path:
    """The joint tokenizer of every run of a budget, trained once on the training split."""
    from mgsa_hf.data import load_parallel_corpus
    from mgsa_hf.tokenization_utils import train_joint_tokenizer

    if (folder / "tokenizer_config.json").is_file():
        return folder
    train_split = load_parallel_corpus(config.data, config.source_lang, config.target_lang,
                                       {"train": config.splits["train"]}, hub_config=config.hub_config)["train"]
    if config.max_train_samples is not None:
        train_split = train_split.select(range(min(config.max_train_samples, len(train_split))))
    with tempfile.TemporaryDirectory() as text_dir:
        files = []
        for lang in (config.source_lang, config.target_lang):
            files.append(Path(text_dir) / f"train.{lang}")
            files[-1].write_text("\n".join(pair[lang] for pair in train_split["translation"]) + "\n", encoding="utf-8")
        train_joint_tokenizer(*files, folder, vocab_size=config.vocab_size)
    return folder


@contextmanager
def file_backed_corpus(cache_dir: Path):
    """Make the corpus the training recipe loads file-backed, so that `datasets` caches the parsed splits on disk
    and only the first run of a budget parses (an in-memory corpus is parsed again by every run)."""
    from datasets import load_from_disk

    import mgsa_hf.data

    load = mgsa_hf.data.load_parallel_corpus

    def load_cached(source, src_lang, tgt_lang, splits, hub_config=None):
        key = json.dumps([str(Path(source).resolve()) if Path(source).exists() else str(source), src_lang,
                          tgt_lang, splits, hub_config])
        folder = cache_dir / hashlib.sha256(key.encode()).hexdigest()[:16]
        if not (folder / "dataset_dict.json").is_file():
            load(source, src_lang, tgt_lang, splits, hub_config=hub_config).save_to_disk(str(folder))
        return load_from_disk(str(folder))

    with mock.patch.object(mgsa_hf.data, "load_parallel_corpus", load_cached):
        yield


def config_record(config) -> dict:
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(config).items() if k not in ("output_dir", "examples")}


def run_one(config, force: bool) -> dict:
    """Train one variant/seed (or reuse its finished run) and return its record."""
    from mgsa_hf.training import train

    output_dir = Path(config.output_dir)
    record_path = output_dir / "bench_run.json"
    wanted = config_record(config)
    if not force and record_path.is_file() and (output_dir / "results.json").is_file():
        record = json.loads(record_path.read_text())
        if record.get("config") == json.loads(json.dumps(wanted)):
            print(f"[bench_quality] reusing {output_dir}", flush=True)
            return record
    if output_dir.exists():
        shutil.rmtree(output_dir)
    print(f"[bench_quality] training {config.model['encoder_type']} → {output_dir}", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        results, _ = train(config)
    except Exception as error:  # one failing variant must not lose the others' results
        traceback.print_exc()
        return {"config": wanted, "output_dir": str(output_dir), "error": f"{type(error).__name__}: {error}"}
    record = {
        "config": wanted,
        "output_dir": str(output_dir),
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "results": results,
    }
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


# ------------------------------------------------------------------------------------------ scores and the test


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def paired_bootstrap(baseline: list[list[str]], system: list[list[str]], references: list[str], metric,
                     n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """
    Paired bootstrap resampling (Koehn, 2004) of a system against the baseline, both given as the hypotheses of one
    or more training seeds (paired by position). Each resample draws test sentences with replacement, the same for
    every seed and both systems, and compares the seed-averaged corpus scores.

    With one seed this is sacreBLEU's `paired_bs` test (`PairedTest(..., test_type="bs")`, same resamples, same
    statistic: p = share of resampled |differences|, centred on their mean, above the observed one), except that a
    difference of exactly zero gives p = 1 rather than 1 / (n_samples + 1).

    Returns: `delta` (system − baseline, seed-averaged score), `p_value`, and the 95% bootstrap interval of `delta`.
    """
    if len(baseline) != len(system) or not baseline:
        raise ValueError(f"need the same number (≥ 1) of seeds for both systems, got {len(baseline)} and "
                         f"{len(system)}.")
    for hypotheses in (*baseline, *system):
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    refs = [references]
    indices = np.random.default_rng(seed).choice(len(references), size=(n_samples, len(references)), replace=True)

    def scores(hypothesis_sets):
        """Seed-averaged corpus score on the full test set and on every resample."""
        full, resampled = [], []
        for hypotheses in hypothesis_sets:
            stats = np.array(metric._extract_corpus_statistics(hypotheses, refs), dtype="float32")
            full.append(metric._compute_score_from_stats(stats.sum(0)).score)
            resampled.append([metric._compute_score_from_stats(row.sum(0)).score for row in stats[indices]])
        return float(np.mean(full)), np.mean(resampled, axis=0)

    base_score, base_samples = scores(baseline)
    sys_score, sys_samples = scores(system)
    observed = abs(sys_score - base_score)
    differences = np.abs(sys_samples - base_samples)
    centred = differences - differences.mean()
    p_value = (np.sum(centred >= observed) + 1) / (n_samples + 1) if observed == 0 else \
        (np.sum(centred > observed) + 1) / (n_samples + 1)
    signed = sys_samples - base_samples
    return {
        "baseline": round(base_score, 2),
        "system": round(sys_score, 2),
        "delta": round(sys_score - base_score, 2),
        "delta_95ci": [round(float(np.percentile(signed, 2.5)), 2), round(float(np.percentile(signed, 97.5)), 2)],
        "p_value": round(float(p_value), 4),
    }


def mean_std(values: list[float]) -> dict:
    values = np.asarray(values, dtype=float)
    return {"mean": round(float(values.mean()), 2),
            "std": round(float(values.std(ddof=1)), 2) if len(values) > 1 else None,
            "values": [round(float(v), 2) for v in values]}


def summarize(runs: dict[str, list[dict]], target_lang: str) -> dict:
    """Per variant: BLEU and chrF on each split, mean ± std over seeds, the number of distinct test translations (a
    model that does not use its source yet writes the same sentence for every input), and training cost."""
    summary = {}
    for name, records in runs.items():
        done = [r for r in records if "results" in r]
        row = {"seeds": len(done), "failed": [r["error"] for r in records if "error" in r]}
        if done:
            for split in ("validation", "test"):
                for metric in ("bleu", "chrf"):
                    values = [s[metric] for r in done for s in r["results"]["scores"] if s["split"] == split]
                    if values:
                        row[f"{split}_{metric}"] = mean_std(values)
            row["distinct_test_outputs"] = mean_std(
                [len(set(read_lines(Path(r["output_dir"]) / f"test.hyp.{target_lang}"))) for r in done])
            row["train_loss"] = mean_std([r["results"]["train_loss"] for r in done])
            row["steps"] = done[0]["results"]["global_step"]
            row["wall_minutes"] = mean_std([r["wall_seconds"] / 60 for r in done])
        summary[name] = row
    return summary


def significance(runs: dict[str, list[dict]], references: list[str], target_lang: str) -> dict:
    """Paired bootstrap of every variant against the baseline on test, over the seeds both finished."""
    from sacrebleu.metrics import BLEU, CHRF

    def hypotheses(records):
        return {r["config"]["training"]["seed"]: read_lines(Path(r["output_dir"]) / f"test.hyp.{target_lang}")
                for r in records if "results" in r}

    if BASELINE not in runs:
        return {}
    baseline = hypotheses(runs[BASELINE])
    tests = {}
    for name, records in runs.items():
        system = hypotheses(records)
        seeds = sorted(set(baseline) & set(system))
        if name == BASELINE or not seeds:
            continue
        tests[name] = {"seeds": seeds}
        for metric_name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
            tests[name][metric_name] = paired_bootstrap([baseline[s] for s in seeds], [system[s] for s in seeds],
                                                        references, metric)
    return tests


# -------------------------------------------------------------------------------------------------- reporting


def _cell(stats: dict | None) -> str:
    if not stats:
        return "–"
    return f"{stats['mean']:.2f}" + (f" ± {stats['std']:.2f}" if stats["std"] is not None else "")


def silent_variants(summary: dict) -> list[str]:
    """Variants that do not use their source yet: at most one different test translation per ten inputs."""
    return [name for name, row in summary.items() if row["seeds"] and row["distinct_test_outputs"]["mean"] <= 100]


def _verdict(test: dict) -> str:
    if test["p_value"] >= 0.05:
        return "no significant difference"
    return "better (p < 0.05)" if test["delta"] > 0 else "worse (p < 0.05)"


def render_budget(report: dict) -> str:
    """The markdown table of one budget."""
    summary, tests = report["summary"], report["significance"]
    lines = [
        f"### Budget `{report['budget']}`",
        "",
        f"Command: `{report['command']}` (at commit `{(report.get('commit') or 'unknown')[:10]}`)  ",
        f"Config: `{report['config_file']}` ({report['protocol']}); seeds {report['seeds']}; "
        f"{report['environment']['device']}.",
        "",
        "| variant | seeds | steps | valid BLEU | valid chrF | test BLEU | test chrF | Δ test BLEU [95% CI] | "
        "p (BLEU) | Δ test chrF | p (chrF) | distinct test outputs | train loss | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in summary.items():
        if not row["seeds"]:
            lines.append(f"| `{name}` | 0 | – | failed: {'; '.join(row['failed'])[:200]} |" + " |" * 11)
            continue
        test = tests.get(name)
        if test:
            bleu, chrf = test["bleu"], test["chrf"]
            delta = (f"{bleu['delta']:+.2f} [{bleu['delta_95ci'][0]:+.2f}, {bleu['delta_95ci'][1]:+.2f}] | "
                     f"{bleu['p_value']:.3f} | {chrf['delta']:+.2f} | {chrf['p_value']:.3f}")
        else:
            delta = "– | – | – | –"
        lines.append(
            f"| `{name}` | {row['seeds']} | {row['steps']} | {_cell(row.get('validation_bleu'))} | "
            f"{_cell(row.get('validation_chrf'))} | {_cell(row.get('test_bleu'))} | {_cell(row.get('test_chrf'))} | "
            f"{delta} | {row['distinct_test_outputs']['mean']:.0f} | {_cell(row['train_loss'])} | "
            f"{_cell(row['wall_minutes'])} |"
        )
    lines += ["", f"BLEU: `{report['signatures']['bleu']}`  ", f"chrF: `{report['signatures']['chrf']}`  ",
              f"Significance: {report['signatures']['significance']}", ""]
    verdicts = [f"`{name}` {_verdict(test['bleu'])} (Δ BLEU {test['bleu']['delta']:+.2f}, p = "
                f"{test['bleu']['p_value']:.3f})" for name, test in tests.items()]
    silent = silent_variants(summary)
    if silent:
        names = ", ".join(f"`{name}`" for name in silent)
        verdicts.append(f"{names} write one sentence for (nearly) every input, so a verdict involving them compares "
                        "fixed sentences, not translations (see the note below)")
    if verdicts:
        lines += ["Against `transformer` on test 2016: " + "; ".join(verdicts) + ".", ""]
    return "\n".join(lines)


def render_papers() -> str:
    lines = ["### The papers' own figures (Transformer-base, WMT En→De; for reference, not comparable in size)", "",
             "| variant | paper | row | baseline BLEU | BLEU | Δ BLEU | training speed |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, paper in PAPER_RESULTS.items():
        for row in paper["rows"]:
            lines.append(f"| `{name}` | {paper['paper']} | {row['row']} | {row['baseline_bleu']:.2f} | "
                         f"{row['bleu']:.2f} | {row['delta']:+.2f} | {row['speed']} |")
    return "\n".join(lines) + "\n"


def cpu_budget_note(report: dict) -> str:
    """What the `cpu` budget can and cannot show, with the run's own figures."""
    config = report["runs"][BASELINE][0]["config"]
    steps, batch = config["training"]["max_steps"], config["training"]["per_device_train_batch_size"]
    records = [r for records in report["runs"].values() for r in records if "results" in r]
    minutes = [r["wall_seconds"] / 60 for r in records]
    share = np.mean([r["cpu_seconds"] / r["wall_seconds"] for r in records])
    rows = {name: row for name, row in report["summary"].items() if row["seeds"]}
    silent = {name: rows[name] for name in silent_variants(rows)}
    note = [
        f"**What the CPU budget can and cannot show.** This run trained every variant {steps} steps of {batch} "
        f"sentence pairs ({steps * batch / 29000:.2f} epochs of Multi30k), one seed, greedy decoding. On the machine "
        f"it ran on (2 cores shared with other jobs; the benchmark at low priority with one torch thread got "
        f"{share:.2f} of a core on average) a variant took {min(minutes):.0f}-{max(minutes):.0f} minutes."
    ]
    if silent:
        names = ", ".join(f"`{name}`" for name in silent)
        most = max(row["distinct_test_outputs"]["mean"] for row in silent.values())
        note.append(
            f"At this length {names} do not use the source yet: each writes at most {most:.0f} different "
            "sentence(s) for the 1000 test sentences (the first phase of training, where the decoder is a "
            "target-side language model), so their BLEU and chrF score that sentence against the references and "
            "say nothing about translation quality; which sentence it is varies from run to run."
        )
        if len(silent) < len(rows):
            started = ", ".join(f"`{name}`" for name in rows if name not in silent)
            note.append(
                f"{started} had started to translate by then. A difference against a silent baseline measures how "
                "soon a variant leaves that phase, not what it converges to; it is a real property of these runs "
                "(one seed each), not evidence for the papers' gains."
            )
    else:
        test_bleu = [row["test_bleu"]["mean"] for row in rows.values()]
        note.append(
            f"The models are far from converged (test BLEU {min(test_bleu):.1f}-{max(test_bleu):.1f}): the scores say "
            "how fast each architecture starts to learn, not what it converges to."
        )
    note.append(
        "The run shows that every variant trains end to end on real parses without diverging and would catch a "
        "variant that is badly broken. It cannot show the papers' gains (+0.5 to +1.3 BLEU for Transformer-base "
        "models trained to convergence on 4.5M WMT sentence pairs): with one seed there is no estimate of the "
        "seed-to-seed spread, and the bootstrap p-values measure only the test-set sampling noise of these "
        "particular runs. The issue's reference point, a plain Marian model at BLEU 7.5 on test 2016, had seen "
        f"115k sentence pairs, {115_000 / (steps * batch):.1f} times what this budget trains on; on one core at the "
        f"rate measured here (about {steps * batch / (np.median(minutes) * 60):.0f} pairs/s) that is about "
        f"{115_000 / (steps * batch) * np.median(minutes):.0f} minutes per variant. The `full` budget (several seeds, "
        "converged models, beam search, checkpoint averaging, on a GPU) is the comparison to draw conclusions from."
    )
    return " ".join(note) + "\n"


def render_section(reports: list[dict]) -> str:
    parts = [SECTION, "",
             "`scripts/bench_quality.py`: Multi30k en→de, one joint tokenizer per budget, the same training config "
             "for every variant (only `encoder_type` and its defaults differ), sacreBLEU BLEU/chrF on validation "
             "(val, 1014 sentences) and test 2016 (flickr, 1000 sentences) from detokenized output against the raw "
             "references, mean ± std over seeds, and the paired bootstrap test (1000 resamples) of each variant "
             "against `transformer` on test 2016 (Δ = variant − transformer).", ""]
    for report in reports:
        parts.append(render_budget(report))
        if report["budget"] == "cpu":
            parts.append(cpu_budget_note(report))
    parts.append(render_papers())
    return "\n".join(parts)


def replace_section(text: str, section: str) -> str:
    """`text` with its "## Translation quality" section (up to the next `## ` heading) replaced by `section`,
    or with `section` appended; every other section is kept as it is."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        return text.rstrip("\n") + ("\n\n" if text.strip() else "") + section.rstrip("\n") + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    rest = "\n".join(lines[end:])
    return "\n".join(lines[:start]) + ("\n" if start else "") + section.rstrip("\n") + "\n" + \
        ("\n" + rest if rest.strip() else "")


def update_markdown(path: Path, reports: list[dict]) -> None:
    reports = sorted(reports, key=lambda report: ["cpu", "full", "dry-run"].index(report["budget"]))
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, render_section(reports)))


def write_results(report: dict, path: Path, target_lang: str) -> None:
    """The report as JSON, and every run's test hypotheses next to it (`<path without .json>/`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    for name, records in report["runs"].items():
        for record in records:
            source = Path(record["output_dir"]) / f"test.hyp.{target_lang}"
            if source.is_file():
                seed = record["config"]["training"]["seed"]
                target = path.with_suffix("") / f"{name.replace('/', '-')}.seed-{seed}.test.hyp.{target_lang}"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


def signatures(runs: dict[str, list[dict]]) -> dict:
    """sacreBLEU's signatures of the scores, as the runs recorded them."""
    for records in runs.values():
        for record in records:
            for score in record.get("results", {}).get("scores", []):
                return {"bleu": score["bleu_signature"], "chrf": score["chrf_signature"]}
    return {"bleu": None, "chrf": None}


def git_commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment() -> dict:
    import sacrebleu
    import torch
    import transformers

    if torch.cuda.is_available():
        device = f"GPU: {torch.cuda.get_device_name(0)}"
    else:
        device = f"CPU: {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), {platform.machine()}"
    return {"device": device, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "sacrebleu": sacrebleu.__version__}


# ------------------------------------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    from mgsa_hf.training import load_train_config

    args = parse_args(argv)
    if args.report_only:
        markdown = Path(args.markdown) if args.markdown else REPO / "benchmarks" / "BENCHMARKS.md"
        found = [REPO / "benchmarks" / f"quality-{b}.json" for b in ("cpu", "full")]
        update_markdown(markdown, [json.loads(p.read_text()) for p in found if p.is_file()])
        return {}
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    budget = "dry-run" if args.dry_run else args.budget
    config_file = BUDGETS[budget]
    if any(o.split("=")[0].strip() in ("model.encoder_type", "training.seed", "output_dir", "tokenizer")
           for o in args.overrides):
        raise SystemExit("--set may not change model.encoder_type, training.seed, output_dir or tokenizer: "
                         "the benchmark sets them per run.")
    base = load_train_config(config_file, args.overrides)
    variants = dict(variant_fields(spec) for spec in args.variants)
    variants = {BASELINE: {"encoder_type": BASELINE}, **variants}
    root = Path(args.output_root) / budget
    root.mkdir(parents=True, exist_ok=True)

    with file_backed_corpus(root / "corpus"):
        tokenizer = train_tokenizer(base, root / "tokenizer")
        runs = {name: [run_one(run_config(base, name, fields, seed, tokenizer, root), args.force)
                       for seed in args.seeds]
                for name, fields in variants.items()}

    from mgsa_hf.data import load_parallel_corpus

    test = load_parallel_corpus(base.data, base.source_lang, base.target_lang, {"test": base.splits["test"]},
                                hub_config=base.hub_config)["test"]
    references = [pair[base.target_lang] for pair in test["translation"]][: base.max_test_samples]
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO)
                                                            if argv is None else "scripts/bench_quality.py",
                                                            *(sys.argv[1:] if argv is None else argv)])
    report = {
        "budget": budget,
        "command": command,
        "commit": git_commit(),
        "config_file": os.path.relpath(config_file, REPO),
        "protocol": f"{base.model.get('d_model')}d {base.model.get('encoder_layers')}+"
                    f"{base.model.get('decoder_layers')} layers, {base.training.get('max_steps')} steps of "
                    f"{base.training.get('per_device_train_batch_size')} sentences, vocabulary {base.vocab_size}, "
                    f"beam {base.training.get('generation_num_beams', 1)}",
        "overrides": args.overrides,
        "seeds": args.seeds,
        "environment": environment(),
        "signatures": {
            **signatures(runs),
            "significance": f"paired bootstrap, {BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, two-sided",
        },
        "summary": summarize(runs, base.target_lang),
        "significance": significance(runs, references, base.target_lang),
        "papers": PAPER_RESULTS,
        "runs": {name: records for name, records in runs.items()},
    }
    results_path = Path(args.results) if args.results else \
        (None if args.dry_run else REPO / "benchmarks" / f"quality-{budget}.json")
    if results_path is not None:
        write_results(report, results_path, base.target_lang)
    markdown = Path(args.markdown) if args.markdown else \
        (None if args.dry_run else REPO / "benchmarks" / "BENCHMARKS.md")
    if markdown is not None:
        others = [REPO / "benchmarks" / f"quality-{b}.json" for b in ("cpu", "full") if b != budget]
        update_markdown(markdown, [report, *(json.loads(p.read_text()) for p in others if p.is_file())])
    print(render_budget(report))
    return report


if __name__ == "__main__":
    main()
