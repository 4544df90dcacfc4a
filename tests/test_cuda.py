"""On a CUDA device: every generated language model computes what it computes on the CPU and
decodes through its KV cache as it recomputes; `cardc train`, `sample` and `eval` run there;
and a run sharded by torch's FSDP (torchrun, one process per GPU) makes the updates of a plain
one and resumes. Skipped where torch sees no GPU, as in CI; on a machine with one:
`pytest tests/test_cuda.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from decodecheck import is_causal, token_inputs
from safetensors.torch import load_file
from test_decoding import FLOAT64_VALUES, walked  # noqa: F401  (walked: a fixture)
from test_distributed import stop_after_first_checkpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--set", "D=64", "--set", "H=2", "--set", "D_f=128", "--set", "N=2", "--set", "ctx=64"]
RUN = ["train", "cards/gpt2.card", "--preset", "tiny", *SMALL, "--steps", "40",
       "--eval-every", "10", "--save-every", "10", "--batch-size", "8", "--block-size", "32",
       "--device", "cuda"]
LOSSES = ("train_loss", "val_loss", "card_loss")


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 products in float32, not TF32, so that CUDA and the CPU agree to rounding."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_every_language_model_computes_on_cuda_what_it_computes_on_the_cpu(walked):  # noqa: F811
    """To float32's rounding; the models whose float32 rounding alone passes that (T5's unscaled
    scores: 2.8e-5 of the logits' size on an H200) in float64, far tighter."""
    for name, model, _, _ in walked:
        wide = name in FLOAT64_VALUES
        model = model.double() if wide else model
        xs = token_inputs(model, 14, 2)
        with torch.no_grad():
            cpu = model(*xs)
            gpu = model.to("cuda")(*[x.cuda() for x in xs]).cpu()
        model.cpu().float()
        scale = cpu.abs().max().item()
        assert (gpu - cpu).abs().max().item() < (1e-9 if wide else 1e-5) * scale, name


def test_every_causal_decoder_decodes_through_its_cache_on_cuda(walked):  # noqa: F811
    decoders = [(n, m) for n, m, _, _ in walked if hasattr(m, "new_cache") and is_causal(m)]
    assert len(decoders) >= 10
    for name, model in decoders:
        model.to("cuda")
        *prefix, x = [t.cuda() for t in token_inputs(model, 14, 2)]
        with torch.no_grad():
            full = model(*prefix, x)
            cache = model.new_cache()
            chunks = [x[:, :5], x[:, 5:6], x[:, 6:7], x[:, 7:11], x[:, 11:]]
            rows = torch.cat([model(*prefix, c, cache=cache) for c in chunks], dim=-2)
        model.cpu()
        assert (rows - full).abs().max().item() < 1e-5 * full.abs().max().item(), name


def test_a_static_cache_decodes_on_cuda_in_two_graphs():
    """Llama's card compiled (inductor) on the GPU, decoding through a static cache (its
    position a tensor on the device): the growing cache's eager logits, from two graphs."""
    import cardc as api

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = api.model("cards/llama.card", V=97, D=32, H=4, H_kv=2, N=2, D_f=64,
                      ctx=64).eval().cuda()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randint(0, 97, (2, 9), device="cuda")
    with torch.no_grad():
        eager_cache, static_cache = model.new_cache(), model.new_cache(length=40)
        for _ in range(16):
            want, got = model(x, cache=eager_cache), compiled(x, cache=static_cache)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            x = want[:, -1:].argmax(-1)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def cardc(*args: str, torchrun: bool = False) -> subprocess.CompletedProcess:
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone"] \
        if torchrun else []
    return subprocess.run([sys.executable, *launch, "-m", "cardc", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def run_once(tmp_path_factory, name: str, *flags: str, torchrun: bool = False) -> Path:
    out = tmp_path_factory.mktemp(name) / "run"
    r = cardc(*RUN, *flags, "--out", str(out), torchrun=torchrun)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "plain")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    return run_once(tmp_path_factory, "sharded", "--fsdp", torchrun=True)


def test_a_run_trains_samples_and_evaluates_on_cuda(plain):
    losses = [r["val_loss"] for r in records(plain)]
    assert losses[-1] < losses[0] - 0.5, losses
    r = cardc("sample", str(plain), "--prompt", "The ", "--tokens", "16", "--device", "cuda")
    assert r.returncode == 0 and r.stdout.startswith("The "), r.stderr
    r = cardc("eval", str(plain), "--device", "cuda")
    assert r.returncode == 0, r.stderr
    print(f"\nval loss {losses[0]:.4f} -> {losses[-1]:.4f}; eval: {r.stdout.strip()}")


def test_a_sharded_run_makes_the_updates_of_a_plain_one(tmp_path_factory):
    """FSDP over one process holds every shard: each update's loss is the plain run's, to
    float32's rounding. In float32, not bf16: AdamW's first steps move a weight by η whatever
    its gradient's size, so a bf16 rounding that flips a small gradient's sign moves it 2η.
    (Under bf16 this test allowed 2e-3, and so missed the root's gradients being carried from
    one update into the next: 2e-3 to 6e-3 off from the second update on, on an H200.)"""
    every = ["--eval-every", "1", "--steps", "20", "--precision", "float32"]
    one = records(run_once(tmp_path_factory, "plain1", *every))
    fsdp = records(run_once(tmp_path_factory, "sharded1", *every, "--fsdp", torchrun=True))
    assert [r["step"] for r in one] == [r["step"] for r in fsdp] == list(range(21))
    gaps = [max(abs(a[k] - b[k]) for k in LOSSES if a[k] is not None)
            for a, b in zip(one, fsdp, strict=True)]
    print("\nFSDP against plain, largest loss difference by update:",
          " ".join(f"{g:.1e}" for g in gaps))
    assert max(gaps) <= 1e-4


def test_a_stopped_sharded_run_resumes(sharded, tmp_path):
    """SIGTERM after the first checkpoint; the resumed run's gathered checkpoint restores into
    the shards and ends as the uninterrupted one."""
    out = tmp_path / "run"
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone"]
    stop_after_first_checkpoint([sys.executable, *launch, "-m", "cardc", *RUN, "--fsdp",
                                 "--out", str(out)], out)
    r = cardc(*RUN, "--fsdp", "--out", str(out), "--resume", str(out), torchrun=True)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = records(out), records(sharded)
    assert [x["step"] for x in a] == [x["step"] for x in b]
    worst = max(abs(x[k] - y[k]) for x, y in zip(a, b, strict=True) for k in LOSSES
                if x[k] is not None)
    w1, w2 = load_file(out / "model.safetensors"), load_file(sharded / "model.safetensors")
    moved = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    print(f"\nresumed FSDP against uninterrupted: losses {worst:.2e}, weights {moved:.2e}")
    assert worst <= 1e-4 and moved <= 1e-4
