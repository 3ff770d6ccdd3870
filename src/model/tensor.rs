//! `TensorDescriptor` (`data-model.md` §4).

use super::axes::{AxisKind, ParallelAxis};
use super::non_empty;
use crate::error::Error;
use crate::error::{invalid, Result};
use crate::json::{self, Profile, Value};
use crate::model::typed::{self, Each, Held, In, IntArray, Keys, Mode, OptUInt, Str, Typed, UInt};
use serde::de::{self, MapAccess};
use std::borrow::Cow;
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
}

/// Reads a document's `tensors` member (the value `m` holds next) in mode `mode`:
/// an array of TENSOR objects, those of a manifest (`stored`) or of a placement,
/// each named in messages as that document names it (`wire-format.md` §2.1, §4.1).
/// Anything but an array: `StoredWeightManifest tensors must be a sequence` /
/// `placement tensors must be a sequence`.
pub(crate) fn read_tensors<'de, M: Mode, A: MapAccess<'de>>(
    mode: M,
    m: &mut A,
    stored: bool,
) -> std::result::Result<M::Out<Vec<Arc<TensorDescriptor>>>, A::Error> {
    let not_array = match stored {
        true => "StoredWeightManifest tensors must be a sequence",
        false => "placement tensors must be a sequence",
    };
    let each = Each(mode, |index| In(mode, TensorSeed { index, stored, mode }), || Error::invalid(not_array));
    mode.value(m, each)
}

/// Decodes tensor `index` of a placement or (`stored`) of a manifest: a TENSOR
/// object with exactly nine keys (one pass, see [`crate::model::typed`]). The
/// document names the fields in its messages (`wire-format.md` §2.1, §4.1).
struct TensorSeed<M> {
    index: usize,
    stored: bool,
    mode: M,
}

/// Decodes axis `index` of a tensor, an AXIS object (`wire-format.md` §2.1 step 5;
/// one pass, see [`crate::model::typed`]); `label` names the tensor's axes.
struct AxisSeed<'a, M> {
    label: &'a dyn std::fmt::Display,
    index: usize,
    mode: M,
}

/// An axis's key slots.
fn axis_slot(k: &str) -> Option<u32> {
    Some(match k {
        "semantics" => 0,
        "kind" => 1,
        "dim" => 2,
        _ => return None,
    })
}

impl<'de, M: Mode> Typed<'de> for AxisSeed<'_, M> {
    type Out = M::Out<ParallelAxis>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.mode;
        let mut keys = Keys::default();
        let (mut semantics, mut kind, mut dim) = (Held::default(), Held::default(), Held::default());
        while let Some(k) = keys.next(mode, &mut m, axis_slot)? {
            match k {
                0 => semantics = mode.value(&mut m, Str)?,
                1 => kind = mode.value(&mut m, Str)?,
                _ => dim = mode.value(&mut m, UInt)?,
            }
        }
        let (label, i) = (self.label, self.index);
        let schema = || Error::invalid(format!("{label} {i} schema fields do not match contract"));
        let kind_of = |v: Held<Cow<str>>| -> Result<AxisKind> {
            match v {
                Held::Typed(s) => AxisKind::parse(&s),
                _ => invalid("parallel axis kind must be a non-empty string"),
            }
        };
        M::checked(match &semantics {
            Held::Typed(s) if !s.is_empty() => match s.as_ref() {
                "split" if !keys.are(0b111) => Err(schema()),
                "split" => kind_of(kind)
                    .and_then(|kind| Ok((kind, dim.req_int("split axis dim", 0)?)))
                    .and_then(|(kind, dim)| ParallelAxis::split(kind, dim)),
                "replicated" | "ownership" if !keys.are(0b011) => Err(schema()),
                "replicated" => kind_of(kind).map(ParallelAxis::Replicated),
                "ownership" => kind_of(kind).map(ParallelAxis::Ownership),
                other => invalid(format!("unsupported parallel axis semantics: {other}")),
            },
            _ => invalid("axis semantics must be a non-empty string"),
        })
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> std::result::Result<Self::Out, E> {
        M::checked(invalid(format!("{} {} must be a JSON object", self.label, self.index)))
    }
}

/// How a tensor's messages name its axes (formatted only for a message).
struct AxisLabel<'a, M>(&'a TensorSeed<M>);

