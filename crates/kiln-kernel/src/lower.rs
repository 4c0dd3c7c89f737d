//! Lowering: the kernel computing each op (see [`lower`]), with its loads at affine index
//! maps of the loop variables.

use crate::ir::{Cond, ConvPatches, Ew, Expr, Idx, Kernel, Schedule};
use crate::window::{WindowDim, window_terms};
use kiln_ir::{Combiner, DType, Func, Inst, Op, OpKind, TensorType, ValueId, strides};

/// A load of `ty` where operand dimension `d` is indexed by `map[d]`: `Some((var, scale,
/// offset))` for `offset + scale * var`, or `None` for index 0.
fn load(input: usize, ty: &TensorType, vars: usize, map: &[Option<(usize, i64, i64)>]) -> Expr {
    let st = strides(&ty.shape);
    let mut coef = vec![0i64; vars];
    let mut off = 0i64;
    for (d, m) in map.iter().enumerate() {
        if let Some((v, scale, o)) = m {
            coef[*v] += scale * st[d] as i64;
            off += o * st[d] as i64;
        }
    }
    Expr::Load {
        input,
        dtype: ty.dtype,
        coef,
        off,
    }
}

/// A load of `ty` at the same position as the output (or position 0 for a scalar operand).
fn same(input: usize, ty: &TensorType, out: &TensorType, vars: usize) -> Expr {
    if ty.rank() == 0 && out.rank() > 0 {
        return load(input, ty, vars, &[]);
    }
    load(
        input,
        ty,
        vars,
        &(0..ty.rank()).map(|d| Some((d, 1, 0))).collect::<Vec<_>>(),
    )
}

/// Whether a GEMM reads operands of types `a` and `b` for a result of `dtype`: of that dtype,
/// or both bf16 or both f16 for an f32 result (a GPU's tensor cores, see
/// `canon::widen_dots`). Other products into a wider type (`f32 x f32 -> f64`, which the
/// pipeline converts first) take the elementwise kernel, which converts its operands.
fn gemm_operands(a: &TensorType, b: &TensorType, dtype: DType) -> bool {
    let half =
        dtype == DType::F32 && a.dtype == b.dtype && matches!(a.dtype, DType::BF16 | DType::F16);
    half || (a.dtype == dtype && b.dtype == dtype)
}

/// Whether `op` on operands of types `x` giving `out` is lowered to a byte copy: a bitcast
/// that is not element for element (32- or 64-bit elements of one shape, or sub-byte
/// integers, which hold their value sign- or zero-extended in a byte each and convert it):
/// one between widths, of 8- or 16-bit types, or of complex numbers. Its kernel ([`lower`])
/// writes the result's bytes (`i8[bytes]`, whatever the result's type) from its operand's,
/// read as bytes (`i8`) at the same positions, whatever the operand's type; so its positions
/// are bytes, even where the two types are of one width (`u8` to `i8`).
///
/// This is the one test of a byte copy: fusion neither merges one with siblings nor
/// computes one inside its users or its operands inside it (`fuse::merge`,
/// `fuse::inlinable`), and the device plan has the GPU read its input as bytes
/// (`gpu::plan::KernelStep::bytes`).
pub fn byte_copy(op: &Op, x: &[TensorType], out: &TensorType) -> bool {
    matches!(op, Op::BitcastConvert {}) && x.first().is_some_and(|x| copies_bytes(x, out))
}

/// [`byte_copy`] for instruction `inst` of `f`.
pub fn is_byte_copy(f: &Func, inst: &Inst) -> bool {
    let ty = |v: Option<&ValueId>| v.map(|v| &f.values[v.index()]);
    match (
        &inst.op,
        ty(inst.operands.first()),
        ty(inst.results.first()),
    ) {
        (Op::BitcastConvert {}, Some(x), Some(out)) => copies_bytes(x, out),
        _ => false,
    }
}

/// Whether a bitcast of `x` to `out` copies bytes (see [`byte_copy`]).
fn copies_bytes(x: &TensorType, out: &TensorType) -> bool {
    let element_for_element = !x.dtype.is_complex()
        && !out.dtype.is_complex()
        && x.shape == out.shape
        && x.dtype.bits() == out.dtype.bits()
        && (matches!(out.dtype.bits(), 32 | 64) || out.dtype.is_sub_byte());
    !element_for_element
}

/// Which elementwise ops the CPU kernels implement for operand dtype `d`.
pub fn elementwise_supported(k: OpKind, d: DType) -> bool {
    use OpKind::*;
    if d.is_complex() {
        // Complex values run on the reference interpreter (see `lower`).
        return false;
    }
    match k {
        Power => d != DType::Pred,
        Add | Subtract | Multiply | Divide | Remainder | Maximum | Minimum | And | Or | Xor
        | ShiftLeft | ShiftRightLogical | ShiftRightArithmetic | Atan2 | Negate | Abs | Sign
        | Exponential | Log | LogPlusOne | ExponentialMinusOne | Sqrt | Rsqrt | Tanh | Logistic
        | Sine | Cosine | Tan | Cbrt | Erf | Floor | Ceil | RoundNearestAfz | RoundNearestEven
        | Popcnt | CountLeadingZeros | Not | IsFinite | Compare | Select | Clamp | Convert => true,
        _ => false,
    }
}

/// Why an op has no kernel, in words the dumps can print: it then runs on the reference
/// interpreter or, for a constant or a pass-through, runs nothing at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoKernel(pub &'static str);

