"""Tests for the training/sampling runtime, using tiny stand-in models (no compiler needed)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from cardc.atomic import atomic_path
from cardc.ir import Analysis
from cardc.runtime.checkpoint import load_state, read_checkpoint, save_checkpoint
from cardc.runtime.data import (
    decode,
    default_corpus,
    encode,
    get_batch,
    load_corpus,
    split,
)
from cardc.runtime.errors import RuntimeInputError
from cardc.runtime.logits import filter_logits
from cardc.runtime.plot import plot_losses
from cardc.runtime.progress import ProgressBar
from cardc.runtime.sample import generate
from cardc.runtime.train import TrainConfig, resolve_device, train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REQUIRED_KEYS = {"step", "train_loss", "val_loss", "tokens_per_s", "lr", "elapsed_s"}


class Bigram(nn.Module):
    """Smallest model honouring the contract; refuses sequences over max_seq_len. It states
    what a card's lowering records of a generated model: a bigram reads no later token."""

    analysis = Analysis(causal=True)

    def __init__(self, vocab: int = 256, max_seq_len: int = 16) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.table = nn.Embedding(vocab, vocab)
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.register_buffer("scale", torch.ones(1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        assert idx.shape[1] <= self.max_seq_len, "context was not cropped"
        logits = self.table(idx) * self.scale + self.bias
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Tied(nn.Module):
    """Embedding and unembedding share one weight, as in GPT-2."""

    def __init__(self, vocab: int = 32, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.unembed = nn.Linear(dim, vocab, bias=False)
        self.unembed.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.embed(idx))


@pytest.fixture(scope="module")
def corpus() -> bytes:
    return default_corpus()


def test_corpus_nonempty_and_deterministic(corpus: bytes) -> None:
    assert len(corpus) > 100_000
    assert corpus == default_corpus()
    assert load_corpus(None) == corpus
    corpus.decode("utf-8")  # valid UTF-8 throughout


def test_load_corpus_errors(tmp_path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(RuntimeInputError, match="nope.txt"):
        load_corpus(str(missing))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(RuntimeInputError, match="empty.txt"):
        load_corpus(str(empty))
    full = tmp_path / "x.txt"
    full.write_bytes(b"hello")
    assert load_corpus(str(full)) == b"hello"


def test_split_sizes() -> None:
    train_data, val_data = split(bytes(range(100)) * 10)
    assert (len(train_data), len(val_data)) == (900, 100)
    assert val_data[0].item() == 0 and train_data[-1].item() == 99  # val is the tail


def test_batches_shift_by_one() -> None:
    data = torch.arange(200) % 256
    gen = torch.Generator().manual_seed(0)
    x, y = get_batch(data, 4, 8, gen, "cpu")
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y, x + 1)  # data is consecutive, so the next token is +1


def test_batches_reproducible_and_too_small() -> None:
    data = split(b"abcdefghij" * 50)[0]
    a = get_batch(data, 3, 5, torch.Generator().manual_seed(7), "cpu")
    b = get_batch(data, 3, 5, torch.Generator().manual_seed(7), "cpu")
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    with pytest.raises(RuntimeInputError):
        get_batch(data[:5], 1, 5, torch.Generator(), "cpu")


def test_encode_decode_round_trip() -> None:
    text = "naïve café — 東京 🙂"
    ids = encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) > len(text)
    assert decode(ids) == text
    assert decode(torch.tensor(ids)) == text
    assert decode(ids[:-1]).endswith("\ufffd")  # a cut character degrades, never raises


def sgd_recipe(x, theta, N_steps, B, l, eta, report=None):  # noqa: E741 (the card's ℓ)
    """A minibatch training card's function, written by hand: what the harness drives."""
    opt = torch.optim.SGD(theta.parameters(), lr=eta)
    for i in range(N_steps):
        batch = torch.stack(x[i * B:(i + 1) * B])
        loss = theta(batch[:, :-1], batch[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        if report is not None:
            report(loss.detach(), eta)
    return theta


def test_train_end_to_end(tmp_path, corpus: bytes) -> None:
    data_file = tmp_path / "corpus.txt"
    data_file.write_bytes(corpus[:30_000])
    out = tmp_path / "run"
    cfg = TrainConfig(out_dir=str(out), eval_every=20, eval_iters=4, device="cpu",
                      data_path=str(data_file))
    torch.manual_seed(0)
    model = Bigram(max_seq_len=16)
    lines: list[str] = []
    hypers = {"N_steps": 60, "B": 8, "l": 16, "eta": 3.0}
    records = train(model, sgd_recipe, hypers, cfg, {"card": "bigram"}, log=lines.append,
                    progress=False)

    assert [r["step"] for r in records] == [0, 20, 40, 60]
    assert records[-1]["val_loss"] < records[0]["val_loss"] - 0.5
    assert records[0]["tokens_per_s"] == 0.0 and records[-1]["tokens_per_s"] > 0
    assert records[-1]["lr"] == 3.0 and records[-1]["card_loss"] is not None
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics == records
    assert all(m.keys() >= REQUIRED_KEYS for m in metrics)
    assert (out / "loss.png").read_bytes()[:8] == PNG_MAGIC
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert "->" in lines[-1] and len(lines) == 5

    meta, state = read_checkpoint(out)
    assert meta["card"] == "bigram" and meta["block_size"] == 16 and meta["recipe"] == hypers
    assert math.isclose(meta["val_loss"], records[-1]["val_loss"])
    fresh = Bigram(max_seq_len=16)
    load_state(fresh, state)
    assert torch.equal(fresh.table.weight, model.table.weight)


def test_train_refuses_sequences_longer_than_the_context(tmp_path) -> None:
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), device="cpu")
    with pytest.raises(RuntimeInputError, match="ℓ = 17 tokens do not fit"):
        train(Bigram(max_seq_len=16), sgd_recipe, {"N_steps": 1, "B": 1, "l": 17, "eta": 1.0},
              cfg, {}, progress=False)
    assert not (tmp_path / "run").exists()


def test_bad_config_and_device() -> None:
    with pytest.raises(RuntimeInputError, match="eval_every"):
        TrainConfig(out_dir="x", eval_every=0)
    with pytest.raises(RuntimeInputError, match="bogus"):
        resolve_device("bogus")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeInputError, match="CUDA is not available"):
            resolve_device("cuda")


