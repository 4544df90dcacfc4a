"""Prepared data folders: `cardc prepare` writes them, `cardc train --data DIR` reads them
lazily, a window at a time, in bounded memory; bad inputs are one line each."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cardc.cli import main
from cardc.runtime.checkpoint import read_checkpoint
from cardc.runtime.data import DataFolder, TokenArray, TokenWindows, text_splits
from cardc.runtime.prepare import SEPARATOR
from cardc.runtime.tokenizer import TOKENIZER_FILE, from_file, train_bpe

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=32", "--set", "H=2", "--set", "D_f=64", "--set", "N=1", "--set", "ctx=32"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "by", "the", "river", "near", "an", "old",
         "house;", "été,", "naïve,", "東京", "and", "🙂"]


def prose(lines: int, seed: int) -> str:
    r = random.Random(seed)
    return "".join(" ".join(r.choice(WORDS) for _ in range(8)) + ".\n" for _ in range(lines))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`cardc ARGV` in process: exit status, stdout, stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def leftovers(dest: Path) -> list[str]:
    """What a run or prepare into `dest` left beside it (staging or replaced folders)."""
    return [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, str]:
    """A folder of two text files and a JSON lines file, and the text they make: the files
    sorted by their path within it, each document's text, SEPARATOR between two."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    a, b = prose(60, 1), "  indented start\n\n\n" + prose(40, 2) + "no newline at the end"
    (folder / "a.txt").write_text(a, encoding="utf-8")
    (folder / "sub" / "b.md").write_text(b, encoding="utf-8")
    docs = [prose(3, 3), "", prose(2, 4)]  # the empty document is skipped
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    (folder / "c.jsonl").write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n",
                                    encoding="utf-8")
    (folder / ".hidden.txt").write_text("not read", encoding="utf-8")
    return folder, SEPARATOR.join([a, docs[0], docs[2], b])


