//! A warp-specialized product on sm_90a's warpgroups (`Gpu::wgmma_tma`, off by default):
//! the operands loaded by TMA into a ring of stages guarded by mbarriers, one producer warp
//! issuing the loads and one or two consumer warpgroups running `wgmma` on them.
//!
//! # Roles and barriers
//!
//! The block is the consumers' `tile.m / 64` warpgroups and one more warp whose first
//! thread is the producer (the rest of the warp idles): 288 or 160 threads. ptxas budgets
//! registers as if that warp were a whole warpgroup (168 a thread for 288 threads, as for
//! 384), so the 128-row tiles' accumulators spill there (`tests/ptx_tma.rs` prints the
//! report); handing the producer's registers to the consumers (`setmaxnreg`) is not done.
//! The ring has `S` stages of A's `tile.m x 64` and B's `tile.n x 64` tiles
//! and two mbarriers per stage: `full[s]` (count 1: the producer's arrival expecting the
//! stage's bytes, then the TMA loads completing them) and `empty[s]` (count: every consumer
//! thread, each arriving once it is done reading the stage). Step `i` (contraction `64 i`)
//! uses stage `i % S` in round `r = i / S`:
//!
//! - the producer waits on `empty[s]` with parity `(r + 1) % 2` (in round 0 the phase
//!   before the first, which counts as completed, so it starts at once; in round `r` the
//!   consumers' release of round `r - 1`), arrives on `full[s]` expecting the stage's bytes
//!   and starts the loads: A's box of 64 contraction steps by `tile.m` rows, B's likewise
//!   when B is stored by columns (K-major), or its panels of 64 columns by 64 contraction
//!   steps when stored by rows (MN-major), all with the 128-byte swizzle;
//! - the consumers wait on `full[s]` with parity `r % 2`, fence, run the stage's four
//!   `wgmma`s, wait for them, flush the sum tree as [`super::warpgroup`] does, and arrive on
//!   `empty[s]`.
//!
//! With `Gpu::wgmma_tma_inline` the producer is the consumers' first thread instead (a
//! block of the consumers alone, whose registers ptxas does not cap for an extra warp): it
//! fills the first `S - 1` steps before the loop, and step `i + S - 1` at step `i`, before
//! its own consumer part, waiting on the empty barrier its slot was released through at
//! step `i - 1`.
//!
//! Both roles step through one loop with no block barrier in it, each in its own branch:
//! the producer's warp runs ahead of the consumers by up to `S` stages on a GPU, and the GPU
//! emulator, which runs the block's threads in lockstep, runs the two branches of a step one
//! after the other, one interleaving the mbarriers allow (its checks of phases, parities and
//! landed data apply to it).
//!
//! # Layouts
//!
//! The stages hold what [`super::warpgroup`]'s descriptors read (the 128-byte swizzle,
//! K-major A and B, or MN-major B in panels of 64 columns): a TMA box whose row is 128 bytes
//! lands as rows of one swizzle atom each, swizzled by its address
//! ([`crate::gpu::tma`]), so the arrays are not swizzled by the kernel
//! ([`SharedArray::swizzle`] `None`) and are aligned to 1024 bytes. Rows and contraction
//! steps past the operands' edges are zeros, as TMA fills them. It applies where each
//! operand is a plain load of a launch input of the operand dtype, one batch, with its
//! contraction (K-major) or its rows (B MN-major, `tile.n` a multiple of 64) contiguous and
//! rows 16-byte aligned; else the `cp.async` ring runs.

use super::gemm::{Launch, Product, tile_origin};
use super::skip::maybe_around;
use super::staging::zero;
use super::tiled::{Operands, accumulators, flushes, sum_down, sum_levels};
use super::warpgroup::{KT, acc_at, stage_wgmmas, swizzled_tile};
use super::*;
use crate::gpu::desc::WgSwizzle;
use crate::gpu::tma::TensorMap;
use crate::gpu::wgmma::WARPGROUP;
use crate::target::GemmTile;

