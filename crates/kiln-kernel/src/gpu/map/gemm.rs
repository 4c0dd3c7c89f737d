//! Matrix products on the GPU: by block tiles through shared memory (`tiled.rs`, and
//! `tensor.rs` on the tensor cores), or one thread per output element over the contraction
//! where the target has no tile; a chained product as a further launch (see the parent
//! module).
//!
//! # Epilogues in the product's launch
//!
//! Fusion (`fuse/epilogue.rs`) makes the elementwise user of a product (a bias, an activation,
//! a residual, an SGD update) or a row-reducing one (a softmax) the GEMM kernel's epilogue, as
//! on the CPU. On the GPU an epilogue that reads the product only at its own position (the
//! same test the CPU's in-place epilogue passes, `access::reads_only_own_position`) runs in
//! the product's launch ([`InLaunch`]): each thread evaluates it on its finished accumulators,
//! the product element read from the accumulator's register, the other inputs (bias,
//! residual) from global memory, and stores the epilogue's value; the product never reaches
//! global memory. A row-reducing epilogue needs the whole row of the product, which no thread
//! holds, so it runs as a second launch over a scratch product (mapped as a loop nest: a
//! softmax gets warps), and so does the epilogue of a chained product.

use super::skip::Skip;
use super::tiled::Operands;
use super::zero_steps::{ZeroSteps, stages_left_out};
use super::*;
use crate::access::reads_only_own_position;
use crate::ir::{Strides, Unread, ZeroBlocks};
use crate::target::GemmTile;

/// An elementwise epilogue run in the product's launch (see the module documentation).
pub(super) struct InLaunch {
    /// The epilogue, its reads of the product as loads of extra input `product` with zero
    /// coefficients: the accumulator's register ([`Stmt::Eval`]'s `scalars`).
    body: Expr,
    /// The result's shape: the epilogue's first variables are its dimensions.
    shape: Vec<usize>,
    /// The epilogue's kernel variables.
    pub vars: usize,
    /// The product's dtype (the epilogue may convert it to the result's).
    pub product: DType,
}

impl InLaunch {
    /// `k`'s epilogue (reading the product as input `e`, after its `inputs` others) as an
    /// in-launch epilogue, if it reads the product only at its own position and there is no
    /// chained product.
    fn of(k: &Kernel, e: usize, inputs: usize) -> Option<InLaunch> {
        let Schedule::Gemm { chain: None, .. } = k.schedule else {
            return None;
        };
        (e == inputs && reads_only_own_position(&k.body, e, &k.out)).then(|| InLaunch {
            body: scalar_reads(&k.body, e, k.vars),
            shape: k.out.shape.clone(),
            vars: k.vars,
            product: k.product_dtype(),
        })
    }

    /// The conversion of an f32 product to `out`'s dtype as it is stored (a tensor-core
    /// product of bf16 or f16 operands whose result is of their dtype), read as extra input
    /// `product` (after the launch's A and B).
    fn narrowing(out: &TensorType, product: usize) -> InLaunch {
        let vars = out.rank().max(4);
        InLaunch {
            body: Expr::Op {
                op: Ew::Convert,
                dtype: out.dtype,
                args: vec![Expr::Load {
                    input: product,
                    dtype: DType::F32,
                    coef: vec![0; vars],
                    off: 0,
                }],
            },
            shape: out.shape.clone(),
            vars,
            product: DType::F32,
        }
    }

