//! Parallel ranks and axis semantics (`data-model.md` §2–§3).

use crate::error::{invalid, Result};
use crate::json::{self, Obj, Value};

/// Coordinates of a participant on the four parallel axes (all default to 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ParallelRank {
    /// Data-parallel coordinate.
    pub dp: u64,
    /// Tensor-parallel coordinate.
    pub tp: u64,
    /// Pipeline-parallel coordinate.
    pub pp: u64,
    /// Expert-parallel coordinate.
    pub ep: u64,
}

impl ParallelRank {
    /// Builds a rank.
    pub fn new(dp: u64, pp: u64, ep: u64, tp: u64) -> Self {
        ParallelRank { dp, tp, pp, ep }
    }

    /// The canonical rank order key `(dp, pp, ep, tp)`.
    pub fn order_key(&self) -> (u64, u64, u64, u64) {
        (self.dp, self.pp, self.ep, self.tp)
    }

    /// The coordinate on `kind`.
    pub fn coord(&self, kind: AxisKind) -> u64 {
        match kind {
            AxisKind::Dp => self.dp,
            AxisKind::Pp => self.pp,
            AxisKind::Ep => self.ep,
            AxisKind::Tp => self.tp,
        }
    }

    pub(crate) fn write_json<W: json::JsonOut>(&self, out: &mut W) {
        out.push_str("{\"dp\":");
        json::write_u64(out, self.dp);
        out.push_str(",\"ep\":");
        json::write_u64(out, self.ep);
        out.push_str(",\"pp\":");
        json::write_u64(out, self.pp);
        out.push_str(",\"tp\":");
        json::write_u64(out, self.tp);
        out.push('}');
    }

    /// Decodes a RANK object with exactly the four keys; `schema_err` names it.
    pub(crate) fn from_json(v: &Value, schema_err: &dyn Fn() -> String) -> Result<Self> {
        let o = Obj::new(v, schema_err)?;
        o.expect_keys(&["dp", "ep", "pp", "tp"], schema_err)?;
        Ok(ParallelRank {
            dp: json::req_int(o.get("dp"), "rank dp", 0)?,
            ep: json::req_int(o.get("ep"), "rank ep", 0)?,
            pp: json::req_int(o.get("pp"), "rank pp", 0)?,
            tp: json::req_int(o.get("tp"), "rank tp", 0)?,
        })
    }
}

/// One of the four parallel axes, in canonical order `dp < pp < ep < tp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AxisKind {
    /// Data parallel.
    Dp,
    /// Pipeline parallel.
    Pp,
    /// Expert parallel.
    Ep,
    /// Tensor parallel.
    Tp,
}

impl AxisKind {
    /// All kinds in canonical order.
    pub const ALL: [AxisKind; 4] = [AxisKind::Dp, AxisKind::Pp, AxisKind::Ep, AxisKind::Tp];

    /// `"dp"`, `"pp"`, `"ep"` or `"tp"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AxisKind::Dp => "dp",
            AxisKind::Pp => "pp",
            AxisKind::Ep => "ep",
            AxisKind::Tp => "tp",
        }
    }

    /// Parses a kind: `parallel axis kind must be a non-empty string`,
    /// `unsupported parallel axis kind: <kind>`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "dp" => Ok(AxisKind::Dp),
            "pp" => Ok(AxisKind::Pp),
            "ep" => Ok(AxisKind::Ep),
            "tp" => Ok(AxisKind::Tp),
            "" => invalid("parallel axis kind must be a non-empty string"),
            other => invalid(format!("unsupported parallel axis kind: {other}")),
        }
    }
}

/// The semantics a tensor declares on one axis (`data-model.md` §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParallelAxis {
    /// The ranks along `kind` partition logical dimension `dim` (kind `ep` or `tp`).
    Split {
        /// `ep` or `tp`.
        kind: AxisKind,
        /// The partitioned dimension (0 for `ep`).
        dim: u64,
    },
    /// Every rank along the kind holds an independent complete copy.
    Replicated(AxisKind),
    /// Only the declared owners hold the tensor, each a complete copy.
    Ownership(AxisKind),
}

impl ParallelAxis {
    /// A validated split axis: `<kind> cannot use split semantics`,
    /// `EP must split the leading logical expert dimension`.
    pub fn split(kind: AxisKind, dim: u64) -> Result<Self> {
        match kind {
            AxisKind::Dp | AxisKind::Pp => invalid(format!("{} cannot use split semantics", kind.as_str())),
            AxisKind::Ep if dim != 0 => invalid("EP must split the leading logical expert dimension"),
            _ => Ok(ParallelAxis::Split { kind, dim }),
        }
    }

    /// The axis kind.
    pub fn kind(&self) -> AxisKind {
        match *self {
            ParallelAxis::Split { kind, .. } | ParallelAxis::Replicated(kind) | ParallelAxis::Ownership(kind) => kind,
        }
    }

    pub(crate) fn write_json<W: json::JsonOut>(&self, out: &mut W) {
        match *self {
            ParallelAxis::Split { kind, dim } => {
                out.push_str("{\"dim\":");
                json::write_u64(out, dim);
                out.push_str(",\"kind\":\"");
                out.push_str(kind.as_str());
                out.push_str("\",\"semantics\":\"split\"}");
            }
            ParallelAxis::Replicated(kind) | ParallelAxis::Ownership(kind) => {
                out.push_str("{\"kind\":\"");
                out.push_str(kind.as_str());
                out.push_str("\",\"semantics\":\"");
                out.push_str(if matches!(self, ParallelAxis::Replicated(_)) { "replicated" } else { "ownership" });
                out.push_str("\"}");
            }
        }
    }
}
