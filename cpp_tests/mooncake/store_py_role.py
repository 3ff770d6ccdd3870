"""A Python process on the REAL Mooncake Store for store_real.py's
store_cross_language case: the library's Python binding over
``mooncake_weight_store.mooncake_backend.MooncakeStoreBackend`` (the wheel's
``mooncake.store.MooncakeDistributedStore``, a pure client: segment 0, so its bytes
cross TCP to the driver's `hold` process), with store_role.cpp's model
(examples/support/mws_model.hpp: model_tensors(layers, 256, 4), resource
"test-model", generation = layers, the same bytes: mws_model.py).

    python store_py_role.py MASTER restore MANIFEST_KEY [LAYERS]
        restores a C++ trainer's snapshot into PP2 x EP4 (a layout neither C++ role
        uses), checks every byte, prints "PY_RESTORE_OK <bytes> <fragments>"
    python store_py_role.py MASTER snapshot NAMESPACE [LAYERS]
        snapshots the model from TP2 x PP2 x EP2 x DP2 (integrity on) as revision
        "rev-py" of NAMESPACE, prints "PY_MANIFEST <manifest key>" (the C++ server
        then restores it into TP2 x EP2)

Exit 0 on success; anything else fails the case.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

from mooncake_weight_store import Store  # noqa: E402
from mooncake_weight_store.mooncake_backend import MooncakeStoreBackend  # noqa: E402
from mws_model import HostModel, Layout, model_tensors, placement  # noqa: E402  (this folder)

HIDDEN, EXPERTS = 256, 4  # store_role.cpp's model(layers)
RESTORE_LAYOUT = Layout(tp=1, pp=2, ep=4, dp=1)
SNAPSHOT_LAYOUT = Layout(tp=2, pp=2, ep=2, dp=2)


def restore(store: Store, manifest_key: str, layers: int) -> None:
    defs = model_tensors(layers, HIDDEN, EXPERTS)
    with store.load_manifest(manifest_key) as m:
        revision = m.revision
    dst = HostModel(placement("py-serving", RESTORE_LAYOUT, defs, layers, revision=revision), defs, fill=False)
    bindings = dst.bindings("py-server")
    stats = store.restore(manifest_key, dst.placement, bindings)
    for b in bindings:
        b.close()
    checked, bad = dst.verify()
    if bad or checked == 0:
        raise AssertionError(f"{len(bad)} fragments differ after the restore, e.g. {bad[:3]}")
    print(f"PY_RESTORE_OK {checked} {len(dst.frags)} (restored {stats.bytes} bytes in {stats.requests} requests)",
          flush=True)


def snapshot(store: Store, namespace: str, layers: int) -> None:
    defs = model_tensors(layers, HIDDEN, EXPERTS)
    src = HostModel(placement("py-trainer", SNAPSHOT_LAYOUT, defs, layers, revision="rev-py"), defs, fill=True)
    bindings = src.bindings("py-trainer")
    with store.begin_snapshot(src.placement, bindings, namespace=namespace) as w:
        w.write_all()
        m = w.commit()
    print(f"PY_MANIFEST {m.key}", flush=True)
    for b in bindings:
        b.close()


def main() -> int:
    master, cmd, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    layers = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    be = MooncakeStoreBackend.connect(master, global_segment_size=0, local_buffer_size=32 << 20)
    store = Store.from_backend(be)
    try:
        if cmd == "restore":
            restore(store, arg, layers)
        elif cmd == "snapshot":
            snapshot(store, arg, layers)
        else:
            print(f"unknown command {cmd!r}", file=sys.stderr)
            return 2
        errors = store.callback_errors
        if errors:
            print(f"backend callback errors: {errors}", file=sys.stderr)
            return 1
    finally:
        store.close()
        be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
