//! Batching (`vmap`) as a graph transform: a function of one example becomes a function of a
//! batch of them.
//!
//! [`vmap`] takes a [`Func`], which of its parameters carry a leading batch dimension of a
//! given size, and returns a [`Func`] whose batched parameters have that extra leading
//! dimension and whose every output has it. Each value of the original function is either
//! *batched* (it gained the leading dimension) or not (it is the same for every example, as a
//! constant is); a per-op *batching rule* maps an instruction with some batched operands to
//! instructions on the batched values:
//!
//! - elementwise ops (from the op table's `ELEMENTWISE` property) and layout ops shift their
//!   dimension attributes by one (`rules`);
//! - reductions, windows, matrix products and convolutions move the batch dimension into a
//!   dimension the op already treats independently (a batching dimension of `dot_general`,
//!   the batch dimension of `convolution`, or its feature or batch groups when the kernel
//!   differs per example), so the batched program runs as one op (`rules`, `conv`);
//! - gathers, scatters and dynamic slices index with the example's own position (`index`);
//! - `while`, `case` and `sort` batch their regions; a loop whose condition depends on the
//!   example runs until every example is done, keeping each finished example's carries
//!   (`control`);
//! - the few cases no rule covers (a batched `rng_bit_generator` state, a per-example
//!   reduction start value or padding value) run the op once per example in a `while` loop
//!   (`sequential`): slower, never wrong.
//!
//! The result verifies, prints and differentiates like any other function, so `vmap`
//! composes with `grad`, `jvp` and itself in either order.

mod control;
mod conv;
mod index;
mod rules;
mod sequential;

use crate::locations::UserLines;
use crate::{Error, Result};
use kiln_ir::{Builder, Func, Inst, Loc, Op, TensorType, ValueId};

/// A value of the batched function standing for a value of the original: `batched` when it
/// has the extra leading batch dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BVal {
    pub v: ValueId,
    pub batched: bool,
}

/// The batched function of `f`: parameter `i` gains a leading dimension of `size` where
/// `batched[i]`, and every output has that leading dimension (outputs that do not depend on a
/// batched parameter are broadcast). `size` may be 0.
pub fn vmap(f: &Func, batched: &[bool], size: usize) -> Result<Func> {
    if batched.len() != f.params.len() {
        return Err(Error::BadRequest(format!(
            "@{} has {} parameter(s), {} batching flags given",
            f.name,
            f.params.len(),
            batched.len()
        )));
    }
    kiln_ir::verify(f).map_err(Error::Verify)?;
    if size == 0 {
        // No example: every output is empty, whatever the function computes.
        let mut bd = Batcher::new(&f.name, 0);
        for (t, &b) in f.param_types().iter().zip(batched) {
            let ty = if b { bd.batched_ty(t) } else { t.clone() };
            bd.b.param(ty);
        }
        let mut outs = Vec::with_capacity(f.outputs.len());
        for t in &f.output_types {
            let bt = bd.batched_ty(t);
            outs.push(bd.b.full(&bt, 0.0)?);
        }
        return Ok(UserLines::of(f).keep_only(bd.b.finish(&outs)?));
    }
    let outs = vec![true; f.outputs.len()];
    let g = batch_func(f, batched, size, Some(&outs), &f.name)?.0;
    Ok(UserLines::of(f).keep_only(g))
}

/// The batched function of `f` whose outputs are batched only where they depend on a batched
/// parameter, and which outputs those are (JAX's `out_axes=None` leaves the others as they
/// are). `size` may be 0: the outputs that depend on the batch are then empty, the others are
/// computed as for any batch (from parameters that do not depend on the examples).
pub fn vmap_as_needed(f: &Func, batched: &[bool], size: usize) -> Result<(Func, Vec<bool>)> {
    if batched.len() != f.params.len() {
        return Err(Error::BadRequest(format!(
            "@{} has {} parameter(s), {} batching flags given",
            f.name,
            f.params.len(),
            batched.len()
        )));
    }
    kiln_ir::verify(f).map_err(Error::Verify)?;
    if size > 0 {
        let (g, flags) = batch_func(f, batched, size, None, &f.name)?;
        return Ok((UserLines::of(f).keep_only(g), flags));
    }
    // No example: batch one placeholder example of zeros, which the outputs that do not
    // depend on the batch ignore, and give the others their empty batched types.
    let (one, flags) = batch_func(f, batched, 1, None, &f.name)?;
    let mut bd = Batcher::new(&f.name, 0);
    let mut args = Vec::with_capacity(batched.len());
    for (t, &b) in f.param_types().iter().zip(batched) {
        if b {
            bd.b.param(bd.batched_ty(t));
            let mut shape = vec![1];
            shape.extend(&t.shape);
            args.push(bd.b.full(&TensorType::new(t.dtype, shape), 0.0)?);
        } else {
            args.push(bd.b.param(t.clone()));
        }
    }
    let inner = bd.b.inline(&one, &args)?;
    let mut outs = Vec::with_capacity(inner.len());
    for ((v, &b), t) in inner.into_iter().zip(&flags).zip(&f.output_types) {
        outs.push(if b {
            let bt = bd.batched_ty(t);
            bd.b.full(&bt, 0.0)?
        } else {
            v
        });
    }
    Ok((UserLines::of(f).keep_only(bd.b.finish(&outs)?), flags))
}

