"""The Python README's live example: a trainer's state dict pushed into a server's, every step.

    python examples/python/quickstart_live_state_dict.py

One process here (the embedded transfer engine): a TP=2 trainer (both ranks given
with ranks=) pushes its weights into a TP=1 server's preallocated tensors after each
optimizer step. In a job, each trainer rank calls live_state_dict with its own state
dict, parallel= and exchange=; the server ships its side with to_json() and
registers its memory with its engine (LiveStateDict.register).
"""

import numpy as np

import mooncake_weight_store as mws

sharding = {"*.q_proj.weight": "colwise", "*.o_proj.weight": "rowwise", "*norm.weight": None}
rng = np.random.default_rng(0)
full = {
    "layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 32), dtype=np.float32),
    "layers.0.self_attn.o_proj.weight": rng.standard_normal((32, 64), dtype=np.float32),
    "layers.0.input_layernorm.weight": np.ones(32, dtype=np.float32),
}


def tp_shard(name, tensor, rank):
    """A TP=2 rank's shard: q split over rows, o over columns, the norm whole."""
    if "q_proj" in name:
        return tensor[rank * 32:(rank + 1) * 32].copy()
    if "o_proj" in name:
        return np.ascontiguousarray(tensor[:, rank * 32:(rank + 1) * 32])
    return tensor.copy()


trainer = {mws.Parallel(tp_rank=r, tp_size=2): {n: tp_shard(n, t, r) for n, t in full.items()} for r in range(2)}
server = {n: np.zeros_like(t) for n, t in full.items()}  # the server's own (TP=1) tensors

# Each side in trainer terms: placement and bindings in one call per side.
source = mws.live_state_dict(ranks=trainer, side="source", resource_id="tiny-llm", sharding=sharding)
target = mws.live_state_dict(server, side="target", resource_id="tiny-llm", sharding=sharding)

# Plan, register and prepare once; then one step per weight generation.
with mws.prepare_live_transfer(source, target, mws.TransferEngine.local(), mode="sink") as live:
    for generation in (1, 2, 3):
        for state_dict in trainer.values():  # the optimizer step updates the tensors in place
            for tensor in state_dict.values():
                tensor *= 0.5
        report = live.step(generation)
        assert report.updated and report.verdicts() == {"rank-d0-p0-e0-t0": "updated"}
        q = np.concatenate([sd["layers.0.self_attn.q_proj.weight"] for sd in trainer.values()])
        o = np.concatenate([sd["layers.0.self_attn.o_proj.weight"] for sd in trainer.values()], axis=1)
        assert np.array_equal(server["layers.0.self_attn.q_proj.weight"], q)
        assert np.array_equal(server["layers.0.self_attn.o_proj.weight"], o)
        print(f"generation {generation}: {report.stats.bytes} bytes, every server tensor matches")
source.close()
target.close()