impl<M> std::fmt::Display for AxisLabel<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.stored {
            true => write!(f, "stored tensor parallel_axes {}", self.0.index),
            false => f.write_str("placement tensor parallel axis"),
        }
    }
}

impl<M> TensorSeed<M> {
    /// The message for a wrong key set.
    fn schema(&self) -> String {
        match self.stored {
            false => format!("placement tensor {} schema fields do not match contract", self.index),
            true => "tensor descriptor schema fields do not match contract".to_string(),
        }
    }
}

/// A tensor's key slots.
fn tensor_slot(k: &str) -> Option<u32> {
    Some(match k {
        "tensor_id" => 0,
        "global_shape" => 1,
        "dtype" => 2,
        "itemsize" => 3,
        "shard_dims" => 4,
        "layout_fingerprint" => 5,
        "parallel_axes" => 6,
        "layer_id" => 7,
        "expert_id" => 8,
        _ => return None,
    })
}

impl<'de, M: Mode> Typed<'de> for TensorSeed<M> {
    type Out = M::Out<Arc<TensorDescriptor>>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.mode;
        let mut keys = Keys::default();
        let (mut id, mut dtype, mut fingerprint, mut itemsize) =
            (Held::default(), Held::default(), Held::default(), Held::default());
        let (mut layer, mut expert, mut shape, mut shard_dims) =
            (Held::default(), Held::default(), Held::default(), Held::default());
        let mut axes = None;
        while let Some(k) = keys.next(mode, &mut m, tensor_slot)? {
            match k {
                0 => id = mode.value(&mut m, Str)?,
                1 => shape = mode.value(&mut m, IntArray)?,
                2 => dtype = mode.value(&mut m, Str)?,
                3 => itemsize = mode.value(&mut m, UInt)?,
                4 => shard_dims = mode.value(&mut m, IntArray)?,
                5 => fingerprint = mode.value(&mut m, Str)?,
                6 => {
                    let label = AxisLabel(&self);
                    let each = Each(
                        mode,
                        |index| In(mode, AxisSeed { label: &label, index, mode }),
                        || match self.stored {
                            true => Error::invalid(format!("{label} must be a sequence")),
                            false => Error::invalid("parallel_axes must be a sequence"),
                        },
                    );
                    axes = Some(M::result(mode.value(&mut m, each)?));
                }
                7 => layer = mode.value(&mut m, OptUInt)?,
                _ => expert = mode.value(&mut m, OptUInt)?,
            }
        }
        let prefix = if self.stored { "stored tensor " } else { "" };
        let checked = (|| {
            if !keys.are(0x1ff) {
                return invalid(self.schema());
            }
            // The key set holds `parallel_axes`.
            let parallel_axes = axes.unwrap_or_else(|| invalid(self.schema()))?;
            // Integer tuples: the placement decoder reports a non-array as
            // `<field> must be a sequence`, the stored decoder as
            // `stored tensor <field> must contain integers` (`wire-format.md` §2.1, §4.1).
            let int_tuple = |ints: Held<typed::Dims>, name: &str, min: u64| {
                if !prefix.is_empty() && ints.is_not_array() {
                    return invalid(format!("{prefix}{name} must contain integers"));
                }
                Ok(ints.ints(format_args!("{prefix}{name}"), min)?.into_owned())
            };
            TensorDescriptor::new(TensorSpec {
                tensor_id: id.req_str(format_args!("{prefix}tensor_id"))?.into_owned(),
                global_shape: int_tuple(shape, "global_shape", 1)?,
                dtype: dtype.req_str(format_args!("{prefix}dtype"))?.into_owned(),
                itemsize: itemsize.req_int(format_args!("{prefix}itemsize"), 1)?,
                shard_dims: int_tuple(shard_dims, "shard_dims", 0)?,
                layout_fingerprint: fingerprint.req_str(format_args!("{prefix}layout_fingerprint"))?.into_owned(),
                parallel_axes,
                layer_id: layer.opt_int(format_args!("{prefix}layer_id"), 0)?,
                expert_id: expert.opt_int(format_args!("{prefix}expert_id"), 0)?,
            })
            .map(Arc::new)
        })();
        M::checked(checked)
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> std::result::Result<Self::Out, E> {
        M::checked(invalid(self.schema()))
    }
}
