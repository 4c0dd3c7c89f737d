//! Attention as one launch by register tiles ([`MapKind::AttentionTiled`]): the
//! flash-attention loop of `attention.rs` with both products computed as a CUDA-core GEMM
//! computes its tiles (`tiled.rs`), so that each element loaded from shared memory feeds
//! several fused multiply-adds instead of one.
//!
//! A tile of `Gpu::attention_tiles` ([`AttentionTile`]) gives a block `rows` consecutive
//! query rows of one batch and steps through the keys `keys` at a time. The `G = keys /
//! thread_keys` lanes of a *row group* (consecutive lanes, `G` a power of two dividing the
//! warp) share `R = thread_rows` rows; a warp holds `32 / G` row groups. Thread `(w, g, j)`
//! (warp `w`, row group `g`, lane `j` of the group) owns the block's rows
//! `w · R · 32/G + g + i · 32/G` (`i < R`), the step's keys `j + c · G` (`c < C =
//! thread_keys`) and the output columns `j + t · G` (`t < T = ⌈columns / G⌉`, at most
//! `thread_cols`).
//!
//! The block stages its rows of Q into shared memory once (row-major, rows padded, `cp.async`
//! where the operand allows, `staging.rs`); each step stages the step's rows of K (likewise)
//! and V
//! (`key · columns + column`), zeros past the keys' end, and meets at a barrier. Then:
//!
//! 1. Scores: for each head index, the thread loads its `R` elements of Q and `C` of K and
//!    adds the `R · C` products into its score tile (one fused multiply-add each).
//! 2. Online softmax, per row: the logits `h` (the epilogue's expression: a scale, a causal
//!    mask, a bias; `-inf` past the keys' or the rows' end), the step's largest across the
//!    thread's keys and then across its row group (`log2 G` xor shuffles), combined with the
//!    running maximum `m` (kept at least the lowest finite value, as `attention.rs` does), the
//!    rescale `α = exp(m_old - m)`, the probabilities `p = exp(h - m)`, their sum across the
//!    thread's keys and the row group, and `l = l · α + Σ p`. The thread stores its `p` into
//!    shared memory (`key · pitch + row`), and the block meets at a barrier.
//! 3. Output: for each key of the step, the thread loads its `R` probabilities and `T`
//!    elements of V and adds the `R · T` products into partial sums, then `acc = acc · α +
//!    part` for each of its outputs; the block meets again before the next step overwrites
//!    the tiles.
//!
//! A step whose keys a causal mask hides from every row of the block is skipped
//! ([`crate::ir::Chain::masked`]), and finally each thread stores `acc / l` for its rows and
//! columns inside the result.
//!
//! # Loads per multiply-add
//!
//! The scores take `R + C` shared loads per `R · C` multiply-adds, the output `R + T` per
//! `R · T`: with the H200's default tile (4 x 4 of a step of 32, 64 output columns so `T =
//! 8`), 0.5 and 0.375, against 2 and 2 for a warp per row, whose lanes each load both
//! factors of every multiply-add. Shared-memory bandwidth (one warp-wide 32-bit load per
//! cycle against four warp-wide multiply-adds) bounded that mapping at about 2 TFLOP/s.
//!
//! # Shared-memory banks
//!
//! The emulator checks races, not banks; the layouts avoid conflicts by construction (32
//! banks of 4 bytes, as many as a warp's lanes; said of f32 elements, f64 ones taking two
//! banks each):
//!
//! - Q and K are row-major with a padded pitch ([`row_pitch`]: `k + 4` for a head dimension
//!   that is a multiple of 8, so 68 for 64), so that 8 consecutive rows start in 8 different
//!   banks. At one head index a warp reads `32 / G` consecutive rows of Q (the lanes of a group
//!   the same element, a broadcast) and `G` consecutive rows of K: no two lanes meet in a bank
//!   while `G <= 8` (the H200's tiles), two at most at `G = 16`. The padding is staged as
//!   zeros past the head dimension's end, and every address of the loops is a register plus a
//!   constant (a swizzle would cost integer work at every load).
//! - V is read at one key, columns `j + t · G`: a group's lanes read consecutive words, the
//!   groups the same ones (broadcasts).
//! - The probabilities lie `key · pitch + row`, the pitch the smallest at least `rows` that is
//!   `32 / G` modulo 32: a thread's store of key `j + c · G`, row `g + ...` falls in bank
//!   `j · 32/G + g + const`, different for all 32 lanes, and the output's loads (one key, rows
//!   `g + ...`) read `32 / G` consecutive words, broadcast within each group.
//!
//! The staging stores (`cp.async` of 16-byte chunks, or element by element) are as
//! `staging.rs` makes them for the GEMMs.
//!
//! # The order of the sums
//!
//! A score is one chain over the head dimension in order (at most `leaf` terms: the mapping
//! requires the head dimension to fit one chunk), each term one fused multiply-add. A
//! probability's term of the output passes through its step's chain of `keys` (at most
//! `leaf`) fused multiply-adds in key order and one rescale-and-add per later step; the
//! denominator through the thread's chain of `C` terms, a `log2 G`-level xor-shuffle tree
//! (every lane of the group ends with the same sum: a float sum is commutative bit for bit),
//! and the same rescale-and-add across steps. The exponentials are kiln's own (the CPU's
//! polynomial). The order is fixed by the tile, so results are deterministic. The reference
//! computes the softmax and the product with exact sums; the tests compare within
//! `kiln_reference::accuracy`'s bounds.

