//! The kernel IR: a loop nest over an output index space whose body is an expression tree.
//!
//! Loads read input buffers through affine index maps of the loop variables, so broadcasts,
//! transposes, slices, reverses and reshapes are index arithmetic rather than copies; fusion
//! later inlines producers into the same tree. Reductions (reduce, dot_general) are expression
//! nodes with loops of their own.

use kiln_ir::{Combiner, ComparisonDirection, DType, Op, OpKind, TensorType};

/// An elementwise operation in a kernel body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

impl Ew {
    /// The kernel operation of elementwise op `op` (whether the kernels have it for its dtypes
    /// is `elementwise_supported`'s to say).
    pub fn of(op: &Op) -> Ew {
        match op {
            Op::Compare {
                comparison_direction,
            } => Ew::Cmp(*comparison_direction),
            Op::Select {} => Ew::Select,
            Op::Clamp {} => Ew::Clamp,
            Op::Convert {} => Ew::Convert,
            _ => Ew::Kind(op.kind()),
        }
    }

    /// The operand whose dtype is the operation's: `select`'s first choice, else the first.
    pub fn typed_operand(&self) -> usize {
        usize::from(*self == Ew::Select)
    }
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
    pub(crate) fn var_plus(v: usize, c: i64) -> Idx {
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
    /// Result `result` of the reduction `fold` (a `reduce_region` whose body is elementwise).
    /// The node stands in each output of the kernel that writes one of its results, the same
    /// `fold` in each: the emitter computes all of them once.
    Fold { fold: Box<Fold>, result: usize },
    /// Argument `slot` of a [`Fold`]'s body (its accumulators, then the elements); only inside
    /// [`Fold::body`].
    Arg { slot: usize, dtype: DType },
}

/// A reduction with `k` coupled accumulators and a body of its own (a `reduce_region` with an
/// elementwise body, such as argmax's values and indices): the accumulators start at `inits`;
/// at each position of the loops over `vars` (outermost first) the elements `elems` are
/// computed and the accumulators become `body` applied to them (reading
/// [`Expr::Arg`] `0..k`, the accumulators, and `k..2k`, the elements). The order of the
/// applications is left open, as the op's spec leaves it: the schedule may keep several sets
/// of accumulators (one per vector lane, starting at elements) and combine them with the body
/// at the end, then with the inits; unless `in_order`, which keeps the reference's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Fold {
    /// The accumulators' starting values, over the output position.
    pub inits: Vec<Expr>,
    /// The reduction loops `(var, extent)`.
    pub vars: Vec<(usize, usize)>,
    /// The elements at each position of the loops.
    pub elems: Vec<Expr>,
    /// The new accumulators, from [`Expr::Arg`]s and constants.
    pub body: Vec<Expr>,
    /// Whether the body is applied in the reference's order only: from the inits, at each
    /// position of the loops in row-major order (a `reduce_window_region`'s window, whose op
    /// fixes that order), so that any body gives the reference's results.
    pub in_order: bool,
}

impl Fold {
    /// The number of accumulators.
    pub fn arity(&self) -> usize {
        self.inits.len()
    }
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
            | Expr::Gather { dtype, .. }
            | Expr::Arg { dtype, .. } => *dtype,
            Expr::Guard { then, .. } => then.dtype(),
            Expr::Fold { fold, result } => fold.body[*result].dtype(),
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
    /// `kind(out[target], body)`, skipped when out of bounds. The result is that of one
    /// thread, in order (a GPU runs it in parallel keeping each element's order:
    /// `gpu/map/scatter.rs`).
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
    /// and `body` (the source value) is combined into the output there. The result is that
    /// of one thread, in order (a GPU runs a thread per output element keeping each
    /// element's order: `gpu/map/select_scatter.rs`).
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
        /// Where A's and B's matrices lie in the buffers they are read from, when not one
        /// after another with their rows whole (see [`Strides`]): layouts of other shapes
        /// that the product reads in place (attention's heads in `[batch, seq, heads *
        /// width]`), instead of a kernel copying them out first.
        strides: [Option<Strides>; 2],
        /// Where the product is stored, when not as the kernel's `out` by rows: in the buffer
        /// of a layout of it, through strides (see [`Store`]).
        store: Option<Box<Store>>,
        /// Where one operand is expected to hold zeros (a causal mask's triangle): the tiles
        /// may leave out those contraction steps, after checking at run time that they are
        /// zeros and that the other operand's same steps are finite (see [`ZeroBlocks`]).
        zero: Option<ZeroBlocks>,
        /// Where no reader ever uses the product (a causal mask's scores, which every reader
        /// selects away): the tiles may leave those elements uncomputed (see [`Unread`]).
        unread: Option<Box<Unread>>,
    },
}

