"""Training on several processes: torch's DistributedDataParallel, as torchrun starts it.

`torchrun --nproc-per-node N -m cardc train …` starts N copies of the command with RANK,
WORLD_SIZE and LOCAL_RANK set. Each process holds the whole model; each update, process r
reads every N-th example of the card's minibatch (so together they read the minibatch one
process would), and DDP averages their gradients before the optimizer steps: the same update
as one process, whatever N is. Rank 0 alone evaluates, logs and writes the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cardc.runtime.errors import RuntimeInputError


@dataclass(frozen=True)
class World:
    """This process's place among those training together."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (its rendezvous set), even as one process

    @property
    def main(self) -> bool:
        """The process that evaluates, logs and writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world_from_env(env: dict[str, str] | None = None) -> World:
    """The world torchrun describes in the environment (one process when it does not)."""
    env = dict(os.environ) if env is None else env
    if "WORLD_SIZE" not in env:
        return World()
    try:
        world = World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                      launched=True)
    except (KeyError, ValueError):
        raise RuntimeInputError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (as "
                                "torchrun sets them)") from None
    if not 0 <= world.rank < world.size or world.local_rank < 0:
        raise RuntimeInputError(f"RANK={world.rank} is not among WORLD_SIZE={world.size} "
                                "processes")
    return world


def join(world: World, device: torch.device, sharded: bool = False) -> None:
    """Join the process group: NCCL between GPUs, gloo between CPU processes. One process
    joins a group of its own only to be sharded (FSDP over one process keeps it whole)."""
    if (world.distributed or sharded and world.launched) and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, rank=world.rank, world_size=world.size, **kwargs)


def leave(world: World) -> None:
    if world.launched and dist.is_initialized():
        dist.destroy_process_group()


class Replicated(DistributedDataParallel):
    """DDP that also answers for the model's own attributes (a card reads its sizes, such as
    θ.N_V), as the model itself would."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def replicate(model: nn.Module, world: World, device: torch.device) -> nn.Module:
    """The model every process trains: wrapped in DDP when there are several."""
    if not world.distributed:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return Replicated(model, device_ids=ids)


class Shard:
    """Rank r's part of a card's dataset {x_n}: examples r, r + N, r + 2N, … of N processes.
    A card reading its minibatch x[iB′ : (i+1)B′] with B′ = B/N reads, across the processes,
    exactly x[iB : (i+1)B]."""

    def __init__(self, data: Any, world: World) -> None:
        self.data, self.world = data, world

    def __len__(self) -> int:
        return len(self.data) // self.world.size

    def _global(self, k: int) -> int:
        return k * self.world.size + self.world.rank

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            ns = [self._global(k) for k in range(*index.indices(len(self)))]
            rows = getattr(self.data, "rows", None)  # a token file's windows: one read
            if rows is not None:
                return list(rows(ns).unbind(0)) if ns else []
            return [self.data[n] for n in ns]
        k = index + len(self) if index < 0 else index
        if not 0 <= k < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        return self.data[self._global(k)]


def _wire() -> torch.device:
    """Where collectives' tensors must live: on the GPU for NCCL."""
    return torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")


def mean(value: torch.Tensor, world: World) -> torch.Tensor:
    """The mean of a number over the processes (every process must ask)."""
    if not world.distributed:
        return value
    value = value.detach().to(_wire(), copy=True)
    dist.all_reduce(value)
    return value / world.size


def anyone(flag: int, world: World) -> int:
    """The largest of a number over the processes: a signal one of them was sent."""
    if not world.distributed:
        return flag
    t = torch.tensor([flag], dtype=torch.int64, device=_wire())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gathered(tensor: torch.Tensor, world: World) -> list[torch.Tensor]:
    """Every process's copy of a CPU tensor of one shape (its random state), by rank."""
    if not world.distributed:
        return [tensor]
    mine = tensor.to(_wire())
    out = [torch.empty_like(mine) for _ in range(world.size)]
    dist.all_gather(out, mine)
    return [t.cpu() for t in out]


# ------------------------------------------------------------------ sharded (FSDP)


def shard(model: nn.Module) -> nn.Module:
    """torch's FSDP (fully_shard): each process keeps 1/N of every parameter, gradient and
    optimizer state, gathering a layer's parameters only while it runs; every layer of a stack
    (an nn.ModuleList) is a unit of its own, the rest of the model one more."""
    from torch.distributed.fsdp import fully_shard

    for stack in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for layer in stack:
            fully_shard(layer)
    fully_shard(model)
    _zero_grad_of_shards(model)
    return model


def _zero_grad_of_shards(model: nn.Module) -> None:
    """`model.zero_grad()` empties the shards' gradients whenever it is called. Between a
    forward and its backward, FSDP leaves the root's gathered copies registered in place of its
    shards, and a card's step `g ← ∇loss(θ)` empties θ's gradients there (after the forward
    that made the loss): the shards' gradients were kept, and the next backward added to them."""
    shards = list(model.parameters())

    def zero_grad(set_to_none: bool = True) -> None:
        for p in shards:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    model.zero_grad = zero_grad  # type: ignore[method-assign]


def _whole() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def whole_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """A sharded model's weights, whole, on rank 0's CPU (every process must ask)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_whole())


def whole_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A sharded optimizer's state, whole, on rank 0, keyed as a plain optimizer's state_dict
    is (by the parameter's place in its groups), so one format serves both."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=_whole())
    if "param_groups" not in full:
        return {"state": {}, "param_groups": []}  # not rank 0: nothing to write
    order = [name for group in full["param_groups"] for name in group["params"]]
    place = {name: i for i, name in enumerate(order)}
    state = {place[name]: values for name, values in full["state"].items()}
    groups, start = [], 0
    for group in full["param_groups"]:
        count = len(group["params"])
        groups.append({**group, "params": list(range(start, start + count))})
        start += count
    return {"state": state, "param_groups": groups}


def load_whole_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer
                         ) -> Callable[[dict[str, Any]], None]:
    """The loader of a whole, index-keyed optimizer state into a sharded optimizer: each
    process takes its share."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    names = [name for group in get_optimizer_state_dict(model, optimizer)["param_groups"]
             for name in group["params"]]
    devices = [p.device for group in optimizer.param_groups for p in group["params"]]

    def load(saved: dict[str, Any]) -> None:
        # on its parameter's device: FSDP shares a whole state out as it finds it, and a
        # shard left on the CPU meets its parameter's on the GPU at the next gathering
        state = {names[i]: {k: v.to(devices[i]) if k != "step" else v for k, v in values.items()}
                 for i, values in saved["state"].items()}
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]
        set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                                 options=StateDictOptions(full_state_dict=True))

    return load
