"""Corpus loading, splitting and batching: a text file read whole, or a prepared data folder.

A prepared data folder (`cardc prepare`) holds the corpus already tokenised as flat arrays of
little-endian token IDs, `train.bin` and `val.bin`, described by `meta.json` (and, for a BPE,
the `tokenizer.json` that made them). Training reads a window from the file when the training
card reads it, so a corpus far larger than memory trains. The folder is untrusted input:
meta.json is checked field by field and only ever read as data.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.jsontext import MAX_DEPTH, depth_over
from cardc.runtime.tokenizer import TOKENIZER_FILE, ByteTokenizer, Tokenizer, from_file

Tokens = bytes | bytearray | torch.Tensor

TRAIN_BIN, VAL_BIN, META_FILE = "train.bin", "val.bin", "meta.json"
DATA_FORMAT, DATA_VERSION = "cardc-tokens", 1
# Token IDs as stored: the narrowest type that holds the vocabulary, little-endian everywhere.
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
CHECK_CHUNK = 1 << 22  # tokens read at a time when a split's IDs are checked


def default_corpus() -> bytes:
    """English text of the pydoc topics shipped with CPython: offline and deterministic."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def load_corpus(path: str | None) -> bytes:
    """The default corpus when ``path`` is None, else the file's raw bytes."""
    if path is None:
        return default_corpus()
    check_corpus_path(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RuntimeInputError(f"cannot read corpus file '{path}': {e.strerror or e}") from e
    if not data:
        raise RuntimeInputError(f"corpus file '{path}' is empty")
    return data


def check_corpus_path(path: str) -> None:
    """Refuse what is not a regular file (a FIFO or /dev/zero never ends) before reading it."""
    if not os.path.exists(path):
        raise RuntimeInputError(f"cannot read corpus file '{path}': No such file or directory")
    if not os.path.isfile(path):
        raise RuntimeInputError(f"corpus file '{path}' is not a regular file")


def to_tensor(tokens: Tokens) -> torch.Tensor:
    """Bytes become a uint8 tensor (4x smaller than int64); tensors pass through."""
    if isinstance(tokens, torch.Tensor):
        return tokens
    return torch.frombuffer(bytearray(tokens), dtype=torch.uint8)


def split(tokens: Tokens, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Hold out the last ``val_fraction`` of the tokens for validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    data = to_tensor(tokens)
    n_train = len(data) - int(len(data) * val_fraction)
    return data[:n_train], data[n_train:]


def text_splits(data: bytes, val_fraction: float = 0.1) -> tuple[str, str]:
    """The corpus as training and held-out text: the last `val_fraction` held out, as `split`
    holds out bytes, the cut moved back to the start of a character."""
    cut = len(data) - int(len(data) * val_fraction)
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte
        cut -= 1
    return (data[:cut].decode("utf-8", errors="replace"),
            data[cut:].decode("utf-8", errors="replace"))


def corpus_splits(data: bytes, tokenizer: Tokenizer,
                  val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus's training and held-out token streams."""
    if isinstance(tokenizer, ByteTokenizer):  # the bytes are the tokens: cut where split cuts
        return split(data, val_fraction)
    train_text, val_text = text_splits(data, val_fraction)
    return tokenizer.corpus(train_text), tokenizer.corpus(val_text)


def get_batch(
    data: torch.Tensor | TokenArray,
    batch_size: int,
    block_size: int,
    generator: torch.Generator,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows ``x`` and their next-token targets ``y`` as int64 ``(B, T)``."""
    if len(data) <= block_size:  # a window is block_size + 1 tokens: inputs and targets
        raise RuntimeInputError(
            f"data split has {len(data)} tokens; need more than block_size={block_size}"
        )
    # Offsets come from a CPU generator so a run is reproducible whatever the device.
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    if isinstance(data, TokenArray):
        chunk = data.windows(starts.numpy(), block_size + 1).to(device)
    else:
        index = starts[:, None] + torch.arange(block_size + 1)
        chunk = data[index.to(data.device)].to(device=device, dtype=torch.long)
    return chunk[:, :-1], chunk[:, 1:]


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids."""
    return list(text.encode("utf-8"))


def decode(ids: Iterable[int] | torch.Tensor) -> str:
    """Token ids back to text; a sampled sequence may split a multi-byte character."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return bytes(ids).decode("utf-8", errors="replace")


# ------------------------------------------------------------------ prepared data folders


def token_dtype(vocab_size: int) -> str:
    """The narrowest stored type for IDs 0 … vocab_size − 1."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def is_data_folder(path: str | os.PathLike[str] | None) -> bool:
    """Whether `path` names a prepared data folder (one that holds a meta.json)."""
    return path is not None and (Path(path) / META_FILE).is_file()


@dataclass(frozen=True)
class TokenArray:
    """A token file, read a window at a time. Each window is read by its own positioned read,
    not through a memory map: touching a window of a map maps whole page-cache folios into the
    process (about 1 MiB a window, measured on Linux 6.18), so a run's resident memory would
    grow with every window it reads; a read copies only the window's bytes."""

    path: Path
    dtype: np.dtype
    count: int  # tokens in the file, which holds exactly that many
    vocab: int  # every ID read is checked against it: a corrupt file is an error, not a crash

    def __len__(self) -> int:
        return self.count

    def windows(self, starts: np.ndarray, length: int) -> torch.Tensor:
        """The `length` tokens from each of `starts`, as an int64 (len(starts), length) tensor."""
        out = np.empty((len(starts), length), dtype=self.dtype)
        size = self.dtype.itemsize
        try:
            with open(self.path, "rb", buffering=0) as f:
                for row, start in zip(out, starts.tolist(), strict=True):
                    if not 0 <= start <= self.count - length:
                        raise IndexError(f"tokens {start}…{start + length} of {self.count}")
                    f.seek(start * size)
                    if f.readinto(memoryview(row).cast("B")) != length * size:
                        raise RuntimeInputError(f"'{self.path}' is shorter than it was; "
                                                "prepare the folder again")
        except OSError as err:
            raise RuntimeInputError(f"cannot read '{self.path}': {err.strerror or err}") from None
        if out.size and (top := int(out.max())) >= self.vocab:
            raise RuntimeInputError(f"'{self.path}' holds token {top}, outside the vocabulary "
                                    f"of {self.vocab}; prepare the folder again")
        return torch.from_numpy(out.astype(np.int64))

    def bounded(self, vocab: int) -> TokenArray:
        """The same tokens, checked against the smaller of its vocabulary and `vocab`."""
        return replace(self, vocab=min(self.vocab, vocab))


class TokenWindows:
    """A training card's dataset {x_n}_{n=1}^{N_data}: `count` windows of `length` tokens of a
    token file, each cut when the card reads it. Window n starts where a generator seeded with
    (seed, n) says, so a run sees the same windows whatever order it reads them in, and no
    window is made before it is needed. The protocol is what generated training code uses:
    `len(x)`, `x[n]` (a 1-D int64 tensor on the device) and `x[a:b]` (a list of them, which
    the code stacks into a minibatch)."""

    def __init__(self, tokens: TokenArray, count: int, length: int, seed: int,
                 device: torch.device | str) -> None:
        if len(tokens) <= length:
            raise RuntimeInputError(f"'{tokens.path}' has {len(tokens)} tokens; need more than "
                                    f"{length}")
        self.tokens, self.count, self.length = tokens, count, length
        self.seed, self.device = seed % 2**64, torch.device(device)  # SeedSequence wants >= 0
        self.span = len(tokens) - length  # starts lie in [0, span), as tasks.windows draws them

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            rows = range(*index.indices(self.count))
            return list(self.rows(rows).unbind(0)) if rows else []
        n = operator.index(index)
        n = n + self.count if n < 0 else n
        if not 0 <= n < self.count:
            raise IndexError(f"window {index} of {self.count}")
        return self.rows([n])[0]

    def start(self, n: int) -> int:
        """Where window n starts: a draw of its own generator, seeded with (seed, n)."""
        return int(np.random.default_rng([self.seed, n]).integers(self.span))

    def rows(self, ns: Iterable[int]) -> torch.Tensor:
        """Windows `ns` as one (len(ns), length) int64 tensor on the device."""
        starts = np.array([self.start(n) for n in ns], dtype=np.int64)
        return self.tokens.windows(starts, self.length).to(self.device)


@dataclass(frozen=True)
class DataFolder:
    """A prepared data folder, its meta.json checked against its files."""

    path: Path
    meta: dict[str, Any]
    meta_sha256: str = field(repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DataFolder:
        """The folder at `path`: its meta.json well formed, its bins of the sizes it gives,
        its tokenizer.json (for a BPE) the one it records; else one error saying which."""
        folder = Path(path)
        file = folder / META_FILE
        try:
            raw = file.read_bytes()
            meta = json.loads(raw.decode("utf-8"))
        except OSError as err:
            raise RuntimeInputError(f"cannot read '{file}': {err.strerror or err}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise _bad_meta(file, f"not JSON ({err})") from None
        except RecursionError:
            meta = None
        if meta is None or depth_over(meta, MAX_DEPTH):
            raise _bad_meta(file, f"nested deeper than {MAX_DEPTH} levels")
        data = cls(folder, _checked_meta(meta, file), hashlib.sha256(raw).hexdigest())
        for part in ("train", "val"):
            data._check_size(part)
            data._check_ids(part)
        data.tokenizer()  # a tokenizer.json that is not the one recorded is refused now
        return data

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.meta["dtype"]]

    @property
    def spec(self) -> str:
        """The `--tokenizer` spec the folder was prepared with."""
        return str(self.meta["tokenizer"]["spec"])

    def file(self, part: str) -> Path:
        return self.path / (TRAIN_BIN if part == "train" else VAL_BIN)

    def tokens(self, part: str) -> TokenArray:
        """`train` or `val`, read a window at a time."""
        return TokenArray(self.file(part), self.dtype, self.meta[f"{part}_tokens"],
                          self.meta["tokenizer"]["vocab_size"])

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the tokens were made with: bytes, or the folder's tokenizer.json,
        which must be the file meta.json records."""
        recorded = self.meta["tokenizer"]
        file = self.path / TOKENIZER_FILE
        if recorded["kind"] == ByteTokenizer.kind:
            return ByteTokenizer()
        try:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
        except OSError as err:
            raise RuntimeInputError(f"cannot read '{file}': {err.strerror or err}") from None
        if digest != recorded.get("sha256"):
            raise RuntimeInputError(f"'{file}' is not the tokenizer '{self.path}' was prepared "
                                    "with; prepare the folder again")
        tokenizer = from_file(file, kind=str(recorded["kind"]))
        if tokenizer.vocab_size != recorded["vocab_size"]:
            raise _bad_meta(self.path / META_FILE, "its tokenizer's size is not the one of "
                                                   f"{TOKENIZER_FILE}")
        return tokenizer

    def check_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Refuse to read the tokens with a tokenizer other than the one that made them."""
        mine, theirs = self.meta["tokenizer"], tokenizer.record()
        if mine["kind"] != theirs["kind"] or mine.get("sha256") != theirs.get("sha256"):
            raise RuntimeInputError(f"'{self.path}' holds tokens of another tokenizer "
                                    f"({self.spec}) than the run's ({theirs['kind']}, "
                                    f"{theirs['vocab_size']:,} tokens)")

    def record(self) -> dict[str, Any]:
        """What a run's checkpoint records of the data it trained on."""
        return {"path": str(self.path.absolute()), "meta_sha256": self.meta_sha256,
                "train_tokens": self.meta["train_tokens"], "val_tokens": self.meta["val_tokens"],
                "dtype": self.meta["dtype"], "tokenizer": self.spec}

    def _check_size(self, part: str) -> None:
        file, count = self.file(part), self.meta[f"{part}_tokens"]
        try:
            size = file.stat().st_size
        except OSError as err:
            raise RuntimeInputError(f"cannot read '{file}': {err.strerror or err}") from None
        if size != count * self.dtype.itemsize:
            raise RuntimeInputError(f"'{file}' holds {size:,} bytes, but {META_FILE} says "
                                    f"{count:,} {self.meta['dtype']} tokens "
                                    f"({count * self.dtype.itemsize:,} bytes); prepare the "
                                    "folder again")


    def _check_ids(self, part: str) -> None:
        """Refuse a split that holds a token ID outside the vocabulary: every split, read a
        chunk at a time (a file far larger than memory is checked in bounded memory)."""
        file, vocab = self.file(part), self.meta["tokenizer"]["vocab_size"]
        try:
            with open(file, "rb") as f:
                while chunk := f.read(CHECK_CHUNK * self.dtype.itemsize):
                    top = int(np.frombuffer(chunk, dtype=self.dtype).max())
                    if top >= vocab:
                        raise RuntimeInputError(f"'{file}' holds token {top}, outside the "
                                                f"vocabulary of {vocab}; prepare the folder "
                                                "again")
        except OSError as err:
            raise RuntimeInputError(f"cannot read '{file}': {err.strerror or err}") from None


def _bad_meta(file: Path, reason: str) -> RuntimeInputError:
    return RuntimeInputError(f"'{file}' is not the meta.json of a prepared data folder: "
                             f"{reason}; prepare it again with cardc prepare")


def _checked_meta(meta: Any, file: Path) -> dict[str, Any]:
    """meta.json's fields that reading relies on, each of the type and range it must have."""
    if not isinstance(meta, dict):
        raise _bad_meta(file, "not a JSON object")
    if meta.get("format") != DATA_FORMAT or meta.get("version") != DATA_VERSION:
        raise _bad_meta(file, f"format is not {DATA_FORMAT} version {DATA_VERSION}")
    if meta.get("dtype") not in DTYPES or meta.get("byteorder") != "little":
        raise _bad_meta(file, "dtype must be uint16 or uint32, byteorder little")
    for key in ("train_tokens", "val_tokens"):
        if not _whole(meta.get(key)):
            raise _bad_meta(file, f"{key} must be a whole number")
    tok = meta.get("tokenizer")
    if not (isinstance(tok, dict) and isinstance(tok.get("spec"), str)
            and tok.get("kind") in ("bytes", "bpe") and _whole(tok.get("vocab_size"))):
        raise _bad_meta(file, "tokenizer must give its spec, kind (bytes or bpe) and "
                              "vocab_size")
    if not 1 <= tok["vocab_size"] <= np.iinfo(DTYPES[meta["dtype"]]).max + 1:
        raise _bad_meta(file, f"a vocabulary of {tok['vocab_size']} tokens does not fit "
                              f"{meta['dtype']}")
    if (tok["spec"] == "bytes") != (tok["kind"] == "bytes"):
        raise _bad_meta(file, f"tokenizer spec {tok['spec']!r} is not of kind {tok['kind']}")
    if tok["kind"] == "bytes" and tok["vocab_size"] != 256:
        raise _bad_meta(file, "a bytes tokenizer has 256 tokens")
    return meta


def _whole(value: Any) -> bool:
    return type(value) is int and value >= 0