impl std::fmt::Display for NoKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// The kernel computing one instruction, or why there is none (the executable then runs that
/// instruction on the reference interpreter). Every op is a case of its own: a new op must
/// say here whether and how it becomes a kernel.
pub fn lower(op: &Op, x: &[TensorType], out: &TensorType) -> Result<Kernel, NoKernel> {
    let r = out.rank();
    let kernel = |vars: usize, body: Expr| {
        Ok(Kernel {
            schedule: Schedule::Nest,
            out: out.clone(),
            vars,
            body,
            extra: Vec::new(),
        })
    };
    // A bitcast keeps its bytes (a complex number is its real part, then its imaginary part,
    // in its part type): the byte copy below, which computes nothing on complex values.
    let complex = x.iter().chain([out]).any(|t| t.dtype.is_complex());
    if complex && !matches!(op, Op::BitcastConvert {}) {
        return Err(NoKernel(
            "complex numbers: the kernels compute on real numbers only, so an instruction with \
             a complex operand or result runs on the reference interpreter",
        ));
    }
    match op {
        Op::Real {} | Op::Imag {} | Op::Complex {} => Err(NoKernel(
            "the parts of a complex number: runs on the reference interpreter with the complex \
             values around it",
        )),
        Op::Add {}
        | Op::Subtract {}
        | Op::Multiply {}
        | Op::Divide {}
        | Op::Remainder {}
        | Op::Maximum {}
        | Op::Minimum {}
        | Op::Power {}
        | Op::And {}
        | Op::Or {}
        | Op::Xor {}
        | Op::ShiftLeft {}
        | Op::ShiftRightLogical {}
        | Op::ShiftRightArithmetic {}
        | Op::Atan2 {}
        | Op::Negate {}
        | Op::Abs {}
        | Op::Sign {}
        | Op::Exponential {}
        | Op::Log {}
        | Op::LogPlusOne {}
        | Op::ExponentialMinusOne {}
        | Op::Sqrt {}
        | Op::Rsqrt {}
        | Op::Tanh {}
        | Op::Logistic {}
        | Op::Sine {}
        | Op::Cosine {}
        | Op::Erf {}
        | Op::Floor {}
        | Op::Ceil {}
        | Op::RoundNearestAfz {}
        | Op::RoundNearestEven {}
        | Op::Tan {}
        | Op::Cbrt {}
        | Op::Popcnt {}
        | Op::CountLeadingZeros {}
        | Op::Not {}
        | Op::IsFinite {}
        | Op::Compare { .. }
        | Op::Select {}
        | Op::Clamp {}
        | Op::Convert {} => elementwise(op, x, out),
        Op::Constant { .. } => Err(NoKernel("a constant: the program holds its value")),
        Op::ReducePrecision { .. } => Err(NoKernel(
            "bit arithmetic that canonicalization expands into integer ops; kept only where it \
             did not run",
        )),
        Op::OptimizationBarrier {} => Err(NoKernel("a pass-through: its results are its operands")),
        Op::Call { .. } => Err(NoKernel(
            "a call: the pipeline inlines calls before it lowers a program",
        )),
        Op::While { .. } | Op::Case { .. } => Err(NoKernel(
            "control flow: the host runs it, each region compiled as a program of its own",
        )),
        Op::Map { .. } => Err(NoKernel(
            "a map whose computation is not elementwise ops and scalar constants: the host runs \
             the computation, compiled as a region, per element (canonicalization expands the \
             others into elementwise ops)",
        )),
        Op::ReduceRegion { dimensions, body } if crate::fold::fold_body(body).is_ok() => {
            crate::fold::lower_reduce_region(dimensions, body, x)
        }
        Op::ReduceWindowRegion { body, .. } if crate::fold::fold_body(body).is_ok() => {
            crate::fold::lower_reduce_window_region(op, x, out)
        }
        Op::ReduceRegion { .. } | Op::ReduceWindowRegion { .. } => Err(NoKernel(
            "a reduction with a body of other than elementwise ops and scalar constants: the \
             host folds the body, compiled as a region, per element",
        )),
        Op::Sort { .. } => Err(NoKernel(
            "a sort: the host runs it (by keys, or with its comparator compiled as a region)",
        )),
        Op::ReplicaId {}
        | Op::PartitionId {}
        | Op::AllGather { .. }
        | Op::AllReduce { .. }
        | Op::AllToAll { .. }
        | Op::ReduceScatter { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveBroadcast { .. }
        | Op::CollectiveReduce { .. } => Err(NoKernel(
            "a collective: the host exchanges the values with the other processes of the grid",
        )),
        Op::Fft { .. } => Err(NoKernel(
            "a Fourier transform, which the pipeline expands into matrix products before \
             lowering (`crate::fft`)",
        )),
        Op::Cholesky { .. } | Op::TriangularSolve { .. } | Op::Lu {} => Err(NoKernel(
            "linear algebra: the host runs it as a blocked factorization or substitution whose \
             updates are matrix products",
        )),
        Op::RngBitGenerator { .. } => Err(NoKernel(
            "a generator with two results, run by the interpreter where canonicalization did not \
             expand it",
        )),
        Op::BroadcastInDim {
            broadcast_dimensions,
        } => {
            let map: Vec<_> = (0..x[0].rank())
                .map(|i| (x[0].shape[i] != 1).then_some((broadcast_dimensions[i] as usize, 1, 0)))
                .collect();
            kernel(r, load(0, &x[0], r, &map))
        }
        Op::Transpose { permutation } => {
            let mut map = vec![None; r];
            for (i, &p) in permutation.iter().enumerate() {
                map[p as usize] = Some((i, 1, 0));
            }
            kernel(r, load(0, &x[0], r, &map))
        }
        Op::Slice {
            start_indices,
            strides: step,
            ..
        } => {
            let map: Vec<_> = (0..r)
                .map(|d| Some((d, step[d], start_indices[d])))
                .collect();
            kernel(r, load(0, &x[0], r, &map))
        }
        Op::Reverse { dimensions } => {
            let map: Vec<_> = (0..r)
                .map(|d| {
                    if dimensions.contains(&(d as i64)) {
                        Some((d, -1, x[0].shape[d] as i64 - 1))
                    } else {
                        Some((d, 1, 0))
                    }
                })
                .collect();
            kernel(r, load(0, &x[0], r, &map))
        }
        Op::Reshape {} => {
            // Same row-major order: the operand's linear index is the output's.
            let ost = strides(&out.shape);
            let coef = ost.iter().map(|&s| s as i64).collect();
            kernel(
                r,
                Expr::Load {
                    input: 0,
                    dtype: x[0].dtype,
                    coef,
                    off: 0,
                },
            )
        }
        Op::Iota { iota_dimension } => kernel(
            r,
            Expr::Op {
                op: Ew::Convert,
                dtype: out.dtype,
                args: vec![Expr::Iota {
                    var: *iota_dimension as usize,
                    dtype: DType::I64,
                }],
            },
        ),
        Op::Reduce { dimensions, kind } => {
            let vars = r + dimensions.len();
            let mut map = Vec::new();
            let (mut o, mut red) = (0, 0);
            let mut rvars = Vec::new();
            for d in 0..x[0].rank() {
                if dimensions.contains(&(d as i64)) {
                    map.push(Some((r + red, 1, 0)));
                    rvars.push((r + red, x[0].shape[d]));
                    red += 1;
                } else {
                    map.push(Some((o, 1, 0)));
                    o += 1;
                }
            }
            let body = load(0, &x[0], vars, &map);
            let init = load(1, &x[1], vars, &[]);
            kernel(
                vars,
                Expr::Reduce {
                    kind: *kind,
                    dtype: out.dtype,
                    init: Box::new(init),
                    vars: rvars,
                    body: Box::new(body),
                },
            )
        }
        Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } if out.numel() > 0
            && matches!(out.dtype, DType::F32 | DType::F64)
            && gemm_operands(&x[0], &x[1], out.dtype) =>
        {
            let layout = matmul_layout(lb, rb, lc, rc, &x[0], &x[1]).ok_or(NoKernel(
                "a matrix product whose operands the GEMM cannot read in place",
            ))?;
            let [batch, m, k, n] = layout.dims;
            Ok(Kernel {
                schedule: Schedule::Gemm {
                    epilogue: None,
                    batch,
                    m,
                    n,
                    k,
                    conv: None,
                    a_trans: layout.a_trans,
                    b_trans: layout.b_trans,
                    chain: None,
                    strides: [None, None],
                    store: None,
                    zero: None,
                    unread: None,
                },
                out: out.clone(),
                vars: 0,
                body: Expr::Const {
                    dtype: out.dtype,
                    value: 0.0,
                },
                extra: Vec::new(),
            })
        }
        Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } => {
            let vars = r + lc.len();
            let free = |rank: usize, a: &[i64], c: &[i64]| -> Vec<usize> {
                (0..rank)
                    .filter(|d| !a.contains(&(*d as i64)) && !c.contains(&(*d as i64)))
                    .collect()
            };
            let (lf, rf) = (free(x[0].rank(), lb, lc), free(x[1].rank(), rb, rc));
            let nb = lb.len();
            let mut lmap = vec![None; x[0].rank()];
            let mut rmap = vec![None; x[1].rank()];
            for i in 0..nb {
                lmap[lb[i] as usize] = Some((i, 1, 0));
                rmap[rb[i] as usize] = Some((i, 1, 0));
            }
            for (j, &d) in lf.iter().enumerate() {
                lmap[d] = Some((nb + j, 1, 0));
            }
            for (j, &d) in rf.iter().enumerate() {
                rmap[d] = Some((nb + lf.len() + j, 1, 0));
            }
            let mut rvars = Vec::new();
            for (c, (&a, &b)) in lc.iter().zip(rc).enumerate() {
                lmap[a as usize] = Some((r + c, 1, 0));
                rmap[b as usize] = Some((r + c, 1, 0));
                rvars.push((r + c, x[0].shape[a as usize]));
            }
            // Operands of another dtype (bf16 x bf16 -> f32 kept for a GPU's tensor cores, here
            // with an empty result) are converted, exactly, to the result's.
            let operand = |i: usize, t: &TensorType, map: &[Option<(usize, i64, i64)>]| {
                let l = load(i, t, vars, map);
                if t.dtype == out.dtype {
                    l
                } else {
                    Expr::Op {
                        op: Ew::Convert,
                        dtype: out.dtype,
                        args: vec![l],
                    }
                }
            };
            let prod = Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype: out.dtype,
                args: vec![operand(0, &x[0], &lmap), operand(1, &x[1], &rmap)],
            };
            let zero = Expr::Const {
                dtype: out.dtype,
                value: 0.0,
            };
            kernel(
                vars,
                Expr::Reduce {
                    kind: Combiner::Add,
                    dtype: out.dtype,
                    init: Box::new(zero),
                    vars: rvars,
                    body: Box::new(prod),
                },
            )
        }
        // Bits of a `pred` are no bytes to copy: `bits::expand_pred_bitcasts` computes these
        // by shifts and masks before lowering.
        Op::BitcastConvert {} if x[0].dtype.is_pred() != out.dtype.is_pred() => Err(NoKernel(
            "a bitcast to or from pred (computed by shifts and masks before lowering)",
        )),
        Op::BitcastConvert {} if !byte_copy(op, x, out) => kernel(
            r,
            Expr::Op {
                op: Ew::Bitcast,
                dtype: out.dtype,
                args: vec![same(0, &x[0], out, r)],
            },
        ),
        // Any other bitcast keeps the buffer's little-endian bytes as they are: a byte copy
        // (see [`byte_copy`]).
        Op::BitcastConvert {} => {
            let bytes = out.numel() * out.dtype.bytes();
            Ok(Kernel {
                schedule: Schedule::Nest,
                out: TensorType::new(DType::I8, [bytes]),
                vars: 1,
                body: Expr::Gather {
                    input: 0,
                    dtype: DType::I8,
                    index: vec![Idx::Var(0)],
                    strides: vec![1],
                },
                extra: Vec::new(),
            })
        }
        Op::SelectAndScatter {
            window_dimensions,
            window_strides,
            padding,
            select,
            kind,
        } => {
            let grid = x[1].shape.clone();
            let body = same(1, &x[1], &x[1], r);
            Ok(Kernel {
                schedule: Schedule::SelectScatter {
                    grid,
                    window: window_dimensions.iter().map(|&w| w as usize).collect(),
                    strides: window_strides.clone(),
                    pad_low: padding.iter().map(|p| p.0).collect(),
                    select: *select,
                    kind: *kind,
                },
                out: out.clone(),
                vars: 2 * r,
                body,
                extra: Vec::new(),
            })
        }
        Op::Scatter {
            update_window_dims: uwd,
            inserted_window_dims: iwd,
            scatter_dims_to_operand_dims: sdod,
            index_vector_dim,
            kind,
            input_batching_dims: ibd,
            scatter_indices_batching_dims: sibd,
        } => {
            let (a, si, u) = (&x[0], &x[1], &x[2]);
            let ivd = *index_vector_dim as usize;
            let ru = u.rank();
            let batch_vars: Vec<usize> = (0..ru).filter(|d| !uwd.contains(&(*d as i64))).collect();
            let window_dims: Vec<usize> = (0..a.rank())
                .filter(|d| !iwd.contains(&(*d as i64)) && !ibd.contains(&(*d as i64)))
                .collect();
            let mut target = Vec::new();
            for d in 0..a.rank() {
                let mut parts = Vec::new();
                if let Some(k) = ibd.iter().position(|&b| b as usize == d) {
                    parts.push(Idx::Var(batch_vars[batch_position(sibd[k], ivd)]));
                }
                if let Some(k) = sdod.iter().position(|&s| s as usize == d) {
                    let mut pos: Vec<Idx> = batch_vars.iter().map(|&v| Idx::Var(v)).collect();
                    if ivd < si.rank() {
                        pos.insert(ivd, Idx::Const(k as i64));
                    }
                    parts.push(Idx::Value(Box::new(gather(1, si, pos))));
                }
                if let Some(j) = window_dims.iter().position(|&w| w == d) {
                    parts.push(Idx::Var(uwd[j] as usize));
                }
                target.push(if parts.is_empty() {
                    Idx::Const(0)
                } else {
                    Idx::Add(parts)
                });
            }
            let body = same(2, u, u, ru);
            Ok(Kernel {
                schedule: Schedule::Scatter {
                    updates: u.shape.clone(),
                    target,
                    kind: *kind,
                },
                out: out.clone(),
                vars: ru,
                body,
                extra: Vec::new(),
            })
        }
        Op::Pad {
            edge_padding_low: lo,
            interior_padding: int,
            ..
        } => {
            let (mut conds, mut index) = (Vec::new(), Vec::new());
            for d in 0..r {
                // A pad is a window of one element: interior padding dilates the input.
                let dim = WindowDim {
                    size: x[0].shape[d] as i64,
                    stride: 1,
                    pad_lo: lo[d],
                    base_dilation: int[d] + 1,
                    window_dilation: 1,
                };
                let p = Idx::var_plus(d, -lo[d]);
                conds.extend(dim.holds_element(&p));
                index.push(dim.element(p));
            }
            let inside = gather(0, &x[0], index);
            kernel(
                r,
                Expr::Guard {
                    conds,
                    then: Box::new(inside),
                    otherwise: Box::new(load(1, &x[1], r, &[])),
                },
            )
        }
        Op::Concatenate { dimension } => {
            let d = *dimension as usize;
            let mut offsets = Vec::new();
            let mut acc = 0i64;
            for t in x {
                offsets.push(acc);
                acc += t.shape[d] as i64;
            }
            // A balanced tree of guards on o_d picks the operand in O(log operands) tests.
            let piece = |i: usize| {
                let index = (0..r)
                    .map(|e| {
                        if e == d {
                            Idx::var_plus(e, -offsets[i])
                        } else {
                            Idx::Var(e)
                        }
                    })
                    .collect();
                gather(i, &x[i], index)
            };
            fn tree(
                lo: usize,
                hi: usize,
                d: usize,
                offsets: &[i64],
                piece: &dyn Fn(usize) -> Expr,
            ) -> Expr {
                if hi - lo == 1 {
                    return piece(lo);
                }
                let mid = (lo + hi) / 2;
                Expr::Guard {
                    conds: vec![Cond::InRange(Idx::Var(d), 0, offsets[mid])],
                    then: Box::new(tree(lo, mid, d, offsets, piece)),
                    otherwise: Box::new(tree(mid, hi, d, offsets, piece)),
                }
            }
            let body = tree(0, x.len(), d, &offsets, &piece);
            kernel(r, body)
        }
        Op::DynamicSlice { slice_sizes } => {
            let index = (0..r)
                .map(|d| {
                    let start = Idx::Clamp(
                        Box::new(Idx::Value(Box::new(load(1 + d, &x[1 + d], r, &[])))),
                        0,
                        x[0].shape[d] as i64 - slice_sizes[d],
                    );
                    Idx::Add(vec![start, Idx::Var(d)])
                })
                .collect();
            kernel(r, gather(0, &x[0], index))
        }
        Op::DynamicUpdateSlice {} => {
            let (mut conds, mut index) = (Vec::new(), Vec::new());
            for d in 0..r {
                let start = Idx::Clamp(
                    Box::new(Idx::Value(Box::new(load(2 + d, &x[2 + d], r, &[])))),
                    0,
                    (x[0].shape[d] - x[1].shape[d]) as i64,
                );
                let p = Idx::Add(vec![Idx::Var(d), Idx::Mul(Box::new(start), -1)]);
                conds.push(Cond::InRange(p.clone(), 0, x[1].shape[d] as i64));
                index.push(p);
            }
            kernel(
                r,
                Expr::Guard {
                    conds,
                    then: Box::new(gather(1, &x[1], index)),
                    otherwise: Box::new(same(0, &x[0], out, r)),
                },
            )
        }
        Op::Gather {
            offset_dims,
            collapsed_slice_dims,
            start_index_map,
            index_vector_dim,
            slice_sizes,
            operand_batching_dims: obd,
            start_indices_batching_dims: sibd,
        } => {
            let (a, si) = (&x[0], &x[1]);
            let ivd = *index_vector_dim as usize;
            let batch_vars: Vec<usize> = (0..r)
                .filter(|d| !offset_dims.contains(&(*d as i64)))
                .collect();
            let window_dims: Vec<usize> = (0..a.rank())
                .filter(|d| {
                    !collapsed_slice_dims.contains(&(*d as i64)) && !obd.contains(&(*d as i64))
                })
                .collect();
            let mut index = Vec::new();
            for (d, (&size, &slice)) in a.shape.iter().zip(slice_sizes).enumerate() {
                let mut parts = Vec::new();
                if let Some(k) = obd.iter().position(|&b| b as usize == d) {
                    // The batch position along the paired dimension of the indices.
                    parts.push(Idx::Var(batch_vars[batch_position(sibd[k], ivd)]));
                }
                if let Some(k) = start_index_map.iter().position(|&s| s as usize == d) {
                    // Position in start_indices: the batch variables with k at index_vector_dim.
                    let mut pos: Vec<Idx> = batch_vars.iter().map(|&v| Idx::Var(v)).collect();
                    if ivd < si.rank() {
                        pos.insert(ivd, Idx::Const(k as i64));
                    }
                    let sv = gather(1, si, pos);
                    parts.push(Idx::Clamp(
                        Box::new(Idx::Value(Box::new(sv))),
                        0,
                        size as i64 - slice,
                    ));
                }
                if let Some(j) = window_dims.iter().position(|&w| w == d) {
                    parts.push(Idx::Var(offset_dims[j] as usize));
                }
                index.push(if parts.is_empty() {
                    Idx::Const(0)
                } else {
                    Idx::Add(parts)
                });
            }
            kernel(r, gather(0, a, index))
        }
        Op::Convolution {
            window_strides,
            rhs_dilation,
            output_dims,
            ..
        } if is_gemm_conv(op)
            && out.numel() > 0
            && matches!(out.dtype, DType::F32 | DType::F64)
            && x.iter().all(|t| t.dtype == out.dtype) =>
        {
            let (a, w) = (&x[0].shape, &x[1].shape);
            let planes = output_dims[..] == GEMM_CONV_PLANES;
            // [N, OH, OW, O] or [N, O, OH, OW].
            let (oh, ow, o) = if planes {
                (out.shape[2], out.shape[3], out.shape[1])
            } else {
                (out.shape[1], out.shape[2], out.shape[3])
            };
            let patches = ConvPatches {
                h: a[1],
                w: a[2],
                c: a[3],
                oh,
                ow,
                kh: w[0],
                kw: w[1],
                stride: [window_strides[0] as usize, window_strides[1] as usize],
                dilation: [rhs_dilation[0] as usize, rhs_dilation[1] as usize],
                planes,
            };
            let (batch, m) = if planes {
                (out.shape[0], oh * ow)
            } else {
                (1, out.shape[0] * oh * ow)
            };
            Ok(Kernel {
                schedule: Schedule::Gemm {
                    epilogue: None,
                    batch,
                    m,
                    n: o,
                    k: w[0] * w[1] * w[2],
                    conv: Some(patches),
                    a_trans: false,
                    b_trans: false,
                    chain: None,
                    strides: [None, None],
                    store: None,
                    zero: None,
                    unread: None,
                },
                out: out.clone(),
                vars: 0,
                body: Expr::Const {
                    dtype: out.dtype,
                    value: 0.0,
                },
                extra: Vec::new(),
            })
        }
        Op::Convolution {
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            feature_group_count,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count,
        } => {
            let (a, w) = (&x[0], &x[1]);
            let sp = a.rank() - 2;
            let k_in = w.shape[kernel_dims[1] as usize];
            let k_out = w.shape[kernel_dims[0] as usize] as i64;
            let per_group = (k_out / feature_group_count).max(1);
            let per_batch_group = (k_out / batch_group_count).max(1);
            // Reduction variables: input feature within the group, then kernel spatial positions.
            let ic = r;
            let kv = |i: usize| r + 1 + i;
            let vars = r + 1 + sp;
            let ob = output_dims[0] as usize;
            let of = output_dims[1] as usize;
            let mut li = vec![Idx::Const(0); a.rank()];
            let mut wi = vec![Idx::Const(0); w.rank()];
            // Output feature group g of a batch-grouped convolution reads the g-th run of
            // result-batch-many input batch elements.
            li[input_dims[0] as usize] = if *batch_group_count == 1 {
                Idx::Var(ob)
            } else {
                Idx::Add(vec![
                    Idx::Var(ob),
                    Idx::Mul(
                        Box::new(Idx::Div(Box::new(Idx::Var(of)), per_batch_group)),
                        out.shape[ob] as i64,
                    ),
                ])
            };
            li[input_dims[1] as usize] = Idx::Add(vec![
                Idx::Mul(
                    Box::new(Idx::Div(Box::new(Idx::Var(of)), per_group)),
                    k_in as i64,
                ),
                Idx::Var(ic),
            ]);
            wi[kernel_dims[0] as usize] = Idx::Var(of);
            wi[kernel_dims[1] as usize] = Idx::Var(ic);
            let mut conds = Vec::new();
            for i in 0..sp {
                let dim = WindowDim {
                    size: a.shape[input_dims[2 + i] as usize] as i64,
                    stride: window_strides[i],
                    pad_lo: padding[i].0,
                    base_dilation: lhs_dilation[i],
                    window_dilation: rhs_dilation[i],
                };
                let pos = dim.position(Idx::Var(output_dims[2 + i] as usize), Idx::Var(kv(i)));
                conds.extend(dim.holds_element(&pos));
                li[input_dims[2 + i] as usize] = dim.element(pos);
                wi[kernel_dims[2 + i] as usize] = Idx::Var(kv(i));
            }
            // Operands of a narrower type (`i8 x i8 -> i32`; the pipeline converts them first,
            // but a kernel lowered as given) are converted, exactly, to the result's.
            let widened = |e: Expr, t: &TensorType| {
                if t.dtype == out.dtype {
                    e
                } else {
                    Expr::Op {
                        op: Ew::Convert,
                        dtype: out.dtype,
                        args: vec![e],
                    }
                }
            };
            let weight = widened(gather(1, w, wi), w);
            let prod = Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype: out.dtype,
                args: vec![widened(gather(0, a, li), a), weight.clone()],
            };
            let zero = Expr::Const {
                dtype: out.dtype,
                value: 0.0,
            };
            // Padding and dilation holes are zeros that multiply the weight like any input
            // element (StableHLO pads, then multiplies): against an infinite weight, NaN.
            let padded = Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype: out.dtype,
                args: vec![zero.clone(), weight],
            };
            let body = Expr::Guard {
                conds,
                then: Box::new(prod),
                otherwise: Box::new(padded),
            };
            let mut rvars = vec![(ic, k_in)];
            rvars.extend((0..sp).map(|i| (kv(i), w.shape[kernel_dims[2 + i] as usize])));
            kernel(
                vars,
                Expr::Reduce {
                    kind: Combiner::Add,
                    dtype: out.dtype,
                    init: Box::new(zero),
                    vars: rvars,
                    body: Box::new(body),
                },
            )
        }
        Op::ReduceWindow {
            window_dimensions: wd,
            window_strides: ws,
            base_dilations: bd,
            window_dilations: wdl,
            padding,
            kind,
        } => {
            let a = &x[0];
            let vars = r + r;
            let (conds, index) = window_terms(r, &a.shape, ws, bd, wdl, padding);
            let init = load(1, &x[1], vars, &[]);
            let body = Expr::Guard {
                conds,
                then: Box::new(gather(0, a, index)),
                otherwise: Box::new(init.clone()),
            };
            let rvars = (0..r).map(|d| (r + d, wd[d] as usize)).collect();
            kernel(
                vars,
                Expr::Reduce {
                    kind: *kind,
                    dtype: out.dtype,
                    init: Box::new(init),
                    vars: rvars,
                    body: Box::new(body),
                },
            )
        }
    }
}

