"""The t-test over training seeds that the quality tables use (`evaluation.seed_level_test`)."""

import numpy as np
import pytest

from mgsa_hf.evaluation import seed_level_test


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
