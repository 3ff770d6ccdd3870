"""A trainer's state dict straight into live transfer (issue 46, item 4):
``live_state_dict`` describes each side from state dicts in trainer terms,
``prepare_live_transfer`` plans, registers and prepares, and every step moves a new
weight generation. A TP2 x PP2 and a TP2 x DP2 trainer push (sink) or are pulled
(reader) into a TP1 and a TP4 server, generation after generation, every server
tensor compared bit for bit with its slice of the global tensor; the multi-process
shape (an exchange per side, the other side shipped as JSON, each side registering
its own memory); notified, content-verified steps; lifetimes; and every refusal
named before anything is bound or registered. numpy everywhere, torch in one test."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import (
    LiveStateDict,
    Parallel,
    StateDictError,
    live_state_dict,
    plan_live_transfer,
    prepare_live_transfer,
)
from mooncake_weight_store.engine_bridge import MemmoveEngine
from sd_model import LAYERS, SHARDING, reference, run_ranks, shard_of

RID = "qwen-mini"
KEY = b"live-state-dict-key-0123"


def stage_of(name: str, pp: int) -> int:
    """The pipeline stage that holds ``name``: layers in order, the embedding first,
    the head (and the step counter) last."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) * pp // LAYERS
    return 0 if name == "model.embed_tokens.weight" else pp - 1


def trainer_ranks(full, tp: int, pp: int = 1, dp: int = 1) -> dict:
    """Every trainer rank's own copies of its shards (its pipeline stage's tensors)."""
    out = {}
    for d in range(dp):
        for p in range(pp):
            for t in range(tp):
                sd = {n: a.copy() for n, a in shard_of(full, t, tp).items() if stage_of(n, pp) == p}
                out[Parallel(tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp, dp_rank=d, dp_size=dp)] = sd
    return out


def server_ranks(full, tp: int) -> dict:
    """Every server rank's preallocated (zeroed) shards."""
    return {Parallel(tp_rank=t, tp_size=tp): {n: np.zeros_like(a) for n, a in shard_of(full, t, tp).items()}
            for t in range(tp)}


def generation(full, g: int) -> dict:
    """Generation ``g``'s global weights: random bits (NaN patterns included)."""
    rng = np.random.default_rng(1000 + g)
    return {n: np.frombuffer(rng.bytes(a.nbytes), dtype=a.dtype).reshape(a.shape).copy() for n, a in full.items()}


def train(ranks: dict, full_g: dict) -> None:
    """The trainer's optimizer step: every rank's tensors updated in place."""
    for par, sd in ranks.items():
        exp = shard_of(full_g, par.tp_rank, par.tp_size)
        for n, a in sd.items():
            a[...] = exp[n]


def mismatches(server: dict, full_g: dict) -> list:
    bad = []
    for par, sd in server.items():
        exp = shard_of(full_g, par.tp_rank, par.tp_size)
        bad += [f"{par.participant_id}/{n}" for n, a in sd.items() if a.tobytes() != exp[n].tobytes()]
    return bad


def sides(full, trainer: dict, server: dict):
    src = live_state_dict(ranks=trainer, side="source", resource_id=RID, sharding=SHARDING)
    dst = live_state_dict(ranks=server, side="target", resource_id=RID, sharding=SHARDING)
    return src, dst


def assert_nothing_held(engine) -> None:
    res = engine.resources()
    assert res.pending_transfers == 0 and res.pinned_tokens == 0
    assert res.registered_regions in (None, 0), res


# -- every generation lands, in every layout pair and mode -------------------------------------------


