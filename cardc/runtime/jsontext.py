"""JSON from untrusted files (a data folder's meta.json, a checkpoint's metadata, a tokenizer):
parsed with its nesting bounded, every failure one message that names where it is."""

from __future__ import annotations

import json
from typing import Any

from cardc.runtime.errors import RuntimeInputError

MAX_DEPTH = 64  # nesting no file cardc reads comes near; bounded, so nothing walks it deeper


def load_json(text: str, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """`text` parsed, or a RuntimeInputError naming `where` (and the line and column of a
    syntax error): not JSON, or nested deeper than `max_depth`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise RuntimeInputError(f"{where}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
    except RecursionError:
        raise RuntimeInputError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    if depth_over(value, max_depth):
        raise RuntimeInputError(f"{where}: JSON nested deeper than {max_depth} levels")
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest deeper than `limit` (walked without recursion)."""
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
