"""Card text reaches generated Python only as the card's math: names through one injective,
collision-checked mapping (cardc.names, checked by cardc.namecheck), literals through one
quoting function; a checkpoint's recorded cards are names of the files it carries."""

from __future__ import annotations

import ast
import keyword
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cardc import syntax as s
from cardc.build import (
    checked,
    generated_cards,
    instantiate,
    load_module,
    rebuild_model,
    recorded_cards,
    source,
)
from cardc.checker import check, split_name
from cardc.cli import main
from cardc.diagnostics import CardError
from cardc.info import preset_values, summarize
from cardc.library import load
from cardc.names import GENERATED, NN_MODULE, attribute, identifier, number, quote
from cardc.runtime.checkpoint import save_checkpoint
from cardc.spelling import python_name

ROOT = Path(__file__).resolve().parent.parent

# A small language model: every role a name can play is one substitution away.
TEMPLATE = """\
Algorithm: P ← {card}(x | θ)
Input: x ∈ {{1..V}}^{{T}}, token IDs.
Output: P ∈ ℝ^{{T×V}}, logits.
Hyperparameters: V, {hyper} ∈ ℕ
Parameters: θ includes all of the following parameters:
    {param} ∈ ℝ^{{V×{hyper}}}, embeddings.
    W_u ∈ ℝ^{{{hyper}×V}}, the unembedding.
Preset {preset}: V = 16, {hyper} = 8
1 e ← {param}[x]
2 return P = e W_u
"""


def card(card: str = "Tiny", hyper: str = "D", param: str = "E", preset: str = "tiny") -> str:
    return TEMPLATE.format(card=card, hyper=hyper, param=param, preset=preset)


def checked_text(text: str, tmp: Path):
    """The card checked as a file of its own: (library, checker, diagnostics)."""
    path = tmp / "t.card"
    path.write_text(text, encoding="utf-8")
    lib, _ = load([str(path)], root=str(tmp))
    checker, diags = check(lib)
    return lib, checker, diags


def errors_of(text: str, tmp: Path) -> list[str]:
    lib, _, diags = checked_text(text, tmp)
    return [d.render(lib.diags.sources) for d in diags.errors]


def build(text: str, tmp: Path):
    """The card's generated source and its model at its first preset."""
    lib, checker, diags = checked_text(text, tmp)
    assert not diags.errors, diags.render()
    alg = next(a for f in lib.files for a in f.algorithms)
    code = source(checker, alg)
    values = preset_values(checker.info(alg).sig, alg.presets[0].name, {})
    model, _ = instantiate(checker, alg, {identifier(k): v for k, v in values.items()})
    return lib, checker, alg, code, model


# ------------------------------------------------------------------ the mapping


def test_identifiers_keep_the_names_existing_modules_use():
    assert [identifier(n) for n in ("W_e", "γ^1_l", "ε", "θ_base", "ℓ_max", "λ")] == \
        ["W_e", "gamma1_l", "eps", "theta_base", "l_max", "lambda_"]
    assert attribute(*split_name("θ^block_ℓ"), "ℓ") == "block"
    assert attribute(*split_name("W^h_qkv"), "h") == "W_qkv"


@pytest.mark.parametrize("name", ["torch", "F", "nn", "math", "self", "super", "cache", "targets",
                                  "loss", "past", "KVCache", "PRESETS", "int", "float", "range",
                                  "len", "forward", "parameters", "to", "state_dict", "for"])
def test_reserved_names_are_mangled(name):
    py = identifier(name)
    assert py == name + "_" and py.isidentifier() and not keyword.iskeyword(py)


def test_the_reserved_lists_are_torchs_own():
    """The static list of nn.Module attributes is what torch has (check cannot import it)."""
    # asked of a fresh interpreter: other libraries (transformers) add methods to nn.Module
    listed = subprocess.run([sys.executable, "-c", "import torch; print(*dir(torch.nn.Module))"],
                            capture_output=True, text=True, check=True).stdout.split()
    public = {n for n in listed if not n.startswith("_")}
    assert public and public <= NN_MODULE | GENERATED, public - NN_MODULE - GENERATED


