//! The parallel topology (`data-model.md` §7): axis sizes, explicit participants and
//! the canonical topology id.

use crate::error::{invalid, Error, Result};
use crate::json::{self, Obj, Profile, Value};
use crate::model::axes::{AxisKind, ParallelRank};
use crate::model::{non_empty, sha256_hex};

/// One participant of a topology.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologyParticipant {
    /// Non-empty participant id.
    pub participant_id: String,
    /// Its rank.
    pub rank: ParallelRank,
}

/// Construction input of a [`ParallelTopology`].
#[derive(Clone, Debug, Default)]
pub struct TopologySpec {
    /// TP size (>= 1).
    pub tp_size: u64,
    /// PP size (>= 1).
    pub pp_size: u64,
    /// EP size (>= 1).
    pub ep_size: u64,
    /// DP size (>= 1).
    pub dp_size: u64,
    /// Participants in any order.
    pub participants: Vec<TopologyParticipant>,
    /// Optional id that must equal the canonical one.
    pub topology_id: Option<String>,
}

/// The validated runtime topology: axis sizes plus explicit participants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParallelTopology {
    pub(super) tp_size: u64,
    pub(super) pp_size: u64,
    pub(super) ep_size: u64,
    pub(super) dp_size: u64,
    pub(super) participants: Vec<TopologyParticipant>,
    pub(super) topology_id: String,
}

impl ParallelTopology {
    /// Validates `spec` (`data-model.md` §7) and computes the canonical id.
    pub fn new(spec: TopologySpec) -> Result<Self> {
        for (name, v) in
            [("tp_size", spec.tp_size), ("pp_size", spec.pp_size), ("ep_size", spec.ep_size), ("dp_size", spec.dp_size)]
        {
            if v < 1 {
                return invalid(format!("{name} must be at least 1"));
            }
        }
        let mut participants = spec.participants;
        if participants.is_empty() {
            return invalid("parallel topology participants must not be empty");
        }
        for p in &participants {
            non_empty(&p.participant_id, "participant_id")?;
        }
        participants.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        if participants.windows(2).any(|w| w[0].participant_id == w[1].participant_id) {
            return invalid("duplicate topology participant_id");
        }
        let mut ranks = crate::fxhash::set_with_capacity(participants.len());
        if !participants.iter().all(|p| ranks.insert(p.rank)) {
            return invalid("duplicate topology parallel rank");
        }
        let mut t = ParallelTopology {
            tp_size: spec.tp_size,
            pp_size: spec.pp_size,
            ep_size: spec.ep_size,
            dp_size: spec.dp_size,
            participants,
            topology_id: String::new(),
        };
        for p in &t.participants {
            for kind in [AxisKind::Tp, AxisKind::Pp, AxisKind::Ep, AxisKind::Dp] {
                if p.rank.coord(kind) >= t.size(kind) {
                    return invalid(format!(
                        "{} rank is out of range for participant {}",
                        kind.as_str(),
                        p.participant_id
                    ));
                }
            }
        }
        let mut text = String::new();
        t.write_fields(&mut text, true);
        t.topology_id = format!("sha256:{}", sha256_hex(text.as_bytes()));
        if let Some(given) = spec.topology_id {
            // The `fuzzing` feature (fuzz builds only) lets mismatched ids through.
            if given != t.topology_id && !cfg!(feature = "fuzzing") {
                return invalid("topology_id does not match canonical topology");
            }
        }
        Ok(t)
    }

    pub(super) fn write_fields<W: json::JsonOut>(&self, out: &mut W, schema: bool) {
        out.push_str("{\"dp_size\":");
        json::write_u64(out, self.dp_size);
        out.push_str(",\"ep_size\":");
        json::write_u64(out, self.ep_size);
        out.push_str(",\"participants\":[");
        for (i, p) in self.participants.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"participant_id\":");
            json::write_str(out, &p.participant_id, Profile::Ascii);
            out.push_str(",\"rank\":");
            p.rank.write_json(out);
            out.push('}');
        }
        out.push_str("],\"pp_size\":");
        json::write_u64(out, self.pp_size);
        if schema {
            out.push_str(",\"schema\":\"weight-parallel-topology\"");
        } else {
            out.push_str(",\"topology_id\":");
            json::write_str(out, &self.topology_id, Profile::Ascii);
        }
        out.push_str(",\"tp_size\":");
        json::write_u64(out, self.tp_size);
        out.push('}');
    }

    /// Size of axis `kind`.
    pub fn size(&self, kind: AxisKind) -> u64 {
        match kind {
            AxisKind::Dp => self.dp_size,
            AxisKind::Pp => self.pp_size,
            AxisKind::Ep => self.ep_size,
            AxisKind::Tp => self.tp_size,
        }
    }
    /// TP size.
    pub fn tp_size(&self) -> u64 {
        self.tp_size
    }
    /// PP size.
    pub fn pp_size(&self) -> u64 {
        self.pp_size
    }
    /// EP size.
    pub fn ep_size(&self) -> u64 {
        self.ep_size
    }
    /// DP size.
    pub fn dp_size(&self) -> u64 {
        self.dp_size
    }
    /// Participants sorted by id.
    pub fn participants(&self) -> &[TopologyParticipant] {
        &self.participants
    }
    /// `len(participants)` (deliberately not the product of the sizes).
    pub fn world_size(&self) -> usize {
        self.participants.len()
    }
    /// Canonical `sha256:` id.
    pub fn topology_id(&self) -> &str {
        &self.topology_id
    }
    /// The participant `id`, or `unknown topology participant: <id>`.
    pub fn participant(&self, id: &str) -> Result<&TopologyParticipant> {
        self.participants
            .binary_search_by(|p| p.participant_id.as_str().cmp(id))
            .map(|i| &self.participants[i])
            .map_err(|_| Error::invalid(format!("unknown topology participant: {id}")))
    }

    pub(super) fn from_json(v: &Value) -> Result<Self> {
        let schema = || "parallel topology schema fields do not match contract".to_string();
        let o = Obj::new(v, schema)?;
        o.expect_keys(&["tp_size", "pp_size", "ep_size", "dp_size", "topology_id", "participants"], schema)?;
        let items =
            json::req_array(o.get("participants"), || "parallel topology participants must be a sequence".into())?;
        let mut participants = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let schema = || format!("parallel topology participant {i} schema fields do not match contract");
            let po = Obj::new(item, schema)?;
            po.expect_keys(&["participant_id", "rank"], schema)?;
            participants.push(TopologyParticipant {
                participant_id: json::req_str(po.get("participant_id"), "participant_id")?,
                rank: ParallelRank::from_json(po.get("rank"), &|| {
                    format!("parallel topology rank {i} schema fields do not match contract")
                })?,
            });
        }
        ParallelTopology::new(TopologySpec {
            tp_size: json::req_int(o.get("tp_size"), "tp_size", 1)?,
            pp_size: json::req_int(o.get("pp_size"), "pp_size", 1)?,
            ep_size: json::req_int(o.get("ep_size"), "ep_size", 1)?,
            dp_size: json::req_int(o.get("dp_size"), "dp_size", 1)?,
            participants,
            topology_id: Some(json::req_str(o.get("topology_id"), "topology_id")?),
        })
    }
}
