"""The flush policy's parameters: shared by the batchers that apply them, the store that
tunes them live (``policy_tuning``) and the simulator that replays them.

Each knob is declared once, as a setting (``core/settings.py``): its default, its bounds,
what it does, and whether it is tuned live. What is here reads them from there: the
defaults, the bounds every value is checked against (from the environment, a live change
or code), the list of live knobs and their descriptions. A parameter here is its setting
in seconds where the setting is in milliseconds (``max_wait`` is ``max_wait_ms`` / 1000)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from annotated_types import Ge, Gt, Le

from brimful.core.settings import Settings, default_of


def _is_live(name: str) -> bool:
    extra = Settings.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and extra.get("tunable") is True


# Live-tunable knob (the setting's name) -> what it does.
TUNABLE: dict[str, str] = {
    name: field.description or "" for name, field in Settings.model_fields.items() if _is_live(name)
}


@dataclass(frozen=True)
class Bounds:
    """A knob's allowed values, from its setting's constraints."""

    low: float = -math.inf
    low_included: bool = True
    high: float = math.inf

    def refusal(self, name: str, value: float) -> str | None:
        """Why ``value`` is not allowed for ``name``; None when it is."""
        if not math.isfinite(value):
            return f"{name} must be finite"
        if value > self.high:
            return f"{name} = {value:g} is above its limit of {self.high:g}"
        if value < self.low or (value == self.low and not self.low_included):
            return f"{name} = {value:g} must be {'at least' if self.low_included else 'above'} {self.low:g}"
        return None


@functools.cache
def bounds(name: str) -> Bounds:
    """The bounds of the setting ``name``."""
    found = Bounds()
    for constraint in Settings.model_fields[name].metadata:
        if isinstance(constraint, Gt):
            found = Bounds(float(constraint.gt), False, found.high)  # type: ignore[arg-type]
        elif isinstance(constraint, Ge):
            found = Bounds(float(constraint.ge), True, found.high)  # type: ignore[arg-type]
        elif isinstance(constraint, Le):
            found = Bounds(found.low, found.low_included, float(constraint.le))  # type: ignore[arg-type]
    return found


def _knob(parameter: str) -> tuple[str, float]:
    """The setting behind a parameter, and the factor from the parameter's unit to it."""
    return (parameter + "_ms", 1000.0) if parameter + "_ms" in Settings.model_fields else (parameter, 1.0)


@dataclass(frozen=True)
class PolicyParams:
    """The policy's parameters; all durations in seconds. ``batch_size`` is the model's
    (its configuration says it), not a setting."""

    batch_size: int = 64
    max_wait: float = default_of("max_wait_ms") / 1000
    min_wait: float = default_of("min_wait_ms") / 1000
    # Submit-to-result time the policy keeps within when the model pool has room: it waits
    # for rows only while the batch can still leave in time for it (the measured time a
    # task spends before the batcher and after its call counted).
    latency_target: float = default_of("latency_target_ms") / 1000
    rate_halflife: float = default_of("rate_halflife_ms") / 1000
    fill_slack: float = default_of("fill_slack")
    min_worthwhile_rows: float = default_of("min_worthwhile_rows")
    low_max_wait: float = default_of("low_max_wait_ms") / 1000  # a low-priority row's longest wait (backfill)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        for parameter in fields(self):
            if parameter.name != "batch_size":
                name, factor = _knob(parameter.name)
                refusal = bounds(name).refusal(name, getattr(self, parameter.name) * factor)
                if refusal is not None:
                    raise ValueError(refusal)
        if self.min_wait > self.max_wait:
            raise ValueError("need min_wait <= max_wait")

    @property
    def fill_first(self) -> bool:
        """The cost mode: a latency target no shorter than ``max_wait`` lets every row wait its
        whole ``max_wait``, so a batch leaves full or at its latest moment, never early for
        want of rows (docs/batching.md, "The cost mode")."""
        return self.latency_target >= self.max_wait

    @staticmethod
    def knobs() -> tuple[str, ...]:
        """The settings behind the parameters, as ``from_knobs`` takes them."""
        return tuple(_knob(parameter.name)[0] for parameter in fields(PolicyParams) if parameter.name != "batch_size")

    @classmethod
    def from_knobs(cls, values: Mapping[str, float], batch_size: int) -> PolicyParams:
        """The parameters from their settings' values (``knobs``; milliseconds where the
        setting says so); ValueError naming what is wrong with them."""
        return cls(
            batch_size=batch_size,
            **{
                parameter.name: values[_knob(parameter.name)[0]] / _knob(parameter.name)[1]
                for parameter in fields(cls)
                if parameter.name != "batch_size"
            },
        )
