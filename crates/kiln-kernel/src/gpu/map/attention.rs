//! Attention as one launch ([`MapKind::Attention`]), flash-attention style: a GEMM kernel
//! whose epilogue is a softmax computed online and whose result is chained into a second
//! product (`softmax(h(Q Kᵀ)) V`, recognized by fusion as on the CPU: `fuse/chain.rs`,
//! [`crate::ir::Chain::online`]) runs without the scores or the probabilities ever reaching
//! global memory.
//!
//! This file holds what both mappings share and the fallback, a warp per query row; where
//! one of `Gpu::attention_tiles` fits, the register tiles of `attention_tiles.rs` take the
//! attention instead (fewer shared-memory loads per multiply-add); bf16 and f16 attention
//! runs on the tensor cores (`attention_mma.rs`).
//!
//! A block of `warps` warps takes `warps` consecutive query rows of one batch, a warp per row.
//! The block stages its rows of Q into shared memory once, then steps through the keys 32 at
//! a time (a lane per key): it stages the step's 32 rows of K and of V into shared memory
//! (zeros past the keys' end; `cp.async` where the operands allow, `staging.rs`), meets at a
//! barrier, and each lane computes its key's score `Q[row] · K[key]` (one chain over the head
//! dimension) and logit `h` (the epilogue's own expression: a scale, a causal mask, a bias
//! read from memory), `-inf` past the keys' end. The warp then combines, by xor shuffles, the
//! step's largest logit with the row's running maximum `m` (kept at least the lowest finite
//! value, so a step where a query sees no key yet adds nothing instead of NaN), rescales its running sum `l` and
//! its output accumulators by `exp(m_old - m)`, adds the step's `p = exp(h - m)` to `l`
//! (a shuffle tree), puts each lane's `p` in shared memory, meets the block at a barrier, and
//! each lane adds `Σ_key p · V[key][col]` for its output columns `lane + 32 t` (a chain of 32
//! per step, then added to the accumulator), and the block meets again before the next step
//! overwrites the tiles. A step whose keys a causal mask hides from every query of the block
//! ([`crate::ir::Chain::masked`]) is skipped. Finally each lane stores `acc / l` for its
//! columns: one write of the output.
//!
//! # The order of the sums
//!
//! The scores are chains of at most `leaf` terms (the mapping requires the head dimension to
//! fit one chunk), lane `l`'s starting at head index `l mod k` and wrapping around (so that
//! the lanes read K's staged rows from different shared-memory banks); a probability's term
//! passes through its step's chain of 32 and one rescale-and-add per later step (the chains'
//! products and sums fused, one rounding each), and the denominator through a 5-level shuffle tree per step
//! and the same chain across steps. The exponentials are kiln's own (the CPU's polynomial).
//! The reference computes the softmax and the product with exact sums; the tests compare
//! within `kiln_reference::accuracy`'s bounds.

use super::gemm::{Product, as_dtype, operand_exprs, scalar_reads};
use super::staging::{Staging, Tile, zero};
use super::*;
use crate::ir::Chain;

/// Keys per step: a lane each.
const KEYS: usize = 32;

/// What both attention mappings (a warp per query row here, register tiles in
/// `attention_tiles.rs`) read: the launch's sizes and its elements as expressions.
pub(super) struct Parts<'a> {
    /// The launch's name.
    pub name: &'a str,
    /// The GEMM kernel.
    pub k: &'a Kernel,
    /// Its inputs.
    pub ins: &'a [(Buf, TensorType)],
    /// The first product (`Q Kᵀ`).
    pub d: &'a Product,
    /// The chained product and its online softmax.
    pub ch: &'a Chain,
    /// The dtype everything is computed in (the result's: f32 or f64; f32 on the tensor
    /// cores).
    pub dtype: DType,
    /// Q's element at variables `(0: batch, 1: row, 3: head index)` (in the result's dtype;
    /// bf16 or f16 on the tensor cores, as K's and V's).
    pub q: Expr,
    /// K's element at variables `(0: batch, 2: key, 3: head index)`.
    pub key: Expr,
    /// V's element at variables `(0: batch, 2: output column, 3: key)`.
    pub v: Expr,
    /// The logit: the epilogue's expression, reading the score as extra input 0.
    pub logit: Expr,
}

