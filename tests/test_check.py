"""The checker: every card in cards/ is clean; bad cards get exact, golden diagnostics."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cardc import syntax as s
from cardc.build import checked, instantiate
from cardc.checker import check
from cardc.cli import main
from cardc.dims import Dim
from cardc.info import summarize
from cardc.library import load
from cardc.names import identifier
from cardc.types import BundleTy, FamilyTy, SetTy, Ty

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.card"))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_every_card_checks_clean(capsys):
    """`cardc check cards` on a fresh clone: every card of the library, nothing to report."""
    assert main(["check", "cards"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("ok:") and captured.err == ""


def test_the_paper_as_printed_reports_exactly_its_two_defects(capsys):
    """tests/golden/faithful keeps Algorithms 8 and 9 as the paper prints them (cards/paper
    holds them corrected), checked against the library: these two diagnostics are all."""
    assert main(["check", "tests/golden/faithful"]) == 1
    err = capsys.readouterr().err
    assert err == (ROOT / "tests" / "golden" / "faithful.expected").read_text(encoding="utf-8")
    assert err.count("error:") == 2 and err.endswith("2 errors\n")


@pytest.mark.parametrize("card", GOLDEN, ids=lambda p: p.stem)
def test_golden_diagnostics(card, capsys):
    code = main(["check", str(card.relative_to(ROOT))])
    err = capsys.readouterr().err
    assert code == 1
    assert err == card.with_suffix(".expected").read_text(encoding="utf-8")


def _sig(name):
    lib, _ = load(["cards"])
    checker, diags = check(lib)
    assert not diags.errors
    return checker.infos[id(lib.find(name))].sig


def test_a_scalar_a_call_leaves_unset_keeps_its_declared_type():
    """Gemma2Block gives its attention no scale and no soft cap: s and c_attn become its own
    hyperparameters, numbers in (0, ∞) as SoftCappedAttention declares them, not sizes, and
    its generated module takes them as floats."""
    sig = _sig("Gemma2Block")
    assert sig.hypers["s"] == sig.hypers["c_attn"] == Ty(elem="ℝ")
    tree = ast.parse((ROOT / "generated" / "gemma2.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Gemma2Block")
    init = next(n for n in block.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    types = {a.arg: ast.unparse(a.annotation) for a in init.args.args if a.annotation}
    assert types["s"] == types["c_attn"] == "float"


def test_gpt2_parameter_count_from_the_card():
    assert summarize(_sig("GPT2"), "gpt2").parameters == 124_439_808


def test_info_command(capsys):
    assert main(["info", "cards/gpt2.card", "--preset", "gpt2"]) == 0
    assert "124,439,808" in capsys.readouterr().out


def test_a_call_without_its_parameters_is_refused_by_info_and_build_as_by_check(capsys):
    """tests/golden/missing_params.card calls Relu2MLP without `| θ^mlp`: `info` used to count
    the block without the MLP's weights and `build` failed on it; all three now refuse it with
    the same located error."""
    card = "tests/golden/missing_params.card"
    message = (f"{card}:10:11: error: 'Relu2MLP' needs its parameter 'W', which this call does "
               "not pass")
    for argv in (["check", card], ["info", card, "--preset", "tiny"], ["build", card]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(message) and "Traceback" not in err, argv


def test_a_call_given_its_parameters_counts_and_builds_them(tmp_path, capsys):
    """The hint's fix: `info` counts the MLP's weights, and the built module holds as many."""
    text = (ROOT / "tests" / "golden" / "missing_params.card").read_text(encoding="utf-8")
    card = tmp_path / "block.card"
    card.write_text(text.replace("Relu2MLP(X)", "Relu2MLP(X | θ^mlp)"), encoding="utf-8")
    lib, checker, _ = checked([str(card)], str(tmp_path))
    alg = lib.find("Block")
    assert summarize(checker.infos[id(alg)].sig, "tiny").parameters == 2 * 8 * 16 + 8
    model, _ = instantiate(checker, alg, {"D": 8, "D_f": 16})
    assert sum(p.numel() for p in model.parameters()) == 2 * 8 * 16 + 8


RENAMED = """Algorithm: Y ← Renamed(X | θ)
/* The MLP's width under another name, passed at the call. */
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×D}
Hyperparameters: D, F ∈ ℕ
Parameters: θ consisting of:
    θ^mlp, the MLP parameters.