def test_quote_and_number_make_literals_of_anything():
    for text in ['t_{"+str(__import__("os").system("x"))+"}', "a'b", 'a"b', "\\", "x\ny", "γ"]:
        assert ast.literal_eval(quote(text)) == text
    assert quote("tiny") == '"tiny"'
    assert number(16, integral=True) == "16" and number(1e-5) == "1e-05"
    for bad in (float("inf"), float("-inf"), float("nan"), 0.5):
        with pytest.raises(ValueError):
            number(bad, integral=bad == 0.5)


# ------------------------------------------------------------------ collisions, duplicates

PAIRS = [("W^q", "Wq"), ("ℓ", "l"), ("ϵ", "ε"), ("X̃", "X_tilde"), ("γ^1", "gamma1"),
         ("W_{a,b}", "W_a_b")]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_parameters_that_would_share_an_identifier_are_located_errors(tmp_path, first, second):
    text = card().replace("    W_u ∈", f"    {first} ∈ ℝ^{{V×D}}, one.\n    {second} ∈ ℝ^{{V×D}}, "
                                        "two.\n    W_u ∈")
    errs = errors_of(text, tmp_path)
    assert len(errs) == 1, errs
    py = identifier(first)
    shown = [ln for ln in errs[0].splitlines()]
    assert re.match(rf".*t\.card:8:5: error: '.+' and '.+' would both be '{py}' in generated "
                    "code$", shown[0]), shown[0]
    assert any(re.match(r".*t\.card:7:5: note: '.+' is here$", ln) for ln in shown)
    assert shown[-1] == "  = hint: rename one of them"


def test_hyperparameters_that_would_share_an_identifier_are_located_errors(tmp_path):
    text = card().replace("Hyperparameters: V, D ∈ ℕ", "Hyperparameters: V, D, γ^1, gamma1 ∈ ℕ")
    errs = errors_of(text, tmp_path)
    assert len(errs) == 1 and "t.card:4:29: error: 'γ1' and 'γ^1' would both be 'gamma1' in " \
        "generated code" in errs[0], errs


def test_build_refuses_colliding_hyperparameters(tmp_path, capsys):
    text = card().replace("Hyperparameters: V, D ∈ ℕ", "Hyperparameters: V, D, ϵ, ε ∈ ℕ")
    (tmp_path / "c.card").write_text(text, encoding="utf-8")
    assert main(["build", str(tmp_path / "c.card"), "--out", str(tmp_path / "out")]) == 1
    assert "would both be 'eps' in generated code" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(("block", "decl"), [
    ("Parameters", "    E ∈ ℝ^{V×D}, again."),
    ("Hyperparameters", None),
    ("Input", None),
])
def test_a_name_declared_twice_is_a_located_error(tmp_path, block, decl):
    text = card()
    if block == "Parameters":
        text = text.replace("    W_u ∈", f"{decl}\n    W_u ∈")
        where, first = "t.card:7:5", "t.card:6:5"
    elif block == "Hyperparameters":
        text = text.replace("Hyperparameters: V, D ∈ ℕ", "Hyperparameters: V, D, D ∈ ℕ")
        where, first = "t.card:4:21", "t.card:4:21"  # one declaration: the name's first place
    else:
        text = text.replace("Output:", "Input: x ∈ {1..V}^{T}, again.\nOutput:")
        where, first = "t.card:3:8", "t.card:2:8"
    errs = errors_of(text, tmp_path)
    assert len(errs) == 1, errs
    assert f"{where}: error: '" in errs[0] and "' is declared twice" in errs[0]
    assert f"{first}: note: first declared here" in errs[0]


def test_renamed_the_two_projections_are_two_parameters(tmp_path):
    """`E W^q − E Wq` was always 0 (Wq overwrote W^q) and counted one matrix twice."""
    text = card().replace("    W_u ∈ ℝ^{D×V}, the unembedding.",
                          "    W^q ∈ ℝ^{D×V}, one.\n    W_r ∈ ℝ^{D×V}, two.")
    text = text.replace("2 return P = e W_u", "2 return P = e W^q − e W_r")
    _, checker, alg, _, model = build(text, tmp_path)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["E", "Wq", "W_r"]
    count = sum(p.numel() for p in model.parameters())
    assert count == 16 * 8 + 2 * 8 * 16 == summarize(checker.info(alg).sig, "tiny").parameters
    out = model(torch.randint(0, 16, (2, 5)))
    assert out.abs().max() > 0


