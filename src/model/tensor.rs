//! `TensorDescriptor` (`data-model.md` §4).

use super::axes::{AxisKind, ParallelAxis};
use super::non_empty;
use crate::error::{invalid, Result};
use crate::json::{self, Obj, Profile, Value};
use std::sync::Arc;

/// Construction input of a [`TensorDescriptor`] (plain data, unvalidated).
#[derive(Clone, Debug, Default)]
pub struct TensorSpec {
    /// Non-empty tensor id.
    pub tensor_id: String,
    /// Global shape; non-empty, every extent >= 1.
    pub global_shape: Vec<u64>,
    /// Opaque dtype name (not checked against `itemsize`).
    pub dtype: String,
    /// Bytes per element, >= 1.
    pub itemsize: u64,
    /// Split dimensions, ascending, unique, < ndim; must equal the split axes' dims.
    pub shard_dims: Vec<u64>,
    /// Opaque framework layout identity, non-empty.
    pub layout_fingerprint: String,
    /// Axis semantics, in any order (normalized to dp, pp, ep, tp).
    pub parallel_axes: Vec<ParallelAxis>,
    /// Optional layer id.
    pub layer_id: Option<u64>,
    /// Optional expert id (an individually allocated expert).
    pub expert_id: Option<u64>,
}

/// A validated tensor descriptor. Equality is field-wise after normalization.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorDescriptor {
    /// Shared with the fragments of a placement (interned: one allocation per
    /// tensor, pointer-comparable within one placement).
    tensor_id: Arc<str>,
    global_shape: Vec<u64>,
    dtype: String,
    itemsize: u64,
    shard_dims: Vec<u64>,
    layout_fingerprint: String,
    parallel_axes: Vec<ParallelAxis>,
    layer_id: Option<u64>,
    expert_id: Option<u64>,
}

impl TensorDescriptor {
    /// Validates `spec` in the reference's order (first failure wins).
    ///
    /// Errors: contract errors ([`crate::ErrorKind::InvalidArgument`]) with the
    /// messages of `data-model.md` §4.
    pub fn new(spec: TensorSpec) -> Result<Self> {
        let TensorSpec {
            tensor_id,
            global_shape,
            dtype,
            itemsize,
            shard_dims,
            layout_fingerprint,
            mut parallel_axes,
            layer_id,
            expert_id,
        } = spec;
        if global_shape.is_empty() {
            return invalid("global_shape must not be empty");
        }
        if global_shape.iter().any(|&x| x < 1) {
            return invalid("global_shape must be at least 1");
        }
        non_empty(&tensor_id, "tensor_id")?;
        non_empty(&dtype, "dtype")?;
        if itemsize < 1 {
            return invalid("itemsize must be at least 1");
        }
        let ndim = global_shape.len() as u64;
        for (i, &d) in shard_dims.iter().enumerate() {
            if shard_dims[..i].contains(&d) {
                return invalid("shard_dims must not contain duplicates");
            }
        }
        if shard_dims.windows(2).any(|w| w[0] > w[1]) {
            return invalid("shard_dims must be sorted");
        }
        if shard_dims.iter().any(|&d| d >= ndim) {
            return invalid("shard_dims contains an out-of-range dimension");
        }
        parallel_axes.sort_by_key(|a| a.kind()); // stable
        if parallel_axes.windows(2).any(|w| w[0].kind() == w[1].kind()) {
            return invalid("parallel_axes must not contain duplicate kinds");
        }
        let mut split_dims: Vec<u64> = parallel_axes
            .iter()
            .filter_map(|a| match a {
                ParallelAxis::Split { dim, .. } => Some(*dim),
                _ => None,
            })
            .collect();
        for (i, d) in split_dims.iter().enumerate() {
            if split_dims[..i].contains(d) {
                return invalid("split axes must not share a dimension");
            }
        }
        if split_dims.iter().any(|&d| d >= ndim) {
            return invalid("split axis dimension is out of range");
        }
        split_dims.sort_unstable();
        if split_dims != shard_dims {
            return invalid("parallel axis split dimensions conflict with shard_dims");
        }
        if expert_id.is_some()
            && parallel_axes.iter().any(|a| matches!(a, ParallelAxis::Split { kind: AxisKind::Ep, .. }))
        {
            return invalid("an individually allocated expert requires explicit EP ownership");
        }
        non_empty(&layout_fingerprint, "layout_fingerprint")?;
        Ok(TensorDescriptor {
            tensor_id: Arc::from(tensor_id),
            global_shape,
            dtype,
            itemsize,
            shard_dims,
            layout_fingerprint,
            parallel_axes,
            layer_id,
            expert_id,
        })
    }

    /// Tensor id.
    pub fn tensor_id(&self) -> &str {
        &self.tensor_id
    }
    /// The shared tensor id (fragments of a placement hold clones of it).
    pub(crate) fn tensor_id_arc(&self) -> &Arc<str> {
        &self.tensor_id
    }
    /// Global shape.
    pub fn global_shape(&self) -> &[u64] {
        &self.global_shape
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.global_shape.len()
    }
    /// Dtype name.
    pub fn dtype(&self) -> &str {
        &self.dtype
    }
    /// Bytes per element.
    pub fn itemsize(&self) -> u64 {
        self.itemsize
    }
    /// Split dimensions (ascending).
    pub fn shard_dims(&self) -> &[u64] {
        &self.shard_dims
    }
    /// Layout fingerprint.
    pub fn layout_fingerprint(&self) -> &str {
        &self.layout_fingerprint
    }
    /// Axes in canonical kind order.
    pub fn parallel_axes(&self) -> &[ParallelAxis] {
        &self.parallel_axes
    }
    /// Layer id.
    pub fn layer_id(&self) -> Option<u64> {
        self.layer_id
    }
    /// Expert id.
    pub fn expert_id(&self) -> Option<u64> {
        self.expert_id
    }