def test_checkpoint_round_trip(tmp_path) -> None:
    torch.manual_seed(1)
    model = Bigram(vocab=8)
    model.scale.fill_(2.0)
    save_checkpoint(tmp_path, model, {"name": "m", "n": 3, "x": 0.5})
    meta, state = read_checkpoint(tmp_path / "model.safetensors")
    assert meta == {"name": "m", "n": 3, "x": 0.5}
    fresh = Bigram(vocab=8)
    load_state(fresh, state)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


def test_checkpoint_keeps_tied_weights(tmp_path) -> None:
    torch.manual_seed(2)
    model = Tied()
    save_checkpoint(tmp_path, model, {})
    _, state = read_checkpoint(tmp_path)
    assert set(state) == {"embed.weight", "unembed.weight"}
    fresh = Tied()
    load_state(fresh, state)
    assert fresh.unembed.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_checkpoint_bad_files(tmp_path) -> None:
    with pytest.raises(RuntimeInputError, match="model.safetensors"):
        read_checkpoint(tmp_path)  # directory without a checkpoint
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(RuntimeInputError, match="not a valid safetensors"):
        read_checkpoint(tmp_path)
    save_checkpoint(tmp_path, Bigram(vocab=8), {})
    bad.write_bytes(bad.read_bytes()[:-10])  # truncated
    with pytest.raises(RuntimeInputError, match="model.safetensors"):
        read_checkpoint(bad)
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(RuntimeInputError, match="plain.safetensors.*metadata"):
        read_checkpoint(plain)


