"""A fuzz harness for cardc's front end: `python -m tests.fuzz --cases 10000 [--seed S] [--jobs J]`.

Cases are cards made two ways: random well-formed ASTs rendered as text (grammar-based), and the
cards of cards/ mutated (bytes flipped, tokens swapped, lines spliced from another card, text
deleted, control characters, stray bytes and deep nesting put in). Each case runs, in a worker
process under a CPU-time limit and a memory cap, what a user can run on a card: `check` (parse and
check, with the cards/ library), the text and LaTeX renderings, the `fmt` round trip
(`parse(render(parse(src))) == parse(src)` when the parse is clean) and, for cards `check`
accepts, the generated model source (through `ast.parse`) and `info` at each preset.

Outcomes: clean, diagnosed (every diagnostic located within the source), or a failure: a
traceback, a hang, an unlocated diagnostic, or a broken round trip. Failing inputs are saved
(with what went wrong) for regression tests; the exit status is 1 on any failure.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARDS = ROOT / "cards"
FAILURES = ("traceback", "hang", "unlocated", "roundtrip", "latex", "html")


# ------------------------------------------------------------------ cases


def seeds() -> list[bytes]:
    """The cards the mutations start from."""
    return [p.read_bytes() for p in sorted(CARDS.rglob("*.card"))]


# Tokens a mutation swaps in: the notation's symbols, their ASCII spellings, keywords, names.
TOKENS = ["←", "<-", "∈", " in ", "ℝ", "ℕ", "RR", "NN", "R^", "^{", "}", "{", "(", ")", "[", "]",
          "[[", "]]", "_", "^", "^⊺", "^T", "·", "*", "⊙", "(.)", "/", "+", "−", "-", "√", "sqrt",
          "Σ_{i=1}^{D}", "sum_{", "∇", "∞", "−∞", "¬", "≤", "<=", "≡", "≅", "×", " x ", ",", ";",
          ":", "|", "=", "…", "...", ". . .", "▷", "//", "/*", "*/", "²", "′", "'", "~", "̃",
          "̂", "∀", "∝", "Algorithm: ", "Algorithm 3: ", "Input: ", "Output: ",
          "Parameters: ", "Hyperparameters: ", "Preset ", "for ", " do", "end", "return ",
          "while ", " if ", " then ", "sample a token ", " from ", " or ", " randomly with probability ",
          "consisting of:", "includes all of the following parameters:", "For l ∈ [L]:",
          "softmax(", "GELU(", "length(", "log(", "exp(", "max(", "X", "W_q", "γ^1_l", "x_{1:N}",
          "θ", "ℓ", "t′", "D", "H", "0", "1", "2", "1e-5", "1e999", "0.5", "\n", "\n    ", "    ",
          "‖", "||", "‖g‖", "g ← ∇loss(θ)", "g ← 0", "g ← g + ∇loss(θ)", "min(1, c/‖g‖)"]
CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\x9f", "\r",
            "\r\n", "\ufeff", "\u2028", "\u2029", "\u200b", "\t"]
OPENERS = [("√(", ")"), ("(", ")"), ("−", ""), ("-", ""), ("softmax(", ")"), ("x[", "]"),
           ("[", "]"), ("√", ""), ("Σ_{i=1}^{D} ", ""), ("exp(", ")"), ("((", "))"), ("[[", "]]"),
           ("{", "}"), ("X^{", "}"), ("F(", " | θ)"), ("¬", ""), ("‖", "‖"), ("||", "||"),
           ("top_k(", " | k)"), ("top_p(", " | p)")]


def mutate(rng: random.Random, pool: list[bytes]) -> bytes:
    """One to four mutations of a seed card."""
    data = bytearray(rng.choice(pool))
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        data = bytearray(rng.choice(MUTATIONS)(rng, bytes(data), pool))
    return bytes(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _at(rng: random.Random, n: int) -> int:
    return rng.randrange(n + 1)


def m_token(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Insert or replace with a token of the notation."""
    text = _text(data)
    i = _at(rng, len(text))
    j = i + (rng.randrange(4) if rng.random() < 0.5 else 0)
    return (text[:i] + rng.choice(TOKENS) + text[j:]).encode()