/// How a product's operands are loaded by TMA: the tensor map of each and whether B is
/// MN-major, and the ring's stages.
pub(super) struct TmaRing {
    maps: [TensorMap; 2],
    b_mn: bool,
    stages: usize,
    /// A producer warp of its own (warp-specialized), rather than the consumers' first
    /// thread.
    warp: bool,
}

/// The tensor map of operand `expr` (input `input` expected), `rows` rows (M or N) along
/// variable `row_var`, contraction `k`, boxes of `box_rows` rows: K-major, or MN-major when
/// `mn` (panels of 64 rows).
fn operand_map(
    expr: &Expr,
    dtype: DType,
    (row_var, rows, k): (usize, usize, usize),
    box_rows: usize,
    mn: bool,
) -> Option<TensorMap> {
    let load = match expr {
        Expr::Load { .. } => expr,
        Expr::Op {
            op: Ew::Convert,
            args,
            ..
        } if args.len() == 1 => &args[0],
        _ => return None,
    };
    let Expr::Load {
        input,
        dtype: d,
        coef,
        off,
    } = load
    else {
        return None;
    };
    let other = 3 - row_var;
    if *d != dtype || coef.len() != 4 || *off != 0 || coef[other] != 0 {
        return None;
    }
    let e = dtype.bits() as usize / 8;
    let (fast, slow) = if mn { (row_var, 3) } else { (3, row_var) };
    let (inner, outer) = if mn { (rows, k) } else { (k, rows) };
    let stride = usize::try_from(coef[slow]).ok()?;
    if coef[fast] != 1 || stride < inner {
        return None;
    }
    let map = TensorMap {
        input: *input,
        dtype,
        dims: [inner, outer],
        row_stride: stride * e,
        box_dims: if mn { [64, KT] } else { [KT, box_rows] },
        swizzle: WgSwizzle::B128,
    };
    map.check().ok().map(|()| map)
}