Preset tiny: D = 4, F = 8
1 X ← X + MLP(X | θ^mlp, D_f = F)
2 return Y = X
"""


def test_a_bundle_sized_by_the_call_is_counted_in_the_callers_sizes(tmp_path):
    """θ^mlp takes MLP's shape with D_f = F: `info` counted it in MLP's own name D_f, which
    this card does not have ("hyperparameter 'D_f' has no value") though check and build
    accepted it. Counted in F, it is what the module builds: 2·D·F + F + D."""
    card = tmp_path / "renamed.card"
    card.write_text(RENAMED, encoding="utf-8")
    lib, checker, _ = checked([str(card), "cards"], "cards")
    alg = lib.find("Renamed")
    assert summarize(checker.infos[id(alg)].sig, "tiny").parameters == 2 * 4 * 8 + 8 + 4
    model, _ = instantiate(checker, alg, {"D": 4, identifier("F"): 8})  # F_: not torch's F
    assert sum(p.numel() for p in model.parameters()) == 2 * 4 * 8 + 8 + 4


STAR = """Algorithm: Y ← Gram(X)
Input: X ∈ ℝ^{T×D}
Output: Y ∈ ℝ^{T×T}
Hyperparameters: T, D ∈ ℕ
1 S ← X X^⊺
2 S ← 2 * S · S
3 return Y = S * S
"""


def test_star_between_two_matrices_warns_and_names_the_hadamard_product(tmp_path, capsys):
    """`*` is the matrix product; between two matrices a PyTorch user likely meant ⊙. The card
    still checks (exit 0), with one warning at the `*` of step 3 only: `2 * S` scales and
    `S · S` is spelled as the paper spells the matrix product."""
    card = tmp_path / "star.card"
    card.write_text(STAR, encoding="utf-8")
    assert main(["check", str(card)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok:")
    assert err.count("warning:") == 1 and "error" not in err
    assert err.startswith(f"{card}:7:16: warning: '*' between two matrices is the matrix "
                          "product (ℝ^{T×T} times ℝ^{T×T})")
    assert "hint: for the element-wise product write ⊙ (ASCII: (.))" in err
    card.write_text(STAR.replace("S * S", "S ⊙ S"), encoding="utf-8")
    assert main(["check", str(card)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [
    ["info", "cards/gpt2.card", "--preset", "nope"],
    ["info", "cards/gpt2.card", "--preset", "tiny", "--set", "H=3"],  # d = D/H is not whole
    ["info", "cards/gpt2.card", "--set", "Q=1"],
])
def test_info_rejects_bad_presets(argv, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["check", "missing.card"], ["check"], ["render", "--to", "pdf", "x"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_check_render_fmt_never_import_torch():
    code = (
        "import sys\n"
        "from cardc.cli import main\n"
        "for argv in (['check', 'cards'], ['render', 'cards/gpt2.card'], ['fmt', '--check', 'cards'],"
        " ['info', 'cards/gpt2.card', '--preset', 'tiny'],"
        " ['diff', 'cards/gpt2.card', 'cards/paper/dtransformer.card']):\n"
        "    main(argv)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ------------------------------------------------ titled cards, ∀-families, Σ_u, loop variables


def _check_text(text: str, monkeypatch_dir: Path) -> list[str]:
    path = monkeypatch_dir / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root=None)
    _, diags = check(lib)
    return [d.message for d in diags.errors]


SINGLE_QUERY = """\
Algorithm 3: Basic single-query attention.
Input: e ∈ ℝ^{d_in}, the current token; e_t ∈ ℝ^{d_in}, context tokens t ∈ [T].
Output: ṽ ∈ ℝ^{d_out}
Parameters: W_q, W_k ∈ ℝ^{d_attn×d_in}, W_v ∈ ℝ^{d_out×d_in}
1 q ← W_q e
2 ∀t: k_t ← W_k e_t
3 ∀t: v_t ← W_v e_t
4 ∀t: α_t = exp(q^⊺ k_t)/Σ_u exp(q^⊺ k_u)
5 return ṽ = Σ_{t=1}^{T} α_t v_t
"""


def test_titled_card_is_checked(tmp_path):
    assert _check_text(SINGLE_QUERY, tmp_path) == []
    wrong = SINGLE_QUERY.replace("W_v ∈ ℝ^{d_out×d_in}", "W_v ∈ ℝ^{d_in×d_in}")
    assert _check_text(wrong, tmp_path) == ["returns ℝ^{d_in} but Output declares ℝ^{d_out}"]


def test_unembedding_distribution_has_the_vocabulary_size(tmp_path):
    card = ("Algorithm 7: Unembedding.\nInput: e ∈ ℝ^{d_e}\nOutput: p ∈ Δ(V)\n"
            "Parameters: W_u ∈ ℝ^{M×d_e}\n1 return p = softmax(W_u e)\n")
    assert _check_text(card, tmp_path) == ["returns ℝ^{M} but Output declares ℝ^{N_V}"]
    assert _check_text(card.replace("M×", "N_V×"), tmp_path) == []


def test_each_sequence_has_its_own_length(tmp_path):
    card = ("Algorithm: Y ← F(z, x)\nInput: z, x ∈ V*\nOutput: Y ∈ ℝ^{length(x)}\n"
            "Parameters: w ∈ ℝ^{N_V}\n1 return Y = w[z]\n")
    assert _check_text(card, tmp_path) == ["returns ℝ^{|z|} but Output declares ℝ^{|x|}"]


LOOP = """\
Algorithm: Y ← F(X | θ)
Input: X ∈ ℝ^{D×T}
Output: Y ∈ ℝ^{D×T}
Hyperparameters: L ∈ ℕ
Parameters: θ includes all of the following parameters:
    For l ∈ [L]:
        W_l, U_l ∈ ℝ^{D×D}
