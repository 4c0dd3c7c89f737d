//! Matrix products on the GPU: by block tiles through shared memory (`tiled.rs`), or one
//! thread per output element over the contraction where the target has no tile; the epilogue
//! and a chained product as further launches (see the parent module).

use super::tiled::Operands;
use super::*;

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
        } = &k.schedule
        else {
            unreachable!("a GEMM kernel")
        };
        let (a, b) = match (ins.first(), ins.get(1)) {
            (Some(a), Some(b)) => (a.clone(), b.clone()),
            _ => return Err(format!("{name}: a matrix product needs two inputs")),
        };
        let mut scratch = Vec::new();
        let mut launches = Vec::new();
        let product_to = if epilogue.is_none() && chain.is_none() {
            (Buf::Output(0), k.out.clone())
        } else {
            scratch.push(k.out.clone());
            (Buf::Scratch(0), k.out.clone())
        };
        let dims = Product {
            batch: *batch,
            m: *m,
            n: *n,
            k: *kk,
            a_trans: *a_trans,
            b_trans: *b_trans,
        };
        launches.push(self.product(
            &format!("{name}.product"),
            a,
            b,
            &dims,
            conv.as_ref(),
            product_to.clone(),
        ));
        if let Some(e) = epilogue {
            let to = if chain.is_some() {
                scratch.push(k.out.clone());
                (Buf::Scratch(1), k.out.clone())
            } else {
                (Buf::Output(0), k.out.clone())
            };
            while ins.len() <= *e {
                ins.push((Buf::Scratch(0), k.out.clone()));
            }
            ins[*e] = product_to.clone();
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
            };
            launches.push(self.product(
                &format!("{name}.chain"),
                a,
                b,
                &dims,
                None,
                (Buf::Output(0), ch.out.clone()),
            ));
        }
        Ok(GpuProgram { scratch, launches })
    }

    /// The product `a x b`, stored at its place in `out` (by feature planes for a convolution
    /// that asks for them): by block tiles ([`Mapper::tiled_product`]) when the target has a
    /// tile for it, else one thread per element over the whole contraction.
    fn product(
        &self,
        name: &str,
        a: (Buf, TensorType),
        b: (Buf, TensorType),
        d: &Product,
        conv: Option<&ConvPatches>,
        out: (Buf, TensorType),
    ) -> GpuKernel {
        let dtype = out.1.dtype;
        let (m, n, kk) = (d.m as i64, d.n as i64, d.k as i64);
        let as_out = |e: Expr| {
            if e.dtype() == dtype {
                e
            } else {
                Expr::Op {
                    op: Ew::Convert,
                    dtype,
                    args: vec![e],
                }
            }
        };
        let a_elem = match conv {
            None => Expr::Load {
                input: 0,
                dtype: a.1.dtype,
                coef: if d.a_trans {
                    vec![kk * m, 1, 0, m]
                } else {
                    vec![m * kk, kk, 0, 1]
                },
                off: 0,
            },
            Some(p) => Expr::Gather {
                input: 0,
                dtype: a.1.dtype,
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
        let b_elem = Expr::Load {
            input: 1,
            dtype: b.1.dtype,
            coef: b_coef,
            off: 0,
        };
        let (a_elem, b_elem) = (as_out(a_elem), as_out(b_elem));
        let total = d.batch * d.m * d.n;
        let ops = Operands {
            a: &a_elem,
            b: &b_elem,
            a_trans: d.a_trans && conv.is_none(),
            b_trans: d.b_trans,
            planes: conv.is_some_and(|c| c.planes),
        };
        let types = (a.1.dtype, b.1.dtype, dtype);
        if let Some(tile) = self.mma_tile((d.m, d.n), types).filter(|_| total > 0) {
            return self.mma_product(name, (a, b), d, &ops, tile, out);
        }
        if let Some(tile) = self.gemm_tile(d.m, d.n, dtype).filter(|_| total > 0) {
            return self.tiled_product(name, (a, b), d, &ops, tile, out);
        }
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
        let index = match conv {
            Some(c) if c.planes => Sc::plus(
                Sc::times(
                    Sc::plus(Sc::times(Sc::Var(0), Sc::Const(n)), Sc::Var(2)),
                    Sc::Const(m),
                ),
                Sc::Var(1),
            ),
            _ => Sc::Reg(p),
        };
        let mut each = set_vars(&[(0, d.batch), (1, d.m), (2, d.n)], Sc::Reg(p));
        each.push(Stmt::Eval {
            reg: v,
            expr: body,
            scalars: Vec::new(),
        });
        each.push(Stmt::Store {
            buf: Buf::Output(0),
            index,
            value: v,
        });
        let block = self.gpu.elementwise_block;
        GpuKernel {
            name: name.to_string(),
            kind: MapKind::Gemm,
            grid: self.grid(total, block),
            block,
            warp: self.gpu.warp_size,
            inputs: vec![a, b],
            outputs: vec![out],
            shared: Vec::new(),
            regs: r.0,
            vars: 4,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: p,
                start: Sc::plus(
                    Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                    sp(Special::Thread),
                ),
                end: c(total),
                step: Sc::times(sp(Special::BlockDim), sp(Special::GridDim)),
                body: each,
            }],
        }
    }
}

/// The dimensions of one product launch.
pub(super) struct Product {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_trans: bool,
    pub b_trans: bool,
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
