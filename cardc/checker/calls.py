"""The call checker: what a called name means (one table: a card-valued hyperparameter, a
function the card defines, a builtin, an optimizer, a filter, dropout, a card of the library),
and the call itself: arguments unified with the callee's declared shapes, its sizes bound in
the caller's symbols, its parameters and hyperparameters matched."""

from __future__ import annotations

from pathlib import Path

from .. import syntax as s
from ..builtins import BUILTINS, BY_NAME, FILTERS, OPTIMIZERS, RESULT, TABLE
from ..dims import ONE, Dim, solve
from ..library import shown_folders
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, FuncTy, SetTy, Ty, subst_dim, substitute
from .messages import (
    _call_hint,
    _card_like,
    _entry_text,
    _join_hints,
    _shown,
    _spelling_hint,
    _suggest,
    _text,
)
from .results import MAX_CALL_DEPTH, CallInfo, CheckError, ModelTy, Signature
from .scope import BodyState, Expressions, Part
from .shapes import _d, _members, _same_entry, broadcast_shape, dims_equal, expr_dim

# the rule that checks a call to a builtin: its own for a filter, dropout or an optimizer
_KINDS = {b.name: b.rule if b.rule in ("filter", "argtop", "indicator", "dropout", "optimizer",
                                       "patches")
          else "builtin"
          for b in TABLE}


