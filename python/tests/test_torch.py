"""save_state_dict / load_state_dict with real torch tensors (CPU): every dtype bit for
bit, views with a storage offset, non-contiguous views, resharded restores into torch
targets, an ``nn.Module``'s own state dict, and torch's lazy conjugate/negative views.

Every test takes the ``torch`` fixture (conftest.py): skipped without torch, a failure
with ``MWS_REQUIRE_TORCH=1`` (CI)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import (
    NonContiguousError,
    Parallel,
    Shard,
    Store,
    TensorError,
    load_state_dict,
    save_state_dict,
    tensor_view,
)
from sd_model import run_ranks


@pytest.fixture(params=["memory", "directory"])
def store(request, tmp_path):
    s = Store.memory() if request.param == "memory" else Store.directory(tmp_path / "store")
    yield s
    s.close()


def raw(t) -> bytes:
    """The bytes of a torch tensor's values (row-major), or of a numpy array."""
    if isinstance(t, np.ndarray):
        return t.tobytes()
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_tensor(torch, gen, shape, dtype):
    """Random bits of ``dtype`` (NaN and infinity patterns included; bool is 0/1)."""
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8).bool().reshape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    bits = torch.randint(0, 256, (n * itemsize,), generator=gen, dtype=torch.uint8)
    return bits.view(dtype).reshape(shape)


