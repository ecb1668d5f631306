"""pe_fast's Pearson and Spearman correlations against scipy.stats's, the reference they replace."""
import warnings

import numpy as np
import pytest
from scipy import stats

from pe_fast.metrics.correlation import average_ranks, pearson, spearman


def scipy_value(function, x, y) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns where the result is NaN
        return float(function(x, y).statistic)


def cases():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    yield "random", x, rng.normal(size=200)
    yield "correlated", x, 0.7 * x + rng.normal(size=200)
    yield "anti", x, -3.0 * x + 1.0
    ties = rng.integers(0, 5, size=300).astype(float)
    yield "ties", ties, ties + rng.integers(0, 3, size=300)
    yield "ties both ways", np.repeat([1.0, 2.0, 2.0, 3.0], 10), np.tile([5.0, 5.0, 1.0, 0.0], 10)
    yield "two points", np.array([1.0, 2.0]), np.array([3.0, -1.0])
    yield "large offset", 1e8 + x, x
    yield "large values", x * 1e300, x * 1e-300 + 1.0
    yield "constant", np.ones(50), x[:50]
    yield "constant of an inexact value", np.full(50, 0.1), x[:50]
    yield "nan", np.r_[x[:9], np.nan], x[:10]
    yield "inf", np.r_[x[:9], np.inf], x[:10]
    yield "-inf both", np.r_[x[:9], -np.inf], np.r_[x[:9], -np.inf]


@pytest.mark.parametrize("name,x,y", list(cases()), ids=[c[0] for c in cases()])
@pytest.mark.parametrize("ours,theirs", [(pearson, stats.pearsonr), (spearman, stats.spearmanr)],
                         ids=["pearson", "spearman"])
def test_equals_scipy(name, x, y, ours, theirs):
    expected = scipy_value(theirs, x, y)
    got = ours(x, y)
    if np.isnan(expected):
        assert np.isnan(got)
    else:
        assert got == pytest.approx(expected, abs=1e-12)


def test_average_ranks_equal_scipys_rankdata():
    values = np.random.default_rng(1).integers(0, 7, size=1000).astype(float)
    np.testing.assert_array_equal(average_ranks(values), stats.rankdata(values))


def test_lengths_must_match():
    with pytest.raises(ValueError, match="same length"):
        pearson([1.0, 2.0, 3.0], [1.0, 2.0])