1 for i = 1, 2, …, L do
2     X ← W_l X
3     X ← U_l X
4 end
5 return Y = X
"""


def test_a_loop_that_binds_the_wrong_variable_is_reported_once(tmp_path):
    assert _check_text(LOOP, tmp_path) == ["the loop binds 'i' but its body indexes by 'l'"]
    assert _check_text(LOOP.replace("for i =", "for l ="), tmp_path) == []


def test_a_loop_using_its_variable_reports_each_unbound_use(tmp_path):
    card = LOOP.replace("2     X ← W_l X", "2     X ← W_l X[:, i : i]")
    assert _check_text(card, tmp_path) == [
        "'W_l' is indexed by 'l', which no enclosing loop binds",
        "'U_l' is indexed by 'l', which no enclosing loop binds",
    ]


# ------------------------------------------------ the paper's Algorithms 11–15: training, inference


def _check_in_library(text: str, tmp_path: Path) -> list[str]:
    """Errors of a card that calls the library's models (DTransformer, …)."""
    path = tmp_path / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root="cards")
    _, diags = check(lib)
    return [d.message for d in diags.errors if d.span.file == str(path)]


def _paper(name: str) -> str:
    return (ROOT / "cards" / "paper" / f"{name}.card").read_text(encoding="utf-8")


def _checked(name: str):
    lib, _ = load(["cards"])
    checker, diags = check(lib)
    alg = lib.find(name)
    assert not [d for d in diags.errors if d.span.file == lib.file_of(alg).path]
    return alg, checker.infos[id(alg)]


def _typed(alg, info, text: str):
    """The type the checker gave the first expression of the card rendered as `text`."""
    from cardc.render.text import render_expr

    def walk(node):
        if isinstance(node, tuple):
            for x in node:
                yield from walk(x)
        elif hasattr(node, "__dataclass_fields__"):
            yield node
            for name in node.__dataclass_fields__:
                yield from walk(getattr(node, name))

    for node in walk(alg.steps):
        if id(node) in info.types and render_expr(node) == text:
            return info.types[id(node)]
    raise AssertionError(f"no typed expression {text!r}")