@pytest.mark.parametrize("mode", ["sink", "reader"])
@pytest.mark.parametrize("server_tp", [1, 4])
@pytest.mark.parametrize("trainer_layout", [(2, 2, 1), (2, 1, 2)], ids=["tp2xpp2", "tp2xdp2"])
def test_every_generation_lands_bit_exact(trainer_layout, server_tp, mode):
    full = reference()
    trainer = trainer_ranks(full, *trainer_layout)
    server = server_ranks(full, server_tp)
    src, dst = sides(full, trainer, server)
    assert len(src.bindings) == len(src.local) == len(trainer) and src.placement.weight_generation == 0
    engine = mws.TransferEngine.local()
    with prepare_live_transfer(src, dst, engine, mode=mode) as live:
        assert len(live.prepared) == (len(trainer) if mode == "sink" else server_tp)
        assert not any(a.any() for sd in server.values() for a in sd.values()), "preparing moves no byte"
        for g in (1, 2, 3):
            full_g = generation(full, g)
            train(trainer, full_g)
            report = live.step(g)
            assert report.weight_generation == g and report.updated
            assert set(report.verdicts()) == set(dst.participant_ids)
            assert set(report.verdicts().values()) == {"updated"}
            assert all(t.weight_generation == g for r in report.reports for t in r.targets)
            assert report.stats.bytes == live.plan.total_bytes
            assert mismatches(server, full_g) == []
    assert_nothing_held(engine)
    src.close()
    dst.close()


def test_one_rank_each_and_lease_rotations():
    """The smallest case, a rank each (no ranks=, no exchange), and rotations: one
    naming no binding is refused before a byte moves, a real one is taken."""
    full = reference()
    trainer = {n: a.copy() for n, a in full.items()}
    server = {n: np.zeros_like(a) for n, a in full.items()}
    src = live_state_dict(trainer, side="source", resource_id=RID)
    dst = live_state_dict(server, side="target", resource_id=RID)
    assert [b.participant_id for b in src.local] == [Parallel().participant_id]
    assert src.binding(Parallel()) is src.bindings[0]
    with pytest.raises(StateDictError, match="has no rank rank-d0-p0-e0-t1"):
        src.binding("rank-d0-p0-e0-t1")
    engine = mws.TransferEngine.local()
    with prepare_live_transfer(src, dst, engine) as live:
        with pytest.raises(mws.ArgumentError, match="names no binding"):
            live.step(1, leases=[mws.LeaseRotation("nowhere", "nobody", "lease-2", 2)])
        assert not server["lm_head.weight"].any(), "nothing moved"
        b = dst.bindings[0]
        report = live.step(2, leases=[mws.LeaseRotation(b.instance_id, b.participant_id, "lease-2", 2)])
        assert report.updated and all(server[n].tobytes() == full[n].tobytes() for n in full)
        with pytest.raises(mws.ArgumentError, match="non-negative"):
            live.step(-1)
    with pytest.raises(mws.ArgumentError, match="closed"):
        live.step(3)
    live.close()  # idempotent
    assert_nothing_held(engine)
    src.close()
    dst.close()


# -- the multi-process shape ---------------------------------------------------------------------