    /// Statements storing value register `value`, the product's element at flat `index` of
    /// the result, into output 0: through `epilogue` if there is one, the index kept in
    /// integer register `tmp.0` (it may read the variables the epilogue sets) and the
    /// epilogue's value in `tmp.1`.
    pub(super) fn store(
        epilogue: Option<&InLaunch>,
        index: Sc,
        value: usize,
        tmp: (usize, usize),
    ) -> Vec<Stmt> {
        let Some(e) = epilogue else {
            return vec![Stmt::Store {
                buf: Buf::Output(0),
                index,
                value,
            }];
        };
        let mut out = vec![Stmt::Let {
            reg: tmp.0,
            value: index,
        }];
        out.extend(set_vars(&dims(&e.shape, 0), Sc::Reg(tmp.0)));
        out.push(Stmt::Eval {
            reg: tmp.1,
            expr: e.body.clone(),
            scalars: vec![value],
        });
        out.push(Stmt::Store {
            buf: Buf::Output(0),
            index: Sc::Reg(tmp.0),
            value: tmp.1,
        });
        out
    }
}

impl Mapper<'_> {
    /// A matrix product (with its epilogue and chained product, see the module
    /// documentation).
    pub(super) fn gemm(
        &self,
        name: &str,
        k: &Kernel,
        mut ins: Vec<(Buf, TensorType)>,
    ) -> Result<GpuProgram, String> {
        let Schedule::Gemm {
            epilogue,
            batch,
            m,
            n,
            k: kk,
            conv,
            a_trans,
            b_trans,
            chain,
            strides,
            store,
            zero,
            unread,
        } = &k.schedule
        else {
            unreachable!("a GEMM kernel")
        };
        let (a, b) = match (ins.first(), ins.get(1)) {
            (Some(a), Some(b)) => (a.clone(), b.clone()),
            _ => return Err(format!("{name}: a matrix product needs two inputs")),
        };
        let dims = Product {
            batch: *batch,
            m: *m,
            n: *n,
            k: *kk,
            a_trans: *a_trans,
            b_trans: *b_trans,
            strides: strides.clone(),
            store: store.as_ref().map(|st| st.strides.clone()),
            unread: unread.as_deref().filter(|_| conv.is_none()).cloned(),
            zero: zero.clone().filter(|_| conv.is_none()),
        };
        // Attention (a softmax epilogue computed online, chained): one launch.
        let attention = match (epilogue, chain, conv) {
            (Some(e), Some(ch), None) => self.attention(name, k, &ins, &dims, (*e, ch)),
            _ => None,
        };
        if let Some(l) = attention {
            return Ok(GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![l],
            });
        }
        let mut scratch = Vec::new();
        let mut launches = Vec::new();
        let in_launch = epilogue.and_then(|e| InLaunch::of(k, e, ins.len()));
        // A bf16 or f16 attention the tensor-core mapping does not take: its f32 scores (in a
        // scratch buffer of the product's dtype, as for any epilogue of its own launch), the
        // softmax in its dtype, the chained product on the tensor cores, converted as stored.
        let half_chain = chain.is_some() && MmaOperand::of_half(k.out.dtype).is_some();
        let product_to = if let Some(st) = store {
            // Stored through strides (a plain product: no epilogue nor chain): the layout's
            // buffer, as many elements of the product's dtype.
            (Buf::Output(0), st.buffer.clone())
        } else if (epilogue.is_none() || in_launch.is_some()) && chain.is_none() {
            (Buf::Output(0), k.out.clone())
        } else {
            let product = TensorType {
                dtype: k.product_dtype(),
                shape: k.out.shape.clone(),
            };
            scratch.push(product.clone());
            (Buf::Scratch(0), product)
        };
        let operands = if in_launch.is_some() {
            ins.clone()
        } else {
            vec![a, b]
        };
        launches.push(self.product(
            &format!("{name}.product"),
            operands,
            &dims,
            conv.as_ref(),
            product_to.clone(),
            in_launch.as_ref(),
        ));
        if let Some(e) = epilogue.filter(|_| in_launch.is_none()) {
            let to = if chain.is_some() {
                scratch.push(k.out.clone());
                (Buf::Scratch(1), k.out.clone())
            } else {
                (Buf::Output(0), k.out.clone())
            };
            while ins.len() <= e {
                ins.push((Buf::Scratch(0), k.out.clone()));
            }
            ins[e] = product_to.clone();
            launches.push(self.nest(
                &format!("{name}.epilogue"),
                &k.out,
                k.vars,
                ins.clone(),
                vec![(to.0, to.1, k.body.clone())],
            ));
        }
        if let Some(ch) = chain {
            let a = (
                if epilogue.is_some() {
                    Buf::Scratch(1)
                } else {
                    Buf::Scratch(0)
                },
                k.out.clone(),
            );
            let b = ins
                .get(ch.b)
                .cloned()
                .ok_or_else(|| format!("{name}: no input {} for the chained product", ch.b))?;
            let dims = Product {
                batch: *batch,
                m: *m,
                n: ch.n,
                k: *n,
                a_trans: false,
                b_trans: ch.b_trans,
                strides: [None, ch.b_strides.clone()],
                store: None,
                unread: None,
                zero: None,
            };
            let narrow =
                (half_chain && b.1.dtype == ch.out.dtype).then(|| InLaunch::narrowing(&ch.out, 2));
            launches.push(self.product(
                &format!("{name}.chain"),
                vec![a, b],
                &dims,
                None,
                (Buf::Output(0), ch.out.clone()),
                narrow.as_ref(),
            ));
        }
        Ok(GpuProgram::new(scratch, launches))
    }

    /// The product `a x b` of the first two `inputs`, stored at its place in `out` (by
    /// feature planes for a convolution that asks for them), through `epilogue` if there is
    /// one (which reads the other inputs): by block tiles ([`Mapper::tiled_product`],
    /// [`Mapper::mma_product`]: on the tensor cores for 16-bit operands, and for f32 ones when
    /// the options allow TF32; [`Mapper::wgmma_product`] on warpgroups for 16-bit operands
    /// where the GPU has them and a tile) when the target has a tile for it, else one thread per element
    /// over the whole contraction.
    fn product(
        &self,
        name: &str,
        inputs: Vec<(Buf, TensorType)>,
        d: &Product,
        conv: Option<&ConvPatches>,
        out: (Buf, TensorType),
        epilogue: Option<&InLaunch>,
    ) -> GpuKernel {
        let (a_dtype, b_dtype) = (inputs[0].1.dtype, inputs[1].1.dtype);
        let dtype = epilogue.map_or(out.1.dtype, |e| e.product);
        let (a_elem, b_elem) = operand_exprs(d, conv, (a_dtype, b_dtype), dtype);
        let total = d.batch * d.m * d.n;
        let ops = Operands {
            a: &a_elem,
            b: &b_elem,
            planes: conv.is_some_and(|c| c.planes),
        };
        let types = (a_dtype, b_dtype, dtype);
        let launch = Launch {
            name,
            inputs,
            out,
            epilogue,
        };
        let leaves_out = d.leaves_out();
        let skip = leaves_out.as_ref().map(|f| f as &dyn Fn(&GemmTile) -> bool);
        if let Some(tile) = self
            .wgmma_tile((d.m, d.n), types, skip)
            .filter(|_| total > 0)
        {
            if let Some(ring) = self.tma_ring(d, &ops, tile) {
                return self.wgmma_tma_product(launch, d, &ops, tile, ring);
            }
            return self.wgmma_product(launch, d, &ops, tile);
        }
        if let Some(tile) = self.mma_tile((d.m, d.n), types, skip).filter(|_| total > 0) {
            return self.mma_product(launch, d, &ops, tile);
        }
        if let Some(tile) = self
            .gemm_tile((d.m, d.n), dtype, skip)
            .filter(|_| total > 0)
        {
            return self.tiled_product(launch, d, &ops, tile);
        }
        let note = d
            .zero_steps(&ops)
            .map(|z| z.every_step("a thread per element"));
        let Launch {
            inputs,
            out,
            epilogue,
            ..
        } = launch;
        let body = Expr::Reduce {
            kind: Combiner::Add,
            dtype,
            init: Box::new(Expr::Const { dtype, value: 0.0 }),
            vars: vec![(3, d.k)],
            body: Box::new(Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype,
                args: vec![a_elem, b_elem],
            }),
        };
        let mut r = Regs::default();
        let p = r.next();
        let v = r.next();
        let tmp = (r.next(), r.next());
        let index = match (conv, &d.store) {
            (_, Some(s)) => strided::stored_at(s, Sc::Var(0), Sc::Var(1), Sc::Var(2)),
            (Some(c), _) if c.planes => Sc::plus(
                Sc::times(
                    Sc::plus(Sc::times(Sc::Var(0), Sc::Const(d.n as i64)), Sc::Var(2)),
                    Sc::Const(d.m as i64),
                ),
                Sc::Var(1),
            ),
            _ => Sc::Reg(p),
        };
        let mut each = set_vars(&[(0, d.batch), (1, d.m), (2, d.n)], Sc::Reg(p));
        let eval = Stmt::Eval {
            reg: v,
            expr: body,
            scalars: Vec::new(),
        };
        each.extend(note);
        match d.skip() {
            Some(s) => each.extend(s.around_element(v, dtype, eval)),
            None => each.push(eval),
        }
        each.extend(InLaunch::store(epilogue, index, v, tmp));
        self.grid_stride(
            (name, MapKind::Gemm),
            (inputs, vec![out]),
            (r.0, epilogue.map_or(4, |e| e.vars.max(4))),
            (p, total, each),
        )
    }
}

