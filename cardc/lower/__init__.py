"""Lowering of checked cards to the IR (`cardc.ir`), with the fusion passes."""

from .cards import Lowering
from .values import LowerError

__all__ = ["Lowering", "LowerError"]
