"""``TransferEngine.from_backend``: a pure-Python engine (``engine_bridge.MemmoveEngine``,
memmove between registered regions of this process) behind the generic C engine
vtable drives live transfers end to end, with the legacy synchronous batches and with
ticketed completion; a raising backend fails the call with a precise ``MwsError``
(the backend's exception named and chained), never a crash. No Mooncake needed."""

from __future__ import annotations

import ctypes
import gc

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store.engine_bridge import (CALLBACK_FAILED, Direction, MemmoveEngine, TicketedMemmoveEngine,
                                                 TicketStatus)
from mooncake_weight_store.testing import Model, ModelSpec

ENGINES = {"sync": MemmoveEngine, "tickets": TicketedMemmoveEngine}


class Live:
    """A TP4 x DP2 source and a TP2 x EP2 target in this process, plan bound."""

    def __init__(self) -> None:
        spec = ModelSpec(layers=2)
        self.src = Model(spec, "tp", tp=4, dp=2, placement_set_id="trainer")
        self.dst = Model(spec, "ep", tp=2, dp=1, ep=2, placement_set_id="serving")
        self.sbufs = {p: self.src.source_buffers(p) for p in self.src.participant_ids}
        self.dbufs = {p: self.dst.target_buffers(p) for p in self.dst.participant_ids}
        self.sb = [self.src.bind(p, self.sbufs[p]) for p in self.src.participant_ids]
        self.tb = [self.dst.bind(p, self.dbufs[p]) for p in self.dst.participant_ids]
        self.plan = mws.TransferPlan.plan(self.src.placement, self.dst.placement).bind(self.tb, self.sb)

    def bad_bytes(self):
        return [f for p in self.dst.participant_ids for f in self.dst.verify(p, self.dbufs[p])]

    def clear_targets(self):
        for bufs in self.dbufs.values():
            for buf in bufs.values():
                buf[:] = b"\0" * len(buf)

    def pull(self, engine, binding=None):
        with mws.Loader(engine) as loader:
            return [loader.load_live(self.plan, self.src.placement, self.sb, self.dst.placement, b)
                    for b in ([binding] if binding is not None else self.tb)]

    def push(self, engine):
        with mws.Sink(engine) as sink:
            return [sink.execute(self.plan, self.src.placement, b, self.dst.placement, self.tb) for b in self.sb]


@pytest.mark.parametrize("kind", list(ENGINES))
def test_reader_and_sink_move_every_byte_through_a_python_engine(kind):
    live = Live()
    backend = ENGINES[kind]()
    engine = mws.TransferEngine.from_backend(backend)
    assert engine.backend is backend and engine.callback_errors == []
    for b in live.sb:
        engine.register_binding(b)  # the sources' owner registers them (the reader pulls)
    pulled = live.pull(engine)
    assert live.bad_bytes() == []
    assert sum(s.bytes for s in pulled) == live.plan.total_bytes
    assert {d for d, _, _ in backend.batches} == {Direction.READ}
    for b in live.sb:
        engine.unregister_binding(b)

    live.clear_targets()
    assert live.bad_bytes() != []
    for b in live.tb:
        engine.register_binding(b)  # the targets' owner registers them (the sink pushes)
    pushed = live.push(engine)
    assert live.bad_bytes() == []
    assert sum(s.bytes for s in pushed) == live.plan.total_bytes
    assert Direction.WRITE in {d for d, _, _ in backend.batches}
    for b in live.tb:
        engine.unregister_binding(b)

    assert engine.callback_errors == [] and engine.pending_count == 0
    assert backend.regions == {}  # every registration (the executors' own too) was undone
    if kind == "tickets":
        assert backend.calls["submit"] == len(backend.batches) > 0
        assert backend.tickets == {} and len(backend.released) == backend.calls["submit"]
    else:
        assert "submit" not in backend.calls


class Raising(MemmoveEngine):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def transfer_sync(self, *args):
        if self.op == "transfer_sync":
            raise RuntimeError("boom")
        return super().transfer_sync(*args)


class RaisingTickets(TicketedMemmoveEngine):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def submit(self, *args):
        if self.op == "submit":
            raise RuntimeError("boom")
        return super().submit(*args)

    def ticket_status(self, ticket):
        if self.op == "ticket_status":
            raise RuntimeError("boom")
        return super().ticket_status(ticket)


@pytest.mark.parametrize("backend", [Raising("transfer_sync"), RaisingTickets("submit"),
                                     RaisingTickets("ticket_status")], ids=lambda b: b.op)
