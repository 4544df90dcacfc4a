"""Lowering of whole cards: which become modules or functions, where parameters live, and
what each constructor needs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .. import ir
from .. import syntax as s
from ..checker import CallInfo, Checker, expr_dim, split_name
from ..dims import Dim, solve
from ..info import preset_values
from ..names import number
from ..spelling import display
from ..types import BundleTy, Entry, FamilyTy, Ty
from .analysis import Masking, analyse, decoded_names, positioned, record, recorded
from .body import bound_sizes
from .likelihood import likelihood_step
from .observe import observe
from .parameters import Parameters, _ctor_dim, _ctor_value
from .pipeline import pipeline
from .resume import START, resumable
from .steps import Body
from .values import (
    Family,
    LowerError,
    Scope,
    Val,
    card_names,
    ctor_type,
    dim_expr,
    local_name,
)


def _doc(alg: s.Algorithm) -> str:
    if alg.name is None:
        return (alg.title or "").rstrip(".")
    head = f"{', '.join(alg.outputs)} ← {alg.name}({', '.join(alg.args)}"
    head += f" | {', '.join(alg.params)})" if alg.params else ")"
    text = " ".join(c.strip() for c in alg.comments) or (alg.title or "")
    return f"{head}: {text}" if text else head


class Lowering(Parameters):
    """Lowers a model card and everything it calls into one `ir.Program`."""

    def __init__(self, checker: Checker, fuse: bool = True,
                 analyses: Mapping[s.Algorithm, ir.Analysis] = {},  # noqa: B006 (read only)
                 observe: bool = False):
        self.checker = checker
        self.lib = checker.lib
        self.fuse, self.observe = fuse, observe
        # the fusion rules and passes (cardc.lower.pipeline)
        self.pipeline = pipeline(fuse, observe)
        self.cards: dict[str, s.Algorithm] = {}  # each function's and module's card, by name
        self.decoder = False  # lowering a causal language model: attention reads a KV cache
        self.masking = Masking()  # how each attention masks, reads a cache (cardc.lower.analysis)
        self.mask_sites = 0  # attention masks made once each through shared_mask, numbered from 1
        self.program = ir.Program(sources=[])
        self._modules: dict[int, ir.Module] = {}
        self._functions: dict[tuple[int, frozenset[str]], str] = {}
        self.passed_sizes: dict[str, list[str]] = {}  # a function's sizes that a call passes
        self._ctor: dict[int, list[str]] = {}
        self._walks: dict[tuple, Any] = {}  # what a card's steps hold, by finder
        for model, analysis in analyses.items():  # models built already: not lowered again
            record(checker, model, self.pipeline, analysis)

    def walk(self, alg: s.Algorithm, find: Callable[..., Any], *args: Any) -> Any:
        """`find(alg, *args)`, once per card: it walks the card's steps."""
        key = (id(alg), find, *args)
        if key not in self._walks:
            self._walks[key] = find(alg, *args)
        return self._walks[key]

    # ------------------------------------------------------------------ entry point
    def model(self, alg: s.Algorithm) -> ir.Program:
        self.decoder = self.pipeline.decodes and \
            self.is_language_model(self.checker.info(alg).sig)
        if self.decoder:
            self.masking.top = id(alg)
            self.masking.decoded = decoded_names(self.checker, alg)
            self.masking.positioned = positioned(self.checker, alg,
                                                 self.masking.decoded.get(id(alg), frozenset()))
        top = self.module(alg, top=True)
        for rewrite in self.pipeline.passes:
            rewrite(self.program, top, self.masking)
        if self.pipeline.observes:
            observe(self.program, self.cards)
        self.program.analysis = analyse(self.program, top, self.masking)
        record(self.checker, alg, self.pipeline, self.program.analysis)
        sig = self.checker.info(alg).sig
        ctor = self.ctor_args(alg)
        for preset in alg.presets:
            values = preset_values(sig, preset.name, {})
            self.program.presets[preset.name] = {
                local_name(k): _number(values[k], sig.hypers[k], preset) for k in ctor
                if k in values}
        self.program.doc = f"{top.name}, generated from its card. {_doc(alg)}"
        return self.program

    def decodes(self, alg: s.Algorithm) -> bool:
        """Whether the model card `alg` lowers to a forward that decodes with a KV cache: as
        recorded when it was lowered, which it is here if it never was."""
        return self.pipeline.decodes and self.analysis(alg).decodes

    def analysis(self, alg: s.Algorithm) -> ir.Analysis:
        """The analysis recorded when the model card `alg` was lowered with this checker and
        pipeline, lowering it (once) if it never was."""
        found = recorded(self.checker, alg, self.pipeline)
        return found if found is not None else \
            Lowering(self.checker, self.fuse, observe=self.observe).model(alg).analysis

    def origin(self, alg: s.Algorithm) -> str:
        path = self.lib.file_of(alg).path
        if path not in self.program.sources:
            self.program.sources.append(path)
        return f"{path}:{alg.span.line}"

    # ------------------------------------------------------------------ modules
    def module(self, alg: s.Algorithm, top: bool = False) -> ir.Module:
        if id(alg) in self._modules:
            return self._modules[id(alg)]
        info = self.checker.info(alg)
        sig = info.sig
        ctor = self.ctor_args(alg)
        m = ir.Module(local_name(alg.label), _doc(alg), self.origin(alg), [], [], [], [], [], [])
        sizes = _tree_symbols(sig.tree)
        for name in sorted(ctor, key=lambda n: n in sig.defaults):  # defaults last, as Python needs
            ty = sig.hypers.get(name, Ty(elem="ℕ"))
            default = sig.defaults.get(name)
            kind = "int" if name in sizes else ctor_type(ty)  # a size, however it was declared
            m.hypers.append(ir.Arg(local_name(name), _ctor_value(default) if default else None,
                                   kind))
        known = set(ctor)
        for name, d in sig.definitions.items():
            m.derived.append((local_name(name), _ctor_dim(d)))
            known.add(name)
        scope = Scope()
        for name, entry in sig.tree.members.items():
            self.store(alg, info.calls, name, entry, m, scope, None)
        runtime = self.runtime_dims(alg)
        aliases = {runtime[sym][0]: sym for sym in runtime}

        def dim_of(sym: str) -> ir.Expr:
            sym = sym.lstrip("?")
            if sym in known:
                return ir.Ref(f"self.{local_name(sym)}")
            sym = aliases.get(local_name(sym), sym)
            if sym in runtime:
                used.add(sym)
                return ir.Ref(runtime[sym][0])
            raise LowerError(alg.span, f"the dimension '{sym}' has no value in generated code")

        used: set[str] = set()
        body = Body(self, alg, info, scope, dim_of, "B")
        body.runtime_used = used
        body.training = ir.Ref("self.training")
        column = sig.layout == "column"
        for name, ty in sig.inputs:
            m.inputs.append(ir.Arg(local_name(name)))
            val = Val(ir.Ref(local_name(name)), ty, True, column and ty.rank == 2)
            var = _member_var(self.walk(alg, _quantified), name)
            if var is not None:  # e_t, t ∈ [T]: the whole family, its members as rows
                scope.values[name] = Family(var, local_name(name), ty,
                                            replace(val, rows=(Dim.sym(var.upper()),)),
                                            positions=True)
            else:
                scope.values[name] = val
        for name in self.tensor_hypers(alg):
            ty = sig.hypers[name]
            m.inputs.append(ir.Arg(local_name(name)))
            scope.values[name] = Val(ir.Ref(local_name(name)), ty, False, column and ty.rank == 2)
        if sig.inputs:  # else device_expr() reports the card, where a device is needed
            body.device = ir.Attr(ir.Ref(local_name(sig.inputs[0][0])), "device")
        body.dtype = _real_dtype(sig, scope)
        stmts = body.fuse_card() or body.run()
        prologue = [ir.Assign((runtime[d][0],), runtime[d][1]) for d in runtime if d in used]
        if top:
            prologue = [*self.size_guard(sig, body), *prologue,
                        *self.length_guard(m, body, prologue)]
        if top and self.is_language_model(sig):
            stmts = self.language_model(m, body, prologue, stmts)
            prologue = []
        m.body = prologue + stmts
        self._modules[id(alg)] = m
        self.cards[m.name] = alg
        self.program.modules.append(m)
        return m

    def tensor_hypers(self, alg: s.Algorithm) -> list[str]:
        """Hyperparameters that are tensors with no default (a Mask): given at call time."""
        sig = self.checker.info(alg).sig
        return [n for n in card_names(sig)
                if sig.hypers[n].shape and sig.hypers[n].value is None and n not in sig.defaults]

    def runtime_dims(self, alg: s.Algorithm) -> dict[str, tuple[str, ir.Expr]]:
        """Sizes read off the inputs at call time (T of X ∈ ℝ^{T×D}), with their Python
        names: a size a step names (`ℓ ← length(x)`) takes that name."""
        info = self.checker.info(alg)
        sig = info.sig
        shapes: dict[str, ir.Expr] = {}
        for name, ty in sig.inputs:
            _note_dims(shapes, local_name(name), _stored(sig, ty.shape), negative=True)
        fixed = set(card_names(sig)) | _tree_symbols(sig.tree)  # known when the module is built
        named = {d: n for n, d in bound_sizes(alg, info).items()}
        # an input named like a size (X ∈ ℝ^{T×D} beside an input T) keeps its name
        taken = {local_name(n) for n, _ in sig.inputs} | set(map(local_name, card_names(sig)))
        out = {}
        for sym, e in shapes.items():
            if sym in fixed:
                continue
            alias = named.get(Dim.sym(sym))
            py = local_name(alias) if alias else local_name(sym.strip("|"))
            py = f"len_{py}" if sym.startswith("|") and not alias else py
            while not alias and py in taken:
                py = f"size_{py}"
            out[sym] = (py, e)
        return out

    @staticmethod
    def is_language_model(sig) -> bool:
        """Token sequences in (a prompt, or a source and a target), a matrix of scores over
        their vocabulary out: one axis of the output (the last, the first in column layout) is
        an input's vocabulary size. BERT's hidden states (ℝ^{T×D}) are no such scores."""
        if not sig.inputs or sig.output is None or len(sig.output.shape) != 2 or sig.more:
            return False  # a card of several outputs is a model, not a language model
        if not all(x.elem == "ℕ" and len(x.shape) == 1 for _, x in sig.inputs):
            return False
        scores = sig.output.shape[0 if sig.layout == "column" else -1]
        return scores is not None and any(x.vocab == scores for _, x in sig.inputs)

    @staticmethod
    def size_guard(sig, body: Body) -> list[ir.Stmt]:
        """An input of real numbers whose every size the hyperparameters fix (an image
        ℝ^{C×S×S}) is checked against them: one of another size is refused, naming both,
        before a step meets it."""
        guard: list[ir.Stmt] = []
        fixed = set(card_names(sig)) | _tree_symbols(sig.tree)  # known when it is built
        for name, ty in sig.inputs:
            dims = _stored(sig, ty.shape)
            if ty.elem != "ℝ" or not dims or any(d is None or d.symbols - fixed for d in dims):
                continue
            x = local_name(name)
            got = f"size_{x}"
            shape = ir.Sub(ir.Attr(ir.Ref(x), "shape"), (ir.SliceX(ir.Lit(str(-len(dims))), None),))
            syms = sorted({sym for d in dims for sym in d.symbols})
            values = ", ".join(f"{display(sym)} = {{self.{local_name(sym)}}}" for sym in syms)
            shown = "×".join(display(str(d)) for d in ty.shape)
            msg = ir.Lit(f'f"{display(name)} has sizes {{{got}}}; the model takes '
                         f'ℝ^{{{{{shown}}}}}{", " + values if values else ""}"')
            want = ir.Seq(tuple(body.dim(d) for d in dims))
            guard += [ir.Assign((got,), ir.Call(ir.Ref("tuple"), (shape,), ())),
                      ir.If(ir.Bin("!=", ir.Ref(got), want), (ir.Raise("ValueError", msg),))]
        return guard

    @staticmethod
    def length_guard(m: ir.Module, body: Body, prologue) -> list[ir.Stmt]:
        """A model whose learned positions bound its sequence length records the bound
        (`self.max_seq_len`) and refuses a longer input with a message naming both."""
        m.max_seq_len = body.max_seq_len
        guard: list[ir.Stmt] = []
        for length in [p.targets[0] for p in prologue] if m.max_seq_len is not None else []:
            msg = ir.Lit(f'f"sequence length {{{length}}} exceeds the model\'s '
                         f'{{self.max_seq_len}} positions"')
            guard.append(ir.If(ir.Bin(">", ir.Ref(length), ir.Ref("self.max_seq_len")),
                               (ir.Raise("ValueError", msg),)))
        return guard

    def language_model(self, m: ir.Module, body: Body, prologue, stmts) -> list[ir.Stmt]:
        """forward(x, targets=None): logits, and with targets also the cross-entropy loss."""
        m.inputs.append(ir.Arg("targets", ir.Lit("None")))
        m.language_model = True
        ret = stmts[-1]
        if not isinstance(ret, ir.Return):
            raise LowerError(body.alg.span, "the model card must end with 'return'")
        logits = local_name(body.alg.outputs[0]) if body.alg.outputs else "logits"
        value, out = ret.value, []
        if isinstance(value, ir.Call) and value.func == ir.Ref("torch.softmax") and \
                value.kwargs == (("dim", ir.Lit("-1")),):
            # P = softmax(Z) over the vocabulary: the loss −log P[target] is cross-entropy on Z
            m.probabilities = True
            z = "logits" if logits != "logits" else "Z"
            out.append(ir.Assign((z,), value.args[0], ret.note))
            value = ir.Call(value.func, (ir.Ref(z),), value.kwargs)
        else:
            z = logits
        sig = self.checker.info(body.alg).sig
        likely = likelihood_step(value.args[0] if m.probabilities else value,
                                 body.dim(sig.output.shape[-1])) \
            if sig.layout != "column" else None
        if likely is not None:  # training's loss reads no more logits than it needs at once
            m.inputs.append(ir.Arg("nll", ir.Lit("None")))
            out.insert(0, likely)
        flat = ir.Call(ir.Attr(ir.Ref(z), "flatten"), (ir.Lit("0"), ir.Lit("-2")))
        loss = ir.Call(ir.Ref("F.cross_entropy"),
                       (flat, ir.Call(ir.Attr(ir.Ref("targets"), "flatten"))))
        return [*prologue, *stmts[:-1], *out,
                ir.Assign((logits,), value, ret.note),
                ir.If(ir.Bin("is", ir.Ref("targets"), ir.Lit("None")), (ir.Return(ir.Ref(logits)),)),
                ir.Assign(("loss",), loss),
                ir.Return(ir.Seq((ir.Ref(logits), ir.Ref("loss"))))]

    # ------------------------------------------------------------------ constructors
    def ctor_args(self, alg: s.Algorithm) -> list[str]:
        """Hyperparameters a card's module is built from: its own, and what its parts need."""
        if id(alg) in self._ctor:
            return self._ctor[id(alg)]
        info = self.checker.info(alg)
        sig = info.sig
        out = [n for n in card_names(sig)
               if n in sig.hypers and not sig.hypers[n].shape and n not in sig.definitions]
        runtime = set(self.runtime_dims(alg))

        def want(sym: str) -> None:
            sym = sym.lstrip("?")
            if sym not in out and sym not in sig.definitions and sym not in runtime:
                out.append(sym)

        def walk(entry: Entry) -> None:
            if isinstance(entry, Ty):
                for d in entry.shape:
                    for sym in (d.symbols if d is not None else ()):
                        want(sym)
            elif isinstance(entry, BundleTy):
                if entry.card is not None:  # a callee's bundle: its sizes come with the call
                    return
                for e in entry.members.values():
                    walk(e)
            else:
                for sym in entry.over.symbols:
                    want(sym)
                walk(entry.entry)

        walk(sig.tree)
        self._ctor[id(alg)] = out
        for call in info.calls.values():
            if not any(isinstance(e, BundleTy) for _, e in self.checker.info(call.callee).sig.params):
                continue
            for arg in self.ctor_args(call.callee):
                for sym in self.kwarg_symbols(call, arg, sig.hypers):
                    want(sym)
        return out

    def kwarg_symbols(self, call: CallInfo, arg: str, hypers: Mapping[str, object]) -> set[str]:
        """The caller's hyperparameters that the callee's `arg` is made from: those an
        explicit value names (not a step's value, nor a layer's index), or `arg` itself."""
        sig = self.checker.info(call.callee).sig
        if arg in call.hypers:
            given = call.hypers[arg]
            value = given.value if isinstance(given, s.Arg) else given
            return {n.id for n in _names(value) if n.id in hypers}
        if arg in call.bind:
            return call.bind[arg].symbols
        return set() if arg in sig.defaults else {arg}

    # ------------------------------------------------------------------ functions
    def function(self, alg: s.Algorithm, merged: frozenset[str] = frozenset(),
                 varied: frozenset[str] = frozenset()) -> str:
        """The function of a card without parameters of its own. With `merged`, the variant
        whose inputs of those names arrive as every head of every group on one axis, for
        a map over groups of heads (cardc.lower.heads): it returns the heads unjoined. With
        `varied`, the variant whose numbers of those names come one per head of a map over
        heads, a vector over the head axis in front of the card axes."""
        key = id(alg), merged, varied
        if key in self._functions:
            return self._functions[key]
        name = local_name(alg.label)
        if merged or varied:  # a name no card of the library and no other function has
            suffix = "_heads" if merged else "_per_head"
            while f"{name}{suffix}" in self._functions.values() or \
                    self.lib.find(f"{alg.name}{suffix}") is not None:
                suffix += "_"
            name += suffix
        self._functions[key] = name
        try:
            return self._function(alg, name, merged, varied)
        except LowerError:
            del self._functions[key]
            raise

    def _function(self, alg: s.Algorithm, name: str, merged: frozenset[str],
                  varied: frozenset[str] = frozenset()) -> str:
        info = self.checker.info(alg)
        sig = info.sig
        args: list[ir.Arg] = []
        scope = Scope()
        shapes: dict[str, ir.Expr] = {}
        told: dict[str, ir.Expr] = {}  # sizes only merged inputs give: neither read nor passed
        column = sig.layout == "column"
        for arg, ty in sig.inputs:
            args.append(ir.Arg(local_name(arg)))
            scope.values[arg] = Val(ir.Ref(local_name(arg)), ty, True, column and ty.rank == 2)
            # a merged input's width is a head's, not the card's: no size is read from it
            _note_dims(told if arg in merged else shapes, local_name(arg),
                       _stored(sig, ty.shape), negative=True)
        for pname, entry in sig.params:
            if pname in sig.hypers:
                continue
            tensors = self.flat_tensors(entry) if isinstance(entry, BundleTy) else [(pname, entry)]
            for tname, ty in tensors:
                args.append(ir.Arg(local_name(tname)))
                scope.tensors[tname] = ir.Ref(local_name(tname))
                # from the end: a map over heads hands a tensor its heads in front (lower.heads)
                _note_dims(shapes, local_name(tname), ty.shape, negative=True)
        bound = bound_sizes(alg, info)
        given: set[str] = set()  # sizes no argument's shape tells (a window w): passed in
        for hname in card_names(sig):
            hty = sig.hypers[hname]
            if hty.shape or hty.value is None or \
                    _unshaped(hname, hty, {**told, **shapes}, sig, bound):
                default = sig.defaults.get(hname)
                args.append(ir.Arg(local_name(hname), _ctor_value(default) if default else None))
                scope.values[hname] = Val(ir.Ref(local_name(hname)), hty, hname in varied,
                                          column and hty.rank == 2)
                if hty.value is not None:
                    given.add(hname)
        self.passed_sizes[name] = [h for h in card_names(sig) if h in given]
        # calls give hyperparameters by name: those with a default go last, as Python wants
        args.sort(key=lambda a: a.default is not None)
        used: dict[str, ir.Expr] = {}
        taken = {a.name for a in args}  # an argument named like a size keeps its name

        def local_size(sym: str) -> str:
            py = local_name(sym)
            while py in taken and sym not in given:
                py = f"size_{py}"
            return py

        def dim_of(sym: str) -> ir.Expr:
            sym = sym.lstrip("?")
            if sym in given:
                return ir.Ref(local_name(sym))
            if sym in sig.definitions:
                return dim_expr(sig.definitions[sym], dim_of)
            if sym in bound and sym not in shapes:
                return dim_expr(bound[sym], dim_of)
            if sym not in shapes:
                raise LowerError(alg.span, f"cannot tell the size '{sym}' from the arguments")
            used[sym] = shapes[sym]
            return ir.Ref(local_size(sym))

        body = Body(self, alg, info, scope, dim_of, "…")
        body.merged = merged
        if sig.inputs:  # else device_expr() reports the card, where a device is needed
            body.device = ir.Attr(ir.Ref(local_name(sig.inputs[0][0])), "device")
        body.dtype = _real_dtype(sig, scope)
        stmts = body.run()
        prologue = [ir.Assign((local_size(k),), v) for k, v in used.items()]
        self.program.functions.append(
            ir.Function(name, _doc(alg), self.origin(alg), args, prologue + stmts))
        self.cards[name] = alg
        return name

    # ------------------------------------------------------------------ procedures
    def procedure(self, alg: s.Algorithm) -> ir.Program:
        """A training or inference card: a function of its data, its hyperparameters and a
        model (the θ it is handed, an nn.Module of the card it calls)."""
        info = self.checker.info(alg)
        sig = info.sig
        name = local_name(alg.label)
        args: list[ir.Arg] = []
        scope = Scope()
        body = Body(self, alg, info, scope, lambda sym: dim_of(sym), "B")
        body.procedure = True
        datasets = {d.elems[0]: d for b in alg.blocks for d in b.items if isinstance(d, s.Dataset)}
        datasets.update({e: d for d in list(datasets.values()) for e in d.elems})
        models: list[str] = []
        for arg, ty in sig.inputs:
            base = split_name(arg)[0]
            data = next((d for e, d in datasets.items() if split_name(e)[0] == base), None)
            if data is not None and isinstance(ty, FamilyTy):
                elem = next(e for e in data.elems if split_name(e)[0] == base)
                body.datasets[elem] = (local_name(base), data.index,
                                       ty.entry if isinstance(ty.entry, Ty) else Ty((None,), "ℕ"))
                args.append(ir.Arg(local_name(base)))
            elif isinstance(ty, BundleTy):
                py = local_name(arg)
                args.append(ir.Arg(py))
                scope.values[arg] = Val(ir.Ref(py), ty)  # type: ignore[arg-type]
                models.append(arg)
            else:
                args.append(ir.Arg(local_name(arg)))
                scope.values[arg] = Val(ir.Ref(local_name(arg)), ty, True)
        for hname in card_names(sig):
            args.append(ir.Arg(local_name(hname)))
            scope.values[hname] = Val(ir.Ref(local_name(hname)), sig.hypers[hname])
        elems = list(body.datasets)
        first = local_name(elems[0]) if elems else local_name(sig.inputs[0][0])
        body.device = ir.Attr(ir.Ref(first), "device")

        def dim_of(sym: str) -> ir.Expr:
            sym = sym.lstrip("?")
            if sym in scope.values and isinstance(scope.values[sym], Val):
                return scope.values[sym].code
            for call in info.calls.values():  # the model's own sizes: theta.N_V
                model = next((g.id for g in call.params.values()
                              if isinstance(g, s.Name) and g.id in models), None)
                for k, d in call.bind.items():
                    if model and d == Dim.sym(sym) and not k.startswith("|"):
                        return ir.Attr(ir.Ref(local_name(model)), local_name(k))
            for elem, (examples, _, _) in body.datasets.items():
                if sym == f"|{elem}|":
                    return ir.Sub(ir.Attr(ir.Ref(local_name(elem)), "shape"), (ir.Lit("-1"),))
                if sym == "N_data":
                    return ir.Call(ir.Ref("len"), (ir.Ref(examples),))
            for arg, _ in sig.inputs:
                if sym == f"|{arg}|":
                    return ir.Sub(ir.Attr(ir.Ref(local_name(arg)), "shape"), (ir.Lit("-1"),))
            raise LowerError(alg.span, f"the size '{sym}' has no value in generated code")

        stmts = body.run()
        for preset in alg.presets:
            values = preset_values(sig, preset.name, {})
            self.program.presets[preset.name] = {
                local_name(k): _number(values[k], sig.hypers[k], preset) for k in card_names(sig)
                if k in values}
        prologue = body.prologue
        if any("optimizer" in getattr(x, "targets", ()) for x in prologue):
            args.append(ir.Arg("report", ir.Lit("None")))  # told the loss of every update
            args.append(ir.Arg(START, ir.Lit("None")))  # keeps the optimizer, may resume
            prologue, stmts = resumable(prologue, stmts)
        if "stop" in body.hooks:
            args.append(ir.Arg("stop", ir.Lit("None")))  # told each token drawn, may end the loop
        self.program.functions.append(
            ir.Function(name, _doc(alg), self.origin(alg), args, prologue + stmts,
                        _per_example(body.visits, len(body.updates))))
        self.program.doc = f"{alg.label}, generated from its card. {_doc(alg)}"
        return self.program

    def dim_value(self, alg: s.Algorithm, e: s.Expr) -> Dim:
        d = expr_dim(e, self.checker.info(alg).sig.definitions)
        if d is None:
            raise LowerError(e.span, "expected a dimension")
        return d


