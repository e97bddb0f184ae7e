"""The quality benchmark's report: the markdown tables of each budget (mean ± seed std, the t-test over seeds of each
row against `transformer`, the paired bootstrap's test-set interval), the papers' own figures, and the validation
curves."""

import json
from pathlib import Path

import numpy as np

from ..evaluation import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, holm_adjusted, seed_level_test
from .rows import BASELINE


SECTION = "## Translation quality"
SIGNIFICANCE = ("Student's t-test over seed-level test scores, two-sided (the null: the same recipe, another seed), "
                "with Holm's adjustment over the rows tested against `transformer` (the verdicts: adjusted p < 0.05, "
                "the chance of calling any row different when none is stays under 5%); "
                f"test-set interval: paired bootstrap, {BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, "
                "seed-averaged")

# What the papers report for their own models (Transformer-base on WMT En→De, 4.5M sentence pairs): the row, the
# baseline's and the row's BLEU, parameters (M) and training speed where given.
PAPER_RESULTS = {
    "phrase_memory": {"paper": "MG-SA (Hao et al., EMNLP 2019), Tables 3-4", "row": "syntactic + tag + ON-LSTM",
                      "baseline_bleu": 27.31, "bleu": 28.28, "params": "88.0 → 89.9",
                      "speed": "1.28 → 1.19 steps/s"},
    "phrase_memory/syntactic_tag_on_lstm": {"paper": "MG-SA, Table 3", "row": "syntactic + tag + ON-LSTM",
                                            "baseline_bleu": 27.31, "bleu": 28.28, "params": "88.0 → 89.9",
                                            "speed": "1.28 → 1.19 steps/s"},
    "phrase_representation": {"paper": "PR (ACL 2020), Table 2", "row": "+Max+Attn+TA", "baseline_bleu": 27.38,
                              "bleu": 28.67, "params": "88.1 → 173.0", "speed": "1.75× training time"},
    "phrase_representation/max_attn_ta_parse": {"paper": "PR, Table 2", "row": "+Max+Attn+TA+Parsing Phrase",
                                                 "baseline_bleu": 27.38, "bleu": 28.76, "params": "88.1 → 173.0",
                                                 "speed": "1.83× training time"},
    "hybrid": {"paper": "Hybrid (Xu et al., ACL 2019), Table 1", "row": "HYBRID (Gate), m = 1",
               "baseline_bleu": 27.67, "bleu": 28.31, "params": "+0.0", "speed": "not reported"},
    "rhe": {"paper": "RHE (EMNLP 2021), Table 1", "row": "LPEA + RHE", "baseline_bleu": 27.31, "bleu": 28.27,
            "params": "not reported", "speed": "1.21 → 1.17 steps/s"},
}


SELECTION_METRICS = {"validation_bleu": ("validation", "bleu", "validation BLEU"),
                     "validation_chrf": ("validation", "chrf", "validation chrF")}


# -------------------------------------------------------------------------------------------------- reporting


