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
    /// Reinterpretation of the bits as the result dtype (same width, 32 or 64 bits).
    Bitcast,
    /// Rounding to the result dtype (f16 or bf16) of a value held in f32: what storing and
    /// loading it back would do. Fusion inserts it where an inlined producer's result was
    /// stored.
    Narrow,
}

/// An integer index expression over loop variables (i64 arithmetic).
#[derive(Clone, Debug, PartialEq)]
pub enum Idx {
    /// A loop variable.
    Var(usize),
    /// A constant.
    Const(i64),
    /// A sum.
    Add(Vec<Idx>),
    /// A product with a constant.
    Mul(Box<Idx>, i64),
    /// Truncating division by a positive constant.
    Div(Box<Idx>, i64),
    /// `min(max(x, lo), hi)`.
    Clamp(Box<Idx>, i64, i64),
    /// An integer value computed by an expression (a run-time index).
    Value(Box<Expr>),
}

impl Idx {
    fn var_plus(v: usize, c: i64) -> Idx {
        if c == 0 {
            Idx::Var(v)
        } else {
            Idx::Add(vec![Idx::Var(v), Idx::Const(c)])
        }
    }
}

/// A condition on index expressions.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    /// `lo <= x < hi`.
    InRange(Idx, i64, i64),
    /// `x` is a multiple of the constant.
    Divisible(Idx, i64),
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
    /// An index expression as a value of `dtype` (i64); fusion turns a producer's `Iota` into
    /// this when it inlines the producer at a consumer's index.
    Index { idx: Idx, dtype: DType },
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
    /// Element `Σ index[d] * strides[d]` of input buffer `input` (any index expressions).
    Gather {
        input: usize,
        dtype: DType,
        index: Vec<Idx>,
        strides: Vec<i64>,
    },
    /// `then` where every condition holds, else `otherwise`; only the chosen side is evaluated.
    Guard {
        conds: Vec<Cond>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
    },
}

impl Expr {
    /// The dtype of the value.
    pub fn dtype(&self) -> DType {
        match self {
            Expr::Load { dtype, .. }
            | Expr::Iota { dtype, .. }
            | Expr::Index { dtype, .. }
            | Expr::Const { dtype, .. }
            | Expr::Op { dtype, .. }
            | Expr::Reduce { dtype, .. }
            | Expr::Gather { dtype, .. } => *dtype,
            Expr::Guard { then, .. } => then.dtype(),
        }
    }
}

/// How a kernel's loops are arranged.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// A loop per output dimension (outermost first) around the body.
    Nest,
    /// `out = operand`, then for each update position (loop variables over the updates'
    /// shape, row-major) the operand position `target` (one index per dimension) gets
    /// `kind(out[target], body)`, skipped when out of bounds. Runs on one thread, in order.
    Scatter {
        /// The updates' shape.
        updates: Vec<usize>,
        /// The target position per operand dimension.
        target: Vec<Idx>,
        /// How an update combines with the old value.
        kind: Combiner,
    },
    /// `out = init` everywhere; then for each position of the window grid (variables
    /// `0..rank`), the window's valid positions (variables `rank..2 rank`) are scanned in
    /// row-major order keeping the selected one (`select(current, candidate)` keeps the current),
    /// and `body` (the source value) is combined into the output there. One thread, in order.
    SelectScatter {
        /// The grid's shape (the source's shape).
        grid: Vec<usize>,
        /// Window sizes.
        window: Vec<usize>,
        /// Window strides.
        strides: Vec<i64>,
        /// Low padding per dimension.
        pad_low: Vec<i64>,
        /// The selection comparison.
        select: ComparisonDirection,
        /// How source values combine into the output.
        kind: Combiner,
    },
    /// A matrix product `[batch, m, k] x [batch, k, n] -> [batch, m, n]` (the BLIS-layered
    /// GEMM of `cpu/gemm.rs`). Without an epilogue the body is unused; with one, the body is an
    /// elementwise expression over the output's index space applied to each element once the
    /// product is complete, reading the product as input `epilogue`.
    Gemm {
        /// The input index under which the body reads the product (fused elementwise users
        /// such as a bias and an activation), if there is an epilogue.
        epilogue: Option<usize>,
        /// Batch size.
        batch: usize,
        /// Rows.
        m: usize,
        /// Columns.
        n: usize,
        /// Contraction length.
        k: usize,
        /// `None`: A is a `[batch, m, k]` buffer (`[batch, k, m]` with `a_trans`). `Some`: A
        /// is the implicit patch matrix of a convolution, read from its input, B (its kernel)
        /// is one `[k, n]` matrix for every batch, and the output is laid out as
        /// [`ConvPatches::planes`] says.
        conv: Option<ConvPatches>,
        /// A is stored transposed, `[batch, k, m]`.
        a_trans: bool,
        /// B is stored transposed, `[batch, n, k]`.
        b_trans: bool,
        /// A second product that takes the epilogue's result as its A (see [`Chain`]).
        chain: Option<Box<Chain>>,
    },
}