def test_colliding_card_names_and_file_names_are_located_errors(tmp_path):
    text = card(card="Tiny") + "\n" + card(card="TINY", param="E_2")
    errs = errors_of(text, tmp_path)
    assert len(errs) == 1 and "t.card:12:1: error: 'TINY' and 'Tiny' would both be " \
        "'tiny' as generated file names" in errs[0], errs


# ------------------------------------------------------------------ reserved names run


RESERVED_CASES = [("card", n) for n in ("torch", "F", "nn", "math", "self", "super", "cache",
                                        "targets", "loss", "KVCache", "PRESETS", "int", "range")]
RESERVED_CASES += [("hyper", n) for n in ("torch", "F", "nn", "math", "self", "super", "cache",
                                          "targets", "loss", "past", "len", "float", "report")]
RESERVED_CASES += [("param", n) for n in ("forward", "parameters", "to", "state_dict", "self",
                                          "loss", "training", "torch", "T_destination")]


@pytest.mark.parametrize(("role", "name"), RESERVED_CASES)
def test_reserved_names_build_and_run(tmp_path, role, name):
    *_, code, model = build(card(**{role: name}), tmp_path)
    x = torch.randint(0, 16, (2, 5))
    logits, loss = model(x, targets=x)
    assert logits.shape == (2, 5, 16) and torch.isfinite(loss)
    assert sum(p.numel() for p in model.parameters()) == 2 * 16 * 8
    if role == "param":
        assert f"self.{name}_ = nn.Parameter" in code
        # the card's parameter hides nothing nn.Module has under that name
        assert name not in dict(model.named_parameters())
        assert not isinstance(getattr(model, name, None), torch.nn.Parameter)


# ------------------------------------------------------------------ injection


INJECTION = 't_{"+str(__import__("os").system("touch pwned"))+"}'


def test_a_preset_name_is_only_ever_a_quoted_string(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = card(preset=INJECTION)
    _, _, alg, code, model = build(text, tmp_path)
    tree = ast.parse(code)
    presets = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                   and n.targets[0].id == "PRESETS")
    assert [k.value for k in presets.keys] == [alg.presets[0].name]
    assert "__import__" not in {getattr(n, "id", None) for n in ast.walk(tree)}
    module = load_module(code, "injected")
    assert list(module.PRESETS) == [alg.presets[0].name]
    assert main(["build", "t.card", "--out", "out"]) == 0
    import cardc

    cardc.model("t.card", preset=alg.presets[0].name)
    spec_path = next((tmp_path / "out").rglob("*.py"))
    load_module(spec_path.read_text(encoding="utf-8"), "written")
    assert not (tmp_path / "pwned").exists()


def _run_folder(tmp_path: Path, text: str) -> tuple[Path, dict]:
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "t.card").write_text(text, encoding="utf-8")
    import cardc

    model = cardc.model(str(tmp_path / "cards" / "t.card"), preset="tiny")
    return tmp_path / "run", model.card_meta


def test_a_recorded_card_path_is_never_read_from_disk(tmp_path, capsys):
    secret = tmp_path / "secret.card"
    secret.write_text("the first line of a private file\n", encoding="utf-8")
    run, meta = _run_folder(tmp_path, card())
    import cardc

    model = cardc.model(str(tmp_path / "cards" / "t.card"), preset="tiny")
    for bad in (str(secret), "../secret.card", "cards/../../secret.card", "C:\\x.card",
                "a/./t.card", "t.card\n", "t.txt"):
        edited = {**meta, "card": bad}
        with pytest.raises(ValueError, match="unsafe card path"):
            rebuild_model(edited)
        with pytest.raises(ValueError, match="unsafe card path"):
            rebuild_model({**meta, "cards": {bad: "x", **meta["cards"]}})
    with pytest.raises(ValueError, match="does not record it"):
        rebuild_model({**meta, "card": "other.card"})
    with pytest.raises(ValueError, match="cannot be written out"):
        rebuild_model({**meta, "cards": {**meta["cards"], "a.card": "", "a.card/b.card": ""}})
    sampler = {**meta, "sampler": {"card": str(secret), "name": "S"}}
    with pytest.raises(ValueError, match="unsafe card path"), recorded_cards(sampler):
        pass
    run.mkdir()
    save_checkpoint(run, model, {**meta, "card": str(secret)})
    assert main(["sample", str(run)]) != 0
    err = capsys.readouterr().err
    assert "unsafe card path" in err and "the first line of a private file" not in err
    assert "Traceback" not in err


