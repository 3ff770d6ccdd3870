"""The Python API over the C ABI: handles, errors, context managers, hostile input.
Runs without Mooncake (memory / directory stores and Python vtable backends)."""

from __future__ import annotations

import ctypes
import gc
import json
import pickle
import threading

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import (
    AlreadyExistsError,
    ArgumentError,
    Binding,
    ConflictError,
    Decision,
    DictBackend,
    Guard,
    InvalidArgumentError,
    InvalidBindingError,
    InvalidManifestError,
    LoadPlan,
    MwsError,
    NotFoundError,
    PanicError,
    Placement,
    PlacementBuilder,
    Rank,
    Receipts,
    Replicated,
    Split,
    StaleBindingError,
    Status,
    Store,
    StoredManifest,
    TensorSpec,
    TerminalState,
    UploadPlan,
    plan_upload,
)
from mooncake_weight_store.testing import Model, ModelSpec, box_bytes

SPEC = ModelSpec(hidden=16, layers=1, experts=2)


@pytest.fixture
def src():
    m = Model(SPEC)
    bufs = {p: m.source_buffers(p) for p in m.participant_ids}
    bindings = [m.bind(p, bufs[p]) for p in m.participant_ids]
    yield m, bufs, bindings
    for b in bindings:
        b.close()


@pytest.fixture(params=["memory", "directory", "dict-vtable"])
def store(request, tmp_path):
    if request.param == "memory":
        s = Store.memory()
    elif request.param == "directory":
        s = Store.directory(tmp_path / "store")
    else:
        s = Store.from_backend(DictBackend())
    yield s
    assert s.callback_errors == []
    s.close()


def restore_into(store, manifest_key, target: Model):
    bufs = {p: target.target_buffers(p) for p in target.participant_ids}
    bindings = [target.bind(p, bufs[p]) for p in target.participant_ids]
    stats = store.restore(manifest_key, target.placement, bindings)
    return bufs, stats


# -- library, status, errors --------------------------------------------------------


def test_library_version_and_path():
    assert mws.version().count(".") == 2
    assert mws.library_path().endswith((".so", ".so.0"))


def test_status_names_and_error_classes():
    from mooncake_weight_store._lib import status_name

    for st in Status:
        assert status_name(st) == f"MWS_{st.name}"
    assert status_name(999) == "MWS_UNKNOWN_STATUS"
    e = mws.error_for_status(Status.CONFLICT, "boom")
    assert isinstance(e, ConflictError) and e.status == Status.CONFLICT and e.message == "boom"
    assert isinstance(mws.error_for_status(Status.NOT_FOUND), LookupError)
    assert isinstance(mws.error_for_status(Status.INVALID_ARGUMENT), ValueError)
    assert type(mws.error_for_status(77)) is MwsError
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is ConflictError and e2.message == "boom" and e2.status_name == "MWS_CONFLICT"


def test_panic_is_caught_at_the_boundary():
    from mooncake_weight_store._lib import call

    with pytest.raises(PanicError) as ei:
        call("mws_test_panic")
    assert "mws_test_panic" in ei.value.message


def test_missing_symbol_is_a_clean_error():
    from mooncake_weight_store._lib import LIB

    with pytest.raises(mws.MissingSymbolError):
        LIB.fn("mws_does_not_exist")


# -- placement ---------------------------------------------------------------------


def _builder_from_wire(w):
    """The fixture's placement rebuilt call by call, plus the canonical id the library
    derives for each fragment (from a second builder that names no fragment)."""
    return _add_fragments(w, _bare_builder(w), _bare_builder(w))


def _bare_builder(w):
    t = w["topology"]
    b = PlacementBuilder(w["resource_id"], w["revision"], w["weight_generation"], w["placement_set_id"],
                         tp_size=t["tp_size"], pp_size=t["pp_size"], ep_size=t["ep_size"], dp_size=t["dp_size"])
    for p in t["participants"]:
        b.add_participant(p["participant_id"], Rank(**p["rank"]))
    ax = {"split": lambda a: Split(a["kind"], a["dim"]), "replicated": lambda a: Replicated(a["kind"]),
          "ownership": lambda a: mws.Ownership(a["kind"])}
    for ts in w["tensors"]:
        b.add_tensor(TensorSpec(ts["tensor_id"], tuple(ts["global_shape"]), ts["dtype"], ts["itemsize"],
                                tuple(ax[a["semantics"]](a) for a in ts["parallel_axes"]),
                                ts["layout_fingerprint"], ts["layer_id"], ts["expert_id"]))
    return b