/// The batching context: the function being built and the batch size.
pub(crate) struct Batcher {
    pub b: Builder,
    pub size: usize,
    /// Where the instruction being batched came from (the user's line, or none), for the
    /// instructions built for it.
    pub loc: Option<Loc>,
}

impl Batcher {
    pub fn new(name: &str, size: usize) -> Batcher {
        Batcher {
            b: Builder::new(name),
            size,
            loc: None,
        }
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> TensorType {
        self.b.ty(v).cloned().expect("built values have types")
    }

    /// `t` with the batch dimension in front.
    pub fn batched_ty(&self, t: &TensorType) -> TensorType {
        let mut shape = vec![self.size];
        shape.extend(&t.shape);
        TensorType::new(t.dtype, shape)
    }

    /// Adds an instruction at the current location, with declared result types if given.
    pub fn push(
        &mut self,
        op: Op,
        operands: &[ValueId],
        declared: Option<&[TensorType]>,
    ) -> Result<Vec<ValueId>> {
        Ok(self.b.push_at(op, operands, declared, self.loc)?)
    }

    /// Adds a single-result instruction.
    pub fn push1(
        &mut self,
        op: Op,
        operands: &[ValueId],
        declared: Option<TensorType>,
    ) -> Result<ValueId> {
        let d = declared.map(|t| vec![t]);
        Ok(self.push(op, operands, d.as_deref())?[0])
    }

    /// `x` with the batch dimension: itself when batched, else broadcast along a new leading
    /// dimension.
    pub fn materialize(&mut self, x: BVal) -> Result<ValueId> {
        if x.batched {
            return Ok(x.v);
        }
        let t = self.ty(x.v);
        let dims: Vec<i64> = (1..=t.rank() as i64).collect();
        let bt = self.batched_ty(&t);
        self.push1(
            Op::BroadcastInDim {
                broadcast_dimensions: dims,
            },
            &[x.v],
            Some(bt),
        )
    }

    /// A scalar constant.
    pub fn scalar(&mut self, dtype: kiln_ir::DType, x: f64) -> Result<ValueId> {
        Ok(self.b.scalar(dtype, x)?)
    }

    /// `transpose` moving dimension `from` of `v` to the front.
    pub fn batch_first(&mut self, v: ValueId, from: usize) -> Result<ValueId> {
        if from == 0 {
            return Ok(v);
        }
        let rank = self.ty(v).rank();
        let mut perm = vec![from as i64];
        perm.extend((0..rank as i64).filter(|&d| d != from as i64));
        self.push1(Op::Transpose { permutation: perm }, &[v], None)
    }
}

/// Batches `f` into a function of its own: parameters batched as `flags` say. With `force`,
/// output `i` is batched when `force[i]` (broadcast if it would not be); without, outputs are
/// batched where they depend on a batched parameter. Returns the function and which outputs
/// are batched.
pub(crate) fn batch_func(
    f: &Func,
    flags: &[bool],
    size: usize,
    force: Option<&[bool]>,
    name: &str,
) -> Result<(Func, Vec<bool>)> {
    let mut bd = Batcher::new(name, size);
    let args: Vec<BVal> = f
        .param_types()
        .iter()
        .zip(flags)
        .map(|(t, &batched)| {
            let ty = if batched { bd.batched_ty(t) } else { t.clone() };
            BVal {
                v: bd.b.param(ty),
                batched,
            }
        })
        .collect();
    let outs = batch_inline(&mut bd, f, &args)?;
    let mut values = Vec::with_capacity(outs.len());
    let mut out_flags = Vec::with_capacity(outs.len());
    for (i, o) in outs.iter().enumerate() {
        let want = force.map_or(o.batched, |fl| fl[i]);
        if want {
            values.push(bd.materialize(*o)?);
        } else {
            debug_assert!(!o.batched, "an output forced unbatched is batched");
            values.push(o.v);
        }
        out_flags.push(want);
    }
    Ok((bd.b.finish(&values)?, out_flags))
}

/// Adds the batched computation of `f` on `args` to `bd`; returns its outputs.
pub(crate) fn batch_inline(bd: &mut Batcher, f: &Func, args: &[BVal]) -> Result<Vec<BVal>> {
    let user = UserLines::of(f);
    let mut map: Vec<Option<BVal>> = vec![None; f.values.len()];
    for (&p, &a) in f.params.iter().zip(args) {
        map[p.index()] = Some(a);
    }
    for inst in &f.insts {
        let xs: Vec<BVal> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("the function is verified"))
            .collect();
        bd.loc = inst.loc;
        let first = bd.b.inst_count();
        let rs = batch_inst(bd, f, inst, &xs)?;
        user.locate_from(&mut bd.b, first, inst.loc);
        for (&r, v) in inst.results.iter().zip(rs) {
            map[r.index()] = Some(v);
        }
    }
    Ok(f.outputs
        .iter()
        .map(|o| map[o.index()].expect("the function is verified"))
        .collect())
}

