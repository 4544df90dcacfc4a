"""Preset values, at their public path: see cardc.checker.presets (and .exact, .presetvalues)."""

from .checker.exact import OverrideError, PresetError
from .checker.presets import check_presets, find_preset, in_ranges, own_values, validate
from .checker.presetvalues import run_values

__all__ = ["OverrideError", "PresetError", "check_presets", "find_preset", "in_ranges",
           "own_values", "run_values", "validate"]
