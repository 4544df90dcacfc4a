"""Observation: the literal program with every value a card names shown to an observer.

The pass runs last on the program the `OBSERVED` pipeline lowered (cardc.lower.pipeline) and
rewrites each function and module so that

- a module's forward starts with `at = observing(self)`: the observer running it and the
  module's path in the model (`block.3.attn`), which the runtime knows (cardc.runtime.observe);
- a function takes `at` from its caller, as the caller's path and the callee's card name
  (`block.3.attn.AttentionHead`);
- each card input, each value a step assigns (by its name in the generated code: `S`, and
  `Y_h` for the family `Y^h` computed for every head at once) and a `return Y = …` is
  followed by `X = at.see("X", X, "gpt2.card:31")`: the observer records the value, and a
  hook may replace it, so every step after reads what the hook returned.

A name a card writes at several steps is keyed by each step's number (`X@1`, `X@2`; an input
so written is `X@0` on entry); a card called at several steps of its caller by the step
(`LayerNorm@1`). What runs more than once in one forward (a loop's steps, a module called
twice) the observer numbers at run time. Nothing else changes: the values computed are the
literal lowering's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from .. import ir
from .. import syntax as s
from .values import local_name

OBSERVING = "observing"  # the runtime's function a module's forward asks for its `at`


def observe(program: ir.Program, cards: dict[str, s.Algorithm]) -> None:
    """Rewrite `program` in place: `cards` holds each function's and module's card by name."""
    functions = {f.name: local_name(cards[f.name].label) for f in program.functions}
    for f in program.functions:
        seen = _Observed(cards[f.name], functions, [a.name for a in f.args])
        f.body = seen.body(f.body)
        f.args.append(ir.Arg("at", ir.Lit("None")))
    for m in program.modules:
        seen = _Observed(cards[m.name], functions, [a.name for a in m.inputs])
        start = ir.Assign(("at",), ir.Call(ir.Ref(OBSERVING), (ir.Ref("self"),)))
        m.body = [start, *seen.body(m.body)]


class _Observed:
    """One card's body, rewritten to show its values."""

    def __init__(self, alg: s.Algorithm, functions: dict[str, str], args: list[str]):
        self.alg, self.functions = alg, functions
        self.inputs = [local_name(n) for n in alg.args if local_name(n) in args]
        self.output = local_name(alg.outputs[0]) if len(alg.outputs) == 1 else None
        self.steps = {st.span.line: st.number or f"L{st.span.line}"
                      for st in s.nodes(alg.steps) if isinstance(st, s.Step)}
        self.file = _file_of(alg)
        self.writes: dict[str, set[str]] = defaultdict(set)
        self.calls: dict[str, set[str]] = defaultdict(set)

    def body(self, stmts: list[ir.Stmt]) -> list[ir.Stmt]:
        for name in self.inputs:
            self.writes[name].add("0")
        self._survey(stmts)
        declared = {local_name(n): item.span.line for item in self.alg.decls("Input")
                    if isinstance(item, s.Decl) for n in item.names}
        entry = [self._see(name, "0", ir.Note(line=f"{self.file}:{declared.get(name, 0)}"))
                 for name in self.inputs]
        return [*entry, *self._stmts(stmts)]

    # ------------------------------------------------------------------ what the card writes
    def _step(self, note: ir.Note) -> str | None:
        """The card's step number a statement comes from, or None (the lowering's own)."""
        if note.line is None:
            return None
        file, _, line = note.line.rpartition(":")
        return self.steps.get(int(line)) if file == self.file and line.isdigit() else None

    def _survey(self, stmts) -> None:
        for st in stmts:
            step = self._step(st.note) if hasattr(st, "note") else None
            if step is not None and isinstance(st, ir.Assign):
                for t in st.targets:
                    self.writes[t].add(step)
            if step is not None and isinstance(st, ir.Return) and self.output and \
                    not isinstance(st.value, ir.Ref):
                self.writes[self.output].add(step)
            if step is not None and not isinstance(st, (ir.Loop, ir.If, ir.While)):
                ir.rewrite(st, lambda n, step=step: self._count_call(n, step))
            for inner in ("body", "orelse"):
                self._survey(getattr(st, inner, ()))

    def _count_call(self, node, step: str) -> None:
        if isinstance(node, ir.Call) and isinstance(node.func, ir.Ref) and \
                node.func.id in self.functions:
            self.calls[self.functions[node.func.id]].add(step)

    # ------------------------------------------------------------------ rewriting
    def _key(self, name: str, step: str) -> str:
        return f"{name}@{step}" if len(self.writes[name]) > 1 else name

    def _see(self, name: str, step: str, note: ir.Note) -> ir.Assign:
        see = ir.Call(ir.Attr(ir.Ref("at"), "see"),
                      (ir.Lit(repr(self._key(name, step))), ir.Ref(name), ir.Lit(repr(note.line))))
        return ir.Assign((name,), see)

    def _stmts(self, stmts) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for st in stmts:
            step = self._step(st.note) if hasattr(st, "note") else None
            st = self._calls(st, step)
            if isinstance(st, (ir.Loop, ir.If, ir.While)):
                changes = {f: tuple(self._stmts(getattr(st, f)))
                           for f in ("body", "orelse") if hasattr(st, f)}
                out.append(replace(st, **changes))
            elif isinstance(st, ir.Return) and step is not None and self.output and \
                    not isinstance(st.value, ir.Ref):
                out += [ir.Assign((self.output,), st.value, st.note),
                        self._see(self.output, step, st.note),
                        ir.Return(ir.Ref(self.output))]
            else:
                out.append(st)
                if isinstance(st, ir.Assign) and step is not None:
                    out += [self._see(t, step, st.note) for t in st.targets]
        return out

    def _calls(self, st, step: str | None):
        """`st` with each call of a card's function handed the callee's `at` (every call: a
        function's `at` is never None), keyed by the step where the caller calls it at several."""
        if isinstance(st, (ir.Loop, ir.If, ir.While)):
            return st  # a compound statement's own steps are rewritten one by one

        def hand(node):
            if not (isinstance(node, ir.Call) and isinstance(node.func, ir.Ref) and
                    node.func.id in self.functions):
                return None
            card = self.functions[node.func.id]
            segment = f"{card}@{step}" if step is not None and len(self.calls[card]) > 1 \
                else card
            at = ir.Call(ir.Attr(ir.Ref("at"), "call"), (ir.Lit(repr(segment)),))
            return ir.Call(node.func, tuple(ir.rewrite(a, hand) for a in node.args),
                           (*((k, ir.rewrite(v, hand)) for k, v in node.kwargs), ("at", at)))

        return ir.rewrite(st, hand)


def _file_of(alg: s.Algorithm) -> str:
    """The file name a note gives for `alg`'s lines (`attention.card`)."""
    return alg.span.file.replace("\\", "/").rsplit("/", 1)[-1]