def test_load_state_names_offending_tensor(tmp_path) -> None:
    save_checkpoint(tmp_path, Bigram(vocab=8), {})
    _, state = read_checkpoint(tmp_path)
    with pytest.raises(
        RuntimeInputError, match=re.escape("'bias' has shape (8,), model expects (4,)")
    ):
        load_state(Bigram(vocab=4), state)
    msg = "checkpoint tensor 'table.weight' has shape (8, 8), model expects (4, 4)"
    with pytest.raises(RuntimeInputError, match=re.escape(msg)):
        load_state(Bigram(vocab=4), {**state, "bias": torch.zeros(4)})
    with pytest.raises(RuntimeInputError, match="'bias'"):
        load_state(Bigram(vocab=8), {k: v for k, v in state.items() if k != "bias"})
    with pytest.raises(RuntimeInputError, match="'extra'"):
        load_state(Bigram(vocab=8), {**state, "extra": torch.zeros(1)})


def test_greedy_generate_is_argmax_stepping() -> None:
    torch.manual_seed(3)
    model = Bigram(max_seq_len=4)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = generate(model, prompt, 10, temperature=0)
    assert out.shape == (2, 13) and torch.equal(out[:, :3], prompt)
    assert torch.equal(out, generate(model, prompt, 10, temperature=0))
    expected = prompt
    for _ in range(10):
        nxt = model(expected[:, -4:])[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, nxt], dim=1)
    assert torch.equal(out, expected)
    assert model.training  # mode restored


def test_sampling_seeded_and_top_k() -> None:
    torch.manual_seed(4)
    model = Bigram(max_seq_len=4)
    prompt = torch.zeros(2, 1, dtype=torch.long)
    a = generate(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(9))
    b = generate(model, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)
    top1 = generate(model, prompt, 8, temperature=5.0, top_k=1)
    assert torch.equal(top1, generate(model, prompt, 8, temperature=0))
    with pytest.raises(ValueError):
        generate(model, prompt, 1, temperature=-0.5)


def test_progress_bar_plain_output_is_short() -> None:
    stream = io.StringIO()
    bar = ProgressBar(1000, stream=stream)
    for step in range(1, 1001):
        bar.update(step, loss=1.0, tokens_per_s=5000.0)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in stream.getvalue()
    assert lines[-1].startswith("step 1000/1000")
    assert lines[0] == "step 100/1000 | loss 1.0000 | 5.00k tok/s | ETA " + lines[0][-5:]


def test_progress_bar_in_a_terminal_is_tqdms() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = ProgressBar(50, stream=stream)
    bar.update(50, loss=2.5, tokens_per_s=1234.0)
    bar.close()
    last = stream.getvalue().split("\r")[-1]
    assert last.startswith("step 50/50 |") and "| loss 2.5000 | 1.23k tok/s | ETA " in last
    assert last.endswith("\n")  # the finished bar stays on screen


def test_top_p_keeps_the_fewest_most_probable_tokens_that_reach_p() -> None:
    probs = torch.tensor([0.0625, 0.5, 0.125, 0.3125])  # sorted: 0.5, 0.3125, 0.125, 0.0625
    logits = probs.log()[None]

    def kept(**options: float) -> list[int]:
        return filter_logits(logits, **options).isfinite()[0].nonzero().flatten().tolist()

    assert kept(top_p=0.4) == [1]  # 0.5 alone reaches 0.4
    assert kept(top_p=0.6) == [1, 3]  # 0.5 + 0.3125 = 0.8125
    assert kept(top_p=0.8) == [1, 3]
    assert kept(top_p=0.9) == [1, 2, 3]  # + 0.125 = 0.9375
    assert kept(top_p=0.95) == [0, 1, 2, 3]
    assert kept(top_k=3, top_p=0.6) == [1, 3]
    assert kept(top_k=1, top_p=0.99) == [1]
    kept_logits = filter_logits(logits, top_p=0.6)
    assert torch.equal(kept_logits[0, [1, 3]], logits[0, [1, 3]])  # the kept keep their values
    for unchanged in (filter_logits(logits, top_p=1.0), filter_logits(logits)):
        assert torch.equal(unchanged, logits)