/// A GEMM's product stored in place in the buffer of a layout of it (attention's heads
/// `[batch, heads, seq, width]` merged back into `[batch, seq, heads * width]`), instead of
/// a kernel copying it there: the kernel computes `buffer`, whose every element is one element
/// of the product, and its `out` stays the product's type. The product's `[batch, m, n]`
/// matrices lie in the buffer as `strides` say, their rows of `n` consecutive elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    /// The buffer written (the layout's type).
    pub buffer: TensorType,
    /// Where each matrix of the product lies in it.
    pub strides: Strides,
}

impl Store {
    /// Whether storing a product of `batch` matrices of `m` rows of `n` elements of `dtype`
    /// writes each element of the buffer once: as many elements, all inside it, no two at one
    /// position (see [`Strides::disjoint`]).
    pub fn writes_each_once(&self, batch: usize, m: usize, n: usize, dtype: DType) -> bool {
        let s = &self.strides;
        let extents: usize = s.batch.iter().map(|b| b.0).product();
        self.buffer.dtype == dtype
            && batch * m * n > 0
            && self.buffer.numel() == batch * m * n
            && extents == batch
            && s.end(m, n) <= self.buffer.numel()
            && s.disjoint(m, n)
    }
}

/// A GEMM operand expected to be zero where `step * a + x * b + c > 0` (`a` and `b` are 1
/// or -1), `step` the contraction step and `x` the row within its batch (for A) or the column
/// (for B): the causal mask's triangle of attention's probabilities and their gradient. It is
/// only a hint: a tile leaves out the steps where the hint says one operand is zero after
/// checking at run time that it is zero there and that the other operand is finite there
/// (`0 * inf` and `0 * NaN` are NaN), so the result is what the full product computes, bit
/// for bit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ZeroBlocks {
    /// The operand: 0 for A, 1 for B.
    pub operand: usize,
    /// `(a, b, c)`: zero where `step * a + x * b + c > 0`.
    pub at: (i64, i64, i64),
}

/// The elements of a GEMM's product that nothing reads: those at row `row` and column `col`
/// of their matrix (within the batch) where `col * a + row * b + c > 0` (`a` and `b` are 1 or
/// -1). Each reader (a later kernel's body, or the product's own epilogue) reads the product
/// there only inside the arm of a `select` that the comparison leaves unchosen (the causal
/// mask's `select(col <= row, s, -inf)`), so its results do not depend on those elements and a
/// tile wholly among them need not be computed: the CPU's tiles store zeros there instead
/// (the buffer's elements stay defined), which is exact whatever the operands hold, infinities
/// and NaN included. Fusion decides it from every reader of the product; the verifier checks
/// it the same way ([`crate::unread`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unread {
    /// `(a, b, c)`: unread where `col * a + row * b + c > 0`.
    pub at: (i64, i64, i64),
}

/// Where a GEMM operand's matrices lie in its buffer, read in place: the rows stored (A's
/// `m` rows of `k` elements, its `k` rows of `m` with `a_trans`; B's `k` rows of `n`, its `n`
/// rows of `k` with `b_trans`) each have their elements consecutive, and are `ld` elements
/// apart; batch `(i0, i1, ...)` (its index split over `batch`'s extents, row-major) starts at
/// `offset + i0 * s0 + i1 * s1 + ...`. Without it an operand's matrices follow one another,
/// rows whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Strides {
    /// The element where the first matrix starts.
    pub offset: usize,
    /// Per batch dimension, outermost first: its extent and the elements between its
    /// consecutive indices (the extents multiply to the product's batch).
    pub batch: Vec<(usize, usize)>,
    /// Elements between consecutive stored rows.
    pub ld: usize,
}

impl Strides {
    /// The element after the last one read, for stored rows of `row_len` elements, `rows` of
    /// them a matrix (the buffer must hold at least that many).
    pub fn end(&self, rows: usize, row_len: usize) -> usize {
        let last: usize = self.batch.iter().map(|&(e, s)| (e - 1) * s).sum();
        self.offset + last + (rows - 1) * self.ld + row_len
    }