/// `body` with its reads of input `e` (loads or gathers, at its own position) as loads of
/// extra input `e` with zero coefficients over `vars` variables: an [`Stmt::Eval`] reads them
/// from its first scalar register, when `e` is the launch's input count.
pub(super) fn scalar_reads(body: &Expr, e: usize, vars: usize) -> Expr {
    struct Scalar(usize, usize);
    impl Rewriter for Scalar {
        fn expr(&mut self, x: &Expr) -> Expr {
            match x {
                Expr::Load { input, dtype, .. } | Expr::Gather { input, dtype, .. }
                    if *input == self.0 =>
                {
                    Expr::Load {
                        input: self.0,
                        dtype: *dtype,
                        coef: vec![0; self.1],
                        off: 0,
                    }
                }
                _ => x.map_children(self),
            }
        }
    }
    Scalar(e, vars).expr(body)
}

/// One product launch's name, buffers and epilogue.
pub(super) struct Launch<'n, 'e> {
    pub name: &'n str,
    /// A, B, then the epilogue's other inputs.
    pub inputs: Vec<(Buf, TensorType)>,
    pub out: (Buf, TensorType),
    pub epilogue: Option<&'e InLaunch>,
}

impl Launch<'_, '_> {
    /// The statement storing value register `value`, the product's element at `(row, col)`
    /// of batch register `batch`, into the result if it lies inside its `d.m x d.n` (by feature
    /// planes where `planes`, else row-major), through the epilogue as [`InLaunch::store`].
    pub(super) fn store_element(
        &self,
        d: &Product,
        planes: bool,
        batch: usize,
        (row, col): (Sc, Sc),
        value: usize,
        tmp: (usize, usize),
    ) -> Stmt {
        let reg = Sc::Reg;
        let index = if let Some(s) = &d.store {
            strided::stored_at(s, reg(batch), row.clone(), col.clone())
        } else if planes {
            Sc::plus(
                Sc::times(Sc::plus(Sc::times(reg(batch), c(d.n)), col.clone()), c(d.m)),
                row.clone(),
            )
        } else {
            Sc::plus(
                Sc::times(Sc::plus(Sc::times(reg(batch), c(d.m)), row.clone()), c(d.n)),
                col.clone(),
            )
        };
        Stmt::If {
            cond: Sc::and(Sc::lt(row, c(d.m)), Sc::lt(col, c(d.n))),
            body: InLaunch::store(self.epilogue, index, value, tmp),
        }
    }