use super::attention::{Parts, block_rows, lowest, skip_masked};
use super::staging::{Staging, Tile, zero};
use super::*;
use crate::target::AttentionTile;

/// What a tile makes of one attention's sizes (see the module documentation).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    tile: AttentionTile,
    /// Lanes of a row group (`G`).
    lanes: usize,
    /// Row groups of a warp (`32 / G`).
    groups: usize,
    /// Warps of the block.
    warps: usize,
    /// Output columns of a thread (`T`).
    cols: usize,
    /// Elements between two keys' probabilities in shared memory.
    pitch: usize,
    /// Elements between two rows of Q or of K in shared memory ([`row_pitch`]).
    row_pitch: usize,
    /// Elements of the shared arrays: Q, K, V, the probabilities.
    lens: [usize; 4],
}

impl Mapper<'_> {
    /// The geometry of `t` for head dimension `k` and `n2` output columns in `dtype`, if it
    /// fits: whole row groups in whole warps, at most `thread_cols` columns a thread, a step's
    /// keys within one chunk of the sum tree, the threads within the block's and the shared
    /// arrays within `Gpu::tile_limit` (beyond the static limit in dynamic shared memory).
    fn attention_geometry(
        &self,
        t: &AttentionTile,
        k: usize,
        n2: usize,
        dtype: DType,
    ) -> Option<Geometry> {
        let warp = self.gpu.warp_size;
        if t.thread_rows == 0 || t.thread_keys == 0 || !t.keys.is_multiple_of(t.thread_keys) {
            return None;
        }
        let lanes = t.lanes_per_row();
        if lanes == 0 || !lanes.is_power_of_two() || !warp.is_multiple_of(lanes) {
            return None;
        }
        let groups = warp / lanes;
        let per_warp = groups * t.thread_rows;
        let cols = n2.div_ceil(lanes);
        if t.rows == 0 || !t.rows.is_multiple_of(per_warp) || cols > t.thread_cols {
            return None;
        }
        let warps = t.rows / per_warp;
        // Banks: as many as a warp's lanes.
        let pitch = t.rows + (groups + warp - t.rows % warp) % warp;
        let rp = row_pitch(k);
        let lens = [t.rows * rp, t.keys * rp, t.keys * n2, t.keys * pitch];
        let bytes = dtype.bytes().max(4);
        // Declared statically within the static limit; else in one dynamic array, each at a
        // 16-byte offset (`GpuKernel::shared_offsets`).
        let fixed = lens.iter().sum::<usize>() * bytes;
        let laid: usize = lens.iter().map(|l| (l * bytes).next_multiple_of(16)).sum();
        let fits = t.keys <= self.sums.leaf
            && warps * warp <= self.gpu.max_threads_per_block
            && (fixed <= self.gpu.shared_limit() || laid <= self.gpu.tile_limit());
        fits.then_some(Geometry {
            tile: *t,
            lanes,
            groups,
            warps,
            cols,
            pitch,
            row_pitch: rp,
            lens,
        })
    }

    /// The tile attention `p` runs with: the first of `Gpu::attention_tiles` that fits and
    /// whose rows the queries fill at least half of, else the last that fits.
    fn attention_tile(&self, p: &Parts) -> Option<Geometry> {
        let fitting: Vec<Geometry> = self
            .gpu
            .attention_tiles
            .iter()
            .filter_map(|t| self.attention_geometry(t, p.d.k, p.ch.n, p.dtype))
            .collect();
        fitting
            .iter()
            .find(|g| 2 * p.d.m >= g.tile.rows)
            .or(fitting.last())
            .copied()
    }

    /// Attention by register tiles (the module documentation), if a tile fits.
    pub(super) fn attention_tiled(&self, p: &Parts) -> Option<GpuKernel> {
        let geo = self.attention_tile(p)?;
        let Parts {
            k,
            ins,
            d,
            ch,
            dtype,
            ..
        } = *p;
        let Geometry {
            tile,
            lanes,
            groups,
            warps,
            cols,
            pitch,
            row_pitch: rp,
            lens,
        } = geo;
        let (rt, ct, n2) = (tile.thread_rows, tile.thread_keys, ch.n);
        let (rows, keys) = (tile.rows, tile.keys);
        let warp = self.gpu.warp_size;
        let threads = warps * warp;
        let gm = d.m.div_ceil(rows);

        let mut r = Regs::default();
        let [batch, m0, zr, n0, rl, jr] = r.array();
        let [el, staged, dd, kk, hv, tmp, ps] = r.array();
        let mut regs = |n: usize| -> Vec<usize> { (0..n).map(|_| r.next()).collect() };
        let (mrun, l, alpha, mt) = (regs(rt), regs(rt), regs(rt), regs(rt));
        let (qf, kf, vf) = (regs(rt), regs(ct), regs(cols));
        // Scores, then logits, then probabilities, row-major `i * C + c`.
        let s = regs(rt * ct);
        // Accumulators and a step's partial sums, row-major `i * T + t`.
        let (acc, part) = (regs(rt * cols), regs(rt * cols));
        let o = r.next();

        let reg = Sc::Reg;
        // The thread's row `i` within the block, key `c` within the step, output column `t`.
        let row_in = |i: usize| Sc::plus(reg(rl), c(groups * i));
        let key_in = |cc: usize| Sc::plus(reg(jr), c(lanes * cc));
        let col = |t: usize| Sc::plus(reg(jr), c(lanes * t));
        let row_at = |i: usize| Sc::plus(reg(m0), row_in(i));
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
        let scale_add = || {
            op(
                OpKind::Add,
                vec![op(OpKind::Multiply, vec![scalar(0), scalar(1)]), scalar(2)],
            )
        };
        let shuffles = |out: &mut Vec<Stmt>, x: usize, kind: Combiner| {
            let mut sh = lanes / 2;
            while sh > 0 {
                out.push(Stmt::Shuffle {
                    reg: tmp,
                    src: x,
                    mode: Shuffle::Xor(sh),
                });
                out.push(Stmt::Combine {
                    acc: x,
                    value: tmp,
                    kind,
                    dtype,
                });
                sh /= 2;
            }
        };

        let mut body = vec![Stmt::Note(format!(
            "a block of {rows} query rows, keys {keys} a step; a thread {rt} rows x {ct} keys \
             and {cols} output columns, {lanes} lanes a row group"
        ))];
        body.extend(block_rows((batch, m0), gm, rows));
        body.extend([
            Stmt::Let {
                reg: zr,
                value: c(0),
            },
            Stmt::Let {
                reg: rl,
                value: Sc::plus(
                    Sc::times(sp(Special::Warp), c(groups * rt)),
                    Sc::quot(sp(Special::Lane), c(lanes)),
                ),
            },
            Stmt::Let {
                reg: jr,
                value: Sc::modulo(sp(Special::Lane), c(lanes)),
            },
        ]);
        for i in 0..rt {
            body.push(Stmt::Identity {
                reg: mrun[i],
                kind: Combiner::Max,
                dtype,
            });
            body.push(zero(l[i], dtype));
        }
        body.extend(acc.iter().map(|&a| zero(a, dtype)));

        let array = |len: usize| SharedArray {
            dtype,
            len,
            packed: false,
            swizzle: None,
        };
        let shared = lens.map(array).to_vec();
        let staging = |k0: usize, k: usize| Staging {
            e: el,
            threads,
            batch,
            k0,
            stage: zr,
            staged,
            k,
            dtype,
        };
        // Q's rows of this block, once: shared array 0, `row * row_pitch + d` (zeros in the
        // padding, as past the head dimension's end).
        body.extend(staging(zr, d.k).stage(
            &[Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: rows,
                depth: rp,
                k_fastest: true,
                panel: 0,
                expr: &p.q,
                array: 0,
            }],
            &shared,
        ));
        // This step's keys: K's rows (shared array 1, `key * row_pitch + d`) and V's rows
        // (shared array 2, `key * n2 + col`).
        let mut step = staging(zr, d.k).stage(
            &[Tile {
                row_var: 2,
                rows: d.n,
                base: n0,
                extent: keys,
                depth: rp,
                k_fastest: true,
                panel: 0,
                expr: &p.key,
                array: 1,
            }],
            &shared,
        );
        step.extend(staging(n0, d.n).stage(
            &[Tile {
                row_var: 2,
                rows: n2,
                base: zr,
                extent: n2,
                depth: keys,
                k_fastest: false,
                panel: 0,
                expr: &p.v,
                array: 2,
            }],
            &shared,
        ));
        step.extend([
            Stmt::CopyCommit,
            Stmt::CopyWait { pending: 0 },
            Stmt::Barrier,
        ]);
        step.extend(s.iter().map(|&x| zero(x, dtype)));
        // The scores: R elements of Q and C of K per head index, R x C multiply-adds.
        let mut scores = Vec::new();
        for (i, &x) in qf.iter().enumerate() {
            scores.push(Stmt::SharedLoad {
                reg: x,
                array: 0,
                index: Sc::plus(Sc::times(row_in(i), c(rp)), reg(dd)),
            });
        }
        for (cc, &y) in kf.iter().enumerate() {
            scores.push(Stmt::SharedLoad {
                reg: y,
                array: 1,
                index: Sc::plus(Sc::times(key_in(cc), c(rp)), reg(dd)),
            });
        }
        for (i, &x) in qf.iter().enumerate() {
            for (cc, &y) in kf.iter().enumerate() {
                scores.push(Stmt::MulAdd {
                    acc: s[i * ct + cc],
                    a: x,
                    b: y,
                    dtype,
                });
            }
        }
        step.push(Stmt::For {
            reg: dd,
            start: c(0),
            end: c(d.k),
            step: c(1),
            body: scores,
        });
        // The logits at (batch, row, key) of the epilogue's shape where both are inside,
        // -inf elsewhere, in place of the scores.
        for i in 0..rt {
            for cc in 0..ct {
                let key = Sc::plus(reg(n0), key_in(cc));
                let flat = Sc::plus(
                    Sc::times(Sc::plus(Sc::times(reg(batch), c(d.m)), row_at(i)), c(d.n)),
                    key.clone(),
                );
                let mut at = set_vars(&dims(&k.out.shape, 0), flat);
                at.push(eval(hv, p.logit.clone(), vec![s[i * ct + cc]]));
                step.extend([
                    Stmt::Identity {
                        reg: hv,
                        kind: Combiner::Max,
                        dtype,
                    },
                    Stmt::If {
                        cond: Sc::and(Sc::lt(key, c(d.n)), Sc::lt(row_at(i), c(d.m))),
                        body: at,
                    },
                    eval(s[i * ct + cc], scalar(0), vec![hv]),
                ]);
            }
        }
        let least = Expr::Const {
            dtype,
            value: lowest(dtype),
        };
        for i in 0..rt {
            let row = &s[i * ct..(i + 1) * ct];
            // The step's largest logit of the row across the row group, then the new maximum.
            step.push(Stmt::Identity {
                reg: mt[i],
                kind: Combiner::Max,
                dtype,
            });
            for &h in row {
                step.push(Stmt::Combine {
                    acc: mt[i],
                    value: h,
                    kind: Combiner::Max,
                    dtype,
                });
            }
            shuffles(&mut step, mt[i], Combiner::Max);
            step.extend([
                Stmt::Combine {
                    acc: mt[i],
                    value: mrun[i],
                    kind: Combiner::Max,
                    dtype,
                },
                eval(tmp, least.clone(), Vec::new()),
                Stmt::Combine {
                    acc: mt[i],
                    value: tmp,
                    kind: Combiner::Max,
                    dtype,
                },
                eval(alpha[i], sub_exp(), vec![mrun[i], mt[i]]),
            ]);
            // The probabilities in place of the logits, their sum across the row group.
            for &h in row {
                step.push(eval(h, sub_exp(), vec![h, mt[i]]));
            }
            step.push(eval(ps, scalar(0), vec![row[0]]));
            for &h in &row[1..] {
                step.push(Stmt::Combine {
                    acc: ps,
                    value: h,
                    kind: Combiner::Add,
                    dtype,
                });
            }
            shuffles(&mut step, ps, Combiner::Add);
            step.extend([
                eval(l[i], scale_add(), vec![l[i], alpha[i], ps]),
                eval(mrun[i], scalar(0), vec![mt[i]]),
            ]);
            for (cc, &h) in row.iter().enumerate() {
                step.push(Stmt::SharedStore {
                    array: 3,
                    index: Sc::plus(Sc::times(key_in(cc), c(pitch)), row_in(i)),
                    value: h,
                });
            }
        }
        step.push(Stmt::Barrier);
        // The output: R probabilities and T elements of V per key, R x T multiply-adds.
        step.extend(part.iter().map(|&x| zero(x, dtype)));
        let mut outs = Vec::new();
        for (i, &x) in qf.iter().enumerate() {
            outs.push(Stmt::SharedLoad {
                reg: x,
                array: 3,
                index: Sc::plus(Sc::times(reg(kk), c(pitch)), row_in(i)),
            });
        }
        for (t, &y) in vf.iter().enumerate() {
            let mut column = vec![Stmt::SharedLoad {
                reg: y,
                array: 2,
                index: Sc::plus(Sc::times(reg(kk), c(n2)), col(t)),
            }];
            for (i, &x) in qf.iter().enumerate() {
                column.push(Stmt::MulAdd {
                    acc: part[i * cols + t],
                    a: x,
                    b: y,
                    dtype,
                });
            }
            // Only the last column of a thread may lie past the output's end.
            if (t + 1) * lanes > n2 {
                outs.push(Stmt::If {
                    cond: Sc::lt(col(t), c(n2)),
                    body: column,
                });
            } else {
                outs.extend(column);
            }
        }
        step.push(Stmt::For {
            reg: kk,
            start: c(0),
            end: c(keys),
            step: c(1),
            body: outs,
        });
        for i in 0..rt {
            for t in 0..cols {
                let a = acc[i * cols + t];
                step.push(eval(a, scale_add(), vec![a, alpha[i], part[i * cols + t]]));
            }
        }
        step.push(Stmt::Barrier);
        // A step whose keys a causal mask hides from all of the block's rows is skipped.
        let step = skip_masked(ch.masked, (n0, keys), (m0, rows), step);
        body.push(Stmt::For {
            reg: n0,
            start: c(0),
            end: c(d.n),
            step: c(keys),
            body: step,
        });
        for i in 0..rt {
            for t in 0..cols {
                body.push(p.store_normalized(
                    dtype,
                    o,
                    (acc[i * cols + t], l[i]),
                    batch,
                    (row_at(i), col(t)),
                ));
            }
        }
        Some(p.kernel(
            MapKind::AttentionTiled,
            (d.batch * gm, threads, warp),
            shared,
            r.0,
            self.sums,
            body,
        ))
    }
}

/// Elements between two rows of Q or of K in shared memory for head dimension `k`: `k` padded
/// so that 8 consecutive rows start in 8 different banks of 4 bytes. A multiple of 4 becomes
/// 4 times an odd number (`k` itself, or `k + 4`), which keeps rows of 16-byte copies aligned;
/// any other `k` the odd number `k` or `k + 1`.
fn row_pitch(k: usize) -> usize {
    match (k % 4, k % 8) {
        (0, 0) => k + 4,
        (0, _) => k,
        _ => k | 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 consecutive rows at one head index fall into 8 different banks of 32, for every
    /// head dimension up to 256.
    #[test]
    fn padded_rows_start_in_different_banks() {
        for k in 1..=256 {
            let p = row_pitch(k);
            assert!(p >= k && p <= k + 4, "{k}: {p}");
            if k % 4 == 0 {
                assert_eq!(p % 4, 0, "{k}: {p}");
            }
            let mut banks: Vec<usize> = (0..8).map(|r| r * p % 32).collect();
            banks.sort();
            banks.dedup();
            assert_eq!(banks.len(), 8, "{k}: {p}");
        }
    }
}