/// A matrix product chained to a GEMM kernel with a row epilogue (attention's probabilities
/// times V): `[batch, m, n] x [batch, n, n2] -> [batch, m, n2]`, where the first operand is the
/// epilogue's result (the kernel's `out`, which is never stored whole). Each block of rows of
/// it is multiplied as soon as the epilogue has run over it, while it is in cache, and the
/// kernel's buffer is this product's.
#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    /// The second product's columns.
    pub n: usize,
    /// The input holding its B, `[batch, n, n2]` (`[batch, n2, n]` with `b_trans`), where `n`
    /// is the first product's columns.
    pub b: usize,
    /// Its B is stored transposed.
    pub b_trans: bool,
    /// The kernel's result, the second product.
    pub out: TensorType,
    /// When the epilogue is a softmax along the row, `exp(h - max h) / Σ exp(h - max h)`, of
    /// the logits `h` given here (an expression over the epilogue's position, its last
    /// variable the column, reading the first product at its own position), it is computed
    /// online (as flash attention does): the first product runs over blocks of columns, each
    /// block's exponentials are taken from the row's running maximum and their sum kept, and
    /// the second product's rows are rescaled whenever the maximum grows and divided by the
    /// sums at the end. No row is ever held whole, so rows of any length chain. Other row
    /// epilogues (`None`) run over whole rows, up to
    /// [`crate::target::FusionLimits::chain_row`] columns.
    pub online: Option<Expr>,
    /// For an online softmax, where its logits are -inf whatever the product (a causal mask):
    /// wherever `col * a + row * b + c > 0` for `(a, b, c)` here, `col` the column and `row`
    /// the position's next-to-last variable (the row within its batch). Blocks of rows and
    /// columns where that holds throughout are skipped.
    pub masked: Option<(i64, i64, i64)>,
}

/// Where the logits `h` of an online softmax (see [`Chain::online`]) are -inf whatever the
/// product: when `h` is `select(a ⋚ b, x, -inf)` (`-inf` as `value` resolves it) with `a` and
/// `b` integer affine expressions of the column variable `col` and the row variable `row`,
/// the `(a, b, c)` of [`Chain::masked`].
pub fn masked_where(
    h: &Expr,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    // An integer expression as `col * a + row * b + c`.
    fn affine_int(
        e: &Expr,
        (col, row): (usize, usize),
        value: &dyn Fn(&Expr) -> Option<f64>,
    ) -> Option<(i64, i64, i64)> {
        let of_idx = |i: &Idx| {
            let (terms, c) = affine(i)?;
            let mut f = (0, 0, c);
            for (v, k) in terms {
                match v {
                    _ if v == col => f.0 += k,
                    _ if v == row => f.1 += k,
                    _ => return None,
                }
            }
            Some(f)
        };
        match e {
            Expr::Index { idx, .. } => of_idx(idx),
            Expr::Iota { var, .. } => of_idx(&Idx::Var(*var)),
            Expr::Const { .. } | Expr::Load { .. } | Expr::Gather { .. }
                if matches!(e.dtype(), DType::I32 | DType::I64) =>
            {
                let v = value(e)?;
                (v.fract() == 0.0 && v.abs() < (1u64 << 52) as f64).then_some((0, 0, v as i64))
            }
            // (Exact for the positions of `masked`'s caller, below 2^30.)
            Expr::Op {
                op: Ew::Convert,
                dtype: DType::I32 | DType::I64,
                args,
            } if matches!(args[0].dtype(), DType::I32 | DType::I64) => {
                affine_int(&args[0], (col, row), value)
            }
            Expr::Op {
                op: Ew::Kind(k @ (OpKind::Add | OpKind::Subtract)),
                dtype: DType::I32 | DType::I64,
                args,
            } => {
                let (x, y) = (
                    affine_int(&args[0], (col, row), value)?,
                    affine_int(&args[1], (col, row), value)?,
                );
                let s = if *k == OpKind::Add { 1 } else { -1 };
                Some((x.0 + s * y.0, x.1 + s * y.1, x.2 + s * y.2))
            }
            _ => None,
        }
    }
    let Expr::Op {
        op: Ew::Select,
        args,
        ..
    } = h
    else {
        return None;
    };
    if value(&args[2]) != Some(f64::NEG_INFINITY) {
        return None;
    }
    let Expr::Op {
        op: Ew::Cmp(dir),
        args: sides,
        ..
    } = &args[0]
    else {
        return None;
    };
    let (a, b) = (
        affine_int(&sides[0], (col, row), value)?,
        affine_int(&sides[1], (col, row), value)?,
    );
    // f = a - b; kept where the comparison holds, masked where `g > 0`.
    let f = (a.0 - b.0, a.1 - b.1, a.2 - b.2);
    let neg = |f: (i64, i64, i64)| (-f.0, -f.1, -f.2);
    match dir {
        ComparisonDirection::Le => Some(f),
        ComparisonDirection::Lt => Some((f.0, f.1, f.2 + 1)),
        ComparisonDirection::Ge => Some(neg(f)),
        ComparisonDirection::Gt => {
            let g = neg(f);
            Some((g.0, g.1, g.2 + 1))
        }
        _ => None,
    }
}

/// The patch matrix of a convolution with input `[N, H, W, C]` (padded) and kernel
/// `[KH, KW, C, O]`: row `(n, oh, ow)`, column `(kh, kw, c)` holds
/// `input[n, oh * stride[0] + kh * dilation[0], ow * stride[1] + kw * dilation[1], c]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvPatches {
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Window strides.
    pub stride: [usize; 2],
    /// Kernel dilation.
    pub dilation: [usize; 2],
    /// The output is `[N, O, OH, OW]`: each image's `[OH*OW, O]` product stored by columns,
    /// one plane per output feature (the GEMM then runs as a batch of images sharing B).
    /// Otherwise it is `[N, OH, OW, O]`, the `[N*OH*OW, O]` product by rows.
    pub planes: bool,
}