    /// The launch's kernel of `kind`: `grid` blocks of `block` threads in warps of `warp`,
    /// with `shared`, `regs` registers, the sum tree `sums` and `body` (and as many variables
    /// as the epilogue sets, at least 4).
    pub(super) fn kernel(
        self,
        kind: MapKind,
        (grid, block, warp): (usize, usize, usize),
        shared: Vec<SharedArray>,
        regs: usize,
        sums: SumTree,
        body: Vec<Stmt>,
    ) -> GpuKernel {
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: self.name.to_string(),
            kind,
            grid,
            block,
            warp,
            inputs: self.inputs,
            outputs: vec![self.out],
            shared,
            regs,
            vars: self.epilogue.map_or(4, |e| e.vars.max(4)),
            sums,
            body,
        }
    }
}

/// The statements setting registers `batch`, `m0` and `n0` to the block's batch and the
/// first row and column of its `bm x bn` tile, of `gm x gn` tiles per batch (the block index
/// running over a row of tiles first, then the rows, then the batches).
pub(super) fn tile_origin(
    (batch, m0, n0): (usize, usize, usize),
    (gm, gn): (usize, usize),
    (bm, bn): (usize, usize),
) -> Vec<Stmt> {
    vec![
        Stmt::Let {
            reg: batch,
            value: Sc::quot(sp(Special::Block), c(gm * gn)),
        },
        Stmt::Let {
            reg: m0,
            value: Sc::times(
                Sc::modulo(Sc::quot(sp(Special::Block), c(gn)), c(gm)),
                c(bm),
            ),
        },
        Stmt::Let {
            reg: n0,
            value: Sc::times(Sc::modulo(sp(Special::Block), c(gn)), c(bn)),
        },
    ]
}

