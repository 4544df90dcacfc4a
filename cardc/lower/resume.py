"""A training card's function made resumable: the caller keeps its optimizer and may skip the
updates a checkpoint already holds.

The generated function takes `start`, called once with the optimizer: the caller keeps it (to
checkpoint its state), restores a saved state into it, and answers how many updates were made
before. The loop that makes the updates skips that many iterations whole, reading no data and
drawing no random numbers, so that with the random state restored the run goes on exactly as
if it had never stopped.
"""

from __future__ import annotations

from .. import ir

START = "start"  # the generated function's argument
SKIP = "skip"  # the local counting the updates still to skip

_STEP = ir.Assign((), ir.Call(ir.Attr(ir.Ref("optimizer"), "step")))


def resumable(prologue: list[ir.Stmt], body: list[ir.Stmt]) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
    """The prologue asking `start` how many updates to skip, and the body skipping them in the
    innermost loop that updates; unchanged where no loop updates (one update is never
    resumed midway)."""
    skipped, found = _skip_in(tuple(body))
    if not found:
        return prologue, body
    ask = ir.Assign((SKIP,), ir.Cond(ir.Bin("is not", ir.Ref(START), ir.Ref("None")),
                                     ir.Call(ir.Ref(START), (ir.Ref("optimizer"),)), ir.Lit("0")),
                    ir.Note(None, None, "updates made before a resume; the caller keeps the "
                            "optimizer and restores its state"))
    return [*prologue, ask], list(skipped)


def _skip_in(stmts: tuple[ir.Stmt, ...]) -> tuple[tuple[ir.Stmt, ...], bool]:
    """`stmts` with the skip at the head of the innermost loop holding the optimizer's step,
    and whether one does."""
    out, found = [], False
    for st in stmts:
        if isinstance(st, ir.Loop) and not found and _updates(st.body):
            inner, deeper = _skip_in(st.body)
            st = ir.Loop(st.target, st.iter, inner if deeper else (_SKIP_HEAD, *st.body), st.note)
            found = True
        out.append(st)
    return tuple(out), found


def _updates(stmts: tuple[ir.Stmt, ...]) -> bool:
    """Whether the optimizer steps somewhere in `stmts`."""
    for st in stmts:
        if isinstance(st, ir.Assign) and (st.targets, st.value) == (_STEP.targets, _STEP.value):
            return True  # whatever its note
        nested = [getattr(st, k, ()) for k in ("body", "orelse")]
        if any(isinstance(b, tuple) and _updates(b) for b in nested):
            return True
    return False


_SKIP_HEAD = ir.If(ir.Ref(SKIP), (
    ir.Assign((SKIP,), ir.Bin("-", ir.Ref(SKIP), ir.Lit("1")),
              ir.Note(None, None, "an update the resumed checkpoint holds")),
    ir.Assign((), ir.Ref("continue")),
))
