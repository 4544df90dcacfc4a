"""What cardc does to a card, in order: the fusion rules by the hook they serve, then the
passes over the lowered program.

Lowering walks a card once (cardc.lower.cards, cardc.lower.steps). At each hook it asks that
hook's recognisers in order; the first whose `find` matches and whose `lower` does not decline
replaces the literal lowering of what it matched:

- card: a whole card in one piece (its body is not walked step by step);
- step: each of a card's own steps, before it is lowered;
- loop: a map `for h ∈ [H] : …` that is not over positions nor over layers;
- recurrence: a sequential loop over positions `for t = 1, …, T do … end`;
- call: a call of another card;
- expression: any expression.

Then the passes rewrite the lowered program of a model, in order: biases folded into their
products, attention whose queries are a product factored (its products associated by their
sizes when it runs), sibling projections joined for decoding, the KV cache, values of sizes
alone made once. `fuse=False` is the literal
pipeline: no recogniser, no pass; it is the twin the tests compare every fusion against.
`OBSERVED` is the literal pipeline with its maps over heads vectorised (a head's values keep a
head axis) and every value a card names shown to an observer (cardc.lower.observe), for
`cardc.run_with_cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ir
from . import (
    attention,
    experts,
    gelu,
    grouped,
    heads,
    norms,
    patches,
    recurrence,
    rotary,
    sdpa_heads,
)
from .analysis import Masking
from .decoding import add_kv_cache, join_for_cache
from .factored import factor_attention
from .invariants import share_invariants
from .peephole import fold_bias


@dataclass(frozen=True)
class Recogniser:
    """A fusion rule: `find(patterns, body, *subject)` says what it matched (None: nothing),
    `lower(body, *subject, found)` lowers it (None or False: it declines after all).
    `patterns` are the cards of patterns.card it looks for (cardc.lower.intrinsics)."""

    name: str
    find: Callable[..., Any]
    lower: Callable[..., Any]
    patterns: tuple[str, ...] = ()


Pass = Callable[[ir.Program, ir.Module, Masking], None]  # and what the lowering recorded


@dataclass(frozen=True)
class Pipeline:
    card: tuple[Recogniser, ...] = ()
    step: tuple[Recogniser, ...] = ()
    loop: tuple[Recogniser, ...] = ()
    recurrence: tuple[Recogniser, ...] = ()
    call: tuple[Recogniser, ...] = ()
    expression: tuple[Recogniser, ...] = ()
    passes: tuple[Pass, ...] = ()
    observes: bool = False  # every value a card names goes through `at.see` (cardc.lower.observe)

    @property
    def decodes(self) -> bool:
        """Whether a causal language model gets a KV cache (its attention reads one)."""
        return add_kv_cache in self.passes


def _fold_bias(program: ir.Program, top: ir.Module, masking: Masking) -> None:
    fold_bias(program)


def _factor_attention(program: ir.Program, top: ir.Module, masking: Masking) -> None:
    factor_attention(program)


def _share_invariants(program: ir.Program, top: ir.Module, masking: Masking) -> None:
    share_invariants(program)


HEADS_VECTORISED = Recogniser("heads vectorised", heads.find, heads.lower)

FUSED = Pipeline(
    card=(Recogniser("grouped-query attention", grouped.find, grouped.lower,
                     ("grouped_query_attention", "grouped_query_attention_biased")),),
    step=(Recogniser("attention core", attention.find, attention.lower),),
    loop=(Recogniser("attention heads", sdpa_heads.find, sdpa_heads.lower,
                     ("attention_head", "attention_head_cm", "cross_attention_head")),
          HEADS_VECTORISED),
    recurrence=(Recogniser("linear scan", recurrence.find, recurrence.lower),),
    call=(Recogniser("norm", norms.find, norms.lower,
                     ("layer_norm_ε", "layer_norm", "rms_norm", "rms_norm_offset",
                      "layer_norm_core_ε", "layer_norm_core", "rms_norm_core")),
          Recogniser("rotary", rotary.find_call, rotary.lower_call,
                     ("rope", "rope_pairs", "rope_by", "rope_pairs_by"))),
    expression=(Recogniser("partial rotary", rotary.find_partial, rotary.lower_partial,
                           ("rope", "rope_pairs", "rope_by", "rope_pairs_by")),
                Recogniser("GELU", gelu.find, gelu.lower),
                Recogniser("patches", patches.find, patches.lower),
                Recogniser("sparse experts", experts.find, experts.lower)),
    passes=(_fold_bias, _factor_attention, join_for_cache, add_kv_cache, _share_invariants),
)

LITERAL = Pipeline()

OBSERVED = Pipeline(loop=(HEADS_VECTORISED,), observes=True)


def pipeline(fuse: bool, observe: bool = False) -> Pipeline:
    return OBSERVED if observe else FUSED if fuse else LITERAL


def first(recognisers: tuple[Recogniser, ...], *subject: Any) -> Any:
    """What the first recogniser that matches `subject` and does not decline lowers it to."""
    for r in recognisers:
        found = r.find(r.patterns, *subject)
        if found is not None:
            lowered = r.lower(*subject, found)
            if lowered is not None and lowered is not False:
                return lowered
    return None