def all_dtypes(torch):
    names = ["bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
             "complex64", "complex128", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    return {n: getattr(torch, n) for n in names if hasattr(torch, n)}


# -- one rank: every dtype, bit for bit --------------------------------------------------------


def test_every_dtype_round_trips_bit_for_bit(torch, store):
    gen = torch.Generator().manual_seed(1)
    dts = all_dtypes(torch)
    assert {"bfloat16", "float16", "float32", "int64", "bool"} <= set(dts)
    sd = {f"t.{n}": random_tensor(torch, gen, (5, 3), dt) for n, dt in dts.items()}
    base = random_tensor(torch, gen, (6, 4), torch.bfloat16)
    sd["slice"] = base[2:5]  # contiguous, storage offset 16 bytes
    assert sd["slice"].storage_offset() == 8 and sd["slice"].is_contiguous()
    sd["step"] = torch.tensor(123456789012, dtype=torch.int64)  # 0-d
    sd["param"] = torch.nn.Parameter(random_tensor(torch, gen, (4, 4), torch.float32))  # requires grad
    sd["row_of_transposed"] = random_tensor(torch, gen, (3, 1), torch.float16).t()  # (1, 3): extent-1 dim
    m = save_state_dict(store, sd, resource_id="torch", revision="v", weight_generation=1)
    assert sorted(t["tensor_id"] for t in m.wire()["tensors"]) == sorted(sd)
    assert {t["tensor_id"]: t["dtype"] for t in m.wire()["tensors"]}["t.bfloat16"] == "bfloat16"

    # into torch targets: fresh tensors of the stored shapes, filled with a pattern first
    into = {n: torch.empty_like(t.detach()).view(torch.uint8).fill_(0xA5).view(t.dtype)
            if t.dim() else torch.zeros((), dtype=t.dtype) for n, t in sd.items()}
    got = load_state_dict(store, m.key, into=into)
    for n, t in sd.items():
        assert got[n] is into[n]
        assert into[n].shape == t.shape and into[n].dtype == t.dtype, n
        assert raw(into[n]) == raw(t), n
    assert into["step"].item() == 123456789012

    # without into: numpy arrays of the same bytes (bfloat16/float8 through ml_dtypes)
    got = load_state_dict(store, m.key)
    for n, t in sd.items():
        assert tuple(got[n].shape) == tuple(t.shape), n
        assert raw(got[n]) == raw(t), n


def test_targets_carved_from_one_buffer_are_written_exactly(torch, store):
    """Restore targets that are contiguous views at offsets into one flat buffer: their
    bytes come back, the guard bytes between them stay as they were."""
    gen = torch.Generator().manual_seed(2)
    sd = {"a": random_tensor(torch, gen, (4, 6), torch.bfloat16),
          "b": random_tensor(torch, gen, (7,), torch.float32),
          "c": random_tensor(torch, gen, (2, 3, 5), torch.int16)}
    m = save_state_dict(store, sd, resource_id="carve", revision="v", weight_generation=1)
    flat = torch.full((4096,), 0x5A, dtype=torch.uint8)
    into, spans, off = {}, [], 64
    for n, t in sd.items():
        nb = t.numel() * t.element_size()
        into[n] = flat[off:off + nb].view(t.dtype).reshape(t.shape)
        assert into[n].data_ptr() == flat.data_ptr() + off
        spans.append((off, off + nb))
        off += nb + 40  # a guard gap after every target
    load_state_dict(store, m.key, into=into)
    for n, t in sd.items():
        assert raw(into[n]) == raw(t), n
    covered = torch.zeros(flat.numel(), dtype=torch.bool)
    for a, b in spans:
        covered[a:b] = True
    assert bool((flat[~covered] == 0x5A).all()), "bytes outside the targets were written"


# -- non-contiguous views ---------------------------------------------------------------------


def test_non_contiguous_views_are_refused_and_their_copies_round_trip(torch, store):
    gen = torch.Generator().manual_seed(3)
    w = random_tensor(torch, gen, (6, 4), torch.bfloat16)
    views = {"transposed": w.t(), "strided": w[:, ::2], "expanded": w[:1].expand(3, 4),
             "column": w[:, 1:2]}
    for n, v in views.items():
        assert not v.is_contiguous()
        with pytest.raises(NonContiguousError, match=f"tensor '{n}' is not C-contiguous"):
            save_state_dict(store, {"ok": w, n: v}, resource_id="nc", revision=n, weight_generation=1)
        assert not store.exists(f"weights/default/nc/{n}/1/manifest")
    assert store.latest("nc") is None
    sd = {n: v.contiguous() for n, v in views.items()}
    m = save_state_dict(store, sd, resource_id="nc", revision="copies", weight_generation=1)
    got = load_state_dict(store, m.key, into={n: torch.zeros_like(v) for n, v in sd.items()})
    for n, v in views.items():
        assert torch.equal(got[n], v), n
        assert raw(got[n]) == raw(v), n
    # a non-contiguous restore target is refused before any byte is written
    target = torch.zeros(4, 6, dtype=torch.bfloat16)
    with pytest.raises(NonContiguousError, match="'transposed'"):
        load_state_dict(store, m.key, into={"transposed": target.t()})
    assert bool((target == 0).all())


def test_lazily_conjugated_or_negated_views_are_refused(torch, store):
    """x.conj() and torch's negative views share their base's memory, whose bytes are
    not their values: stored as they are, the conjugate/negation would be lost."""
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    neg = torch._neg_view(torch.tensor([1.0, -2.0])) if hasattr(torch, "_neg_view") else None
    with pytest.raises(TensorError, match="conj bit"):
        save_state_dict(store, {"c": c.conj()}, resource_id="cj", revision="v", weight_generation=1)
    if neg is not None:
        assert neg.is_neg()
        with pytest.raises(TensorError, match="neg bit"):
            tensor_view(neg)
    m = save_state_dict(store, {"c": c.conj().resolve_conj()}, resource_id="cj", revision="v", weight_generation=1)
    got = load_state_dict(store, m.key, into={"c": torch.zeros(2, dtype=torch.complex64)})
    assert torch.equal(got["c"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    target = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(TensorError, match="conj bit"):
        load_state_dict(store, m.key, into={"c": target.conj()})
    assert bool((target == 0).all())


def test_cuda_is_available_exactly_when_torch_sees_a_gpu(torch):
    """torch's pip wheels bring libcudart to machines without a GPU; once torch has
    loaded it, a runtime that loads must not count as CUDA (a fresh process: the
    answer is cached per process)."""
    code = ("import torch, mooncake_weight_store as mws\n"
            "print(int(torch.cuda.is_available()), int(mws.cuda_available()))\n"
            "if not mws.cuda_available():\n"
            "    try:\n"
            "        mws.DeviceEngine.cuda(0)\n"
            "    except mws.UnsupportedError as e:\n"
            "        print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [l for l in out.stdout.splitlines() if l]
    seen_by_torch, seen_by_us = lines[0].split()
    assert seen_by_us == seen_by_torch, out.stdout
    if seen_by_torch == "0":
        assert lines[1].startswith("refused: ") and "CUDA" in lines[1], out.stdout


# -- an nn.Module ---------------------------------------------------------------------------------


def test_module_state_dict_restores_into_another_module(torch, store):
    torch.manual_seed(4)

    def model():
        return torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                   torch.nn.Linear(16, 8, bias=False), torch.nn.BatchNorm1d(8))

    src = model().to(torch.bfloat16)
    with torch.no_grad():  # running stats and a step count that differ from a fresh module
        src[4].running_mean.uniform_(-1, 1)
        src[4].running_var.uniform_(0.5, 2)
        src[4].num_batches_tracked.fill_(17)
    sd = src.state_dict()
    assert sd["4.num_batches_tracked"].dim() == 0
    m = save_state_dict(store, sd, resource_id="module", revision="v", weight_generation=1)
    dst = model().to(torch.bfloat16)
    assert not all(torch.equal(a, b) for a, b in zip(dst.state_dict().values(), sd.values()))
    load_state_dict(store, m.key, into=dst.state_dict())  # the module's own parameters and buffers
    for n, t in sd.items():
        assert raw(dst.state_dict()[n]) == raw(t), n
    x = torch.randint(0, 32, (5,))
    src.eval()
    dst.eval()
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))


# -- resharding ------------------------------------------------------------------------------------


def test_tp2_save_restores_into_torch_at_tp4_tp1_and_ep(torch, store):
    gen = torch.Generator().manual_seed(5)
    full = {"qkv": random_tensor(torch, gen, (8, 6), torch.bfloat16),      # colwise (dim 0)
            "o": random_tensor(torch, gen, (6, 8), torch.float16),         # rowwise (dim 1)
            "emb": random_tensor(torch, gen, (16, 4), torch.int32),        # dim 0
            "experts": random_tensor(torch, gen, (4, 2, 8), torch.float32),  # TP over dim 2
            "norm": random_tensor(torch, gen, (6,), torch.float32),        # replicated
            "step": torch.tensor(9, dtype=torch.int64)}                    # replicated, 0-d
    sharding = {"qkv": 0, "o": 1, "emb": 0, "experts": 2}

    def shard(name, t, rank, size):
        d = sharding.get(name)
        return t if d is None else t.chunk(size, dim=d)[rank]

    def rank(r, ex):
        # dim-0 chunks are contiguous views at a storage offset: saved as they are
        sd = {n: shard(n, t, r, 2) for n, t in full.items()}
        assert sd["qkv"].storage_offset() == r * 4 * 6 and sd["qkv"].is_contiguous()
        sd = {n: t if t.is_contiguous() else t.contiguous() for n, t in sd.items()}
        return save_state_dict(store, sd, resource_id="tp", revision="v", weight_generation=2, sharding=sharding,
                               parallel=Parallel(tp_rank=r, tp_size=2), exchange=ex)

    res = run_ranks(2, rank)
    assert all(isinstance(m, mws.StoredManifest) for m in res), res
    key = res[0].key
    for size in (1, 2, 4):
        for r in range(size):
            exp = {n: shard(n, t, r, size).contiguous() for n, t in full.items()}
            into = {n: torch.empty_like(t).view(torch.uint8).fill_(0xEE).view(t.dtype) if t.dim()
                    else torch.zeros((), dtype=t.dtype) for n, t in exp.items()}
            got = load_state_dict(store, key, into=into, sharding=sharding, parallel=Parallel(tp_rank=r, tp_size=size))
            for n, e in exp.items():
                assert got[n] is into[n]
                assert raw(into[n]) == raw(e), (size, r, n)
    # an EP4 serving layout: one expert per rank (leading dim), whole otherwise
    for ep in range(4):
        into = {"experts": torch.zeros(1, 2, 8)}
        load_state_dict(store, key, into=into, sharding={"experts": Shard(ep_dim=0)},
                        parallel=Parallel(ep_rank=ep, ep_size=4))
        assert raw(into["experts"]) == raw(full["experts"][ep:ep + 1]), ep
    with pytest.raises(mws.StateDictError, match="target shape"):
        load_state_dict(store, key, into={"qkv": torch.zeros(4, 6, dtype=torch.bfloat16)}, sharding=sharding,
                        parallel=Parallel(tp_rank=0, tp_size=4))
    with pytest.raises(mws.StateDictError, match="target dtype float32, stored dtype bfloat16"):
        load_state_dict(store, key, into={"qkv": torch.zeros(8, 6)})


# -- a live Mooncake Store --------------------------------------------------------------------------


def test_torch_state_dict_through_a_live_mooncake_store(torch, mc_store):
    gen = torch.Generator().manual_seed(6)
    full = {"w": random_tensor(torch, gen, (64, 32), torch.bfloat16),
            "b": random_tensor(torch, gen, (64,), torch.float16),
            "i": random_tensor(torch, gen, (3, 5), torch.int64)}
    m = save_state_dict(mc_store, full, resource_id="mc-torch", revision="v", weight_generation=1)
    for r in range(2):
        into = {"w": torch.zeros(64, 16, dtype=torch.bfloat16), "b": torch.zeros(32, dtype=torch.float16),
                "i": torch.zeros(3, 5, dtype=torch.int64)}
        load_state_dict(mc_store, m.key, into=into, sharding={"w": 1, "b": 0},
                        parallel=Parallel(tp_rank=r, tp_size=2))
        assert raw(into["w"]) == raw(full["w"][:, r * 16:(r + 1) * 16])
        assert raw(into["b"]) == raw(full["b"][r * 32:(r + 1) * 32])
        assert raw(into["i"]) == raw(full["i"])
