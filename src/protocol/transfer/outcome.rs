//! The coordinator's verdict per target participant (`live-transfer.md` §12.2,
//! "nothing torn"): computed only from one bound plan, the calls' normal returns and
//! their receipts. A target is reported updated for generation G only when every
//! call that the plan routes operations of it to returned normally under that same
//! plan with exactly the predicted receipts.

use super::error::TransferError;
use super::executor::TransferReceipt;
use crate::engine::Direction;
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use std::collections::{BTreeMap, BTreeSet};

/// Who executes: sources push (sink) or targets pull (reader).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferMode {
    /// One `execute_sink` per source executor.
    Sink,
    /// One `execute_reader` per target executor.
    Reader,
}

/// One finished call, as the coordinator recorded it.
#[derive(Clone, Debug)]
pub struct CallRecord {
    /// The plan the call ran under (compared by plan equality).
    pub plan: TransferPlan,
    /// The calling executor's participant.
    pub participant_id: String,
    /// The calling executor's worker.
    pub worker_id: String,
    /// The normal return (receipts) or the error.
    pub result: Result<Vec<TransferReceipt>, TransferError>,
}

/// The verdict for one target participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetOutcome {
    /// Every planned byte landed: the participant may be activated at `generation`.
    Updated {
        /// The plan's weight generation.
        weight_generation: u64,
    },
    /// No call of the participant submitted anything (each did not run, or failed
    /// before any batch): it still holds its previous contents.
    Unchanged,
    /// Some call is missing or incomplete after something may have been written:
    /// the participant's bytes are undefined until the missing calls complete.
    Torn {
        /// The executors `(participant, worker)` whose calls are not complete.
        incomplete: Vec<(String, String)>,
    },
}

/// The receipts `plan` predicts for the call of `executor` (§12.2 step 2): its
/// operations grouped by the other side's endpoint, `Σ segment_count` and
/// `Σ total_bytes` per group, sorted by endpoint.
pub fn predicted_receipts(plan: &TransferPlan, executor: &ExecutorTransferPlan) -> Vec<TransferReceipt> {
    let (direction, other) = match executor.side {
        Side::Source => (Direction::Write, Side::Target),
        Side::Target => (Direction::Read, Side::Source),
    };
    let mut groups: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for &i in &executor.operation_indices {
        let (_, f) = plan.operation_fragment(i as usize, other);
        let r = &plan.regions()[i as usize];
        let g = groups.entry(f.endpoint()).or_default();
        g.0 += r.segment_count();
        g.1 += r.total_bytes();
    }
    groups
        .into_iter()
        .map(|(endpoint, (operation_count, nbytes))| TransferReceipt {
            direction,
            worker_id: executor.worker_id.clone(),
            endpoint: endpoint.to_string(),
            operation_count,
            nbytes,
        })
        .collect()
}

/// The executors whose calls write target participant `participant` (§12.2 step 1).
pub fn calls_of<'p>(plan: &'p TransferPlan, mode: TransferMode, participant: &str) -> Vec<&'p ExecutorTransferPlan> {
    match mode {
        TransferMode::Reader => {
            plan.executors(Side::Target).iter().filter(|e| e.participant_id == participant).collect()
        }
        TransferMode::Sink => plan
            .executors(Side::Source)
            .iter()
            .filter(|e| {
                e.operation_indices
                    .iter()
                    .any(|&i| plan.operation_fragment(i as usize, Side::Target).0.participant_id() == participant)
            })
            .collect(),
    }
}

/// The verdict for every target participant of `plan` (§12.2): `calls` are the
/// coordinator's records in the order they finished; for one executor the latest
/// record under `plan` counts (re-running a failed call under the same plan is
/// allowed); records under another plan value are ignored.
pub fn target_outcomes(
    plan: &TransferPlan,
    mode: TransferMode,
    calls: &[CallRecord],
) -> BTreeMap<String, TargetOutcome> {
    let mut latest: BTreeMap<(&str, &str), &CallRecord> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.plan == *plan) {
        latest.insert((c.participant_id.as_str(), c.worker_id.as_str()), c);
    }
    let participants: BTreeSet<&str> = plan.executors(Side::Target).iter().map(|e| e.participant_id.as_str()).collect();
    let mut out = BTreeMap::new();
    for p in participants {
        let mut incomplete = Vec::new();
        let mut touched = false;
        for e in calls_of(plan, mode, p) {
            let key = (e.participant_id.clone(), e.worker_id.clone());
            match latest.get(&(e.participant_id.as_str(), e.worker_id.as_str())) {
                None => incomplete.push(key),
                Some(c) => match &c.result {
                    Ok(receipts) => {
                        let mut got = receipts.clone();
                        got.sort();
                        if got != predicted_receipts(plan, e) {
                            touched = true;
                            incomplete.push(key);
                        }
                    }
                    Err(err) => {
                        touched |= err.submitted;
                        incomplete.push(key);
                    }
                },
            }
        }
        let verdict = if incomplete.is_empty() {
            TargetOutcome::Updated { weight_generation: plan.weight_generation() }
        } else if !touched && incomplete.len() == calls_of(plan, mode, p).len() {
            TargetOutcome::Unchanged
        } else {
            TargetOutcome::Torn { incomplete }
        };
        out.insert(p.to_string(), verdict);
    }
    out
}

/// The verdict of one call, by `executor`, for each target participant it writes
/// (§12.2 applied to that call alone): `Updated` when the call returned normally
/// under `plan` with exactly the predicted receipts, `Unchanged` when it failed
/// before submitting anything, `Torn` (naming the executor) otherwise. A target
/// written by several calls is updated only when all of them are: use
/// [`target_outcomes`] over every call's record for that.
pub fn call_outcomes(
    plan: &TransferPlan,
    mode: TransferMode,
    executor: &ExecutorTransferPlan,
    record: &CallRecord,
) -> BTreeMap<String, TargetOutcome> {
    let key = (executor.participant_id.clone(), executor.worker_id.clone());
    let verdict = if record.plan != *plan {
        TargetOutcome::Torn { incomplete: vec![key] }
    } else {
        match &record.result {
            Ok(receipts) => {
                let mut got = receipts.clone();
                got.sort();
                if got == predicted_receipts(plan, executor) {
                    TargetOutcome::Updated { weight_generation: plan.weight_generation() }
                } else {
                    TargetOutcome::Torn { incomplete: vec![key] }
                }
            }
            Err(e) if !e.submitted => TargetOutcome::Unchanged,
            Err(_) => TargetOutcome::Torn { incomplete: vec![key] },
        }
    };
    let targets: BTreeSet<String> = match mode {
        TransferMode::Reader => std::iter::once(executor.participant_id.clone()).collect(),
        TransferMode::Sink => executor
            .operation_indices
            .iter()
            .map(|&i| plan.operation_fragment(i as usize, Side::Target).0.participant_id().to_string())
            .collect(),
    };
    targets.into_iter().map(|p| (p, verdict.clone())).collect()
}
