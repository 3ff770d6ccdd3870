"""The engine-vtable bridge of te_backend against an in-process stand-in with the
wheel's method names (no Mooncake needed): batches split to the per-peer limit,
TE return codes passed through, callback exceptions contained (never into C)."""

from __future__ import annotations

import ctypes
import itertools

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.te_backend import CALLBACK_FAILED, MooncakeTransferEngine
from mooncake_weight_store.testing import Model, ModelSpec


# Unique per stand-in, never reused (a restart-required entry stays keyed by its identity).
_IDS = itertools.count(1 << 40)


class StandInTE:
    """Same calls as mooncake.engine.TransferEngine; one process, memmove."""

    def __init__(self, fail_on_call=None, raise_on_call=None):
        self.ptr = next(_IDS)
        self.regs = {}
        self.batches = []
        self.fail_on_call, self.raise_on_call = fail_on_call, raise_on_call

    def get_engine_ptr(self):
        return self.ptr

    def register_memory(self, addr, n, location="*"):
        if any(a < addr + n and addr < a + m for a, m in self.regs.items()):
            return -7
        self.regs[addr] = n
        return 0

    def unregister_memory(self, addr):
        return 0 if self.regs.pop(addr, None) is not None else -3

    def _batch(self, write, seg, local, remote, sizes):
        self.batches.append((write, seg, len(local)))
        k = len(self.batches)
        if k == self.raise_on_call:
            raise RuntimeError("boom")
        if k == self.fail_on_call:
            return -1
        for l, r, n in zip(local, remote, sizes):
            if not any(a <= r and r + n <= a + m for a, m in self.regs.items()):
                return -1
            ctypes.memmove(r, l, n) if write else ctypes.memmove(l, r, n)
        return 0

    def batch_transfer_sync_write(self, seg, local, remote, sizes):
        return self._batch(True, seg, local, remote, sizes)

    def batch_transfer_sync_read(self, seg, local, remote, sizes):
        return self._batch(False, seg, local, remote, sizes)


def _setup():
    spec = ModelSpec(layers=2)
    src = Model(spec, "tp", tp=4, dp=2, placement_set_id="trainer")
    dst = Model(spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
    sbufs = {p: src.source_buffers(p) for p in src.participant_ids}
    dbufs = {p: dst.target_buffers(p) for p in dst.participant_ids}
    sb = [src.bind(p, sbufs[p]) for p in src.participant_ids]
    tb = [dst.bind(p, dbufs[p]) for p in dst.participant_ids]
    plan = mws.TransferPlan.plan(src.placement, dst.placement).bind(tb, sb)
    return src, dst, sb, tb, dbufs, plan


@pytest.mark.parametrize("max_batch", [1024, 7])
def test_bridge_reader_every_byte_and_split(max_batch):
    src, dst, sb, tb, dbufs, plan = _setup()
    te = StandInTE()
    eng = MooncakeTransferEngine(te, max_batch_operations=max_batch)
    for b in sb:
        eng.register_binding(b)
    with mws.Loader(eng) as loader:
        ops = sum(loader.load_live(plan, src.placement, sb, dst.placement, b).operations for b in tb)
    assert [f for p in dst.participant_ids for f in dst.verify(p, dbufs[p])] == []
    assert all(n <= max_batch for _, _, n in te.batches)
    assert sum(n for _, _, n in te.batches) == ops
    if max_batch == 7:
        assert len(te.batches) > len(tb)
    assert eng.callback_errors == [] and eng.pending_count == 0
    for b in sb:
        eng.unregister_binding(b)
    assert te.regs == {}


@pytest.mark.parametrize("how", ["rc", "raise"])
def test_bridge_failure_is_reported_never_raised_into_c(how):
    src, dst, sb, tb, dbufs, plan = _setup()
    te = StandInTE(**({"fail_on_call": 1} if how == "rc" else {"raise_on_call": 1}))
    eng = MooncakeTransferEngine(te)
    for b in sb:
        eng.register_binding(b)
    with mws.Loader(eng) as loader:
        with pytest.raises(mws.MwsError) as ei:
            loader.load_live(plan, src.placement, sb, dst.placement, tb[0])
    msg = str(ei.value)
    assert "restart" in msg
    if how == "raise":
        assert str(CALLBACK_FAILED) in msg or eng.callback_errors
        assert any("boom" in e for e in eng.callback_errors)
    else:
        assert eng.callback_errors == []
    assert eng.pending_count == 1  # completion unknown: restart-required, never reused silently


def test_bridge_register_codes_and_bad_arguments():
    te = StandInTE()
    eng = MooncakeTransferEngine(te)
    buf = (ctypes.c_char * 4096)()
    a = ctypes.addressof(buf)
    eng.register_memory(a, 4096)
    with pytest.raises(mws.MwsError):
        eng.register_memory(a, 4096)  # TE -7 (overlap) reaches the caller as an error
    eng.unregister_memory(a)
    with pytest.raises(mws.MwsError):
        eng.unregister_memory(a)  # TE -3
    with pytest.raises(ValueError):
        MooncakeTransferEngine(te, max_batch_operations=0)
