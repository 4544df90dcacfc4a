"""Values of the decoded rows' positions that a caller gives its attention (T5's buckets):

    β ← CappedDistance(X | N_b)      ▷ reads only how many rows X has: β ∈ ℕ^{T×T}
    … Block(X, β, W_b | θ_ℓ) …        ▷ every call gives it on, down to the heads
    ∀t, t′: S[t, t′] ← S[t, t′] + w[β[t, t′]]

Under a KV cache, the top computes such a value over the cached positions and the new ones
and reads it at the new rows (cardc.lower.calls.positioned), so each head's bias follows the
decoded positions, as a position table does; the heads read it as it comes. A value of
positions the analysis cannot trace to such a call leaves the model recomputing, never
decoding wrong. The card's module, fused and literal, computes what the reference interpreter
says it means (float64, values and gradients); T5 is walked in tests/test_decoding.py."""

from __future__ import annotations

from pathlib import Path

import torch
from decodecheck import check_incremental_decoding
from test_reproducers import Built

import cardc
from cardc.build import checked, model_cards, source
from cardc.library import library_roots

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "tests/cards/decoding/given_buckets.card"
SIZES = dict(V=50, D=32, H=4, N=2, N_b=6)


def _moved(model: torch.nn.Module) -> torch.nn.Module:
    """Parameters far from their small initial values, as trained ones are: positions matter."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def test_the_card_agrees_with_the_interpreter_fused_and_literal(tmp_path):
    built = Built(tmp_path, CARD.read_text(encoding="utf-8"), **SIZES)
    x = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    built.agree(x, tokens=True)


def test_a_value_of_positions_given_to_the_heads_follows_the_decoded_rows(tmp_path):
    model = _moved(cardc.model(str(CARD), **SIZES))
    assert model.analysis.decodes and hasattr(model, "generate")
    x = torch.randint(0, 50, (2, 14), generator=torch.Generator().manual_seed(2))
    check_incremental_decoding(model, [x])  # distances past N_b − 1 share the last bucket
    code = _source(tmp_path, CARD.read_text(encoding="utf-8"))
    # made over the cached positions and the new ones, read at the new rows
    assert "return CappedDistance(X, N_b=self.N_b, past=past)" in code and \
        "cache.positioned(over, X.shape[-2])" in code
    assert "def CappedDistance(X, N_b, past=0):" in code and "T = past + X.shape[-2]" in code


def test_a_value_of_positions_the_top_computes_itself_leaves_the_model_recomputing(tmp_path):
    """Buckets the top computes in its own steps (no call that reads only X's size) are not
    traced to the decoded positions: the heads would read them over the new rows only, so the
    model gets no cache, and still computes what the card means."""
    text = CARD.read_text(encoding="utf-8").replace(
        "2 β ← CappedDistance(X | N_b = N_b)  ▷ β ∈ ℕ^{T×T}, made once for every block",
        "2 ∀t ∈ [T], t′ ∈ [T]: β[t, t′] ← 1 + min(max(t − t′, 0), N_b − 1)")
    assert text != CARD.read_text(encoding="utf-8")
    path = tmp_path / "own.card"
    path.write_text(text, encoding="utf-8")
    model = cardc.model(str(path), **SIZES)
    assert not model.analysis.decodes and not hasattr(model, "new_cache")
    Built(tmp_path, text, **SIZES).agree(torch.randint(0, 50, (2, 9)), tokens=True)


def _source(tmp_path: Path, text: str) -> str:
    path = tmp_path / "card.card"
    path.write_text(text, encoding="utf-8")
    lib, checker, _ = checked([str(path)], library_roots([str(path)], None))
    (alg,) = model_cards(lib, checker, [str(path)])
    return source(checker, alg, fuse=True)