def m_delete(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    i = _at(rng, len(data))
    return data[:i] + data[i + rng.choice((1, 1, 2, 3, 8, 40, 200)):]


def m_bytes(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Flip, insert or overwrite raw bytes (may break UTF-8)."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        i = _at(rng, len(out))
        b = rng.randrange(256)
        if rng.random() < 0.5 and i < len(out):
            out[i] = b
        else:
            out[i:i] = bytes([b])
    return bytes(out)


def m_control(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    text = _text(data)
    for _ in range(rng.randrange(1, 4)):
        i = _at(rng, len(text))
        text = text[:i] + rng.choice(CONTROLS) + text[i:]
    return text.encode()


def m_splice(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Lines of another card put in among this one's."""
    mine, other = data.split(b"\n"), rng.choice(pool).split(b"\n")
    a = rng.randrange(len(other))
    chunk = other[a:a + rng.randrange(1, 8)]
    i = _at(rng, len(mine))
    return b"\n".join(mine[:i] + chunk + mine[i:])


def m_lines(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A line deleted, duplicated, swapped with another or re-indented."""
    lines = data.split(b"\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    op = rng.randrange(4)
    if op == 0:
        del lines[i]
    elif op == 1:
        lines.insert(j, lines[i])
    elif op == 2:
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines[i] = b" " * rng.choice((0, 1, 4, 8, 13)) + lines[i].lstrip()
    return b"\n".join(lines)


def m_nest(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Deep nesting around a place in the card, or a long flat chain."""
    text = _text(data)
    i = _at(rng, len(text))
    k = rng.choice((20, 60, 99, 101, 150, 400, 1000, 3000))
    if rng.random() < 0.2:
        piece = " + ".join(["x"] * k) if rng.random() < 0.5 else " ".join(["W"] * k)
    else:
        opener, closer = rng.choice(OPENERS)
        piece = opener * k + "x" + closer * k
    return (text[:i] + piece + text[i:]).encode()


def m_loops(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """Deeply nested `for … do` blocks, or `For` families, as steps."""
    k = rng.choice((10, 60, 120, 500))
    if rng.random() < 0.5:
        body = "".join(f"{'    ' * d}for i{d} = 1, …, L do\n" for d in range(k)) + \
            "    " * k + "x ← x\n" + "".join(f"{'    ' * d}end\n" for d in reversed(range(k)))
    else:
        body = "".join(f"{'    ' * d}For l{d} ∈ [L]:\n" for d in range(k)) + "    " * k + "W ∈ ℝ^{D}\n"
    return data.rstrip(b"\n") + b"\n" + body.encode()


def m_repeat(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A line repeated many times, or a very long line."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    if rng.random() < 0.5:
        lines[i:i + 1] = [lines[i]] * rng.choice((50, 500, 3000))
    else:
        lines[i] = lines[i] * rng.choice((20, 200))
    return b"\n".join(lines)


NUMBERS = ["0", "1", "-1", "−2", "0.5", "1e999", "1e-999", "3/0", "99999999999999999999", "2^{64}",
           "2²", "√2", "∞", "-inf", "D", "D/0", "1e5", "0.0"]


def m_number(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A number (a preset's value, a default, a dimension) replaced by an awkward one."""
    text = _text(data)
    spots = [m.span() for m in re.finditer(r"(?<![\w.])\d+(\.\d+)?([eE][-+]?\d+)?", text)]
    if not spots:
        return data
    a, b = rng.choice(spots)
    return (text[:a] + rng.choice(NUMBERS) + text[b:]).encode()


def m_truncate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    return data[:_at(rng, len(data))]


MUTATIONS = [m_token] * 6 + [m_delete] * 3 + [m_bytes] * 2 + [m_control] * 2 + [m_splice] * 2 \
    + [m_lines] * 3 + [m_number] * 2 + [m_nest, m_loops, m_repeat, m_truncate]


# ------------------------------------------------------------------ grammar-based cases


class Grammar:
    """Random well-formed cards: an AST drawn at random, written out by the text renderer."""

    DIMS = ["D", "H", "T", "V", "d"]
    FUNCS = ["softmax", "GELU", "ReLU", "exp", "log", "σ", "SiLU"]

    def __init__(self, rng: random.Random):
        self.rng = rng
        from cardc import syntax as s

        self.s = s

    def card(self) -> bytes:
        from cardc.render.text import render_card

        s, rng = self.s, self.rng
        algs = tuple(self.algorithm(i) for i in range(rng.choice((1, 1, 2))))
        return render_card(s.CardFile("<fuzz>", algs)).encode()

    def algorithm(self, i: int):
        s, rng = self.s, self.rng
        name = rng.choice(["F", "Block", "Model", "Attn", "Norm"]) + str(i)
        self.names = ["X", "W", "b", "γ", "x"]
        dims = rng.sample(self.DIMS, rng.randrange(1, 4))
        blocks = (
            s.Block("Input", (s.Decl(("X",), self.type(dims)),)),
            s.Block("Output", (s.Decl(("Y",), self.type(dims)),)),
            s.Block("Hyperparameters", (s.Decl(tuple(dims), s.Scalar("ℕ")),)),
            s.Block("Parameters", (s.Decl(("W",), self.type(dims)), s.Decl(("b", "γ"), self.type(dims)))),
        )
        presets = (s.Preset("tiny", tuple((d, s.Num(str(rng.randrange(1, 9)))) for d in dims)),) \
            if rng.random() < 0.5 else ()
        steps = [self.step(2) for _ in range(rng.randrange(0, 4))]
        steps.append(s.Step(s.Return(self.expr(rng.randrange(1, 6)), "Y")))
        numbered = tuple(s.Step(st.stmt, str(k + 1)) if rng.random() < 0.8 else st
                         for k, st in enumerate(steps))
        return s.Algorithm(name, None, ("Y",), ("X",), ("W", "b", "γ"), blocks=blocks,
                           presets=presets, steps=numbered)

    def type(self, dims: list[str]):
        s, rng = self.s, self.rng
        if rng.random() < 0.15:
            return s.Scalar("ℝ")
        shape = tuple(s.Name(d) for d in rng.sample(dims, rng.randrange(1, len(dims) + 1)))
        return s.Tensor(s.Scalar("ℝ"), shape[:2])

    def step(self, depth: int):
        s, rng = self.s, self.rng
        r = rng.random()
        if r < 0.6 or depth == 0:
            target = rng.choice(["X", "Z", "A"])
            self.names.append(target)
            return s.Step(s.Assign(s.Name(target), self.expr(rng.randrange(1, 6))))
        if r < 0.8:
            body = tuple(self.step(depth - 1) for _ in range(rng.randrange(1, 3)))
            return s.Step(s.For("l", s.Range((s.Num("1"),), s.Name("L")), body, "do", "="))
        return s.Step(s.For("t", s.Finite(s.Name("T")), (self.step(0),), "map", "∈"))

    def expr(self, depth: int):
        s, rng = self.s, self.rng
        if depth <= 0 or rng.random() < 0.25:
            return s.Name(rng.choice(self.names)) if rng.random() < 0.85 else s.Num(rng.choice(["1", "2", "0.5"]))
        r = rng.random()
        sub = lambda: self.expr(depth - 1)  # noqa: E731
        if r < 0.35:
            return s.BinOp(rng.choice(["+", "−", "·", "⊙", "/", " "]), sub(), sub())
        if r < 0.5:
            return s.Call(rng.choice(self.FUNCS), (sub(),))
        if r < 0.6:
            return s.Norm(sub()) if rng.random() < 0.3 else s.Unary(rng.choice(["−", "√"]), sub())
        if r < 0.7:
            return s.Transpose(sub())
        if r < 0.8:
            return s.Index(s.Name(rng.choice(self.names)), (s.Slice(None, None), s.Name("t")))
        if r < 0.9:
            return s.Power(sub(), s.Num("2"))
        return s.Sum("i", s.Num("1"), s.Name("D"), None, sub())


def make_case(seed: int, i: int, pool: list[bytes]) -> bytes:
    rng = random.Random(f"{seed}:{i}")
    if rng.random() < 0.2:
        data = Grammar(rng).card()
        return mutate(rng, [data]) if rng.random() < 0.3 else data
    return mutate(rng, pool)


# ------------------------------------------------------------------ running a case


@dataclass
class Outcome:
    kind: str  # clean | diagnosed | traceback | hang | unlocated | roundtrip
    detail: str = ""

    @property
    def signature(self) -> str:
        """What tells failures apart: the exception and the innermost cardc frame."""
        last = [ln for ln in self.detail.splitlines() if ln.strip()]
        frames = [ln.strip() for ln in last if ln.strip().startswith('File "') and "cardc" in ln]
        head = last[-1] if last else ""
        return f"{self.kind}: {head.split(':')[0]} at {frames[-1] if frames else '?'}"


def _unlocated(diags, path: str) -> str | None:
    """The first diagnostic not located within its source, rendered; None if all are."""
    for d in diags.items:
        if d.span.file != path:
            continue
        text = diags.sources.get(path)
        if d.span.line == 0 and d.message.startswith("cannot read card"):
            continue  # a whole-file problem names its file
        lines = text.split("\n") if text is not None else []
        ok = 1 <= d.span.line <= len(lines) and 1 <= d.span.col <= len(lines[d.span.line - 1]) + 1
        d.render(diags.sources)  # rendering must not fail either
        if not ok:
            return f"{d.span}: {d.message}"
    return None


def run_case(path: str) -> Outcome:
    """Everything a user can do with the card at `path`, as cardc's commands do it."""
    from cardc import build, info
    from cardc.checker import check
    from cardc.diagnostics import CardError, Diagnostics
    from cardc.library import load
    from cardc.parser import parse, parse_file
    from cardc.render.html import render_html
    from cardc.render.latex import render_latex
    from cardc.render.markdown import render_markdown
    from cardc.render.text import render_card
    from cardc.types import BundleTy

    lib, _ = load([path], root=str(CARDS), lazy=True)
    checker, diags = check(lib)
    bad = _unlocated(diags, path)
    if bad:
        return Outcome("unlocated", bad)
    errors = [d for d in diags.errors if d.span.file == path]
    pd = Diagnostics()
    card = parse_file(path, pd)
    text = render_card(card)
    if not render_latex(card, checker).isascii():
        return Outcome("latex", "the LaTeX is not ASCII")
    render_markdown(card, checker)
    if "<script" in render_html(card, checker).lower():  # card text stays text
        return Outcome("html", "card text became markup in the HTML")
    if not pd.errors:
        again = parse(text, path, Diagnostics())
        if again != card:
            return Outcome("roundtrip", text)
    if errors:
        return Outcome("diagnosed")
    mine = [a for f in lib.files if f.path == path for a in f.algorithms]
    for alg in mine:
        if id(alg) not in checker.infos:
            continue
        generated = alg in build.model_cards(lib, checker, [path]) or any(
            isinstance(ty, BundleTy) for _, ty in checker.infos[id(alg)].sig.inputs)
        try:
            if generated:
                ast.parse(build.source(checker, alg))
            for preset in alg.presets:
                info.summarize(checker.infos[id(alg)].sig, preset.name)
        except CardError as err:
            bad = _unlocated(err.diagnostics, path)
            if bad:
                return Outcome("unlocated", bad)
            return Outcome("diagnosed")
        except info.PresetError as err:
            if err.span.file == path and err.span.line < 1:
                return Outcome("unlocated", f"{err.span}: {err.message}")
            return Outcome("diagnosed")
    return Outcome("clean")


def _mapped() -> int:
    """The bytes of address space this process maps (0 where the system does not say)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            kib = next(line.split()[1] for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return 0
    return int(kib) * 1024


def _worker(conn, folder: str, memory: int) -> None:
    """Runs cases sent down `conn` until told to stop."""
    try:
        import resource

        # `memory` more than the address space the fork inherits: a test process that imported
        # much (transformer_lens maps 1.4 GB) must not leave its cases none
        limit = _mapped() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    path = os.path.join(folder, "case.card")
    import cardc.build  # noqa: F401 - loaded once, not in the first case's time
    import cardc.checker  # noqa: F401

    while True:
        try:
            data = conn.recv()
        except EOFError:  # the harness is gone
            return
        if data is None:
            return
        with open(path, "wb") as f:
            f.write(data)
        try:
            outcome = run_case(path)
        except BaseException:  # noqa: BLE001 - every escape is what this looks for
            outcome = Outcome("traceback", traceback.format_exc())
        conn.send(outcome)


def cpu_seconds(pid: int) -> float | None:
    """The CPU time process `pid` has used (Linux's /proc), or None where that cannot be read.
    A case's time limit counts this, not the wall clock: on a busy machine a worker waits for a
    core without using its limit, while a case that loops still reaches it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# A worker blocked without using CPU time (a read that never returns) is a hang too: the wall
# clock catches it, after this many times the CPU limit, so that load alone never does.
WALL_FACTOR = 20


class Pool:
    """Worker processes, each with a case at a time; one past the time limit is killed. The
    limit is CPU time where the system reports it (else wall-clock time)."""

    def __init__(self, jobs: int, timeout: float, memory: int):
        self.ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
        self.timeout, self.memory = timeout, memory
        self.tmp = tempfile.TemporaryDirectory(prefix="cardc-fuzz-")
        self.workers = [self._start(k) for k in range(jobs)]

    def _start(self, k: int):
        folder = os.path.join(self.tmp.name, str(k))
        os.makedirs(folder, exist_ok=True)
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, folder, self.memory), daemon=True)
        proc.start()
        return proc, parent

    def run(self, cases):
        """Yields (index, outcome) for each (index, bytes) of `cases`."""
        cases = iter(cases)
        busy: dict[int, tuple[int, bytes, tuple[float, float | None]]] = {}
        for k in range(len(self.workers)):
            self._feed(k, cases, busy)
        while busy:
            for k in list(busy):
                proc, conn = self.workers[k]
                i, data, started = busy[k]
                if conn.poll(0.01):
                    try:
                        outcome = conn.recv()
                    except EOFError:
                        outcome = Outcome("traceback", f"worker died (exit code {proc.exitcode})")
                        self._restart(k)
                elif not proc.is_alive():
                    outcome = Outcome("traceback", f"worker died (exit code {proc.exitcode})")
                    self._restart(k)
                elif self._over(proc.pid, started):
                    outcome = Outcome("hang", f"no answer in {self.timeout:g} s of CPU time")
                    self._restart(k)
                else:
                    continue
                del busy[k]
                yield i, data, outcome
                self._feed(k, cases, busy)

    def _feed(self, k: int, cases, busy) -> None:
        nxt = next(cases, None)
        if nxt is not None:
            self.workers[k][1].send(nxt[1])
            busy[k] = (nxt[0], nxt[1], (time.monotonic(), cpu_seconds(self.workers[k][0].pid)))

    def _over(self, pid: int, started: tuple[float, float | None]) -> bool:
        """Whether the case a worker started at `started` (wall, CPU) is past its limit."""
        wall, cpu = started
        now = cpu_seconds(pid)
        if cpu is not None and now is not None:
            return now - cpu > self.timeout or \
                time.monotonic() - wall > WALL_FACTOR * self.timeout
        return time.monotonic() - wall > self.timeout

    def _restart(self, k: int) -> None:
        proc, conn = self.workers[k]
        if proc.is_alive():
            proc.kill()
        proc.join()
        conn.close()
        self.workers[k] = self._start(k)

    def close(self) -> None:
        for proc, conn in self.workers:
            if proc.is_alive():
                conn.send(None)
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
        self.tmp.cleanup()


def fuzz(cases: int, seed: int, jobs: int = 1, timeout: float = 30.0, memory: int = 2 << 30,
         save: Path | None = None, quiet: bool = False) -> Counter:
    """Run `cases` cases; return the count of each outcome (and save failing inputs)."""
    pool_seeds = seeds()
    counts: Counter = Counter()
    signatures: dict[str, int] = {}
    pool = Pool(jobs, timeout, memory)
    try:
        gen = ((i, make_case(seed, i, pool_seeds)) for i in range(cases))
        for i, data, outcome in pool.run(gen):
            counts[outcome.kind] += 1
            if outcome.kind in FAILURES:
                sig = outcome.signature
                first = sig not in signatures
                signatures[sig] = signatures.get(sig, 0) + 1
                if save is not None:
                    _save(save, i, data, outcome, sig)
                if first and not quiet:
                    print(f"case {i}: {sig}", file=sys.stderr)
    finally:
        pool.close()
    if not quiet and signatures:
        print("signatures:", file=sys.stderr)
        for sig, n in sorted(signatures.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {sig}", file=sys.stderr)
    return counts


def _save(folder: Path, i: int, data: bytes, outcome: Outcome, sig: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(sig.encode()).hexdigest()[:8]
    (folder / f"{outcome.kind}-{tag}-{i}.card").write_bytes(data)
    (folder / f"{outcome.kind}-{tag}-{i}.txt").write_text(f"{sig}\n\n{outcome.detail}\n",
                                                           encoding="utf-8")


def summary(counts: Counter, seconds: float) -> str:
    total = sum(counts.values())
    return (f"fuzz: {total} cases, {counts['traceback']} tracebacks, {counts['hang']} hangs, "
            f"{counts['unlocated']} unlocated, {counts['roundtrip']} round-trip failures "
            f"({counts['clean']} clean, {counts['diagnosed']} diagnosed) in {seconds:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000, help="how many cards (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default: 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="CPU seconds a case may take before it counts as a hang (default: 30)")
    p.add_argument("--memory", type=int, default=2048, help="MiB a worker may use (default: 2048)")
    p.add_argument("--save", type=Path, default=Path("fuzz-failures"),
                   help="folder for failing inputs (default: fuzz-failures)")
    args = p.parse_args(argv)
    start = time.monotonic()
    counts = fuzz(args.cases, args.seed, max(1, args.jobs), args.timeout, args.memory << 20,
                  args.save)
    print(summary(counts, time.monotonic() - start))
    return 1 if any(counts[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
