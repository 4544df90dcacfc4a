"""Values made once (a pass): an expression of the generated code that reads only
hyperparameters, sizes, devices, number formats, the positions' start and values made this
way — ALiBi's slopes, a bias of the positions — is the same in every layer, and in every
forward of the same sizes. It becomes `shared_value(site, lambda: …, …what it reads)`
(cardc/runtime/modelkit.py), made once per what it reads and shared: a decoded token makes it
once for all the layers, where each layer made its own. A tensor it reads is itself such a
value (a function's argument every caller gives one), told apart by identity."""

from __future__ import annotations

import dataclasses

from .. import ir

CREATES = frozenset({"torch.arange", "torch.ones", "torch.zeros", "torch.full", "torch.tensor",
                     "torch.linspace", "torch.eye"})  # tensors from numbers alone
PURE = frozenset({"math.floor", "math.ceil", "math.log2", "math.log", "math.sqrt", "math.exp",
                  "real_type", "int", "float", "min", "max", "abs"})  # numbers from numbers
MADE_ONCE = frozenset({"shared_mask", "shared_value"})  # memos already
CONSTANTS = frozenset({"None", "...", "math.inf", "math.pi", "True", "False"})
SHARED = ir.Ref("shared_value")
MIN_COST = 2  # tensor operations below which a lookup saves nothing


@dataclasses.dataclass
class Known:
    """Names of a unit whose values are made from sizes and hyperparameters alone; `tensors`
    are those among them that are tensors."""

    names: set[str]
    tensors: set[str]


class Sharing:
    """The pass over one program: sites numbered from 1, the arguments of its functions
    that every call gives a shared value."""

    def __init__(self, program: ir.Program):
        self.program = program
        self.sites = 0
        self.functions = {f.name: f for f in program.functions}
        self.given: dict[tuple[str, str], str | None] = {}  # (function, arg) → _kind

    def run(self) -> None:
        for m in reversed(self.program.modules):  # callers before their callees
            known = Known({f"self.{a.name}" for a in m.hypers} |
                          {f"self.{n}" for n, _ in m.derived}, set())
            m.body = self.body(m.body, known, _taken(m.body, m.inputs))
        for f in reversed(self.program.functions):
            known = Known(set(), set())
            for a in f.args:
                given = self.given.get((f.name, a.name))
                if given:
                    known.names.add(a.name)
                    if given == "tensor":
                        known.tensors.add(a.name)
            f.body = self.body(f.body, known, _taken(f.body, f.args))

    # ------------------------------------------------------------------ statements
    def body(self, stmts: list[ir.Stmt], known: Known, taken: set[str]) -> list[ir.Stmt]:
        out = []
        for st in stmts:
            out.append(self.stmt(st, known, taken))
        return out

    def stmt(self, st: ir.Stmt, known: Known, taken: set[str]) -> ir.Stmt:
        taken = set(taken)  # a statement's local functions are defined just above it
        if isinstance(st, ir.Assign):
            value = self.expr(st.value, known, taken)
            for t in st.targets:
                known.names.discard(t)
                known.tensors.discard(t)
            kind = _kind(value, known)
            if len(st.targets) == 1 and kind:
                known.names.add(st.targets[0])
                if kind == "tensor":
                    known.tensors.add(st.targets[0])
            return dataclasses.replace(st, value=value)
        if isinstance(st, ir.Return):
            return dataclasses.replace(st, value=self.expr(st.value, known, taken))
        if isinstance(st, ir.If | ir.Loop | ir.While):
            again = ir.assigned(st) if isinstance(st, ir.Loop | ir.While) else set()
            inner = Known(known.names - again, known.tensors - again)  # a later pass's values
            changes = {"body": tuple(self.body(list(st.body), inner, taken))}
            if isinstance(st, ir.If):
                orelse = Known(set(known.names), set(known.tensors))
                changes["orelse"] = tuple(self.body(list(st.orelse), orelse, taken))
            for name in ir.assigned(st):  # set in a branch or a loop: not known after it
                known.names.discard(name)
                known.tensors.discard(name)
            return dataclasses.replace(st, **changes)
        return st

    # ------------------------------------------------------------------ expressions
    def expr(self, e: ir.Expr, known: Known, taken: set[str]) -> ir.Expr:
        """`e` with each largest sub-expression made from known values alone, and costly
        enough, made once; the arguments it gives the file's functions recorded."""
        def visit(n):
            if isinstance(n, ir.Lambda):
                return n  # made on a memo's miss already
            leaves = _leaves(n, known)
            if leaves is not None and _cost(n, known) >= MIN_COST and _is_tensor(n, known):
                self.sites += 1
                name = _fresh("make", taken)
                return ir.Call(SHARED, (ir.Lit(str(self.sites)), ir.Lambda(n, name), *leaves))
            if isinstance(n, ir.Call) and isinstance(n.func, ir.Ref) and \
                    n.func.id in self.functions:
                return self.call(n, known, taken)
            return None

        return ir.rewrite(e, visit)

    def call(self, e: ir.Call, known: Known, taken: set[str]) -> ir.Call:
        """A call of a function of the file, its arguments made once where they can be; each
        argument the callee takes is known to it if every call gives it a known value."""
        f = self.functions[e.func.id]
        args = tuple(self.expr(a, known, taken) for a in e.args)
        kwargs = tuple((k, self.expr(v, known, taken)) for k, v in e.kwargs)
        given = dict(zip((a.name for a in f.args), args, strict=False)) | dict(kwargs)
        for a in f.args:
            kind = _kind(given.get(a.name), known)
            before = self.given.get((f.name, a.name), kind)
            self.given[(f.name, a.name)] = kind if before == kind else None
        return dataclasses.replace(e, args=args, kwargs=kwargs)


