//! Attention as one launch on the tensor cores ([`MapKind::AttentionMma`]): Q, K and V of bf16
//! or f16 (attention traced in that dtype, which fusion chains with its softmax computed
//! online in f32: `fuse/chain.rs`), both products by `mma.m16n8k16` with f32 accumulators,
//! flash-attention style.
//!
//! A block of `W = Gpu::mma_attention_warps` warps owns `16 W` consecutive query rows of one
//! batch, each warp 16 of them (one `mma` row tile). The block stages its rows of Q into
//! shared memory once and each warp loads its Q fragments (the A fragments of `S = Q Kᵀ`,
//! one per 16 head indices) with `ldmatrix.x4`, once. It then steps through the keys `N =
//! Gpu::mma_attention_keys` at a time (halved while the arrays do not fit
//! [`Gpu::tile_limit`]); each step:
//!
//! 1. `S = Q Kᵀ`: per 16 head indices and 16 keys, one `ldmatrix.x4` of K (staged by rows,
//!    `key · D + d`: B stored by columns, so the matrices load as they are) gives the B
//!    fragments of two 8-key tiles, and two `mma`s add into the warp's `N / 8` score tiles.
//! 2. The online softmax on the accumulator fragments, in f32: lane `l` holds, of each 16 x 8
//!    tile, row `g = l / 4` columns `2t, 2t + 1` (`t = l % 4`) and row `g + 8` the same
//!    columns, so a row's `N` values of the step lie in the 4 lanes of a quad, `N / 4` each.
//!    Each value becomes its logit `h` (the epilogue's expression: a scale, a causal mask, a
//!    bias; -inf past the keys' or the rows' end), the row's step maximum is the lane's
//!    maximum then two xor shuffles (1 and 2) across the quad, combined with the running
//!    maximum `m` (kept at least the lowest finite value, as `attention.rs` does), `α = exp(m_old
//!    - m)`, `p = exp(h - m)` in place of the scores, their sum likewise (the lane's, then the
//!    two shuffles), and `l = l · α + Σ p`. The output accumulators of the row are scaled by
//!    `α`.
//! 3. `O += P V`: the probabilities become the A fragments of the second product without
//!    leaving the registers (see below), rounded to bf16 or f16 as the `mma` packs them; V
//!    (staged by rows, `key · C + column`: B stored by rows) loads with `ldmatrix.x4.trans`,
//!    two 8-column tiles per 16 keys, one `mma` per 16 keys and 8 columns. V given transposed
//!    (`[batch, columns, keys]`) is staged by columns, `column · N + key` (B stored by
//!    columns), and loads as K does, without `.trans`.
//!
//! A step whose keys a causal mask hides from every row of the block is skipped (its staging
//! too; [`crate::ir::Chain::masked`]), and finally each lane stores `O / l` for its rows and
//! columns, rounded to the result's dtype as it is stored.
//!
//! # The accumulators are the next A fragments
//!
//! The m16n8k16 accumulator `c[i]` of a lane is row `g + 8 (i / 2)`, column `2t + i % 2`; the
//! A operand's `a[i]` is row `g + 8 ((i / 2) % 2)`, column `2t + i % 2 + 8 (i / 4)`
//! ([`Stmt::Mma`]). So for the 16 keys `16 k..16 k + 16` of the step, the score tiles `2 k`
//! (keys `+0..8`) and `2 k + 1` (`+8..16`) give `a[0..4] = c[0..4]` of tile `2 k` (rows `g`,
//! `g + 8`, keys `2t, 2t + 1`) and `a[4..8] = c[0..4]` of tile `2 k + 1` (the same rows, keys
//! `8 + 2t, 8 + 2t + 1`): element for element the same row and key in the same lane. P is
//! never exchanged between lanes or through shared memory.
//!
//! # Shared memory
//!
//! Q (`16 W x D`), and a ring of `Gpu::mma_attention_stages` stages of K (`N x D`) and V (`N
//! x C`), `D` and `C` the head dimension and the output columns rounded up to 16, zeros past
//! their ends and past the keys' and the queries' ends, packed 16-bit elements, swizzled
//! (`Gpu::mma_swizzle`: [`SharedArray::swizzle`]) so that the 8 rows one `ldmatrix` matrix
//! reads, and the 16-byte chunks `cp.async` writes, fall in 8 different bank groups (rows of
//! 16, 32, 64 or 128 elements; other widths meet fewer conflicts than unswizzled). The ring
//! runs as the tensor-core GEMMs' does (`staging.rs`): the copies of the next `stages - 1`
//! steps in flight while one step computes, one barrier a step. Q is staged first, its own
//! `cp.async` group, waited for before the ring starts. Operands `cp.async` cannot copy (a
//! head dimension, an output width or, for V given transposed, a key count that is not a
//! multiple of 8; a conversion) are staged through registers.
//!
//! # The order of the sums
//!
//! A score is one `mma` chain over the head dimension, 16 terms an `mma` (the order inside
//! one `mma` is the hardware's); the mapping requires the head dimension within one chunk of
//! the sum tree (`leaf`), and the step's keys too. An output element is scaled by `α` and
//! accumulates the step's `N` products in the `mma`s' order, `N / 16` `mma`s a step; the
//! denominator sums the lane's `N / 4` probabilities in a chain, then a 2-level xor-shuffle
//! tree, then into `l`. The probabilities multiply V rounded to bf16 or f16, their sum in `l`
//! is of the f32 values (as flash attention computes it). The logits are the traced
//! program's expression, the score converted to bf16 or f16 as traced, the ops after it in
//! f32 (fusion leaves out their roundings to the dtype, `fuse/chain.rs`). The reference rounds
//! each op of the traced program to its dtype; the tests compare within
//! `kiln_reference::accuracy`'s bound for the cone's dtype, and within a tolerance of their
//! own of the same attention computed in f32 from the same arguments.
//!
//! Not measured on a GPU: checked by ptxas (sm_80 and sm_90) and the emulator only.

