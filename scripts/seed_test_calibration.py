#!/usr/bin/env python
"""How often each test between quality rows says "significant" when both rows are the same recipe.

A test's null hypothesis in the quality tables is "the same recipe, another training seed". On two groups of seeds of
one recipe a calibrated test gives p < 0.05 in about 5% of comparisons. This script measures that rate for:

- the paired bootstrap over test sentences (`evaluation.paired_bootstrap`), on the real translations of every
  recipe that has two seeds in `benchmarks/quality-*/`: seed 1 against seed 2 of the same row;
- the t-test over seeds (`evaluation.seed_level_test`): Student's pooled form, which the quality tables use, and
  Welch's unequal-variance form; by simulation, with seed
  scores drawn around one mean with the seed spread measured on those same rows (normal, and Student-t with 3
  degrees of freedom for heavy tails), at 2 to 5 seeds a row; and on real rows wherever a recipe has 4 seeds or more
  (every split of its seeds into two halves).

    python scripts/seed_test_calibration.py            # writes benchmarks/seed-test-calibration.json

Counting only: no training, about a minute on one core (the bootstrap resamples the real translations).
"""

import argparse
import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import sacrebleu
from scipy import stats

from mgsa_hf.evaluation import paired_bootstrap, seed_level_test


REPOSITORY = Path(__file__).resolve().parents[1]
REFERENCES = REPOSITORY.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.de.gz"


def same_recipe_rows(benchmarks: Path) -> list[dict]:
    """Every (budget, row) of the stored quality results with its seeds' test BLEU and translation files."""
    rows = []
    for results in sorted(benchmarks.glob("quality-*.json")):
        report = json.loads(results.read_text())
        by_row = {}
        for run in report.get("runs", []):
            hypotheses = benchmarks / results.stem / f"{run['name']}.seed-{run['seed']}.test.hyp.de"
            by_row.setdefault(run["name"], []).append((run["seed"], run["test"]["bleu"], hypotheses))
        for name, seeds in by_row.items():
            seeds.sort()
            rows.append({"budget": results.stem, "row": name, "seeds": [s for s, _, _ in seeds],
                         "bleu": [b for _, b, _ in seeds], "hypotheses": [h for _, _, h in seeds]})
    return rows


def bootstrap_on_same_recipe(rows: list[dict], references: list[str]) -> dict:
    """The paired bootstrap of seed 1 against seed 2 of each row, whose translations are stored."""
    bleu = sacrebleu.metrics.BLEU()
    pairs = []
    for row in rows:
        if len(row["seeds"]) < 2 or not all(path.exists() for path in row["hypotheses"][:2]):
            continue
        first, second = ([line.rstrip("\n") for line in path.open()] for path in row["hypotheses"][:2])
        test = paired_bootstrap([first], [second], references, bleu)
        pairs.append({"budget": row["budget"], "row": row["row"], "delta": test["delta"], "p_value": test["p_value"]})
    significant = sum(pair["p_value"] < 0.05 for pair in pairs)
    return {"pairs": pairs, "significant": significant, "comparisons": len(pairs),
            "rate": round(significant / len(pairs), 3) if pairs else None}


def t_tests_by_simulation(seed_std: float, draws: int, rng: np.random.Generator) -> list[dict]:
    """Share of p < 0.05 from the t-tests on two groups of n seeds of one recipe, seed scores drawn i.i.d."""
    results = []
    for noise, form in itertools.product(("normal", "student-t(3)"), ("Student", "Welch")):
        for n in (2, 3, 4, 5):
            if noise == "normal":
                scores = rng.normal(0.0, seed_std, size=(draws, 2, n))
            else:  # unit-variance-free heavy tails scaled to the same standard deviation
                scores = rng.standard_t(3, size=(draws, 2, n)) * seed_std / np.sqrt(3.0)
            # scipy's test, vectorised over the draws: `seed_level_test` calls it on one pair of rows
            p_values = stats.ttest_ind(scores[:, 1], scores[:, 0], axis=1, equal_var=form == "Student").pvalue
            results.append({"test": form, "noise": noise, "seeds_per_row": n, "draws": draws,
                            "rate": round(float(np.mean(p_values < 0.05)), 4)})
    return results


def t_test_on_real_seeds(rows: list[dict]) -> list[dict]:
    """Every split into two halves of the seeds of each row with 4 seeds or more."""
    results = []
    for row in rows:
        scores = row["bleu"]
        if len(scores) < 4:
            continue
        half = len(scores) // 2
        p_values = []
        for chosen in itertools.combinations(range(len(scores)), half):
            rest = [i for i in range(len(scores)) if i not in chosen]
            p_values.append(seed_level_test([scores[i] for i in chosen], [scores[i] for i in rest])["p_value"])
        results.append({"budget": row["budget"], "row": row["row"], "seeds": len(scores), "splits": len(p_values),
                        "rate": round(float(np.mean(np.array(p_values) < 0.05)), 4)})
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", type=Path, default=REPOSITORY / "benchmarks")
    parser.add_argument("--draws", type=int, default=100000, help="simulated comparisons per setting")
    parser.add_argument("--output", type=Path, default=REPOSITORY / "benchmarks" / "seed-test-calibration.json")
    args = parser.parse_args(argv)

    rows = same_recipe_rows(args.benchmarks)
    with gzip.open(REFERENCES, "rt", encoding="utf-8") as file:
        references = [line.rstrip("\n") for line in file]
    # the seed spread of one recipe: the pooled standard deviation of the rows with two seeds or more
    spreads = [np.var(row["bleu"], ddof=1) for row in rows if len(row["bleu"]) >= 2]
    seed_std = float(np.sqrt(np.mean(spreads)))
    report = {
        "command": "python scripts/seed_test_calibration.py",
        "null": "two groups of seeds of the same recipe; a calibrated test gives p < 0.05 in about 5% of comparisons",
        "pooled_seed_std_bleu": round(seed_std, 3),
        "rows_with_two_seeds": len(spreads),
        "paired_bootstrap_same_recipe": bootstrap_on_same_recipe(rows, references),
        "t_tests_simulated": t_tests_by_simulation(seed_std, args.draws, np.random.default_rng(0)),
        "student_real_seeds": t_test_on_real_seeds(rows),
    }
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    boot = report["paired_bootstrap_same_recipe"]
    print(f"seed std {seed_std:.2f} BLEU over {len(spreads)} rows; paired bootstrap on same-recipe seed pairs: "
          f"{boot['significant']}/{boot['comparisons']} with p < 0.05")
    for entry in report["t_tests_simulated"]:
        print(f"{entry['test']:>7}, {entry['noise']:>12}, {entry['seeds_per_row']} seeds a row: p < 0.05 in "
              f"{entry['rate']:.1%}")
    return report


if __name__ == "__main__":
    main()
