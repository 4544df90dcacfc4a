"""The checker's step for names, at its public path: see cardc.checker.namecheck."""

from .checker.namecheck import Named, card_identifiers, check_names

__all__ = ["Named", "card_identifiers", "check_names"]