def _add_fragments(w, b, canon):
    derived = {}
    for part in w["parts"]:
        for fr in part["fragments"]:
            b.add_fragment(part["participant_id"], fr["tensor_id"], fr["global_offset"], fr["local_shape"],
                           placement_fragment_id=fr["placement_fragment_id"], aliases=fr["aliases"],
                           pipeline_stage_id=fr.get("pipeline_stage_id"))
            # The canonical id of the same box, as the library derives it.
            derived[fr["placement_fragment_id"]] = canon.add_fragment(
                part["participant_id"], fr["tensor_id"], fr["global_offset"], fr["local_shape"],
                aliases=fr["aliases"], pipeline_stage_id=fr.get("pipeline_stage_id"))
    return b, derived


def test_placement_builder_matches_conformance_fixtures(conformance_dir):
    cases = sorted(conformance_dir.glob("*placement*.json"))
    assert cases
    accepted = 0
    for f in cases:
        case = json.loads(f.read_text())
        exp = case["expected"]
        inp = case["inputs"]
        if "error" in exp:
            raw = inp.get("placement_json") or mws.canonical_json(inp["placement"])
            with pytest.raises(InvalidArgumentError) as ei:
                Placement.from_json(raw)
            assert ei.value.message.startswith("mws_placement_from_json")
            continue
        b, derived = _builder_from_wire(inp["placement"])
        assert derived == exp["canonical_fragment_ids"], f.name
        assert b.to_json() == exp["canonical_json"], f.name
        with b.build() as p:
            assert (p.placement_id, p.digest, p.topology_id) == (exp["placement_id"], exp["digest"], exp["topology_id"])
            assert p.to_json() == exp["canonical_json"]
        accepted += 1
    assert accepted >= 5


@pytest.mark.parametrize("bad", [b"", b"{", b"\xff\xfe", b"[" * 100000, b"null", b'{"resource_kind":"model_weight"}',
                                 b"\x00" * 10, "é".encode("utf-16")])
def test_placement_hostile_json(bad):
    with pytest.raises(InvalidArgumentError):
        Placement.from_json(bad)


def test_placement_accessors_and_lifecycle():
    m = Model(SPEC)
    p = m.placement
    assert p.resource_id == SPEC.resource_id and p.revision == SPEC.revision
    assert p.weight_generation == SPEC.generation and p.participant_count == 8
    assert p.tensor_count == len(SPEC.tensors("tp"))
    frs = p.fragments()
    assert len(frs) == sum(1 for _ in frs) and frs[0].strides[-1] == 2
    assert p.fragment(0) == frs[0]
    with pytest.raises(InvalidArgumentError):
        p.fragment(len(frs))
    with pytest.raises(IndexError):
        p.fragment(-1)
    with pytest.raises(TypeError):
        p.fragment("0")
    q = Placement.from_json(p.to_json())
    assert q.digest == p.digest
    with q:
        pass
    with pytest.raises(ValueError):
        _ = q.digest  # closed
    q.close()  # idempotent
    assert "closed" in repr(q)


def test_placement_builder_rejections():
    b = PlacementBuilder("r", "v", 1, tp_size=2)
    b.add_participant("a", Rank(tp=0))
    b.add_participant("b", Rank(tp=1))
    with pytest.raises(ValueError):
        b.add_participant("a", Rank(tp=1))
    b.add_tensor(TensorSpec("w", (8, 4), "bf16", 2, (Split("tp", 0),)))
    b.shard("w", ["a"])  # tp1 missing: incomplete
    with pytest.raises(InvalidArgumentError) as ei:
        b.build()
    assert "w" in ei.value.message
    with pytest.raises(ValueError):
        PlacementBuilder("r", "v", 1, tp_size=3).add_tensor(
            TensorSpec("w", (8,), "bf16", 2, (Split("tp", 0),))).add_participant("a", Rank()).shard("w")


# -- bindings ----------------------------------------------------------------------