# ------------------------------------------------------------------ helpers


def _tree_symbols(entry: Entry) -> set[str]:
    """Every size a parameter's shape or a family's count names."""
    if isinstance(entry, Ty):
        return {sym.lstrip("?") for d in entry.shape if d is not None for sym in d.symbols}
    if isinstance(entry, BundleTy):
        return set().union(*(_tree_symbols(e) for e in entry.members.values()))
    return {sym.lstrip("?") for sym in entry.over.symbols} | _tree_symbols(entry.entry)


def _unshaped(name: str, ty: Ty, shapes: dict[str, ir.Expr], sig, bound) -> bool:
    """A size hyperparameter that no argument's shape, definition or step gives."""
    return ty.value == Dim.sym(name) and name not in shapes and name not in sig.definitions \
        and name not in bound


def _stored(sig, shape: tuple) -> tuple:
    """A value's card shape in storage order: a column-major card's matrices are flipped."""
    return shape[::-1] if sig.layout == "column" and len(shape) == 2 else shape


_SIZE = "|size|"  # a placeholder symbol: the size an axis has at run time


def _real_dtype(sig, scope: Scope) -> ir.Expr | None:
    """The number format of the reals the card computes: its first real input's, else (a
    card of token IDs) its first parameter's, as `.double()` leaves it."""
    name = next((n for n, ty in sig.inputs if getattr(ty, "elem", None) == "ℝ"), None)
    if name is not None:
        return ir.Attr(ir.Ref(local_name(name)), "dtype")
    first = next(iter(scope.tensors.values()), None)
    return None if first is None else ir.Attr(first, "dtype")