    /// Whether distinct elements of the matrices (`rows` rows of `row_len` elements each) lie
    /// at distinct positions: ordered by stride, each dimension's stride passes the farthest
    /// element the smaller ones reach. What a product stored through strides needs, so that
    /// no element is written twice.
    pub fn disjoint(&self, rows: usize, row_len: usize) -> bool {
        let mut dims: Vec<(usize, usize)> = (self.batch.iter().copied())
            .chain([(rows, self.ld), (row_len, 1)])
            .filter(|&(e, _)| e > 1)
            .collect();
        dims.sort_by_key(|&(_, s)| s);
        let mut reach = 0;
        dims.iter().all(|&(e, s)| {
            let ok = s > reach;
            reach += (e - 1) * s;
            ok
        })
    }
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
    /// Where its B's matrices lie when read in place through strides (see [`Strides`]).
    pub b_strides: Option<Strides>,
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

impl Kernel {
    /// A GEMM kernel's product's dtype: its output's, or, with an epilogue, the dtype the
    /// epilogue reads the product in (a GPU's tensor-core product, f32, whose epilogue ends in
    /// a conversion to bf16 or f16: `fuse/epilogue.rs`).
    pub fn product_dtype(&self) -> DType {
        struct Find(usize, Option<DType>);
        impl<'e> Visitor<'e> for Find {
            fn expr(&mut self, e: &'e Expr) {
                match e {
                    Expr::Load { input, dtype, .. } | Expr::Gather { input, dtype, .. }
                        if *input == self.0 && self.1.is_none() =>
                    {
                        self.1 = Some(*dtype)
                    }
                    _ => e.for_each_child(self),
                }
            }
        }
        match self.schedule {
            Schedule::Gemm {
                epilogue: Some(e), ..
            } => {
                let mut f = Find(e, None);
                f.expr(&self.body);
                f.1.unwrap_or(self.out.dtype)
            }
            _ => self.out.dtype,
        }
    }
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

/// A walk over an expression tree that looks at some nodes and passes through the others:
/// each method's default visits the node's children ([`Expr::for_each_child`],
/// [`Idx::for_each_child`]), so an implementation overrides what it looks at and calls those
/// to go on below it. This and [`Rewriter`] are the one place that knows every node's
/// children: a new variant is added there.
pub trait Visitor<'e> {
    /// Visits an expression; by default, its children.
    fn expr(&mut self, e: &'e Expr) {
        e.for_each_child(self);
    }

    /// Visits an index expression; by default, its children.
    fn idx(&mut self, i: &'e Idx) {
        i.for_each_child(self);
    }
}

/// A rewrite of an expression tree: each method's default rebuilds the node from its children
/// rewritten ([`Expr::map_children`], [`Idx::map_children`]), so an implementation overrides
/// the nodes it changes and calls those to rewrite below them.
pub trait Rewriter {
    /// Rewrites an expression; by default, its children.
    fn expr(&mut self, e: &Expr) -> Expr {
        e.map_children(self)
    }

    /// Rewrites an index expression; by default, its children.
    fn idx(&mut self, i: &Idx) -> Idx {
        i.map_children(self)
    }
}

impl Expr {
    /// Calls `v` on each expression and index expression directly inside this one, in order:
    /// an index node's index, an op's operands, a reduction's start then its body, a gather's
    /// indices, a guard's conditions then its branches, a fold's inits, elements and body
    /// (loads, iotas, constants and arguments have none).
    pub fn for_each_child<'e, V: Visitor<'e> + ?Sized>(&'e self, v: &mut V) {
        match self {
            Expr::Load { .. } | Expr::Iota { .. } | Expr::Const { .. } | Expr::Arg { .. } => {}
            Expr::Fold { fold, .. } => {
                let Fold {
                    inits, elems, body, ..
                } = &**fold;
                inits
                    .iter()
                    .chain(elems)
                    .chain(body)
                    .for_each(|x| v.expr(x));
            }
            Expr::Index { idx, .. } => v.idx(idx),
            Expr::Op { args, .. } => args.iter().for_each(|a| v.expr(a)),
            Expr::Reduce { init, body, .. } => {
                v.expr(init);
                v.expr(body);
            }
            Expr::Gather { index, .. } => index.iter().for_each(|i| v.idx(i)),
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                conds.iter().for_each(|c| v.idx(c.idx()));
                v.expr(then);
                v.expr(otherwise);
            }
        }
    }