impl ConvPatches {
    /// The input element offset of each column from its row's window corner.
    pub fn column_offsets(&self) -> Vec<i64> {
        let mut v = Vec::with_capacity(self.kh * self.kw * self.c);
        for kh in 0..self.kh {
            for kw in 0..self.kw {
                for c in 0..self.c {
                    let (dy, dx) = (kh * self.dilation[0], kw * self.dilation[1]);
                    v.push(((dy * self.w + dx) * self.c + c) as i64);
                }
            }
        }
        v
    }
}

/// One kernel: the output type, the number of loop variables, and the body.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The loop arrangement.
    pub schedule: Schedule,
    /// The output buffer's type; loop variables `0..rank` index it.
    pub out: TensorType,
    /// Loop variables in total (output dims, then reduction loops).
    pub vars: usize,
    /// The value stored at each output position.
    pub body: Expr,
    /// More outputs of the same shape written by the same loop nest (multi-output fusion); a
    /// loop-nest kernel only.
    pub extra: Vec<Extra>,
}

/// An extra output of a multi-output loop-nest kernel: at each position of the kernel's index
/// space, `body` is stored into the buffer whose pointer is input slot `slot`.
#[derive(Clone, Debug, PartialEq)]
pub struct Extra {
    /// The buffer's type (the kernel output's shape).
    pub out: TensorType,
    /// The value stored at each position.
    pub body: Expr,
    /// The input slot holding the buffer's pointer (after the kernel's inputs).
    pub slot: usize,
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
        Power => d != DType::Pred,
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
            schedule: Schedule::Nest,
            out: out.clone(),
            vars,
            body,
            extra: Vec::new(),
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
        } if out.numel() > 0 && matches!(out.dtype, DType::F32 | DType::F64) => {
            let layout = matmul_layout(lb, rb, lc, rc, &x[0], &x[1])?;
            let [batch, m, k, n] = layout.dims;
            Some(Kernel {
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
        Op::BitcastConvert {}
            if x[0].shape == out.shape
                && x[0].dtype.bits() == out.dtype.bits()
                && matches!(out.dtype.bits(), 32 | 64) =>
        {
            kernel(
                r,
                Expr::Op {
                    op: Ew::Bitcast,
                    dtype: out.dtype,
                    args: vec![same(0, &x[0], out, r)],
                },
            )
        }
        // Any other bitcast (between widths, or of 8- and 16-bit types) keeps the buffer's
        // little-endian bytes as they are: a byte copy.
        Op::BitcastConvert {} => {
            let bytes = out.numel() * out.dtype.bytes();
            Some(Kernel {
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
            Some(Kernel {
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
        } => {
            let (a, si, u) = (&x[0], &x[1], &x[2]);
            let ivd = *index_vector_dim as usize;
            let ru = u.rank();
            let batch_vars: Vec<usize> = (0..ru).filter(|d| !uwd.contains(&(*d as i64))).collect();
            let window_dims: Vec<usize> = (0..a.rank())
                .filter(|d| !iwd.contains(&(*d as i64)))
                .collect();
            let mut target = Vec::new();
            for d in 0..a.rank() {
                let mut parts = Vec::new();
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
            Some(Kernel {
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
                let p = Idx::var_plus(d, -lo[d]);
                let step = int[d] + 1;
                let n = x[0].shape[d] as i64;
                conds.push(Cond::InRange(
                    p.clone(),
                    0,
                    if n == 0 { 0 } else { (n - 1) * step + 1 },
                ));
                if step > 1 {
                    conds.push(Cond::Divisible(p.clone(), step));
                }
                index.push(if step > 1 {
                    Idx::Div(Box::new(p), step)
                } else {
                    p
                });
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
        } => {
            let (a, si) = (&x[0], &x[1]);
            let ivd = *index_vector_dim as usize;
            let batch_vars: Vec<usize> = (0..r)
                .filter(|d| !offset_dims.contains(&(*d as i64)))
                .collect();
            let window_dims: Vec<usize> = (0..a.rank())
                .filter(|d| !collapsed_slice_dims.contains(&(*d as i64)))
                .collect();
            let mut index = Vec::new();
            for (d, (&size, &slice)) in a.shape.iter().zip(slice_sizes).enumerate() {
                let mut parts = Vec::new();
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
        } if crate::canon::is_gemm_conv(op)
            && out.numel() > 0
            && matches!(out.dtype, DType::F32 | DType::F64) =>
        {
            let (a, w) = (&x[0].shape, &x[1].shape);
            let planes = output_dims[..] == crate::canon::GEMM_CONV_PLANES;
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
            Some(Kernel {
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
        } => {
            let (a, w) = (&x[0], &x[1]);
            let sp = a.rank() - 2;
            let k_in = w.shape[kernel_dims[1] as usize];
            let per_group = (w.shape[kernel_dims[0] as usize] as i64 / feature_group_count).max(1);
            // Reduction variables: input feature within the group, then kernel spatial positions.
            let ic = r;
            let kv = |i: usize| r + 1 + i;
            let vars = r + 1 + sp;
            let ob = output_dims[0] as usize;
            let of = output_dims[1] as usize;
            let mut li = vec![Idx::Const(0); a.rank()];
            let mut wi = vec![Idx::Const(0); w.rank()];
            li[input_dims[0] as usize] = Idx::Var(ob);
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
                let pos = Idx::Add(vec![
                    Idx::Mul(
                        Box::new(Idx::Var(output_dims[2 + i] as usize)),
                        window_strides[i],
                    ),
                    Idx::Const(-padding[i].0),
                    Idx::Mul(Box::new(Idx::Var(kv(i))), rhs_dilation[i]),
                ]);
                let size = a.shape[input_dims[2 + i] as usize] as i64;
                let ld = lhs_dilation[i];
                conds.push(Cond::InRange(
                    pos.clone(),
                    0,
                    if size == 0 { 0 } else { (size - 1) * ld + 1 },
                ));
                if ld > 1 {
                    conds.push(Cond::Divisible(pos.clone(), ld));
                }
                li[input_dims[2 + i] as usize] = if ld > 1 {
                    Idx::Div(Box::new(pos), ld)
                } else {
                    pos
                };
                wi[kernel_dims[2 + i] as usize] = Idx::Var(kv(i));
            }
            let weight = gather(1, w, wi);
            let prod = Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype: out.dtype,
                args: vec![gather(0, a, li), weight.clone()],
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
            let (mut conds, mut index) = (Vec::new(), Vec::new());
            for d in 0..r {
                let pos = Idx::Add(vec![
                    Idx::Mul(Box::new(Idx::Var(d)), ws[d]),
                    Idx::Const(-padding[d].0),
                    Idx::Mul(Box::new(Idx::Var(r + d)), wdl[d]),
                ]);
                let size = a.shape[d] as i64;
                conds.push(Cond::InRange(
                    pos.clone(),
                    0,
                    if size == 0 { 0 } else { (size - 1) * bd[d] + 1 },
                ));
                if bd[d] > 1 {
                    conds.push(Cond::Divisible(pos.clone(), bd[d]));
                }
                index.push(if bd[d] > 1 {
                    Idx::Div(Box::new(pos), bd[d])
                } else {
                    pos
                });
            }
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
        _ => None,
    }
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

/// The loop variables `e` reads, without those bound by its own reductions.
pub fn free_vars(e: &Expr) -> std::collections::BTreeSet<usize> {
    let mut out = std::collections::BTreeSet::new();
    collect_free(e, &mut out);
    out
}

fn collect_free(e: &Expr, out: &mut std::collections::BTreeSet<usize>) {
    match e {
        Expr::Load { coef, .. } => {
            out.extend(coef.iter().enumerate().filter(|c| *c.1 != 0).map(|c| c.0));
        }
        Expr::Iota { var, .. } => {
            out.insert(*var);
        }
        Expr::Index { idx, .. } => collect_free_idx(idx, out),
        Expr::Const { .. } => {}
        Expr::Op { args, .. } => args.iter().for_each(|a| collect_free(a, out)),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            collect_free(init, out);
            let mut inner = std::collections::BTreeSet::new();
            collect_free(body, &mut inner);
            out.extend(
                inner
                    .into_iter()
                    .filter(|v| !vars.iter().any(|b| b.0 == *v)),
            );
        }
        Expr::Gather { index, .. } => index.iter().for_each(|i| collect_free_idx(i, out)),
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            for c in conds {
                match c {
                    Cond::InRange(i, ..) | Cond::Divisible(i, _) => collect_free_idx(i, out),
                }
            }
            collect_free(then, out);
            collect_free(otherwise, out);
        }
    }
}

fn collect_free_idx(i: &Idx, out: &mut std::collections::BTreeSet<usize>) {
    match i {
        Idx::Var(v) => {
            out.insert(*v);
        }
        Idx::Const(_) => {}
        Idx::Add(xs) => xs.iter().for_each(|x| collect_free_idx(x, out)),
        Idx::Mul(x, _) | Idx::Div(x, _) | Idx::Clamp(x, ..) => collect_free_idx(x, out),
        Idx::Value(e) => collect_free(e, out),
    }
}

/// A text key equal for expressions that compute the same value: variables bound by
/// reductions inside `e` are numbered by binding order, so two copies of one inlined reduction
/// (each given fresh loop variables) have the same key.
pub fn value_key(e: &Expr) -> String {
    let mut s = String::new();
    key_expr(e, &mut Vec::new(), &mut s);
    s
}

fn key_var(v: usize, bound: &[usize]) -> String {
    match bound.iter().rposition(|&b| b == v) {
        Some(k) => format!("b{k}"),
        None => format!("v{v}"),
    }
}

fn key_expr(e: &Expr, bound: &mut Vec<usize>, s: &mut String) {
    use std::fmt::Write as _;
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => {
            let _ = write!(s, "L{input}:{dtype}:{off}[");
            for (v, c) in coef.iter().enumerate().filter(|c| *c.1 != 0) {
                let _ = write!(s, "{}*{c},", key_var(v, bound));
            }
            s.push(']');
        }
        Expr::Iota { var, dtype } => {
            let _ = write!(s, "I{}:{dtype}", key_var(*var, bound));
        }
        Expr::Index { idx, dtype } => {
            let _ = write!(s, "X{dtype}(");
            key_idx(idx, bound, s);
            s.push(')');
        }
        Expr::Const { dtype, value } => {
            let _ = write!(s, "C{dtype}:{:x}", value.to_bits());
        }
        Expr::Op { op, dtype, args } => {
            let _ = write!(s, "O{op:?}:{dtype}(");
            for a in args {
                key_expr(a, bound, s);
                s.push(',');
            }
            s.push(')');
        }
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => {
            let _ = write!(s, "R{kind:?}:{dtype}(");
            key_expr(init, bound, s);
            let depth = bound.len();
            for &(v, n) in vars {
                bound.push(v);
                let _ = write!(s, ";{}<{n}", key_var(v, bound));
            }
            s.push('|');
            key_expr(body, bound, s);
            bound.truncate(depth);
            s.push(')');
        }
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } => {
            let _ = write!(s, "G{input}:{dtype}:{strides:?}(");
            for i in index {
                key_idx(i, bound, s);
                s.push(',');
            }
            s.push(')');
        }
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            s.push_str("W(");
            for c in conds {
                match c {
                    Cond::InRange(i, lo, hi) => {
                        let _ = write!(s, "in{lo}:{hi}:");
                        key_idx(i, bound, s);
                    }
                    Cond::Divisible(i, d) => {
                        let _ = write!(s, "div{d}:");
                        key_idx(i, bound, s);
                    }
                }
                s.push(',');
            }
            key_expr(then, bound, s);
            s.push('?');
            key_expr(otherwise, bound, s);
            s.push(')');
        }
    }
}

fn key_idx(i: &Idx, bound: &mut Vec<usize>, s: &mut String) {
    use std::fmt::Write as _;
    // An affine index by its terms: inlining a producer wraps its indices in sums with zeros
    // (`((v0 + 0) + 0)`), which must not make equal values look different.
    if let Some((terms, c)) = affine(i) {
        let mut merged: Vec<(String, i64)> = Vec::new();
        for (v, k) in terms {
            let name = key_var(v, bound);
            match merged.iter_mut().find(|t| t.0 == name) {
                Some(t) => t.1 += k,
                None => merged.push((name, k)),
            }
        }
        merged.retain(|t| t.1 != 0);
        merged.sort();
        s.push_str("a(");
        for (name, k) in merged {
            let _ = write!(s, "{name}*{k},");
        }
        let _ = write!(s, "{c})");
        return;
    }
    match i {
        Idx::Var(v) => s.push_str(&key_var(*v, bound)),
        Idx::Const(c) => {
            let _ = write!(s, "{c}");
        }
        Idx::Add(xs) => {
            s.push_str("+(");
            for x in xs {
                key_idx(x, bound, s);
                s.push(',');
            }
            s.push(')');
        }
        Idx::Mul(x, c) => {
            s.push_str("*(");
            key_idx(x, bound, s);
            let _ = write!(s, ",{c})");
        }
        Idx::Div(x, c) => {
            s.push_str("/(");
            key_idx(x, bound, s);
            let _ = write!(s, ",{c})");
        }
        Idx::Clamp(x, lo, hi) => {
            s.push_str("c(");
            key_idx(x, bound, s);
            let _ = write!(s, ",{lo},{hi})");
        }
        Idx::Value(e) => {
            s.push_str("v(");
            key_expr(e, bound, s);
            s.push(')');
        }
    }
}

/// The reductions in `e` that may be computed ahead of the loops they sit in (every one not
/// under a guard, whose condition may protect its loads), inner ones before outer ones.
pub fn hoistable_reduces(e: &Expr) -> Vec<&Expr> {
    fn walk<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        match e {
            Expr::Op { args, .. } => args.iter().for_each(|a| walk(a, out)),
            Expr::Reduce { init, body, .. } => {
                walk(init, out);
                walk(body, out);
                out.push(e);
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out
}

/// How [`rebuild`] changes an expression: the leaves that name inputs and loop variables, and
/// the reductions it leaves alone.
struct Rewrite<'a> {
    /// A load's or gather's input.
    input: &'a dyn Fn(usize) -> usize,
    /// A load's coefficients.
    coef: &'a dyn Fn(&[i64]) -> Vec<i64>,
    /// A loop variable (in `Iota` and index expressions).
    var: &'a dyn Fn(usize) -> usize,
    /// Reductions kept as they are, children included.
    keep: &'a dyn Fn(&Expr) -> bool,
}

/// `e` with its inputs, load coefficients and loop variables rewritten by `r`.
fn rebuild(e: &Expr, r: &Rewrite<'_>) -> Expr {
    let idx = |i: &Idx| rebuild_idx(i, r);
    let sub = |x: &Expr| Box::new(rebuild(x, r));
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => Expr::Load {
            input: (r.input)(*input),
            dtype: *dtype,
            coef: (r.coef)(coef),
            off: *off,
        },
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } => Expr::Gather {
            input: (r.input)(*input),
            dtype: *dtype,
            index: index.iter().map(idx).collect(),
            strides: strides.clone(),
        },
        Expr::Iota { var, dtype } => Expr::Iota {
            var: (r.var)(*var),
            dtype: *dtype,
        },
        Expr::Const { .. } => e.clone(),
        Expr::Index { idx: i, dtype } => Expr::Index {
            idx: idx(i),
            dtype: *dtype,
        },
        Expr::Op { op, dtype, args } => Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args.iter().map(|a| rebuild(a, r)).collect(),
        },
        Expr::Reduce { .. } if (r.keep)(e) => e.clone(),
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: sub(init),
            vars: vars.clone(),
            body: sub(body),
        },
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => Expr::Guard {
            conds: conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, lo, hi) => Cond::InRange(idx(i), *lo, *hi),
                    Cond::Divisible(i, m) => Cond::Divisible(idx(i), *m),
                })
                .collect(),
            then: sub(then),
            otherwise: sub(otherwise),
        },
    }
}

fn rebuild_idx(i: &Idx, r: &Rewrite<'_>) -> Idx {
    let sub = |x: &Idx| Box::new(rebuild_idx(x, r));
    match i {
        Idx::Var(v) => Idx::Var((r.var)(*v)),
        Idx::Const(_) => i.clone(),
        Idx::Add(xs) => Idx::Add(xs.iter().map(|x| rebuild_idx(x, r)).collect()),
        Idx::Mul(x, c) => Idx::Mul(sub(x), *c),
        Idx::Div(x, c) => Idx::Div(sub(x), *c),
        Idx::Clamp(x, lo, hi) => Idx::Clamp(sub(x), *lo, *hi),
        Idx::Value(e) => Idx::Value(Box::new(rebuild(e, r))),
    }
}

/// `e` with every input index `i` replaced by `map(i)`.
pub fn map_inputs(e: &Expr, map: &dyn Fn(usize) -> usize) -> Expr {
    rebuild(
        e,
        &Rewrite {
            input: map,
            coef: &|c| c.to_vec(),
            var: &|v| v,
            keep: &|_| false,
        },
    )
}

/// `(a, m)` when `e` is `a - m` with `m` a maximum reduction, through round trips of bit
/// casts (a stop-gradient's).
pub fn minus_max(e: &Expr) -> Option<(&Expr, &Expr)> {
    let Expr::Op {
        op: Ew::Kind(OpKind::Subtract),
        args,
        ..
    } = e
    else {
        return None;
    };
    let (a, mut m) = (&args[0], &args[1]);
    while let Expr::Op {
        op: Ew::Bitcast,
        dtype,
        args: inner,
    } = m
        && let Expr::Op {
            op: Ew::Bitcast,
            args: innermost,
            ..
        } = &inner[0]
        && innermost[0].dtype() == *dtype
    {
        m = &innermost[0];
    }
    matches!(
        m,
        Expr::Reduce {
            kind: Combiner::Max,
            ..
        }
    )
    .then_some((a, m))
}

/// `e` with every read of input `j` at coefficients `from` (no offset; a load, or a gather at
/// that affine index) a load at coefficients `to` instead; `None` when `e` reads `j` any other
/// way (elsewhere, or in an index expression or a condition). Variable `v` runs over
/// `0..extents[v]`; the coefficients of those that run over one value do not matter.
pub fn reindex_input(
    e: &Expr,
    j: usize,
    (from, to): (&[i64], &[i64]),
    extents: &[usize],
) -> Option<Expr> {
    let matches = |coef: &[i64]| {
        let at = |c: &[i64], v: usize| c.get(v).copied().unwrap_or(0);
        (0..coef.len().max(from.len()))
            .all(|v| at(coef, v) == at(from, v) || extents.get(v) == Some(&1))
    };
    if !reads_input(e, j) {
        return Some(e.clone());
    }
    let sub = |x: &Expr| reindex_input(x, j, (from, to), extents).map(Box::new);
    match e {
        Expr::Load { dtype, .. } | Expr::Gather { dtype, .. } => {
            let (coef, off) = affine_read(e, j)?;
            (off == 0 && matches(&coef)).then(|| Expr::Load {
                input: j,
                dtype: *dtype,
                coef: to.to_vec(),
                off: 0,
            })
        }
        Expr::Op { op, dtype, args } => Some(Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args
                .iter()
                .map(|a| reindex_input(a, j, (from, to), extents))
                .collect::<Option<_>>()?,
        }),
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => Some(Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: sub(init)?,
            vars: vars.clone(),
            body: sub(body)?,
        }),
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            let bare = Expr::Guard {
                conds: conds.clone(),
                then: Box::new(Expr::Const {
                    dtype: DType::F32,
                    value: 0.0,
                }),
                otherwise: Box::new(Expr::Const {
                    dtype: DType::F32,
                    value: 0.0,
                }),
            };
            if reads_input(&bare, j) {
                return None;
            }
            Some(Expr::Guard {
                conds: conds.clone(),
                then: sub(then)?,
                otherwise: sub(otherwise)?,
            })
        }
        _ => None,
    }
}

