"""The reference interpreter (cardc.interpret): each construct on small hand cards whose values
are computed by hand or with plain torch here, then every model card of the repository run by
the interpreter and by its generated module, fused and literal, on random inputs and weights
in float64: outputs and gradients with respect to every parameter agree to rtol 1e-9,
atol 1e-10."""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import pytest
import torch

from cardc import syntax as s
from cardc.build import checked, instantiate, model_cards
from cardc.checker import split_name
from cardc.diagnostics import CardError
from cardc.interpret import InterpretError, Program, interpret
from cardc.library import library_roots
from cardc.names import identifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cardparams import card_params  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RTOL, ATOL = 1e-9, 1e-10  # float64: the two sides differ by rounding alone


def _card(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.card"
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ constructs, by hand


def test_index_is_one_based_and_a_slice_includes_its_end(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Pick(x)
Input: x ∈ ℝ^{5}
Output: y ∈ ℝ^{3}
1 return y = x[2 : 4] + x[1]
""")
    x = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0], dtype=torch.float64)
    y = interpret(card, inputs=(x,), params={})
    assert y.tolist() == [30.0, 40.0, 50.0]  # x[2], x[3], x[4] plus x[1] = 10


def test_a_sum_runs_its_bounds_inclusive(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Tail(x)
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ
Hyperparameters: D ∈ ℕ
1 return y = Σ_{i=2}^{D} x[i] · i
""")
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert interpret(card, inputs=(x,), params={}, D=4).item() == 2 * 2 + 3 * 3 + 4 * 4


def test_iverson_brackets_are_one_and_zero(tmp_path):
    card = _card(tmp_path, """Algorithm: Y ← Lower(X)
Input: X ∈ ℝ^{T×T}
Output: Y ∈ ℝ^{T×T}
1 Y ← X
2 ∀t, t′: Y[t, t′] ← X[t, t′] · [[t′ ≤ t]]
3 return Y
""")
    X = torch.arange(1.0, 10.0, dtype=torch.float64).reshape(3, 3)
    Y = interpret(card, inputs=(X,), params={})
    assert Y.tolist() == [[1, 0, 0], [4, 5, 0], [7, 8, 9]]


def test_sigmoid_keeps_its_gradient_a_number_far_from_zero(tmp_path):
    """σ(−800) is 0 in float64 and its gradient σ(1 − σ) is 0: not nan from e^{800}
    overflowing to ∞ and meeting a 0."""
    card = _card(tmp_path, """Algorithm: y ← Gate(x)
Input: x ∈ ℝ^{4}
Output: y ∈ ℝ^{4}
1 return y = σ(x)
""")
    x = torch.tensor([-800.0, -30.0, 0.0, 40.0], dtype=torch.float64, requires_grad=True)
    y = interpret(card, inputs=(x,), params={})
    want = torch.sigmoid(x.detach())
    torch.testing.assert_close(y, want, rtol=1e-15, atol=0)
    y.sum().backward()
    e = torch.exp(-x.detach().abs())
    torch.testing.assert_close(x.grad, e / (1 + e) ** 2, rtol=1e-14, atol=0)  # σ(1 − σ)


def test_a_real_stored_into_a_new_vector_keeps_every_digit(tmp_path):
    """`ω[i] ← θ^{−2(i − 1)/d}` makes ω from Python numbers: float64 ones, not torch's default
    float32 (which was 1e-8 off RoPE's frequencies)."""
    card = _card(tmp_path, """Algorithm: y ← Freq(x)
Input: x ∈ ℝ^{d}
Output: y ∈ ℝ^{d/2}
Hyperparameters: d ∈ ℕ
1 for i ∈ [d/2] : ω[i] ← (7)^{−2 (i − 1)/d}
2 return y = x[1 : d/2] ⊙ ω
""")
    x = torch.ones(6, dtype=torch.float64)
    y = interpret(card, inputs=(x,), params={}, d=6)
    assert y.tolist() == [7 ** (-2 * i / 6) for i in range(3)]


def test_a_loop_carried_recurrence_runs_in_order(tmp_path):
    card = _card(tmp_path, """Algorithm: h ← Scan(x)
Input: x ∈ ℝ^{T}
Output: h ∈ ℝ^{T}
1 h ← x
2 for t = 2, …, T do
3     h[t] ← 0.5 · h[t − 1] + x[t]
4 end
5 return h
""")
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert interpret(card, inputs=(x,), params={}).tolist() == [1.0, 2.5, 5.25]


def test_a_sub_card_call_binds_parameters_and_hyperparameters(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Outer(x | θ)
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
Parameters: θ consisting of:
    γ^1 ∈ ℝ^{D}, β^1 ∈ ℝ^{D}
1 return y = Affine(x | γ^1, β^1, c = 2)

Algorithm: e ← Affine(e | γ, β)
Input: e ∈ ℝ^{D}
Output: e ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ; c ∈ ℝ = 1
Parameters: γ, β ∈ ℝ^{D}
1 return e = c · e ⊙ γ + β
""")
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    params = {"θ": {"γ^1": torch.tensor([3.0, 4.0], dtype=torch.float64),
                    "β^1": torch.tensor([0.5, -1.0], dtype=torch.float64)}}
    y = interpret(card, inputs=(x,), params=params, D=2)
    assert y.tolist() == [2 * 1 * 3 + 0.5, 2 * 2 * 4 - 1.0]


def test_a_family_over_layers_applies_each_member_in_turn(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Stack(x | θ)
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D, L ∈ ℕ
Parameters: θ includes all of the following parameters:
    For l ∈ [L]:
        W^1_l ∈ ℝ^{D×D}, b^1_l ∈ ℝ^{D}
1 for l = 1, …, L do
2     x ← ReLU(W^1_l x + b^1_l)
3 end
4 return y = x
""")
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(3, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    bs = [torch.randn(3, generator=g, dtype=torch.float64) for _ in range(2)]
    x = torch.randn(3, generator=g, dtype=torch.float64)
    y = interpret(card, inputs=(x,), params={"θ": {"W^1_l": ws, "b^1_l": bs}}, D=3, L=2)
    # member l of W^1_l, not member 1 (the superscript 1 is part of the name)
    expected = torch.relu(ws[1] @ torch.relu(ws[0] @ x + bs[0]) + bs[1])
    torch.testing.assert_close(y, expected, rtol=RTOL, atol=ATOL)


def test_a_transposed_vector_times_a_vector_is_a_number(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Dot(q, k)
Input: q, k ∈ ℝ^{D}
Output: y ∈ ℝ
Hyperparameters: D ∈ ℕ
1 return y = q^⊺ k/2
""")
    q, k = (torch.tensor(v, dtype=torch.float64) for v in ([1.0, 2.0], [3.0, 4.0]))
    y = interpret(card, inputs=(q, k), params={}, D=2)
    assert y.shape == () and y.item() == (3 + 8) / 2


def test_softmax_is_over_the_first_index_of_a_column_major_card():
    program = Program(ROOT / "cards/paper/attention.card")
    g = torch.Generator().manual_seed(0)
    env = {"d_x": 3, "d_z": 3, "d_attn": 2, "d_out": 2, "ℓ_x": 4, "ℓ_z": 4}
    params = program.random_parameters(env, g)
    X = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))  # Mask[t_z, t_x] = [[t_z ≤ t_x]]
    out = program(X, X, params=params, hypers={**env, "Mask": mask})
    w = params["W_qkv"]
    q = w["W_q"] @ X + w["b_q"][:, None]
    k = w["W_k"] @ X + w["b_k"][:, None]
    v = w["W_v"] @ X + w["b_v"][:, None]
    s = (k.T @ q).masked_fill(~mask, -math.inf)
    expected = v @ torch.softmax(s / math.sqrt(2), dim=0)
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("card", "expected"), [
    ("gather", [0.5, 20.0, -350.0]),  # x ⊙ w: p[i] = i picks w[i]
    ("threshold_map", [0.0, 11.0, 0.0]),  # Σ_j [[x[i] ≥ j]] w[j]: none, w[1] + w[2], none
    ("sign", [1.0, 10.0, -100.0]),  # sign(x) ⊙ w
])
def test_computed_indices_maps_and_truth_values_follow_the_math(card, expected):
    program = Program(ROOT / "tests" / "interpret" / f"{card}.card")
    env = program.hyperparameters(**{k: 3 for k in ("n", "m") if k in program.sig.hypers})
    x = torch.tensor([0.5, 2.0, -3.5], dtype=torch.float64)
    w = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    assert program(x, params={"w": w}, hypers=env).tolist() == expected


def test_an_unsupported_construct_is_named_at_its_place(tmp_path):
    card = _card(tmp_path, """Algorithm: y ← Draw(x)
Input: x ∈ ℝ^{D}
Output: y ∈ ℝ^{D}
Hyperparameters: D ∈ ℕ
1 y ← x or −x randomly with probability 0.5 or 0.5
2 return y
""")
    with pytest.raises(InterpretError, match=r"c\.card:5:\d+: the interpreter does not run .*Choice"):
        interpret(card, inputs=(torch.zeros(2, dtype=torch.float64),), params={}, D=2)


def test_a_card_with_errors_is_refused(tmp_path):
    card = _card(tmp_path, "Algorithm: y ← Bad(x)\nInput: x ∈ ℝ^{D}\nOutput: y ∈ ℝ^{D}\n"
                           "1 return y = x W\n")
    with pytest.raises(CardError):
        Program(card)


# ------------------------------------------------------------------ differential

# the smallest sizes each model takes, by hyperparameter name (where a card declares it)
# (string keys: Python reads the identifier ℓ_max as l_max)
SMALL = {"n": 4, "m": 3, "V": 13, "D": 8, "H": 2, "H_kv": 1, "d": 4, "D_f": 6, "N": 2, "ctx": 6, "w": 2,
         "types": 2, "d_r": 2, "D_c": 3, "L": 2, "L_enc": 1, "L_dec": 2, "d_e": 4, "d_mlp": 6, "d_f": 3,
         "N_V": 9, "ℓ_max": 6, "d_attn": 2, "d_mid": 2, "d_in": 3, "d_out": 2, "D_s": 5}
T = 4  # positions of each example; B examples at once through the module
B = 2
DIFFERENTIAL = sorted([*ROOT.glob("cards/*.card"), *ROOT.glob("cards/paper/*.card"),
                       *ROOT.glob("tests/cards/**/*.card"), *ROOT.glob("tests/lang/*.card"),
                       *ROOT.glob("tests/interpret/*.card")])
# where the interpreter and a lowering disagree: a defect of that lowering, stated exactly
DISAGREE: dict[str, str] = {}
# models the comparison does not run yet, and why
UNSUPPORTED: dict[str, str] = {}


@functools.cache
def _checked(rel: str):
    """A card file's library, checked once for all its models (run from the repository)."""
    return checked([rel], library_roots([rel], None))[:2]


def _models() -> list[tuple[str, str]]:
    out = []
    for path in DIFFERENTIAL:
        rel = str(path.relative_to(ROOT))
        lib, checker = _checked(rel)
        out += [(rel, alg.label) for alg in model_cards(lib, checker, [rel])]
    return out


def _cases():
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        models = _models()
    for rel, name in models:
        marks = [pytest.mark.xfail(strict=True, reason=DISAGREE[name])] if name in DISAGREE \
            else [pytest.mark.skip(reason=UNSUPPORTED[name])] if name in UNSUPPORTED else []
        yield pytest.param(rel, name, marks=marks, id=name)


def _inputs(program: Program, env: dict, g: torch.Generator):
    """B examples for the module (0-based token IDs, row-major) and the same for the
    interpreter (1-based, in the card's layout)."""
    for_module, for_card = [], []
    sizes = {**env, "T": T, "T_z": T + 1, "ℓ": T, "ℓ_x": T, "ℓ_z": T + 1}
    for name, ty in program.sig.inputs:
        for sym in {x for d in ty.shape for x in d.symbols} - set(sizes):
            sizes[sym] = T  # a length the card names by its input, |x|
        shape = [int(d.evaluate(sizes)) for d in ty.shape]
        if ty.elem == "ℕ" and ty.vocab is None and not shape:  # a position ℓ ∈ [n], from 1
            x = torch.randint(1, _bound(program, name, env) + 1, (B,), generator=g)
            for_module.append(x)
            for_card.append([int(v) for v in x])
        elif ty.elem == "ℕ":
            vocab = int(ty.vocab.evaluate(env))
            x = torch.randint(0, vocab, (B, *shape), generator=g)
            for_module.append(x)
            for_card.append([x[b] + 1 for b in range(B)])
        elif _is_family(program, name):  # e_t, t ∈ [T]: the module takes its members as rows
            x = torch.randn(B, T, *shape, generator=g, dtype=torch.float64)
            for_module.append(x)
            for_card.append([list(x[b]) for b in range(B)])
        else:
            x = torch.randn(B, *shape, generator=g, dtype=torch.float64)
            column = program.sig.layout == "column" and x.dim() == 3
            for_module.append(x.mT if column else x)
            for_card.append(list(x))
    return for_module, for_card


def _is_family(program: Program, name: str) -> bool:
    """An input `e_t` whose subscript a step quantifies over (∀t, Σ_t): a family of vectors."""
    bound = {v for n in s.nodes(program.alg.steps) if isinstance(n, (s.ForAll, s.Sum))
             for v in (n.vars if isinstance(n, s.ForAll) else (n.index,))}
    return any(v in bound for _, v in split_name(name)[1])


@pytest.mark.parametrize(("rel", "name"), list(_cases()))
def test_interpreter_equals_fused_and_literal_modules(rel, name, monkeypatch):
    monkeypatch.chdir(ROOT)
    _compare(rel, name)


def _compare(rel: str, name: str) -> None:
    """The model `name` of the card file `rel`, small, in float64: its interpreted values and
    gradients, and those of its literal and fused modules holding the same weights."""
    lib, checker = _checked(rel)
    alg = next(a for a in model_cards(lib, checker, [rel]) if a.label == name)
    program = Program.of(lib, checker, alg)
    given = {k: v for k, v in SMALL.items()
             if k in program.sig.hypers and k not in program.sig.definitions}
    preset = "tiny" if any(p.name == "tiny" for p in program.alg.presets) else None
    env = program.hyperparameters(preset, **given)
    g = torch.Generator().manual_seed(0)
    values = {identifier(k): v for k, v in env.items()}
    literal = instantiate(checker, alg, values, fuse=False)[0].double().eval()
    fused = instantiate(checker, alg, values, fuse=True)[0].double().eval()
    with torch.no_grad():
        for p in literal.parameters():  # gains and biases too, so that none hides a mistake
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    fused.load_state_dict(literal.state_dict())
    for_module, for_card = _inputs(program, env, g)
    params = card_params(checker, alg, literal)
    column = program.sig.layout == "column"
    several = bool(program.sig.more)  # a card of several outputs: each compared, in order
    runs = [program(*(x[b] for x in for_card), params=params, hypers=env) for b in range(B)]
    runs = [y if several else (y,) for y in runs]
    want = [torch.stack([y[k].mT if column and y[k].dim() == 2 else y[k] for y in runs])
            for k in range(len(runs[0]))]
    weights = [torch.randn(w.shape, generator=g, dtype=torch.float64) for w in want]
    sum((w * v).sum() for w, v in zip(want, weights, strict=True)).backward()
    want_grads = {n: _grad(p) for n, p in literal.named_parameters()}
    for module in (literal, fused):
        module.zero_grad()
        got = module(*for_module)
        got = list(got) if several else [got[0] if isinstance(got, tuple) else got]
        assert len(got) == len(want)
        for one, expected in zip(got, want, strict=True):
            torch.testing.assert_close(one, expected.detach(), rtol=RTOL, atol=ATOL)
        sum((w * v).sum() for w, v in zip(got, weights, strict=True)).backward()
        for n, p in module.named_parameters():
            torch.testing.assert_close(_grad(p), want_grads[n], rtol=RTOL, atol=ATOL, msg=n)


def _bound(program: Program, name: str, env: dict) -> int:
    """n of an input declared `ℓ ∈ [n]`."""
    decl = next(d for d in program.alg.decls("Input") if name in getattr(d, "names", ()))
    assert isinstance(decl.type, s.Finite) and isinstance(decl.type.size, s.Name)
    return int(env[decl.type.size.id])


def _grad(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient; none where the output does not read it (BERT's pooler)."""
    return p.grad.clone() if p.grad is not None else torch.zeros_like(p)
