"""Output folders: a command replaces only what cardc itself wrote there.

Every command that writes a folder (`docs`, `prepare`, `train`, `import`, `export`, `build`)
is pointed at a folder in each state a user may hand it — absent, empty, its own previous
output, a look-alike of its output beside a user's file, a user's file alone, its own output
with a user's file added — named directly or through a link. What must hold: a folder that
holds a file cardc did not write is refused in one line naming that file, and nothing in it is
touched; otherwise the command succeeds, through a link too, and leaves nothing beside it."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cardc.build
import cardc.cli.source
import cardc.runtime.train
from cardc.cli import main
from cardc.runtime.manifest import MANIFEST, Record, foreign_file, read_manifest, write_manifest

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--preset", "tiny", "--set", "D=16", "--set", "H=2", "--set", "D_f=32", "--set", "N=1",
        "--set", "ctx=16", "--batch-size", "2", "--block-size", "9"]
USER = "thesis.tex"  # a user's file, which must survive whatever the command does


def remembered(fn: Callable[..., Any], key: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` computed once per `key(*args)`."""
    seen: dict[Any, Any] = {}

    def once(*args: Any, **kwargs: Any) -> Any:
        k = key(*args, **kwargs)
        if k not in seen:
            seen[k] = fn(*args, **kwargs)
        return seen[k]
    return once


@pytest.fixture(scope="module", autouse=True)
def cheap_commands() -> Iterator[None]:
    """Each command's work made cheap where it has nothing to do with its folder: the cards
    are parsed and checked once for the module (every call would check the same unchanged
    library again), and a run's held-out loss is one batch rather than twenty. What each
    command does with its folder runs unchanged."""
    evaluate = cardc.runtime.train.next_token_loss
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cardc.build, "checked", remembered(
            cardc.build.checked,
            lambda paths, library, lazy=False: (tuple(map(str, paths)), repr(library), lazy)))
        mp.setattr(cardc.cli.source, "load", remembered(
            cardc.cli.source.load, lambda paths, **kw: (tuple(map(str, paths)), repr(kw))))
        mp.setattr(cardc.cli.source, "check", remembered(cardc.cli.source.check, id))
        mp.setattr(cardc.runtime.train, "next_token_loss",
                   lambda model, data, batches, *rest: evaluate(model, data, 1, *rest))
        yield


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, cheap_commands) -> dict[str, Path]:
    """What the commands read: a text, a trained run and its export (which import reads), and
    a folder for each command's own output (`previous`)."""
    base = tmp_path_factory.mktemp("inputs")
    (base / "a.txt").write_text("the cat sat on the mat.\n" * 40, encoding="utf-8")
    handler = signal.getsignal(signal.SIGTERM)  # what `cardc train` sets for its own process
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        assert main(["train", "cards/gpt2.card", *TINY, "--steps", "1", "--out",
                     str(base / "run")]) == 0
        assert main(["export", str(base / "run"), "--to", str(base / "hf")]) == 0
    signal.signal(signal.SIGTERM, handler)
    (base / "own").mkdir()
    return {"text": base / "a.txt", "run": base / "run", "hf": base / "hf", "own": base / "own"}


def command(name: str, inputs: dict[str, Path], out: Path) -> list[str]:
    return {
        "docs": ["docs", "cards/nn/layer_norm.card", "--out", str(out)],
        "prepare": ["prepare", str(inputs["text"]), "--out", str(out)],
        "train": ["train", "cards/gpt2.card", *TINY, "--steps", "1", "--out", str(out)],
        "import": ["import", "cards/gpt2.card", "--from", str(inputs["hf"]), "--out", str(out)],
        "export": ["export", str(inputs["run"]), "--to", str(out)],
        "build": ["build", "cards/gpt2.card", "--out", str(out)],
    }[name]


# Files that look like each command's output, with a user's file among them.
LOOK_ALIKE = {
    "docs": ["index.html", "style.css", USER],
    "prepare": ["train.bin", "val.bin", "meta.json", USER],
    "train": ["tokenizer.json", "checkpoints/epoch=3.ckpt", "tb/events.out.mine"],
    "import": ["tokenizer.json", "checkpoints/epoch=3.ckpt", "tb/events.out.mine"],
    "export": ["config.json", "model.safetensors", USER],
    "build": ["gpt2.py", USER],  # a module of the user's own at the path build writes
}
COMMANDS = list(LOOK_ALIKE)