def bins(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    return (np.fromfile(folder / "train.bin", dtype="<u2"),
            np.fromfile(folder / "val.bin", dtype="<u2"))


# ------------------------------------------------------------------ cardc prepare


@pytest.mark.parametrize("spec", ["bytes", "bpe:300"])
def test_prepare_tokenises_the_texts_in_order(capsys, corpus, tmp_path, monkeypatch, spec):
    """Read in small blocks and encoded in small chunks (a character split between two blocks,
    chunks cut where no token spans), the bins decode to the text, cut as `cardc train --data
    FILE` cuts one; a BPE is trained on the training part alone, as on the whole of it."""
    import cardc.runtime.prepare as prepare
    import cardc.runtime.tokenizer as tokenizer

    monkeypatch.setattr(prepare, "BLOCK", 7)
    monkeypatch.setattr(tokenizer, "STREAM_CHUNK", 50)
    folder, whole = corpus
    out = tmp_path / "data"
    code, stdout, err = run(capsys, "prepare", str(folder), "--out", str(out),
                            "--tokenizer", spec, "--val-fraction", "0.2")
    assert code == 0, err
    assert f"prepared {out}/" in stdout
    meta = json.loads((out / "meta.json").read_text())
    train_text, val_text = text_splits(whole.encode(), 0.2)
    if spec == "bytes":
        tok = DataFolder.open(out).tokenizer()
        assert sorted(p.name for p in out.iterdir()) == [".cardc-manifest", "meta.json", "train.bin",
                                                         "val.bin"]
    else:
        tok = from_file(out / TOKENIZER_FILE)
        assert tok.text == train_bpe(train_text, 300).text
        assert meta["tokenizer"]["sha256"] == hashlib.sha256(tok.text.encode()).hexdigest()
    train, val = bins(out)
    assert (tok.decode(train.tolist()), tok.decode(val.tolist())) == (train_text, val_text)
    assert train.tolist() == tok.corpus(train_text).tolist()  # as the whole text encodes
    assert meta["dtype"] == "uint16" and meta["byteorder"] == "little"
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    assert (out / "train.bin").stat().st_size == 2 * len(train)
    assert meta["tokenizer"]["spec"] == spec
    assert meta["tokenizer"]["vocab_size"] == tok.vocab_size <= (256 if spec == "bytes" else 300)
    assert meta["documents"] == 4 and meta["text_bytes"] == len(whole.encode())
    assert [s["path"] for s in meta["sources"]] == [
        str(folder / "a.txt"), str(folder / "c.jsonl"), str(folder / "sub" / "b.md")]
    for source in meta["sources"]:
        data = Path(source["path"]).read_bytes()
        assert source["bytes"] == len(data)
        assert source["sha256"] == hashlib.sha256(data).hexdigest()
    assert leftovers(out) == []


def test_prepare_replaces_a_prepared_folder_and_reads_files_in_the_order_named(capsys,
                                                                                tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("first file\n", encoding="utf-8")
    b.write_text("second file\n", encoding="utf-8")
    out = tmp_path / "data"
    for order in ([b, a], [a, b]):
        code, _, err = run(capsys, "prepare", *map(str, order), "--out", str(out))
        assert code == 0, err
    train, val = bins(out)
    assert bytes(train.tolist() + val.tolist()).decode() == "first file\n\n\nsecond file\n"


def test_a_streamed_text_is_cut_where_no_token_spans_or_where_it_must(monkeypatch):
    import cardc.runtime.tokenizer as tokenizer

    text = prose(40, 7)
    chunks = list(tokenizer.chunked(iter(text[i:i + 33] for i in range(0, len(text), 33)), 100))
    assert "".join(chunks) == text and len(chunks) > 5
    assert all(c.endswith("\n") for c in chunks[:-1])  # each cut after a line
    monkeypatch.setattr(tokenizer, "CHUNK", 40)  # a line longer than 8 · CHUNK is cut inside
    long = "x" * 1000 + "\nend\n"
    chunks = list(tokenizer.chunked([long[:500], long[500:]], 100))
    assert "".join(chunks) == long and max(map(len, chunks)) <= 320


# ------------------------------------------------------------------ the lazy dataset


@pytest.fixture(params=["<u2", "<u4"])
def positions(tmp_path, request) -> TokenArray:
    """A token file whose token k is k: a window's tokens say where it was cut."""
    np.arange(5000, dtype=request.param).tofile(tmp_path / "t.bin")
    return TokenArray(tmp_path / "t.bin", np.dtype(request.param), 5000, 2**16)


def test_a_window_depends_on_the_seed_and_its_index_alone(positions):
    ds = TokenWindows(positions, 40, 9, seed=3, device="cpu")
    forward = [ds[n] for n in range(40)]
    backward = [TokenWindows(positions, 40, 9, 3, "cpu")[n] for n in reversed(range(40))][::-1]
    assert all(torch.equal(u, v) for u, v in zip(forward, backward, strict=True))
    assert len(ds) == 40 and ds[-1].tolist() == forward[39].tolist()
    for w in forward:
        assert w.dtype == torch.int64 and w.shape == (9,)
        assert w.tolist() == list(range(w[0], w[0] + 9))  # one stretch of the file
        assert w[0] >= 0 and w[-1] < 5000
    assert len({w[0].item() for w in forward}) > 30  # spread over the file
    other = TokenWindows(positions, 40, 9, seed=4, device="cpu")
    assert not all(torch.equal(other[n], forward[n]) for n in range(40))
    with pytest.raises(IndexError):
        ds[40]


def test_a_slice_is_the_stacked_items(positions):
    ds = TokenWindows(positions, 40, 9, seed=3, device="cpu")
    batch = ds[8:16]
    assert isinstance(batch, list)
    assert torch.equal(torch.stack(batch), torch.stack([ds[n] for n in range(8, 16)]))
    assert torch.equal(torch.stack(ds[30:50]), torch.stack([ds[n] for n in range(30, 40)]))
    assert ds[10:3] == []


def test_a_token_outside_the_vocabulary_is_an_error(positions):
    from cardc.runtime.errors import RuntimeInputError

    ds = TokenWindows(positions.bounded(100), 40, 9, seed=3, device="cpu")
    with pytest.raises(RuntimeInputError, match="outside the vocabulary of 100"):
        torch.stack(ds[0:40])


# ------------------------------------------------------------------ training on a folder


def test_train_reads_a_prepared_folder(capsys, corpus, tmp_path):
    """The folder's tokenizer and vocabulary, its meta recorded in the checkpoint; eval reads
    its held-out tokens."""
    folder, _ = corpus
    data, out = tmp_path / "data", tmp_path / "run"
    code, _, err = run(capsys, "prepare", str(folder), "--out", str(data),
                       "--tokenizer", "bpe:300")
    assert code == 0, err
    code, stdout, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny", *SMALL,
                            "--steps", "4", "--batch-size", "2", "--block-size", "9",
                            "--eval-every", "2", "--data", str(data), "--tokenizer", "bpe:300",
                            "--out", str(out))
    assert code == 0, err
    meta, state = read_checkpoint(out)
    size = json.loads((data / "meta.json").read_text())["tokenizer"]["vocab_size"]
    assert meta["hyperparameters"]["V"] == size == state["W_e"].shape[0]
    assert (out / TOKENIZER_FILE).read_bytes() == (data / TOKENIZER_FILE).read_bytes()
    recorded = meta["data"]
    assert recorded["path"] == str(data.absolute())
    assert recorded["meta_sha256"] == hashlib.sha256((data / "meta.json").read_bytes()).hexdigest()
    assert (recorded["train_tokens"], recorded["val_tokens"]) == tuple(map(len, bins(data)))
    assert meta["train_config"]["data_path"] == str(data)
    code, stdout, err = run(capsys, "eval", str(out))
    assert code == 0, err
    assert f"the held-out split of '{data}'" in stdout


# ------------------------------------------------------------------ bad inputs


def one_error(code: int, err: str, expected_code: int = 1) -> str:
    assert code == expected_code, err
    assert err.startswith("cardc: error: ") and err.endswith("\n"), err
    return err.strip().splitlines()[-1]


def _missing(tmp: Path) -> list[str]:
    return [str(tmp / "nowhere.txt")]


def _empty(tmp: Path) -> list[str]:
    (tmp / "in").mkdir()
    (tmp / "in" / "a.txt").write_text("")
    (tmp / "in" / "b.jsonl").write_text('\n{"text": ""}\n')
    return [str(tmp / "in")]


def _binary(tmp: Path) -> list[str]:
    (tmp / "in").mkdir()
    (tmp / "in" / "a.txt").write_text("fine\n")
    (tmp / "in" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return [str(tmp / "in")]


def _latin1(tmp: Path) -> list[str]:
    (tmp / "a.txt").write_bytes("café au lait\n".encode("latin-1"))
    return [str(tmp / "a.txt")]


def _bad_line(tmp: Path) -> list[str]:
    (tmp / "c.jsonl").write_text('{"text": "one"}\n{"text": "two"\n')
    return [str(tmp / "c.jsonl")]


def _no_text_field(tmp: Path) -> list[str]:
    (tmp / "c.jsonl").write_text('{"text": "one"}\n\n{"body": "two"}\n')
    return [str(tmp / "c.jsonl")]


@pytest.mark.parametrize("inputs, message", [
    (_missing, "cannot read corpus file '{tmp}/nowhere.txt': No such file or directory"),
    (_empty, "no text to prepare: '{tmp}/in' holds no text"),
    (_binary, "'{tmp}/in/logo.png' is not text: it holds a NUL byte (at byte 8)"),
    (_latin1, "'{tmp}/a.txt' is not UTF-8 text (byte 3 is not: invalid continuation byte)"),
    (_bad_line, "{tmp}/c.jsonl:2: not a line of JSON"),
    (_no_text_field, "{tmp}/c.jsonl:3: expected a JSON object with a string field 'text'"),
])
def test_bad_prepare_inputs_are_one_line(capsys, tmp_path, inputs, message):
    out = tmp_path / "data"
    code, _, err = run(capsys, "prepare", *inputs(tmp_path), "--out", str(out))
    line = one_error(code, err)
    assert line.startswith("cardc: error: " + message.format(tmp=tmp_path)), line
    assert not out.exists() and leftovers(out) == []


@pytest.mark.parametrize("args, message", [
    (["--tokenizer", "bpe:10"], "--tokenizer bpe:10: a byte-level BPE holds the 256 bytes"),
    (["--val-fraction", "1"], "argument --val-fraction: must be a number in (0, 1), got 1"),
])
def test_bad_prepare_flags_are_usage_errors(capsys, tmp_path, args, message):
    (tmp_path / "a.txt").write_text("text\n")
    code, _, err = run(capsys, "prepare", str(tmp_path / "a.txt"), "--out",
                       str(tmp_path / "data"), *args)
    assert message in one_error(code, err.splitlines()[-1] + "\n", 2)
    assert not (tmp_path / "data").exists()


def test_prepare_refuses_an_out_folder_holding_other_files(capsys, tmp_path):
    (tmp_path / "a.txt").write_text("text\n")
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(out))
    assert one_error(code, err) == (f"cardc: error: '{out}' holds files that are not a prepared "
                                    "data folder ('notes.txt'); write it to an empty or new "
                                    "folder")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and leftovers(out) == []
    code, _, err = run(capsys, "prepare", str(tmp_path), "--out", str(tmp_path / "sub" / "d"))
    assert "lies inside the input folder" in one_error(code, err)


def test_a_killed_prepare_leaves_the_previous_folder_whole(capsys, tmp_path, monkeypatch):
    import cardc.runtime.prepare as prepare

    (tmp_path / "a.txt").write_text("first version\n" * 50)
    out = tmp_path / "data"
    assert run(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write = prepare._write_tokens

    def killed(*args):
        write(*args)  # the bins are written, meta.json not yet
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "_write_tokens", killed)
    (tmp_path / "a.txt").write_text("second version\n" * 50)
    code, _, err = run(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(out),
                       "--tokenizer", "bpe:300")
    assert code == 130 and err == "cardc: interrupted\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(out) == []


@pytest.fixture
def prepared(capsys, tmp_path) -> Path:
    (tmp_path / "a.txt").write_text(prose(80, 5), encoding="utf-8")
    out = tmp_path / "data"
    assert run(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(out))[0] == 0
    return out


def _corrupt_meta(data: Path) -> None:
    (data / "meta.json").write_text('{"format": "cardc-tokens", ')


def _bad_dtype(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "dtype": "float64"}))