def test_training_signature_links_the_dataset_and_infers_the_parameters():
    alg, info = _checked("DTraining")
    (data, dataset), (theta, params) = info.sig.inputs
    assert data == "x_{1:N_data}" and isinstance(dataset, FamilyTy)
    assert dataset.var == "n" and dataset.over == Dim.sym("N_data")
    assert dataset.entry == Ty((Dim.sym("|x_n|"),), "ℕ", vocab=Dim.sym("N_V"))  # x_n ∈ V*
    assert theta == "θ" and isinstance(params, BundleTy) and params.card == "DTransformer"
    assert info.sig.output.card == "DTransformer"  # θ̂, the trained θ
    assert list(info.sig.output.members) == list(params.members)
    assert {"N_data", "N_V", "N_epochs"} <= set(info.sig.hypers)


def test_training_types():
    alg, info = _checked("DTraining")
    theta = dict(info.sig.inputs)["θ"]
    assert _typed(alg, info, "P(θ)") == Ty((Dim.sym("N_V"), Dim.sym("|x_n|")))
    assert _typed(alg, info, "P(θ)[x_n[t + 1], t]") == Ty()
    assert _typed(alg, info, "loss(θ)") == Ty()
    assert _typed(alg, info, "∇loss(θ)") is theta
    assert _typed(alg, info, "θ − η · ∇loss(θ)") is theta


def test_masked_training_types():
    alg, info = _checked("ETraining")
    n_v, length = Dim.sym("N_V"), Dim.sym("|x_n|")
    choice = "mask_token or x_n[t] randomly with probability p_mask or 1 − p_mask"
    assert _typed(alg, info, choice) == Ty(elem="ℕ", vocab=n_v)
    assert _typed(alg, info, "x̃_n") == Ty((length,), "ℕ", vocab=n_v)
    assert _typed(alg, info, "{t ∈ [ℓ] : x̃_n[t] = mask_token}") == SetTy(length)
    assert _typed(alg, info, "T̃") == SetTy(length)
    assert dict(info.sig.inputs)["θ"].card == "ETransformer"


def test_sequence_to_sequence_training_links_both_halves_of_the_pairs():
    _, info = _checked("EDTraining")
    assert [name for name, _ in info.sig.inputs] == ["z_{1:N_data}", "x_{1:N_data}", "θ"]
    assert dict(info.sig.inputs)["θ"].card == "EDTransformer"


def test_inference_types():
    alg, info = _checked("DInference")
    n_v = Dim.sym("N_V")
    assert dict(info.sig.inputs)["θ̂"].card == "DTransformer"  # declared by a sentence
    assert _typed(alg, info, "y") == Ty(elem="ℕ", vocab=n_v)  # the sampled token
    assert _typed(alg, info, "[x, y]") == Ty((Dim.sym("|x|′") + Dim.const(1),), "ℕ", vocab=n_v)
    assert _typed(alg, info, "x[ℓ + 1 : ℓ + ℓ_gen]") == Ty((Dim.sym("ℓ_gen"),), "ℕ", vocab=n_v)
    alg, info = _checked("EDInference")
    assert _typed(alg, info, "[bos_token]") == Ty((Dim.const(1),), "ℕ", vocab=n_v)
    assert _typed(alg, info, "eos_token") == Ty(elem="ℕ", value=n_v, vocab=n_v)