def test_binding_validation_and_hostile_input():
    m = Model(SPEC)
    pid = m.participant_ids[0]
    frs = m.placement.participant_fragments(pid)
    with Binding(m.placement, pid) as b:
        with pytest.raises((InvalidBindingError, InvalidArgumentError)):
            b.validate()  # incomplete
        with pytest.raises(ValueError):
            b.add_address(frs[0].placement_fragment_id, -1)
        with pytest.raises(TypeError):
            b.add_address(frs[0].placement_fragment_id, 1.5)
        with pytest.raises(ValueError):
            b.add(frs[0].placement_fragment_id + "\0x", bytearray(frs[0].nbytes))
        with pytest.raises(BufferError):
            b.add(frs[0].placement_fragment_id, b"\0" * frs[0].nbytes)  # read-only, writable required
        with pytest.raises(TypeError):
            b.add(frs[0].placement_fragment_id, 12345)
        with pytest.raises(InvalidArgumentError):
            b.add_address(frs[0].placement_fragment_id, 0x1000, 16, strides_bytes=[0, 0])
        with pytest.raises(InvalidArgumentError):
            b.add_address(frs[0].placement_fragment_id, 0x1000, memory_kind=7)
        for f in frs:
            b.add(f.placement_fragment_id, bytes(f.nbytes), writable=False)
        assert len(b) == len(frs)
        b.validate()
        with pytest.raises((InvalidBindingError, InvalidArgumentError)):
            b.validate(Model(SPEC, "tp", tp=2, dp=1).placement)
    with pytest.raises(ValueError):
        b.fragment_count  # closed
    # wrong size buffer is caught at validation
    with Binding(m.placement, pid) as b2:
        for f in frs:
            b2.add(f.placement_fragment_id, bytearray(f.nbytes + 2))
        with pytest.raises((InvalidBindingError, InvalidArgumentError)):
            b2.validate()


def test_binding_holds_buffer_exports_until_closed():
    m = Model(SPEC)
    pid = m.participant_ids[0]
    bufs = m.target_buffers(pid)
    b = m.bind(pid, bufs)
    one = next(iter(bufs.values()))
    with pytest.raises(BufferError):
        one.extend(b"x")  # cannot move while bound
    b.close()
    one.extend(b"x")


# -- upload plan -------------------------------------------------------------------


def test_upload_plan_accessors_and_transport(src):
    m, _, bindings = src
    plan = plan_upload(m.placement, bindings, namespace="ns", key_prefix="/p/", transaction_id="ab" * 16,
                       created_at="2026-01-02T03:04:05Z")
    assert plan.manifest_key == f"p/ns/{SPEC.resource_id}/{SPEC.revision}/{SPEC.generation}/manifest"
    assert plan.transaction_id == "ab" * 16 and plan.control_key.endswith("/decision")
    assert plan.group_id + "/manifest" == plan.manifest_key
    assert plan.source_placement_id == m.placement.placement_id
    assert json.loads(plan.commit_record)["plan_digest"] == plan.manifest_digest
    assert plan.manifest()["created_at"] == "2026-01-02T03:04:05Z"
    ops = plan.operations()
    assert len(ops) == len(plan) and all(o.object_key.startswith(plan.group_id + "/payload/") for o in ops)
    assert sum(o.nbytes for o in ops) == SPEC.total_bytes
    again = UploadPlan.from_json(plan.to_json())
    assert again.manifest_json == plan.manifest_json and again.operations() == ops
    for bad in (b"", b"{}", plan.to_json().replace("manifest", "manifezt").encode()):
        with pytest.raises(InvalidArgumentError):
            UploadPlan.from_json(bad)
    with pytest.raises(InvalidArgumentError):
        plan_upload(m.placement, bindings, transaction_id="a/b")
    with pytest.raises(InvalidBindingError):
        plan_upload(m.placement, [])


# -- store, transaction, manifest, load --------------------------------------------


def test_raw_store_access(store):
    store.put("k/1", b"abc", "g")
    if store.kind.startswith("vtable"):
        store.put("k/1", b"xyz")  # Mooncake-style backend: 0 for an existing key, value kept
    else:
        with pytest.raises(AlreadyExistsError):
            store.put("k/1", b"xyz")
    assert store.get("k/1") == b"abc"
    assert store.get("k/1") == b"abc" and store.exists("k/1")
    store.upsert("k/1", b"longer value")
    assert store.get("k/1") == b"longer value"
    store.remove("k/1")
    store.remove("k/1")
    assert not store.exists("k/1")
    with pytest.raises(NotFoundError):
        store.get("k/1")
    with pytest.raises(ValueError):
        store.get("bad\0key")
    assert store.key_prefix == "weights" and store.pending_registration_count == 0


