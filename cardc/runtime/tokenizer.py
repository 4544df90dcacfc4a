"""Tokenizers: how text becomes the token IDs a model reads, and back.

Bytes are the default: token ID k is the byte k, 256 of them, and a run needs no file for
them. IDs are 0-based as the generated models index their embeddings (a card's `{1..V}` counts
the same tokens from 1). Any other tokenizer is a Hugging Face `tokenizers` tokenizer kept as
`tokenizer.json` beside the weights: `cardc train --tokenizer bpe:N` trains a byte-level BPE,
`cardc import` copies the checkpoint's own. The file is untrusted input: `tokenizers` parses
it into its own types (nothing in it is run), and a file it cannot parse ends in one line
naming the file. The checkpoint records the file's SHA-256, so a run never samples with the
tokenizer of another.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import string
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from cardc.atomic import write_text_atomic
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.jsontext import loads

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"  # what transformers reads beside tokenizer.json
BYTES = 256
MAX_BPE = 2**20  # a vocabulary larger than any real model's is a typo
MAX_FILE = 1 << 28  # bytes of a tokenizer.json: a vocabulary of MAX_BPE tokens takes far fewer
# Encoded once when a tokenizer is read, so that one whose pre-tokenizer fails on text (a
# regular expression whose backtracking the engine gives up on) is refused where it is read:
# prose, and a long run of each printable ASCII character on its own.
PROBES = ["Hello, world! 123 ünïcödé 漢字 \n\t  end.\n", *(c * 64 for c in string.printable)]
CHUNK = 1 << 20  # characters of corpus text per encode call: bounded memory, parallel batches
# A streamed text (`chunked`) goes in far shorter chunks: tokenizers encodes them several times
# faster, with less memory per call, and buffers 256 of them while it trains a BPE.
STREAM_CHUNK = 1 << 14
BATCH = 8  # chunks per encode_batch call, which tokenizers encodes in parallel
STREAM_BATCH = 16
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
T = TypeVar("T")


class Tokenizer(Protocol):
    """What the harness and the sampler need of a tokenizer."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def prompt(self, text: str) -> list[int]: ...
    def corpus(self, text: str) -> torch.Tensor: ...
    def stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]: ...
    def save(self, folder: str | os.PathLike[str]) -> None: ...
    def record(self) -> dict[str, Any]: ...