class CallChecker(Part):
    """Types calls: to builtins, to functions the card defines, to other cards."""

    def __init__(self, state: BodyState, exprs: Expressions):
        super().__init__(state)
        self.exprs = exprs

    def call(self, e: s.Call) -> Entry:
        """A call, checked by the rule for what its name means (resolved once, `callee`)."""
        kind, target = self.callee(e.func)
        rule = {"model": self.call_model, "function": self.apply_function, "card": self.call_card,
                "optimizer": self.apply_optimizer, "filter": self.apply_filter,
                "argtop": self.apply_argtop, "indicator": self.apply_indicator,
                "dropout": self.apply_dropout, "patches": self.apply_patches,
                "builtin": self.call_builtin,
                "value": self.not_a_function, "unknown": self.unknown_callee}[kind]
        return rule(e, target)

    def callee(self, name: str) -> tuple[str, object]:
        """What a called name means, first match first: a card-valued hyperparameter (a card
        when this run binds it), a function the card defines (its loss(θ) shadows a card
        'loss'), a card of the library, a builtin no card shadows, another value, nothing."""
        state = self.state
        model = state.sig.models.get(name)
        if model is not None:
            bound = state.c.bindings.get((id(state.alg), name))
            return ("card", bound) if bound is not None else ("model", model)
        local = state.try_lookup(name)
        if isinstance(local, FuncTy):
            return "function", local
        card = state.c.lib.find(name, state.file)
        if card is not None:
            return "card", card
        if name in _KINDS:
            return _KINDS[name], None
        return ("value", local) if local is not None else ("unknown", None)

    def call_builtin(self, e: s.Call, _: None = None) -> Ty:
        return self.apply_builtin(e.func, [self.exprs.tensor(a) for a in e.args], e)

    def not_a_function(self, e: s.Call, local: Entry) -> Entry:
        self.error(e.span, f"'{display(e.func)}' is {local}, not a function",
                   hint=f"define it as a function of its parameters: {display(e.func)}(θ) ← …")
        raise CheckError

    def unknown_callee(self, e: s.Call, _: None = None) -> Entry:
        cards = [a.name for _, a in self.c.lib.algorithms() if a.name]
        others = sorted(BUILTINS) + [
            k for sc in self.state.scopes for k, v in sc.items() if isinstance(v, FuncTy)]
        hint = _call_hint(e) or _spelling_hint(e.func) or _join_hints(
            _suggest(e.func, cards) or (None if _card_like(e.func) else
                                        _suggest(e.func, others)), self.searched())
        self.error(e.span, f"unknown card or function '{display(e.func)}'", hint)
        raise CheckError

    def searched(self) -> str:
        """Where a card name was looked for, in order."""
        here = str(Path(self.state.file.path).parent)
        folders = ", ".join(shown_folders([here, *self.c.lib.roots]))
        return f"Cards are looked for in {folders} (and the folders above the card's); add a " \
               "folder with --library."

    def apply_optimizer(self, e: s.Call, _: None = None) -> Entry:
        """AdamW(θ, ∇loss(θ) | η, …): parameters and their gradient in, parameters out."""
        if len(e.args) != 2:
            self.error(e.span, f"{e.func} takes the parameters and their gradient",
                       hint=f"write {e.func}(θ, ∇loss(θ) | η)")
            raise CheckError
        theta, grad = (self.exprs.expr(a) for a in e.args)
        if not isinstance(theta, BundleTy) or not _same_entry(theta, grad):
            self.error(e.span, f"{e.func} updates parameters with their gradient; given "
                               f"{theta} and {grad}")
            raise CheckError
        if len(e.params) > OPTIMIZERS[e.func]:
            self.error(e.span, f"{e.func} takes at most {OPTIMIZERS[e.func]} hyperparameters "
                               "(η, β_1, β_2, λ)")
            raise CheckError
        for p in e.params:
            ty = self.exprs.expr(p)
            if not isinstance(ty, Ty) or ty.shape:
                self.error(p.span, f"a hyperparameter of {e.func} is a number, not {ty}")
                raise CheckError
        return theta

    def apply_function(self, e: s.Call, f: FuncTy) -> Entry:
        """P(θ) as defined; P(φ) with φ of θ's type stands for the same value at φ."""
        if len(e.args) != len(f.params) or e.params:
            self.error(e.span, f"'{display(e.func)}' is {f}: it takes {len(f.params)} argument(s)")
            raise CheckError
        for arg, param in zip(e.args, f.params, strict=True):
            got, want = self.exprs.expr(arg), self.state.try_lookup(param)
            if not _same_entry(got, want):
                self.error(arg.span, f"'{display(e.func)}' is a function of {display(param)}, "
                                     f"which is {want}; given {got}")
                raise CheckError
        return f.result

    def apply_filter(self, e: s.Call, _: None = None) -> Ty:
        """top_k(w | k), top_p(w | p): a vector of weights in, a distribution of its shape out."""
        bound, what = FILTERS[e.func]
        usage = f"write {e.func}(w | {bound}): {bound} is {what}"
        if len(e.args) != 1:
            self.error(e.span, f"{e.func} filters one vector of weights, given {len(e.args)} "
                               "arguments",
                       hint=usage)
            raise CheckError
        if len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, f"{e.func} takes one number after '|', its {bound}", hint=usage)
            raise CheckError
        weights = self.exprs.tensor(e.args[0])
        if weights.rank != 1:
            self.error(e.args[0].span, f"{e.func} filters a vector of weights, not {weights}",
                       hint="index one column: p ← P[:, t]")
            raise CheckError
        self.filter_bound(e.func, e.params[0])
        return Ty(weights.shape)

    def apply_argtop(self, e: s.Call, _: None = None) -> SetTy:
        """argtop_k(r | k): a vector of scores in, the set of its k best indices out."""
        usage = f"write {display(e.func)}(r | k): the indices of the k largest entries of r"
        if len(e.args) != 1 or len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, f"{display(e.func)} takes one vector of scores, then k after '|'",
                       hint=usage)
            raise CheckError
        scores = self.exprs.tensor(e.args[0])
        if scores.rank != 1 or scores.elem == "𝔹":
            self.error(e.args[0].span, f"{display(e.func)} ranks the entries of a vector of "
                                       f"numbers, not {scores}", hint=usage)
            raise CheckError
        k = self.exprs.tensor(e.params[0])
        given = e.params[0]
        if k.shape or k.elem != "ℕ" or isinstance(given, s.Num) and given.value < 1:
            shown = given.text if isinstance(given, s.Num) else str(k)
            self.error(given.span, f"the k of {display(e.func)} is a whole number ≥ 1, not "
                                   f"{shown}", hint=usage)
            raise CheckError
        return SetTy(scores.shape[0])

    def apply_indicator(self, e: s.Call, _: None = None) -> Ty:
        """indicator(I): a set of indices of [n] in, ℝ^{n} out, 1 at its members."""
        if len(e.args) != 1 or e.params:
            self.error(e.span, f"{display(e.func)} takes one set of indices",
                       hint="write indicator(I) for I ← argtop_k(r | k)")
            raise CheckError
        given = self.exprs.expr(e.args[0])
        if not isinstance(given, SetTy):
            self.error(e.args[0].span, f"{display(e.func)} marks the members of a set of "
                                       f"indices, not {given}",
                       hint="write indicator(I) for I ← argtop_k(r | k)")
            raise CheckError
        return Ty((given.of,))

    def apply_dropout(self, e: s.Call, _: None = None) -> Ty:
        """dropout(X | p): a tensor in, one of its shape out; p a number in [0, 1)."""
        usage = "write dropout(X | p): p is the probability that an entry is zeroed"
        if len(e.args) != 1 or len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, "dropout takes one tensor, then its probability after '|'",
                       hint=usage)
            raise CheckError
        x = self.exprs.tensor(e.args[0])
        p = self.exprs.tensor(e.params[0])
        given = e.params[0]
        if p.shape or isinstance(given, s.Num) and not 0 <= given.value < 1:
            self.error(given.span, f"the probability of dropout lies in [0, 1), not "
                                   f"{given.text if isinstance(given, s.Num) else p}", hint=usage)
            raise CheckError
        return Ty(x.shape, "ℝ")

    def apply_patches(self, e: s.Call, _: None = None) -> Ty:
        """patches(X | p): X ∈ ℝ^{C×H×W} (or ℝ^{H×W}) cut into p×p blocks, one flattened block
        a row: ℝ^{(H/p)(W/p)×C p p}. p is a whole number that divides H and W."""
        usage = "write patches(X | p): X ∈ ℝ^{C×H×W} cut into p×p blocks, one row per block"
        if len(e.args) != 1 or len(e.params) != 1 or isinstance(e.params[0], s.Arg):
            self.error(e.span, "patches takes one image, then its block size after '|'",
                       hint=usage)
            raise CheckError
        x = self.exprs.tensor(e.args[0])
        if x.rank not in (2, 3) or None in x.shape:
            self.error(e.args[0].span, f"patches cuts an image ℝ^{{C×H×W}} or ℝ^{{H×W}}, not {x}",
                       hint=usage)
            raise CheckError
        p = self.exprs.tensor(e.params[0])
        if p.shape or p.elem != "ℕ" or p.value is None or not p.value.terms:
            self.error(e.params[0].span, "the block size of patches is a whole number ≥ 1 (a "
                                         f"hyperparameter or a number), not {p}", hint=usage)
            raise CheckError
        *channels, height, width = x.shape
        blocks = [self.blocks(side, p.value, e.params[0]) for side in (height, width)]
        area = p.value * p.value
        return Ty((blocks[0] * blocks[1], channels[0] * area if channels else area))

    def blocks(self, side: Dim, size: Dim, given: s.Expr) -> Dim:
        """How many blocks of `size` a side cuts into; a size that does not divide a side
        whose length is a number is an error here (presets check the others)."""
        count = side / size
        value = None if count is None else count.constant()
        if count is None or value is not None and (value.denominator != 1 or value < 1):
            self.error(given.span, f"a block of {display(str(size))} does not divide a side of "
                                   f"{display(str(side))}",
                       hint="the block size must divide the image's height and width")
            raise CheckError
        return count

    def filter_bound(self, func: str, given: s.Expr) -> None:
        """k of top_k is a whole number ≥ 1; p of top_p a number in (0, 1]."""
        ty = self.exprs.tensor(given)
        value = given.value if isinstance(given, s.Num) else None
        if ty.shape:
            problem = f"is a number, not {ty}"
        elif func == "top_k" and (ty.elem != "ℕ" or value is not None and value < 1):
            problem = f"is a whole number ≥ 1, not {given.text if value is not None else ty}"
        elif func == "top_p" and value is not None and not 0 < value <= 1:
            problem = f"lies in (0, 1], not {given.text}"
        else:
            return
        bound, what = FILTERS[func]
        self.error(given.span, f"the {bound} of {func} {problem}", hint=f"{bound} is {what}")

    def apply_builtin(self, name: str, args: list[Ty], e: s.Expr) -> Ty:
        """An element-wise builtin keeps its argument's shape, a reducing one drops the last
        axis (min and max of two arguments compare them entry by entry), length is a whole
        number."""
        builtin = BY_NAME[name]
        if len(args) == 2 and 2 in builtin.args:
            return self.pairwise(name, args, e)
        if len(args) != 1:
            self.error(e.span, f"{name} takes one argument")
            raise CheckError
        (x,) = args
        if builtin.rule == "length":
            return Ty(elem="ℕ", value=x.shape[0] if x.shape else ONE)
        if builtin.rule == "reducing":
            return Ty(x.shape[:-1])
        kind = RESULT[name]
        return Ty(x.shape, x.elem if kind == "same" and x.elem != "𝔹" else
                  "ℕ" if kind != "ℝ" else "ℝ")

    def pairwise(self, name: str, args: list[Ty], e: s.Expr) -> Ty:
        """max(a, b), min(a, b): entry by entry, the shapes broadcast as a sum's do (a number
        beside a tensor bounds every entry); whole numbers stay whole."""
        a, b = args
        shape = broadcast_shape(a.shape, b.shape)
        if shape is None:
            self.error(e.span, f"{name}(a, b) compares entry by entry; cannot compare {a} with {b}",
                       hint=f"shapes must match, or one must be a number or a trailing part of "
                            f"the other; {name}(x) takes the {name} of a vector")
            raise CheckError
        return Ty(shape, "ℕ" if all(x.elem == "ℕ" for x in args) else "ℝ")

    def call_card(self, e: s.Call, callee: s.Algorithm) -> Entry:
        if len(self.c.active) >= MAX_CALL_DEPTH and id(callee) not in self.c.infos:
            self.error(e.span, f"cards call each other too deeply (more than {MAX_CALL_DEPTH} "
                               "levels)", hint="a model is a few levels of cards: block, "
                                               "attention, normalisation")
            raise CheckError
        info = self.c.info(callee)
        sig = info.sig
        args = list(e.args)
        if 0 < len(args) < len(sig.inputs):  # an omitted context sequence: Z = X (self-attention)
            args += [args[0]] * (len(sig.inputs) - len(args))
        if len(args) != len(sig.inputs):
            self.error(e.span, f"'{callee.name}' takes {len(sig.inputs)} input(s), given {len(e.args)}",
                       notes=((callee.span, "declared here"),))
            raise CheckError
        bind: dict[str, Dim] = {}
        lift: tuple[Dim, ...] = ()
        for arg, (pname, want) in zip(args, sig.inputs, strict=False):
            if not isinstance(want, Ty):  # an input declared by prose alone: a bundle
                self.error(arg.span, f"'{callee.name}' takes '{display(pname)}' as a bundle of "
                                     "parameters, which no step of a card can pass it",
                           notes=((callee.span, "declared here"),),
                           hint=f"declare '{display(pname)}' with a type: "
                                f"'{display(pname)} ∈ ℝ^{{…}}'")
                raise CheckError
            got = self.exprs.tensor(arg)
            extra = got.rank - want.rank
            if extra > 0 and not lift:  # an ℝ^{D} card applied to ℝ^{T×D}: mapped over rows
                lift = tuple(d for d in got.shape[:extra] if d is not None)
            if extra < 0 or not self.unify(want.shape, got.shape[max(extra, 0):], bind):
                self.error(arg.span, f"'{callee.name}' expects {display(pname)} ∈ "
                                     f"{_shown(want, bind)}, got {got}",
                           notes=((callee.span, f"'{callee.name}' is declared here"),))
                raise CheckError
            if want.vocab is not None and got.vocab is not None \
                    and not self.unify((want.vocab,), (got.vocab,), bind):
                self.error(arg.span, f"'{callee.name}' expects tokens of a vocabulary of "
                                     f"{_d(subst_dim(want.vocab, bind))}, got tokens of one of "
                                     f"{_d(got.vocab)}",
                           notes=((callee.span, f"'{callee.name}' is declared here"),))
                raise CheckError
        params, hypers = self.bind_params(sig, e, bind)
        self.require_params(e, sig, params)
        for name, dim in sig.definitions.items():
            if name not in bind:
                bind[name] = subst_dim(dim, bind)
        for name, hty in sig.hypers.items():
            if name not in bind and hty.value is not None and name not in sig.definitions:
                mine = self.state.try_lookup(name)
                default = _default_size(sig, name, bind)
                if isinstance(mine, Ty) and mine.value is not None:
                    bind[name] = mine.value
                elif default is not None:  # `n ∈ ℕ = 3`, which the call does not give
                    bind[name] = default
                else:  # inferred from later use (X + MHAttention(X̃ | …) fixes d_out = d_e)
                    bind[name] = Dim.sym("?" + name)
        for bundle in self.adopted:
            self.in_caller_sizes(bundle, bind)
        out = substitute(sig.output or Ty(), bind)
        outs = tuple(_lifted(substitute(o or Ty(), bind), lift) for o in (sig.output, *sig.more)) \
            if sig.more else ()
        self.info.calls[id(e)] = CallInfo(callee, dict(bind), lift, params, hypers, outs)
        if outs and self.state.naming != id(e):
            names = ", ".join(display(o) for o in callee.outputs)
            self.error(e.span, f"'{callee.name}' has {len(outs)} outputs, {names}: a step names "
                               f"each, '{names} ← {callee.name}(…)'",
                       notes=((callee.span, f"'{callee.name}' is declared here"),))
            raise CheckError
        if not isinstance(out, Ty):  # a training card returns parameters
            return out
        return Ty(lift + out.shape, out.elem, vocab=out.vocab)

    def call_model(self, e: s.Call, model: ModelTy) -> Ty:
        """`M(x | θ)` for a card-valued M not bound to a card: its declared signature, θ the
        parameters of whichever card it stands for."""
        name = display(e.func)
        if len(e.args) != 1:
            self.error(e.span, f"{name} takes one input, {str(model).split(' → ')[0]}; given "
                               f"{len(e.args)}",
                       notes=((model.decl.span, f"{name} is declared here"),))
            raise CheckError
        if len(e.params) != 1 or not isinstance(e.params[0], s.Name):
            self.error(e.span, f"{name} takes its parameters after '|': write "
                               f"{name}(x | θ)", notes=((model.decl.span, "declared here"),))
            raise CheckError
        theta = e.params[0]
        have = self.state.lookup(theta.id, theta.span)
        if not isinstance(have, BundleTy):
            self.error(theta.span, f"{name}'s parameters are a bundle, and '{display(theta.id)}'"
                                   f" is {have}", hint="declare them by prose alone: "
                                                       f"'Input: θ, the parameters of {name}.'")
            raise CheckError
        self.info.types[id(theta)] = have
        got = self.exprs.tensor(e.args[0])
        want, bind = model.input, {}
        extra = got.rank - want.rank
        lift = tuple(d for d in got.shape[:extra] if d is not None) if extra > 0 else ()
        if extra < 0 or not self.unify(want.shape, got.shape[max(extra, 0):], bind) or (
                want.vocab is not None and got.vocab is not None
                and not self.unify((want.vocab,), (got.vocab,), bind)):
            self.error(e.args[0].span, f"{name} expects {_shown(want, bind)}, got {got}",
                       notes=((model.decl.span, f"{name} is declared here"),))
            raise CheckError
        out = substitute(model.output, bind)
        assert isinstance(out, Ty)
        return Ty(lift + out.shape, out.elem, vocab=out.vocab)

    def bind_params(self, sig: Signature, e: s.Call, bind: dict[str, Dim]):
        params: dict[str, s.Expr] = {}
        hypers: dict[str, s.Expr] = {}
        self.adopted: list[BundleTy] = []
        positional = [p for p in e.params if not isinstance(p, s.Arg)]
        if len(positional) > len(sig.params):
            self.error(e.span, f"'{sig.alg.name}' takes {len(sig.params)} parameter(s) after '|', "
                               f"given {len(positional)}")
            raise CheckError
        for p, (name, want) in zip(positional, sig.params, strict=False):
            if name in sig.hypers:
                hypers[name] = p
                self.exprs.tensor(p)
                continue
            params[name] = p
            self.bind_entry(want, p, bind, sig.alg)
        for p in e.params:
            if isinstance(p, s.Arg):
                target = p.target.base if isinstance(p.target, s.Index) else p.target
                if not isinstance(target, s.Name) or target.id not in sig.hypers:
                    self.error(p.target.span, f"'{sig.alg.name}' has no hyperparameter "
                                              f"'{_text(target)}'",
                               notes=((sig.alg.span, "declared here"),))
                    continue
                hypers[target.id] = p
                if isinstance(p.target, s.Index):  # Mask[t, t′] = [[t ≤ t′]]: a rule
                    idx = [i.id for i in p.target.items if isinstance(i, s.Name)]
                    self.state.scopes.append({i: Ty(elem="ℕ") for i in idx})
                    try:
                        self.exprs.tensor(p.value)
                    finally:
                        self.state.scopes.pop()
                else:
                    size = self.exprs.tensor(p.value).value
                    if size is not None and target.id not in bind:  # D_f = F: a size the
                        bind[target.id] = size                      # callee's shapes take
        return params, hypers

    def in_caller_sizes(self, bundle: BundleTy, bind: dict[str, Dim]) -> None:
        """A bundle that took its callee's shape states it in the sizes the call binds
        (`D_f = F`), so that `info` counts it, and `build` makes it, from the caller's
        hyperparameters. A size the call leaves to be found (`?D_f`) keeps the callee's name,
        which the cards above this one bind by that name."""
        known = {k: v for k, v in bind.items() if not any(n.startswith("?") for n in v.symbols)}
        rewritten = substitute(bundle, known)
        assert isinstance(rewritten, BundleTy)
        bundle.members.update(rewritten.members)

    def require_params(self, e: s.Call, sig: Signature, params: dict[str, s.Expr]) -> None:
        """Every parameter of the callee is passed: a card computes with its weights, so a
        call without them has no meaning to count, build or run."""
        missing = [name for name, _ in sig.params
                   if name not in sig.hypers and name not in params]
        if not missing:
            return
        names = ", ".join(f"'{display(n)}'" for n in missing)
        wanted = ", ".join(display(n) for n, _ in sig.params if n not in sig.hypers)
        unbound = [n for n, entry in _members(self.sig.tree).items()
                   if isinstance(entry, BundleTy) and not entry.members]
        if len(missing) == 1 and len(unbound) == 1 and not params:  # the caller's only
            wanted = display(unbound[0])                             # bundle no call binds
        self.error(e.span, f"'{sig.alg.name}' needs its parameter{'s' if len(missing) > 1 else ''}"
                           f" {names}, which this call does not pass",
                   hint="pass the caller's parameters after '|': "
                        f"{display(e.func)}(… | {wanted})",
                   notes=((sig.alg.span, f"'{sig.alg.name}' is declared here"),))
        raise CheckError

    def bind_entry(self, want: Entry, given: s.Expr, bind: dict[str, Dim], callee) -> None:
        if isinstance(given, s.Index) and isinstance(given.base, s.Name):
            base = display(given.base.id)
            self.error(given.span, f"a call binds a parameter by its name, not a part of "
                                   f"'{base}'",
                       hint=f"declare a family of parameters instead of '{base}' (`For h ∈ [H]: "
                            f"γ^h ∈ ℝ^{{d}}`) and pass 'γ^h', or use the part of '{base}' in an "
                            "expression of this card")
            raise CheckError
        if not isinstance(given, s.Name):
            self.error(given.span, "expected the name of a parameter or bundle")
            raise CheckError
        have = self.state.lookup(given.id, given.span)
        if isinstance(have, BundleTy) and not have.members and isinstance(want, BundleTy):
            adopted = BundleTy(want.members, callee.name)
            have.members.update(adopted.members)  # the caller's bundle takes the callee's shape
            have.card = callee.name
            self.adopted.append(have)  # in the callee's sizes until the call's are all bound
            self.info.types[id(given)] = have
            return
        if not self.unify_entry(want, have, bind):
            self.error(given.span, f"'{display(given.id)}' is {_entry_text(have)} but "
                                   f"'{callee.name}' expects {_entry_text(want)}")
            raise CheckError
        self.info.types[id(given)] = have

    def unify_entry(self, want: Entry, have: Entry, bind: dict[str, Dim]) -> bool:
        if isinstance(want, FamilyTy):
            want = want.entry
        if isinstance(have, FamilyTy):
            have = have.entry
        if isinstance(want, Ty) and isinstance(have, Ty):
            return self.unify(want.shape, have.shape, bind)
        if isinstance(want, BundleTy) and isinstance(have, BundleTy):
            w, h = list(want.members.values()), list(have.members.values())
            return len(w) == len(h) and all(self.unify_entry(a, b, bind) for a, b in zip(w, h, strict=False))
        return False

    def unify(self, want: tuple, got: tuple, bind: dict[str, Dim]) -> bool:
        """Bind the callee's symbols so that its dimensions `want` equal the caller's `got`:
        each dimension that leaves one unknown symbol, linearly, binds it (`3 d` against
        `3 D/H`), in as many passes as bindings make more dimensions solvable."""
        if len(want) != len(got):
            return False
        pending = [(w, g) for w, g in zip(want, got, strict=True) if w is not None and g is not None]
        while True:
            left = []
            for w, g in pending:
                unknowns = w.symbols - set(bind)
                solved = solve(subst_dim(w, bind), g, unknowns) if unknowns else None
                if solved is None:
                    left.append((w, g))
                else:
                    bind[solved[0]] = solved[1]
            if len(left) == len(pending):
                break
            pending = left
        return all(dims_equal(subst_dim(w, bind), g) for w, g in pending)


def _default_size(sig: Signature, name: str, bind: dict[str, Dim]) -> Dim | None:
    """A size's default (`n ∈ ℕ = 3`, `D_f ∈ ℕ = 4 D`) in the caller's sizes, where every
    size it reads is bound; else None."""
    default = sig.defaults.get(name)
    dim = expr_dim(default, {}) if default is not None else None
    if dim is None or not dim.symbols <= set(bind):
        return None
    return subst_dim(dim, bind)


def _lifted(out: Entry, lift: tuple[Dim, ...]) -> Entry:
    """An output of a call mapped over rows: one row per row of the argument."""
    return Ty(lift + out.shape, out.elem, vocab=out.vocab) if isinstance(out, Ty) else out