def test_transaction_roundtrip_and_reshard(store, src):
    m, _, bindings = src
    plan = store.plan_upload(m.placement, bindings)
    assert store.read_decision(plan) == Decision.NONE
    with store.transaction(plan) as tx:
        for b in bindings:
            tx.upload(m.placement, b)
        with tx.receipts() as r:
            assert isinstance(r, Receipts) and len(r) == len(plan)
    assert tx.state == "committed" and store.read_decision(plan) == Decision.COMMIT
    manifest = tx.manifest
    assert tx.commit() is manifest  # idempotent
    with pytest.raises(ConflictError):
        tx.abort()
    with pytest.raises(ConflictError):
        store.abort_upload(plan)
    store.finalize_upload(plan)
    loaded = store.load_manifest(plan.manifest_key)
    assert loaded == manifest and loaded.digest == plan.manifest_digest
    assert loaded.total_bytes == SPEC.total_bytes and loaded.fragment_count == len(plan)
    f0 = loaded.fragment(0)
    assert f0.object_key in loaded.object_keys
    for target in (Model(SPEC, "tp", tp=2, dp=1), Model(SPEC, "ep", tp=2, dp=1, ep=2), Model(SPEC, "tp", tp=1, dp=3)):
        bufs, stats = restore_into(store, manifest.key, target)
        assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
        assert stats.bytes == sum(len(x) for d in bufs.values() for x in d.values())


def test_transaction_context_manager_aborts_on_error(store, src):
    m, _, bindings = src
    plan = store.plan_upload(m.placement, bindings)
    with pytest.raises(RuntimeError, match="framework failed"):
        with store.transaction(plan) as tx:
            tx.upload(m.placement, bindings[0])
            raise RuntimeError("framework failed")
    assert tx.state == "aborted" and store.read_decision(plan) == Decision.ABORT
    assert not any(store.exists(k) for k in plan.payload_keys)
    assert not store.exists(plan.manifest_key)
    with pytest.raises(ConflictError):
        store.commit(plan, Receipts.for_plan(plan))
    with pytest.raises(ConflictError):
        tx.upload(m.placement, bindings[0])


def test_commit_without_all_payloads_fails_and_can_be_aborted(store, src):
    m, _, bindings = src
    plan = store.plan_upload(m.placement, bindings)
    store.upload(plan, m.placement, bindings[0])
    with pytest.raises(MwsError) as ei:
        store.commit(plan, Receipts.for_plan(plan))
    assert ei.value.decision_may_exist is False
    with pytest.raises(ConflictError):
        store.finalize_upload(plan)  # no terminal decision
    store.abort_upload(plan)
    store.finalize_upload(plan)
    assert not any(store.exists(k) for k in plan.payload_keys)


def test_conflicting_revisions(store, src):
    m, _, bindings = src
    p1 = store.plan_upload(m.placement, bindings, created_at="2026-01-01T00:00:01Z")
    p2 = store.plan_upload(m.placement, bindings, created_at="2026-01-01T00:00:02Z")
    r1 = Receipts.concat([store.upload(p1, m.placement, b) for b in bindings])
    r2 = Receipts.concat([store.upload(p2, m.placement, b) for b in bindings])
    store.commit(p1, r1)
    with pytest.raises(ConflictError):
        store.commit(p2, r2)
    assert not any(store.exists(k) for k in p2.payload_keys)
    assert all(store.exists(k) for k in p1.payload_keys)
    assert store.load_manifest(p1.manifest_key).digest == p1.manifest_digest
    store.finalize_upload(p2)


def test_writer(store, src):
    m, bufs, bindings = src
    with store.begin_snapshot(m.placement, bindings, namespace="w") as w:
        assert "open" in repr(w)
        ids = w.tensor_ids()
        assert ids == sorted(t.tensor_id for t in SPEC.tensors("tp"))
        for tid in ids[:-1]:
            w.write_tensor(tid).close()
        with pytest.raises(MwsError):
            w.write_tensor("no.such.tensor")  # resolves no fragment: writer stays open
        w.write_tensor(ids[-1]).close()
    assert w.committed and w.manifest.namespace == "w"
    bufs2, _ = restore_into(store, w.manifest.key, Model(SPEC, "tp", tp=2, dp=1))


def test_writer_deferred_uploads(store, src):
    """defer_uploads(): write_tensor returns no receipts and writes nothing; commit
    uploads every participant, then commits."""
    m, bufs, bindings = src
    with store.begin_snapshot(m.placement, bindings, namespace="deferred") as w:
        w.defer_uploads()
        with pytest.raises(ArgumentError):
            w.defer_uploads(1)  # type: ignore[arg-type]
        for tid in w.tensor_ids():
            with w.write_tensor(tid) as r:
                assert len(r) == 0
        assert not any(store.exists(k) for k in w.plan.payload_keys)
    assert w.committed
    restore_into(store, w.manifest.key, Model(SPEC, "tp", tp=2, dp=1))


