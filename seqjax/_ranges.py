"""Declared ranges of numeric options: ``Annotated[int, Range(low=1)]`` and its aliases.

A config field declared with one (``num_layers: PosInt = 2``) carries its range in its type, and
the command line (:func:`seqjax.experiments._config.check_field_ranges`) refuses a value outside
it, naming the option. ``Annotated`` keeps the fields plain ``int``/``float`` to type checkers
and ``dataclasses``. No dependencies, so configs at every level can use it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

__all__ = ["Range", "PosInt", "NonNegInt", "PosFloat", "NonNegFloat", "Fraction"]


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option may take: ``low <= x`` (``low < x`` when ``low_open``)
    and ``x < high`` (``x <= high`` when ``high_closed``); ``None`` = unbounded. Floats must
    also be finite. Used as ``Annotated[int, Range(low=1)]``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_closed: bool = False

    def admits(self, x: float) -> bool:
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return self.high is None or (x <= self.high if self.high_closed else x < self.high)

    def describe(self, tp: type) -> str:
        if tp is int and self.low is not None and self.high is None:
            return f"an int >= {int(self.low) + int(self.low_open)}"
        if self.high is None:
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        return (f"lie in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{']' if self.high_closed else ')'}")


#: The declared types of the numeric options.
PosInt = Annotated[int, Range(low=1)]
NonNegInt = Annotated[int, Range(low=0)]
PosFloat = Annotated[float, Range(low=0, low_open=True)]
NonNegFloat = Annotated[float, Range(low=0)]
Fraction = Annotated[float, Range(low=0, high=1)]  # [0, 1): dropout rates, held-out shares