def _note_dims(shapes: dict[str, ir.Expr], arg: str, dims, negative: bool) -> None:
    """Sizes read off an argument's shape: `d` of an axis of d, and of 3d too (its size // 3)."""
    for k, d in enumerate(dims):
        if d is None or len(d.symbols) != 1:
            continue
        sym = next(iter(d.symbols))
        solved = solve(d, Dim.sym(_SIZE), {sym}) if sym not in shapes else None
        if solved is not None and solved[1].symbols == {_SIZE}:
            index = k - len(dims) if negative else k
            size = ir.Sub(ir.Attr(ir.Ref(arg), "shape"), (ir.Lit(str(index)),))
            shapes[sym] = dim_expr(solved[1], lambda _, size=size: size)


def _names(e) -> list[s.Name]:
    return [n for n in s.nodes(e) if isinstance(n, s.Name)]


def _number(value: float, ty: Ty, preset: s.Preset) -> ir.Expr:
    """A preset's value as a literal: ℕ whole, ℝ a float; never `inf` or `nan`."""
    try:
        return ir.Lit(number(int(value) if ty.elem == "ℕ" and math.isfinite(value) else value,
                             integral=ty.elem == "ℕ"))
    except (ValueError, OverflowError) as err:
        raise LowerError(preset.span, f"preset '{display(preset.name)}': {err}",
                         "give every hyperparameter a finite value") from None


def _member_var(quantified: set[str], name: str) -> str | None:
    """`e_t` when a step quantifies over t (∀t, Σ_t): an input that is a family of vectors."""
    return next((v for _, v in split_name(name)[1] if v in quantified), None)


def _quantified(alg: s.Algorithm) -> set[str]:
    """The variables a card's steps quantify over (∀t, Σ_t)."""
    bound = set()
    for node in s.nodes(alg.steps):
        if isinstance(node, s.ForAll):
            bound.update(node.vars)
        elif isinstance(node, s.Sum):
            bound.add(node.index)
    return bound


def _per_example(visits: list[int | None], updates: int) -> int | None:
    """A training card's updates per example it visits: the same in every loop over
    examples, and none outside them; None where that is not a fixed number (an update in a
    condition, or once per epoch); 1 for a card that makes none."""
    if not updates:
        return 1
    kinds = set(visits)
    if len(kinds) != 1 or None in kinds or kinds.pop() * len(visits) != updates:
        return None
    return visits[0]

