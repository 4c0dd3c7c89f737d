//! Transposes through shared-memory tiles ([`MapKind::TransposeTiles`]).
//!
//! A loop nest without reductions whose inputs are read contiguously along an output
//! dimension `a` other than the innermost `l` (a transpose, a permutation that moves the
//! innermost dimension, a gather that is one) writes its output in tiles of `T x T`
//! positions of `a` and `l` (`T` the warp size), the other dimensions fixed per tile. A block
//! of `Gpu::elementwise_block` threads (`T` lanes by `R` rows) steps through the tiles, grid
//! strided. For each tile:
//!
//! 1. each warp computes `T` positions along `a` at one position of `l` (its reads
//!    consecutive in memory) and stores them in row `l` of a shared `T x (T + 1)` array;
//! 2. a barrier; each warp then reads `T` positions along `l` at one position of `a` (column
//!    `a` of the array: a stride of `T + 1` elements, so the lanes fall in different banks)
//!    and stores them consecutively into the output;
//! 3. a barrier, before the next tile overwrites the array.
//!
//! Positions past the output's edges (ragged tiles) are skipped in both phases.

use super::*;

impl Mapper<'_> {
    /// The output dimension `k` runs in shared-memory tiles of (with its innermost one), if
    /// it is a transpose (of a dtype shared arrays hold) whose tiles the block fills in whole rows: what
    /// [`crate::loop_schedule::transpose_tile_dim`] picks for tiles of the warp size.
    pub(super) fn transpose_dim(&self, k: &Kernel) -> Option<usize> {
        let t = self.gpu.warp_size;
        let block = self.gpu.elementwise_block;
        // The dtypes a shared array holds as they are (f16 and bf16 widened to f32).
        let held = matches!(
            k.out.dtype,
            DType::F16
                | DType::BF16
                | DType::F32
                | DType::F64
                | DType::I32
                | DType::I64
                | DType::U32
                | DType::U64
        );
        if !held || block < t || !block.is_multiple_of(t) || block > t * t {
            return None;
        }
        crate::loop_schedule::transpose_tile_dim(k, t)
    }

    /// `k` (one output, no reductions) in tiles of its dimensions `a` and its innermost one.
    pub(super) fn transpose_tiles(
        &self,
        name: &str,
        k: &Kernel,
        a: usize,
        inputs: Vec<(Buf, TensorType)>,
    ) -> GpuKernel {
        let out = &k.out;
        let rank = out.shape.len();
        let l = rank - 1;
        let t = self.gpu.warp_size;
        let block = self.gpu.elementwise_block;
        let rows = block / t;
        let (ea, el) = (out.shape[a], out.shape[l]);
        let (na, nl) = (ea.div_ceil(t), el.div_ceil(t));
        let others: Vec<(usize, usize)> = (0..rank)
            .filter(|&d| d != a && d != l)
            .map(|d| (d, out.shape[d]))
            .collect();
        let tiles = extent(&others) * na * nl;
        let mut r = Regs::default();
        let [tile, lane, row, a0, l0, j, v] = r.array();
        let pitch = t + 1;
        // The output's element at the variables as set: Σ var_d · stride_d.
        let mut index = c(0);
        let mut stride = 1;
        for d in (0..rank).rev() {
            index = Sc::plus(index, Sc::times(Sc::Var(d), c(stride)));
            stride *= out.shape[d];
        }
        // Positions `(a0 + da, l0 + dl)`, when inside the output.
        let inside = |da: Sc, dl: Sc| {
            Sc::And(
                Box::new(Sc::lt(Sc::plus(Sc::Reg(a0), da), c(ea))),
                Box::new(Sc::lt(Sc::plus(Sc::Reg(l0), dl), c(el))),
            )
        };
        let set = |da: Sc, dl: Sc| {
            vec![
                Stmt::SetVar {
                    var: a,
                    value: Sc::plus(Sc::Reg(a0), da),
                },
                Stmt::SetVar {
                    var: l,
                    value: Sc::plus(Sc::Reg(l0), dl),
                },
            ]
        };
        let rows_loop = |body: Vec<Stmt>| Stmt::For {
            reg: j,
            start: Sc::Reg(row),
            end: c(t),
            step: c(rows),
            body,
        };
        // Phase 1: lanes along `a` (coalesced reads), the value into row `j` of the array.
        let mut compute = set(Sc::Reg(lane), Sc::Reg(j));
        compute.push(Stmt::Eval {
            reg: v,
            expr: k.body.clone(),
            scalars: Vec::new(),
        });
        compute.push(Stmt::SharedStore {
            array: 0,
            index: Sc::plus(Sc::times(Sc::Reg(j), c(pitch)), Sc::Reg(lane)),
            value: v,
        });
        // Phase 2: lanes along the innermost dimension (coalesced writes), from column `j`.
        let mut write = vec![Stmt::SharedLoad {
            reg: v,
            array: 0,
            index: Sc::plus(Sc::times(Sc::Reg(lane), c(pitch)), Sc::Reg(j)),
        }];
        write.extend(set(Sc::Reg(j), Sc::Reg(lane)));
        write.push(Stmt::Store {
            buf: Buf::Output(0),
            index,
            value: v,
        });
        let mut per_tile = set_vars(&others, Sc::quot(Sc::Reg(tile), c(na * nl)));
        per_tile.extend([
            Stmt::Let {
                reg: a0,
                value: Sc::times(Sc::modulo(Sc::quot(Sc::Reg(tile), c(nl)), c(na)), c(t)),
            },
            Stmt::Let {
                reg: l0,
                value: Sc::times(Sc::modulo(Sc::Reg(tile), c(nl)), c(t)),
            },
            rows_loop(vec![Stmt::If {
                cond: inside(Sc::Reg(lane), Sc::Reg(j)),
                body: compute,
            }]),
            Stmt::Barrier,
            rows_loop(vec![Stmt::If {
                cond: inside(Sc::Reg(j), Sc::Reg(lane)),
                body: write,
            }]),
            Stmt::Barrier,
        ]);
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::TransposeTiles,
            grid: tiles.clamp(1, self.gpu.sms * self.gpu.blocks_per_sm),
            block,
            warp: t,
            inputs,
            outputs: vec![(Buf::Output(0), out.clone())],
            shared: vec![SharedArray {
                dtype: out.dtype,
                len: t * pitch,
                packed: false,
                swizzle: None,
            }],
            regs: r.0,
            vars: k.vars,
            sums: self.sums,
            body: vec![
                Stmt::Let {
                    reg: lane,
                    value: Sc::modulo(sp(Special::Thread), c(t)),
                },
                Stmt::Let {
                    reg: row,
                    value: Sc::quot(sp(Special::Thread), c(t)),
                },
                Stmt::For {
                    reg: tile,
                    start: sp(Special::Block),
                    end: c(tiles),
                    step: sp(Special::GridDim),
                    body: per_tile,
                },
            ],
        }
    }
}