def tree(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` and its bytes (links not followed)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def put(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"mine: {name}\n", encoding="utf-8")


STATES: dict[str, Callable[..., None]] = {}


def state(fn: Callable[..., None]) -> Callable[..., None]:
    STATES[fn.__name__] = fn
    return fn


@state
def absent(cli, name, inputs, folder):
    folder.rmdir()


@state
def empty(cli, name, inputs, folder):
    pass


@state
def previous(cli, name, inputs, folder):
    """The command's own output: made once, then copied (its manifest names files by their
    paths inside the folder)."""
    own = inputs["own"] / name
    if not own.exists():
        assert cli(*command(name, inputs, own)).returncode == 0
    shutil.copytree(own, folder, symlinks=True, dirs_exist_ok=True)


@state
def look_alike(cli, name, inputs, folder):
    put(folder, LOOK_ALIKE[name])


@state
def user_file_only(cli, name, inputs, folder):
    put(folder, [USER])


@state
def previous_and_user_file(cli, name, inputs, folder):
    previous(cli, name, inputs, folder)
    put(folder, [USER])


def refused(name: str, state_name: str) -> bool:
    """Whether the command must refuse the folder: it holds a file cardc did not write that
    the command would replace (build replaces only the modules it writes)."""
    if name == "build":
        return state_name == "look_alike"
    return state_name in ("look_alike", "user_file_only", "previous_and_user_file")


@pytest.mark.parametrize("link", [False, True], ids=["direct", "link"])
@pytest.mark.parametrize("state_name", list(STATES))
@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_replaces_only_what_cardc_wrote(cli, inputs, tmp_path, name, state_name, link):
    place = tmp_path / "place"
    folder = place / "out"
    folder.mkdir(parents=True)
    STATES[state_name](cli, name, inputs, folder)
    out = place / "link" if link else folder
    if link:
        out.symlink_to(folder, target_is_directory=True)
    before = tree(folder) if folder.exists() else None
    r = cli(*command(name, inputs, out))
    assert "Traceback" not in r.stderr
    if refused(name, state_name):
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and str(out) in r.stderr, r.stderr
        assert tree(folder) == before  # nothing touched
        assert any(f"{e}'" in r.stderr for e in before), r.stderr  # names a file in it
    else:
        assert r.returncode == 0, r.stderr
        after = tree(folder)
        if before is not None and name == "build":
            assert {k: v for k, v in before.items() if k == USER} == \
                {k: v for k, v in after.items() if k == USER}
        elif name != "build":
            record = read_manifest(folder)
            assert record is not None and all(record.owns(p) for p in after if p != MANIFEST)
    assert sorted(p.name for p in place.iterdir()) == (["link", "out"] if link else ["out"])
    if link:
        assert out.is_symlink() and out.resolve() == folder.resolve()


def test_a_manifest_of_another_kind_or_damaged_records_nothing(tmp_path):
    put(tmp_path, ["index.html"])
    write_manifest(tmp_path, "docs", ["index.html"])
    assert foreign_file(tmp_path, "docs") is None
    assert foreign_file(tmp_path, "run") == "index.html"  # a site is not a run
    for text in ("[" * 100_000, '{"format": "cardc-manifest", "kind": "docs", "files": [1]}',
                 "\xff"):
        (tmp_path / MANIFEST).write_text(text, encoding="utf-8", errors="surrogateescape")
        assert read_manifest(tmp_path) is None
        assert foreign_file(tmp_path, "docs") == MANIFEST  # someone's file of that name


def test_a_recorded_folder_owns_what_is_below_it():
    record = Record("run", frozenset({"checkpoints/", "metrics.jsonl"}))
    assert record.owns("checkpoints/step-0000001/model.safetensors")
    assert record.owns("metrics.jsonl")
    assert not record.owns("checkpoints2/x") and not record.owns("metrics.jsonl/x")


def test_a_run_killed_after_publishing_can_be_trained_into_again(cli, tmp_path):
    """A run's checkpoints are recorded before they are written: a killed run leaves a folder
    that is its own, which a new run may replace."""
    out = tmp_path / "run"
    assert cli("train", "cards/gpt2.card", *TINY, "--steps", "2", "--save-every", "1",
               "--out", str(out)).returncode == 0
    (out / "model.safetensors").unlink()  # as if killed before it finished
    shutil.copytree(out / "checkpoints", out / "checkpoints" / "step-9999999")
    assert foreign_file(out, "run") is None
    assert cli("train", "cards/gpt2.card", *TINY, "--steps", "1", "--out", str(out)).returncode == 0


def test_build_refuses_to_overwrite_a_module_it_did_not_generate(cli, tmp_path):
    (tmp_path / "gpt2.py").write_text("print('mine')\n", encoding="utf-8")
    r = cli("build", "cards/gpt2.card", "--out", str(tmp_path))
    assert r.returncode == 1
    assert r.stderr == (f"cardc: error: '{tmp_path / 'gpt2.py'}' is not a module cardc "
                        "generated (it does not start with '# Code generated by cardc'); move "
                        "it, or build to another --out\n")
    assert (tmp_path / "gpt2.py").read_text(encoding="utf-8") == "print('mine')\n"
    assert os.listdir(tmp_path) == ["gpt2.py"]