/// The batched results of one instruction.
fn batch_inst(bd: &mut Batcher, f: &Func, inst: &Inst, xs: &[BVal]) -> Result<Vec<BVal>> {
    let result_types: Vec<TensorType> = inst
        .results
        .iter()
        .map(|r| f.values[r.index()].clone())
        .collect();
    if xs.iter().all(|x| !x.batched) {
        let operands: Vec<ValueId> = xs.iter().map(|x| x.v).collect();
        let rs = bd.push(inst.op.clone(), &operands, Some(&result_types))?;
        return Ok(rs.into_iter().map(|v| BVal { v, batched: false }).collect());
    }
    let inst_ctx = InstCtx {
        op: &inst.op,
        xs,
        x_types: inst
            .operands
            .iter()
            .map(|o| f.values[o.index()].clone())
            .collect(),
        result_types,
    };
    match &inst.op {
        Op::While { .. }
        | Op::Call { .. }
        | Op::Case { .. }
        | Op::Sort { .. }
        | Op::ReduceRegion { .. }
        | Op::ReduceWindowRegion { .. }
        | Op::Map { .. } => control::rule(bd, &inst_ctx),
        Op::Gather { .. }
        | Op::Scatter { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice {} => index::rule(bd, &inst_ctx),
        _ => rules::rule(bd, &inst_ctx),
    }
}

/// An instruction being batched: its op, its operands in the batched function, and the
/// original (per-example) operand and result types.
pub(crate) struct InstCtx<'a> {
    pub op: &'a Op,
    pub xs: &'a [BVal],
    pub x_types: Vec<TensorType>,
    pub result_types: Vec<TensorType>,
}

impl InstCtx<'_> {
    /// The batched per-example result types.
    pub fn batched_results(&self, bd: &Batcher) -> Vec<TensorType> {
        self.result_types.iter().map(|t| bd.batched_ty(t)).collect()
    }
}

/// Dimension numbers moved past the new leading batch dimension.
pub(crate) fn shifted(dims: &[i64]) -> Vec<i64> {
    dims.iter().map(|d| d + 1).collect()
}

/// `rest` with `first` in front (an attribute entry for the batch dimension).
pub(crate) fn prepend<T: Clone>(first: T, rest: &[T]) -> Vec<T> {
    let mut v = vec![first];
    v.extend_from_slice(rest);
    v
}

/// Every result batched.
pub(crate) fn all_batched(vs: Vec<ValueId>) -> Vec<BVal> {
    vs.into_iter().map(|v| BVal { v, batched: true }).collect()
}

/// How an op's batching rule runs a batch (reported in `ir-specs/status.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// As one op (or a few) over the whole batch, for every combination of batched operands.
    Whole,
    /// As one op, except in the case the text names, which runs once per example in a loop.
    LoopWhen(&'static str),
}

/// How [`vmap`] batches `k` (the rules above, as data for the status table).
pub fn batching(k: kiln_ir::OpKind) -> Batching {
    use kiln_ir::OpKind::*;
    match k {
        Pad => Batching::LoopWhen("the padding value differs per example"),
        Reduce | ReduceRegion | ReduceWindow | ReduceWindowRegion | SelectAndScatter => {
            Batching::LoopWhen("the init value differs per example")
        }
        RngBitGenerator => Batching::LoopWhen("the state differs per example"),
        Call => Batching::LoopWhen("an instruction of the callee does (it is batched in place)"),
        ReplicaId | PartitionId | AllGather | AllReduce | AllToAll | ReduceScatter
        | CollectivePermute | CollectiveBroadcast | CollectiveReduce => Batching::LoopWhen(
            "it is a collective (one per example, in the same order on every process)",
        ),
        Add | Subtract | Multiply | Divide | Remainder | Maximum | Minimum | Power | And | Or
        | Xor | ShiftLeft | ShiftRightLogical | ShiftRightArithmetic | Atan2 | Negate | Abs
        | Sign | Exponential | Log | LogPlusOne | ExponentialMinusOne | Sqrt | Rsqrt | Tanh
        | Logistic | Sine | Cosine | Tan | Cbrt | Erf | Floor | Ceil | RoundNearestAfz
        | RoundNearestEven | ReducePrecision | Popcnt | CountLeadingZeros | Not | IsFinite
        | Compare | Select | Clamp | Convert | BitcastConvert | Constant | Iota
        | BroadcastInDim | Reshape | Transpose | Slice | DynamicSlice | DynamicUpdateSlice
        | Concatenate | Reverse | DotGeneral | Gather | Scatter | OptimizationBarrier | While
        | Case | Sort | Map | Cholesky | TriangularSolve | Lu | Real | Imag | Complex | Fft
        | Convolution => Batching::Whole,
    }
}
