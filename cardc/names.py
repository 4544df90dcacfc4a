"""The one door from card text to Python text: card names as identifiers, card literals as
Python literals.

Every name a card declares reaches generated code through `identifier` (locals, arguments,
hyperparameters, class and function names, preset keys) or `attribute` (parameters and
submodules of an `nn.Module`); every string through `quote`, every number through `number`.
`identifier` is a readable spelling (`γ^1_l` → `gamma1_l`), so two distinct card names may
spell the same; the checker's `collisions` step reports those, which is what makes the mapping
injective over what `check` accepts. Names the generated code itself needs are *reserved*: a card
name that would spell one gets a trailing underscore, everywhere alike.

No torch here: `check` must not import it, so `nn.Module`'s attribute names are data.
"""

from __future__ import annotations

import keyword
import math
import re

from .spelling import python_name


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Globals of a generated module, the names its methods and functions bind themselves, and the
# attributes it sets on a model (omega: the buffer of RoPE's frequencies).
GENERATED = frozenset({
    "torch", "F", "nn", "math", "KVCache", "PRESETS",
    "self", "cache", "targets", "loss", "past", "optimizer", "report", "start",
    "skip", "decayed",
    "undecayed", "group", "new_cache", "max_seq_len", "returns", "card_meta", "training",
    "omega", "grouped_sdpa", "rotate_half", "rotate_pairs", "rope_angles", "real_type", "ANGLES",
    "rope_table", "rope_frequencies", "TABLES", "turn", "offset_rms_norm",
    "rms_normalize", "RMS_EPS",
    "shared_mask", "shared_value", "VALUES", "inference_made", "project", "XW", "JOINED_MAX", "cat_broadcast",
    "generate", "pick_token", "filter_logits",  # a decoder's method, the functions it calls
    "hold_stopped", "stop",  # and the stop tokens it holds; a sampling card's caller's stop(y)
    "linear_scan", "previous_states", "stack_broadcast",  # a recurrence over positions
    "resume", "hold",  # the cache's methods a recurrence calls
    "advance", "sees_all", "first_query", "rows_at", "beyond", "rope_rows",  # the positions a static cache holds
    "holds", "keep", "encoding",  # and those an encoder–decoder's source is encoded once by,
    "kept", "keep_context",  # and its cross keys and values made once
    "top_mask", "route", "route_one", "route_dense", "ROWS", "FEW",  # sparse experts
    "cut_patches", "gather_patches", "patch_grid",  # patches(X | p)
    "lookup", "broadcast_sizes",  # a vector per head read at a tensor of indices
    "factored_sdpa", "heads_product",  # attention whose queries are a product (cardc.lower.factored)
    "nll", "log_likelihood", "LOGITS_AT_ONCE", "head",  # the loss a few rows at a time
})
# Python's builtins (3.11): a card name must not shadow one the generated code calls, and
# shadowing none is simpler to see than which ones it calls.
BUILTINS = _words("""
ArithmeticError AssertionError AttributeError BaseException BaseExceptionGroup BlockingIOError
BrokenPipeError BufferError BytesWarning ChildProcessError ConnectionAbortedError ConnectionError
ConnectionRefusedError ConnectionResetError DeprecationWarning EOFError Ellipsis EncodingWarning
EnvironmentError Exception ExceptionGroup False FileExistsError FileNotFoundError
FloatingPointError FutureWarning GeneratorExit IOError ImportError ImportWarning IndentationError
IndexError InterruptedError IsADirectoryError KeyError KeyboardInterrupt LookupError MemoryError
ModuleNotFoundError NameError None NotADirectoryError NotImplemented NotImplementedError OSError
OverflowError PendingDeprecationWarning PermissionError ProcessLookupError PythonFinalizationError
RecursionError ReferenceError ResourceWarning RuntimeError RuntimeWarning StopAsyncIteration
StopIteration SyntaxError SyntaxWarning SystemError SystemExit TabError TimeoutError True
TypeError UnboundLocalError UnicodeDecodeError UnicodeEncodeError UnicodeError
UnicodeTranslateError UnicodeWarning UserWarning ValueError Warning ZeroDivisionError abs aiter
all anext any ascii bin bool breakpoint bytearray bytes callable chr classmethod compile complex
copyright credits delattr dict dir divmod enumerate eval exec exit filter float format frozenset
getattr globals hasattr hash help hex id input int isinstance issubclass iter len license list
locals map max memoryview min next object oct open ord pow print property quit range repr
reversed round set setattr slice sorted staticmethod str sum super tuple type vars zip
""")
# torch.nn.Module's public attributes (torch 2.x): a parameter, submodule or hyperparameter
# stored under one of these names would replace a method every model relies on.
NN_MODULE = _words("""
T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter
get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
named_parameters parameters register_backward_hook register_buffer register_forward_hook
register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
register_parameter register_state_dict_post_hook register_state_dict_pre_hook requires_grad_
set_extra_state set_submodule share_memory state_dict to to_empty train type xpu zero_grad
""")
# Modules that run things, and os.system: generated code imports none of them, but a class or
# local by such a name reads as the module, and an auditor should never have to tell them apart.
RUNNERS = _words("os sys subprocess importlib shutil builtins system")
RESERVED = GENERATED | BUILTINS | NN_MODULE | RUNNERS | frozenset(keyword.kwlist)

_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def mangle(py: str) -> str:
    """A Python spelling made safe: reserved names take a trailing underscore."""
    while py in RESERVED:
        py += "_"
    if not _IDENT.match(py):  # python_name only ever spells these; a guard, not a path
        raise ValueError(f"not a plain identifier: {py!r}")
    return py


def identifier(name: str) -> str:
    """The Python identifier of a card name: `γ^1_l` → `gamma1_l`, `loss` → `loss_`."""
    return mangle(python_name(name))


def attribute(base: str, decor: list[tuple[str, str]], family_var: str | None = None) -> str:
    """The attribute of a parameter or submodule split as (base, decorations): the family's
    variable drops out (`W^h_qkv` → `W_qkv`) and a bundle θ is named by its decorations
    (`θ^block_ℓ` → `block`, `γ^1` → `gamma1`)."""
    decor = [(k, v) for k, v in decor if v != family_var]
    if base == "θ" and decor:
        return identifier("_".join(v for _, v in decor))
    return identifier(base + "".join(f"{k}{{{v}}}" if len(v) > 1 else f"{k}{v}"
                                     for k, v in decor))


def quote(text: str) -> str:
    """A Python string literal of `text`, whatever it holds: `repr`'s, in double quotes where
    the text holds no quote (repr escapes everything else that could end the literal)."""
    text = str(text)
    out = repr(text)
    if out[0] == "'" and '"' not in text:  # then text holds no ' either: swap the delimiters
        out = f'"{out[1:-1]}"'
    return out


def number(value: float | int, integral: bool = False) -> str:
    """A Python literal of a finite number: `16`, `0.02`, `1e-05`; raises ValueError if the
    number is not finite (generated code would name `inf` or `nan`, which Python has not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    if integral:
        if float(value) != int(value):
            raise ValueError(f"{value} is not a whole number")
        return str(int(value))
    return repr(float(value))