def test_edited_recorded_cards_compile_to_nothing_but_their_math(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, meta = _run_folder(tmp_path, card())
    edited = {**meta, "cards": {k: v.replace("Preset tiny", f"Preset {INJECTION}")
                                for k, v in meta["cards"].items()}}
    rebuild_model(edited)
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------ what generated code holds

# What the code generator itself writes: its imports, the builtins and torch API it calls,
# the names of its own locals and arguments. Anything else must come from a card name.
IMPORTS = {("torch", None), ("torch.nn.functional", "F"), ("math", None), ("torch:nn", None)}
GENERATOR_NAMES = {
    "F", "KVCache", "K_past", "seen", "PRESETS", "V_past", "ValueError", "_", "_layer", "__init__", "approximate",
    "betas", "cache", "decayed", "device", "dict", "dim", "dtype", "enable_gqa", "extend", "float",
    "forward", "fused", "group", "held", "int", "is_causal", "scale", "keepdim", "key", "len", "logits", "lr",
    "math", "new", "new_cache", "nn", "optimizer", "past", "persistent", "phi", "range", "report",
    "rotary", "self", "source", "super", "targets", "torch", "undecayed", "weight_decay", "Z",
    "qkv", "kv", "parts", "loss", "unbiased", "alpha", "None", "True", "False", "p",
    "padding_idx", "start", "end", "step", "skip",
    # the file's attention and RoPE helpers (cardc.lower.attention, cardc.lower.intrinsics)
    "grouped_sdpa", "options", "groups", "rotate_half", "rotate_pairs", "rope_angles", "ANGLES",
    "real_type", "rope_frequencies", "function", "hypers", "isinstance",
    "pairs", "keep", "layer", "at", "n", "shared_mask", "site", "make", "queries",
    "shared_value", "VALUES", "reads", "made", "inference_made",
    "keys", "numbers", "visible", "hidden", "drop", "mask", "rope_table", "TABLES", "width", "found",
    "table", "rest", "positions", "r", "turn", "part", "partner", "Y", "wide_sin", "partners",
    "columns", "rows", "id", "sum", "all", "project", "XW", "JOINED_MAX", "weights", "joined", "joins", "widths",
    "offset_rms_norm", "normed", "shape", "gamma", "eps", "rms_normalize", "RMS_EPS", "root",
    "roots",
    "norm",
    # generate() and the token pickers it copies from cardc.runtime.logits
    "generate", "pick_token", "filter_logits", "idx", "max_new_tokens", "temperature", "top_k",
    "top_p", "generator", "context", "kth", "probs", "order", "descending",
    # and the stop tokens it holds (hold_stopped); a sampling card's caller's stop(y)
    "stop_tokens", "hold_stopped", "stops", "token", "stop", "tuple", "sorted", "bool",
    "cat_broadcast", "tensors", "like", "sizes", "size", "bias", "list", "zip", "strict",
    # a recurrence's scan and the cache's state (cardc.lower.recurrence)
    "linear_scan", "resume", "hold",
    # an encoder–decoder's source, encoded once per cache (cardc.lower.decoding)
    "holds", "z", "encoding", "kept", "values", "keep_context",
    # sparse experts (cardc/runtime/experts.py)
    "route", "ROWS", "experts", "expert", "chosen", "weight", "lead", "tokens",
    "expert_of", "counts", "runs", "run", "short", "minlength", "as_tuple", "scores", "best",
    "slot", "spare", "FEW", "padded", "ts", "shift", "padding", "called", "call", "any",
    # patches (the patch helpers)
    "cut_patches", "patch_grid", "blocks", "cols",
    # a vector per head read at a tensor of indices, and shapes broadcast
    "lookup", "index", "rank", "broadcast_sizes", "shapes", "out", "front", "enumerate", "first", "wide", "slice",
    "RuntimeError", "str",
    # a lone decoded token's experts
    "route_one",
    # attention whose queries are a product (cardc.lower.factored)
    "factored_sdpa", "A", "B", "R", "K", "V", "Q", "a", "tq", "tk", "c", "u",
    "w", "heads_product", "X", "W", "H", "P", "to",
    # the training loss a few rows at a time (cardc.lower.likelihood)
    "nll", "log_likelihood", "LOGITS_AT_ONCE", "head", "h", "per_row", "chunk", "logp", "total",
    "lo", "max", "use_reentrant",
    # the cache's room to grow (KVCache.appended), and what a traced graph makes anew
    "appended", "room", "K_room", "V_room", "as_bias", "is_compiling",
    # a static cache: its positions a tensor, its keys and values held in place
    "next", "static", "length", "advance", "written", "first_query", "rows_at", "beyond", "rope_rows", "limit",
    "count", "sees_all", "over", "every", "positioned", "t", "omega", "cos", "sin",
}
# what the generator appends to a card's name: a recurrence's state held or read late, all
# of its states; a head's function over every head at once
GENERATOR_SUFFIXES = ("held", "all", "late", "per_head")
GENERATOR_ATTRS = {
    # sparse experts (cardc/runtime/experts.py)
    "new_full", "index_put", "index_put_", "index_select", "index_add_", "items", "setdefault",
    "stride",
    "is_inference_mode_enabled", "compiler", "is_compiling", "clone", "Module", "joins", "joined", "split_with_sizes", "numel", "requires_grad", "flip", "ModuleList", "Parameter", "SGD", "AdamW", "__init__", "addcmul", "angles", "any",
    "Generator", "Tensor", "no_grad", "scatter", "sort", "to", "values",
    "arange", "argmax", "as_tensor", "backward", "bool", "cat", "cross_entropy", "detach",
    "device", "empty", "equal", "extend", "flatten", "float", "float32", "float64", "full", "gather", "gelu",
    "linear", "mT", "max_seq_len", "movedim", "multinomial", "ndim", "new", "new_cache",
    "normal_", "ones", "optim", "param_groups", "parameters", "pos", "rand_like",
    "register_buffer", "relu", "returns", "rms_norm", "roll", "rotary", "scaled_dot_product_attention",
    "all", "shape", "silu", "sqrt", "stack", "step", "sum", "tensor", "tokens", "transpose", "tril",
    "unbind", "unflatten", "where", "zero_grad", "zeros", "softmax", "log_softmax", "logsigmoid", "exp", "log",
    "tanh", "erf", "sigmoid", "mean", "var", "max", "min", "amax", "amin", "pi", "inf", "layer_norm", "T", "kv",
    "cos", "sin", "omega", "append", "clamp", "tolist", "item", "long", "topk", "div", "size",
    "view", "reshape", "unsqueeze", "squeeze", "expand", "masked_fill", "logical_not", "cumsum",
    "rsqrt", "pow", "abs", "square", "randint", "bernoulli", "lerp", "norm", "embedding",
    "slice_scatter", "zeros_like", "dim", "repeat", "repeat_interleave", "clear", "calls", "called",
    "new_ones", "new_zeros", "get", "isin", "full_like", "is_grad_enabled", "type", "linalg",
    "vector_norm", "hypot", "addcmul_", "dtype",
    "utils", "checkpoint",  # torch.utils.checkpoint, the loss's chunks
    "appended", "room", "new_empty", "element_size",  # the cache's room to grow
    "resume", "hold", "states", "carried", "holds", "keep", "source", "encoding",
    "kept", "keep_context", "context", "contexts", "broadcast_tensors", "broadcast_to", "broadcast_shapes",
    "is_tensor", "narrow", "index_add", "nonzero", "split", "indices", "bincount", "permute",
    "length", "advance", "written", "sees_all", "index_copy_", "positioned", "contiguous", "given", "_assert_async",
}
GENERATOR_STRINGS = {"tanh", "scale", "omega", "cpu", "probabilities", "params", "weight_decay", "lr", "-inf",
                     " exceeds the model's ", " positions", "sequence length ",
                     "this cache holds tokens decoded after another source: decode this one "
                     "through a new cache (new_cache())",
                     "shapes that do not broadcast: ",
                     "KVCache",  # new_cache()'s annotation: the class stands after the model
                     "this static cache holds ", " positions: ", " do not fit (new_cache(length=…))",
                     "a cache of ", "this static cache holds keys for ", ", not ",
                     ": decode another batch through a new cache", "the source was written over after this cache encoded it: "
                     "decode through a new cache", ", or give a traced forward the source tensor "
                     "it encoded", "",
                     "a static cache (new_cache(length=…)) decodes without gradients: "
                     "new_cache() passes them on",
                     " positions exceeds the model's "}
# the pieces of the message a model input of the wrong size gets, around the card's own names
# and sizes (an input's, its declared type's)
GENERATOR_MESSAGE = re.compile(r"\w+ has sizes |; the model takes ℝ\^\{[\w×]+\}, \w+ = |, \w+ = |×"
                               r"| pixels does not cut into | patches|an image of |attn_mask")
FORBIDDEN = {"__import__", "eval", "exec", "compile", "open", "os", "sys", "subprocess",
             "getattr", "setattr", "globals", "locals", "vars", "breakpoint", "input",
             "__builtins__", "importlib", "system"}


def card_identifiers(lib, checker) -> set[str]:
    """Every identifier a name written in the library's cards may become."""
    names: set[str] = set()
    for alg in [a for f in lib.files for a in f.algorithms]:
        names |= {alg.label or "", *alg.outputs, *alg.args, *alg.params}
        for node in s.nodes((alg.blocks, alg.steps)):
            for attr in ("name", "id", "var", "index", "func", "dist"):
                value = getattr(node, attr, None)
                names |= {value} if isinstance(value, str) else set()
            for attr in ("names", "vars", "elems"):
                value = getattr(node, attr, None)
                names |= set(value) if isinstance(value, tuple) else set()
        info = checker.infos.get(id(alg))
        names |= set(info.sig.hypers) if info else set()
    out = set()
    for n in filter(None, (n.strip("|") for n in names)):
        base, decor = split_name(n)
        out |= {identifier(n), python_name(base), attribute(base, decor, None)}
        out |= {attribute(base, decor, v) for _, v in decor} | {python_name(v) for _, v in decor}
    return {x.rstrip("_") for x in out}


def _derived(name: str, card: set[str]) -> bool:
    """A card identifier, perhaps made fresh (X_), a family's local (Y_h) or a length (len_x)."""
    name = name.rstrip("_") or name
    if name in card or name.startswith("len_") and name[4:].rstrip("_") in card:
        return True
    if name.endswith("_heads") and name[:-len("_heads")] in card:  # a group's merged variant
        return True
    if name.startswith("size_") and _derived(name[len("size_"):], card):  # an input's sizes
        return True
    if any(name.endswith("_" + s) and name[:-len(s) - 1] in card for s in GENERATOR_SUFFIXES):
        return True
    return any(name.startswith(a + "_") and name[len(a) + 1:].rstrip("_") in card for a in card)


def audit(code: str, card: set[str], presets: set[str]) -> None:
    """Every name, attribute, import and string of `code` is the generator's or the card's."""
    tree = ast.parse(code)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {(a.name, a.asname) for a in node.names} <= IMPORTS, ast.dump(node)
        elif isinstance(node, ast.ImportFrom):
            assert {(f"{node.module}:{a.name}", a.asname) for a in node.names} <= IMPORTS
        named = {ast.Name: "id", ast.arg: "arg", ast.keyword: "arg", ast.FunctionDef: "name",
                 ast.ClassDef: "name", ast.Attribute: "attr"}.get(type(node))
        value = getattr(node, named, None) if named else None
        if value is not None:
            assert value not in FORBIDDEN, value
            allowed = GENERATOR_ATTRS if isinstance(node, ast.Attribute) else GENERATOR_NAMES
            fresh = value.rstrip("_") or value  # a generator's name made fresh (make_)
            assert value in allowed or fresh in GENERATOR_NAMES and allowed is GENERATOR_NAMES \
                or _derived(value, card), f"{type(node).__name__} {value!r}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docstrings:
            assert node.value in GENERATOR_STRINGS | presets or \
                GENERATOR_MESSAGE.fullmatch(node.value), repr(node.value)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, (ast.Name, ast.Attribute, ast.Subscript)), ast.dump(node)


