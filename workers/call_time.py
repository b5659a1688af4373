"""The time one model call takes, fitted as ``a * rows + b`` (pure, no clock).

An exponentially weighted least-squares line through (rows, seconds) of recent calls:
recent calls count most, so the fit follows a model that warms up or a GPU that gets
shared. While every call carries the same number of rows the line is undetermined, and
the fit answers the weighted mean for every size.
"""

from __future__ import annotations


class CallTimeFit:
    """Predicts the seconds of a call from its real rows."""

    def __init__(self, initial_s: float = 0.05, weight: float = 0.1) -> None:
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self._weight = weight
        self._initial_s = initial_s
        # Exponentially weighted moments of rows (n) and seconds (t).
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    @property
    def observed(self) -> bool:
        return self._w > 0

    def observe(self, rows: int, seconds: float) -> None:
        """A call of ``rows`` real rows took ``seconds``."""
        keep = 1 - self._weight
        self._w = keep * self._w + self._weight
        self._n = keep * self._n + self._weight * rows
        self._t = keep * self._t + self._weight * seconds
        self._nn = keep * self._nn + self._weight * rows * rows
        self._nt = keep * self._nt + self._weight * rows * seconds

    def line(self) -> tuple[float, float]:
        """(a, b): seconds per row and seconds per call; a is never negative."""
        if not self.observed:
            return 0.0, self._initial_s
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance < 1e-6:
            return 0.0, mean_t
        slope = max(0.0, (self._nt / self._w - mean_n * mean_t) / variance)
        return slope, max(0.0, mean_t - slope * mean_n)

    def predict(self, rows: int) -> float:
        """Expected seconds of a call carrying ``rows`` real rows."""
        slope, base = self.line()
        return slope * rows + base