/// The kernel of an elementwise op: the op applied to its operands at the output's position.
fn elementwise(op: &Op, x: &[TensorType], out: &TensorType) -> Result<Kernel, NoKernel> {
    let (r, k) = (out.rank(), op.kind());
    let ew = Ew::of(op);
    let operand_dtype = x[ew.typed_operand()].dtype;
    if !elementwise_supported(k, operand_dtype) {
        return Err(NoKernel(
            "an elementwise op the kernels lack for its operand dtype",
        ));
    }
    let args: Vec<Expr> = x
        .iter()
        .enumerate()
        .map(|(i, t)| same(i, t, out, r))
        .collect();
    if ew == Ew::Convert && (x[0].dtype.mini().is_some() || out.dtype.mini().is_some()) {
        // Small floats: integer ops on the bits (`minifloat.rs`).
        return Ok(Kernel {
            schedule: Schedule::Nest,
            out: out.clone(),
            vars: r,
            body: crate::minifloat::convert(args[0].clone(), out.dtype),
            extra: Vec::new(),
        });
    }
    Ok(Kernel {
        schedule: Schedule::Nest,
        out: out.clone(),
        vars: r,
        body: Expr::Op {
            op: ew,
            dtype: out.dtype,
            args,
        },
        extra: Vec::new(),
    })
}

