"""Whether a training curve has levelled off: the one test that the report states (report.numbers.convergence) and
that the training loop stops on (--until converged).

The test compares the score's gain over the last quarter of the steps so far with PLATEAU_TOLERANCE. The scores
at the quarters' boundaries are interpolated between evaluations: with evaluations every 1,000 of 10,000 steps,
the last one at or before 7,500 would stretch the last quarter to 3,000 steps and shrink the one before to 2,000,
hiding a slow-down.
"""
from __future__ import annotations

import numpy as np

PLATEAU_TOLERANCE = 0.01  # a score (accuracy, R²) that moved less than this over the last quarter has plateaued
MIN_EVALUATIONS = 4       # fewer evaluations (the one at step 0 included) cannot show a quarter's gain
FIT_THRESHOLD = 0.99      # a training accuracy below this at the end: the model does not fit its training set


def quarter_gains(steps, scores, lower_is_better: bool) -> tuple[float, float]:
    """(gain over the last quarter, gain over the quarter before) of a curve evaluated at increasing steps from 0;
    a gain is an improvement (a fall for a lower-is-better score)."""
    steps, scores = np.asarray(steps, dtype=float), np.asarray(scores, dtype=float)
    end = steps[-1]
    half, three_quarters = np.interp([0.5 * end, 0.75 * end], steps, scores)
    sign = -1.0 if lower_is_better else 1.0
    return float(sign * (scores[-1] - three_quarters)), float(sign * (three_quarters - half))


def has_plateaued(steps, scores, lower_is_better: bool) -> bool:
    """Enough evaluations, and the last quarter gained no more than PLATEAU_TOLERANCE."""
    if len(steps) < MIN_EVALUATIONS or steps[-1] <= 0:
        return False
    return quarter_gains(steps, scores, lower_is_better)[0] <= PLATEAU_TOLERANCE
