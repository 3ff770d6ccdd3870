"""The Python README's trainer example: save a state dict, restore it in another layout.

    python examples/python/quickstart_state_dict.py

One process here (the embedded memory store; ``mws.Store.directory(path)`` persists):
a TP=1 trainer saves its state dict, then the two ranks of a TP=2 server each load
their own shards. In a job, each rank is a process: pass
``exchange=mws.TorchDistributedExchange()`` (or ``FileExchange``) to
``save_state_dict`` and every rank calls it with its own shards.
"""

import numpy as np

import mooncake_weight_store as mws

store = mws.Store.memory()  # or mws.Store.directory("/ckpt/store")

# Sharding in trainer terms (fnmatch patterns): column-parallel splits dim 0,
# row-parallel dim 1, norms are replicated.
sharding = {"*.q_proj.weight": "colwise", "*.o_proj.weight": "rowwise", "*norm.weight": None}
rng = np.random.default_rng(0)
state_dict = {
    "layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 32), dtype=np.float32),
    "layers.0.self_attn.o_proj.weight": rng.standard_normal((32, 64), dtype=np.float32),
    "layers.0.input_layernorm.weight": np.ones(32, dtype=np.float32),
}

manifest = mws.save_state_dict(store, state_dict, resource_id="tiny-llm", revision="step-42", weight_generation=42,
                               sharding=sharding, parallel=mws.Parallel(tp_rank=0, tp_size=1),
                               progress=mws.ProgressBar("save"))
print("saved", manifest.key, f"({manifest.fragment_count} fragments)")

# The server finds the newest revision in the store (no key is built by hand);
# load_state_dict(store, "latest", resource_id="tiny-llm", ...) does the same.
latest = store.latest("tiny-llm")
assert latest is not None and latest.manifest_key == manifest.key
print("newest revision:", latest.revision, "generation", latest.weight_generation)

# A TP=2 server: each rank restores only its own shards (fresh numpy arrays here, or
# in place with into=model.state_dict()).
for rank in range(2):
    shards = mws.load_state_dict(store, latest, sharding=sharding,
                                 parallel=mws.Parallel(tp_rank=rank, tp_size=2))
    q = state_dict["layers.0.self_attn.q_proj.weight"]
    o = state_dict["layers.0.self_attn.o_proj.weight"]
    assert np.array_equal(shards["layers.0.self_attn.q_proj.weight"], q[rank * 32:(rank + 1) * 32])
    assert np.array_equal(shards["layers.0.self_attn.o_proj.weight"], o[:, rank * 32:(rank + 1) * 32])
    assert np.array_equal(shards["layers.0.input_layernorm.weight"], state_dict["layers.0.input_layernorm.weight"])
    print(f"TP rank {rank}/2: every shard matches")