def test_a_raising_backend_is_a_precise_error_never_a_crash(backend):
    live = Live()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)
    with pytest.raises(mws.StoreError) as ei:
        live.pull(engine, live.tb[0])
    err = ei.value
    assert err.status == mws.Status.STORE and "mws_loader_load_live" in err.message
    assert "engine backend: RuntimeError: boom" in str(err)
    assert isinstance(err.__cause__, RuntimeError) and str(err.__cause__) == "boom"
    assert engine.callback_errors == [f"{backend.op}: RuntimeError: boom"]
    # Completion unknown: the engine is restart-required, never silently reused.
    assert engine.pending_count == 1
    calls = dict(backend.calls)
    with pytest.raises(mws.StoreError, match="restart"):
        live.pull(engine, live.tb[1])
    assert {k: v for k, v in backend.calls.items() if k not in ("register_memory", "unregister_memory")} == \
        {k: v for k, v in calls.items() if k not in ("register_memory", "unregister_memory")}, \
        "refused before any transfer"
    # A later failure with no backend exception is reported without a stale cause.
    with pytest.raises(mws.StoreError) as again:
        live.pull(engine, live.tb[1])
    assert again.value.__cause__ is None and "engine backend" not in str(again.value)


def test_a_failed_drained_ticket_fails_the_call_and_leaves_the_engine_usable():
    live = Live()
    backend = TicketedMemmoveEngine()
    engine = mws.TransferEngine.from_backend(backend)
    with pytest.raises(mws.StoreError, match="FAILED_DRAINED") as ei:
        live.pull(engine, live.tb[0])  # sources not registered: the batch fails, nothing moves
    assert ei.value.__cause__ is None and engine.callback_errors == []
    assert engine.pending_count == 0 and backend.tickets == {}
    for b in live.sb:
        engine.register_binding(b)
    live.pull(engine)
    assert live.bad_bytes() == []


def test_an_unknown_ticket_is_drained_by_ticket_wait():
    class Late(TicketedMemmoveEngine):
        def ticket_status(self, ticket):
            self._count("ticket_status")
            return int(TicketStatus.UNKNOWN)  # still running when first asked

    live = Live()
    backend = Late()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)
    live.pull(engine)
    assert live.bad_bytes() == []
    assert backend.calls["ticket_wait"] >= 1 and backend.tickets == {}
    assert engine.pending_count == 0


def test_registration_codes_identity_and_contract():
    buf = (ctypes.c_char * 4096)()
    a = ctypes.addressof(buf)
    engine = mws.TransferEngine.from_backend(MemmoveEngine())
    engine.register_memory(a, 4096)
    with pytest.raises(mws.StoreError, match="-7") as ei:
        engine.register_memory(a, 4096)  # the engine's own code reaches the caller
    assert ei.value.__cause__ is None
    engine.unregister_memory(a)
    with pytest.raises(mws.StoreError, match="-3"):
        engine.unregister_memory(a)

    class RegisterRaises(MemmoveEngine):
        def register_memory(self, address, length, device):
            raise OSError("cannot pin")

    engine = mws.TransferEngine.from_backend(RegisterRaises())
    with pytest.raises(mws.StoreError, match=str(CALLBACK_FAILED)) as ei:
        engine.register_memory(a, 4096)
    assert isinstance(ei.value.__cause__, OSError) and "OSError: cannot pin" in str(ei.value)

    class NotAnInt(MemmoveEngine):
        def unregister_memory(self, address):
            return "0"

    engine = mws.TransferEngine.from_backend(NotAnInt())
    engine.register_memory(a, 4096)
    with pytest.raises(mws.StoreError) as ei:
        engine.unregister_memory(a)
    assert isinstance(ei.value.__cause__, TypeError)
    assert engine.callback_errors == ["unregister_memory: ArgumentError: unregister_memory returned str, expected int"]

    class NoIdentity(MemmoveEngine):
        def engine_id(self):
            raise KeyError("no identity")

    engine = mws.TransferEngine.from_backend(NoIdentity())
    with pytest.raises(mws.StoreError, match="identity") as ei:
        mws.Loader(engine)
    assert isinstance(ei.value.__cause__, KeyError)

    class Half:
        def engine_id(self):
            return 1

    with pytest.raises(TypeError, match="register_memory, unregister_memory, transfer_sync"):
        mws.TransferEngine.from_backend(Half())

    class SubmitOnly(MemmoveEngine):
        def submit(self, *args):
            return 1

    with pytest.raises(TypeError, match="ticket_status, ticket_wait"):
        mws.TransferEngine.from_backend(SubmitOnly())


def test_loaders_keep_the_python_engine_alive():
    live = Live()
    backend = MemmoveEngine()
    engine = mws.TransferEngine.from_backend(backend)
    for b in live.sb:
        engine.register_binding(b)
    loader = mws.Loader(engine)
    engine.close()  # the handle only; the loader holds the engine (and its callbacks)
    del engine
    gc.collect()
    for b in live.tb:
        loader.load_live(live.plan, live.src.placement, live.sb, live.dst.placement, b)
    assert live.bad_bytes() == []
    loader.close()