def test_load_many(store, src):
    """Store.load_many: every binding in one call, the totals of the loads in turn; a
    participant given twice is refused."""
    m, bufs, bindings = src
    with store.begin_snapshot(m.placement, bindings, namespace="many") as w:
        for tid in w.tensor_ids():
            w.write_tensor(tid).close()
    tgt = Model(SPEC, "tp", tp=2, dp=1)
    tbufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
    tb = [tgt.bind(p, tbufs[p]) for p in tgt.participant_ids]
    with store.load_manifest(w.manifest.key) as manifest, LoadPlan.new(manifest, tgt.placement, tb) as lp:
        with pytest.raises(InvalidArgumentError):
            store.load_many(lp, [tb[0], tb[0]])
        st = store.load_many(lp, tb)
        assert st.bytes == sum(len(b) for p in tgt.participant_ids for b in tbufs[p].values())
    for b in tb:
        b.close()


def test_writer_aborts_on_error_and_resolver(store, src):
    m, _, bindings = src
    calls = []

    def resolver(tensor_id, tensor):
        calls.append((tensor_id, tensor))
        if tensor == "explode":
            raise RuntimeError("adapter bug")
        return w.default_fragment_ids(tensor_id)

    with pytest.raises(MwsError) as ei:
        with store.begin_snapshot(m.placement, bindings, resolver=resolver) as w:
            tid = w.tensor_ids()[0]
            w.write_tensor(tid, {"framework": "tensor"})
            w.write_tensor(tid, "explode")
    assert "adapter bug" in str(ei.value)
    assert calls[0] == (tid, {"framework": "tensor"})
    assert w.closed and not w.committed
    assert not store.exists(w.manifest.key if w.manifest else "weights/none")


def test_stored_manifest_fixtures(conformance_dir):
    n = 0
    for f in sorted(conformance_dir.glob("*-manifest-*.json")):
        case = json.loads(f.read_text())
        raw = case["inputs"]["stored_manifest"]
        if not isinstance(raw, str):
            raw = json.dumps(raw, ensure_ascii=False)
        if "error" in case["expected"]:
            with pytest.raises((InvalidManifestError, InvalidArgumentError)):
                StoredManifest.from_json(raw)
        else:
            with StoredManifest.from_json(raw) as m:
                assert m.digest == case["expected"]["manifest_digest"], f.name
                assert m.to_json() == case["expected"]["canonical_json"], f.name
        n += 1
    assert n >= 5


def test_load_refuses_stale_binding_and_wrong_target(store, src):
    m, _, bindings = src
    with store.begin_snapshot(m.placement, bindings) as w:
        w.write_all()
    tgt = Model(SPEC, "tp", tp=2, dp=1)
    bufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
    tbs = [tgt.bind(p, bufs[p]) for p in tgt.participant_ids]
    manifest = store.load_manifest(w.manifest.key)
    lp = LoadPlan.new(manifest, tgt.placement, tbs)
    assert lp.region_count > 0 and sorted(lp.participants()) == tgt.participant_ids
    assert lp.total_bytes == sum(len(x) for d in bufs.values() for x in d.values())
    moved = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
    stale = tgt.bind(tgt.participant_ids[0], moved[tgt.participant_ids[0]])  # same participant, other buffers
    with pytest.raises(StaleBindingError):
        store.load(lp, stale)
    assert all(set(x) == {0xFF} for x in moved[tgt.participant_ids[0]].values())  # untouched
    other = Model(ModelSpec(hidden=16, layers=1, experts=2, revision="other"), "tp", tp=2, dp=1)
    obufs = {p: other.target_buffers(p) for p in other.participant_ids}
    with pytest.raises(InvalidArgumentError):
        LoadPlan.new(manifest, other.placement, [other.bind(p, obufs[p]) for p in other.participant_ids])
    with pytest.raises(NotFoundError):
        store.load_manifest("weights/nothing/manifest")


