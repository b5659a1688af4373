"""The time one model call takes, fitted as ``a * rows + b`` (pure, no clock).

An exponentially weighted least-squares line through (rows, seconds) of recent calls:
recent calls count most, so the fit follows a model that warms up or a GPU that gets
shared. While every call carries the same number of rows the line is undetermined, and
the fit answers the weighted mean for every size.

A slope is kept only when the calls show it: at least twice its standard error above
zero. A model whose calls cost the same whatever their rows (a GPU at small batch sizes)
still shows some slope in noisy times, and a slope fitted on the thin calls of light load
and stretched to a full batch turns a 30 ms call into a predicted 50 ms one.
"""

from __future__ import annotations

import math

SLOPE_MIN_T = 2.0  # standard errors a fitted slope must clear to count


class CallTimeFit:
    """Predicts the seconds of a call from its real rows."""

    def __init__(self, initial_s: float = 0.05, weight: float = 0.1) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self._weight = weight
        # Exponentially weighted moments of rows (n) and seconds (t), and the sum of the
        # squared weights, which gives the effective number of calls behind them.
        self._w = self._w2 = self._n = self._t = self._nn = self._nt = self._tt = 0.0
        # Fitted once a call, read for every flush plan: the pool predicts on the hot path.
        self._line = (0.0, initial_s)

    def observe(self, rows: int, seconds: float) -> None:
        """A call of ``rows`` real rows took ``seconds``."""
        keep, weight = 1 - self._weight, self._weight
        self._w = keep * self._w + weight
        self._w2 = keep * keep * self._w2 + weight * weight
        self._n = keep * self._n + weight * rows
        self._t = keep * self._t + weight * seconds
        self._nn = keep * self._nn + weight * rows * rows
        self._nt = keep * self._nt + weight * rows * seconds
        self._tt = keep * self._tt + weight * seconds * seconds
        self._line = self._fit()

    def line(self) -> tuple[float, float]:
        """(a, b): seconds per row and seconds per call; a is never negative, and 0 unless
        the calls tell it from 0."""
        return self._line

    def _fit(self) -> tuple[float, float]:
        """The line through the moments, its slope kept only past SLOPE_MIN_T standard errors."""
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance < 1e-6:
            return 0.0, mean_t
        covariance = self._nt / self._w - mean_n * mean_t
        slope = covariance / variance
        calls = self._w * self._w / self._w2  # effective: recent calls weigh more
        if slope <= 0 or calls <= 2:
            return 0.0, mean_t
        residual = max(0.0, self._tt / self._w - mean_t * mean_t - slope * covariance)
        standard_error = math.sqrt(residual / (variance * (calls - 2)))
        if slope <= SLOPE_MIN_T * standard_error:
            return 0.0, mean_t
        return slope, max(0.0, mean_t - slope * mean_n)

    def predict(self, rows: int) -> float:
        """Expected seconds of a call carrying ``rows`` real rows."""
        slope, base = self.line()
        return slope * rows + base
