"""RoPE recognised by its structure, not its spelling: a card that turns row t of X by the
angles (t − 1) ω, for frequencies ω it computes from its hyperparameters alone (a base
written as a number, as GPT-J's; Llama 3.1's rescaling), lowers to the file's rotate_half or
rotate_pairs, its angle tables made once from a generated `<Card>_frequencies` function; its
module, fused and literal, computes what the reference interpreter says the card means
(float64, values and gradients), and decodes through its cache as recomputation does."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import pytest
import torch

from cardc.build import checked, instantiate, model_cards, source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decodecheck import SIZES, check_incremental_decoding, token_inputs  # noqa: E402
from test_reproducers import Built, _randn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEADS = ROOT / "tests" / "cards" / "heads"
# card file → (its frequency card, the helper it lowers to)
CARDS = {"numeric_base_rotary": ("TurnPairs", "rotate_pairs"),
         "scaled_rotary": ("ScaledRoPE", "rotate_half")}


def _sources(stem: str) -> tuple[str, str]:
    path = f"tests/cards/heads/{stem}.card"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, checker, _ = checked([path], "cards")
        (alg,) = model_cards(lib, checker, [path])
        return source(checker, alg, fuse=True), source(checker, alg, fuse=False)


def _model(stem: str):
    """The card's fused module at the decoding walk's sizes, its weights far from their small
    initial values (positions then matter), and its vocabulary."""
    path = f"tests/cards/heads/{stem}.card"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, checker, _ = checked([path], "cards")
        (alg,) = model_cards(lib, checker, [path])
        model, _ = instantiate(checker, alg, {k: v for k, v in SIZES.items() if k in "VDHN"})
    model.vocabularies = [SIZES["V"]]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("stem", CARDS)
def test_computed_frequencies_lower_to_the_angle_tables(stem):
    card, helper = CARDS[stem]
    fused, literal = _sources(stem)
    functions = _functions(fused)
    assert card not in functions  # no step of the card is left: one rotation by tables
    freq = functions[f"{card}_frequencies"]
    # the frequencies' function reads its width and hyperparameters only: no X, no positions
    assert [a.arg for a in freq.args.args][-2:] == ["device", "dtype"]
    assert "X" not in {n.id for n in ast.walk(freq) if isinstance(n, ast.Name)}
    calls = [n for n in ast.walk(ast.parse(fused)) if isinstance(n, ast.Call) and
             isinstance(n.func, ast.Name) and n.func.id == helper]
    assert calls and all(isinstance(c.args[1], ast.Tuple) and
                         ast.unparse(c.args[1].elts[0]) == f"{card}_frequencies" for c in calls)
    assert "torch.cos" not in fused and "torch.cos" in literal and helper not in literal


def _card(stem: str) -> str:
    return (HEADS / f"{stem}.card").read_text(encoding="utf-8")


@pytest.mark.parametrize("stem", CARDS)
def test_computed_frequencies_agree_with_the_interpreter(stem, tmp_path):
    built = Built(tmp_path, _card(stem), V=11, D=16, H=2, N=2)
    x = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(3))
    built.agree(x, tokens=True)


@pytest.mark.parametrize("stem", CARDS)
def test_computed_frequencies_decode_through_the_cache(stem):
    model = _model(stem)
    check_incremental_decoding(model, token_inputs(model, 14, 2))


def test_the_frequencies_are_computed_once_per_table():
    """Every layer, queries and keys, and each decoded token read the same tables: the
    card's frequency steps run once."""
    model = _model("scaled_rotary")
    names = type(model).forward.__globals__  # the generated file's
    made = []
    plain = names["ScaledRoPE_frequencies"]

    def counted(*args):
        made.append(args)
        return plain(*args)

    names["TABLES"].clear()
    names["ANGLES"].clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(names, "ScaledRoPE_frequencies", counted)
        x = token_inputs(model, 9, 1)[0]
        with torch.no_grad():
            model(x)
            cache = model.new_cache()
            for t in range(1, 10):
                model(x[:, :t], cache=cache)
    assert len(made) == 1