class ByteTokenizer:
    """UTF-8 bytes as token IDs: what cardc has always read."""

    kind = "bytes"
    vocab_size = BYTES

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        # a sampled sequence may split a multi-byte character
        return bytes(_ints(ids)).decode("utf-8", errors="replace")

    def prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def corpus(self, text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)

    def stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        """The token IDs of a text given in pieces, piece by piece."""
        for piece in pieces:
            yield np.frombuffer(piece.encode("utf-8"), dtype=np.uint8)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Nothing: a run without tokenizer.json reads bytes."""

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size}


class HFTokenizer:
    """A `tokenizers.Tokenizer`, saved as tokenizer.json. `special` names its bos/eos/unk/pad
    tokens for transformers (tokenizer.json marks tokens special but says not which is which)."""

    def __init__(self, tok: Any, source: str = TOKENIZER_FILE,
                 special: dict[str, str] | None = None, kind: str | None = None) -> None:
        self.tok, self.source = tok, source
        self.special = dict(special or {})
        self.text = tok.to_str()  # what save writes, and what record's hash is of
        self.kind = kind or str(json.loads(self.text).get("model", {}).get("type", "")).lower()
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token IDs of `text` alone (no special tokens): decode gives `text` back."""
        return self._call(lambda: self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        ids = _ints(ids)
        return self._call(lambda: self.tok.decode(ids, skip_special_tokens=False))

    def prompt(self, text: str) -> list[int]:
        """A prompt as the model was trained to see one: with the special tokens the tokenizer
        adds (Llama's BOS; none for a byte-level BPE)."""
        return self._call(lambda: self.tok.encode(text, add_special_tokens=True).ids)

    def corpus(self, text: str) -> torch.Tensor:
        """A whole text's token IDs, encoded in chunks cut where no token can span (after a
        newline that a non-space follows), so memory stays bounded."""
        out = [torch.tensor(ids, dtype=torch.int32)
               for ids in self._encoded(_chunks(text), BATCH)]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int32)

    def stream(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        """The token IDs of a text given in pieces of any size, chunk by chunk (`chunked`):
        the IDs `corpus` gives for the whole text, in bounded memory."""
        for ids in self._encoded(chunked(pieces), STREAM_BATCH):
            yield np.array(ids, dtype=np.uint32)

    def _encoded(self, chunks: Iterable[str], size: int) -> Iterator[list[int]]:
        """Each chunk's token IDs, `size` chunks to a call; without offsets where tokenizers
        can leave them out (0.21 on), which nothing here reads."""
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        it = iter(chunks)
        while batch := list(itertools.islice(it, size)):
            encoded = self._call(lambda b=batch: encode(b, add_special_tokens=False))
            yield from (e.ids for e in encoded)

    def save(self, folder: str | os.PathLike[str]) -> None:
        write_text_atomic(Path(folder) / TOKENIZER_FILE, self.text)

    def record(self) -> dict[str, Any]:
        """What the checkpoint records: the kind, the size, the file's hash and special names."""
        out = {"kind": self.kind, "vocab_size": self.vocab_size, "file": TOKENIZER_FILE,
               "sha256": _sha256(self.text.encode("utf-8"))}
        return {**out, "special": self.special} if self.special else out

    def hf_files(self) -> dict[str, str]:
        """tokenizer.json and a tokenizer_config.json with which `transformers.AutoTokenizer`
        loads it as a PreTrainedTokenizerFast, decoding as `decode` does."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "clean_up_tokenization_spaces": False, **self.special}
        return {TOKENIZER_FILE: self.text,
                TOKENIZER_CONFIG: json.dumps(config, indent=2, sort_keys=True) + "\n"}

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as err:  # tokenizers raises bare Exception for whatever goes wrong
            raise RuntimeInputError(f"'{self.source}': {_first_line(err)}") from None
        except BaseException as err:  # a panic in tokenizers' Rust is not an Exception
            if type(err).__name__ != "PanicException":
                raise
            raise RuntimeInputError(f"'{self.source}': the tokenizer failed: "
                                    f"{_first_line(err)}") from None


def continuation(tokenizer: Tokenizer, prompt: list[int], new: list[int]) -> str:
    """The text `new` adds after `prompt`, decoded with it: a word's leading space (dropped at
    the start of a text by SentencePiece-style decoders) or a character split between the two
    reads as it does in the whole."""
    head, whole = tokenizer.decode(prompt), tokenizer.decode([*prompt, *new])
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new)


def _ints(ids: Iterable[int] | torch.Tensor) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]


def _chunks(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        cut = len(text) if len(text) - start <= CHUNK else _cut(text, start + CHUNK)
        yield text[start:cut]
        start = cut


def chunked(pieces: Iterable[str], size: int | None = None) -> Iterator[str]:
    """A text given in pieces of any size, regrouped into chunks of about `size`
    (STREAM_CHUNK) characters cut where no token can span, as `corpus` cuts a whole text. A
    stretch of 8 · CHUNK characters with no such place is cut anyway, so memory stays bounded
    (a token there may then differ from the whole text's; decoding still gives it back)."""
    size = size or STREAM_CHUNK
    most = max(size, 8 * CHUNK)
    buffer, start = "", 0
    for piece in pieces:
        buffer, start = buffer[start:] + piece, 0
        while len(buffer) - start > size:
            cut = _cut(buffer, start + size)
            if cut - start > most:  # no place near enough: cut where it must
                cut = start + size
            elif cut == len(buffer):  # no place yet: wait for more text
                break
            yield buffer[start:cut]
            start = cut
    if start < len(buffer):
        yield buffer[start:]


def _cut(text: str, near: int) -> int:
    """A position at or after `near` just after a newline followed by a non-space character;
    the end of the text if there is none."""
    at = near
    while (at := text.find("\n", at)) != -1:
        if at + 1 < len(text) and not text[at + 1].isspace():
            return at + 1
        at += 1
    return len(text)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ------------------------------------------------------------------ specs and training


def parse_spec(spec: str) -> int | None:
    """`--tokenizer`: None for `bytes`, N for `bpe:N`; ValueError with the reason otherwise."""
    if spec == "bytes":
        return None
    kind, sep, size = spec.partition(":")
    if kind != "bpe" or not sep:
        raise ValueError(f"--tokenizer {spec}: expected 'bytes' or 'bpe:N' (N tokens)")
    if not size.isdigit():
        raise ValueError(f"--tokenizer {spec}: N must be a whole number, got '{size}'")
    n = int(size)
    if not BYTES < n <= MAX_BPE:
        raise ValueError(f"--tokenizer {spec}: a byte-level BPE holds the {BYTES} bytes and "
                         f"its merges, so N must be between {BYTES + 1} and {MAX_BPE:,}")
    return n


def train_bpe(text: str, size: int) -> HFTokenizer:
    """A byte-level BPE of at most `size` tokens (fewer if `text` has too few pairs to merge):
    GPT-2's pre-tokenizer and decoder, no special tokens. Deterministic for a given text."""
    return _train_bpe(_chunks(text), size)


def train_bpe_stream(pieces: Iterable[str], size: int) -> HFTokenizer:
    """`train_bpe` of the text the pieces make, read once in bounded memory (the trainer keeps
    word counts, not the text)."""
    return _train_bpe(chunked(pieces), size)


def _train_bpe(chunks: Iterable[str], size: int) -> HFTokenizer:
    from tokenizers import Tokenizer as Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(chunks, trainer)
    return HFTokenizer(tok, kind="bpe")


# ------------------------------------------------------------------ loading


def from_file(path: str | os.PathLike[str], special: dict[str, str] | None = None,
              kind: str | None = None) -> HFTokenizer:
    """A tokenizer.json, or one line naming the file that is not one."""
    from tokenizers import Tokenizer as Tok

    try:
        if os.path.getsize(path) > MAX_FILE:
            raise RuntimeInputError(f"'{path}' is not a valid tokenizer file: larger than "
                                    f"{MAX_FILE >> 20} MiB")
        text = Path(path).read_bytes().decode("utf-8")
        check_bounds(_json(text, os.fspath(path), "is not a valid tokenizer file"), f"'{path}'")
        tok = Tok.from_str(text)
    except OSError as err:
        raise RuntimeInputError(f"cannot read '{path}': {err.strerror or err}") from None
    except RuntimeInputError:
        raise
    except Exception as err:  # UnicodeDecodeError, or tokenizers' bare Exception
        raise RuntimeInputError(f"'{path}' is not a valid tokenizer file: "
                                f"{_first_line(err)}") from None
    if tok.get_vocab_size(with_added_tokens=True) < 1:
        raise RuntimeInputError(f"'{path}' is not a valid tokenizer file: it has no tokens")
    tokenizer = HFTokenizer(tok, os.fspath(path), special, kind)
    with _quiet_stderr():  # a panic's report, which tokenizers prints, is said in one line
        for probe in PROBES:  # a pre-tokenizer that fails on text fails here, not later
            tokenizer.encode(probe)
    return tokenizer


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null meanwhile (what native code writes there too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_bounds(value: Any, where: str) -> None:
    """Refuse a tokenizer.json whose vocabulary or token IDs are beyond MAX_BPE, before
    anything is built from it (an ID of 10^9 makes tokenizers size a table by it)."""
    if not isinstance(value, dict):
        raise RuntimeInputError(f"{where} is not a valid tokenizer file: not a JSON object")
    model = value.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    added = value.get("added_tokens")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    ids += [t.get("id") for t in added if isinstance(t, dict)] if isinstance(added, list) else []
    count = (len(vocab) if isinstance(vocab, (dict, list)) else 0) + \
        (len(added) if isinstance(added, list) else 0)
    if count > MAX_BPE:
        raise RuntimeInputError(f"{where} is not a valid tokenizer file: it has {count:,} "
                                f"tokens, more than {MAX_BPE:,}")
    big = next((i for i in ids if type(i) is int and not 0 <= i < MAX_BPE), None)
    if big is not None:
        raise RuntimeInputError(f"{where} is not a valid tokenizer file: token ID {big:,} is "
                                f"outside 0 … {MAX_BPE - 1:,}")


def run_tokenizer(run: str | os.PathLike[str], meta: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a run folder (or of the folder of the checkpoint file named): bytes
    where the checkpoint records no other, else its tokenizer.json, which must be the file the
    checkpoint records."""
    folder = Path(run) if Path(run).is_dir() else Path(run).parent
    file = folder / TOKENIZER_FILE
    recorded = meta.get("tokenizer")
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind in (None, ByteTokenizer.kind):
        if file.exists():
            raise RuntimeInputError(f"'{run}' mixes two runs: its weights read bytes, but it "
                                    f"holds a {TOKENIZER_FILE}; train again into it, or into a "
                                    "new folder")
        return ByteTokenizer()
    if not file.is_file():
        raise RuntimeInputError(f"'{run}' has no {TOKENIZER_FILE}, and its weights read the "
                                f"tokens of one ({kind})")
    want = recorded.get("sha256")
    try:
        got = _sha256(file.read_bytes())
    except OSError as err:
        raise RuntimeInputError(f"cannot read '{file}': {err.strerror or err}") from None
    if got != want:
        raise RuntimeInputError(f"'{run}' mixes two runs: its {TOKENIZER_FILE} is not the one "
                                "its weights were trained with")
    special = recorded.get("special")
    return from_file(file, _strings(special) if isinstance(special, dict) else None, str(kind))


def hf_tokenizer(source: str | os.PathLike[str]) -> HFTokenizer | None:
    """The tokenizer of a Hugging Face model folder (or of the folder of the weights file
    named): its tokenizer.json, else GPT-2's vocab.json and merges.txt; None if it has neither.
    Which tokens are bos/eos/unk/pad is read from tokenizer_config.json or
    special_tokens_map.json, as strings only."""
    folder = Path(source) if Path(source).is_dir() else Path(source).parent
    special = _special_names(folder)
    if (folder / TOKENIZER_FILE).is_file():
        tok = from_file(folder / TOKENIZER_FILE)
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tok = _from_vocab_merges(folder / "vocab.json", folder / "merges.txt", special)
    else:
        return None
    vocab = tok.tok.get_vocab(with_added_tokens=True)
    return HFTokenizer(tok.tok, tok.source, {k: v for k, v in special.items() if v in vocab},
                       tok.kind)


def _from_vocab_merges(vocab_file: Path, merges_file: Path,
                       special: dict[str, str]) -> HFTokenizer:
    """GPT-2's byte-level BPE from its vocab.json and merges.txt (as transformers' slow
    GPT2Tokenizer saves it), its special tokens marked so a prompt may name them."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Tok

    vocab = _read_json(vocab_file)
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in vocab.items()):
        raise RuntimeInputError(f"'{vocab_file}' is not a vocabulary: expected token → ID")
    check_bounds({"model": {"vocab": vocab}}, f"'{vocab_file}'")
    merges = _read_merges(merges_file)
    try:
        tok = Tok(models.BPE(vocab=vocab, merges=merges))
    except Exception as err:
        raise RuntimeInputError(f"'{merges_file}' does not fit '{vocab_file}': "
                                f"{_first_line(err)}") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys(special.values())
                            if t in vocab])
    return HFTokenizer(tok, os.fspath(vocab_file), kind="bpe")