def test_each_rank_through_an_exchange_the_other_side_as_json():
    """As in a job: each trainer rank describes itself collectively (an exchange),
    the server ships its side as JSON and registers its own memory, each trainer rank
    registers its own and prepares its push; the server's acceptors, on the plan it
    binds from the trainer's side as shipped, see every writer of each step done."""
    full = reference()
    trainer = trainer_ranks(full, 2)
    pars = list(trainer)
    srcs = run_ranks(2, lambda r, ex: live_state_dict(trainer[pars[r]], side="source", resource_id=RID,
                                                      sharding=SHARDING, parallel=pars[r], exchange=ex,
                                                      endpoint=f"trainer-{r}:1234"))
    assert all(isinstance(s, LiveStateDict) for s in srcs), srcs
    assert srcs[0].placement.digest == srcs[1].placement.digest
    for r, s in enumerate(srcs):
        assert [b.participant_id for b in s.local] == [pars[r].participant_id]
        assert len(s.bindings) == 2 and s.binding(pars[r]).endpoint == f"trainer-{r}:1234"
        assert s.binding(pars[1 - r]).addresses == srcs[1 - r].binding(pars[1 - r]).addresses
    server = server_ranks(full, 2)
    dst = live_state_dict(ranks=server, side="target", resource_id=RID, sharding=SHARDING)
    backend = NotifyingEngine()  # one in-process engine stands for every process's
    engine = mws.TransferEngine.from_backend(backend)
    dst.register(engine)  # the server's own memory, which the trainers write
    remote = [LiveStateDict.from_json(dst.to_json()) for _ in srcs]
    assert remote[0].placement.digest == dst.placement.digest and remote[0].local == ()
    assert remote[0].bindings[1].addresses == dst.bindings[1].addresses
    lives = []
    for s, d in zip(srcs, remote):
        s.register(engine)
        lives.append(prepare_live_transfer(s, d, engine, pre_registered=True))
    # The server's acceptors, on the plan it binds from the trainer's side as shipped.
    shipped = LiveStateDict.from_json(srcs[0].to_json())
    server_plan = plan_live_transfer(shipped, dst)
    acceptors = [mws.NotifyAcceptor(server_plan, pid, key=KEY) for pid in dst.participant_ids]
    router = mws.NotifyRouter(tuple(acceptors))
    for g in (4, 5):
        full_g = generation(full, g)
        train(trainer, full_g)
        for live in lives:  # one engine runs one call at a time: each rank's step in turn
            report = live.step_notified(g, key=KEY)
            assert report.updated and report.weight_generation == g
        inbox, backend.inbox = backend.inbox, []
        assert inbox and all(router.accept(m)[0] == "accepted" for m in inbox)
        assert all(a.outcome() == mws.NotifyOutcome("updated", g, 0) for a in acceptors), "every writer done"
        assert mismatches(server, full_g) == []
    for obj in [*lives, router, *acceptors, server_plan, shipped, *srcs, *remote, dst]:
        obj.close()  # a side's close unregisters what its register() registered
    assert_nothing_held(engine)


def test_a_rank_that_fails_to_describe_fails_every_rank():
    full = reference()
    trainer = trainer_ranks(full, 2)
    pars = list(trainer)
    trainer[pars[1]]["model.layers.0.mlp.down_proj.weight"] = trainer[pars[1]]["model.layers.0.mlp.down_proj.weight"].T
    out = run_ranks(2, lambda r, ex: live_state_dict(trainer[pars[r]], side="source", resource_id=RID,
                                                     sharding=SHARDING, parallel=pars[r], exchange=ex))
    assert all(isinstance(e, StateDictError) for e in out), out
    assert all("rank(s) 1" in str(e) and "NonContiguousError" in str(e) for e in out), out
    assert isinstance(out[1].__cause__, mws.NonContiguousError)


# -- notified, content-verified steps ---------------------------------------------------------------


