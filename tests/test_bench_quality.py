"""scripts/bench_quality.py: the paired bootstrap test against sacreBLEU's, the BENCHMARKS.md section update, and a
dry run of the whole benchmark (two variants, one seed, the tiny config)."""

import importlib.util
import json
import random
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training import load_train_config


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"

spec = importlib.util.spec_from_file_location("bench_quality", REPO / "scripts" / "bench_quality.py")
bench_quality = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_quality)


@pytest.fixture(scope="module")
def references():
    return list(read_lines(DATA / "test_2016_flickr.de.gz", 300))


def degrade(sentences, rate, seed):
    """Each word dropped with probability `rate`: a system whose quality falls as `rate` grows."""
    rng = random.Random(seed)
    return [" ".join(w for w in s.split() if rng.random() >= rate) for s in sentences]


@pytest.mark.parametrize("metric", [BLEU(), CHRF()], ids=["bleu", "chrf"])
def test_one_seed_is_sacrebleu_paired_bootstrap(references, metric):
    baseline, system = degrade(references, 0.30, 0), degrade(references, 0.25, 1)
    ours = bench_quality.paired_bootstrap([baseline], [system], references, metric)
    _, scores = PairedTest([("baseline", baseline), ("system", system)], {"m": metric}, [references],
                           test_type="bs", n_samples=1000)()
    name = next(key for key in scores if key != "System")
    expected = scores[name][1]
    assert ours["system"] == pytest.approx(expected.score, abs=0.01)
    assert ours["p_value"] == pytest.approx(expected.p_value, abs=1e-4)
    assert ours["delta"] == pytest.approx(expected.score - scores[name][0].score, abs=0.01)


def test_identical_systems_are_not_different(references):
    system = degrade(references, 0.3, 0)
    result = bench_quality.paired_bootstrap([system], [list(system)], references, BLEU())
    assert result["delta"] == 0.0 and result["p_value"] == 1.0
    assert result["delta_95ci"] == [0.0, 0.0]


def test_clearly_better_and_worse_systems_are_significant(references):
    baseline = degrade(references, 0.3, 0)
    better = bench_quality.paired_bootstrap([baseline], [degrade(references, 0.1, 1)], references, BLEU())
    worse = bench_quality.paired_bootstrap([baseline], [degrade(references, 0.5, 2)], references, BLEU())
    assert better["delta"] > 5 and better["p_value"] < 0.05 and better["delta_95ci"][0] > 0
    assert worse["delta"] < -5 and worse["p_value"] < 0.05 and worse["delta_95ci"][1] < 0
    # two systems of the same quality, differing only by chance: no significant difference
    same = bench_quality.paired_bootstrap([baseline], [degrade(references, 0.3, 3)], references, BLEU())
    assert same["p_value"] > 0.05 and same["delta_95ci"][0] < 0 < same["delta_95ci"][1]


def test_seeds_are_averaged(references):
    seeds = [degrade(references, rate, seed) for seed, rate in enumerate((0.2, 0.4))]
    baseline = [degrade(references, 0.3, 5), degrade(references, 0.3, 6)]
    result = bench_quality.paired_bootstrap(baseline, seeds, references, BLEU())
    mean = sum(BLEU().corpus_score(s, [references]).score for s in seeds) / 2
    assert result["system"] == pytest.approx(mean, abs=0.01)
    with pytest.raises(ValueError, match="same number"):
        bench_quality.paired_bootstrap(baseline, seeds[:1], references, BLEU())
    with pytest.raises(ValueError, match="hypotheses for"):
        bench_quality.paired_bootstrap([references[:10]], [references[:10]], references, BLEU())


def test_markdown_section_is_replaced_and_others_kept():
    text = "# Benchmarks\n\n## Speed\n\nspeed table\n\n## Translation quality\n\nold\n\n## Preprocessing\n\nparse\n"
    updated = bench_quality.replace_section(text, "## Translation quality\n\nnew table\n")
    assert "old" not in updated and "new table" in updated
    assert updated.index("## Speed") < updated.index("new table") < updated.index("## Preprocessing")
    assert "speed table" in updated and "parse" in updated
    assert bench_quality.replace_section(updated, "## Translation quality\n\nnew table\n") == updated
    appended = bench_quality.replace_section("# Benchmarks\n\n## Speed\n\nx\n", "## Translation quality\n\ny\n")
    assert appended.endswith("## Translation quality\n\ny\n") and "## Speed\n\nx" in appended


def test_variant_configs_change_only_variant_fields(tmp_path):
    assert bench_quality.variant_fields("rhe") == ("rhe", {"encoder_type": "rhe"})
    name, fields = bench_quality.variant_fields(str(REPO / "configs" / "rhe" / "dea_rhe.json"))
    assert name == "rhe/dea_rhe" and fields["rhe_attention"] == "dea"
    with pytest.raises(ValueError, match="neither an encoder type"):
        bench_quality.variant_fields("no_such_variant")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"encoder_type": "hybrid", "d_model": 64}))
    base = load_train_config(REPO / "configs" / "train" / "tiny.yaml")
    with pytest.raises(ValueError, match="d_model"):
        bench_quality.run_config(base, *bench_quality.variant_fields(str(bad)), 1, tmp_path, tmp_path)


def test_dry_run_trains_scores_tests_and_reports(tmp_path, capsys):
    args = ["--dry-run", "--variants", "hybrid", "--output-root", str(tmp_path / "runs"), "--set", f"data={DATA}",
            "--results", str(tmp_path / "quality.json"), "--markdown", str(tmp_path / "BENCHMARKS.md")]
    report = bench_quality.main(args)
    assert set(report["summary"]) == {"transformer", "hybrid"}
    for name in ("transformer", "hybrid"):
        row = report["summary"][name]
        assert row["seeds"] == 1 and row["steps"] == 4 and not row["failed"]
        assert 0.0 <= row["test_bleu"]["mean"] <= 100.0 and row["test_chrf"]["mean"] > 0.0
        assert 1 <= row["distinct_test_outputs"]["mean"] <= 8
        run_dir = tmp_path / "runs" / "dry-run" / name / "seed-1"
        assert len((run_dir / "test.hyp.de").read_text().splitlines()) == 8
        assert (tmp_path / "quality" / f"{name}.seed-1.test.hyp.de").is_file()
    test = report["significance"]["hybrid"]
    assert test["seeds"] == [1] and 0.0 < test["bleu"]["p_value"] <= 1.0 and 0.0 < test["chrf"]["p_value"] <= 1.0
    assert "nrefs:1|case:mixed" in report["signatures"]["bleu"] and "tok:13a" in report["signatures"]["bleu"]
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["summary"] == report["summary"] and saved["command"].startswith("python scripts/bench_quality.py")
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Translation quality" in markdown and "| `hybrid` | 1 | 4 |" in markdown

    # a second call reuses the finished runs instead of training again
    stamp = (tmp_path / "runs" / "dry-run" / "hybrid" / "seed-1" / "results.json").stat().st_mtime_ns
    capsys.readouterr()
    again = bench_quality.main(args)
    assert "reusing" in capsys.readouterr().out
    assert (tmp_path / "runs" / "dry-run" / "hybrid" / "seed-1" / "results.json").stat().st_mtime_ns == stamp
    assert again["summary"] == report["summary"]
