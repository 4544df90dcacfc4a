"""The structure of the lowering (cardc/lower): its pipeline of fusion rules and passes is
declared in one place, the state of a card's lowering declares what nested bodies share, no
class is too long to read, and the analyses the rest of cardc needs are recorded once."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import torch

from cardc import ir
from cardc.build import build_model, checked, find_card, source
from cardc.library import library_roots
from cardc.lower import Lowering
from cardc.lower.intrinsics import patterns
from cardc.lower.pipeline import FUSED, LITERAL, pipeline
from cardc.lower.state import COPIED, FRESH, SHARED, BodyState
from cardc.lower.steps import Body
from cardc.lower.values import Scope
from cardc.runtime.train import predicts_next_token

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ("card", "step", "loop", "call", "expression")


def _model(card: str):
    path = str(ROOT / card)
    lib, checker, _ = checked([path], library_roots([path], None))
    return checker, find_card(lib, checker, path, None)


def test_the_literal_pipeline_is_empty_and_the_fused_one_declares_its_patterns():
    assert pipeline(False) is LITERAL and pipeline(True) is FUSED
    assert all(getattr(LITERAL, hook) == () for hook in HOOKS) and LITERAL.passes == ()
    for hook in HOOKS:
        for rule in getattr(FUSED, hook):
            assert callable(rule.find) and callable(rule.lower), rule.name
            assert set(rule.patterns) <= set(patterns()), rule.name
    assert [p.__name__ for p in FUSED.passes] == [
        "_fold_bias", "_factor_attention", "join_for_cache", "add_kv_cache", "_share_invariants"]


def test_every_field_of_a_body_declares_what_a_nested_body_gets():
    checker, alg = _model("cards/gpt2.card")
    low = Lowering(checker)
    body = Body(low, alg, checker.info(alg), Scope(), lambda sym: None, "B")
    body.loop_index["l"] = None
    child = body.child()
    for f in fields(BodyState):
        how = f.metadata["child"]
        assert how in (SHARED, COPIED, FRESH), f.name
        mine, theirs = getattr(body, f.name), getattr(child, f.name)
        if how == SHARED:
            assert theirs is mine, f.name
        elif how == COPIED:
            assert theirs == mine and theirs is not mine, f.name
        elif f.init and isinstance(mine, (list, dict, set)):
            assert theirs is not mine, f.name
    child.loop_index["h"] = None
    assert "h" not in body.loop_index


def test_no_class_of_the_lowering_is_over_500_lines():
    for path in (ROOT / "cardc" / "lower").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno < 500, f"{path.name}: {node.name}"


def test_analyses_are_recorded_with_the_model_and_its_metadata():
    gpt2 = build_model(str(ROOT / "cards/gpt2.card"), "tiny")
    assert (gpt2.analysis.decodes, gpt2.analysis.causal) == (True, True)
    assert gpt2.card_meta["analysis"] == {"decodes": True, "causal": True, "likelihood": True}
    paper = build_model(str(ROOT / "cards/paper/dtransformer.card"), "tiny")
    assert (paper.analysis.decodes, paper.analysis.causal) == (False, True)  # by its mask rule
    encoder = build_model(str(ROOT / "cards/paper/etransformer.card"), "tiny", name="ETransformer")
    assert not encoder.analysis.causal  # Mask ≡ 1: every position reads every other
    literal = build_model(str(ROOT / "cards/gpt2.card"), "tiny", fuse=False)
    assert literal.analysis.causal and not literal.analysis.decodes  # its own mask rules


def test_whether_a_model_decodes_is_read_from_its_lowering_not_lowered_again(monkeypatch):
    checker, alg = _model("cards/gpt2.card")
    assert Lowering(checker).model(alg).analysis.decodes
    lowered = []
    monkeypatch.setattr(Lowering, "model", lambda self, a: lowered.append(a))
    assert Lowering(checker).decodes(alg) and not lowered
    assert not Lowering(checker, fuse=False).decodes(alg) and not lowered


def test_the_literal_lowering_proves_causality_from_its_own_masks():
    """`fuse=False` fuses no attention, but each core's mask rules are recorded as its steps are
    lowered one by one: a literal decoder (a hyperparameter's rule given by its caller, a
    window, a soft cap) is a causal language model, which generic recipes and eval accept, and
    decodes without a cache; BERT, whose every position reads every other, is not causal."""
    for card in ("cards/gpt2.card", "cards/mistral.card", "cards/gemma2.card"):
        literal = build_model(str(ROOT / card), "tiny", fuse=False)
        assert predicts_next_token(literal) and not literal.analysis.decodes, card
        assert literal.card_meta["analysis"] == {"decodes": False, "causal": True,
                                                 "likelihood": True}
    gpt2 = build_model(str(ROOT / "cards/gpt2.card"), "tiny", fuse=False).eval()
    x = torch.randint(0, 256, (2, 12))
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 1) % 256
    with torch.no_grad():  # and it is: no logit of the first 8 positions reads a later token
        assert torch.equal(gpt2(x)[:, :8], gpt2(y)[:, :8])
    assert not predicts_next_token(build_model(str(ROOT / "cards/bert.card"), "tiny", fuse=False))


def test_lowering_state_stays_off_the_program():
    """What only lowering needs (attention masks numbered as they are made, whether an
    attention reads a cache) is the lowering's own, not the IR's: each lowering numbers its
    masks from 1, and the recorded analysis says whether the model decodes."""
    assert not {"uncached", "masks"} & {f.name for f in fields(ir.Program)}
    checker, alg = _model("cards/mistral.card")
    first, second = Lowering(checker), Lowering(checker)
    first.model(alg)
    second.model(alg)
    assert first.mask_sites == second.mask_sites == 1  # one window rule, shared by the layers
    assert source(checker, alg) == source(checker, alg)


def test_a_training_cards_updates_per_example_are_counted_where_fixed():
    from cardc.lower.cards import _per_example

    assert _per_example([1], 1) == 1 and _per_example([2], 2) == 2
    assert _per_example([2, 2], 4) == 2  # two loops over examples, alike
    assert _per_example([None], 1) is None  # an update under a condition
    assert _per_example([0], 1) is None  # once per epoch, outside the loop over examples
    assert _per_example([1, 2], 3) is None
    assert _per_example([], 0) == 1  # no update: nothing to count