@pytest.mark.parametrize(("card", "old", "new", "message"), [
    ("dtraining", "length(x_n)", "length(x_m)", "unknown name 'x_m'"),
    ("dtraining", "∇loss(θ)", "∇los(θ)", "unknown card or function 'los'"),
    ("dtraining", "DTraining(x_{1:N_data}", "DTraining(x_{1:N}",
     "argument 'x_{1:N}' is not declared in Input"),
    ("dtraining", "DTraining(x_{1:N_data}, θ)", "DTraining(θ)",
     "the header takes no argument for 'x_n'"),
    ("dtraining", "∇loss(θ)", "∇P(θ)", "∇ needs a scalar to differentiate; P(θ) is ℝ^{N_V×|x_n|}"),
    ("dtraining", "∇loss(θ)", "∇θ", "∇ takes the gradient of a function of one variable"),
    ("dtraining", "θ − η · ∇loss(θ)", "θ − η", "cannot subtract parameters of DTransformer and ℝ"),
    ("dtraining", "θ − η · ∇loss(θ)", "η · θ · θ",
     "cannot multiply parameters of DTransformer and parameters of DTransformer"),
    ("dtraining", "return θ̂ = θ", "return θ̂ = η",
     "returns ℝ but Output declares a parameter bundle"),
    ("dtraining", "P(θ)[x_n[t + 1], t]", "P(θ)[t, x_n[t + 1]]",
     "a token of a vocabulary of N_V indexes an axis of |x_n|"),
    ("dtraining", "log P(θ)[", "log P[", "'P' is a function of θ, not a tensor"),
    ("dtraining", "P(θ) ← DTransformer(x_n | θ)", "P(θ) ← DTransformer(x_n | θ̂)",
     "unknown name 'θ̂'"),
    ("dtraining", "θ ← θ − η · ∇loss(θ)", "θ ← x_n",
     "'θ' is parameters of DTransformer; cannot assign ℕ^{|x_n|} to it"),
    ("etraining", "{t ∈ [ℓ] :", "{t ∈ x_n :",
     "expected a set such as [ℓ] or {t ∈ [ℓ] : …}, not ℕ^{|x_n|}"),
    ("etraining", "Σ_{t∈T̃}", "Σ_{t∈x_n}",
     "expected a set such as [ℓ] or {t ∈ [ℓ] : …}, not ℕ^{|x_n|}"),
    ("etraining", "mask_token or x_n[t]", "mask_token or η",
     "the options of a random choice differ: ℕ and ℝ"),
    ("etraining", "or 1 − p_mask", "or x_n", "a probability must be a scalar, not ℕ^{|x_n|}"),
    ("etraining", "or 1 − p_mask", "or 1 − p_mask or p_mask", "2 options but 3 probabilities"),
    ("etraining", "x̃_n[t] = mask_token", "x̃_n", "a set's condition must be a single truth value, "
                                              "not ℕ^{|x_n|}"),
    ("dinference", "q ∝ p^{1/τ}", "q ∝ P^{1/τ}",
     "a token is sampled from a vector of weights, not ℝ^{N_V×|x|′}"),
    ("dinference", "q ∝ p^{1/τ}", "q ∝ (p)^{p}", "an exponent must be a scalar, not ℝ^{N_V}"),
    ("dinference", "x ← [x, y]", "x ← [x, p]",
     "cannot join ℝ^{N_V} into a sequence of tokens of a vocabulary of N_V"),
    ("dinference", "x ← [x, y]", "x ← p",
     "'x' is a sequence of tokens; cannot assign ℝ^{N_V} to it"),
    ("dinference", "parameters θ̂.", "parameters.",
     "this sentence declares nothing: it names no symbol of the header"),
    ("edinference", "while y ≠ eos_token do", "while x̂ do",
     "a condition must be a single truth value, not ℕ^{1}"),
])
def test_training_and_inference_diagnostics(card, old, new, message, tmp_path):
    text = _paper(card)
    assert old in text
    assert message in _check_in_library(text.replace(old, new), tmp_path)


def test_training_cards_check_clean_on_their_own(tmp_path):
    for card in ("dtraining", "etraining", "edtraining", "dinference", "edinference"):
        assert _check_in_library(_paper(card), tmp_path) == []


