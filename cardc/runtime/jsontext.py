"""JSON from files nobody vouches for (mapping files, config.json, a checkpoint's metadata, a
data folder's meta.json, a tokenizer), read with its nesting and its integers bounded, so that
every later walk over it is shallow and every number fits the arithmetic that reads it; each
refusal names the file, and the key or the line and column."""

from __future__ import annotations

import json
from typing import Any

from .errors import RuntimeInputError

MAX_DEPTH = 64  # objects and lists inside each other: real configs nest 3 or 4 deep
MAX_INT = 2**63 - 1  # the largest size torch takes; no config key counts beyond it


def loads(text: str, source: str, max_int: int | None = MAX_INT) -> Any:
    """`text` parsed as JSON; RuntimeInputError, naming `source`, for text that is not JSON,
    nests more than MAX_DEPTH levels or holds an integer beyond ±`max_int` (None: any integer
    Python reads, for files whose numbers cardc does not size anything by)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise RuntimeInputError(f"{source}: nested too deeply (more than {MAX_DEPTH} "
                                "levels)") from None
    except json.JSONDecodeError as err:
        raise RuntimeInputError(f"{source}:{err.lineno}:{err.colno}: not JSON: "
                                f"{err.msg}") from None
    except ValueError as err:  # an integer of more digits than Python reads
        raise RuntimeInputError(f"cannot read {source}: {err}") from None
    check(value, source, max_int)
    return value


def check(value: Any, source: str, max_int: int | None = MAX_INT) -> None:
    """Refuse nesting deeper than MAX_DEPTH and integers beyond ±`max_int`, walking without
    recursion; the message names the key (`a.b[2]`)."""
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]
    while todo:
        item, path, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise RuntimeInputError(f"{source}: {_at(path)}nested too deeply (more than "
                                        f"{MAX_DEPTH} levels)")
            pairs = item.items() if isinstance(item, dict) else \
                ((f"[{i}]", v) for i, v in enumerate(item))
            for key, child in pairs:
                sub = f"{path}{key}" if str(key).startswith("[") else \
                    f"{path}.{key}" if path else str(key)
                todo.append((child, sub, depth + 1))
        elif max_int is not None and isinstance(item, int) and not isinstance(item, bool) \
                and abs(item) > max_int:
            raise RuntimeInputError(f"{source}: {_at(path)}an integer of {_digits(item)} "
                                    "digits is too large (at most 2^63 − 1)")


def depth_over(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest deeper than `limit` (walked without
    recursion): for a value another parser made."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) \
            else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return False


def _at(path: str) -> str:
    return f"'{path}': " if path else ""


def _digits(n: int) -> int:
    """How many decimal digits `n` has, without converting a huge one to text."""
    digits = max(1, int(abs(n).bit_length() * 0.30102999566398120))
    return digits + (abs(n) >= 10**digits)