use super::attention::{Parts, block_rows, lowest, skip_masked};
use super::staging::{Staging, Stepping, Tile, pipelined, zero};
use super::tensor::swizzle_shift;
use super::*;

/// What the target makes of one attention's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MmaAttention {
    /// Warps of the block (16 query rows each).
    pub warps: usize,
    /// Keys per step.
    pub keys: usize,
    /// Stages of the keys' and values' ring.
    pub stages: usize,
    /// The head dimension rounded up to 16.
    pub depth: usize,
    /// The output columns rounded up to 16.
    pub cols: usize,
}

impl MmaAttention {
    /// Elements of the shared arrays: Q, the K ring, the V ring.
    fn lens(&self) -> [usize; 3] {
        let rows = 16 * self.warps;
        [
            rows * self.depth,
            self.stages * self.keys * self.depth,
            self.stages * self.keys * self.cols,
        ]
    }
}

/// The most head indices and output columns a warp holds in registers (Q's fragments and
/// the output's accumulators, 64 32-bit registers each at 128); wider attention runs as
/// separate launches.
const MOST: usize = 128;

impl Mapper<'_> {
    /// The geometry of tensor-core attention with head dimension `k` and `n2` output columns,
    /// if the target has it and it fits: `Gpu::mma_attention_keys` keys a step (halved down to
    /// 16 while the arrays do not fit `Gpu::tile_limit`, after the ring was cut back to two
    /// stages), a warp of 32, the head dimension and the step within one chunk of the sum tree,
    /// at most [`MOST`] head indices and output columns.
    pub(super) fn mma_attention(&self, k: usize, n2: usize) -> Option<MmaAttention> {
        let g = self.gpu;
        let (depth, cols) = (k.next_multiple_of(16), n2.next_multiple_of(16));
        if g.warp_size != 32
            || !g.tensor_core_shapes.contains(&(16, 8, 16))
            || g.mma_attention_warps == 0
            || g.mma_attention_warps * 32 > g.max_threads_per_block
            || g.mma_attention_keys < 16
            || !g.mma_attention_keys.is_multiple_of(16)
            || k == 0
            || n2 == 0
            || k > self.sums.leaf
            || depth > MOST
            || cols > MOST
        {
            return None;
        }
        let mut keys = g.mma_attention_keys;
        while keys >= 16 {
            for stages in (2..=g.mma_attention_stages.max(2)).rev() {
                let geo = MmaAttention {
                    warps: g.mma_attention_warps,
                    keys,
                    stages,
                    depth,
                    cols,
                };
                let bytes: usize = geo
                    .lens()
                    .iter()
                    .map(|l| (2 * l).next_multiple_of(16))
                    .sum();
                if keys <= self.sums.leaf && bytes <= g.tile_limit() {
                    return Some(geo);
                }
            }
            keys /= 2;
            if !keys.is_multiple_of(16) {
                break;
            }
        }
        None
    }

    /// Attention on the tensor cores (the module documentation), if the target has it and it
    /// fits: `p`'s Q, K and V expressions in `operand`'s dtype, everything else in f32.
    pub(super) fn attention_mma(&self, p: &Parts, operand: MmaOperand) -> Option<GpuKernel> {
        let Parts { k, ins, d, ch, .. } = *p;
        let n2 = ch.n;
        let geo = self.mma_attention(d.k, n2)?;
        let MmaAttention {
            warps,
            keys,
            stages,
            depth,
            cols,
        } = geo;
        let f32t = DType::F32;
        let rows = 16 * warps;
        let threads = 32 * warps;
        let gm = d.m.div_ceil(rows);
        let (ktiles, stiles, otiles) = (depth / 16, keys / 8, cols / 8);

        let mut r = Regs::default();
        let [batch, m0, zr, n0, kn, cur, next, el, staged] = r.array();
        let [hv, tmp, ps, o] = r.array();
        let mut regs = |n: usize| -> Vec<usize> { (0..n).map(|_| r.next()).collect() };
        // Per row of the lane (g, g + 8): running maximum, sum, rescale, step maximum.
        let (mrun, l, alpha, mt) = (regs(2), regs(2), regs(2), regs(2));
        // Q's A fragments, one per 16 head indices.
        let qf: Vec<Vec<usize>> = (0..ktiles).map(|_| regs(8)).collect();
        // A 16-key pair of B fragments (K's or V's).
        let bf = regs(8);
        // The step's score tiles and the output's, 4 accumulators each.
        let s: Vec<[usize; 4]> = (0..stiles)
            .map(|_| std::array::from_fn(|_| r.next()))
            .collect();
        let acc: Vec<[usize; 4]> = (0..otiles)
            .map(|_| std::array::from_fn(|_| r.next()))
            .collect();

        let reg = Sc::Reg;
        let lane = || sp(Special::Lane);
        let warp = || sp(Special::Warp);
        let g = || Sc::quot(lane(), c(4));
        let t2 = || Sc::times(Sc::modulo(lane(), c(4)), c(2));
        // The lane's row `q / 2` of the warp's 16 within the block, as accumulator `q` has it.
        let row_in = |q: usize| Sc::plus(Sc::plus(Sc::times(warp(), c(16)), g()), c(8 * (q / 2)));
        let row_at = |q: usize| Sc::plus(reg(m0), row_in(q));
        // The column (key, or output column) of accumulator `q` of tile `j`.
        let col_of = |j: usize, q: usize| Sc::plus(t2(), c(8 * j + q % 2));
        let scalar = |i: usize| Expr::Load {
            input: ins.len() + i,
            dtype: f32t,
            coef: vec![0; k.vars.max(4)],
            off: 0,
        };
        let op = |kind: OpKind, args: Vec<Expr>| Expr::Op {
            op: Ew::Kind(kind),
            dtype: f32t,
            args,
        };
        let eval = |reg: usize, expr: Expr, scalars: Vec<usize>| Stmt::Eval { reg, expr, scalars };
        let sub_exp = || {
            op(
                OpKind::Exponential,
                vec![op(OpKind::Subtract, vec![scalar(0), scalar(1)])],
            )
        };
        let combine = |acc: usize, value: usize, kind: Combiner| Stmt::Combine {
            acc,
            value,
            kind,
            dtype: f32t,
        };
        let quad = |out: &mut Vec<Stmt>, x: usize, kind: Combiner| {
            for sh in [1, 2] {
                out.push(Stmt::Shuffle {
                    reg: tmp,
                    src: x,
                    mode: Shuffle::Xor(sh),
                });
                out.push(combine(x, tmp, kind));
            }
        };

        let mut body = vec![Stmt::Note(format!(
            "tensor-core attention: a block of {rows} query rows ({warps} warps of 16), \
             keys {keys} a step in a ring of {stages}, head {depth} and {cols} columns \
             (rounded up to 16)"
        ))];
        body.extend(block_rows((batch, m0), gm, rows));
        body.push(Stmt::Let {
            reg: zr,
            value: c(0),
        });
        for i in 0..2 {
            body.push(Stmt::Identity {
                reg: mrun[i],
                kind: Combiner::Max,
                dtype: f32t,
            });
            body.push(zero(l[i], f32t));
        }
        body.extend(acc.iter().flatten().map(|&a| zero(a, f32t)));

        let [q_len, k_len, v_len] = geo.lens();
        // V given transposed (`[batch, columns, keys]`) is staged by columns, `column · N +
        // key` (B stored by columns, as K), its fragments loaded as K's are.
        let v_by_columns = ch.b_trans;
        let swizzle = |row: usize| self.gpu.mma_swizzle.then(|| swizzle_shift(row / 8));
        let array = |len: usize, row: usize| SharedArray {
            dtype: operand.dtype(),
            len,
            packed: true,
            swizzle: swizzle(row),
        };
        let shared = vec![
            array(q_len, depth),
            array(k_len, depth),
            array(v_len, if v_by_columns { keys } else { cols }),
        ];
        let staging = |k0: usize, stage: usize, k: usize| Staging {
            e: el,
            threads,
            batch,
            k0,
            stage,
            staged,
            k,
            dtype: f32t,
        };
        // Q's rows of this block, once, then each warp's fragments.
        body.extend(staging(zr, zr, d.k).stage(
            &[Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: rows,
                depth,
                k_fastest: true,
                panel: 0,
                expr: &p.q,
                array: 0,
            }],
            &shared,
        ));
        body.extend([
            Stmt::CopyCommit,
            Stmt::CopyWait { pending: 0 },
            Stmt::Barrier,
        ]);
        for (kc, regs) in qf.iter().enumerate() {
            // Matrix `lane / 8`: rows `8 ((lane / 8) % 2)..` of the warp's 16, head indices
            // `16 kc + 8 (lane / 16)..`.
            let row = Sc::plus(
                Sc::times(warp(), c(16)),
                Sc::plus(
                    Sc::modulo(lane(), c(8)),
                    Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
                ),
            );
            body.push(Stmt::LdMatrix {
                regs: regs.clone(),
                array: 0,
                trans: false,
                row: Sc::plus(
                    Sc::plus(Sc::times(row, c(depth)), c(16 * kc)),
                    Sc::times(Sc::quot(lane(), c(16)), c(8)),
                ),
            });
        }

        // A step's keys from register `kn` on: K's rows (`key · depth + d`) and V's
        // (`key · cols + column`) into stage `next`.
        let mut stage = staging(zr, next, d.k).stage(
            &[Tile {
                row_var: 2,
                rows: d.n,
                base: kn,
                extent: keys,
                depth,
                k_fastest: true,
                panel: 0,
                expr: &p.key,
                array: 1,
            }],
            &shared,
        );
        stage.extend(staging(kn, next, d.n).stage(
            &[Tile {
                row_var: 2,
                rows: n2,
                base: zr,
                extent: cols,
                depth: keys,
                k_fastest: v_by_columns,
                panel: 0,
                expr: &p.v,
                array: 2,
            }],
            &shared,
        ));
        let stage = skip_masked(ch.masked, (kn, keys), (m0, rows), stage);

        // The step from register `n0` on, in stage `cur`.
        let mut step: Vec<Stmt> = s.iter().flatten().map(|&x| zero(x, f32t)).collect();
        let mma = |d: [usize; 4], a: Vec<usize>, b: &[usize]| Stmt::Mma {
            d,
            a,
            b: b.to_vec(),
            c: d,
            shape: operand.shape(),
            operand,
        };
        // The lane's row start of matrix `lane / 8` of a 16 x 16 pair of B tiles: by columns
        // (K: `lane % 8 + 8 (lane / 16)` the key, `8 ((lane / 8) % 2)` the head index), or
        // by rows (V: `lane % 8 + 8 ((lane / 8) % 2)` the key, `8 (lane / 16)` the column).
        let inner = || Sc::modulo(lane(), c(8));
        let half = || Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8));
        let upper = || Sc::times(Sc::quot(lane(), c(16)), c(8));
        for (kc, a) in qf.iter().enumerate() {
            for pair in 0..stiles / 2 {
                let key = Sc::plus(c(16 * pair), Sc::plus(inner(), upper()));
                step.push(Stmt::LdMatrix {
                    regs: bf.clone(),
                    array: 1,
                    trans: false,
                    row: Sc::plus(
                        Sc::plus(
                            Sc::times(reg(cur), c(keys * depth)),
                            Sc::times(key, c(depth)),
                        ),
                        Sc::plus(c(16 * kc), half()),
                    ),
                });
                step.push(mma(s[2 * pair], a.clone(), &bf[..4]));
                step.push(mma(s[2 * pair + 1], a.clone(), &bf[4..]));
            }
        }
        // The logits in place of the scores: the epilogue's expression at (batch, row, key)
        // where both are inside, -inf elsewhere.
        for (j, tile) in s.iter().enumerate() {
            for (q, &x) in tile.iter().enumerate() {
                let key = Sc::plus(reg(n0), col_of(j, q));
                let mut at = logit_vars(&k.out.shape, d, (batch, row_at(q), key.clone()));
                at.push(eval(
                    hv,
                    Expr::Op {
                        op: Ew::Convert,
                        dtype: f32t,
                        args: vec![p.logit.clone()],
                    },
                    vec![x],
                ));
                step.extend([
                    Stmt::Identity {
                        reg: hv,
                        kind: Combiner::Max,
                        dtype: f32t,
                    },
                    Stmt::If {
                        cond: Sc::and(Sc::lt(key, c(d.n)), Sc::lt(row_at(q), c(d.m))),
                        body: at,
                    },
                    eval(x, scalar(0), vec![hv]),
                ]);
            }
        }
        let least = Expr::Const {
            dtype: f32t,
            value: lowest(f32t),
        };
        for i in 0..2 {
            // The row's values: accumulators `2i` and `2i + 1` of every tile.
            let mine: Vec<usize> = s.iter().flat_map(|t| [t[2 * i], t[2 * i + 1]]).collect();
            step.push(Stmt::Identity {
                reg: mt[i],
                kind: Combiner::Max,
                dtype: f32t,
            });
            step.extend(mine.iter().map(|&h| combine(mt[i], h, Combiner::Max)));
            quad(&mut step, mt[i], Combiner::Max);
            step.extend([
                combine(mt[i], mrun[i], Combiner::Max),
                eval(tmp, least.clone(), Vec::new()),
                combine(mt[i], tmp, Combiner::Max),
                eval(alpha[i], sub_exp(), vec![mrun[i], mt[i]]),
            ]);
            step.extend(mine.iter().map(|&h| eval(h, sub_exp(), vec![h, mt[i]])));
            step.push(eval(ps, scalar(0), vec![mine[0]]));
            step.extend(mine[1..].iter().map(|&h| combine(ps, h, Combiner::Add)));
            quad(&mut step, ps, Combiner::Add);
            step.extend([
                eval(
                    l[i],
                    op(
                        OpKind::Add,
                        vec![op(OpKind::Multiply, vec![scalar(0), scalar(1)]), scalar(2)],
                    ),
                    vec![l[i], alpha[i], ps],
                ),
                eval(mrun[i], scalar(0), vec![mt[i]]),
            ]);
            for tile in &acc {
                for &a in &tile[2 * i..2 * i + 2] {
                    step.push(eval(
                        a,
                        op(OpKind::Multiply, vec![scalar(0), scalar(1)]),
                        vec![a, alpha[i]],
                    ));
                }
            }
        }
        // O += P V: the score tiles `2 kk` and `2 kk + 1` are the A fragment of keys
        // `16 kk..16 kk + 16`.
        for kk in 0..stiles / 2 {
            let a: Vec<usize> = s[2 * kk].iter().chain(&s[2 * kk + 1]).copied().collect();
            for pair in 0..otiles / 2 {
                let stage = Sc::times(reg(cur), c(keys * cols));
                let row = if v_by_columns {
                    let col = Sc::plus(c(16 * pair), Sc::plus(inner(), upper()));
                    Sc::plus(
                        Sc::plus(stage, Sc::times(col, c(keys))),
                        Sc::plus(c(16 * kk), half()),
                    )
                } else {
                    let key = Sc::plus(c(16 * kk), Sc::plus(inner(), half()));
                    Sc::plus(
                        Sc::plus(stage, Sc::times(key, c(cols))),
                        Sc::plus(c(16 * pair), upper()),
                    )
                };
                step.push(Stmt::LdMatrix {
                    regs: bf.clone(),
                    array: 2,
                    trans: !v_by_columns,
                    row,
                });
                step.push(mma(acc[2 * pair], a.clone(), &bf[..4]));
                step.push(mma(acc[2 * pair + 1], a.clone(), &bf[4..]));
            }
        }
        // A step whose keys a causal mask hides from all of the block's rows is skipped.
        let step = skip_masked(ch.masked, (n0, keys), (m0, rows), step);
        let stepping = Stepping {
            k0: n0,
            cur,
            step: keys,
            stages,
            lag: 0,
            range: None,
        };
        body.extend(pipelined(
            &staging(kn, next, d.n),
            stage,
            &stepping,
            step,
            true,
        ));
        for (j, tile) in acc.iter().enumerate() {
            for (q, &a) in tile.iter().enumerate() {
                let col = col_of(j, q);
                body.push(p.store_normalized(f32t, o, (a, l[q / 2]), batch, (row_at(q), col)));
            }
        }
        Some(p.kernel(
            MapKind::AttentionMma,
            (d.batch * gm, threads, 32),
            shared,
            r.0,
            self.sums,
            body,
        ))
    }
}