impl Parts<'_> {
    /// The statement storing output column `col` of query row `row` (of batch register
    /// `batch`), accumulator `acc` divided by the row's sum `l` in `dtype` through register
    /// `o`, into the result if it lies inside it.
    pub fn store_normalized(
        &self,
        dtype: DType,
        o: usize,
        (acc, l): (usize, usize),
        batch: usize,
        (row, col): (Sc, Sc),
    ) -> Stmt {
        let (m, n2) = (self.d.m, self.ch.n);
        let scalar = |i: usize| Expr::Load {
            input: self.ins.len() + i,
            dtype,
            coef: vec![0; self.k.vars.max(4)],
            off: 0,
        };
        Stmt::If {
            cond: Sc::and(Sc::lt(col.clone(), c(n2)), Sc::lt(row.clone(), c(m))),
            body: vec![
                Stmt::Eval {
                    reg: o,
                    expr: Expr::Op {
                        op: Ew::Kind(OpKind::Divide),
                        dtype,
                        args: vec![scalar(0), scalar(1)],
                    },
                    scalars: vec![acc, l],
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::plus(
                        Sc::times(Sc::plus(Sc::times(Sc::Reg(batch), c(m)), row), c(n2)),
                        col,
                    ),
                    value: o,
                },
            ],
        }
    }

    /// The launch's kernel of `kind`: `grid` blocks of `block` threads in warps of `warp`,
    /// with `shared`, `regs` registers, the sum tree `sums` and `body`.
    pub fn kernel(
        &self,
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
            name: format!("{}.attention", self.name),
            kind,
            grid,
            block,
            warp,
            inputs: self.ins.to_vec(),
            outputs: vec![(Buf::Output(0), self.ch.out.clone())],
            shared,
            regs,
            vars: self.k.vars.max(4),
            sums,
            body,
        }
    }
}

/// The statements setting registers `batch` and `m0` to the block's batch and its first
/// query row, of `gm` blocks of `rows` query rows a batch.
pub(super) fn block_rows((batch, m0): (usize, usize), gm: usize, rows: usize) -> [Stmt; 2] {
    [
        Stmt::Let {
            reg: batch,
            value: Sc::quot(sp(Special::Block), c(gm)),
        },
        Stmt::Let {
            reg: m0,
            value: Sc::times(Sc::modulo(sp(Special::Block), c(gm)), c(rows)),
        },
    ]
}

/// The least finite value of `dtype`: the running maximum never goes below it, so a step
/// where a query sees no key yet (every logit -inf) scales by `exp(-inf - lowest) = 0`,
/// never by `exp(-inf + inf) = NaN`.
pub(super) fn lowest(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        f64::MIN
    } else {
        f32::MIN as f64
    }
}

/// A step's statements, skipped where a causal mask (`masked`: the mask's `a key + b row + c`,
/// [`crate::ir::Chain::masked`]) hides the step's `keys` keys from register `n0` on from all
/// of the block's `rows` query rows from register `m0` on: the whole block agrees, so its
/// barriers stay whole, and the step would scale by 1 and add nothing.
pub(super) fn skip_masked(
    masked: Option<(i64, i64, i64)>,
    (n0, keys): (usize, usize),
    (m0, rows): (usize, usize),
    step: Vec<Stmt>,
) -> Vec<Stmt> {
    let Some((a, b, c0)) = masked else {
        return step;
    };
    // The least value of the mask's expression over the step's keys and the block's rows.
    let key = if a > 0 {
        Sc::Reg(n0)
    } else {
        Sc::plus(Sc::Reg(n0), c(keys - 1))
    };
    let row = if b > 0 {
        Sc::Reg(m0)
    } else {
        Sc::plus(Sc::Reg(m0), c(rows - 1))
    };
    let least = Sc::plus(
        Sc::plus(Sc::times(key, Sc::Const(a)), Sc::times(row, Sc::Const(b))),
        Sc::Const(c0),
    );
    vec![Stmt::If {
        cond: Sc::lt(least, Sc::Const(1)),
        body: step,
    }]
}