    /// This node with each child (as [`Expr::for_each_child`] lists them, in that order)
    /// replaced by what `r` makes of it; the node's own fields (inputs, dtypes, a load's
    /// coefficients, an iota's variable, a reduction's variables) stay as they are.
    pub fn map_children<R: Rewriter + ?Sized>(&self, r: &mut R) -> Expr {
        match self {
            Expr::Load { .. } | Expr::Iota { .. } | Expr::Const { .. } | Expr::Arg { .. } => {
                self.clone()
            }
            Expr::Fold { fold, result } => {
                let mut all = |xs: &[Expr]| xs.iter().map(|x| r.expr(x)).collect::<Vec<_>>();
                let inits = all(&fold.inits);
                let elems = all(&fold.elems);
                let body = all(&fold.body);
                Expr::Fold {
                    fold: Box::new(Fold {
                        inits,
                        vars: fold.vars.clone(),
                        elems,
                        body,
                        in_order: fold.in_order,
                    }),
                    result: *result,
                }
            }
            Expr::Index { idx, dtype } => Expr::Index {
                idx: r.idx(idx),
                dtype: *dtype,
            },
            Expr::Op { op, dtype, args } => Expr::Op {
                op: op.clone(),
                dtype: *dtype,
                args: args.iter().map(|a| r.expr(a)).collect(),
            },
            Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } => {
                let init = Box::new(r.expr(init));
                Expr::Reduce {
                    kind: *kind,
                    dtype: *dtype,
                    init,
                    vars: vars.clone(),
                    body: Box::new(r.expr(body)),
                }
            }
            Expr::Gather {
                input,
                dtype,
                index,
                strides,
            } => Expr::Gather {
                input: *input,
                dtype: *dtype,
                index: index.iter().map(|i| r.idx(i)).collect(),
                strides: strides.clone(),
            },
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                let conds = conds
                    .iter()
                    .map(|c| match c {
                        Cond::InRange(i, lo, hi) => Cond::InRange(r.idx(i), *lo, *hi),
                        Cond::Divisible(i, m) => Cond::Divisible(r.idx(i), *m),
                    })
                    .collect();
                let then = Box::new(r.expr(then));
                Expr::Guard {
                    conds,
                    then,
                    otherwise: Box::new(r.expr(otherwise)),
                }
            }
        }
    }
}

impl Idx {
    /// Calls `v` on each index expression directly inside this one (a sum's terms, the
    /// operand of a product, quotient or clamp), or on the expression of a run-time index.
    pub fn for_each_child<'e, V: Visitor<'e> + ?Sized>(&'e self, v: &mut V) {
        match self {
            Idx::Var(_) | Idx::Const(_) => {}
            Idx::Add(xs) => xs.iter().for_each(|x| v.idx(x)),
            Idx::Mul(x, _) | Idx::Div(x, _) | Idx::Clamp(x, ..) => v.idx(x),
            Idx::Value(e) => v.expr(e),
        }
    }

    /// This index with each child (as [`Idx::for_each_child`] lists them) replaced by what
    /// `r` makes of it.
    pub fn map_children<R: Rewriter + ?Sized>(&self, r: &mut R) -> Idx {
        match self {
            Idx::Var(_) | Idx::Const(_) => self.clone(),
            Idx::Add(xs) => Idx::Add(xs.iter().map(|x| r.idx(x)).collect()),
            Idx::Mul(x, c) => Idx::Mul(Box::new(r.idx(x)), *c),
            Idx::Div(x, c) => Idx::Div(Box::new(r.idx(x)), *c),
            Idx::Clamp(x, lo, hi) => Idx::Clamp(Box::new(r.idx(x)), *lo, *hi),
            Idx::Value(e) => Idx::Value(Box::new(r.expr(e))),
        }
    }
}

impl Cond {
    /// The index expression the condition tests.
    pub fn idx(&self) -> &Idx {
        match self {
            Cond::InRange(i, ..) | Cond::Divisible(i, _) => i,
        }
    }
}

/// Calls `f` on `e` and every expression inside it (operands, reduction bodies, index
/// expressions, guard conditions and branches), parents first.
pub fn visit(e: &Expr, f: &mut dyn FnMut(&Expr)) {
    struct Each<'f>(&'f mut dyn FnMut(&Expr));
    impl<'e> Visitor<'e> for Each<'_> {
        fn expr(&mut self, e: &'e Expr) {
            (self.0)(e);
            e.for_each_child(self);
        }
    }
    Each(f).expr(e);
}
