"""The t-test over training seeds that the quality tables use (`evaluation.seed_level_test`)."""

import numpy as np
import pytest

from mgsa_hf.evaluation import holm_adjusted, seed_level_test


pytest.importorskip("scipy")


def test_matches_the_pooled_t_statistic_by_hand():
    baseline, system = [31.2, 32.0, 31.5], [32.4, 33.1, 32.2]
    result = seed_level_test(baseline, system)
    a, b = np.array(system), np.array(baseline)
    pooled = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    half_width = (result["delta_ci"][1] - result["delta_ci"][0]) / 2
    standard_error = np.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    # the interval is delta ± t(0.975, 4) · se, with t(0.975, 4) = 2.7764
    assert result["delta"] == pytest.approx(a.mean() - b.mean(), abs=0.005)
    assert half_width == pytest.approx(2.7764 * standard_error, abs=0.01)
    assert result["df"] == 4 and result["seeds"] == [3, 3]
    assert 0.01 < result["p_value"] < 0.05  # t = 3.4 on 4 degrees of freedom


def test_same_recipe_seeds_are_called_different_in_about_five_percent():
    """The calibration the quality tables rely on: both groups drawn from one seed distribution."""
    rng = np.random.default_rng(1)
    draws = rng.normal(32.0, 0.8, size=(2000, 2, 3))
    rate = np.mean([seed_level_test(a, b)["p_value"] < 0.05 for a, b in draws])
    assert 0.035 < rate < 0.065
    welch = np.mean([seed_level_test(a, b, equal_var=False)["p_value"] < 0.05 for a, b in draws[:600]])
    assert welch < rate  # Welch's form is conservative when the variances are equal


def test_one_seed_gives_no_p_value_and_empty_rows_are_refused():
    result = seed_level_test([31.0], [32.0, 33.0])
    assert result["p_value"] is None and result["delta_ci"] is None and result["delta"] == 1.5
    with pytest.raises(ValueError, match="at least one seed"):
        seed_level_test([], [32.0])
    identical = seed_level_test([30.0, 30.0], [30.0, 30.0])
    assert identical["p_value"] == 1.0


def test_holm_adjustment_by_hand_and_its_family_wise_rate():
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m − k + 1), never below the one before
    it, capped at 1, rows without a p-value left out; five rows drawn like the baseline are all called the same in
    at least 92.5% of tables (unadjusted, over 12% of tables call one row different: 17.5% with these draws)."""
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005, None]) == [0.03, 0.06, 0.06, 0.02, None]
    assert holm_adjusted([0.6, 0.7]) == [1.0, 1.0] and holm_adjusted([0.02]) == [0.02]
    rng = np.random.default_rng(2)
    any_called, any_called_raw = [], []
    for baseline, *rows in rng.normal(32.0, 0.8, size=(600, 6, 3)):
        p_values = [seed_level_test(baseline, row)["p_value"] for row in rows]
        any_called.append(min(holm_adjusted(p_values)) < 0.05)
        any_called_raw.append(min(p_values) < 0.05)
    assert np.mean(any_called) < 0.075 and np.mean(any_called_raw) > 0.12
