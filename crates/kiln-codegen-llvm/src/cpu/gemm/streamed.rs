//! A product of a few rows that streams B stored by rows ([`Stream::Rows`]): nothing is packed. For
//! each block of `nc` columns the block's product (all `mr` rows of a matrix) is accumulated in
//! the scratch memory across the contraction, in passes of `kc` steps: a pass walks the block
//! one panel of `nr` columns at a time, with the panel's rows of the product in registers,
//! reading `kc` rows of B side by side where they are stored. Then the block is stored into C
//! (folded in, in update mode) and the epilogue runs over it.

use super::*;

impl<'c> Gemm<'_, 'c> {
    /// Emits the streamed product of the rows `lo..hi` (across batches) and columns
    /// `col_lo..col_hi` of a GEMM of `n` columns; B's matrices start as `b_strides` say (one
    /// after another, `[k, n]` each, without); C's element (r, j) is `out[out_at(r, j)]`;
    /// `scratch` holds [`Blocking::scratch_bytes`]; `epilogue` runs over each finished block.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn streamed(
        &self,
        n: i64,
        (lo, hi): (IntValue<'c>, IntValue<'c>),
        (col_lo, col_hi): (IntValue<'c>, IntValue<'c>),
        b_strides: Option<&Strides>,
        out: PointerValue<'c>,
        out_at: &dyn Fn(IntValue<'c>, IntValue<'c>) -> Result<IntValue<'c>>,
        scratch: PointerValue<'c>,
        mut epilogue: Option<Epilogue<'_, 'c>>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let bl = self.bl;
        let (mr, nv, lanes, nr) = (bl.mr, bl.nv, bl.lanes as i64, bl.nr());
        // The block of the product: `mc` rows (the matrix's, in groups of `mr`), `ld` apart
        // (one block when `n` is narrower than `nc`).
        let ld = bl.nc_for(n);
        let groups = bl.mc / mr;
        let n_full = n - n % nr;
        let n_vec = n - n % lanes;
        let m = self.m;
        let (s_bt, s_jc, s_kb, s_j, s_kk) = (x.slot()?, x.slot()?, x.slot()?, x.slot()?, x.slot()?);
        let accs: Vec<PointerValue<'c>> = (0..mr * nv)
            .map(|_| em.entry_alloca(self.vt.into()))
            .collect::<Result<_>>()?;
        x.batches(s_bt, (lo, hi), m, &mut |bt, r_lo, r_hi| {
            let (b_base, ldb) = match b_strides {
                Some(s) => (batch_start(x, s, bt)?, x.c(s.ld as i64)),
                None => (x.mul(bt, x.mulc(self.k, n)?)?, x.c(n)),
            };
            // Where each row of each group's tile of A starts (rows past the batch's last read
            // it; their products are not stored).
            let last = x.sub(r_hi, x.c(1))?;
            let rows = x.sub(r_hi, r_lo)?;
            let starts: Vec<Vec<IntValue<'c>>> = (0..groups)
                .map(|g| {
                    (0..mr)
                        .map(|i| self.a_row(x.min(x.addc(r_lo, g * mr + i)?, last)?))
                        .collect::<Result<_>>()
                })
                .collect::<Result<_>>()?;
            em.range_loop_ptr(s_jc, col_lo, col_hi, ld, &mut |_| {
                let jc = x.get(s_jc)?;
                let jc_end = x.min(x.addc(jc, ld)?, col_hi)?;
                let full_end = x.min(jc_end, x.c(n_full))?;
                em.range_loop_ptr(s_j, x.c(0), x.c(bl.mc * ld), lanes, &mut |_| {
                    let at = x.at(self.ft, scratch, x.get(s_j)?)?;
                    em.b.build_store(at, self.vt.const_zero()).map_err(llvm)?;
                    Ok(())
                })?;
                em.range_loop_ptr(s_kb, x.c(0), self.k, bl.kc, &mut |_| {
                    let kb = x.get(s_kb)?;
                    let kend = x.min(x.addc(kb, bl.kc)?, self.k)?;
                    // Panel `j` (`width` columns) of the block over this pass's steps, for
                    // the tile of rows `g * mr..` (the later groups find the pass's rows of B in
                    // the level 1 cache).
                    let tile = |j: IntValue<'c>, width: i64, g: i64| -> Result<()> {
                        let starts = &starts[g as usize];
                        let p = |i: i64, v: i64| -> Result<IntValue<'c>> {
                            x.addc(x.sub(j, jc)?, (g * mr + i) * ld + v * lanes)
                        };
                        for i in 0..mr {
                            for v in 0..nv {
                                let acc = self.load_cols(scratch, p(i, v)?, lanes)?;
                                em.b.build_store(accs[(i * nv + v) as usize], acc)
                                    .map_err(llvm)?;
                            }
                        }
                        let step = |kk: IntValue<'c>| -> Result<()> {
                            let row = x.add(x.add(b_base, x.mul(kk, ldb)?)?, j)?;
                            let bvs: Vec<BasicValueEnum<'c>> = (0..nv)
                                .map(|v| {
                                    self.load_cols(
                                        self.b,
                                        x.addc(row, v * lanes)?,
                                        width - v * lanes,
                                    )
                                })
                                .collect::<Result<_>>()?;
                            for (i, &start) in starts.iter().enumerate() {
                                let at = x.at(self.ft, self.a, self.a_at(start, kk)?)?;
                                let a = em.b.build_load(self.ft, at, "a").map_err(llvm)?;
                                let splat = splat(em, self.ft, bl.lanes, a)?;
                                for (v, bv) in bvs.iter().enumerate() {
                                    let slot = accs[i * nv as usize + v];
                                    let acc =
                                        em.b.build_load(self.vt, slot, "acc").map_err(llvm)?;
                                    let fma = em.intrinsic(
                                        "llvm.fmuladd",
                                        self.vt.into(),
                                        &[splat.into(), *bv, acc],
                                    )?;
                                    em.b.build_store(slot, fma).map_err(llvm)?;
                                }
                            }
                            Ok(())
                        };
                        // The steps in a loop: unrolled, the passes' loads of B were scheduled
                        // ahead of their multiply-adds and spilled.
                        em.range_loop_ptr(s_kk, kb, kend, 1, &mut |_| step(x.get(s_kk)?))?;
                        for i in 0..mr {
                            for v in 0..nv {
                                let acc =
                                    em.b.build_load(self.vt, accs[(i * nv + v) as usize], "acc")
                                        .map_err(llvm)?;
                                self.store_cols(scratch, p(i, v)?, lanes, acc)?;
                            }
                        }
                        Ok(())
                    };
                    let panel = |j: IntValue<'c>, width: i64| -> Result<()> {
                        for g in 0..groups {
                            let live = x.cmp(IntPredicate::SLT, x.c(g * mr), rows)?;
                            x.branch(live, &mut || tile(j, width, g), &mut || Ok(()))?;
                        }
                        Ok(())
                    };
                    if n_full > 0 {
                        em.range_loop_ptr(s_j, jc, full_end, nr, &mut |_| panel(x.get(s_j)?, nr))?;
                    }
                    if n_full < n {
                        let tail = x.cmp(IntPredicate::SGT, jc_end, x.c(n_full))?;
                        x.branch(tail, &mut || panel(x.c(n_full), n - n_full), &mut || Ok(()))?;
                    }
                    Ok(())
                })?;
                // The block into C, row by row: whole vectors, then the row's last columns.
                em.range_loop_ptr(s_kk, r_lo, r_hi, 1, &mut |_| {
                    let r = x.get(s_kk)?;
                    let i = x.sub(r, r_lo)?;
                    let vec_end = x.min(jc_end, x.c(n_vec))?;
                    let store = |j: IntValue<'c>, width: i64| -> Result<()> {
                        let at = x.add(x.mulc(i, ld)?, x.sub(j, jc)?)?;
                        let acc = self.load_cols(scratch, at, lanes)?;
                        self.store_acc(out, out_at(r, j)?, width, acc, self.update.is_some())
                    };
                    em.range_loop_ptr(s_j, jc, vec_end, lanes, &mut |_| store(x.get(s_j)?, lanes))?;
                    if n_vec < n {
                        let tail = x.cmp(IntPredicate::SGT, jc_end, x.c(n_vec))?;
                        x.branch(tail, &mut || store(x.c(n_vec), n - n_vec), &mut || Ok(()))?;
                    }
                    Ok(())
                })?;
                match epilogue.as_mut() {
                    Some(e) => e((r_lo, r_hi), (jc, jc_end), out, x.c(0), None),
                    None => Ok(()),
                }
            })
        })
    }
}