/// The dimension numbers of the convolutions the GEMM runs directly: input `[N, H, W, C]`
/// (already padded), kernel `[KH, KW, C, O]` (a `[KH*KW*C, O]` matrix as it stands), output
/// `[N, OH, OW, O]` (the `[N*OH*OW, O]` product as it stands) or `[N, O, OH, OW]` (see
/// [`GEMM_CONV_PLANES`]).
pub const GEMM_CONV_INPUT: [i64; 4] = [0, 3, 1, 2];
/// Kernel dimension numbers of the GEMM convolution (see [`GEMM_CONV_INPUT`]).
pub const GEMM_CONV_KERNEL: [i64; 4] = [3, 2, 0, 1];
/// Output dimension numbers of the GEMM convolution (see [`GEMM_CONV_INPUT`]).
pub const GEMM_CONV_OUTPUT: [i64; 4] = [0, 3, 1, 2];
/// The other output dimension numbers the GEMM writes directly: `[N, O, OH, OW]` (NCHW), each
/// image's product stored by columns, one plane per output feature.
pub const GEMM_CONV_PLANES: [i64; 4] = [0, 1, 2, 3];

/// Whether `op` is a convolution the GEMM runs directly: the layouts above (either output
/// layout), no padding, no input dilation, one feature group.
pub fn is_gemm_conv(op: &Op) -> bool {
    matches!(op, Op::Convolution {
        padding,
        lhs_dilation,
        feature_group_count,
        batch_group_count,
        input_dims,
        kernel_dims,
        output_dims,
        ..
    } if input_dims[..] == GEMM_CONV_INPUT
        && kernel_dims[..] == GEMM_CONV_KERNEL
        && (output_dims[..] == GEMM_CONV_OUTPUT || output_dims[..] == GEMM_CONV_PLANES)
        && padding.iter().all(|&p| p == (0, 0))
        && lhs_dilation.iter().all(|&d| d == 1)
        && *feature_group_count == 1
        && *batch_group_count == 1)
}