impl Mapper<'_> {
    /// The TMA ring a product on warpgroups of `tile` runs with, if the GPU asks for one
    /// (`Gpu::wgmma_tma`) and its operands allow it (module docs).
    pub(super) fn tma_ring(
        &self,
        d: &Product,
        ops: &Operands,
        (tile, operand): (GemmTile, MmaOperand),
    ) -> Option<TmaRing> {
        if !self.gpu.wgmma_tma || d.batch != 1 || d.a_trans || ops.planes {
            return None;
        }
        let dtype = operand.dtype();
        let b_mn = !d.b_trans;
        if b_mn && !tile.n.is_multiple_of(64) {
            return None;
        }
        let a = operand_map(ops.a, dtype, (1, d.m, d.k), tile.m, false)?;
        let b = operand_map(ops.b, dtype, (2, d.n, d.k), tile.n, b_mn)?;
        if (a.input, b.input) != (0, 1) {
            return None;
        }
        let bytes = |s: usize| s * ((tile.m + tile.n) * KT * dtype.bytes() + 16);
        let most = self.gpu.mma_stages.min(d.k.div_ceil(KT)).max(2);
        let stages = (2..=most)
            .rev()
            .find(|&s| bytes(s) <= self.gpu.tile_limit())?;
        Some(TmaRing {
            maps: [a, b],
            b_mn,
            stages,
            warp: !self.gpu.wgmma_tma_inline,
        })
    }

    /// The product of `d` on warpgroups by block tiles of `tile`, its operands loaded by
    /// TMA through `ring` (module docs), stored into `out`.
    pub(super) fn wgmma_tma_product(
        &self,
        launch: Launch,
        d: &Product,
        ops: &Operands,
        (tile, operand): (GemmTile, MmaOperand),
        ring: TmaRing,
    ) -> GpuKernel {
        let f32t = DType::F32;
        let (bm, bn) = (tile.m, tile.n);
        let (gm, gn) = (d.m.div_ceil(bm), d.n.div_ceil(bn));
        let consumers = bm / 64 * WARPGROUP;
        // A producer warp after the consumers, or the consumers' first thread.
        let (producer, threads) = if ring.warp {
            (consumers, consumers + 32)
        } else {
            (0, consumers)
        };
        let stages = ring.stages;
        let mut r = Regs::default();
        let [batch, m0, n0] = r.array();
        let [k0, stage, parity] = r.array();
        // The step the producer fills, its stage and its round's parity.
        let (pk0, pstage, pparity) = if ring.warp {
            (k0, stage, parity)
        } else {
            (r.next(), r.next(), r.next())
        };
        let tmp = (r.next(), r.next());
        let levels = sum_levels(d.k, self.sums);
        let acc = accumulators(&mut r, levels, bn / 2);
        let reg = Sc::Reg;
        let tid = || sp(Special::Thread);
        let mut body = tile_origin((batch, m0, n0), (gm, gn), (bm, bn));
        for level in &acc {
            body.extend(level.iter().map(|&x| zero(x, f32t)));
        }
        let (ta, tb) = (swizzled_tile(bm, false), swizzled_tile(bn, ring.b_mn));
        let shared = vec![
            SharedArray {
                dtype: operand.dtype(),
                len: stages * ta.elems(),
                packed: true,
                swizzle: None,
            },
            SharedArray {
                dtype: operand.dtype(),
                len: stages * tb.elems(),
                packed: true,
                swizzle: None,
            },
            SharedArray::mbarriers(2 * stages),
        ];
        let full = |stage: usize| Mbar {
            array: 2,
            index: reg(stage),
        };
        let empty = |stage: usize| Mbar {
            array: 2,
            index: Sc::plus(reg(stage), c(stages)),
        };
        let mut init = Vec::new();
        for s in 0..stages {
            init.push(Stmt::MbarInit {
                bar: Mbar {
                    array: 2,
                    index: c(s),
                },
                count: 1,
            });
            init.push(Stmt::MbarInit {
                bar: Mbar {
                    array: 2,
                    index: c(s + stages),
                },
                count: consumers,
            });
        }
        body.push(Stmt::If {
            cond: Sc::eq(tid(), c(0)),
            body: init,
        });
        body.push(Stmt::Barrier);
        // The producer: the stage's slot free, its bytes expected, its boxes started.
        let tx = (bm + bn) * KT * operand.dtype().bytes();
        let (k0_c, stage_c, parity_c) = (k0, stage, parity);
        let (k0p, stage_p, parity_p) = (pk0, pstage, pparity);
        let step_of = |k: usize, stage: usize, parity: usize| {
            let step = Sc::quot(reg(k), c(KT));
            [
                Stmt::Let {
                    reg: stage,
                    value: Sc::modulo(step.clone(), c(stages)),
                },
                Stmt::Let {
                    reg: parity,
                    value: Sc::modulo(Sc::quot(step, c(stages)), c(2)),
                },
            ]
        };
        let (k0, stage, parity) = (k0p, stage_p, parity_p);
        let mut produce = vec![
            Stmt::MbarWait {
                bar: empty(stage),
                parity: Sc::modulo(Sc::plus(reg(parity), c(1)), c(2)),
            },
            Stmt::MbarArrive {
                bar: full(stage),
                tx,
            },
            Stmt::TmaLoad {
                map: 0,
                array: 0,
                index: Sc::times(reg(stage), c(ta.elems())),
                coords: [reg(k0), reg(m0)],
                bar: full(stage),
            },
        ];
        if ring.b_mn {
            for j in 0..bn / 64 {
                produce.push(Stmt::TmaLoad {
                    map: 1,
                    array: 1,
                    index: Sc::plus(
                        Sc::times(reg(stage), c(tb.elems())),
                        c(tb.desc_start(64 * j, 0)),
                    ),
                    coords: [Sc::plus(reg(n0), c(64 * j)), reg(k0)],
                    bar: full(stage),
                });
            }
        } else {
            produce.push(Stmt::TmaLoad {
                map: 1,
                array: 1,
                index: Sc::times(reg(stage), c(tb.elems())),
                coords: [reg(k0), reg(n0)],
                bar: full(stage),
            });
        }
        let (k0, stage, parity) = (k0_c, stage_c, parity_c);
        // The consumers: the stage landed, its four k-steps, the sum tree's flushes, the
        // slot released.
        let warpgroup = Sc::quot(tid(), c(WARPGROUP));
        let mut consume = vec![
            Stmt::MbarWait {
                bar: full(stage),
                parity: reg(parity),
            },
            Stmt::WgmmaFence,
        ];
        consume.extend(stage_wgmmas(
            &acc[0],
            (&ta, &tb),
            reg(stage),
            &warpgroup,
            (bn, operand),
        ));
        consume.push(Stmt::WgmmaCommit);
        consume.push(Stmt::WgmmaWait { pending: 0 });
        let done = Sc::plus(reg(k0), c(KT));
        consume.extend(flushes(&acc, &done, self.sums, f32t, &[]));
        consume.push(Stmt::MbarArrive {
            bar: empty(stage),
            tx: 0,
        });
        let is_consumer = || Sc::lt(tid(), c(consumers));
        let mut steps: Vec<Stmt> = step_of(k0, stage, parity).to_vec();
        // The ring's first fill and the loop: what a block whose tile no reader uses skips.
        let mut contraction = Vec::new();
        if ring.warp {
            steps.push(Stmt::If {
                cond: Sc::eq(tid(), c(producer)),
                body: produce,
            });
        } else {
            // The consumers' first thread fills the ring `stages - 1` steps ahead: the first
            // steps before the loop, step `i + stages - 1` at step `i`.
            let ahead = (stages - 1) * KT;
            let mut fill: Vec<Stmt> = step_of(pk0, pstage, pparity).to_vec();
            fill.extend(produce);
            contraction.push(Stmt::For {
                reg: pk0,
                start: c(0),
                end: c(ahead.min(d.k.next_multiple_of(KT))),
                step: c(KT),
                body: vec![Stmt::If {
                    cond: Sc::eq(tid(), c(producer)),
                    body: fill.clone(),
                }],
            });
            steps.push(Stmt::Let {
                reg: pk0,
                value: Sc::plus(reg(k0), c(ahead)),
            });
            steps.push(Stmt::If {
                cond: Sc::and(Sc::eq(tid(), c(producer)), Sc::lt(reg(pk0), c(d.k))),
                body: fill,
            });
        }
        steps.push(Stmt::If {
            cond: is_consumer(),
            body: consume,
        });
        contraction.push(Stmt::For {
            reg: k0,
            start: c(0),
            end: c(d.k),
            step: c(KT),
            body: steps,
        });
        if let Some(z) = d.zero_steps(ops) {
            contraction.insert(0, z.every_step("the TMA ring"));
        }
        let origin = (reg(m0), reg(n0));
        body.extend(maybe_around(
            d.skip().as_ref(),
            origin,
            (bm, bn),
            contraction,
        ));
        let mut epilogue = sum_down(&acc, f32t);
        for (i, &v) in acc[levels].iter().enumerate() {
            let at = acc_at((reg(m0), reg(n0)), &warpgroup, i);
            epilogue.push(launch.store_element(d, ops.planes, batch, at, v, tmp));
        }
        body.push(Stmt::If {
            cond: is_consumer(),
            body: epilogue,
        });
        let mut k = launch.kernel(
            MapKind::GemmMma,
            (gm * gn, threads, 32),
            shared,
            r.0,
            self.sums,
            body,
        );
        k.tensor_maps = ring.maps.to_vec();
        k
    }
}