def share_invariants(program: ir.Program) -> None:
    """Make each costly value of sizes and hyperparameters alone once per what it reads."""
    Sharing(program).run()


# ------------------------------------------------------------------ what a value reads
def _leaves(e, known: Known) -> list[ir.Expr] | None:
    """What `e` reads, if only sizes, devices, number formats, the positions' start and known
    names (each once, in order); None where it reads anything else (a tensor's entries, a
    parameter, a call of anything but torch's tensor makers and pure number functions)."""
    out: list[ir.Expr] = []

    def add(leaf):
        if leaf not in out:
            out.append(leaf)

    def walk(n) -> bool:
        if n is None or isinstance(n, ir.Lit | str | int | float):
            return True
        if isinstance(n, ir.Ref):
            if n.id in CONSTANTS:
                return True
            if n.id in known.names or n.id == "past":
                add(n)
                return True
            return False
        if isinstance(n, ir.Attr):
            if n.name in ("device", "dtype") and isinstance(n.obj, ir.Ref) or \
                    n == ir.Attr(ir.Ref("cache"), "pos"):
                add(n)
                return True
            return False
        if isinstance(n, ir.Sub) and isinstance(n.obj, ir.Attr) and n.obj.name == "shape" and \
                isinstance(n.obj.obj, ir.Ref):
            add(n)  # a size
            return all(walk(i) for i in n.items)
        if isinstance(n, ir.Bin) and n.op in ("is", "is not") and n.right == ir.Lit("None") and \
                isinstance(n.left, ir.Ref) and n.left.id == "cache":
            add(n)
            return True
        if isinstance(n, ir.Call) and n.func == ir.Ref("first_query"):
            add(n)  # a position the cache gives: a number, a static cache's tensor
            return True
        if isinstance(n, ir.Call):
            func = n.func
            if isinstance(func, ir.Ref):
                if func.id not in CREATES | PURE | MADE_ONCE:
                    return False
            elif not (isinstance(func, ir.Attr) and not func.name.endswith("_") and
                      walk(func.obj)):
                return False  # a method of a known value, not one that writes in place
            return all(walk(a) for a in n.args) and all(walk(v) for _, v in n.kwargs)
        if isinstance(n, ir.Lambda):
            return walk(n.body)
        if isinstance(n, ir.Bin):
            return walk(n.left) and walk(n.right)
        if isinstance(n, ir.Un):
            return walk(n.operand)
        if isinstance(n, ir.Cond):
            return walk(n.test) and walk(n.body) and walk(n.orelse)
        if isinstance(n, ir.Seq):
            return all(walk(i) for i in n.items)
        if isinstance(n, ir.Sub):
            return walk(n.obj) and all(walk(i) for i in n.items)
        if isinstance(n, ir.SliceX):
            return walk(n.lo) and walk(n.hi) and walk(n.step)
        return False

    return out if walk(e) else None


def _kind(e, known: Known) -> str | None:
    """"number" for a value of sizes and hyperparameters alone; "tensor" for a tensor made
    once (a memo's, or a name holding one: shared by identity); else None. A tensor made
    anew each time (too cheap to share) is not known: what reads it is not shared either."""
    if e is None or _leaves(e, known) is None:
        return None
    if not _is_tensor(e, known):
        return "number"
    made = isinstance(e, ir.Call) and isinstance(e.func, ir.Ref) and e.func.id in MADE_ONCE
    return "tensor" if made or isinstance(e, ir.Ref) and e.id in known.tensors else None


def _is_tensor(e, known: Known) -> bool:
    """Whether `e` makes or reads a tensor (not numbers and sizes alone)."""
    found = False

    def visit(n):
        nonlocal found
        if isinstance(n, ir.Call) and isinstance(n.func, ir.Ref) and \
                n.func.id in CREATES | MADE_ONCE or isinstance(n, ir.Ref) and n.id in known.tensors:
            found = True
            return n
        return n if isinstance(n, ir.Lambda) else None

    ir.rewrite(e, visit)
    return found


def _cost(e, known: Known) -> int:
    """The tensor operations `e` makes: calls and operators with a tensor among their
    operands (arithmetic on sizes costs nothing)."""
    count = 0

    def visit(n):
        nonlocal count
        if isinstance(n, ir.Lambda):
            return n
        if isinstance(n, ir.Call | ir.Bin | ir.Un | ir.Sub) and _is_tensor(n, known):
            count += 1
        return None

    ir.rewrite(e, visit)
    return count


def _taken(body: list[ir.Stmt], args: list[ir.Arg]) -> set[str]:
    """The names a unit uses: a local function made for a long line takes none of them."""
    return ir.ref_ids(body) | ir.assigned(tuple(body)) | {a.name for a in args}


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