    /// The axis declared for `kind`, if any.
    pub fn axis(&self, kind: AxisKind) -> Option<&ParallelAxis> {
        self.parallel_axes.iter().find(|a| a.kind() == kind)
    }

    /// Ownership-axis kinds in canonical order.
    pub fn ownership_kinds(&self) -> impl Iterator<Item = AxisKind> + '_ {
        self.parallel_axes.iter().filter_map(|a| match a {
            ParallelAxis::Ownership(k) => Some(*k),
            _ => None,
        })
    }

    /// Tensor compatibility for planners: equal `layout_fingerprint`,
    /// `global_shape`, `dtype`, `itemsize`, `layer_id`, `expert_id`.
    pub fn is_compatible_with(&self, other: &TensorDescriptor) -> bool {
        self.tensor_id == other.tensor_id
            && self.layout_fingerprint == other.layout_fingerprint
            && self.global_shape == other.global_shape
            && self.dtype == other.dtype
            && self.itemsize == other.itemsize
            && self.layer_id == other.layer_id
            && self.expert_id == other.expert_id
    }

    /// Equality of the alias descriptor keys (every field but `tensor_id`).
    pub fn same_alias_key(&self, other: &TensorDescriptor) -> bool {
        self.global_shape == other.global_shape
            && self.dtype == other.dtype
            && self.itemsize == other.itemsize
            && self.shard_dims == other.shard_dims
            && self.parallel_axes == other.parallel_axes
            && self.layer_id == other.layer_id
            && self.expert_id == other.expert_id
            && self.layout_fingerprint == other.layout_fingerprint
    }

    /// Row-major byte strides of the whole tensor.
    pub fn byte_volume_of(&self, shape: &[u64]) -> u128 {
        crate::geometry::volume(shape).saturating_mul(self.itemsize as u128)
    }

    /// Appends the TENSOR object (`wire-format.md` §2).
    pub(crate) fn write_json<W: json::JsonOut>(&self, out: &mut W, profile: Profile) {
        out.push_str("{\"dtype\":");
        json::write_str(out, &self.dtype, profile);
        out.push_str(",\"expert_id\":");
        json::write_opt_u64(out, self.expert_id);
        out.push_str(",\"global_shape\":");
        json::write_u64_array(out, &self.global_shape);
        out.push_str(",\"itemsize\":");
        json::write_u64(out, self.itemsize);
        out.push_str(",\"layer_id\":");
        json::write_opt_u64(out, self.layer_id);
        out.push_str(",\"layout_fingerprint\":");
        json::write_str(out, &self.layout_fingerprint, profile);
        out.push_str(",\"parallel_axes\":[");
        for (i, a) in self.parallel_axes.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            a.write_json(out);
        }
        out.push_str("],\"shard_dims\":");
        json::write_u64_array(out, &self.shard_dims);
        out.push_str(",\"tensor_id\":");
        json::write_str(out, &self.tensor_id, profile);
        out.push('}');
    }

    /// Decodes a TENSOR object with exactly nine keys. `schema` is the message for a
    /// wrong key set; `prefix` labels fields (`""` or `"stored tensor "`); `axis_label`
    /// labels axes. Labels are formatted only for an error message.
    pub(crate) fn from_json(
        v: &Value,
        schema: &dyn Fn() -> String,
        prefix: &str,
        axis_label: &dyn std::fmt::Display,
    ) -> Result<Self> {
        const KEYS: [&str; 9] = [
            "tensor_id",
            "global_shape",
            "dtype",
            "itemsize",
            "shard_dims",
            "layout_fingerprint",
            "parallel_axes",
            "layer_id",
            "expert_id",
        ];
        let o = Obj::new(v, schema)?;
        o.expect_keys(&KEYS, schema)?;
        let axes_v = json::req_array(o.get("parallel_axes"), || {
            if prefix.is_empty() {
                "parallel_axes must be a sequence".to_string()
            } else {
                format!("{axis_label} must be a sequence")
            }
        })?;
        let mut parallel_axes = Vec::with_capacity(axes_v.len());
        for (i, a) in axes_v.iter().enumerate() {
            parallel_axes.push(ParallelAxis::from_json(a, &format_args!("{axis_label} {i}"))?);
        }
        // Integer tuples: the placement decoder reports a non-array as
        // `<field> must be a sequence`, the stored decoder as
        // `stored tensor <field> must contain integers` (`wire-format.md` §2.1, §4.1).
        let int_tuple = |name: &str, min: u64| {
            let v = o.get(name);
            if !prefix.is_empty() && !matches!(v, Value::Array(_)) {
                return invalid(format!("{prefix}{name} must contain integers"));
            }
            json::req_int_array(v, format_args!("{prefix}{name}"), min)
        };
        TensorDescriptor::new(TensorSpec {
            tensor_id: json::req_str(o.get("tensor_id"), format_args!("{prefix}tensor_id"))?,
            global_shape: int_tuple("global_shape", 1)?,
            dtype: json::req_str(o.get("dtype"), format_args!("{prefix}dtype"))?,
            itemsize: json::req_int(o.get("itemsize"), format_args!("{prefix}itemsize"), 1)?,
            shard_dims: int_tuple("shard_dims", 0)?,
            layout_fingerprint: json::req_str(o.get("layout_fingerprint"), format_args!("{prefix}layout_fingerprint"))?,
            parallel_axes,
            layer_id: json::opt_int(o.get("layer_id"), format_args!("{prefix}layer_id"), 0)?,
            expert_id: json::opt_int(o.get("expert_id"), format_args!("{prefix}expert_id"), 0)?,
        })
    }
}
