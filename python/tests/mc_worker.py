"""Second-process client for the live Mooncake tests (a pure client: it contributes
no memory, so every byte it writes or reads crosses TCP to the holder process).

    python mc_worker.py restore  --master M --prefix P --manifest-key K --out F
    python mc_worker.py race     --master M --prefix P --barrier DIR --name N --out F
    python mc_worker.py crash    --master M --prefix P --plan-out F --marker F --hang-after-calls N
    python mc_worker.py recover  --master M --prefix P --plan F --out F
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

from mooncake_weight_store import (  # noqa: E402
    Decision,
    MwsError,
    Store,
    UploadPlan,
    plan_upload,
)
from mooncake_weight_store.mooncake_backend import MooncakeStoreBackend  # noqa: E402
from mooncake_weight_store.testing import Model, ModelSpec  # noqa: E402


def lo_rx() -> int:
    for line in open("/proc/net/dev"):
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


def connect(args):
    be = MooncakeStoreBackend.connect(args.master, global_segment_size=0, local_buffer_size=32 << 20)
    return be, Store.from_backend(be, key_prefix=args.prefix)


def spec_from(args) -> ModelSpec:
    return ModelSpec(hidden=args.hidden, revision=args.revision)


def cmd_restore(args):
    be, store = connect(args)
    out = {"layouts": {}}
    lo0 = lo_rx()
    try:
        spec = spec_from(args)
        for name, tgt in (("tp2", Model(spec, "tp", tp=2, dp=1)), ("ep2xtp2", Model(spec, "ep", tp=2, dp=1, ep=2))):
            bufs = {p: tgt.target_buffers(p) for p in tgt.participant_ids}
            bindings = [tgt.bind(p, bufs[p]) for p in tgt.participant_ids]
            t = time.perf_counter()
            stats = store.restore(args.manifest_key, tgt.placement, bindings)
            dt = time.perf_counter() - t
            bad = [f for p in tgt.participant_ids for f in tgt.verify(p, bufs[p])]
            nbytes = sum(len(b) for d in bufs.values() for b in d.values())
            out["layouts"][name] = {"bytes": stats.bytes, "target_bytes": nbytes, "bad": bad,
                                    "fragments": sum(len(d) for d in bufs.values()), "seconds": dt}
            for b in bindings:
                b.close()
        out["callback_errors"] = store.callback_errors
    finally:
        store.close()
        be.close()
    out["lo_rx_bytes"] = lo_rx() - lo0
    Path(args.out).write_text(json.dumps(out))


def cmd_race(args):
    be, store = connect(args)
    spec = spec_from(args)
    src = Model(spec)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    plan = store.plan_upload(src.placement, bindings, created_at=f"2026-01-01T00:00:0{args.name[-1]}Z")
    res = {"name": args.name, "payload_keys": plan.payload_keys, "manifest_key": plan.manifest_key,
           "digest": plan.manifest_digest}
    try:
        tx = store.transaction(plan)
        for b in bindings:
            tx.upload(src.placement, b)
        barrier = Path(args.barrier)
        (barrier / f"{args.name}.ready").write_text("1")
        deadline = time.monotonic() + 60
        while len(list(barrier.glob("*.ready"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        # MWS_STORE errors of commit are retryable by contract (a put still in flight,
        # "decision is not complete; retry", "manifest put failed"): retry them.
        res["retries"] = 0
        for attempt in range(6):
            try:
                m = tx.commit()
                res["outcome"] = "committed"
                res["manifest_digest"] = m.digest
                break
            except MwsError as e:
                res["outcome"] = "error"
                res["status"] = e.status_name
                res["message"] = e.message
                res["decision_may_exist"] = bool(getattr(e, "decision_may_exist", False))
                if e.status_name != "MWS_STORE":
                    break
                res["retries"] = attempt + 1
                time.sleep(0.05 * (attempt + 1))
        res["decision"] = store.read_decision(plan).name
        try:
            store.finalize_upload(plan)
            res["finalize"] = "ok"
        except MwsError as e:
            res["finalize"] = e.status_name
        res["callback_errors"] = store.callback_errors
    finally:
        store.close()
        be.close()
    Path(args.out).write_text(json.dumps(res))


class HangingBackend:
    """Forwards to the real backend; the N-th batch_put_from writes half of its items
    and then announces itself and hangs (the test SIGKILLs the process)."""

    def __init__(self, inner, hang_after_calls: int, marker: str):
        self.inner = inner
        self.calls = 0
        self.hang_after_calls = hang_after_calls
        self.marker = marker

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batch_put_from(self, items, record_type):
        self.calls += 1
        if self.calls == self.hang_after_calls:
            half = list(items)[: max(1, len(items) // 2)]
            rcs = self.inner.batch_put_from(half, record_type)
            Path(self.marker).write_text(json.dumps({"written": [i.key for i, rc in zip(half, rcs) if rc == 0]}))
            while True:
                time.sleep(1)
        return self.inner.batch_put_from(items, record_type)


def cmd_crash(args):
    be = MooncakeStoreBackend.connect(args.master, global_segment_size=0, local_buffer_size=32 << 20)
    store = Store.from_backend(HangingBackend(be, args.hang_after_calls, args.marker), key_prefix=args.prefix)
    spec = spec_from(args)
    src = Model(spec)
    bufs = {p: src.source_buffers(p) for p in src.participant_ids}
    bindings = [src.bind(p, bufs[p]) for p in src.participant_ids]
    plan = store.plan_upload(src.placement, bindings)
    Path(args.plan_out).write_text(plan.to_json())
    for b in bindings:  # never returns: the hanging backend blocks, the test kills us
        store.upload(plan, src.placement, b)
    Path(args.marker).write_text(json.dumps({"error": "upload finished without hanging"}))


def cmd_recover(args):
    be, store = connect(args)
    res = {}
    try:
        plan = UploadPlan.from_json(Path(args.plan).read_text())
        res["decision_before"] = store.read_decision(plan).name
        try:
            store.finalize_upload(plan)
            res["finalize_before"] = "ok"
        except MwsError as e:
            res["finalize_before"] = e.status_name
        store.abort_upload(plan)
        res["decision_after"] = store.read_decision(plan).name
        store.finalize_upload(plan)
        res["finalize_after"] = "ok"
        res["payload_keys"] = plan.payload_keys
        res["present_after"] = [k for k in plan.payload_keys if be.exists(k) != 0]
        res["manifest_present"] = be.exists(plan.manifest_key)
        res["callback_errors"] = store.callback_errors
    finally:
        store.close()
        be.close()
    Path(args.out).write_text(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["restore", "race", "crash", "recover"])
    ap.add_argument("--master", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--revision", default="step-1")
    ap.add_argument("--manifest-key")
    ap.add_argument("--out")
    ap.add_argument("--barrier")
    ap.add_argument("--name")
    ap.add_argument("--plan-out")
    ap.add_argument("--plan")
    ap.add_argument("--marker")
    ap.add_argument("--hang-after-calls", type=int, default=3)
    args = ap.parse_args()
    {"restore": cmd_restore, "race": cmd_race, "crash": cmd_crash, "recover": cmd_recover}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