impl Mapper<'_> {
    /// Attention as one launch, if `k` (a GEMM kernel with product `d`, reading the product
    /// as input `e` after its inputs `ins`) has an online-softmax chain the target can hold:
    /// f32 or f64, a warp of 32, a head dimension within one chunk of the sum tree; by register
    /// tiles where one of `Gpu::attention_tiles` fits (`attention_tiles.rs`), else a warp per
    /// query row.
    pub(super) fn attention(
        &self,
        name: &str,
        k: &Kernel,
        ins: &[(Buf, TensorType)],
        d: &Product,
        (e, ch): (usize, &Chain),
    ) -> Option<GpuKernel> {
        let h = ch.online.as_ref()?;
        let dtype = k.out.dtype;
        let v_in = ins.get(ch.b)?;
        // bf16 or f16 attention (fusion chains it with a tensor-core product, `fuse/chain.rs`):
        // on the tensor cores, Q, K and V read in their dtype, the rest in f32.
        let half = MmaOperand::of_half(dtype);
        if self.gpu.warp_size != 32
            || e != ins.len()
            || d.k > self.sums.leaf
            || d.m == 0
            || d.n == 0
            || d.k == 0
            || ch.n == 0
            || (half.is_none() && !matches!(dtype, DType::F32 | DType::F64))
        {
            return None;
        }
        let (a_dtype, b_dtype) = (ins.first()?.1.dtype, ins.get(1)?.1.dtype);
        if half.is_some() && (a_dtype != dtype || b_dtype != dtype || v_in.1.dtype != dtype) {
            return None;
        }
        let (q, key) = operand_exprs(d, None, (a_dtype, b_dtype), dtype);
        let (nn, n2i) = (d.n as i64, ch.n as i64);
        // V `[batch, n, n2]` (`[batch, n2, n]` stored transposed), or through its strides:
        // its row variable the output column (2), its contraction the key (3).
        let v = as_dtype(
            match &ch.b_strides {
                Some(s) => super::strided::strided_operand(ch.b, v_in.1.dtype, s, 2, ch.b_trans),
                None => Expr::Load {
                    input: ch.b,
                    dtype: v_in.1.dtype,
                    coef: if ch.b_trans {
                        vec![n2i * nn, 0, nn, 1]
                    } else {
                        vec![nn * n2i, 0, 1, n2i]
                    },
                    off: 0,
                },
            },
            dtype,
        );
        let parts = Parts {
            name,
            k,
            ins,
            d,
            ch,
            dtype: if half.is_some() { DType::F32 } else { dtype },
            q,
            key,
            v,
            logit: scalar_reads(h, e, k.vars),
        };
        if let Some(operand) = half {
            return self.attention_mma(&parts, operand);
        }
        self.attention_tiled(&parts)
            .or_else(|| self.attention_rows(&parts))
    }

    /// Attention by a warp per query row (the module documentation), if its tiles fit: at
    /// most 256 output columns (8 accumulators a lane) and the tiles within the block's shared
    /// memory.
    fn attention_rows(&self, parts: &Parts) -> Option<GpuKernel> {
        let Parts {
            k,
            ins,
            d,
            ch,
            dtype,
            ..
        } = *parts;
        let (q_elem, k_elem, v_elem, logit) = (&parts.q, &parts.key, &parts.v, &parts.logit);
        let n2 = ch.n;
        let cols = n2.div_ceil(KEYS);
        let warps = self.gpu.attention_warps.iter().copied().find(|&w| {
            let floats = w * d.k + KEYS * d.k + KEYS * n2 + w * KEYS;
            w > 0
                && floats * dtype.bytes().max(4) <= self.gpu.shared_limit()
                && w * 32 <= self.gpu.max_threads_per_block
        })?;
        if cols > 8 {
            return None;
        }
        let threads = warps * 32;
        let mut r = Regs::default();
        let [batch, m0, row, n0, key, zr] = r.array();
        let [el, staged, dd, jj, rot] = r.array();
        let [x, y, s, hv, mt, tmp] = r.array();
        let [alpha, p, ps, l, mrun, part, o] = r.array();
        let acc: Vec<usize> = (0..cols).map(|_| r.next()).collect();
        let reg = Sc::Reg;
        let lane = || sp(Special::Lane);
        let warp = || sp(Special::Warp);
        let gm = d.m.div_ceil(warps);
        // Extra inputs past the launch's: the registers an expression reads.
        let scalar = |i: usize| Expr::Load {
            input: ins.len() + i,
            dtype,
            coef: vec![0; k.vars.max(4)],
            off: 0,
        };
        let op = |kind: OpKind, args: Vec<Expr>| Expr::Op {
            op: Ew::Kind(kind),
            dtype,
            args,
        };
        let eval = |reg: usize, expr: Expr, scalars: Vec<usize>| Stmt::Eval { reg, expr, scalars };
        let sub_exp = || {
            op(
                OpKind::Exponential,
                vec![op(OpKind::Subtract, vec![scalar(0), scalar(1)])],
            )
        };

        let mut body = block_rows((batch, m0), gm, warps).to_vec();
        body.extend([
            Stmt::Let {
                reg: row,
                value: Sc::plus(reg(m0), warp()),
            },
            Stmt::Let {
                reg: zr,
                value: c(0),
            },
            Stmt::Identity {
                reg: mrun,
                kind: Combiner::Max,
                dtype,
            },
            zero(l, dtype),
        ]);
        body.extend(acc.iter().map(|&a| zero(a, dtype)));
        // Q's rows of this block, once: shared array 0, `row * k + d`.
        let stage_q = Staging {
            e: el,
            threads,
            batch,
            k0: zr,
            stage: zr,
            staged,
            k: d.k,
            dtype,
        };
        let shared = vec![
            SharedArray {
                dtype,
                len: warps * d.k,
                packed: false,
                swizzle: None,
            },
            SharedArray {
                dtype,
                len: KEYS * d.k,
                packed: false,
                swizzle: None,
            },
            SharedArray {
                dtype,
                len: KEYS * n2,
                packed: false,
                swizzle: None,
            },
            SharedArray {
                dtype,
                len: warps * KEYS,
                packed: false,
                swizzle: None,
            },
        ];
        body.extend(stage_q.stage(
            &[Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: warps,
                depth: d.k,
                k_fastest: true,
                panel: 0,
                expr: q_elem,
                array: 0,
            }],
            &shared,
        ));
        // This step's keys: K's rows (shared array 1, `key * k + d`) and V's rows (shared
        // array 2, `key * n2 + col`).
        let stage_k = Staging {
            e: el,
            threads,
            batch,
            k0: zr,
            stage: zr,
            staged,
            k: d.k,
            dtype,
        };
        let stage_v = Staging {
            e: el,
            threads,
            batch,
            k0: n0,
            stage: zr,
            staged,
            k: d.n,
            dtype,
        };
        let mut step = stage_k.stage(
            &[Tile {
                row_var: 2,
                rows: d.n,
                base: n0,
                extent: KEYS,
                depth: d.k,
                k_fastest: true,
                panel: 0,
                expr: k_elem,
                array: 1,
            }],
            &shared,
        );
        step.extend(stage_v.stage(
            &[Tile {
                row_var: 2,
                rows: n2,
                base: zr,
                extent: n2,
                depth: KEYS,
                k_fastest: false,
                panel: 0,
                expr: v_elem,
                array: 2,
            }],
            &shared,
        ));
        step.extend([
            Stmt::CopyCommit,
            Stmt::CopyWait { pending: 0 },
            Stmt::Barrier,
            Stmt::Let {
                reg: key,
                value: Sc::plus(reg(n0), lane()),
            },
            // The score: one chain over the head dimension, lane `l` from head index
            // `l mod k` on (a rotation): the lanes' rows of K lie `k` elements apart, so
            // reading one head index together would put every lane in one shared-memory bank.
            zero(s, dtype),
            Stmt::For {
                reg: dd,
                start: c(0),
                end: c(d.k),
                step: c(1),
                body: vec![
                    Stmt::Let {
                        reg: rot,
                        value: Sc::modulo(Sc::plus(reg(dd), lane()), c(d.k)),
                    },
                    Stmt::SharedLoad {
                        reg: x,
                        array: 0,
                        index: Sc::plus(Sc::times(warp(), c(d.k)), reg(rot)),
                    },
                    Stmt::SharedLoad {
                        reg: y,
                        array: 1,
                        index: Sc::plus(Sc::times(lane(), c(d.k)), reg(rot)),
                    },
                    Stmt::MulAdd {
                        acc: s,
                        a: x,
                        b: y,
                        dtype,
                    },
                ],
            },
            Stmt::Identity {
                reg: hv,
                kind: Combiner::Max,
                dtype,
            },
        ]);
        // The logit at (batch, row, key) of the epilogue's shape, where both are inside.
        let flat = Sc::plus(
            Sc::times(Sc::plus(Sc::times(reg(batch), c(d.m)), reg(row)), c(d.n)),
            reg(key),
        );
        let mut at = set_vars(&dims(&k.out.shape, 0), flat);
        at.push(eval(hv, logit.clone(), vec![s]));
        step.push(Stmt::If {
            cond: Sc::and(Sc::lt(reg(key), c(d.n)), Sc::lt(reg(row), c(d.m))),
            body: at,
        });
        // The step's largest logit across the warp, then the row's new maximum.
        step.push(eval(mt, scalar(0), vec![hv]));
        for sh in [16, 8, 4, 2, 1] {
            step.push(Stmt::Shuffle {
                reg: tmp,
                src: mt,
                mode: Shuffle::Xor(sh),
            });
            step.push(Stmt::Combine {
                acc: mt,
                value: tmp,
                kind: Combiner::Max,
                dtype,
            });
        }
        // The new maximum is never below the lowest finite value ([`lowest`]).
        let lowest = lowest(dtype);
        step.extend([
            Stmt::Combine {
                acc: mt,
                value: mrun,
                kind: Combiner::Max,
                dtype,
            },
            eval(
                tmp,
                Expr::Const {
                    dtype,
                    value: lowest,
                },
                Vec::new(),
            ),
            Stmt::Combine {
                acc: mt,
                value: tmp,
                kind: Combiner::Max,
                dtype,
            },
            eval(alpha, sub_exp(), vec![mrun, mt]),
            eval(p, sub_exp(), vec![hv, mt]),
            eval(ps, scalar(0), vec![p]),
        ]);
        for sh in [16, 8, 4, 2, 1] {
            step.push(Stmt::Shuffle {
                reg: tmp,
                src: ps,
                mode: Shuffle::Xor(sh),
            });
            step.push(Stmt::Combine {
                acc: ps,
                value: tmp,
                kind: Combiner::Add,
                dtype,
            });
        }
        step.extend([
            eval(
                l,
                op(
                    OpKind::Add,
                    vec![op(OpKind::Multiply, vec![scalar(0), scalar(1)]), scalar(2)],
                ),
                vec![l, alpha, ps],
            ),
            eval(mrun, scalar(0), vec![mt]),
            Stmt::SharedStore {
                array: 3,
                index: Sc::plus(Sc::times(warp(), c(KEYS)), lane()),
                value: p,
            },
            Stmt::Barrier,
        ]);
        for (t, &a) in acc.iter().enumerate() {
            let col = Sc::plus(lane(), c(KEYS * t));
            step.push(Stmt::If {
                cond: Sc::lt(col.clone(), c(n2)),
                body: vec![
                    zero(part, dtype),
                    Stmt::For {
                        reg: jj,
                        start: c(0),
                        end: c(KEYS),
                        step: c(1),
                        body: vec![
                            Stmt::SharedLoad {
                                reg: x,
                                array: 3,
                                index: Sc::plus(Sc::times(warp(), c(KEYS)), reg(jj)),
                            },
                            Stmt::SharedLoad {
                                reg: y,
                                array: 2,
                                index: Sc::plus(Sc::times(reg(jj), c(n2)), col),
                            },
                            Stmt::MulAdd {
                                acc: part,
                                a: x,
                                b: y,
                                dtype,
                            },
                        ],
                    },
                    eval(
                        a,
                        op(
                            OpKind::Add,
                            vec![op(OpKind::Multiply, vec![scalar(0), scalar(1)]), scalar(2)],
                        ),
                        vec![a, alpha, part],
                    ),
                ],
            });
        }
        step.push(Stmt::Barrier);
        step = skip_masked(ch.masked, (n0, KEYS), (m0, warps), step);
        body.push(Stmt::For {
            reg: n0,
            start: c(0),
            end: c(d.n),
            step: c(KEYS),
            body: step,
        });
        for (t, &a) in acc.iter().enumerate() {
            let col = Sc::plus(lane(), c(KEYS * t));
            body.push(parts.store_normalized(dtype, o, (a, l), batch, (reg(row), col)));
        }
        Some(parts.kernel(
            MapKind::Attention,
            (d.batch * gm, threads, 32),
            shared,
            r.0,
            self.sums,
            body,
        ))
    }
}
