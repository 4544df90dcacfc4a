"""The compiler's own speed: parse, check and codegen per card file and for the whole library,
warm and in-process (median of repeats), and the cold start of `cardc check` as a fresh process
(with cardc's bytecode cached, as after a first run).

Goals: one card file < 50 ms warm, the library < 2 s, a cold `cardc check` < 0.5 s.

    python bench/compiler.py [--repeats 10] [--cold 7] [--importtime]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "cards"
GOALS = {"card": 0.050, "library": 2.0, "cold": 0.5}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` calls, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compile_files(paths: list[str], targets: list[str]) -> tuple[float, float, float]:
    """Parse `paths`, check them as one library, and generate the Python of every card of
    `targets` that `cardc build` writes; seconds spent in each phase."""
    from cardc.build import generated_cards, source
    from cardc.checker import check
    from cardc.diagnostics import CardError
    from cardc.library import Library
    from cardc.parser import parse_file

    t0 = time.perf_counter()
    lib = Library()
    lib.files = [parse_file(p, lib.diags) for p in paths]
    t1 = time.perf_counter()
    checker, _ = check(lib)
    t2 = time.perf_counter()
    for alg in generated_cards(lib, checker, targets):
        with contextlib.suppress(CardError):  # a card with errors: no code
            source(checker, alg)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def phases(paths: list[str], targets: list[str], repeats: int) -> tuple[float, ...]:
    """Median seconds of (parse, check, codegen, total) over `repeats` warm runs."""
    compile_files(paths, targets)  # warm: the grammar, the imports
    runs = [compile_files(paths, targets) for _ in range(repeats)]
    return (*(statistics.median(r[i] for r in runs) for i in range(3)),
            statistics.median(sum(r) for r in runs))


def warm(repeats: int) -> None:
    from cardc.build import files_used
    from cardc.checker import check
    from cardc.library import load

    os.chdir(ROOT)  # card paths as cardc sees them, relative to the repository
    lib, _ = load(["cards"], root="cards")
    checker, _ = check(lib)
    print(f"warm, in-process, median of {repeats} (each card file with the files it calls):")
    print(f"  {'card file':<40} {'parse':>8} {'check':>8} {'codegen':>8} {'total':>8}")
    worst = 0.0
    for f in lib.files:
        used = files_used(lib, checker, {f.path})
        paths = [g.path for g in lib.files if g.path in used]  # library order
        parse, chk, gen, total = phases(paths, [f.path], repeats)
        worst = max(worst, total)
        print(f"  {f.path:<40} {parse * 1e3:6.1f}ms {chk * 1e3:6.1f}ms {gen * 1e3:6.1f}ms "
              f"{total * 1e3:6.1f}ms")
    paths = [f.path for f in lib.files]
    parse, chk, gen, total = phases(paths, paths, max(3, repeats // 3))
    print(f"  {'cards/ (' + str(len(paths)) + ' files)':<40} {parse * 1e3:6.1f}ms "
          f"{chk * 1e3:6.1f}ms {gen * 1e3:6.1f}ms {total * 1e3:6.1f}ms")
    print(f"  slowest card file {worst * 1e3:.1f} ms (goal < {GOALS['card'] * 1e3:.0f} ms); "
          f"library {total:.2f} s (goal < {GOALS['library']:.0f} s)")


def cardc_command() -> list[str]:
    exe = Path(sys.executable).parent / "cardc"
    return [str(exe)] if exe.exists() else [shutil.which("cardc") or "cardc"]


def cold(runs: int) -> None:
    """Fresh `cardc check` processes, with cardc's bytecode cached as any run after the first
    finds it: one untimed run writes it, even where PYTHONDONTWRITEBYTECODE is set (without
    it, each process would spend a good part of its time compiling cardc's sources)."""
    cmd = [*cardc_command(), "check", "cards/gpt2.card"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(f"cold `cardc check cards/gpt2.card`, fresh process, median of {runs}: {med:.3f} s "
          f"[{min(times):.3f}–{max(times):.3f}] (goal < {GOALS['cold']} s)")


def importtime(top: int = 15) -> None:
    """Where a cold `cardc check` spends its imports: `python -X importtime`, biggest first."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "cardc", "check",
                           "cards/gpt2.card"], cwd=ROOT, capture_output=True, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m[2]), len(m[3]), m[4]))
    total = sum(c for c, depth, _ in rows if depth == 1)
    print(f"imports of a cold `cardc check`: {total / 1e3:.0f} ms in all; top-level ones by "
          f"cumulative time:")
    for cumulative, _, name in sorted((r for r in rows if r[1] == 1), reverse=True)[:top]:
        print(f"  {cumulative / 1e3:8.1f} ms  {name}")
    heavy = [n for n in ("torch", "jinja2", "matplotlib", "numpy", "transformers")
             if any(name == n for _, _, name in rows)]
    print(f"  heavy imports present: {', '.join(heavy) or 'none'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10, help="warm runs per card file")
    p.add_argument("--cold", type=int, default=7, help="fresh `cardc check` processes")
    p.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    args = p.parse_args()
    warm(args.repeats)
    cold(args.cold)
    if args.importtime:
        importtime()
    return 0


if __name__ == "__main__":
    sys.exit(main())
