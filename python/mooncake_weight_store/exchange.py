"""Exchanges: how the ranks of one job share the plan and the receipts of a
multi-rank :func:`~mooncake_weight_store.state_dict.save_state_dict` (and the boxes
of a :func:`~mooncake_weight_store.state_dict.load_state_dict` that cannot be derived
by symmetry).

An exchange has ``rank``, ``world_size`` and two collective operations on strings
(JSON), which every rank calls in the same order:

* ``all_gather(text) -> list[str]`` (indexed by rank);
* ``broadcast(text_or_None, root=0) -> str``.

Ready ones: :class:`LocalExchange` (one rank), :class:`ThreadExchange` (ranks as
threads of one process), :class:`FileExchange` (ranks as processes sharing a
directory: tests, single-node jobs without a process group) and
:class:`TorchDistributedExchange` (``torch.distributed``, when importable).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, List, Optional, Union, cast

from .errors import ArgumentError, LocalError, Status

__all__ = ["Exchange", "LocalExchange", "ThreadExchange", "FileExchange", "TorchDistributedExchange",
           "ExchangeTimeout"]


class ExchangeTimeout(LocalError, TimeoutError):
    """A collective did not complete in time (a rank died or never called it); status
    ``STORE`` (retryable once every rank is back)."""

    default_status = Status.STORE


class Exchange:
    """The exchange interface (see the module doc). Subclass it."""

    rank: int = 0
    world_size: int = 1

    def all_gather(self, text: str) -> List[str]:
        raise NotImplementedError

    def broadcast(self, text: Optional[str], root: int = 0) -> str:
        raise NotImplementedError


class LocalExchange(Exchange):
    """A world of one rank."""

    def __init__(self) -> None:
        self.rank, self.world_size = 0, 1

    def all_gather(self, text: str) -> List[str]:
        return [text]

    def broadcast(self, text: Optional[str], root: int = 0) -> str:
        if root != 0 or text is None:
            raise ArgumentError("a one-rank broadcast needs root 0 and a value")
        return text


class _ThreadGroup:
    def __init__(self, n: int, timeout: float) -> None:
        self.n = n
        self.timeout = timeout
        self.barrier = threading.Barrier(n)
        self.slots: List[Any] = [None] * n
        self.lock = threading.Lock()

    def wait(self) -> None:
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise ExchangeTimeout(f"thread exchange: not every one of {self.n} ranks arrived within "
                                  f"{self.timeout}s") from None


class ThreadExchange(Exchange):
    """Ranks as threads of one process: ``ThreadExchange.group(n)`` returns the ``n``
    exchanges (one per thread). ``timeout`` bounds each collective."""

    def __init__(self, group: _ThreadGroup, rank: int) -> None:
        self._g = group
        self.rank, self.world_size = rank, group.n

    @classmethod
    def group(cls, n: int, timeout: float = 120.0) -> List["ThreadExchange"]:
        if n < 1:
            raise ArgumentError("a group needs at least one rank")
        g = _ThreadGroup(n, timeout)
        return [cls(g, r) for r in range(n)]

    def all_gather(self, text: str) -> List[str]:
        g = self._g
        g.wait()  # every rank has read the previous round
        g.slots[self.rank] = text
        g.wait()
        return list(g.slots)

    def broadcast(self, text: Optional[str], root: int = 0) -> str:
        out = self.all_gather(cast(str, text) if self.rank == root else "")  # a None root is caught below
        value = out[root]
        if value is None:  # pragma: no cover - a root that passed None
            raise ArgumentError("broadcast root passed no value")
        return value


class FileExchange(Exchange):
    """Ranks as processes sharing ``directory`` (local or network file system).

    Each collective ``k`` writes ``<directory>/<k>.<rank>`` atomically (write then
    rename) and waits until the other ranks' files of round ``k`` exist. Polls every
    ``poll`` seconds, at most ``timeout`` seconds a collective. The directory must be
    empty or unused by other jobs; files are left for inspection.
    """

    def __init__(self, directory: Union[str, "os.PathLike[str]"], rank: int, world_size: int, *,
                 timeout: float = 120.0, poll: float = 0.002) -> None:
        if not 0 <= rank < world_size:
            raise ArgumentError(f"rank {rank} out of range for world_size {world_size}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = rank, world_size
        self.timeout, self.poll = timeout, poll
        self._round = 0

    def _write(self, k: int, tag: str, text: str) -> None:
        final = self.dir / f"{k:06d}.{tag}"
        tmp = self.dir / f".{k:06d}.{tag}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps({"v": text}), encoding="utf-8")
        os.replace(tmp, final)

    def _read(self, k: int, tag: str, deadline: float) -> str:
        p = self.dir / f"{k:06d}.{tag}"
        while True:
            try:
                return json.loads(p.read_text(encoding="utf-8"))["v"]
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise ExchangeTimeout(f"file exchange: {p} did not appear within {self.timeout}s "
                                          f"(rank {self.rank} of {self.world_size})") from None
                time.sleep(self.poll)

    def all_gather(self, text: str) -> List[str]:
        k = self._round
        self._round += 1
        self._write(k, str(self.rank), text)
        deadline = time.monotonic() + self.timeout
        return [self._read(k, str(r), deadline) for r in range(self.world_size)]

    def broadcast(self, text: Optional[str], root: int = 0) -> str:
        k = self._round
        self._round += 1
        if self.rank == root:
            if text is None:
                raise ArgumentError("broadcast root passed no value")
            self._write(k, "b", text)
            return text
        return self._read(k, "b", time.monotonic() + self.timeout)


class TorchDistributedExchange(Exchange):
    """``torch.distributed`` (an initialized default process group, or ``group``):
    ``all_gather_object`` and ``broadcast_object_list``."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist  # type: ignore  # noqa: WPS433 - optional dependency

        if not dist.is_available() or not dist.is_initialized():
            raise ArgumentError("torch.distributed is not initialized (call init_process_group first)")
        self._dist = dist
        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_gather(self, text: str) -> List[str]:
        out: List[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, text, group=self._group)
        return [str(x) for x in out]

    def broadcast(self, text: Optional[str], root: int = 0) -> str:
        box = [text if self.rank == root else None]
        src = root if self._group is None else self._dist.get_global_rank(self._group, root)
        self._dist.broadcast_object_list(box, src=src, group=self._group)
        return str(box[0])
