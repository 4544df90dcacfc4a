"""A learned position table read by the decoded length, and the KV cache: the rows a card reads
as `W_p[k + 1 : T + k]` (k a number or the hyperparameters', however the bounds are written)
are offset by the tokens cached; a table read in any other way, or by a sub-card given decoded
values, leaves the model without a cache (it decodes by recomputing), never with one that
reads the first rows again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from decodecheck import check_incremental_decoding, check_static_decoding

from cardc.build import build_model
from cardc.runtime.sample import generate

HEAD = """Algorithm: P ← Positions(x | θ)
/* Learned positions from row o + 1, one causal attention. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D, ctx ∈ ℕ; o ∈ ℕ = 2, the rows before position 1
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings.
    W_p ∈ ℝ^{(ctx + o)×D}, learned positions, from row o + 1.
1 EMBED
2 S ← E E^⊺/√D
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return P = softmax(S) E W_e^⊺
"""

IN_A_SUB_CARD = """Algorithm: P ← SubPositions(x | θ)
/* Positions added by a sub-card given the decoded tokens' embeddings. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D, ctx ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings.
    θ_pos, the positions.
1 E ← AddPositions(W_e[x] | θ_pos)
2 S ← E E^⊺/√D
3 ∀t, t′, if t′ > t then S[t, t′] ← −∞
4 return P = softmax(S) E W_e^⊺

Algorithm: Y ← AddPositions(X | θ)
/* Learned positions. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, ctx ∈ ℕ
Parameters: θ consisting of:
    W_p ∈ ℝ^{ctx×D}
1 return Y = X + W_p[1 : T]
"""


def _model(tmp_path: Path, text: str):
    card = tmp_path / "positions.card"
    card.write_text(text, encoding="utf-8")
    model = build_model(str(card), None, dict(V=13, D=8, ctx=12)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # far from their initial values, as trained ones: positions matter
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize(("embed", "longest"), [
    ("E ← W_e[x] + W_p[o + 1 : T + o]", 12), ("E ← W_e[x] + W_p[1 + o : o + T]", 12),
    ("E ← W_e[x] + W_p[o : T + o − 1]", 13),  # from row o: ctx + o rows hold ctx + 1 positions
    ("for t ∈ [T] : E[t, :] ← W_e[x[t]] + W_p[t + o]", 12)])  # token by token
def test_rows_from_a_hyperparameters_offset_follow_the_cache(tmp_path, embed, longest):
    model = _model(tmp_path, HEAD.replace("EMBED", embed))
    assert model.max_seq_len == longest
    x = [torch.randint(0, 13, (2, 11), generator=torch.Generator().manual_seed(1))]
    check_incremental_decoding(model, x)
    check_static_decoding(model, x)
    too_long = longest + 1
    with pytest.raises(ValueError, match=f"sequence length {too_long} exceeds the model's "
                                         f"{longest} positions"):
        model(torch.zeros(1, too_long, dtype=torch.long))


def test_positions_a_sub_card_reads_leave_the_model_without_a_cache(tmp_path):
    """The decoding pass offsets the positions the model's own steps read; a sub-card that
    reads W_p[1 : T] of the decoded tokens would read rows 1… again: no cache is offered."""
    model = _model(tmp_path, IN_A_SUB_CARD)
    assert not hasattr(model, "new_cache")
    x = torch.randint(0, 13, (1, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = generate(model, x, max_new_tokens=5, temperature=0)
        for n in range(4, 9):  # each token is the one a forward over all before it picks
            assert out[0, n] == model(out[:, :n])[0, -1].argmax()


def test_a_map_reads_a_parameter_at_no_other_position(tmp_path, capsys):
    """W_p[t − 1] would read row 0 at t = 1, and X[t + 1] ties iterations: refused, located."""
    from cardc.cli import main

    for embed in ("for t ∈ [T] : E[t, :] ← W_e[x[t]] + W_p[t − 1]",
                  "for t ∈ [T] : E[t, :] ← W_e[x[t]] + W_p[t + t]"):
        card = tmp_path / "bad.card"
        card.write_text(HEAD.replace("EMBED", embed), encoding="utf-8")
        assert main(["build", str(card), "--out", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{card}:9:") and "a map over 't' reads a value at 't', and a " \
            "parameter at 't + k' too, never another position" in err


STACKED = """Algorithm: P ← StackedLM(x | θ)
/* Each token's embedding through E matrices of one stacked parameter, summed with weights. */
Input: x ∈ {1..V}^{T}, token IDs.
Output: P ∈ ℝ^{T×V}
Hyperparameters: V, D, E ∈ ℕ
Parameters: θ includes all of the following parameters:
    W_e ∈ ℝ^{V×D}, token embeddings.
    θ^m, the mixture.
1 X ← W_e[x]
2 for t ∈ [T] : Y[t, :] ← Mix(X[t, :] | θ^m)
3 return P = Y W_e^⊺

Algorithm: y ← Mix(x | θ)
/* E matrices, one slice each of a stacked parameter, applied to one token and weighed by w. */
Input: x ∈ ℝ^{D}, one token.
Output: y ∈ ℝ^{D}
Hyperparameters: D, E ∈ ℕ
Parameters: θ consisting of:
    W ∈ ℝ^{E×D×D}, the matrices.
    w ∈ ℝ^{E}, their weights.
1 for e ∈ [E] : Z[:, e] ← W[e, :, :] x  ▷ Z ∈ ℝ^{D×E}
2 return y = Σ_{e=1}^{E} w[e] · Z[:, e]
"""


def test_a_map_over_a_stacked_parameters_slices_is_refused_not_miscomputed(tmp_path, capsys):
    """`W[e, :, :] x` in a map over e, inside a map over tokens: not vectorised yet, so a
    located error at build (a draft broadcast the experts against the examples)."""
    from cardc.cli import main

    card = tmp_path / "stacked.card"
    card.write_text(STACKED, encoding="utf-8")
    assert main(["build", str(card), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith(f"{card}:21:")
    assert not (tmp_path / "out").exists()
