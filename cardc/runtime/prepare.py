"""`cardc prepare`: text tokenised once into a data folder that training reads by window.

The inputs are text files, folders of them, and JSON lines. They are read as one text: the
documents in order — the inputs as named; a folder's files sorted by their path within it; a
`.jsonl` file's lines in order — each non-empty document's text, with SEPARATOR between two.
A `.jsonl` file's documents are the `text` fields of its lines, one JSON object a line (blank
lines are skipped); any other file is one document, UTF-8 text. A folder contributes every
regular file below it, recursively, except hidden ones (a name that starts with a dot), so it
should hold text alone: a file that is not UTF-8, or that holds a NUL byte (binary data, or
UTF-16), is an error naming it, as a bad JSON line is one naming file:line.

The last `val_fraction` of the text's UTF-8 bytes is held out, the cut moved back to the start
of a character, as `cardc train --data FILE` holds out a text file's tail. Nothing is held in
memory whole: a first pass checks every source and measures the text (and hashes the files), a
BPE is trained on a pass over the training part alone, and a last pass encodes both parts a
chunk at a time, appending each chunk's tokens to train.bin or val.bin. The folder is written
as a run folder is (`staged_run`): staged beside its destination and renamed into place once
whole, so a killed prepare leaves no half folder.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import json
import operator
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from cardc.runtime.data import (
    DATA_FORMAT,
    DATA_VERSION,
    DTYPES,
    META_FILE,
    TRAIN_BIN,
    VAL_BIN,
    check_corpus_path,
    token_dtype,
)
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.runs import check_destination, staged_run
from cardc.runtime.tokenizer import (
    ByteTokenizer,
    Tokenizer,
    parse_spec,
    train_bpe_stream,
)

SEPARATOR = "\n\n"  # between two documents: a blank line, as paragraphs are set apart
BLOCK = 1 << 20  # bytes of a text file read at a time
DATA = "data"  # the kind of folder prepare writes (runtime.manifest)

Seen = Callable[[bytes], None]  # told each block of a source's raw bytes (its hash)


@dataclass
class Scan:
    """What the first pass learned: each source's size, hash and documents, and the text's
    length in UTF-8 bytes."""

    sources: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    text_bytes: int = 0


def prepare(inputs: list[str], out: str, spec: str = "bytes", val_fraction: float = 0.1,
            log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Tokenise the inputs into the data folder `out` (train.bin, val.bin, meta.json and, for
    a BPE, tokenizer.json); its meta.json as a dict."""
    size = parse_spec(spec)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    dest = Path(out)
    check_destination(dest, DATA)  # before any reading: the staging below checks it again
    sources = find_sources(inputs, dest)
    scan = scan_sources(sources)
    if scan.text_bytes == 0:
        raise RuntimeInputError(f"no text to prepare: {_named(inputs)} hold"
                                f"{'s' if len(inputs) == 1 else ''} no text")
    log(f"read {len(sources):,} file(s): {scan.documents:,} document(s), "
        f"{scan.text_bytes:,} bytes of text")
    cut = scan.text_bytes - int(scan.text_bytes * val_fraction)
    tokenizer = _tokenizer(sources, size, cut, log)
    with staged_run(dest, DATA) as folder:
        tokenizer.save(folder)
        train, val = _write_tokens(sources, tokenizer, cut, scan.text_bytes, folder)
        meta = {"format": DATA_FORMAT, "version": DATA_VERSION,
                "dtype": token_dtype(tokenizer.vocab_size), "byteorder": "little",
                "train_tokens": train, "val_tokens": val,
                "tokenizer": {"spec": spec, **tokenizer.record()},
                "val_fraction": val_fraction, "separator": SEPARATOR,
                "documents": scan.documents, "text_bytes": scan.text_bytes,
                "sources": scan.sources}
        _write_durably(folder / META_FILE, json.dumps(meta, indent=2) + "\n")
    log(f"prepared {out}/: {train:,} training and {val:,} held-out tokens ({meta['dtype']})")
    return meta


def _tokenizer(sources: list[Path], size: int | None, cut: int,
               log: Callable[[str], Any]) -> Tokenizer:
    """Bytes, or a byte-level BPE of at most `size` tokens trained on a pass over the training
    part alone (the held-out text stays unseen)."""
    if size is None:
        return ByteTokenizer()
    training = itertools.takewhile(lambda part: not part[0], _split(text(sources), cut))
    tokenizer = train_bpe_stream((piece for _, piece in training), size)
    log(f"tokenizer: byte-level BPE of {tokenizer.vocab_size:,} tokens, trained on the "
        f"{cut:,} bytes of the training part")
    return tokenizer


# ------------------------------------------------------------------ finding and reading sources


def find_sources(inputs: list[str], dest: Path) -> list[Path]:
    """The files the inputs name, in the order they are read (see the module's docstring)."""
    found: list[Path] = []
    for name in inputs:
        path = Path(name)
        if not path.is_dir():
            check_corpus_path(name)
            found.append(path)
            continue
        if dest.absolute().resolve().is_relative_to(path.resolve()):
            raise RuntimeInputError(f"--out '{dest}' lies inside the input folder '{name}'; "
                                    "write the data folder elsewhere")
        found.extend(_folder_files(path))
    return found


def _folder_files(root: Path) -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        files.extend(Path(folder) / n for n in names if not n.startswith("."))
    return sorted((f for f in files if f.is_file()), key=lambda f: f.relative_to(root).parts)


def documents(source: Path, seen: Seen | None = None) -> Iterator[Iterator[str]]:
    """A source's documents, each as pieces of text; `seen` is given every raw block."""
    if source.suffix == ".jsonl":
        yield from (iter((t,)) for t in _jsonl_texts(source, seen))
    else:
        yield _text_pieces(source, seen)