def test_info_names_a_titled_card_by_its_title(capsys):
    args = ["info", "cards/paper/single_query_attention.card", "--set", "d_in=4", "--set",
            "d_out=3", "--set", "d_attn=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("BasicSingleQueryAttention") and "parameters: 35" in out


def test_schedules_compare_numbers_with_min_and_max(tmp_path):
    card = ("Algorithm: y ← Schedule(x)\nInput: x ∈ ℝ^{D}\nOutput: y ∈ ℝ\n"
            "Hyperparameters: D, N ∈ ℕ\n"
            "1 return y = min(1, (1 + cos(π · max(0, D − N)/N))/2) · max(x)\n")
    assert _check_text(card, tmp_path) == []
    # two arguments compare entry by entry, one reduces: min(x, c) of a vector is a vector
    vector = card.replace("min(1, (1", "min(x, (1")
    assert _check_text(vector, tmp_path) == ["returns ℝ^{D} but Output declares ℝ"]
    assert _check_text(vector.replace("y ∈ ℝ\n", "y ∈ ℝ^{D}\n"), tmp_path) == []
    unlike = card.replace("Schedule(x)", "Schedule(x | W)").replace(
        "ℕ\n", "ℕ\nParameters: W ∈ ℝ^{N×N}\n").replace("min(1, (1", "min(x, W ⊙ (1")
    assert _check_text(unlike, tmp_path) == [
        "min(a, b) compares entry by entry; cannot compare ℝ^{D} with ℝ^{N×N}"]


def test_a_sum_over_a_datasets_examples_binds_them(tmp_path):
    card = ("Algorithm: s ← Total(x_{1:N_data})\nInput: {x_n}_{n=1}^{N_data}, sequences.\n"
            "Output: s ∈ ℝ\nHyperparameters: B ∈ ℕ\n"
            "1 return s = Σ_{n=1}^{B} length(x_n)\n")
    assert _check_text(card, tmp_path) == []
    unbound = card.replace("Σ_{n=1}^{B} length(x_n)", "Σ_{m=1}^{B} length(x_n)")
    assert _check_text(unbound, tmp_path) == [
        "'x_n' is indexed by 'n', which no enclosing loop binds"]


def test_two_bundles_on_one_line_get_a_hint(tmp_path):
    """`θ^attn, θ^mlp` declares θ^attn with the prose 'θ^mlp': using θ^mlp names the slip."""
    text = (ROOT / "cards" / "llama.card").read_text(encoding="utf-8")
    text = text.replace("    θ^attn, the attention parameters.\n", "    θ^attn, θ^mlp\n", 1)
    text = text.replace("    θ^mlp, the MLP parameters.\n", "", 1)
    path = tmp_path / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root="cards")
    _, diags = check(lib)
    (error,) = [d for d in diags.errors if d.span.file == str(path)]
    assert error.message == "unknown name 'θ^mlp'"
    assert error.hint == ("'θ^attn, θ^mlp' declares θ^attn and describes it as 'θ^mlp': "
                          "declare each parameter bundle on its own line")


def test_two_bundles_and_their_prose_on_one_line_get_the_hint(tmp_path):
    """`θ^attn, θ^mlp, the attention and the MLP.`: the second name read as the start of the
    first one's prose, named by the hint too."""
    text = (ROOT / "cards" / "llama.card").read_text(encoding="utf-8")
    text = text.replace("    θ^attn, the attention parameters.\n",
                        "    θ^attn, θ^mlp, the attention and the MLP.\n", 1)
    text = text.replace("    θ^mlp, the MLP parameters.\n", "", 1)
    path = tmp_path / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([path], root="cards")
    _, diags = check(lib)
    (error,) = [d for d in diags.errors if d.span.file == str(path)]
    assert error.message == "unknown name 'θ^mlp'"
    assert error.hint is not None and error.hint.startswith(
        "'θ^attn, θ^mlp, the attention and the MLP.' declares θ^attn")


def test_a_node_kind_a_visitor_does_not_handle_is_named():
    """Visitors dispatch on the node's class name (expr_Name); a kind without a method is the
    compiler's fault, reported by its name, not an AttributeError."""

    class Names:
        def expr_Name(self, e: s.Name) -> str:
            return e.id

    assert s.dispatch(Names(), "expr", s.Name("x")) == "x"
    with pytest.raises(NotImplementedError, match="Names handles no Num node"):
        s.dispatch(Names(), "expr", s.Num("1"))
