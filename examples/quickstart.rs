//! The README's Rust quick start, a complete program (`cargo run --example quickstart`;
//! `tests/doc_examples.rs` runs it under `cargo test`).
//!
//! A trainer holds one bf16 tensor [8, 6] in TP=2 (rows split) and snapshots it into
//! the embedded memory store; a server in TP=3 (columns split) restores it and checks
//! every byte.

use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, UploadArgs, WeightStore};
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::*;
use std::sync::Arc;

/// One TP rank: the box of the tensor it holds (row0, col0, rows, cols) and its buffer.
struct Rank {
    bx: [u64; 4],
    buf: Vec<u8>,
}

/// The placement of a TP layout (split on `dim`) and one binding per rank.
fn layout(tp: u64, dim: usize, name: &str) -> Result<(Placement, Vec<Rank>, Vec<RuntimeBinding>)> {
    let tensor = "model.layers.0.mlp.down_proj.weight";
    let mut b = PlacementBuilder::new(PlacementBuilderSpec {
        resource_id: "quickstart-model".into(),
        revision: "rev-1".into(),
        weight_generation: 1,
        placement_set_id: name.into(),
        tp_size: tp,
        pp_size: 1,
        ep_size: 1,
        dp_size: 1,
    });
    b.add_tensor(TensorSpec {
        tensor_id: tensor.into(),
        global_shape: vec![8, 6],
        dtype: "bfloat16".into(),
        itemsize: 2,
        shard_dims: vec![dim as u64],
        layout_fingerprint: "quickstart:row-major:v1".into(),
        parallel_axes: vec![ParallelAxis::Replicated(AxisKind::Dp), ParallelAxis::split(AxisKind::Tp, dim as u64)?],
        layer_id: None,
        expert_id: None,
    })?;
    let mut ranks = Vec::new();
    let mut ids = Vec::new();
    for r in 0..tp {
        let (rows, cols) = if dim == 0 { (8 / tp, 6) } else { (8, 6 / tp) };
        let (row0, col0) = if dim == 0 { (r * rows, 0) } else { (0, r * cols) };
        let participant = format!("{name}-tp{r}");
        b.add_participant(&participant, ParallelRank::new(0, 0, 0, r))?;
        let id = b.add_fragment(BuilderFragment {
            participant_id: participant,
            tensor_id: tensor.into(),
            global_offset: vec![row0, col0],
            local_shape: vec![rows, cols],
            ..Default::default()
        })?;
        ids.push(id.to_string());
        ranks.push(Rank { bx: [row0, col0, rows, cols], buf: vec![0; (rows * cols * 2) as usize] });
    }
    let placement = b.build()?;
    let mut bindings = Vec::new();
    for (r, rank) in ranks.iter().enumerate() {
        let participant = format!("{name}-tp{r}");
        let address = rank.buf.as_ptr() as u64; // borrowed: the buffer outlives every use
        let fragment = RuntimeFragment::new(RuntimeFragmentSpec {
            placement_fragment_id: ids[r].clone(),
            fragment_id: participant.clone(),
            address,
            nbytes: rank.buf.len() as u64,
            worker_id: "worker-0".into(),
            endpoint: "localhost".into(),
            device: "cpu".into(),
            itemsize: 2,
            local_shape: vec![rank.bx[2], rank.bx[3]],
            strides_bytes: vec![rank.bx[3] * 2, 2],
            storage_address: address,
            storage_nbytes: rank.buf.len() as u64,
            ..Default::default()
        })?;
        bindings.push(RuntimeBinding::new(RuntimeBindingSpec {
            resource_id: placement.resource_id().into(),
            placement_id: placement.placement_id().into(),
            placement_digest: placement.digest().into(),
            instance_id: participant.clone(),
            lease_generation: 1,
            lease_id: "lease-1".into(),
            revision: placement.revision().into(),
            participant_id: participant,
            fragments: vec![fragment],
        })?);
    }
    Ok((placement, ranks, bindings))
}

/// Byte `k` of global element (i, j): what the trainer writes.
fn value(i: u64, j: u64, k: u64) -> u8 {
    (i * 31 + j * 7 + k) as u8
}

pub fn main() -> Result<()> {
    let store = WeightStore::new(Arc::new(MemoryStore::new())); // or DirectoryStore::open(path)?

    // The trainer: fill its buffers, plan the upload, upload every rank, commit.
    let (placement, mut ranks, bindings) = layout(2, 0, "trainer")?;
    for rank in &mut ranks {
        let [row0, col0, _, cols] = rank.bx;
        for (n, byte) in rank.buf.iter_mut().enumerate() {
            let n = n as u64;
            *byte = value(row0 + n / 2 / cols, col0 + n / 2 % cols, n % 2);
        }
    }
    let plan = store.plan_upload(&placement, &bindings, &UploadOptions::default())?;
    let mut receipts = Vec::new();
    for binding in &bindings {
        let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: the buffers stay valid and unchanged during the call (StaticGuard says
        // so; a framework's GuardProvider would pin them instead).
        receipts.extend(unsafe { store.upload(&plan, &placement, binding, args)? });
    }
    let manifest = store.commit(&plan, &receipts, None)?; // publishes exactly once

    // The server: plan the restore into its own layout, load every rank, check.
    let (target, ranks, target_bindings) = layout(3, 1, "server")?;
    let manifest = Arc::new(store.load_manifest(manifest.manifest_key())?);
    let load = store.plan_load(manifest, Arc::new(target), &target_bindings, PlanningLimits::default())?;
    let progress = |p: &protocol::Progress| println!("  restore {}/{} bytes", p.bytes_done, p.bytes_total);
    for binding in &target_bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), progress: Some(&progress), ..Default::default() };
        // SAFETY: the target buffers are valid and touched by nobody else during the call.
        unsafe { store.load(&load, binding, args)? };
    }
    for rank in &ranks {
        let [row0, col0, _, cols] = rank.bx;
        for (n, &byte) in rank.buf.iter().enumerate() {
            let n = n as u64;
            assert_eq!(byte, value(row0 + n / 2 / cols, col0 + n / 2 % cols, n % 2), "restored bytes differ");
        }
    }
    println!("restored TP=2 into TP=3: every byte matches");
    Ok(())
}
