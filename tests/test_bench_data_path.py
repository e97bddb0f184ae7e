"""`scripts/bench_data_path.py`'s WMT14 extrapolation: the CPU a source word adds between the two largest prepare runs,
with the tokenizer's training (timed alone at the same sizes, where it trains on every pair) counted at the share of
pairs WMT14's recipe trains it on, at the largest per-word cost measured."""

import argparse
import sys
from pathlib import Path

import pytest
import yaml


pytestmark = pytest.mark.benchmark_tools
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench_data_path  # noqa: E402


def test_the_tokenizer_counts_at_the_recipes_sample_share():
    from mgsa_hf.training.catalogue import recipe_path

    share = yaml.safe_load(recipe_path("wmt14").read_text())["tokenizer_max_sentences"] / bench_data_path.WMT14_PAIRS
    assert 0 < share < 1 and bench_data_path.tokenizer_sample_share() == pytest.approx(share)
    words = {5000: 50_000, 20000: 200_000, 100000: 1_000_000}
    results = {
        "prepare/rhe/5000/workers-2": {"cpu_seconds": 20.0, "source_words": 50_000},
        "prepare/rhe/20000/workers-2": {"cpu_seconds": 50.0, "source_words": 200_000},  # 0.2 ms a word
        # 0.02 ms a word between the prepare runs' sizes, 0.01 beyond
        **{f"tokenizer/{pairs}": {"cpu_seconds": seconds, "source_words": words[pairs]}
           for pairs, seconds in ((5000, 5.0), (20000, 8.0), (100000, 16.0))},
    }
    results["prepare/rhe/20000/workers-2"].update(pairs=20000, processed_bytes_per_pair=400.0,
                                                   processed_bytes_per_pair_int64=1600.0)
    args = argparse.Namespace(parse_pairs=[5000, 20000], tokenizer_pairs=[100000], prepare_types=["rhe"],
                              workers=[2])
    bench_data_path.extrapolate(results, args)
    row = results["extrapolation/rhe/workers-2"]
    assert row["cpu_ms_per_source_word"] == pytest.approx(0.2)
    assert row["tokenizer_cpu_ms_per_source_word"] == pytest.approx(0.02)
    expected = 0.2 - 0.02 + 0.02 * share
    assert row["wmt14_cpu_ms_per_source_word"] == pytest.approx(expected, abs=1e-4)
    assert row["one_node_16_cores_minutes"] == pytest.approx(expected / 1000 * 116e6 / 60 / 16, abs=0.05)
    # without the tokenizer timed alone, every word counts at the measured slope
    del results["tokenizer/100000"], results["extrapolation/rhe/workers-2"]
    bench_data_path.extrapolate(results, args)
    assert results["extrapolation/rhe/workers-2"]["wmt14_cpu_ms_per_source_word"] == pytest.approx(0.2)


def test_repeats_keep_the_run_of_median_cpu(tmp_path, monkeypatch):
    """`--repeats 3`: the row is the run of median CPU time, every run's CPU beside it; the folder to clear is
    removed before each run."""
    cleared, seconds = tmp_path / "run", iter([3.0, 1.0, 2.0])

    def measure(command, **options):
        assert not cleared.exists() and options == {"cwd": tmp_path}
        cleared.mkdir()
        return {"cpu_seconds": next(seconds), "command": command}

    monkeypatch.setattr(bench_data_path, "measure_command", measure)
    row = bench_data_path.median_run(["prepare"], 3, clear=cleared, cwd=tmp_path)
    assert row == {"cpu_seconds": 2.0, "command": ["prepare"], "cpu_seconds_runs": [3.0, 1.0, 2.0]}