def _text_pieces(source: Path, seen: Seen | None) -> Iterator[str]:
    """A text file as it is decoded, block by block; not UTF-8 text is an error naming it."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open(source) as f:
        while block := f.read(BLOCK):
            if seen is not None:
                seen(block)
            if (nul := block.find(b"\0")) != -1:
                raise RuntimeInputError(f"'{source}' is not text: it holds a NUL byte (at byte "
                                        f"{offset + nul:,})")
            yield _decoded(decoder, block, offset, source)
            offset += len(block)
        yield _decoded(decoder, b"", offset, source, final=True)


def _decoded(decoder: codecs.IncrementalDecoder, block: bytes, offset: int, source: Path,
             final: bool = False) -> str:
    pending = len(decoder.getstate()[0])  # bytes of a character the last block began
    try:
        return decoder.decode(block, final)
    except UnicodeDecodeError as err:
        raise RuntimeInputError(f"'{source}' is not UTF-8 text (byte {offset - pending + err.start:,}"
                                f" is not: {err.reason})") from None


def _jsonl_texts(source: Path, seen: Seen | None) -> Iterator[str]:
    """The `text` field of each line of a JSON lines file; a bad line is an error at it."""
    with _open(source) as f:
        for number, raw in enumerate(f, 1):
            if seen is not None:
                seen(raw)
            if not raw.strip():
                continue
            where = f"{source}:{number}"
            try:
                value = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise RuntimeInputError(f"{where}: not a line of JSON ({err})") from None
            if not (isinstance(value, dict) and isinstance(value.get("text"), str)):
                raise RuntimeInputError(f"{where}: expected a JSON object with a string "
                                        "field 'text'")
            try:
                value["text"].encode("utf-8")
            except UnicodeEncodeError:
                raise RuntimeInputError(f"{where}: its text is not Unicode (it holds a lone "
                                        "surrogate)") from None
            yield value["text"]


@contextlib.contextmanager
def _open(source: Path) -> Iterator[BinaryIO]:
    try:
        f = source.open("rb")
    except OSError as err:
        raise RuntimeInputError(f"cannot read '{source}': {err.strerror or err}") from None
    with f:
        yield f


def text(sources: list[Path], seen: dict[Path, Seen] | None = None,
         counted: Callable[[Path], None] | None = None) -> Iterator[str]:
    """The sources as one text, in pieces: each non-empty document, SEPARATOR between two.
    `counted` is told the source of each document that has text."""
    first = True
    for source in sources:
        for document in documents(source, (seen or {}).get(source)):
            started = False
            for piece in document:
                if not piece:
                    continue
                if not started:
                    if not first:
                        yield SEPARATOR
                    first, started = False, True
                    if counted is not None:
                        counted(source)
                yield piece


def scan_sources(sources: list[Path]) -> Scan:
    """The first pass: every source read and checked, hashed, its documents counted, and the
    text measured, before anything is written."""
    digests = {s: hashlib.sha256() for s in sources}
    docs = dict.fromkeys(sources, 0)
    scan = Scan()

    def counted(source: Path) -> None:
        docs[source] += 1

    for piece in text(sources, {s: d.update for s, d in digests.items()}, counted):
        scan.text_bytes += len(piece.encode("utf-8"))
    scan.documents = sum(docs.values())
    scan.sources = [{"path": str(s), "bytes": s.stat().st_size,
                     "sha256": digests[s].hexdigest(), "documents": docs[s]} for s in sources]
    return scan


def _split(pieces: Iterable[str], cut: int) -> Iterator[tuple[bool, str]]:
    """(held out, piece) for the pieces of a text: the first `cut` UTF-8 bytes (the cut moved
    back to the start of a character) train, the rest is held out."""
    at = 0
    for piece in pieces:
        if at >= cut:
            yield True, piece
            continue
        data = piece.encode("utf-8")
        if at + len(data) <= cut:
            yield False, piece
        else:
            k = cut - at
            while k > 0 and data[k] & 0xC0 == 0x80:  # a UTF-8 continuation byte
                k -= 1
            yield False, data[:k].decode("utf-8")
            yield True, data[k:].decode("utf-8")
        at += len(data)


# ------------------------------------------------------------------ writing


def _write_tokens(sources: list[Path], tokenizer: Tokenizer, cut: int, text_bytes: int,
                  folder: Path) -> tuple[int, int]:
    """The last pass: each part encoded a chunk at a time and appended to its file; the two
    parts' token counts."""
    dtype = DTYPES[token_dtype(tokenizer.vocab_size)]
    measured = [0]

    def measure(pieces: Iterable[str]) -> Iterator[str]:
        for piece in pieces:
            measured[0] += len(piece.encode("utf-8"))
            yield piece

    counts = [0, 0]
    with open(folder / TRAIN_BIN, "wb") as train, open(folder / VAL_BIN, "wb") as val:
        # the training part's pieces all come first, then the held-out part's: two groups
        for held, group in itertools.groupby(_split(measure(text(sources)), cut),
                                             key=operator.itemgetter(0)):
            out = val if held else train
            for ids in tokenizer.stream(piece for _, piece in group):
                ids.astype(dtype).tofile(out)
                counts[held] += len(ids)
        for out in (train, val):
            out.flush()
            os.fsync(out.fileno())
    if measured[0] != text_bytes:
        raise RuntimeInputError("the inputs changed while cardc prepare read them; run it again")
    return counts[0], counts[1]


def _write_durably(path: Path, content: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def _named(inputs: list[str]) -> str:
    return ", ".join(f"'{i}'" for i in inputs)
