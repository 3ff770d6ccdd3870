"""The store contract on top of Mooncake Store's Python client.

:class:`MooncakeStoreBackend` wraps a ``mooncake.store.MooncakeDistributedStore`` (the
PyPI wheel ``mooncake-transfer-engine[-non-cuda]``) and offers the methods the
library's store vtable needs (see :mod:`mooncake_weight_store.store`,
``docs/STORE-VTABLE.md``):

=================  ==========================================================
method             Mooncake call
=================  ==========================================================
``put``            ``put(key, value, cfg)`` (insert-if-absent: an existing key
                   keeps its value and the call returns 0)
``upsert``         ``upsert(key, value, cfg)``
``get``            ``get_size`` + ``get_into`` (raises :class:`KeyError` if absent)
``get_size``       ``get_size(key)``
``batch_get_size`` ``batch_get_replica_desc(keys)``: one round trip; per key the
                   size of its COMPLETE memory replica, else ``get_size(key)``
``get_into``       ``get_into(key, ptr, cap)``
``exists``         ``is_exist(key)`` (alias ``is_exist``)
``remove``         ``remove(key, force=True)``; -704 counts as success
``batch_put_from`` ``batch_put_from(keys, ptrs, sizes, cfg)`` with
                   ``cfg.group_ids`` = one group per key
``get_into_ranges`` ``get_into_ranges`` in Mooncake's buffer-major 3-D form
``register_buffer`` / ``unregister_buffer``: the same-named calls
=================  ==========================================================

Every write uses ``ReplicateConfig(group_ids=[...], with_hard_pin=True,
data_type=WEIGHT | METADATA)``. Transient return codes are retried here with a
bounded backoff: -200 ``NO_AVAILABLE_HANDLE`` (eviction lag) on writes and -706
``OBJECT_HAS_LEASE`` on removal; what is left after the retries is returned as is
(the library retries these codes again).

Every method returns Mooncake's integer codes and never raises for a store failure,
so it can sit behind the C vtable. Only host memory is supported (the non-CUDA
wheel); device regions are refused with -600.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The store protocol's types and codes are the generic bridge's (store.py); this
# module only maps them onto Mooncake's client. Re-exported for compatibility.
from .store import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    NO_AVAILABLE_HANDLE,
    OBJECT_HAS_LEASE,
    OBJECT_NOT_FOUND,
    OK,
    PutItem,
    RangeItem,
    RecordType,
)

__all__ = [
    "OK",
    "NO_AVAILABLE_HANDLE",
    "INVALID_PARAMS",
    "OBJECT_NOT_FOUND",
    "OBJECT_HAS_LEASE",
    "RecordType",
    "PutItem",
    "RangeItem",
    "MooncakeStoreBackend",
    "MooncakeMaster",
    "free_port",
]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What a request to Mooncake Store costs through this client, as measured on
#: loopback with ``python/bench_mooncake.py`` (wheel 0.3.13.post1): about 21 us per
#: range of ``batch_get_into`` / ``get_into_ranges``, a fixed cost per call, and a few
#: GB/s per stream. The restore planner uses it to read spans of many short rows into
#: a staging buffer instead of one range per row.
MOONCAKE_COST: Dict[str, int] = {"per_request_ns": 40_000, "per_range_ns": 21_000, "bytes_per_second": 3_000_000_000}


class MooncakeStoreBackend:
    """Store contract over a ``MooncakeDistributedStore``.

    Args:
        store: an already set-up ``MooncakeDistributedStore`` (or any object with the
            same methods, e.g. a fault-injecting proxy). ``None`` creates one with
            :meth:`connect`-style arguments.
        retries: attempts for a transient code (-200 on writes, -706 on removal).
        backoff_s: first backoff; doubled per attempt, capped at ``max_backoff_s``.
        owns_store: close the store in :meth:`close`.
        cost: the backend's cost model for the restore planner (see :meth:`cost`);
            default :data:`MOONCAKE_COST`.
    """

    def __init__(
        self,
        store: Any,
        *,
        retries: int = 8,
        backoff_s: float = 0.005,
        max_backoff_s: float = 0.2,
        owns_store: bool = False,
        cost: Optional[Dict[str, int]] = None,
    ) -> None:
        from mooncake.store import ObjectDataType, ReplicateConfig  # type: ignore  # noqa: F401 (import check)

        self._cost = dict(MOONCAKE_COST if cost is None else cost)

        self.store = store
        self.retries = max(1, int(retries))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.owns_store = owns_store
        self._ReplicateConfig = ReplicateConfig
        self._types = {RecordType.PAYLOAD: ObjectDataType.WEIGHT, RecordType.METADATA: ObjectDataType.METADATA}
        self.stats: Dict[str, int] = {"retried_200": 0, "retried_706": 0}
        self._stats_lock = threading.Lock()
        self._closed = False

    # -- construction ---------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        master: str,
        *,
        local_hostname: str = "127.0.0.1",
        metadata_server: str = "P2PHANDSHAKE",
        global_segment_size: int = 256 << 20,
        local_buffer_size: int = 64 << 20,
        protocol: str = "tcp",
        rdma_devices: str = "",
        **kw: Any,
    ) -> "MooncakeStoreBackend":
        """Creates and sets up a ``MooncakeDistributedStore`` client of ``master``
        (``host:port``) and wraps it. ``global_segment_size=0`` makes a pure client
        (it contributes no memory; its bytes cross the transport to other clients).
        Sets ``MC_TCP_BIND_ADDRESS=127.0.0.1`` when ``local_hostname`` is loopback and
        the variable is unset."""
        if local_hostname.startswith("127.") or local_hostname == "localhost":
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        rc = store.setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
                         protocol, rdma_devices, master)
        if rc != 0:
            raise ConnectionError(f"MooncakeDistributedStore.setup({master}) failed: {rc}")
        return cls(store, owns_store=True, **kw)

    def close(self) -> None:
        """Closes the wrapped store if this backend created it (idempotent)."""
        if not self._closed:
            self._closed = True
            if self.owns_store:
                self.store.close()

    def __enter__(self) -> "MooncakeStoreBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------

    def config(self, group_ids: Sequence[str], record_type: int) -> Any:
        """``ReplicateConfig(group_ids, with_hard_pin=True, data_type=...)``."""
        cfg = self._ReplicateConfig()
        cfg.group_ids = list(group_ids)
        cfg.with_hard_pin = True
        cfg.data_type = self._types.get(int(record_type), self._types[RecordType.METADATA])
        return cfg

    def _count(self, what: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[what] = self.stats.get(what, 0) + n

    def _retry(self, op: Callable[[], int], transient: int) -> int:
        delay = self.backoff_s
        rc = op()
        for _ in range(self.retries - 1):
            if rc != transient:
                return rc
            self._count("retried_200" if transient == NO_AVAILABLE_HANDLE else "retried_706")
            time.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)
            rc = op()
        return rc

    @staticmethod
    def _int(rc: Any) -> int:
        if isinstance(rc, bool) or not isinstance(rc, int):
            return INTERNAL_ERROR
        return rc

    # -- the contract ---------------------------------------------------------------

    def put(self, key: str, value: Any, group_id: str = "", record_type: int = RecordType.METADATA) -> int:
        """Create-only put (Mooncake keeps the existing value and returns 0)."""
        cfg = self.config([group_id], record_type)
        return self._int(self._retry(lambda: self.store.put(key, value, cfg), NO_AVAILABLE_HANDLE))

    def upsert(self, key: str, value: Any, group_id: str = "", record_type: int = RecordType.METADATA) -> int:
        """Insert or overwrite (the group must not change while the key exists)."""
        cfg = self.config([group_id], record_type)
        return self._int(self._retry(lambda: self.store.upsert(key, value, cfg), NO_AVAILABLE_HANDLE))

    def get_size(self, key: str) -> int:
        return self._int(self.store.get_size(key))

    def get_into(self, key: str, address: int, capacity: int) -> int:
        return self._int(self.store.get_into(key, address, capacity))

    def batch_get_size(self, keys: Sequence[str]) -> List[int]:
        """Per key, exactly what :meth:`get_size` answers (bytes, or -704 absent), in
        one ``batch_get_replica_desc`` round trip: a key's size is its COMPLETE memory
        replicas' ``buffer_descriptor.size`` (all of them agreeing). A key the answer
        does not settle with certainty (absent from it, no COMPLETE replica, a disk
        replica, replicas that disagree, a descriptor not understood) is asked with
        ``get_size`` on its own; so is every key when the call raises or the wheel
        has no ``batch_get_replica_desc``."""
        keys = list(keys)
        descs: Any = {}
        done: Any = None
        batch = getattr(self.store, "batch_get_replica_desc", None)
        if keys and callable(batch):
            try:
                from mooncake.store import ReplicaStatus

                done = ReplicaStatus.COMPLETE
                descs = batch(keys)
                if not isinstance(descs, dict):
                    descs = {}
            except Exception:  # noqa: BLE001 - fall back to get_size per key
                descs = {}
        out: List[int] = []
        for k in keys:
            size = self._replica_size(descs.get(k), done)
            out.append(self.get_size(k) if size is None else size)
        return out

    @staticmethod
    def _replica_size(replicas: Any, done: Any) -> Optional[int]:
        """The object size the replica descriptors of one key state with certainty
        (``done``: ``ReplicaStatus.COMPLETE``), or None (then ``get_size`` decides)."""
        if not replicas or done is None:
            return None
        try:
            complete = [r for r in replicas if r.status == done]
            if not complete or not all(r.is_memory_replica() for r in complete):
                return None  # nothing complete, or a disk replica: its size is not checked here
            sizes = {r.get_memory_descriptor().buffer_descriptor.size for r in complete}
        except Exception:  # noqa: BLE001 - a descriptor not understood
            return None
        if len(sizes) != 1:
            return None
        size = sizes.pop()
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return None
        return size

    def get(self, key: str) -> bytes:
        """The whole object; raises :class:`KeyError` if absent, :class:`RuntimeError`
        on another error."""
        for _ in range(self.retries):
            n = self.get_size(key)
            if n == OBJECT_NOT_FOUND:
                raise KeyError(key)
            if n < 0:
                raise RuntimeError(f"get_size({key!r}) failed: {n}")
            buf = ctypes.create_string_buffer(max(n, 1))
            got = self.get_into(key, ctypes.addressof(buf), n)
            if got == n:
                return buf.raw[:n]
            if got == OBJECT_NOT_FOUND:
                raise KeyError(key)
            if got == INVALID_PARAMS:  # replaced by a larger object meanwhile: re-size
                continue
            raise RuntimeError(f"get_into({key!r}) failed: {got}")
        raise RuntimeError(f"get({key!r}) did not settle")

    def exists(self, key: str) -> int:
        """1 present, 0 absent, negative = error."""
        return self._int(self.store.is_exist(key))

    is_exist = exists

    def batch_exists(self, keys: Sequence[str]) -> List[int]:
        return [self._int(x) for x in self.store.batch_is_exist(list(keys))]

    # No `list`: MooncakeDistributedStore has no call that enumerates keys (no
    # list-keys, group-query or scan API; docs/mooncake/README.md, "Existence, size,
    # removal"), so this backend cannot implement the store contract's optional
    # listing and `mws ls` / `mws gc` do not work on Mooncake Store. Keep the plans
    # (or the manifest keys) to inspect and finalize revisions there.

    def remove(self, key: str) -> int:
        """Force removal; 0 removed, -704 absent (both success for the protocol)."""
        return self._int(self._retry(lambda: self.store.remove(key, True), OBJECT_HAS_LEASE))

    def batch_put_from(self, items: Sequence[PutItem], record_type: int = RecordType.PAYLOAD) -> List[int]:
        """Writes every item from (registered) host memory; per-item codes. Items that
        get -200 are retried (only those) with a bounded backoff."""
        n = len(items)
        results = [INTERNAL_ERROR] * n
        pending = []
        for i, it in enumerate(items):
            if it.memory_kind != 0:
                results[i] = INVALID_PARAMS  # device memory: not with this wheel
            else:
                pending.append(i)
        delay = self.backoff_s
        for attempt in range(self.retries):
            if not pending:
                break
            cfg = self.config([items[i].group_id for i in pending], record_type)
            rcs = self.store.batch_put_from(
                [items[i].key for i in pending],
                [items[i].address for i in pending],
                [items[i].len for i in pending],
                cfg,
            )
            if isinstance(rcs, int) and not isinstance(rcs, bool):
                rcs = [rcs] * len(pending)
            if not isinstance(rcs, (list, tuple)) or len(rcs) != len(pending):
                for i in pending:
                    results[i] = INTERNAL_ERROR
                break
            again = []
            for i, rc in zip(pending, rcs):
                rc = self._int(rc)
                results[i] = rc
                if rc == NO_AVAILABLE_HANDLE:
                    again.append(i)
            pending = again
            if pending and attempt + 1 < self.retries:
                self._count("retried_200", len(pending))
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        return results

    def get_into_ranges(self, items: Sequence[RangeItem]) -> List[int]:
        """Reads byte ranges into (registered) memory; per item, bytes read or a
        negative code.

        Translation to Mooncake's buffer-major form: items are grouped by
        ``buffer_address`` (order of first appearance), then by key (order of first
        appearance); destination offsets are ``dest_address - buffer_address``.
        """
        results = [INTERNAL_ERROR] * len(items)
        buffers: "OrderedDict[int, OrderedDict[str, List[int]]]" = OrderedDict()
        for i, it in enumerate(items):
            if it.memory_kind != 0 or it.dest_address < it.buffer_address:
                results[i] = INVALID_PARAMS
                continue
            buffers.setdefault(it.buffer_address, OrderedDict()).setdefault(it.key, []).append(i)
        if not buffers:
            return results
        ptrs, keys, dsts, srcs, sizes, index = [], [], [], [], [], []
        for addr, by_key in buffers.items():
            ptrs.append(addr)
            keys.append(list(by_key))
            dsts.append([[items[i].dest_address - addr for i in idx] for idx in by_key.values()])
            srcs.append([[items[i].object_offset for i in idx] for idx in by_key.values()])
            sizes.append([[items[i].len for i in idx] for idx in by_key.values()])
            index.append(list(by_key.values()))
        out = self.store.get_into_ranges(ptrs, keys, dsts, srcs, sizes)
        if isinstance(out, int) and not isinstance(out, bool):
            for idxs in index:
                for idx in idxs:
                    for i in idx:
                        results[i] = out
            return results
        for b, idxs in enumerate(index):
            per_buf = out[b] if b < len(out) else None
            for o, idx in enumerate(idxs):
                per_obj = per_buf[o] if per_buf is not None and o < len(per_buf) else None
                for r, i in enumerate(idx):
                    if per_obj is None:
                        results[i] = INTERNAL_ERROR
                    elif isinstance(per_obj, int):
                        results[i] = self._int(per_obj)
                    elif r < len(per_obj):
                        results[i] = self._int(per_obj[r])
        return results

    def cost(self) -> Dict[str, int]:
        """The cost model the library's restore planner uses for this store
        (``per_request_ns``, ``per_range_ns``, ``bytes_per_second``): asked once when
        the store handle is made (the vtable's ``get_cost``)."""
        return dict(self._cost)

    def register_buffer(self, address: int, length: int, memory_kind: int = 0, device_ordinal: int = 0) -> int:
        if memory_kind != 0 or self._closed:
            return INVALID_PARAMS
        return self._int(self.store.register_buffer(address, length))

    def unregister_buffer(self, address: int) -> int:
        # After close the client is gone (its registrations with it): calling into it
        # would crash the wheel. A store handle that outlives its backend (its staging
        # buffer is unregistered when the handle is freed) lands here.
        if self._closed:
            return 0
        return self._int(self.store.unregister_buffer(address))

    def remove_prefix(self, prefix: str) -> int:
        """Force-removes every key starting with ``prefix`` (test cleanup); returns
        the count or a negative code."""
        import re

        return self._int(self.store.remove_by_regex("^" + re.escape(prefix), True))


class MooncakeMaster:
    """A ``mooncake_master`` on loopback, started and stopped by PID (tests, benches).

    ``with MooncakeMaster() as m: MooncakeStoreBackend.connect(m.address)``.
    """

    def __init__(self, *, lease_ttl: str = "500ms", log_path: Optional[str] = None, extra: Sequence[str] = ()) -> None:
        import mooncake  # type: ignore  # (no stubs)

        self.binary = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
        self.rpc_port = free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{self.rpc_port}"
        self.log_path = log_path or os.path.join(
            os.environ.get("TMPDIR", "/tmp"), f"mooncake_master_{self.rpc_port}.log"
        )
        self.cmd = [
            self.binary,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={lease_ttl}",
            "--enable_metric_reporting=false",
            "--logtostderr",
            *extra,
        ]
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 15.0) -> "MooncakeMaster":
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited {self.proc.returncode}; log: {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.rpc_port), 0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"mooncake_master did not open port {self.rpc_port}")

    def stop(self) -> Optional[int]:
        if self.proc is None:
            return None
        p, self.proc = self.proc, None
        if p.poll() is None:
            p.terminate()
            try:
                return p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        return p.wait()

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