/// The dimensions of one product launch.
pub(super) struct Product {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_trans: bool,
    pub b_trans: bool,
    /// Where A's and B's matrices lie in their inputs, when not one after another (see
    /// [`crate::ir::Strides`]).
    pub strides: [Option<Strides>; 2],
    /// Where the product's matrices lie in the buffer it is stored into, when not one after
    /// another by rows (the strides of [`crate::ir::Store`]).
    pub store: Option<Strides>,
    /// Where no reader uses the product (see [`crate::ir::Unread`]): the block tiles wholly
    /// there skip their contraction (`skip.rs`).
    pub unread: Option<Unread>,
    /// Where one operand is zero by a causal mask (see [`crate::ir::ZeroBlocks`]): the block
    /// tiles leave those steps out where checked at run time (`zero_steps.rs`).
    pub zero: Option<ZeroBlocks>,
}

impl Product {
    /// What the launch may leave uncomputed (see `skip.rs`).
    pub(super) fn skip(&self) -> Option<Skip<'_>> {
        self.unread.as_ref().map(|unread| Skip {
            unread,
            mn: (self.m, self.n),
        })
    }

    /// Whether blocks of `t` would leave some of the launch's work out (see `skip::choose`):
    /// a tile wholly unread, or a stage of steps zero for a whole tile (`t.k` indices a
    /// stage); `None` where the launch has neither hint.
    pub(super) fn leaves_out(&self) -> Option<impl Fn(&GemmTile) -> bool + '_> {
        (self.unread.is_some() || self.zero.is_some()).then_some(move |t: &GemmTile| {
            let unread = self
                .skip()
                .is_some_and(|s| s.tiles_unread((t.m, t.n)).0 > 0);
            let zero = self.zero.as_ref().is_some_and(|z| {
                stages_left_out(z, (self.m, self.n, self.k), (t.m, t.n), t.k).0 > 0
            });
            unread || zero
        })
    }

    /// The steps the launch may leave out, with its operands' elements (see `zero_steps.rs`).
    pub(super) fn zero_steps<'e>(&'e self, ops: &'e Operands) -> Option<ZeroSteps<'e>> {
        self.zero.as_ref().map(|zero| ZeroSteps {
            zero,
            mnk: (self.m, self.n, self.k),
            ops: (ops.a, ops.b),
        })
    }
}

