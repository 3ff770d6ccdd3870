"""The Python README's low-level example: placement, bindings, snapshot, restore.

    python examples/python/quickstart_low_level.py [MASTER]

With MASTER (``127.0.0.1:50051``, a running ``mooncake_master``), the store is
Mooncake Store; without it, the embedded memory store.
"""

import sys

import mooncake_weight_store as mws

# 1. describe the model (address-free); the builder writes canonical placement JSON
def placement_for(tp: int, name: str) -> mws.Placement:
    b = mws.PlacementBuilder("qwen", "step-42", weight_generation=7, tp_size=tp, placement_set_id=name)
    b.add_grid(name)                                      # one participant per rank
    b.add_tensor(mws.TensorSpec("w", (8, 4), "bfloat16", 2, (mws.Split("tp", 0),)))
    b.shard("w")                                          # even split over TP
    return b.build()                                      # validated by the library


# 2. bind live buffers (any object exporting a C-contiguous buffer, or raw addresses)
def bind(placement: mws.Placement, fill: int):
    bindings, buffers = [], {}
    for pid in placement.participants():
        bd = mws.Binding(placement, pid, lease_id="lease-1")
        for f in placement.participant_fragments(pid):
            buffers[f.placement_fragment_id] = buf = bytearray([fill]) * f.nbytes
            bd.add(f.placement_fragment_id, buf)          # or bd.add_address(fid, ptr)
        bindings.append(bd)
    return bindings, buffers


source = placement_for(2, "trainer")
bindings, src_buffers = bind(source, 0)
for n, buf in enumerate(src_buffers.values()):
    buf[:] = bytes((n * 16 + i) % 256 for i in range(len(buf)))

# 3. a store: memory, directory, or Mooncake Store through the vtable
if len(sys.argv) > 1:
    from mooncake_weight_store.mooncake_backend import MooncakeStoreBackend

    store = mws.Store.from_backend(MooncakeStoreBackend.connect(sys.argv[1]))
else:
    store = mws.Store.memory()                            # or mws.Store.directory(path)

# 4. snapshot (writer: uploads each participant as soon as its tensors are written)
with store.begin_snapshot(source, bindings) as writer:
    for tensor_id in writer.tensor_ids():
        writer.write_tensor(tensor_id).close()
manifest = writer.manifest
print("snapshot", manifest.key)

# 5. restore into any other layout (each rank may load its own participant)
target = placement_for(1, "server")
target_bindings, dst_buffers = bind(target, 0xFF)
stats = store.restore(manifest.key, target, target_bindings)
(whole,) = dst_buffers.values()
assert bytes(whole) == b"".join(bytes(b) for b in src_buffers.values()), "restored bytes differ"
print(f"restored into TP=1: {stats.bytes} bytes in {stats.regions} regions, every byte matches")
