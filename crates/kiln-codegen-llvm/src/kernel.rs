//! Kernels: a loop nest over an output index space whose body is an expression tree.
//!
//! Loads read input buffers through affine index maps of the loop variables, so broadcasts,
//! transposes, slices, reverses and reshapes are index arithmetic rather than copies; fusion
//! later inlines producers into the same tree. Reductions (reduce, dot_general) are expression
//! nodes with loops of their own.

use kiln_ir::{Combiner, ComparisonDirection, DType, Op, OpKind, TensorType, strides};

/// An elementwise operation in a kernel body.
#[derive(Clone, Debug, PartialEq)]
pub enum Ew {
    /// An arithmetic, logical or transcendental op of the IR (by kind).
    Kind(OpKind),
    /// A comparison.
    Cmp(ComparisonDirection),
    /// `select(pred, a, b)`.
    Select,
    /// `clamp(lo, x, hi)`.
    Clamp,
    /// Conversion from the operand's dtype.
    Convert,
}

/// A kernel body expression; every node has the dtype of the value it computes. Field names
/// are described on each variant.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Expr {
    /// Element `off + Σ coef[k] * var[k]` of input buffer `input`.
    Load {
        input: usize,
        dtype: DType,
        coef: Vec<i64>,
        off: i64,
    },
    /// Loop variable `var` as a value of `dtype`.
    Iota { var: usize, dtype: DType },
    /// A constant.
    Const { dtype: DType, value: f64 },
    /// An elementwise op producing `dtype`.
    Op {
        op: Ew,
        dtype: DType,
        args: Vec<Expr>,
    },
    /// `kind`-reduction of `body` over extra loop variables `(var, extent)`, starting from `init`.
    Reduce {
        kind: Combiner,
        dtype: DType,
        init: Box<Expr>,
        vars: Vec<(usize, usize)>,
        body: Box<Expr>,
    },
}

impl Expr {
    /// The dtype of the value.
    pub fn dtype(&self) -> DType {
        match self {
            Expr::Load { dtype, .. }
            | Expr::Iota { dtype, .. }
            | Expr::Const { dtype, .. }
            | Expr::Op { dtype, .. }
            | Expr::Reduce { dtype, .. } => *dtype,
        }
    }
}

/// One kernel: the output type, the number of loop variables, and the body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The output buffer's type; loop variables `0..rank` index it.
    pub out: TensorType,
    /// Loop variables in total (output dims, then reduction loops).
    pub vars: usize,
    /// The value stored at each output position.
    pub body: Expr,
}

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

/// Which elementwise ops the CPU kernels implement for operand dtype `d`.
pub fn elementwise_supported(k: OpKind, d: DType) -> bool {
    use OpKind::*;
    match k {
        Power => d.is_float(),
        Add | Subtract | Multiply | Divide | Remainder | Maximum | Minimum | And | Or | Xor
        | ShiftLeft | ShiftRightLogical | Negate | Abs | Sign | Exponential | Log | LogPlusOne
        | ExponentialMinusOne | Sqrt | Rsqrt | Tanh | Logistic | Sine | Cosine | Erf | Floor
        | Ceil | Round | Not | IsFinite | Compare | Select | Clamp | Convert => true,
        _ => false,
    }
}

/// The kernel computing one instruction, or `None` when the CPU backend has no kernel for it
/// (the executable then runs that instruction on the reference interpreter).
pub fn lower(op: &Op, x: &[TensorType], out: &TensorType) -> Option<Kernel> {
    let r = out.rank();
    let k = op.kind();
    let kernel = |vars: usize, body: Expr| {
        Some(Kernel {
            out: out.clone(),
            vars,
            body,
        })
    };
    if k.props().contains(kiln_ir::Props::ELEMENTWISE) {
        let operand_dtype = if matches!(op, Op::Select {}) {
            x[1].dtype
        } else {
            x[0].dtype
        };
        if !elementwise_supported(k, operand_dtype) {
            return None;
        }
        let ew = match op {
            Op::Compare {
                comparison_direction,
            } => Ew::Cmp(*comparison_direction),
            Op::Select {} => Ew::Select,
            Op::Clamp {} => Ew::Clamp,
            Op::Convert {} => Ew::Convert,
            _ => Ew::Kind(k),
        };
        let args = x
            .iter()
            .enumerate()
            .map(|(i, t)| same(i, t, out, r))
            .collect();
        return kernel(
            r,
            Expr::Op {
                op: ew,
                dtype: out.dtype,
                args,
            },
        );
    }
    match op {
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
            let prod = Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype: out.dtype,
                args: vec![load(0, &x[0], vars, &lmap), load(1, &x[1], vars, &rmap)],
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
        _ => None,
    }
}
