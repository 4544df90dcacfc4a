"""Maps over heads lowered by structure: attention cards that match no whole pattern (rotary on
half a head, a fused qkv projection laid out head by head with QK-norm, a sliding window with a
scale of their own, a soft cap, per-head parameter families in a parallel-residual block) lower
to batched heads — SDPA where it can express the core, the exact batched math where it cannot —
with no Python loop over heads or positions, and equal their literal lowering (a loop per
head, the masked softmax step by step). Every model card in cards/ has no such loop either; the
lowering's modules import one another one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from codetext import unbroken
from decodecheck import walk_models

from cardc.build import checked, load_module, model_cards, source
from cardc.lower.cards import Lowering

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = sorted((ROOT / "tests" / "cards" / "heads").glob("*.card"))
SIZES = dict(V=61, D=32, H=4, N=2, D_f=40, H_kv=2, ctx=24, w=3)


def _compile(path: Path) -> list[tuple[str, str, str, bool]]:
    """(name, fused source, literal source, whether SDPA can express it) of each model card."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        lib, checker, _ = checked([str(path.relative_to(ROOT))], "cards")
        out = []
        for alg in model_cards(lib, checker, [str(path.relative_to(ROOT))]):
            out.append((alg.name, source(checker, alg, fuse=True),
                        source(checker, alg, fuse=False),
                        Lowering.is_language_model(checker.info(alg).sig)))
        return out


# helpers whose loops are not one pass per head, position or token: a scan's ⌈log₂ T⌉ rounds
# over whole tensors; the parts a card joins; sparse dispatch's pass over the E experts (each
# called once on its run of tokens) and, without gradients, over at most FEW (a constant)
# chosen (token, expert) pairs, or over a lone token's k experts; the axes of shapes broadcast
ROUNDS = {"linear_scan", "cat_broadcast", "route", "route_one", "broadcast_sizes",
          "log_likelihood"}  # its loop: chunks of positions, not heads


def _loops(text: str) -> list[str]:
    """Python loops in the forward methods and functions of a generated module, except stacks
    of layers (`for block in self.block`, or an index into a module list `self.block[l]`)
    and the rounds of a helper in ROUNDS."""
    found = []
    tree = ast.parse(text)
    bodies = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name not in ROUNDS]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        bodies += [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    for fn in bodies:
        for node in ast.walk(fn):
            if isinstance(node, ast.While) or isinstance(node, ast.For) and not _layers(node):
                found.append(f"{fn.name}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def _layers(loop: ast.For) -> bool:
    it = loop.iter
    if isinstance(it, ast.Attribute) and isinstance(it.value, ast.Name) and it.value.id == "self":
        return True
    var = loop.target.id if isinstance(loop.target, ast.Name) else None
    return any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and
               isinstance(n.value.value, ast.Name) and n.value.value.id == "self" and
               isinstance(n.slice, ast.Name) and n.slice.id == var
               for n in ast.walk(loop))


def _sizes(cls) -> dict:
    from inspect import signature

    return {k: v for k, v in SIZES.items() if k in signature(cls).parameters}


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda p: p.stem)
def variant(request):
    (name, fused, literal, lm), = _compile(request.param)
    assert lm
    return name, fused, literal


def test_variant_forward_has_no_loop_over_heads_or_positions(variant):
    name, fused, literal = variant
    assert _loops(fused) == [], name
    assert _loops(literal), name  # the literal twin loops over heads: the check can fail


def test_variant_uses_sdpa_unless_the_core_is_soft_capped(variant):
    name, fused, _ = variant
    capped = "torch.tanh(S)" in fused  # the cap c · tanh(S/c), its division in the queries
    assert ("F.scaled_dot_product_attention" in fused) != capped, name


def test_variant_fused_equals_literal_with_gradients(variant):
    name, fused, literal = variant
    a_mod, b_mod = load_module(fused, f"{name}_fused"), load_module(literal, f"{name}_literal")
    cls_a, cls_b = getattr(a_mod, name), getattr(b_mod, name)
    torch.manual_seed(0)
    a = cls_a(**_sizes(cls_a))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in a.parameters():  # gains and biases too, so that none hides a mistake
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    b = cls_b(**_sizes(cls_b))
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 61, (3, 11), generator=g)
    la, loss_a = a(x, x)
    lb, loss_b = b(x, x)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    loss_a.backward()
    loss_b.backward()
    for (pname, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=pname)


def test_rotary_is_recognised_by_its_math(variant):
    """A card whose steps are RoPE, rotate-half or on interleaved pairs, becomes the file's
    rotate_half or rotate_pairs, its tables computed once per positions; the literal twin keeps
    the card's steps."""
    name, fused, literal = variant
    for card, helper in (("RoPE(", "rotate_half("), ("RoPEPairs(", "rotate_pairs(")):
        if card in literal:
            assert helper in fused and f"def {card}" not in fused, name
            assert helper not in literal, name