def test_guard_is_called_around_io(store, src):
    m, _, bindings = src
    events = []

    class G(Guard):
        def acquire(self, transfer_id, participant_id, fragment_ids):
            events.append(("acquire", transfer_id, participant_id, len(fragment_ids)))
            return 42

        def release(self, token, state):
            events.append(("release", token, state))

    plan = store.plan_upload(m.placement, bindings)
    store.upload(plan, m.placement, bindings[0], guard=G(), transfer_id="t-1")
    assert events[0][:3] == ("acquire", "t-1", bindings[0].participant_id)
    assert events[1] == ("release", 42, TerminalState.COMPLETED)

    class Refuse(Guard):
        def acquire(self, *a):
            raise RuntimeError("no pin")

    with pytest.raises(MwsError):
        store.upload(plan, m.placement, bindings[1], guard=Refuse())


# -- hostile Python backends -------------------------------------------------------


class Raising(DictBackend):
    def batch_put_from(self, items, record_type):
        raise RuntimeError("backend exploded")


class BadTypes(DictBackend):
    def exists(self, key):
        return "yes"

    def batch_put_from(self, items, record_type):
        return [0]  # wrong length


class Lies(DictBackend):
    def get_into_ranges(self, items):
        return [it.len + 1 for it in items]  # claims more bytes than asked


def test_backend_exceptions_never_reach_c(src):
    m, _, bindings = src
    for backend, needle in ((Raising(), "backend exploded"), (BadTypes(), "results")):
        with Store.from_backend(backend) as s:
            plan = s.plan_upload(m.placement, bindings)
            with pytest.raises(MwsError) as ei:
                s.upload(plan, m.placement, bindings[0])
            assert ei.value.status in (Status.STORE, Status.IO)
            assert any(needle in e or "exists" in e for e in s.callback_errors), s.callback_errors


def test_lying_backend_is_detected(src):
    m, _, bindings = src
    with Store.from_backend(Lies()) as s:
        with s.begin_snapshot(m.placement, bindings) as w:
            w.write_all()
        tgt = Model(SPEC, "tp", tp=2, dp=1)
        with pytest.raises(MwsError):
            restore_into(s, w.manifest.key, tgt)


def test_backend_missing_methods_rejected():
    class Half:
        def put(self, *a):
            return 0

    with pytest.raises(TypeError, match="lacks"):
        Store.from_backend(Half())


def test_backend_with_only_get_is_adapted(src):
    class OnlyGet(DictBackend):
        get_size = None
        get_into = None

    m, _, bindings = src
    with Store.from_backend(OnlyGet()) as s:
        s.put("x", b"12345")
        assert s.get("x") == b"12345"
        with pytest.raises(NotFoundError):
            s.get("nope")


def test_vtable_destroy_closes_backend_and_bridge_is_released():
    closed = threading.Event()

    class B(DictBackend):
        def close(self):
            closed.set()

    s = Store.from_backend(B(), close_backend=True)
    s.put("a", b"1")
    del s
    gc.collect()
    assert closed.is_set()


def test_concurrent_loads_through_python_backend(src):
    m, _, bindings = src
    with Store.from_backend(DictBackend()) as s:
        with s.begin_snapshot(m.placement, bindings) as w:
            w.write_all()
        tgt = Model(SPEC, "ep", tp=2, dp=1, ep=2)
        bufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
        tbs = [tgt.bind(p, bufs[p]) for p in tgt.participant_ids]
        with s.load_manifest(w.manifest.key) as man, LoadPlan.new(man, tgt.placement, tbs) as lp:
            errs = []

            def run(b):
                try:
                    s.load(lp, b)
                except Exception as e:  # pragma: no cover
                    errs.append(e)

            ts = [threading.Thread(target=run, args=(b,)) for b in tbs]
            [t.start() for t in ts]
            [t.join() for t in ts]
        assert errs == []
        assert [f for p in tgt.participant_ids for f in tgt.verify(p, bufs[p])] == []


def test_box_bytes_reference():
    import itertools

    g = bytes(range(2 * 3 * 4 * 2))
    gs = (2, 3, 4)

    def ref(off, sh):
        out = bytearray()
        for i in itertools.product(*[range(o, o + s) for o, s in zip(off, sh)]):
            lin = (i[0] * 3 + i[1]) * 4 + i[2]
            out += g[lin * 2:(lin + 1) * 2]
        return out

    for off, sh in [((0, 0, 0), (2, 3, 4)), ((1, 0, 0), (1, 3, 4)), ((0, 1, 0), (2, 2, 4)), ((0, 0, 2), (2, 3, 2)),
                    ((1, 2, 1), (1, 1, 3))]:
        assert box_bytes(g, gs, 2, off, sh) == ref(off, sh)