/// A's element at variables `(0: batch, 1: row, 3: contraction)` and B's at
/// `(0: batch, 2: column, 3: contraction)` of the product `d` (A read through a convolution's
/// patches with `conv`; A and B through their strides where `d` has them, `strided.rs`),
/// inputs 0 and 1 of `dtypes`, converted to `dtype`.
pub(super) fn operand_exprs(
    d: &Product,
    conv: Option<&ConvPatches>,
    (a_dtype, b_dtype): (DType, DType),
    dtype: DType,
) -> (Expr, Expr) {
    let (m, n, kk) = (d.m as i64, d.n as i64, d.k as i64);
    let a_elem = match (conv, &d.strides[0]) {
        (None, Some(s)) => strided::strided_operand(0, a_dtype, s, 1, !d.a_trans),
        (None, None) => Expr::Load {
            input: 0,
            dtype: a_dtype,
            coef: if d.a_trans {
                vec![kk * m, 1, 0, m]
            } else {
                vec![m * kk, kk, 0, 1]
            },
            off: 0,
        },
        (Some(p), _) => Expr::Gather {
            input: 0,
            dtype: a_dtype,
            index: vec![patch_index(p, m)],
            strides: vec![1],
        },
    };
    let b_coef = match (conv.is_some(), d.b_trans) {
        (true, false) => vec![0, 0, 1, n],
        (true, true) => vec![0, 0, kk, 1],
        (false, false) => vec![kk * n, 0, 1, n],
        (false, true) => vec![n * kk, 0, kk, 1],
    };
    let b_elem = match &d.strides[1] {
        Some(s) if conv.is_none() => strided::strided_operand(1, b_dtype, s, 2, d.b_trans),
        _ => Expr::Load {
            input: 1,
            dtype: b_dtype,
            coef: b_coef,
            off: 0,
        },
    };
    (as_dtype(a_elem, dtype), as_dtype(b_elem, dtype))
}

/// `e` converted to `dtype` (itself if it has that dtype).
pub(super) fn as_dtype(e: Expr, dtype: DType) -> Expr {
    if e.dtype() == dtype {
        e
    } else {
        Expr::Op {
            op: Ew::Convert,
            dtype,
            args: vec![e],
        }
    }
}

/// `x mod m` for `x >= 0`.
fn idx_rem(x: Idx, m: i64) -> Idx {
    Idx::Add(vec![
        x.clone(),
        Idx::Mul(Box::new(Idx::Div(Box::new(x), m)), -m),
    ])
}

/// The flat input element of row `(var 0) * m + (var 1)`, column `var 3` of a convolution's
/// patch matrix.
fn patch_index(p: &ConvPatches, m: i64) -> Idx {
    let g = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), m), Idx::Var(1)]);
    let plane = (p.oh * p.ow) as i64;
    let img = Idx::Div(Box::new(g.clone()), plane);
    let within = idx_rem(g, plane);
    let y = Idx::Div(Box::new(within.clone()), p.ow as i64);
    let x = idx_rem(within, p.ow as i64);
    let col = Idx::Var(3);
    let kh = Idx::Div(Box::new(col.clone()), (p.kw * p.c) as i64);
    let kw = idx_rem(Idx::Div(Box::new(col.clone()), p.c as i64), p.kw as i64);
    let ch = idx_rem(col, p.c as i64);
    let row = Idx::Add(vec![
        Idx::Mul(Box::new(img), p.h as i64),
        Idx::Mul(Box::new(y), p.stride[0] as i64),
        Idx::Mul(Box::new(kh), p.dilation[0] as i64),
    ]);
    let column = Idx::Add(vec![
        Idx::Mul(Box::new(row), p.w as i64),
        Idx::Mul(Box::new(x), p.stride[1] as i64),
        Idx::Mul(Box::new(kw), p.dilation[1] as i64),
    ]);
    Idx::Add(vec![Idx::Mul(Box::new(column), p.c as i64), ch])
}
