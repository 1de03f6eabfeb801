"""torch.distributed for the trainer: one process per rank (started by torchrun, or by the daemon
through torch's own elastic launcher), whole prompts per rank, and rank 0 alone owning the run
record, the sinks, the health monitor and the checkpoints.

`Dist` is the few collectives the trainer needs; with one process (`SINGLE`) every one of them is
the identity, so the training code reads the same at any world size.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    wait_s: float = field(default=0.0, repr=False)  # time spent in collectives since the last take_wait()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.wait_s += time.perf_counter() - t0

    def take_wait(self) -> float:
        w, self.wait_s = self.wait_s, 0.0
        return w

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce SUM of a tensor (a copy; the argument is untouched)."""
        if self.world == 1:
            return t
        t = t.detach().clone()
        self._timed(dist.all_reduce, t, op=dist.ReduceOp.SUM)
        return t

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """All-reduce SUM of the parameters' gradients, as one flat bucket (a LoRA adapter is small).
        DDP is not used: the training forward runs the model twice per micro-batch (each group's prompt
        once, then its completions), which DDP's reducer does not follow."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.flatten() for g in grads])
        self._timed(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        for p, g in zip(params, flat.split([g.numel() for g in grads])):
            p.grad = g.view_as(p)

    def same_as_rank0(self, params: list[torch.Tensor]) -> None:
        """Rank 0's values in every rank's parameters (initial weights: identical from here on)."""
        if self.world == 1:
            return
        flat = torch.cat([p.detach().flatten() for p in params])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for p, v in zip(params, flat.split([p.numel() for p in params])):
                p.copy_(v.view_as(p))

    def any(self, flag: bool, device) -> bool:
        """True on every rank if it is true on any (a stop request, a non-finite loss)."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=device)
        self._timed(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj) -> list | None:
        """Every rank's object, in rank order, on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world if self.main else None
        self._timed(dist.gather_object, obj, out, dst=0)
        return out

    def all_gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        self._timed(dist.all_gather_object, out, obj)
        return out

    def broadcast(self, obj):
        """Rank 0's object, on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        self._timed(dist.broadcast_object_list, box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            self._timed(dist.barrier)

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            # Leave together, then destroy the group before exit: gloo's teardown races with its worker
            # threads (a rank exiting with the group alive can abort, exit -6 instead of its own code:
            # pytorch#190489, seen once in CI before this); none since in 132 loaded 2-rank runs. A peer that
            # is gone answers the barrier at once (connection closed): nothing to wait for then.
            try:
                dist.barrier()
            except RuntimeError:
                pass
            dist.destroy_process_group()


SINGLE = Dist()


def from_env(device: str, timeout_s: float) -> Dist:
    """The process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT), or SINGLE.
    NCCL on CUDA, gloo on CPU; collectives time out after `timeout_s`, so a dead rank ends the run
    with an error instead of hanging the others."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return SINGLE
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # torch's launcher does not take its workers down when it is killed itself (a SIGKILLed
        # daemon, a lost node agent): a worker without its launcher checkpoints and stops instead.
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank, world, local)