def test_every_generated_module_holds_only_its_cards_names():
    clean = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cards").rglob("*.card")
                   if "faithful" not in p.parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, checker, _ = checked(clean, "cards")
        card_names = card_identifiers(lib, checker)
        files = [f.path for f in lib.files if "faithful" not in f.path]
        algs = generated_cards(lib, checker, files)
        assert len(algs) >= 20
        presets = {p.name for _, a in lib.algorithms() for p in a.presets}
        for alg in algs:
            audit(source(checker, alg), card_names, presets)


def test_the_audit_catches_what_a_card_did_not_write():
    card_names = {"W_e", "x", "y", "z"}
    audit("import torch\ny = torch.zeros(3)\nz = W_e[x]\n", card_names, set())
    for bad in ("import os\n", "__import__('os')\n", "y = eval\n", "z = torch.load\n",
                "PRESETS = {'a' + str(1): 1}\n", "y = q\n"):
        with pytest.raises(AssertionError):
            audit(bad, card_names, set())


# ------------------------------------------------------------------ hostile names

HOSTILE_WORDS = sorted({*keyword.kwlist, *GENERATED, *NN_MODULE, "int", "float", "range", "len",
                        "dict", "super", "print", "eval", "exec", "open", "os", "W", "γ", "ℓ",
                        "ϵ", "ε", "X", "l", "gamma", "lambda", "Wq", "x", "P", "e", "E", "D", "V",
                        "T", "θ", "θ_base"})