class NotifyingEngine(MemmoveEngine):
    """The test engine with a notify channel (one inbox)."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: list = []

    def send_notify(self, endpoint, name, message):
        self.inbox.append(bytes(message))
        return 0


def test_step_notified_verified_at_every_target():
    full = reference()
    trainer = trainer_ranks(full, 2)
    server = server_ranks(full, 2)
    src, dst = sides(full, trainer, server)
    backend = NotifyingEngine()
    engine = mws.TransferEngine.from_backend(backend)
    with prepare_live_transfer(src, dst, engine) as live:
        acceptors = [mws.NotifyAcceptor(live.plan, pid, key=KEY) for pid in dst.participant_ids]
        for a in acceptors:
            a.verify_content()
        with mws.NotifyRouter(tuple(acceptors)) as router:
            for g in (6, 7):
                full_g = generation(full, g)
                train(trainer, full_g)
                assert live.step_notified(g, key=KEY, verify_content=True).updated
                inbox, backend.inbox = backend.inbox, []
                assert inbox and all(router.accept(m)[0] == "accepted" for m in inbox)
                assert all(a.outcome() == mws.NotifyOutcome("updated", g, 0) for a in acceptors)
                assert mismatches(server, full_g) == []
        for a in acceptors:
            a.close()
    with prepare_live_transfer(src, dst, engine, mode="reader") as live:
        with pytest.raises(mws.ArgumentError, match="mode='sink'"):
            live.step_notified(8, key=KEY)
    assert_nothing_held(engine)
    assert engine.callback_errors == []


# -- lifetimes -------------------------------------------------------------------------------------


def test_tensors_stay_held_until_the_last_user_is_closed():
    full = reference()
    server = {n: np.zeros_like(a) for n, a in full.items()}
    src = live_state_dict({n: a.copy() for n, a in full.items()}, side="source", resource_id=RID)
    dst = live_state_dict(server, side="target", resource_id=RID)
    alive = weakref.ref(server["lm_head.weight"])
    engine = mws.TransferEngine.local()
    live = prepare_live_transfer(src, dst, engine)
    del server
    src.close()
    dst.close()  # lent to the prepared transfer: the bindings and tensors stay held
    gc.collect()
    assert alive() is not None
    assert live.step(1).updated
    assert alive().tobytes() == full["lm_head.weight"].tobytes()
    live.close()
    gc.collect()
    assert alive() is None, "closing the last user let the tensors go"
    assert_nothing_held(engine)


# -- refusals --------------------------------------------------------------------------------------


def test_mismatched_sides_are_named_before_anything_is_registered():
    full = reference()
    src = live_state_dict({n: a.copy() for n, a in full.items()}, side="source", resource_id=RID)
    engine = mws.TransferEngine.local()

    def target(sd, **kw):
        return live_state_dict(sd, side="target", resource_id=kw.pop("resource_id", RID), **kw)

    def refused(dst, match):
        with pytest.raises(StateDictError, match=match):
            prepare_live_transfer(src, dst, engine)
        assert_nothing_held(engine)
        dst.close()

    zeros = {n: np.zeros_like(a) for n, a in full.items()}
    refused(target({n: a for n, a in zeros.items() if n != "lm_head.weight"}),
            r"in the source \(trainer\) but not in the target \(server\): lm_head.weight")
    refused(target({**zeros, "extra": np.zeros(3, np.float32)}),
            r"in the target \(server\) but not in the source \(trainer\): extra")
    refused(target({**zeros, "model.layers.0.input_layernorm.weight": np.zeros(16, np.float16)}),
            "'model.layers.0.input_layernorm.weight': source dtype float32, target dtype float16")
    # A TP2 server whose shard does not tile the trainer's tensor: its global shape differs.
    lm = full["lm_head.weight"]
    refused(target({**zeros, "lm_head.weight": np.zeros((48, 16), lm.dtype)}, sharding=SHARDING,
                   parallel=Parallel(tp_rank=0, tp_size=1)),
            r"'lm_head.weight': source global shape \[128, 16\] \(rank-d0-p0-e0-t0 holds \[128, 16\] at \[0, 0\]\), "
            r"target global shape \[48, 16\]")
    refused(target(zeros, resource_id="other"), "resource_id 'qwen-mini' vs 'other'")
    refused(target(zeros, fingerprints={"lm_head.weight": "vocab-v2"}), "'lm_head.weight': source fingerprint")
    dst = target(zeros)
    with pytest.raises(mws.ArgumentError, match="side 'target', not 'source'"):
        prepare_live_transfer(dst, src, engine)
    with pytest.raises(mws.ArgumentError, match="mode must be one of"):
        prepare_live_transfer(src, dst, engine, mode="push")
    with pytest.raises(mws.ArgumentError, match="must be a LiveStateDict"):
        plan_live_transfer(src, zeros)
    # A sink where no source tensor is: refused, nothing registered.
    remote = LiveStateDict.from_json(src.to_json())
    with pytest.raises(StateDictError, match="holds no rank of the source"):
        prepare_live_transfer(remote, dst, engine)
    assert_nothing_held(engine)
    # A failed registration undoes the ones before it.
    dst.register(engine)
    with pytest.raises(StateDictError, match="registering the tensors' host memory .* pre_registered=True") as e:
        prepare_live_transfer(src, dst, engine)  # the target's memory is registered already
    assert e.value.status == mws.Status.STORE and isinstance(e.value.__cause__, mws.StoreError)
    dst.unregister(engine)
    assert_nothing_held(engine)
    for s in (src, dst, remote):
        s.close()


def test_bad_state_dicts_and_layouts_are_refused():
    full = reference()
    a = full["lm_head.weight"]
    with pytest.raises(mws.NonContiguousError):
        live_state_dict({"w": np.zeros((4, 6), np.float32).T}, side="source", resource_id=RID)
    with pytest.raises(mws.NonContiguousError):
        live_state_dict({"w": np.zeros((4, 6), np.float32).T}, side="target", resource_id=RID)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    live_state_dict({"w": ro}, side="source", resource_id=RID).close()  # a source is only read
    with pytest.raises(mws.TensorError, match="read-only"):
        live_state_dict({"w": ro}, side="target", resource_id=RID)
    with pytest.raises(StateDictError, match="empty"):
        live_state_dict({}, side="source", resource_id=RID)
    with pytest.raises(StateDictError, match="is empty"):
        live_state_dict({"w": np.zeros((0, 4))}, side="source", resource_id=RID)
    with pytest.raises(StateDictError, match="must be a mapping"):
        live_state_dict([a], side="source", resource_id=RID)
    with pytest.raises(mws.ArgumentError, match="side must be one of"):
        live_state_dict({"w": a}, side="trainer", resource_id=RID)
    with pytest.raises(StateDictError, match="give 2 ranks, the exchange has 1"):
        live_state_dict({"w": a}, side="source", resource_id=RID, sharding={"w": 0},
                        parallel=Parallel(tp_rank=0, tp_size=2))
    ranks = trainer_ranks(full, 2)
    del ranks[Parallel(tp_rank=1, tp_size=2)]
    with pytest.raises(StateDictError, match="holds 1 of the 2 ranks .* missing: rank-d0-p0-e0-t1"):
        live_state_dict(ranks=ranks, side="source", resource_id=RID, sharding=SHARDING)
    with pytest.raises(mws.ArgumentError, match="pass no state_dict"):
        live_state_dict({"w": a}, ranks=ranks, side="source", resource_id=RID)
    with pytest.raises(StateDictError, match="split dimension 2 out of range"):
        live_state_dict(ranks={Parallel(tp_rank=t, tp_size=2): {"w": a} for t in range(2)}, side="source",
                        resource_id=RID, sharding={"w": 2})
    for text in ("{}", "not json", '{"format": "mws-live-state-dict/1", "side": "source", "ranks": [{}]}'):
        with pytest.raises(StateDictError, match="not a live state dict description"):
            LiveStateDict.from_json(text)


# -- torch -----------------------------------------------------------------------------------------


def raw(t) -> bytes:
    """A torch tensor's bytes (row-major)."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_torch_trainer_into_torch_server(torch):
    """A TP2 trainer's torch tensors (bfloat16 and float32) into a TP1 server's torch
    tensors, updated in place each generation (``copy_``, as an optimizer does)."""
    sharding = {"*.weight": 0}
    g = torch.Generator().manual_seed(0)
    full = {"a.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16), "b.weight": torch.randn(6, 3, generator=g),
            "b.bias": torch.randn(3, generator=g)}
    trainer = {Parallel(tp_rank=t, tp_size=2): {n: (v.chunk(2)[t] if n.endswith("weight") else v).clone()
                                                for n, v in full.items()} for t in range(2)}
    server = {n: torch.zeros_like(v) for n, v in full.items()}
    src = live_state_dict(ranks=trainer, side="source", resource_id=RID, sharding=sharding)
    dst = live_state_dict(server, side="target", resource_id=RID, sharding=sharding)
    engine = mws.TransferEngine.local()
    with prepare_live_transfer(src, dst, engine) as live:
        for gen in (1, 2):
            with torch.no_grad():
                for sd in trainer.values():
                    for n, v in sd.items():
                        v.copy_(v * 2 + gen)
            assert live.step(gen).updated
            for n, v in server.items():
                parts = [sd[n] for sd in trainer.values()]
                want = torch.cat(parts) if n.endswith("weight") else parts[0]
                assert raw(v) == raw(want), n
    assert_nothing_held(engine)
    src.close()
    dst.close()