def _cell(stats: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if not stats:
        return "–"
    text = f"{stats['mean'] * scale:.{digits}f}"
    return text + (f" ± {stats['std'] * scale:.{digits}f}" if stats["std"] is not None else "")


def _verdict(test: dict, adjusted: float | None) -> str:
    """What the t-test over seeds says of a row against the baseline, at its Holm-adjusted p-value."""
    if adjusted is None:
        return "not tested (one seed)"
    if adjusted >= 0.05:
        return "no significant difference"
    return "better (Holm p < 0.05)" if test["delta"] > 0 else "worse (Holm p < 0.05)"


def _p(test: dict, adjusted: float | None = None) -> str:
    if test["p_value"] is None:
        return "–"
    return f"{test['p_value']:.3f}" + (f"; {adjusted:.3f}" if adjusted is not None else "")


def _seed_test(tests: dict, metric: str) -> dict:
    """The t-test over seeds of a report's row (`with_seed_tests` fills it in for a report written before it)."""
    return tests[f"{metric}_seeds"]


def with_seed_tests(report: dict) -> dict:
    """`report` with the t-test over seeds of every tested row, computed from its runs' test scores where a report
    written before the test has only the paired bootstrap, and (`holm`) each metric's p-values adjusted over the
    family of rows tested against the baseline ([`holm_adjusted`])."""
    for name, tests in report["significance"].items():
        for metric in ("bleu", "chrf"):
            if f"{metric}_seeds" not in tests:
                scores = [[run["test"][metric] for run in report["runs"] if run["name"] == row]
                          for row in (BASELINE, name)]
                tests[f"{metric}_seeds"] = seed_level_test(*scores)
    names = list(report["significance"])
    report["holm"] = {}
    for metric in ("bleu", "chrf"):
        p_values = [report["significance"][name][f"{metric}_seeds"]["p_value"] for name in names]
        report["holm"][metric] = dict(zip(names, holm_adjusted(p_values), strict=True))
    return report


def render_budget(report: dict) -> str:
    """The markdown table of one budget."""
    summary, tests = report["summary"], with_seed_tests(report)["significance"]
    holm = report["holm"]
    base = summary.get(BASELINE)
    lines = [
        f"### Budget `{report['budget']}`",
        "",
        f"Command: `{report['command']}` (at commit `{(report.get('commit') or 'unknown')[:10]}`)  ",
        *(f"Runs trained by `{entry['command']}` (at commit `{(entry.get('commit') or 'unknown')[:10]}`): "
          + "; ".join(f"`{row}` seeds {', '.join(map(str, seeds))}" for row, seeds in entry["runs"].items()) + "  "
          for entry in report.get("trained_by", [])),
        f"Recipe: `{report['budget_file']}` ({report['protocol']}); {report['environment']['device']}."
        + (f"  \nResults: [{Path(report['results_file']).name}]({report['results_file']})"
           if report.get("results_file") else ""),
        "",
        "| row | seeds | steps | params (M) | steps/s (ratio) | valid BLEU | test BLEU | test chrF | "
        "Δ test BLEU [95% CI over seeds] | p (seeds; Holm) | test-set 95% CI (bootstrap) | Δ chrF | "
        "p (chrF, seeds; Holm) | "
        "distinct test outputs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in summary.items():
        test = tests.get(name)
        if test:
            bleu, chrf, boot = _seed_test(test, "bleu"), _seed_test(test, "chrf"), test["bleu"]
            interval = f" [{bleu['delta_ci'][0]:+.2f}, {bleu['delta_ci'][1]:+.2f}]" if bleu["delta_ci"] else ""
            delta = (f"{bleu['delta']:+.2f}{interval} | {_p(bleu, holm['bleu'][name])} | "
                     f"[{boot['delta_95ci'][0]:+.2f}, {boot['delta_95ci'][1]:+.2f}] | {chrf['delta']:+.2f} | "
                     f"{_p(chrf, holm['chrf'][name])}")
        else:
            delta = "– | – | – | – | –"
        ratio = row["steps_per_second"]["mean"] / base["steps_per_second"]["mean"] if base else float("nan")
        lines.append(
            f"| `{name}` | {len(row['seeds'])} | {row['steps']} | {row['parameters'] / 1e6:.1f} | "
            f"{row['steps_per_second']['mean']:.2f} ({ratio:.2f}) | {_cell(row['validation_bleu'])} | "
            f"{_cell(row['test_bleu'])} | {_cell(row['test_chrf'])} | {delta} | "
            f"{_cell(row['test_distinct_fraction'], 100, 1)}% |"
        )
    lines += ["", f"BLEU: `{report['signatures']['bleu']}`  ", f"chrF: `{report['signatures']['chrf']}`  ",
              f"Significance: {SIGNIFICANCE}", ""]
    hosts = sorted({host for row in summary.values() for host in row.get("hosts", [])})
    if len(hosts) > 1:  # steps/s of runs on different machines are not each other's measure
        lines += [f"Steps/s: these runs trained on {len(hosts)} machines (each run's `hosts`), so their ratios mix "
                  "machines; the speed tables compare speed.", ""]
    verdicts = [f"`{name}` {_verdict(_seed_test(test, 'bleu'), holm['bleu'][name])} (Δ BLEU "
                f"{_seed_test(test, 'bleu')['delta']:+.2f}, p = {_p(_seed_test(test, 'bleu'))}, Holm "
                f"{'–' if holm['bleu'][name] is None else format(holm['bleu'][name], '.3f')})"
                for name, test in tests.items()]
    if verdicts:
        lines += ["Against `transformer` on test 2016: " + "; ".join(verdicts) + ".", ""]
    if report.get("plot"):
        lines += [f"![validation loss against steps]({Path(report['plot']).name})", ""]
    if report.get("selection"):
        lines += render_selection(report)
    return "\n".join(lines)


def render_selection(report: dict) -> list[str]:
    """The scores every row had in each budget of a selection, and the budget chosen."""
    selection = report["selection"]
    budgets = list(next(iter(selection.values()))["scores"])
    by = SELECTION_METRICS[next(iter(selection.values()))["by"]][2]
    header = " | ".join(f"`{budget}`: valid / test" for budget in budgets)
    tested = all("against_the_other" in row for row in selection.values())
    lines = [f"Each row's budget, chosen by the mean {by} over the seeds shown (the test scores beside it are not "
             "used to choose)" + (", and the t-test over those seeds of the other budget against the chosen one "
                                  "(p on validation / test)" if tested else "") + ":", "",
             f"| row | seeds | {header} | chosen |" + (" p (valid / test) |" if tested else ""),
             "| --- | --- | " + " | ".join("---" for _ in budgets) + " | --- |" + (" --- |" if tested else "")]
    for name, row in selection.items():
        cells = " | ".join(f"{row['scores'][b]['validation']:.2f} / {row['scores'][b]['test']:.2f}" for b in budgets)
        recipe = ", ".join(f"{key} {value}" for key, value in row["recipe"].items())
        p_values = " / ".join("–" if p is None else f"{p:.3f}" for p in row.get("against_the_other", {}).values())
        lines.append(f"| `{name}` | {', '.join(map(str, row['seeds']))} | {cells} | `{row['chosen']}` ({recipe}) |"
                     + (f" {p_values} |" if tested else ""))
    return lines + [""]


def render_papers() -> str:
    """The markdown table of the papers' own figures (`PAPER_RESULTS`)."""
    lines = ["### The papers' own figures (Transformer-base, WMT En→De; for reference, not comparable in size)", "",
             "| row | paper | paper's row | baseline BLEU | BLEU | Δ BLEU | parameters (M) | training speed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, paper in PAPER_RESULTS.items():
        lines.append(f"| `{name}` | {paper['paper']} | {paper['row']} | {paper['baseline_bleu']:.2f} | "
                     f"{paper['bleu']:.2f} | {paper['bleu'] - paper['baseline_bleu']:+.2f} | {paper['params']} | "
                     f"{paper['speed']} |")
    return "\n".join(lines) + "\n"


def render_section(reports: list[dict]) -> str:
    """The "## Translation quality" section: the protocol, one table per reported budget and the papers' figures."""
    parts = [SECTION, "",
             "`scripts/bench_quality.py`: Multi30k en→de, one prepared corpus per budget, the same recipe and number "
             "of steps for every row (only the variant's own fields differ), the last checkpoints averaged, beam "
             "search, sacreBLEU BLEU/chrF on validation (val, 1014 sentences) and test 2016 (flickr, 1000 sentences) "
             "from detokenized output against the raw references, mean ± std over seeds, the share of distinct test "
             "translations, and each row against `transformer` on test 2016 (Δ = row − transformer): Student's t-test "
             "over the seeds' scores, whose null is the same recipe with another seed (its false-positive rate: "
             "[seed-test-calibration.json](seed-test-calibration.json), `scripts/seed_test_calibration.py`), its p "
             "adjusted by Holm's method over the table's rows (a verdict needs the adjusted p under 0.05), with "
             "the paired bootstrap's interval (1000 resamples, seed-averaged) beside it: how far another test set "
             "could move Δ, blind to training variance.", ""]
    parts += [render_budget(report) for report in reports]
    parts.append(render_papers())
    return "\n".join(parts)


def replace_section(text: str, section: str) -> str:
    """`text` with its quality section (up to the next `## ` heading) replaced by `section`, or `section` appended."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        return text.rstrip("\n") + ("\n\n" if text.strip() else "") + section.rstrip("\n") + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    rest = "\n".join(lines[end:])
    return "\n".join(lines[:start]) + ("\n" if start else "") + section.rstrip("\n") + "\n" + \
        ("\n" + rest if rest.strip() else "")


def update_markdown(path: Path, reports: list[dict]) -> None:
    """Rewrite the quality section of the markdown file at `path` (made if missing) from `reports`."""
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, render_section(reports)))


def plot_curves(runs: list[dict], path: Path) -> str | None:
    """Validation loss (and greedy validation BLEU where logged) against steps, one line per row (seed mean)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    curves: dict[str, dict[int, list]] = {}
    for record in runs:
        log = Path(record["run_dir"]) / "log.jsonl"
        for line in log.read_text().splitlines() if log.is_file() else []:
            entry = json.loads(line)
            if "validation_loss" in entry:
                curves.setdefault(record["name"], {}).setdefault(entry["step"], []).append(entry)
    if not curves:
        return None
    with_bleu = any("validation_bleu_greedy" in e for c in curves.values() for es in c.values() for e in es)
    figure, axes = plt.subplots(1, 2 if with_bleu else 1, figsize=(12 if with_bleu else 6, 4), squeeze=False)
    for name, by_step in curves.items():
        steps = sorted(by_step)
        axes[0][0].plot(steps, [np.mean([e["validation_loss"] for e in by_step[s]]) for s in steps], label=name)
        if with_bleu:
            axes[0][1].plot(steps, [np.mean([e.get("validation_bleu_greedy", np.nan) for e in by_step[s]])
                                    for s in steps], label=name)
    axes[0][0].set(xlabel="step", ylabel="validation loss (nats/token)", title="validation loss")
    axes[0][0].legend(fontsize=7)
    if with_bleu:
        axes[0][1].set(xlabel="step", ylabel="BLEU", title="validation BLEU (greedy)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