_BRACED = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"),
                                blacklist_characters="{}\n\r"), max_size=12)
_PLAIN = st.from_regex(r"[A-Za-zα-ωℓϵ][A-Za-z0-9α-ω]{0,5}", fullmatch=True)


@st.composite
def hostile_names(draw) -> str:
    base = draw(st.one_of(st.sampled_from(HOSTILE_WORDS), _PLAIN))
    for _ in range(draw(st.integers(0, 2))):
        mark = draw(st.sampled_from(["_", "^"]))
        braced = draw(st.booleans())
        text = draw(_BRACED if braced else _PLAIN)
        base += f"{mark}{{{text}}}" if braced else f"{mark}{text}"
    return base + draw(st.sampled_from(["", "", "\u0303", "\u0302", "′"]))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(role=st.sampled_from(["card", "hyper", "param", "preset"]), name=hostile_names())
def test_a_hostile_name_is_rejected_with_a_location_or_builds_only_its_math(tmp_path, role,
                                                                            name, monkeypatch):
    work = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis reuses tmp_path: a fresh folder
    monkeypatch.chdir(work)
    text = card(**{role: name})
    lib, checker, diags = checked_text(text, work)
    if diags.errors:
        for d in diags.errors:
            assert d.span.file == str(work / "t.card") and d.span.line >= 1, d.render()
        return
    alg = next(a for f in lib.files for a in f.algorithms)
    try:
        code = source(checker, alg)
    except CardError as err:  # a located refusal at build time is still a refusal
        assert all(d.span.line >= 1 for d in err.diagnostics.errors), str(err)
        return
    audit(code, card_identifiers(lib, checker), {p.name for p in alg.presets})
    values = preset_values(checker.info(alg).sig, alg.presets[0].name, {})
    model, _ = instantiate(checker, alg, {identifier(k): v for k, v in values.items()})
    x = torch.randint(0, 16, (1, 3))
    logits, loss = model(x, targets=x)
    assert logits.shape == (1, 3, 16) and torch.isfinite(loss)
    assert sum(p.numel() for p in model.parameters()) == 2 * 16 * 8
    assert [p.name for p in work.iterdir()] == ["t.card"]  # it wrote nothing, ran nothing


def test_a_local_may_not_hide_a_card_it_calls(tmp_path):
    text = card().replace("1 e ← E[x]", "1 Twice ← E[x]\n2 e ← Twice(Twice)").replace(
        "2 return", "3 return") + "\nAlgorithm: y ← Twice(a)\nInput: a ∈ ℝ^{D}\n" \
        "Output: y ∈ ℝ^{D}\n1 return y = a + a\n"
    errs = errors_of(text, tmp_path)
    assert len(errs) == 1, errs
    assert "t.card:9:3: error: 'Twice' would hide the card 'Twice' it calls: both would be " \
        "'Twice' in generated code" in errs[0]
    assert "t.card:13:1: note: 'Twice' is here" in errs[0]