/// A dot_general the GEMM reads in place: `[batch, m, k]` or `[batch, k, m]` times
/// `[batch, k, n]` or `[batch, n, k]` row-major matrices, each of `batch`, `m`, `k` and `n` a
/// run of consecutive dimensions in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulLayout {
    /// Batch size, rows, contraction length, columns.
    pub dims: [usize; 4],
    /// The lhs is stored `[batch, k, m]`.
    pub a_trans: bool,
    /// The rhs is stored `[batch, n, k]`.
    pub b_trans: bool,
}

/// The in-place layout of a dot_general (see [`MatmulLayout`]): batch dimensions lead both
/// operands, and each operand's contracting dimensions are, in order, either its trailing
/// ones or the ones right after the batch. The result (batch, lhs free, rhs free) is the
/// `[batch, m, n]` product either way.
pub fn matmul_layout(
    lb: &[i64],
    rb: &[i64],
    lc: &[i64],
    rc: &[i64],
    a: &TensorType,
    b: &TensorType,
) -> Option<MatmulLayout> {
    let (nb, nc) = (lb.len() as i64, lc.len() as i64);
    let (ra, rr) = (a.rank() as i64, b.rank() as i64);
    let range = |lo: i64, hi: i64| (lo..hi).collect::<Vec<i64>>();
    if lb != range(0, nb) || rb != range(0, nb) || ra < nb + nc || rr < nb + nc {
        return None;
    }
    let a_trans = if lc == range(ra - nc, ra) {
        false
    } else if lc == range(nb, nb + nc) {
        true
    } else {
        return None;
    };
    let b_trans = if rc == range(nb, nb + nc) {
        false
    } else if rc == range(rr - nc, rr) {
        true
    } else {
        return None;
    };
    let nb = nb as usize;
    let free = |t: &TensorType, c: &[i64]| -> usize {
        (nb..t.rank())
            .filter(|d| !c.contains(&(*d as i64)))
            .map(|d| t.shape[d])
            .product()
    };
    let k = lc.iter().map(|&d| a.shape[d as usize]).product();
    Some(MatmulLayout {
        dims: [a.shape[..nb].iter().product(), free(a, lc), k, free(b, rc)],
        a_trans,
        b_trans,
    })
}