def test_top_p_one_changes_no_draw_and_a_tiny_top_p_is_greedy() -> None:
    torch.manual_seed(5)
    model = Bigram(max_seq_len=4)
    prompt = torch.zeros(3, 1, dtype=torch.long)

    def draw(**options: float) -> torch.Tensor:
        return generate(model, prompt, 12, generator=torch.Generator().manual_seed(2), **options)

    assert torch.equal(draw(top_p=1.0), draw())
    assert torch.equal(draw(top_p=1e-6), generate(model, prompt, 12, temperature=0))
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="top_p"):
            draw(top_p=bad)


def test_metrics_are_appended_record_by_record(tmp_path, corpus: bytes) -> None:
    """Each record adds its own line to metrics.jsonl in place: the earlier lines are never
    written again (the same file, its bytes only growing), so a record costs O(1), not
    O(records so far)."""
    data_file = tmp_path / "corpus.txt"
    data_file.write_bytes(corpus[:20_000])
    out = tmp_path / "run"
    seen: list[tuple[int, str]] = []

    def log(_: str) -> None:  # called right after each record is written
        for f in tmp_path.glob(".run.incomplete-*/metrics.jsonl"):
            seen.append((f.stat().st_ino, f.read_text()))

    cfg = TrainConfig(out_dir=str(out), eval_every=4, eval_iters=1, device="cpu",
                      data_path=str(data_file))
    records = train(Bigram(), sgd_recipe, {"N_steps": 40, "B": 2, "l": 16, "eta": 1.0}, cfg, {},
                    log=log, progress=False)
    assert len(seen) == len(records) == 11
    assert len({inode for inode, _ in seen}) == 1  # never replaced by a rewritten copy
    for (_, before), (_, after) in zip(seen, seen[1:], strict=False):
        assert after.startswith(before) and after.count("\n") == before.count("\n") + 1
    final = (out / "metrics.jsonl").read_text()
    assert final == seen[-1][1]
    assert [json.loads(line) for line in final.splitlines()] == records


class FakeWriter:
    """torch.utils.tensorboard.SummaryWriter's calls, recorded."""

    made: list[FakeWriter] = []

    def __init__(self, log_dir: str) -> None:
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        FakeWriter.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_tensorboard_gets_every_records_numbers(tmp_path, corpus: bytes, monkeypatch) -> None:
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    FakeWriter.made.clear()
    data_file = tmp_path / "corpus.txt"
    data_file.write_bytes(corpus[:20_000])
    cfg = TrainConfig(out_dir=str(tmp_path / "run"), eval_every=5, eval_iters=1, device="cpu",
                      data_path=str(data_file), tensorboard=True)
    records = train(Bigram(), sgd_recipe, {"N_steps": 10, "B": 2, "l": 16, "eta": 1.0}, cfg, {},
                    log=lambda _: None, progress=False)
    (writer,) = FakeWriter.made
    assert writer.closed and writer.log_dir.endswith(os.path.join(".run.incomplete-"
                                                                  f"{os.getpid()}", "tb"))
    assert [(s, v) for t, v, s in writer.scalars if t == "val_loss"] == \
        [(r["step"], r["val_loss"]) for r in records]
    assert {t for t, _, _ in writer.scalars} == {"train_loss", "val_loss", "card_loss",
                                                 "tokens_per_s", "lr"}


def test_plot_writes_png(tmp_path) -> None:
    records = [
        {"step": 0, "train_loss": 5.0, "val_loss": 5.1},
        {"step": 5, "train_loss": 3.0, "val_loss": None},
    ]
    plot_losses(records, tmp_path / "sub" / "loss.png")
    assert (tmp_path / "sub" / "loss.png").read_bytes()[:8] == PNG_MAGIC


class Views(nn.Module):
    """Buffers that are partial or transposed views of one storage."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.randn(4, 6)
        self.register_buffer("top", base[:2])
        self.register_buffer("bottom", base[2:])
        self.register_buffer("transposed", base.t())


def test_checkpoint_handles_views(tmp_path) -> None:
    model = Views()
    save_checkpoint(tmp_path, model, {})
    fresh = Views()
    load_state(fresh, read_checkpoint(tmp_path)[1])
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


def test_atomic_write_keeps_old_file_on_failure(tmp_path) -> None:
    target = tmp_path / "metrics.jsonl"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