/// Statements setting the epilogue's variables (the dimensions of `shape`, the scores'
/// shape) at batch register `batch`, query row `row` and key `key` of product `d`: the row
/// and the key themselves where they are the last two dimensions (so that only the batch's
/// digits, the same for the whole launch, take divisions), else the digits of the flat
/// position.
fn logit_vars(
    shape: &[usize],
    d: &super::gemm::Product,
    (batch, row, key): (usize, Sc, Sc),
) -> Vec<Stmt> {
    let rank = shape.len();
    if rank >= 2 && shape[rank - 1] == d.n && shape[rank - 2] == d.m {
        let mut out = set_vars(&dims(&shape[..rank - 2], 0), Sc::Reg(batch));
        out.push(Stmt::SetVar {
            var: rank - 2,
            value: row,
        });
        out.push(Stmt::SetVar {
            var: rank - 1,
            value: key,
        });
        return out;
    }
    let flat = Sc::plus(
        Sc::times(Sc::plus(Sc::times(Sc::Reg(batch), c(d.m)), row), c(d.n)),
        key,
    );
    set_vars(&dims(shape, 0), flat)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapper(gpu: &Gpu) -> Mapper<'_> {
        Mapper {
            gpu,
            sums: TargetInfo::h200().sums,
            precision: MatmulPrecision::Highest,
            float_atomics: false,
        }
    }

    /// The H200 takes steps of 64 keys, double buffered, within the 48 KiB a kernel declares
    /// statically, shorter steps for wider heads, nothing past 128 or without tensor cores.
    #[test]
    fn the_geometry_fits_shared_memory() {
        let mut gpu = Gpu::h200();
        let geo = |gpu: &Gpu, k, n2| mapper(gpu).mma_attention(k, n2).map(|g| (g.keys, g.stages));
        assert_eq!(geo(&gpu, 64, 64), Some((64, 2)));
        assert_eq!(geo(&gpu, 40, 24), Some((64, 2)));
        // 16 KiB of Q and 32 KiB of K and V a stage of 64: halved to 32 keys.
        assert_eq!(geo(&gpu, 128, 128), Some((32, 2)));
        assert_eq!(geo(&gpu, 129, 64), None);
        assert_eq!(geo(&gpu, 64, 130), None);
        // Dynamic shared memory allowed: more stages and longer steps fit.
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        gpu.mma_attention_stages = 3;
        assert_eq!(geo(&gpu, 128, 128), Some((64, 3)));
        gpu.mma_attention_keys = 0;
        assert_eq!(geo(&gpu, 64, 64), None);
        let mut gpu = Gpu::h200();
        gpu.tensor_core_shapes.clear();
        assert_eq!(geo(&gpu, 64, 64), None);
    }

    /// The ring's shared arrays, swizzled: every `ldmatrix` matrix (8 rows at one chunk) of
    /// K's and V's rows falls in 8 different bank groups where the rows are a power of two of
    /// chunks long (heads of 16, 32, 64, 128), and in no fewer than unswizzled elsewhere.
    #[test]
    fn the_staged_rows_meet_no_bank_conflicts() {
        for row in [16usize, 32, 48, 64, 80, 96, 112, 128] {
            let plain = SharedArray {
                dtype: DType::BF16,
                len: 64 * row,
                packed: true,
                swizzle: None,
            };
            let swizzled = SharedArray {
                swizzle: Some(swizzle_shift(row / 8)),
                ..plain.clone()
            };
            let worst = |a: &SharedArray| {
                let mut least = 8;
                for first in (0..64).step_by(8) {
                    for chunk in (0..row).step_by(8) {
                        let mut groups: Vec<usize> = (first..first + 8)
                            .map(|r| a.physical(r * row + chunk, 8) / 8 % 8)
                            .collect();
                        groups.sort();
                        groups.dedup();
                        least = least.min(groups.len());
                    }
                }
                least
            };
            if row.is_power_of_two() {
                assert_eq!(worst(&swizzled), 8, "rows of {row}");
                assert!(worst(&plain) < 8, "rows of {row}");
            } else {
                assert!(worst(&swizzled) >= worst(&plain), "rows of {row}");
            }
        }
    }
}