def _read_merges(file: Path) -> list[tuple[str, str]]:
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise RuntimeInputError(f"cannot read '{file}': {err}") from None
    merges = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise RuntimeInputError(f"'{file}' line {n} is not a merge of two tokens")
        merges.append((parts[0], parts[1]))
    return merges


def _special_names(folder: Path) -> dict[str, str]:
    """bos/eos/unk/pad token strings named by the folder's tokenizer_config.json, else its
    special_tokens_map.json (a string, or an object whose content is one)."""
    for name in (TOKENIZER_CONFIG, "special_tokens_map.json"):
        if (folder / name).is_file():
            config = _read_json(folder / name)
            found = {k: _content(config.get(k)) for k in SPECIAL_KEYS}
            return {k: v for k, v in found.items() if v}
    return {}


def _content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _strings(table: dict[Any, Any]) -> dict[str, str]:
    return {k: v for k, v in table.items() if k in SPECIAL_KEYS and isinstance(v, str)}


def _json(text: str, file: str, what: str) -> Any:
    """`text` parsed as JSON (nesting bounded), or one error: '`file`' `what`: why, where."""
    try:
        return loads(text, file, max_int=None)  # model_max_length is often 10^30
    except RuntimeInputError as err:
        raise RuntimeInputError(f"'{file}' {what}: {err}") from None


def _read_json(file: Path) -> dict[str, Any]:
    try:
        if file.stat().st_size > MAX_FILE:
            raise RuntimeInputError(f"'{file}' is larger than {MAX_FILE >> 20} MiB")
        value = _json(file.read_text(encoding="utf-8"), str(file), "is not valid JSON")
    except (OSError, UnicodeDecodeError) as err:
        raise RuntimeInputError(f"'{file}' is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise RuntimeInputError(f"'{file}' is not a JSON object")
    return value