# -- registration leases and batched existence ------------------------------------


class Counting(DictBackend):
    """Counts registrations and existence checks; has batch_exists."""

    def __init__(self):
        super().__init__()
        self.reg = self.unreg = self.single = self.batch = 0

    def register_buffer(self, address, length, memory_kind=0, device_ordinal=0):
        self.reg += 1
        return super().register_buffer(address, length, memory_kind, device_ordinal)

    def unregister_buffer(self, address):
        self.unreg += 1
        return super().unregister_buffer(address)

    def exists(self, key):
        self.single += 1
        return super().exists(key)

    def batch_exists(self, keys):
        self.batch += 1
        return [DictBackend.exists(self, k) for k in keys]


def test_registration_leases_register_once(src):
    m, _, bindings = src
    be = Counting()
    store = Store.from_backend(be)
    plan = store.plan_upload(m.placement, bindings)
    leases = {b.participant_id: store.register_buffers(b, plan.source_fragment_ids(b.participant_id))
              for b in bindings if plan.source_fragment_ids(b.participant_id)}
    regs = be.reg
    assert regs > 0 and be.unreg == 0
    with store.transaction(plan) as tx:
        for b in bindings:
            if b.participant_id in leases:
                tx.upload(m.placement, b, lease=leases[b.participant_id])
    assert be.reg == regs and be.unreg == 0  # nothing registered per call
    assert be.batch > 0  # payload existence checked in batches
    for lease in leases.values():
        lease.close()
        assert lease.closed
        lease.close(TerminalState.ABORTED)  # no-op
    assert be.unreg == regs
    # a closed lease is refused before any I/O
    b0 = next(b for b in bindings if b.participant_id in leases)
    with pytest.raises(StaleBindingError, match="lease is closed"):
        store.upload(plan, m.placement, b0, lease=leases[b0.participant_id])
    # restore with one target lease per participant (context managers)
    target = Model(SPEC, "tp", tp=2, dp=1)
    bufs = {p: target.target_buffers(p) for p in target.participant_ids}
    tb = [target.bind(p, bufs[p]) for p in target.participant_ids]
    with store.load_manifest(tx.manifest.key) as manifest, LoadPlan.new(manifest, target.placement, tb) as lp:
        staging_regs = 0
        for b in tb:
            with store.register_buffers(b, side="target") as lease:
                regs, unregs = be.reg, be.unreg
                assert store.load(lp, b, lease=lease).bytes > 0
                store.load(lp, b, lease=lease)
                # Nothing per call: only the store's staging buffer, registered once
                # for every restore of this store.
                staging_regs += be.reg - regs
                assert be.unreg == unregs
            assert lease.closed and be.unreg > unregs
        assert staging_regs == 1
        # a lease of another store is refused; freeing an open lease closes it
        other = Store.memory()
        lease = store.register_buffers(tb[0], side="target")
        with pytest.raises(InvalidArgumentError, match="another store"):
            other.load(lp, tb[0], lease=lease)
    assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
    unregs = be.unreg
    lease.free()
    assert be.unreg > unregs
    assert store.pending_registration_count == 0 and store.callback_errors == []
    other.close()
    store.close()


def test_lease_with_guard_pins_once(store, src):
    m, _, bindings = src
    events = []

    class G(Guard):
        def acquire(self, transfer_id, participant_id, fragment_ids):
            events.append("acquire")
            return 7

        def release(self, token, state):
            events.append(("release", token, state))

    plan = store.plan_upload(m.placement, bindings)
    b = next(b for b in bindings if plan.source_fragment_ids(b.participant_id))
    with store.register_buffers(b, plan.source_fragment_ids(b.participant_id), guard=G()) as lease:
        store.upload(plan, m.placement, b, lease=lease)
        store.upload(plan, m.placement, b, lease=lease)
    assert events == ["acquire", ("release", 7, TerminalState.COMPLETED)]
    with pytest.raises(MwsError):
        store.register_buffers(b, ["no-such-fragment"])
    with pytest.raises(KeyError):
        store.register_buffers(b, side="sideways")


# -- staging (staging_bytes, on by default, chosen by the store's cost model) -------------


