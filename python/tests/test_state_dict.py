"""save_state_dict / load_state_dict: trainer-term sharding, resharding between
layouts, multi-rank saves through exchanges (threads, and four processes), errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import (
    FileExchange,
    Parallel,
    Shard,
    StateDictError,
    Store,
    ThreadExchange,
    load_state_dict,
    save_state_dict,
)
from mooncake_weight_store.state_dict import resolve_shard

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sd_model import SHARDING, reference, run_ranks, shard_of, split_dim  # noqa: E402


def assert_shard_equal(got: dict, full: dict, tp_rank: int, tp_size: int) -> None:
    exp = shard_of(full, tp_rank, tp_size)
    assert sorted(got) == sorted(exp)
    for n in exp:
        e = exp[n]  # 0-d tensors come back with shape ()
        assert got[n].dtype == e.dtype, n
        assert got[n].shape == e.shape, n
        assert got[n].tobytes() == e.tobytes(), n


@pytest.fixture(params=["memory", "directory"])
def store(request, tmp_path):
    s = Store.memory() if request.param == "memory" else Store.directory(tmp_path / "store")
    yield s
    s.close()


# -- sharding terms --------------------------------------------------------------------------


def test_sharding_resolution():
    assert resolve_shard(None, "x") == Shard()
    assert resolve_shard({"a": 0}, "a").dim == 0
    assert resolve_shard({"*.o_proj.weight": "rowwise"}, "model.layers.3.self_attn.o_proj.weight").dim == 1
    assert resolve_shard({"*.q.weight": "colwise"}, "x.k.weight") == Shard()
    assert resolve_shard(lambda n, t: 1 if n.endswith("b") else None, "ab").dim == 1
    assert resolve_shard({"e": Shard(ep_dim=0, dim=2)}, "e").uses_ep
    with pytest.raises(ValueError, match="shorthand"):
        resolve_shard({"a": "diagonal"}, "a")
    with pytest.raises(TypeError):
        resolve_shard({"a": True}, "a")
    with pytest.raises(ValueError, match="ep_dim must be 0"):
        Shard(ep_dim=1)
    with pytest.raises(ValueError, match="per-expert"):
        Shard(ep_dim=0, expert_id=1)
    with pytest.raises(ValueError, match="out of range"):
        Parallel(tp_rank=2, tp_size=2)


# -- one process ---------------------------------------------------------------------------------


def test_save_whole_restore_tp2_tp4_and_whole(store):
    full = reference()
    m = save_state_dict(store, full, resource_id="qwen-mini", revision="step-7", weight_generation=7)
    assert (m.resource_id, m.revision, m.weight_generation) == ("qwen-mini", "step-7", 7)
    for tp_size in (2, 4):
        for r in range(tp_size):
            got = load_state_dict(store, m.key, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=tp_size))
            assert_shard_equal(got, full, r, tp_size)
    got = load_state_dict(store, m.key)
    assert_shard_equal(got, full, 0, 1)
    stats = []
    sub = load_state_dict(store, m.key, names=["lm_head.weight"], stats=stats)
    assert list(sub) == ["lm_head.weight"] and stats[0].bytes == full["lm_head.weight"].nbytes


def test_load_into_preallocated_targets_and_errors(store):
    full = reference()
    m = save_state_dict(store, full, resource_id="qwen-mini", revision="step-7", weight_generation=7)
    par = Parallel(tp_rank=1, tp_size=2)
    exp = shard_of(full, 1, 2)
    into = {n: np.zeros_like(a) for n, a in exp.items()}
    got = load_state_dict(store, m.key, into=into, sharding=SHARDING, parallel=par)
    assert all(got[n] is into[n] for n in into)
    assert all(into[n].tobytes() == exp[n].tobytes() for n in exp)
    with pytest.raises(StateDictError, match="target dtype float64, stored dtype float32"):
        load_state_dict(store, m.key, into={"model.layers.0.input_layernorm.weight": np.zeros(16)})
    with pytest.raises(StateDictError, match="target shape"):
        load_state_dict(store, m.key, into={"lm_head.weight": np.zeros((8, 16), full["lm_head.weight"].dtype)},
                        sharding=SHARDING, parallel=par)
    with pytest.raises(StateDictError, match="not in revision"):
        load_state_dict(store, m.key, names=["nope"])
    with pytest.raises(StateDictError, match="not divisible"):
        load_state_dict(store, m.key, names=["model.layers.0.input_layernorm.weight"], sharding={"*": 0},
                        parallel=Parallel(tp_rank=0, tp_size=3))
    with pytest.raises(mws.NonContiguousError):
        load_state_dict(store, m.key, into={"lm_head.weight": np.zeros((16, 128), full["lm_head.weight"].dtype).T})
    with pytest.raises(mws.NotFoundError):
        load_state_dict(store, "weights/default/qwen-mini/nope/7/manifest")


def test_save_refuses_bad_input(store):
    with pytest.raises(mws.NonContiguousError):
        save_state_dict(store, {"w": np.zeros((4, 4)).T}, resource_id="r", revision="v", weight_generation=1)
    with pytest.raises(StateDictError, match="empty"):
        save_state_dict(store, {"w": np.zeros((0, 4))}, resource_id="r", revision="v", weight_generation=1)
    with pytest.raises(StateDictError, match="non-empty strings"):
        save_state_dict(store, {3: np.zeros(4)}, resource_id="r", revision="v", weight_generation=1)
    with pytest.raises(StateDictError, match="complete placement"):  # TP-split but only one of two ranks
        save_state_dict(store, {"w": np.zeros((4, 4))}, resource_id="r", revision="v", weight_generation=1,
                        sharding={"w": 0}, parallel=Parallel(tp_rank=0, tp_size=2))


def test_tied_weights_are_aliases(store):
    emb = np.arange(64, dtype=np.float32).reshape(16, 4)
    m = save_state_dict(store, {"embed": emb, "lm_head": emb, "norm": np.ones(4, np.float32)},
                        resource_id="tied", revision="v", weight_generation=1)
    got = load_state_dict(store, m.key)
    assert (got["embed"] == emb).all() and (got["lm_head"] == emb).all()
    target = np.zeros((8, 4), np.float32)  # tied targets share memory too
    load_state_dict(store, m.key, into={"embed": target, "lm_head": target}, sharding={"embed": 0, "lm_head": 0},
                    parallel=Parallel(tp_rank=1, tp_size=2))
    assert (target == emb[8:]).all()


# -- several ranks as threads ------------------------------------------------------------------


def test_tp2_ep2_stacked_experts_restore_tp4(store):
    rng = np.random.default_rng(3)
    full = {"w": rng.standard_normal((8, 4)).astype(np.float32), "n": np.arange(4, dtype=np.int64),
            "experts.w1": rng.standard_normal((4, 6, 8)).astype(np.float16)}
    sharding = {"w": 0, "experts.*": Shard(ep_dim=0, dim=2)}

    def rank(r, ex):
        ep, tp = divmod(r, 2)
        sd = {"w": full["w"][tp * 4:(tp + 1) * 4], "n": full["n"],
              "experts.w1": np.ascontiguousarray(full["experts.w1"][ep * 2:(ep + 1) * 2, :, tp * 4:(tp + 1) * 4])}
        return save_state_dict(store, sd, resource_id="moe", revision="v", weight_generation=3, sharding=sharding,
                               parallel=Parallel(tp_rank=tp, tp_size=2, ep_rank=ep, ep_size=2), exchange=ex)

    res = run_ranks(4, rank)
    assert all(isinstance(m, mws.StoredManifest) for m in res), res
    assert len({m.digest for m in res}) == 1
    key = res[0].key
    for tp in range(4):
        got = load_state_dict(store, key, sharding={"w": 0, "experts.w1": 2}, parallel=Parallel(tp_rank=tp, tp_size=4))
        assert (got["w"] == full["w"][tp * 2:(tp + 1) * 2]).all()
        assert (got["experts.w1"] == full["experts.w1"][:, :, tp * 2:(tp + 1) * 2]).all()
        assert (got["n"] == full["n"]).all()
    # an EP4 x TP1 serving layout: one expert per rank
    for ep in range(4):
        got = load_state_dict(store, key, names=["experts.w1"], sharding={"experts.*": Shard(ep_dim=0)},
                              parallel=Parallel(ep_rank=ep, ep_size=4))
        assert (got["experts.w1"] == full["experts.w1"][ep:ep + 1]).all()


def test_pp2_tp2_stage_owned_tensors_and_per_expert_ownership(store):
    """PP stages own their layers; per-expert tensors are owned by their EP rank."""
    rng = np.random.default_rng(5)
    full = {f"layers.{l}.w": rng.standard_normal((4, 6)).astype(np.float32) for l in range(4)}
    full.update({f"layers.{l}.experts.{e}.w": rng.standard_normal((2, 6)).astype(np.float32)
                 for l in range(4) for e in range(2)})

    def shard_for(name):
        if ".experts." in name:
            return Shard(dim=1, expert_id=int(name.split(".")[3]), layer_id=int(name.split(".")[1]))
        return Shard(dim=0, layer_id=int(name.split(".")[1]))

    def rank(r, ex):
        pp, rest = divmod(r, 4)
        ep, tp = divmod(rest, 2)
        sd = {}
        for l in (2 * pp, 2 * pp + 1):
            sd[f"layers.{l}.w"] = np.ascontiguousarray(full[f"layers.{l}.w"][tp * 2:(tp + 1) * 2])
            sd[f"layers.{l}.experts.{ep}.w"] = np.ascontiguousarray(full[f"layers.{l}.experts.{ep}.w"][:, tp * 3:(tp + 1) * 3])
        return save_state_dict(store, sd, resource_id="pp", revision="v", weight_generation=1,
                               sharding=lambda n, t: shard_for(n),
                               parallel=Parallel(tp_rank=tp, tp_size=2, ep_rank=ep, ep_size=2, pp_rank=pp, pp_size=2),
                               exchange=ex)

    res = run_ranks(8, rank)
    assert all(isinstance(m, mws.StoredManifest) for m in res), res
    got = load_state_dict(store, res[0].key)
    assert sorted(got) == sorted(full)
    for n in full:
        assert (got[n] == full[n]).all(), n
    # a PP4 stage (one layer) at TP2, EP1: loads its layer and both experts of that layer
    names = ["layers.3.w", "layers.3.experts.0.w", "layers.3.experts.1.w"]
    for tp in range(2):
        got = load_state_dict(store, res[0].key, names=names, sharding=lambda n, t: shard_for(n),
                              parallel=Parallel(tp_rank=tp, tp_size=2, pp_rank=3, pp_size=4))
        assert (got["layers.3.w"] == full["layers.3.w"][tp * 2:(tp + 1) * 2]).all()
        assert (got["layers.3.experts.1.w"] == full["layers.3.experts.1.w"][:, tp * 3:(tp + 1) * 3]).all()


def test_rank_failure_aborts_every_rank(store):
    full = reference()

    def rank(r, ex):
        sd = shard_of(full, r, 2)
        if r == 1:
            sd["lm_head.weight"] = np.zeros((16, 64), sd["lm_head.weight"].dtype).T  # not contiguous
        return save_state_dict(store, sd, resource_id="qwen-mini", revision="bad", weight_generation=1, sharding=SHARDING,
                               parallel=Parallel(tp_rank=r, tp_size=2), exchange=ex)

    res = run_ranks(2, rank)
    assert all(isinstance(e, StateDictError) for e in res), res
    assert all("rank(s) 1" in str(e) and "not C-contiguous" in str(e) for e in res)
    assert not store.exists("weights/default/qwen-mini/bad/1/manifest")


def test_ranks_that_disagree_on_a_tensor_are_refused(store):
    def rank(r, ex):
        return save_state_dict(store, {"w": np.zeros((2, 4), np.float32 if r == 0 else np.float16)},
                               resource_id="r", revision="v", weight_generation=1, sharding={"w": 0},
                               parallel=Parallel(tp_rank=r, tp_size=2), exchange=ex)

    res = run_ranks(2, rank)
    assert all(isinstance(e, StateDictError) and "described differently" in str(e) for e in res), res


def test_upload_failure_on_one_rank_aborts_the_transaction():
    be = mws.DictBackend()
    store = Store.from_backend(be)
    calls = {"n": 0}
    real = be.batch_put_from

    def flaky(items, rt):
        calls["n"] += 1
        if calls["n"] == 2:
            return [-1] * len(items)
        return real(items, rt)

    be.batch_put_from = flaky
    full = reference()

    def rank(r, ex):
        return save_state_dict(store, shard_of(full, r, 2), resource_id="qwen-mini", revision="flaky", weight_generation=1,
                               sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=2), exchange=ex)

    res = run_ranks(2, rank)
    assert all(isinstance(e, StateDictError) and "aborted" in str(e) for e in res), res
    assert not [k for k in be.keys() if "/payload/" in k]  # the abort removed the payloads
    store.close()


# -- four ranks as four processes ----------------------------------------------------------------


def _spawn(cmd, tmp_path, world, tp, dp=1, key=None, tag="run"):
    procs, outs = [], []
    xdir = tmp_path / f"exchange-{tag}"
    for r in range(world):
        out = tmp_path / f"{tag}-{r}.json"
        args = [sys.executable, str(HERE / "sd_worker.py"), cmd, "--store", str(tmp_path / "store"),
                "--exchange", str(xdir), "--rank", str(r), "--world", str(world), "--tp", str(tp),
                "--dp", str(dp), "--out", str(out)]
        if key:
            args += ["--key", key]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ)))
        outs.append(out)
    logs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    return [json.loads(o.read_text()) for o in outs]


def test_four_processes_save_tp2_dp2_then_load_tp4(tmp_path):
    full = reference()
    res = _spawn("save", tmp_path, world=4, tp=2, dp=2, tag="save")
    assert all("error" not in r for r in res), res
    assert len({r["digest"] for r in res}) == 1
    key = res[0]["key"]
    with Store.directory(tmp_path / "store") as store:
        m = store.load_manifest(key)
        # DP replicas are uploaded once: one stored fragment per TP shard (2 per split tensor)
        assert m.fragment_count == sum(2 if split_dim(n) is not None else 1 for n in full)
        for r in range(4):
            got = load_state_dict(store, key, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=4))
            assert_shard_equal(got, full, r, 4)
    # four processes load TP4 shards with the exchange
    res = _spawn("load", tmp_path, world=4, tp=4, key=key, tag="load")
    assert all("error" not in r for r in res), res
    for r in range(4):
        with np.load(tmp_path / f"load-{r}.json.npz") as z:
            got = {n: z[n] for n in z.files}
        exp = shard_of(full, r, 4)
        for n in exp:
            assert got[n].tobytes() == exp[n].tobytes(), n


def test_four_processes_one_failing_rank(tmp_path):
    res = _spawn("fail", tmp_path, world=4, tp=4, tag="fail")
    assert all("error" in r and "rank(s) 1" in r["error"] for r in res), res
    with Store.directory(tmp_path / "store") as store:
        assert not store.exists("weights/default/qwen-mini/step-7/7/manifest")


def test_file_exchange_times_out(tmp_path):
    ex = FileExchange(tmp_path / "x", 0, 2, timeout=0.2)
    with pytest.raises(mws.ExchangeTimeout):
        ex.all_gather("hello")


def test_collective_load_failure_on_one_rank_reaches_every_rank(store):
    full = reference()
    m = save_state_dict(store, full, resource_id="qwen-mini", revision="step-7", weight_generation=7)

    def rank(r, ex):
        exp = shard_of(full, r, 2)
        into = {n: np.zeros_like(a) for n, a in exp.items()}
        if r == 0:
            into["lm_head.weight"] = np.zeros(into["lm_head.weight"].shape, np.float64)  # wrong dtype
        return load_state_dict(store, m.key, into=into, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=2),
                               exchange=ex)

    res = run_ranks(2, rank)
    assert all(isinstance(e, StateDictError) and "rank(s) 0" in str(e) and "target dtype" in str(e)
               for e in res), res

    def good(r, ex):
        got = load_state_dict(store, m.key, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=2), exchange=ex)
        assert_shard_equal(got, full, r, 2)
        return True

    assert run_ranks(2, good) == [True, True]


def test_torch_distributed_adapter_over_a_stand_in_process_group(store, monkeypatch):
    """TorchDistributedExchange drives torch.distributed's object collectives; here a
    stand-in module with the same signatures (all_gather_object(list, obj, group),
    broadcast_object_list(list, src, group)) backed by threads, so the adapter's
    calls are checked without torch."""
    import types

    local = threading.local()
    groups = ThreadExchange.group(2)

    def all_gather_object(object_list, obj, group=None):
        object_list[:] = local.ex.all_gather(obj)

    def broadcast_object_list(object_list, src=0, group=None, device=None):
        object_list[0] = local.ex.broadcast(object_list[0] if local.ex.rank == src else None, root=src)

    fake = types.ModuleType("torch.distributed")
    fake.is_available = lambda: True
    fake.is_initialized = lambda: True
    fake.get_rank = lambda group=None: local.ex.rank
    fake.get_world_size = lambda group=None: local.ex.world_size
    fake.get_global_rank = lambda group, r: r
    fake.all_gather_object = all_gather_object
    fake.broadcast_object_list = broadcast_object_list
    torch_mod = sys.modules.get("torch") or types.ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", torch_mod)
    monkeypatch.setattr(torch_mod, "distributed", fake, raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    full = reference()
    results = [None, None]

    def body(r):
        local.ex = groups[r]
        try:
            ex = mws.TorchDistributedExchange()
            assert (ex.rank, ex.world_size) == (r, 2)
            results[r] = save_state_dict(store, shard_of(full, r, 2), resource_id="qwen-mini", revision="dist",
                                         weight_generation=1, sharding=SHARDING, parallel=Parallel(tp_rank=r, tp_size=2),
                                         exchange=ex)
        except BaseException as e:  # noqa: BLE001
            results[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(isinstance(m, mws.StoredManifest) for m in results), results
    assert_shard_equal(load_state_dict(store, results[0].key), full, 0, 1)