/// `e` with the free loop variable `from` replaced by `to`, which `e` must not use (loads'
/// coefficients move from one variable to the other; reductions binding `from` are kept).
pub fn rename_var(e: &Expr, from: usize, to: usize) -> Expr {
    rebuild(
        e,
        &Rewrite {
            input: &|i| i,
            coef: &|coef| {
                let mut coef = coef.to_vec();
                if let Some(c) = coef.get_mut(from).map(std::mem::take) {
                    if coef.len() <= to {
                        coef.resize(to + 1, 0);
                    }
                    coef[to] += c;
                }
                coef
            },
            var: &|v| if v == from { to } else { v },
            keep: &|x| matches!(x, Expr::Reduce { vars, .. } if vars.iter().any(|v| v.0 == from)),
        },
    )
}

/// The flat affine index `(coef, off)` at which `e` reads input `j` when `e` is a load of it or
/// a gather of it at an affine index with strides; `None` for anything else.
fn affine_read(e: &Expr, j: usize) -> Option<(Vec<i64>, i64)> {
    match e {
        Expr::Load {
            input, coef, off, ..
        } if *input == j => Some((coef.clone(), *off)),
        Expr::Gather {
            input,
            index,
            strides: gs,
            ..
        } if *input == j => {
            let mut coef: Vec<i64> = Vec::new();
            let mut off = 0;
            for (i, &s) in index.iter().zip(gs) {
                let (terms, c) = affine(i)?;
                off += c * s;
                for (v, a) in terms {
                    if coef.len() <= v {
                        coef.resize(v + 1, 0);
                    }
                    coef[v] += a * s;
                }
            }
            Some((coef, off))
        }
        _ => None,
    }
}