def test_staging_bytes_option_same_bytes_fewer_ranges(tmp_path, src):
    m, _, bindings = src
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(ValueError, match="staging_bytes"):
            Store.memory(staging_bytes=bad)
    for s in (Store.memory(staging_bytes=1 << 20), Store.directory(tmp_path / "d", staging_bytes=1 << 20)):
        with s:
            plan = s.plan_upload(m.placement, bindings)
            with s.transaction(plan) as tx:
                for b in bindings:
                    tx.upload(m.placement, b)
            target = Model(SPEC, "ep", tp=2, dp=1, ep=2)
            bufs, _ = restore_into(s, tx.manifest.key, target)
            assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
    # A range-priced (vtable) backend, by default: the same bytes through far fewer
    # ranges than with staging off.
    be = DictBackend()
    plain = Store.from_backend(be, staging_bytes=0)
    staged = Store.from_backend(be)
    plan = plain.plan_upload(m.placement, bindings)
    with plain.transaction(plan) as tx:
        for b in bindings:
            tx.upload(m.placement, b)
    results = []
    for s in (plain, staged):
        target = Model(SPEC, "tp", tp=2, dp=1)
        bufs, stats = restore_into(s, tx.manifest.key, target)
        assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
        results.append((stats, bufs))
    (off, bufs_off), (on, bufs_on) = results
    assert bufs_on == bufs_off and on.bytes == off.bytes
    assert on.ranges < off.ranges, (on.ranges, off.ranges)
    assert on.staged_regions > 0 and on.staged_regions + on.direct_regions == on.regions
    assert off.staged_regions == 0 and off.direct_regions == off.regions
    assert plain.callback_errors == [] and staged.callback_errors == []
    staged.close()
    plain.close()


def test_backend_cost_model_decides_staging(src):
    """A backend's ``cost()`` reaches the restore planner (the vtable's ``get_cost``):
    a store whose ranges cost nothing is read row by row; a bad answer fails the open."""
    m, _, bindings = src

    class FreeRanges(DictBackend):
        def cost(self):
            return {"per_request_ns": 0, "per_range_ns": 0, "bytes_per_second": 10_000_000_000}

    class Broken(DictBackend):
        def cost(self):
            raise RuntimeError("no cost model today")

    be = FreeRanges()
    with Store.from_backend(be) as s:
        plan = s.plan_upload(m.placement, bindings)
        with s.transaction(plan) as tx:
            for b in bindings:
                tx.upload(m.placement, b)
        target = Model(SPEC, "tp", tp=2, dp=1)
        bufs, stats = restore_into(s, tx.manifest.key, target)
        assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
        assert stats.staged_regions == 0 and stats.direct_regions == stats.regions > 0
    with pytest.raises(mws.errors.StoreError, match="get_cost"):
        Store.from_backend(Broken())


class BatchSized(DictBackend):
    """Answers ``batch_get_size`` (``drop``: that many results too few) and counts
    every size query."""

    def __init__(self, drop=0):
        super().__init__()
        self.drop = drop
        self.batches = []
        self.single = []

    def get_size(self, key):
        self.single.append(key)
        return DictBackend.get_size(self, key)

    def batch_get_size(self, keys):
        self.batches.append(list(keys))
        sizes = [DictBackend.get_size(self, k) for k in keys]
        return sizes[: len(sizes) - self.drop]


def test_restore_asks_sizes_through_batch_get_size(src):
    """A backend with ``batch_get_size`` (the vtable's ``batch_get_size``) answers a
    restore's size checks: one call per restore (``Store.restore`` is one
    ``load_many`` call, which checks the sizes once for every participant), no ``get_size`` for those
    keys; a wrong result count fails the restore with a clear error."""
    m, _, bindings = src
    be = BatchSized()
    with Store.from_backend(be) as s:
        with s.begin_snapshot(m.placement, bindings) as w:
            w.write_all()
        target = Model(SPEC, "tp", tp=2, dp=1)
        bufs, stats = restore_into(s, w.manifest.key, target)
        assert [f for p in target.participant_ids for f in target.verify(p, bufs[p])] == []
        assert stats.bytes > 0
        assert len(be.batches) == 1, be.batches
        asked = {k for b in be.batches for k in b}
        assert asked and asked <= set(be.objects)
        assert not asked & set(be.single), be.single
        assert s.callback_errors == []
    be = BatchSized(drop=1)
    with Store.from_backend(be) as s:
        with s.begin_snapshot(m.placement, bindings) as w:
            w.write_all()
        target = Model(SPEC, "tp", tp=2, dp=1)
        with pytest.raises(mws.errors.StoreError, match="batch_get_size"):
            restore_into(s, w.manifest.key, target)
        assert any("batch_get_size returned" in e and "results for" in e for e in s.callback_errors), \
            s.callback_errors