def _short_bin(data: Path) -> None:
    with open(data / "train.bin", "r+b") as f:
        f.truncate(1001)


def _small_val(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    (data / "val.bin").write_bytes(b"\x01\x00" * 3)
    (data / "meta.json").write_text(json.dumps({**meta, "val_tokens": 3}))


def _foreign_tokenizer(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer"] = {"spec": "bpe:300", "kind": "bpe", "vocab_size": 300,
                         "file": TOKENIZER_FILE, "sha256": "0" * 64}
    (data / "meta.json").write_text(json.dumps(meta))
    train_bpe(prose(50, 6), 300).save(data)


@pytest.mark.parametrize("corrupt, args, code, message", [
    (_corrupt_meta, [], 1, "'{data}/meta.json' is not the meta.json of a prepared data folder: "
                           "not JSON"),
    (_bad_dtype, [], 1, "'{data}/meta.json' is not the meta.json of a prepared data folder: "
                        "dtype must be uint16 or uint32, byteorder little"),
    (_short_bin, [], 1, "'{data}/train.bin' holds 1,001 bytes, but meta.json says"),
    (_small_val, [], 1, "'{data}/val.bin' has 3 tokens; need more than 9"),
    (_foreign_tokenizer, [], 1, "'{data}/tokenizer.json' is not the tokenizer '{data}' was "
                                "prepared with"),
    (None, ["--tokenizer", "bpe:300"], 2, "--tokenizer bpe:300: '{data}' holds tokens of "
                                          "bytes; prepare it again"),
])
def test_a_bad_data_folder_is_one_line_and_writes_no_run(capsys, tmp_path, prepared, corrupt,
                                                          args, code, message):
    if corrupt is not None:
        corrupt(prepared)
    out = tmp_path / "run"
    got, stdout, err = run(capsys, "train", "cards/gpt2.card", "--preset", "tiny", *SMALL,
                           "--steps", "2", "--batch-size", "2", "--block-size", "9",
                           "--data", str(prepared), "--out", str(out), *args)
    line = one_error(got, err, code)
    assert line.startswith("cardc: error: " + message.format(data=prepared)), line
    assert not out.exists() and leftovers(out) == []


# The child measures the address space and the data (heap and private mappings) that the
# interpreter, torch and cardc hold, allows each HEADROOM more (RLIMIT_AS, RLIMIT_DATA), checks
# that a file's worth of memory is then refused, and trains; it prints what it used. numpy's
# BLAS takes a buffer per thread (tens of MiB each) at its first product, which the loss plot
# makes: one thread, and a first product before the measure, keep that out of the headroom.
CHILD = r"""
import json, re, resource, sys
import numpy, torch
numpy.ones((256, 256)) @ numpy.ones((256, 256))
from cardc.cli import main

def status(key):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)[1]) << 10

headroom, size = int(sys.argv[1]), int(sys.argv[2])
rss = status("VmRSS")
limits = {"as": status("VmSize") + headroom, "data": status("VmData") + headroom}
resource.setrlimit(resource.RLIMIT_AS, (limits["as"], limits["as"]))
resource.setrlimit(resource.RLIMIT_DATA, (limits["data"], limits["data"]))
try:
    bytearray(size)
    sys.exit("the limits do not bind")
except MemoryError:
    pass
code = main(sys.argv[3:])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
print(json.dumps({**limits, "baseline_rss": rss, "peak_rss": peak}))
sys.exit(code)
"""
HEADROOM = 256 * 2**20


def test_a_corpus_larger_than_the_memory_limit_trains(tmp_path):
    """A train.bin of 512 MiB trains in a process allowed 256 MiB of address space and of data
    beyond what the interpreter, torch and cardc hold when it starts: windows are read as the
    training card reads them. RLIMIT_DATA (the process's private memory, below the file's size)
    is what binds; peak RSS is reported, not asserted: it counts the pages of torch's libraries
    that a run happens to touch, which vary from machine to machine by a hundred MiB."""
    data, tokens = tmp_path / "data", 256 * 2**20
    data.mkdir()
    chunk = np.random.default_rng(0).integers(0, 256, 2**22, dtype=np.uint16).astype("<u2")
    try:
        with open(data / "train.bin", "wb") as f:
            for _ in range(tokens // len(chunk)):
                chunk.tofile(f)
        chunk[:5000].tofile(data / "val.bin")
        meta = {"format": "cardc-tokens", "version": 1, "dtype": "uint16",
                "byteorder": "little", "train_tokens": tokens, "val_tokens": 5000,
                "tokenizer": {"spec": "bytes", "kind": "bytes", "vocab_size": 256}}
        (data / "meta.json").write_text(json.dumps(meta))
        size = (data / "train.bin").stat().st_size
        r = subprocess.run([sys.executable, "-c", CHILD, str(HEADROOM), str(size), "train",
                            "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "3",
                            "--batch-size", "2", "--block-size", "17", "--data", str(data),
                            "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    finally:
        (data / "train.bin").unlink(missing_ok=True)  # 512 MiB: not left for pytest to keep
    assert r.returncode == 0, r.stdout + r.stderr
    used = json.loads(r.stdout.strip().splitlines()[-1])
    mib = {k: v / 2**20 for k, v in used.items()}
    print(f"\ntrain.bin {size / 2**20:.0f} MiB; RLIMIT_AS {mib['as']:.0f} MiB, RLIMIT_DATA "
          f"{mib['data']:.0f} MiB (each {HEADROOM / 2**20:.0f} MiB above the start); RSS "
          f"{mib['baseline_rss']:.0f} MiB at the start, {mib['peak_rss']:.0f} MiB at peak")
    assert used["data"] < size  # the whole file could not have been held