/// The coefficients (per loop variable) of every read of an input at an affine index in `e`,
/// outside reductions: loads, and gathers whose index is affine.
pub fn affine_reads(e: &Expr) -> Vec<Vec<i64>> {
    fn walk(e: &Expr, out: &mut Vec<Vec<i64>>) {
        match e {
            Expr::Load { input, .. } | Expr::Gather { input, .. } => {
                if let Some((coef, _)) = affine_read(e, *input) {
                    out.push(coef);
                }
            }
            Expr::Op { args, .. } => args.iter().for_each(|a| walk(a, out)),
            Expr::Guard {
                then, otherwise, ..
            } => {
                walk(then, out);
                walk(otherwise, out);
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out
}

/// Whether `e` reads input `j` (of `out`'s type, a `[rows, row]` matrix whose rows are the
/// dimensions before `split`) only at the position it writes, or inside reductions over the row
/// it writes: a reduction that depends on no variable from `split` on, whose every read of `j`
/// is at the written row (the row variables at their own strides, no offset) plus a
/// non-negative combination of the reduction's own variables staying below the row's length.
/// Such a body (a softmax, a layer norm) can run over a block of whole rows in place: each
/// row's reductions first, then its elements, each read just before it is overwritten.
pub fn reads_own_position_or_row(e: &Expr, j: usize, out: &TensorType, split: usize) -> bool {
    fn in_row(
        e: &Expr,
        j: usize,
        out: &TensorType,
        split: usize,
        extents: &mut Vec<(usize, usize)>,
    ) -> bool {
        let rank = out.rank();
        let st = strides(&out.shape);
        let row_len: i64 = out.shape[split..].iter().product::<usize>() as i64;
        if let Some((coef, off)) = affine_read(e, j) {
            let mut span = 0i64;
            for (v, &c) in coef.iter().enumerate() {
                if v < split {
                    if out.shape[v] != 1 && c != st[v] as i64 {
                        return false;
                    }
                } else if v < rank {
                    if c != 0 {
                        return false;
                    }
                } else if c != 0 {
                    let Some(&(_, ext)) = extents.iter().find(|x| x.0 == v) else {
                        return false;
                    };
                    if c < 0 {
                        return false;
                    }
                    span += c * (ext as i64 - 1);
                }
            }
            return off == 0 && span < row_len;
        }
        match e {
            Expr::Load { .. }
            | Expr::Iota { .. }
            | Expr::Const { .. }
            | Expr::Index { .. }
            | Expr::Gather { .. } => !reads_input(e, j),
            Expr::Op { args, .. } => args.iter().all(|a| in_row(a, j, out, split, extents)),
            Expr::Reduce {
                init, vars, body, ..
            } => {
                let mark = extents.len();
                extents.extend(vars.iter().copied());
                let ok =
                    in_row(init, j, out, split, extents) && in_row(body, j, out, split, extents);
                extents.truncate(mark);
                ok
            }
            // Conditions may hold run-time indices: only a guard not reading `j` at all.
            Expr::Guard { .. } => !reads_input(e, j),
        }
    }
    match e {
        Expr::Reduce { .. } if reads_input(e, j) => {
            free_vars(e).iter().all(|&v| v < split) && in_row(e, j, out, split, &mut Vec::new())
        }
        Expr::Op { args, .. } => args
            .iter()
            .all(|a| reads_own_position_or_row(a, j, out, split)),
        _ => reads_only_own_position(e, j, out),
    }
}

/// Whether every read of input `j` in `e` is a load of the element at the kernel's own output
/// position (`strides` are the output's row-major strides), outside reductions and guards: the
/// reads an in-place epilogue may make (`out` is the kernel's output type).
pub fn reads_only_own_position(e: &Expr, j: usize, out: &TensorType) -> bool {
    let st = strides(&out.shape);
    match e {
        Expr::Load {
            input, coef, off, ..
        } if *input == j => {
            *off == 0
                && coef
                    .iter()
                    .enumerate()
                    .all(|(v, &c)| match out.shape.get(v) {
                        Some(1) => true,
                        Some(_) => c == st[v] as i64,
                        None => c == 0,
                    })
        }
        // Fusion turns a producer's loads into gathers at the consumer's index; an affine one
        // may still be the own position.
        Expr::Gather { input, .. } if *input == j => match affine_read(e, j) {
            Some((coef, off)) => {
                let own = Expr::Load {
                    input: j,
                    dtype: out.dtype,
                    coef,
                    off,
                };
                reads_only_own_position(&own, j, out)
            }
            None => false,
        },
        Expr::Load { .. } | Expr::Iota { .. } | Expr::Const { .. } => true,
        Expr::Op { args, .. } => args.iter().all(|a| reads_only_own_position(a, j, out)),
        _ => !reads_input(e, j),
    }
}

/// `i` as `Σ coef * var + constant`, when it is affine in the loop variables.
/// Whether every buffer read in `e` moves by 0 or 1 element when loop variable `var` grows
/// by one, at least one by 1 (the reads are contiguous along `var`), and `e` has no reduction
/// or guard inside.
pub fn contiguous_along(e: &Expr, var: usize) -> bool {
    let mut ok = true;
    let mut unit = false;
    visit(e, &mut |x| match x {
        Expr::Load { coef, .. } => match coef.get(var).copied().unwrap_or(0) {
            0 => {}
            1 => unit = true,
            _ => ok = false,
        },
        Expr::Gather { index, strides, .. } => {
            let mut step = 0i64;
            for (i, s) in index.iter().zip(strides) {
                match affine(i) {
                    Some((terms, _)) => {
                        step += s * terms
                            .iter()
                            .filter(|t| t.0 == var)
                            .map(|t| t.1)
                            .sum::<i64>();
                    }
                    None => ok = false,
                }
            }
            match step {
                0 => {}
                1 => unit = true,
                _ => ok = false,
            }
        }
        Expr::Reduce { .. } | Expr::Guard { .. } => ok = false,
        _ => {}
    });
    ok && unit
}

/// Whether an index expression is a constant (uses no loop variable).
pub fn is_constant(i: &Idx) -> bool {
    affine(i).is_some_and(|(terms, _)| terms.iter().all(|&(_, c)| c == 0))
}

/// `(v, c)` when `i` is `v + c` for one loop variable `v` (terms of one variable merged).
pub fn var_plus_const(i: &Idx) -> Option<(usize, i64)> {
    let (terms, c) = affine(i)?;
    let mut merged: Vec<(usize, i64)> = Vec::new();
    for (v, a) in terms {
        match merged.iter_mut().find(|m| m.0 == v) {
            Some(m) => m.1 += a,
            None => merged.push((v, a)),
        }
    }
    merged.retain(|m| m.1 != 0);
    match merged.as_slice() {
        [(v, 1)] => Some((*v, c)),
        _ => None,
    }
}

fn affine(i: &Idx) -> Option<(Vec<(usize, i64)>, i64)> {
    match i {
        Idx::Var(v) => Some((vec![(*v, 1)], 0)),
        Idx::Const(c) => Some((vec![], *c)),
        Idx::Add(xs) => {
            let mut terms = Vec::new();
            let mut c = 0;
            for x in xs {
                let (t, k) = affine(x)?;
                terms.extend(t);
                c += k;
            }
            Some((terms, c))
        }
        Idx::Mul(x, m) => {
            let (t, k) = affine(x)?;
            Some((t.into_iter().map(|(v, a)| (v, a * m)).collect(), k * m))
        }
        Idx::Div(..) | Idx::Clamp(..) | Idx::Value(_) => None,
    }
}

/// Whether `e` reads input `j` anywhere.
pub fn reads_input(e: &Expr, j: usize) -> bool {
    let mut found = false;
    visit(
        e,
        &mut |x| {
            found |=
                matches!(x, Expr::Load { input, .. } | Expr::Gather { input, .. } if *input == j)
        },
    );
    found
}

/// Calls `f` on `e` and every expression inside it (operands, reduction bodies, index
/// expressions, guard conditions and branches), parents first.
pub fn visit(e: &Expr, f: &mut dyn FnMut(&Expr)) {
    f(e);
    let idx = |i: &Idx, f: &mut dyn FnMut(&Expr)| visit_idx(i, f);
    match e {
        Expr::Load { .. } | Expr::Iota { .. } | Expr::Const { .. } => {}
        Expr::Index { idx: i, .. } => idx(i, f),
        Expr::Op { args, .. } => args.iter().for_each(|a| visit(a, f)),
        Expr::Reduce { init, body, .. } => {
            visit(init, f);
            visit(body, f);
        }
        Expr::Gather { index, .. } => index.iter().for_each(|i| idx(i, f)),
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            for c in conds {
                match c {
                    Cond::InRange(i, ..) | Cond::Divisible(i, _) => idx(i, f),
                }
            }
            visit(then, f);
            visit(otherwise, f);
        }
    }
}

fn visit_idx(i: &Idx, f: &mut dyn FnMut(&Expr)) {
    match i {
        Idx::Value(e) => visit(e, f),
        Idx::Add(xs) => xs.iter().for_each(|x| visit_idx(x, f)),
        Idx::Mul(x, _) | Idx::Div(x, _) | Idx::Clamp(x, ..) => visit_idx(x, f),
        Idx::Var(_) | Idx::Const(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inlined producers wrap indices in sums with zeros; equal values keep equal keys.
    #[test]
    fn value_keys_see_through_zero_sums() {
        let gather = |index: Idx| Expr::Gather {
            input: 1,
            dtype: DType::F32,
            index: vec![index],
            strides: vec![1],
        };
        let plain = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), 1024), Idx::Var(1)]);
        let wrapped = Idx::Add(vec![
            Idx::Const(0),
            Idx::Mul(
                Box::new(Idx::Add(vec![
                    Idx::Add(vec![Idx::Var(0), Idx::Const(0)]),
                    Idx::Const(0),
                ])),
                1024,
            ),
            Idx::Mul(Box::new(Idx::Var(1)), 1),
        ]);
        assert_eq!(
            value_key(&gather(plain.clone())),
            value_key(&gather(wrapped))
        );
        let other = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), 1024), Idx::Var(2)]);
        assert_ne!(value_key(&gather(plain)), value_key(&gather(other)));
    }
}