/// A load of `ty` at index expressions `index` (one per dimension).
fn gather(input: usize, ty: &TensorType, index: Vec<Idx>) -> Expr {
    Expr::Gather {
        input,
        dtype: ty.dtype,
        index,
        strides: strides(&ty.shape).iter().map(|&s| s as i64).collect(),
    }
}

/// Where dimension `d` of a gather's or scatter's indices sits among its batch dimensions
/// (the indices' dimensions without `index_vector_dim`).
fn batch_position(d: i64, ivd: usize) -> usize {
    let d = d as usize;
    if d < ivd { d } else { d - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Arity, ComparisonDirection, Props, RngAlgorithm, attr::AttrCtx};

    /// The one test of a byte copy, on the bitcasts whose kinds differ: 8-bit to 8-bit (its
    /// kernel's type is its value's, yet it copies bytes), 32-bit words of one shape (an
    /// elementwise op), a word split into bytes and bytes joined into a word, complex
    /// numbers (of their parts' width, or of a real type of the same width), 16-bit types
    /// and sub-byte integers; the kernel [`lower`] makes is the byte copy exactly when the
    /// test says so, and the test of an instruction agrees.
    #[test]
    fn byte_copies_are_the_bitcasts_lowered_to_a_copy_of_bytes() {
        let t = |d: DType, s: &[usize]| TensorType::new(d, s.to_vec());
        let cases = [
            (t(DType::U8, &[3]), t(DType::I8, &[3]), true),
            (t(DType::F32, &[3]), t(DType::I32, &[3]), false),
            (t(DType::F64, &[2]), t(DType::I64, &[2]), false),
            (t(DType::F32, &[3]), t(DType::U8, &[3, 4]), true),
            (t(DType::U8, &[3, 4]), t(DType::F32, &[3]), true),
            (t(DType::C64, &[2]), t(DType::F32, &[2, 2]), true),
            (t(DType::C64, &[2]), t(DType::I64, &[2]), true),
            (t(DType::BF16, &[2]), t(DType::F16, &[2]), true),
            (t(DType::I4, &[4]), t(DType::U4, &[4]), false),
        ];
        for (x, out, want) in cases {
            let what = format!("{x} to {out}");
            let op = Op::BitcastConvert {};
            assert_eq!(
                byte_copy(&op, std::slice::from_ref(&x), &out),
                want,
                "{what}"
            );
            let k = lower(&op, std::slice::from_ref(&x), &out).expect("a bitcast's kernel");
            let copies = matches!(
                k.body,
                Expr::Gather {
                    dtype: DType::I8,
                    ..
                }
            ) && k.out
                == TensorType::new(DType::I8, [out.numel() * out.dtype.bytes()]);
            assert_eq!(copies, want, "{what}: {:?}", k.body);
            let text = format!(
                "func @main(%0: {x}) -> {out} {{\n  %1 = bitcast_convert %0 : {out}\n  return %1\n}}\n"
            );
            let f = kiln_ir::parse_func_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(is_byte_copy(&f, &f.insts[0]), want, "{what}");
        }
        // Only a bitcast copies bytes: a conversion of `u8` to `i8` converts values.
        let (x, out) = (t(DType::U8, &[3]), t(DType::I8, &[3]));
        let convert = Op::Convert {};
        assert!(!byte_copy(&convert, std::slice::from_ref(&x), &out));
    }

    /// Every elementwise op (by its properties) lowers to a loop nest applying it at the
    /// output's position.
    #[test]
    fn every_elementwise_op_is_a_loop_nest() {
        let t = TensorType::new(DType::F32, [2, 3]);
        for &kind in OpKind::ALL {
            // `reduce_precision` is expanded into integer ops before lowering (`precision.rs`);
            // `real`, `imag` and `complex` into ops on the parts (`complex.rs`).
            if !kind.props().contains(Props::ELEMENTWISE)
                || matches!(
                    kind,
                    OpKind::ReducePrecision | OpKind::Real | OpKind::Imag | OpKind::Complex
                )
            {
                continue;
            }
            let op = match kind {
                OpKind::Compare => Op::Compare {
                    comparison_direction: ComparisonDirection::Lt,
                },
                _ => Op::from_attrs(kind, &[], &AttrCtx { result_types: &[] })
                    .expect("an elementwise op without attributes"),
            };
            let Arity::Fixed(n) = kind.arity() else {
                panic!("{kind:?} has a fixed arity");
            };
            let k = lower(&op, &vec![t.clone(); n], &t).expect("a kernel");
            assert_eq!(k.schedule, Schedule::Nest, "{kind:?}");
            assert!(matches!(k.body, Expr::Op { .. }), "{kind:?}");
        }
    }

    /// An op without a kernel says why.
    #[test]
    fn ops_without_kernels_say_why() {
        let t = TensorType::new(DType::F32, [2]);
        let u = TensorType::new(DType::U32, [2]);
        let pred = TensorType::new(DType::Pred, [2]);
        let cases = [
            (
                Op::Constant {
                    value: kiln_ir::Literal::zeros(t.clone()),
                },
                vec![],
                t.clone(),
            ),
            (Op::OptimizationBarrier {}, vec![t.clone()], t.clone()),
            (
                Op::RngBitGenerator {
                    algorithm: RngAlgorithm::ThreeFry,
                },
                vec![u.clone()],
                u,
            ),
            (Op::Power {}, vec![pred.clone(), pred.clone()], pred),
        ];
        for (op, x, out) in cases {
            let why = lower(&op, &x, &out).expect_err("no kernel");
            assert!(!why.to_string().is_empty(), "{op:?}");
        }
    }
}
