"""Print an IR program as a Python module: expressions by precedence, files by template, and
the helpers the program names copied after it from cardc/runtime/modelkit.py (and logits.py)."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import ir
from .linebreak import WIDTH, break_lines
from .names import quote

# Python operator precedence, loosest first; postfix forms (calls, subscripts) bind tightest.
_PREC = {"or": 0.25, "and": 0.5, "is": 1, "is not": 1, "<": 1, "<=": 1, ">": 1, ">=": 1,
         "==": 1, "!=": 1, "|": 2, "&": 3, "+": 4, "-": 4, "*": 5, "/": 5, "@": 5, "//": 5, "%": 5, "unary": 6, "**": 7}
_ATOM = 9


def expr_py(e: ir.Expr, prec: int = 0) -> str:
    """Python text of `e`, parenthesised only where precedence needs it."""
    text, own = _EXPR[type(e).__name__](e)
    return f"({text})" if own < prec else text


def _ref(e: ir.Ref) -> tuple[str, int]:
    return e.id, _ATOM


def _lit(e: ir.Lit) -> tuple[str, int]:
    neg = e.text.startswith("-")
    return e.text, _PREC["unary"] if neg else _ATOM


def _call(e: ir.Call) -> tuple[str, int]:
    args = [expr_py(a) for a in e.args] + [f"{k}={expr_py(v)}" for k, v in e.kwargs]
    return f"{expr_py(e.func, _ATOM)}({', '.join(args)})", _ATOM


def _attr(e: ir.Attr) -> tuple[str, int]:
    return f"{expr_py(e.obj, _ATOM)}.{e.name}", _ATOM


def _bin(e: ir.Bin) -> tuple[str, int]:
    p = _PREC[e.op]
    if e.op == "**":  # right-associative, and tighter than a unary minus on its left
        return f"{expr_py(e.left, p + 1)} ** {expr_py(e.right, _PREC['unary'])}", p
    left = p + 1 if p == _PREC["<"] or _mixed(e.op, e.left) else p  # comparisons chain in
    # Python: never nest them bare; nor a product by a matrix with a scalar one (`(a * b) @ c`)
    right = p if e.op in ("and", "or") else p + 1  # associative either way
    return f"{expr_py(e.left, left)} {e.op} {expr_py(e.right, right)}", p


def _mixed(op: str, left: ir.Expr) -> bool:
    """`@` beside `*` or `/` on its left: one level in Python, read as two by a person."""
    return isinstance(left, ir.Bin) and left.op != op and "@" in (op, left.op) and \
        _PREC[left.op] == _PREC[op]


def _un(e: ir.Un) -> tuple[str, int]:
    return f"{e.op}{expr_py(e.operand, _PREC['unary'])}", _PREC["unary"]


def _sub(e: ir.Sub) -> tuple[str, int]:
    items = ", ".join(_item(i) for i in e.items)
    return f"{expr_py(e.obj, _ATOM)}[{items}]", _ATOM


def _item(i: ir.Expr | ir.SliceX) -> str:
    if isinstance(i, ir.SliceX):
        lo = "" if i.lo is None else expr_py(i.lo, 1)
        hi = "" if i.hi is None else expr_py(i.hi, 1)
        return f"{lo}:{hi}" if i.step is None else f"{lo}:{hi}:{expr_py(i.step, 1)}"
    return expr_py(i)


def _seq(e: ir.Seq) -> tuple[str, int]:
    items = [expr_py(i) for i in e.items]
    if e.kind == "list":
        return f"[{', '.join(items)}]", _ATOM
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})", _ATOM


def _cond(e: ir.Cond) -> tuple[str, int]:
    return f"{expr_py(e.body, 1)} if {expr_py(e.test, _PREC['or'])} else {expr_py(e.orelse)}", 0


def _lambda(e: ir.Lambda) -> tuple[str, int]:
    params = f" {', '.join(e.params)}" if e.params else ""
    return f"lambda{params}: {expr_py(e.body)}", 0


_EXPR = {"Ref": _ref, "Lit": _lit, "Call": _call, "Attr": _attr, "Bin": _bin, "Un": _un,
         "Sub": _sub, "Seq": _seq, "Cond": _cond, "Lambda": _lambda}

# ------------------------------------------------------------------ statements


def note_py(note: ir.Note) -> str:
    parts = [p for p in (note.shape, note.text, note.line and f"[{note.line}]") if p]
    return f"  # {one_line('  '.join(parts))}" if parts else ""


def stmt_lines(st: ir.Stmt, indent: str = "") -> list[str]:
    lines = _STMT[type(st).__name__](st, indent)
    if len(lines[0]) > WIDTH and isinstance(st, (ir.Assign, ir.Return)):
        return _functions_above(st, indent) or lines
    return lines


def _functions_above(st: ir.Assign | ir.Return, indent: str) -> list[str]:
    """A statement too long for a line, its lambdas (a mask's rule) defined above it as local
    functions of their names, which it then passes; [] where it holds none."""
    named: list[ir.Lambda] = []

    def name(e):
        if isinstance(e, ir.Lambda):
            named.append(e)
            return ir.Ref(e.name)
        return None

    st = ir.rewrite(st, name)
    defs = [line for f in named
            for line in (f"{indent}def {f.name}({', '.join(f.params)}):",
                         f"{indent}    return {expr_py(f.body)}")]
    return defs + _STMT[type(st).__name__](st, indent) if named else []


def _assign(st: ir.Assign, indent: str) -> list[str]:
    lhs = f"{', '.join(st.targets)} = " if st.targets else ""
    return [f"{indent}{lhs}{expr_py(st.value)}{note_py(st.note)}"]


def _loop(st: ir.Loop, indent: str) -> list[str]:
    head = f"{indent}for {st.target} in {expr_py(st.iter)}:{note_py(st.note)}"
    return [head] + body_lines(st.body, indent + "    ")


def _if(st: ir.If, indent: str) -> list[str]:
    lines = [f"{indent}if {expr_py(st.cond)}:{note_py(st.note)}"]
    lines += body_lines(st.body, indent + "    ")
    if st.orelse:
        lines += [f"{indent}else:"] + body_lines(st.orelse, indent + "    ")
    return lines


def _comment(st: ir.Comment, indent: str) -> list[str]:
    return [f"{indent}# {one_line(st.text)}"]


def _while(st: ir.While, indent: str) -> list[str]:
    head = f"{indent}while {expr_py(st.cond)}:{note_py(st.note)}"
    return [head] + body_lines(st.body, indent + "    ")


def _raise(st: ir.Raise, indent: str) -> list[str]:
    return [f"{indent}raise {st.error}({expr_py(st.message)})"]


def _break(st: ir.Break, indent: str) -> list[str]:
    return [f"{indent}break"]


def _return(st: ir.Return, indent: str) -> list[str]:
    value = st.value
    text = ", ".join(expr_py(i) for i in value.items) if isinstance(value, ir.Seq) and \
        value.kind == "tuple" and len(value.items) > 1 else expr_py(value)
    return [f"{indent}return {text}{note_py(st.note)}"]


_STMT = {"Assign": _assign, "Loop": _loop, "If": _if, "While": _while, "Comment": _comment,
         "Raise": _raise, "Return": _return, "Break": _break}


def body_lines(body, indent: str) -> list[str]:
    lines = [line for st in body for line in stmt_lines(st, indent)]
    if all(line.lstrip().startswith("#") for line in lines):  # no statement left (`x ← x`)
        lines.append(f"{indent}pass")
    return lines


# ------------------------------------------------------------------ files

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("cardc", "templates"),
    keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
    undefined=jinja2.StrictUndefined, autoescape=False,
)
_ENV.filters.update(py=expr_py, note=note_py, body=body_lines)


def arg_py(a: ir.Arg) -> str:
    text = a.name if a.type is None else f"{a.name}: {a.type}"
    if a.default is not None:
        text += f" = {expr_py(a.default)}" if a.type else f"={expr_py(a.default)}"
    return text


def one_line(text: str) -> str:
    """Card text inside a `#` comment: no line break may end the comment early, and no other
    control character (a NUL) may stop Python from reading the file."""
    return _CONTROL.sub("\N{REPLACEMENT CHARACTER}", " ".join(text.splitlines()))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def doc_py(text: str, indent: int) -> str:
    """Card prose as docstring text, wrapped; quotes and backslashes cannot end it early."""
    text = one_line(text).replace("\\", "\\\\").replace('"', '\\"')
    pad = " " * indent
    return textwrap.fill(text, width=96 - indent, subsequent_indent=pad)


_ENV.filters.update(arg=arg_py, doc=doc_py, line=one_line, quote=quote)


# ------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Helper:
    """A module-level name of a helper module (a function, a class, a constant), as written
    there: the comment lines right above it and its own lines, trailing comments included."""

    name: str
    text: str
    uses: frozenset[str]  # the module-level names it reads: other helpers, math
    origin: Path


_RUNTIME = Path(__file__).parent / "runtime"
# Where generated code finds its helpers, and the banner over those it copies from each. The
# token choice of generate() and the filter of top_k/top_p steps are cardc's sampler's: one
# definition serves both (read as text, not imported: codegen loads no torch).
HELPER_SOURCES = {
    _RUNTIME / "modelkit.py": "# Helpers the code above calls: cardc/runtime/modelkit.py's, copied by name.",
    _RUNTIME / "logits.py": "# How tokens are picked and filtered: cardc/runtime/logits.py's, cardc's sampler's.",
    _RUNTIME / "experts.py": "# How tokens are routed to experts: cardc/runtime/experts.py's, copied by name.",
}
# What the methods the template writes itself call: new_cache() and generate().
METHOD_HELPERS = {"cached": ("KVCache",), "generates": ("pick_token", "hold_stopped"),
                  "source": ("pick_token", "hold_stopped")}


def helpers_in(path: Path) -> dict[str, Helper]:
    """Every module-level function, class and assignment of the module at `path`, in order."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    defined = {_defined(node) for node in tree.body} - {None}
    found = {}
    for node in tree.body:
        name = _defined(node)
        if name is None:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1  # the comment that introduces it
        reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        found[name] = Helper(name, "\n".join(lines[first:node.end_lineno]),
                             frozenset(reads & (defined | {"math"}) - {name}), path)
    return found


def _defined(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
            isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


HELPERS = {name: h for path in HELPER_SOURCES for name, h in helpers_in(path).items()}


def helpers_of(program: ir.Program) -> list[str]:
    """The helpers `program` needs, in their modules' order: those its code names, and
    theirs in turn."""
    wanted = _refs(program) & HELPERS.keys()
    for m in program.modules:
        for flag, names in METHOD_HELPERS.items():
            if getattr(m, flag):
                wanted |= set(names)
    todo = list(wanted)
    while todo:
        for name in HELPERS[todo.pop()].uses & HELPERS.keys() - wanted:
            wanted.add(name)
            todo.append(name)
    return [name for name in HELPERS if name in wanted]


def _refs(program: ir.Program) -> set[str]:
    """Every name the program's functions and modules refer to."""
    nodes: list = []
    for f in program.functions:
        nodes += [*f.body, *(a.default for a in f.args if a.default is not None)]
    for m in program.modules:
        nodes += [*m.body, *(a.default for a in [*m.hypers, *m.inputs] if a.default is not None)]
        nodes += [*(v for _, v in m.derived), *(q.init for q in m.params)]
        nodes += [v for s in m.submodules for _, v in s.kwargs]
    return ir.ref_ids(nodes)


def helpers_text(names: list[str]) -> str:
    """The helpers' source, after a banner per module they come from."""
    parts, origin = [], None
    for name in names:
        helper = HELPERS[name]
        if helper.origin != origin:
            origin = helper.origin
            parts.append(HELPER_SOURCES[origin])
        parts.append(helper.text)
    # two blank lines before each part; the model's text ends with a line break already
    return "".join(f"\n\n{part}\n" for part in parts)


def generate(program: ir.Program) -> str:
    """The source text of `program`, its helpers after it; it is parsed before anyone gets to
    write it (dropping a whole import line from the top of a module that parses leaves one
    that parses)."""
    names = helpers_of(program)
    imports = program.imports | {"math" for n in names if "math" in HELPERS[n].uses}
    text = _ENV.get_template("model.py.j2").render(p=program, imports=imports,
                                                   helpers=helpers_text(names))
    text = break_lines(text)
    used = _names(ast.parse(text))
    for name, line in (("F", "import torch.nn.functional as F\n"), ("nn", "from torch import nn\n")):
        if name not in used:  # a file of functions alone needs neither
            text = text.replace(line, "", 1)
    return text


def _names(tree: ast.AST) -> set[str]:
    """The ids of every ast.Name in `tree`: ast.walk's answer, at about half its cost."""
    ids: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if type(node) is ast.Name:
            ids.add(node.id)
            continue
        for field in node._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                stack += [x for x in value if isinstance(x, ast.AST)]
            elif isinstance(value, ast.AST):
                stack.append(value)
    return ids