def _llama3(theta: float, d: int, factor: float, low: float, high: float, old: int):
    """Llama 3.1's rescaled frequencies as transformers computes them (its rope_type 'llama3'),
    written out here in float64."""
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def test_the_rescaled_frequencies_are_llama_3_1s():
    fused, _ = _sources("scaled_rotary")
    names: dict = {}
    exec(compile("import math\nimport torch\n" + ast.unparse(_functions(fused)[
        "ScaledRoPE_frequencies"]), "<frequencies>", "exec"), names)  # noqa: S102
    names["real_type"] = lambda dtype: dtype
    for d in (8, 16, 64):
        got = names["ScaledRoPE_frequencies"](d, 500000.0, 8.0, 1.0, 4.0, 8192, "cpu",
                                              torch.float64)
        torch.testing.assert_close(got, _llama3(500000.0, d, 8.0, 1.0, 4.0, 8192),
                                   rtol=1e-12, atol=0)


ROTARY = """\
Algorithm: Y ← Model(X | W)
/* X projected, then turned. */
Input: X ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: d ∈ ℕ
Parameters: W ∈ ℝ^{d×d}
1 return Y = Turn(X W)

Algorithm: Y ← Turn(X)
/* Rotate-half by the frequencies ω. */
Input: X ∈ ℝ^{T×d}
Output: Y ∈ ℝ^{T×d}
Hyperparameters: d ∈ ℕ
1 for i ∈ [d/2] : ω[i] ← FREQUENCY
2 for t ∈ [T] : Φ[t, :] ← (t − 1) ω
3 X_1 ← X[:, 1 : d/2]
4 X_2 ← X[:, d/2 + 1 : d]
5 return Y = [X_1 ⊙ cos(Φ) − X_2 ⊙ sin(Φ), X_2 ⊙ cos(Φ) + X_1 ⊙ sin(Φ)]
"""


@pytest.mark.parametrize("frequency, fused", [
    ("1/(1 + i)²", True),  # any function of the hyperparameters and the plane
    ("10000^{−2 (i − 1)/d} · X[1, 1]", False),  # reads X: not a frequency
    ("1/(T + i)", False),  # reads the positions' count: not a frequency
])
def test_only_frequencies_of_the_hyperparameters_are_tables(frequency, fused, tmp_path):
    text = ROTARY.replace("FREQUENCY", frequency)
    built = Built(tmp_path, text, d=6)
    built.agree(_randn(5, 6))
    path = tmp_path / "card.card"
    lib, checker, _ = checked([str(path)], None)
    (alg,) = model_cards(lib, checker, [str(path)])
    assert ("rotate_half(" in source(checker, alg, fuse=True)) == fused


DEFAULT_FIRST = """\
Algorithm: y ← Model(x | w)
/* A function card whose hyperparameter with a default comes before one without. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: w ∈ ℝ^{D}
1 return y = Scale(x ⊙ w | b = 3)

Algorithm: y ← Scale(x | a, b)
/* x scaled by a b. */
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ, a ∈ (0, ∞) = 2, b ∈ (0, ∞)
1 return y = a b x
"""


def test_a_function_takes_a_hyperparameter_with_a_default_before_one_without(tmp_path):
    # was: `def Scale(x, a=2, b)`, which Python does not parse (an internal error)
    built = Built(tmp_path, DEFAULT_FIRST, D=3)
    x = _randn(3)
    torch.testing.assert_close(built.agree(x), 6 * x * built.literal.w.detach())


@pytest.mark.parametrize("stem", ["scaled_rotary", "interleaved_rotary"])
def test_rotary_inside_the_scores_turns_each_of_queries_and_keys_once_per_step(stem):
    """`S ← RoPE(Q) RoPE(K)^⊺/√d`, the rotation written inside the score line: each layer
    turns its queries once and its keys once, in a forward over a prompt and in each decoded
    step (the queries were turned a second time for the cache's mask), and decoding still
    equals recomputation."""
    model = _model(stem)
    names = type(model).forward.__globals__  # the generated file's names
    helper = next(h for h in ("rotate_half", "rotate_pairs") if h in names)
    calls = []
    turn = names[helper]

    def counted(*args, **kwargs):
        calls.append(args[0].shape[-2])
        return turn(*args, **kwargs)

    x = torch.randint(0, SIZES["V"], (2, 9), generator=torch.Generator().manual_seed(5))
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setitem(names, helper, counted)
        cache = model.new_cache()
        model(x[:, :8], cache=cache)
        assert calls == [8] * 2 * model.N, calls
        calls.clear()
        model(x[:, 8:], cache=cache)
        assert calls == [1] * 2 * model.N, calls
    check_incremental_decoding(model, [x])