def test_sliding_window_hides_positions_w_or_more_behind():
    """The fused window is the card's rule, not causal attention: a token w positions back
    changes nothing, one w − 1 back does."""
    (name, fused, _, _), = _compile(ROOT / "tests" / "cards" / "heads" / "sliding_window.card")
    cls = getattr(load_module(fused, "window_fused"), name)
    torch.manual_seed(0)
    model = cls(V=61, D=32, H=4, N=1, w=3).eval()
    x = torch.randint(0, 61, (1, 8))
    y = x.clone()
    y[0, 4] = (x[0, 4] + 1) % 61
    with torch.no_grad():
        a, b = model(x), model(y)
    # one layer: row t sees t − 2, t − 1, t; position 5 (0-based 4) reaches rows 4, 5, 6
    assert torch.equal(a[0, :4], b[0, :4]) and torch.equal(a[0, 7:], b[0, 7:])
    assert not torch.equal(a[0, 6], b[0, 6])


def test_sliding_window_keeps_a_bounded_cache():
    """Under a window of w positions the cache holds the last w − 1 keys and values of each
    layer (all that a new position reads before itself), however many tokens were decoded,
    and still gives full recomputation's logits, one token at a time and in chunks."""
    (name, fused, _, _), = _compile(ROOT / "tests" / "cards" / "heads" / "sliding_window.card")
    cls = getattr(load_module(fused, "window_cache"), name)
    torch.manual_seed(0)
    model = cls(V=61, D=32, H=4, N=2, w=3).eval()
    x = torch.randint(0, 61, (2, 16))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        rows = torch.cat([model(x[:, :6], cache=cache),
                          *(model(x[:, t:t + 1], cache=cache) for t in range(6, 13)),
                          model(x[:, 13:], cache=cache)], dim=1)
    assert (rows - full).abs().max().item() < 1e-5
    assert len(cache.kv) == 2
    assert all(k.shape[-2] == 2 and v.shape[-2] == 2 for k, v in cache.kv.values())


def test_head_map_calls_the_head_once_with_every_head():
    (_, fused, _, _), = _compile(ROOT / "tests" / "cards" / "heads" / "fused_per_head.card")
    fused = unbroken(fused)
    # the fused projection's columns, head by head: (B, T, 3 D) → (B, H, T, 3 d)
    assert "U.unflatten(-1, (self.H, 3 * self.D // self.H)).transpose(-3, -2)" in fused
    (_, fused, _, _), = _compile(ROOT / "tests" / "cards" / "heads" / "parallel_residual.card")
    fused = unbroken(fused)
    # the shared input gains a head axis; W^h_q of every head is one (H, D, d) view
    assert "PlainHead(X.unsqueeze(-3), W_q=self.W_qkv.unflatten(-1, (3, self.H, self.d))" \
        "[..., 0, :, :].movedim(-2, 0)" in fused


# ------------------------------------------------------------------ every model card


@pytest.fixture(scope="module")
def walked():
    paths = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cards").rglob("*.card"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        return walk_models(paths + [str(p.relative_to(ROOT)) for p in VARIANTS])


def test_walk_no_model_forward_loops_over_heads_or_positions(walked):
    assert {name: _loops(text) for name, _, text, _ in walked if _loops(text)} == {}


# ------------------------------------------------------------------ the lowering's imports


def test_lowering_modules_import_one_way():
    """cardc/lower/*.py import one another (type-only imports included) without a cycle."""
    lower = ROOT / "cardc" / "lower"
    graph: dict[str, set[str]] = {}
    for path in lower.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module} if node.module else {a.name for a in node.names}
        graph[path.stem] = {d for d in deps if (lower / f"{d}.py").exists()}
    assert graph["cards"] >= {"body"}  # the graph is read: the check can fail

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " → ".join((*path, node))
        for dep in graph[node]:
            visit(dep, (*path, node))

    for node in graph:
        visit(node, ())


def test_a_map_over_groups_hands_the_group_every_head_on_one_axis():
    """Groups of query heads that share one key and value head are one call whose queries
    hold every head of every group on one axis, SDPA's grouped-query layout: keys get no
    size-1 axis and the heads are joined once. Keys that reach more than SDPA (a soft cap
    multiplies them with the queries) keep the nested layout, which broadcasting needs."""
    (name, fused, _, _), = _compile(ROOT / "tests" / "cards" / "heads" / "grouped_window.card")
    fused = unbroken(fused)
    assert "_heads(" in fused and "unsqueeze" not in fused, name
    assert "Q.unflatten(-1, (-1, d)).transpose(-3, -2)" in fused
    for name, fused, _, _ in _compile(ROOT / "cards" / "gemma2.card"):  # groups, soft-capped
        assert "SoftCappedGroup(" in fused and "_heads(" not in fused, name
