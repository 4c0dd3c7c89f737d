//! A product of a few rows whose B is stored transposed (`[n, k]`: a weight matrix by output,
//! as a linear layer keeps it) and that streams B ([`Stream::Dots`]): every element of C is
//! the dot product of a row of A and a stored row of B, both contiguous along the contraction.
//! A tile holds the `mr` rows of a matrix times `nv` rows of B, one vector of partial sums
//! each; a contraction step loads a vector of each of the `nv` rows of B (read once, from
//! start to end, side by side) and of the `mr` rows of A. At the end each partial sum is
//! summed across its lanes (halves added, a fixed order), the steps past the last whole vector
//! are added one by one, and the tile's row of C is stored (folded in, in update mode).

use super::*;

impl<'c> Gemm<'_, 'c> {
    /// Emits the product of the rows `lo..hi` (across batches) and columns `col_lo..col_hi` of
    /// a GEMM of `n` columns whose B is stored transposed, by dot products; B's matrices start
    /// as `b_strides` say (one after another, `[n, k]` each, without); C's element (r, j) is
    /// `out[out_at(r, j)]`; `epilogue` runs over the block when it is done.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dots(
        &self,
        n: i64,
        (lo, hi): (IntValue<'c>, IntValue<'c>),
        (col_lo, col_hi): (IntValue<'c>, IntValue<'c>),
        b_strides: Option<&Strides>,
        out: PointerValue<'c>,
        out_at: &dyn Fn(IntValue<'c>, IntValue<'c>) -> Result<IntValue<'c>>,
        mut epilogue: Option<Epilogue<'_, 'c>>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let bl = self.bl;
        let (mr, nv, lanes) = (bl.mr, bl.nv, bl.lanes as i64);
        let n_full = n - n % nv;
        let m = self.m;
        let (s_bt, s_j, s_kk) = (x.slot()?, x.slot()?, x.slot()?);
        let accs: Vec<PointerValue<'c>> = (0..mr * nv)
            .map(|_| em.entry_alloca(self.vt.into()))
            .collect::<Result<_>>()?;
        let sums: Vec<PointerValue<'c>> = (0..mr * nv)
            .map(|_| em.entry_alloca(self.ft.into()))
            .collect::<Result<_>>()?;
        // The contraction's whole vectors.
        let k_vec = x.sub(
            self.k,
            em.b.build_int_signed_rem(self.k, x.c(lanes), "kr")
                .map_err(llvm)?,
        )?;
        x.batches(s_bt, (lo, hi), m, &mut |bt, r_lo, r_hi| {
            let (b_base, ldb) = match b_strides {
                Some(s) => (batch_start(x, s, bt)?, x.c(s.ld as i64)),
                None => (x.mul(bt, x.mulc(self.k, n)?)?, self.k),
            };
            // Where each of the tile's rows of A starts (rows past the batch's last read it;
            // their products are not stored).
            let last = x.sub(r_hi, x.c(1))?;
            let starts: Vec<IntValue<'c>> = (0..mr)
                .map(|i| self.a_row(x.min(x.addc(r_lo, i)?, last)?))
                .collect::<Result<_>>()?;
            // The `width` columns of C from `j` on (rows `j..` of B).
            let group = |j: IntValue<'c>, width: i64| -> Result<()> {
                let b_rows: Vec<IntValue<'c>> = (0..width)
                    .map(|jj| x.add(b_base, x.mul(x.addc(j, jj)?, ldb)?))
                    .collect::<Result<_>>()?;
                for &acc in &accs {
                    em.b.build_store(acc, self.vt.const_zero()).map_err(llvm)?;
                }
                em.range_loop_ptr(s_kk, x.c(0), k_vec, lanes, &mut |_| {
                    let kk = x.get(s_kk)?;
                    let bvs: Vec<BasicValueEnum<'c>> = b_rows
                        .iter()
                        .map(|&row| self.load_cols(self.b, x.add(row, kk)?, lanes))
                        .collect::<Result<_>>()?;
                    for (i, &start) in starts.iter().enumerate() {
                        let av = self.load_cols(self.a, self.a_at(start, kk)?, lanes)?;
                        for (jj, bv) in bvs.iter().enumerate() {
                            let slot = accs[i * nv as usize + jj];
                            let acc = em.b.build_load(self.vt, slot, "acc").map_err(llvm)?;
                            let fma =
                                em.intrinsic("llvm.fmuladd", self.vt.into(), &[av, *bv, acc])?;
                            em.b.build_store(slot, fma).map_err(llvm)?;
                        }
                    }
                    Ok(())
                })?;
                for i in 0..mr {
                    for jj in 0..width {
                        let at = (i * nv + jj) as usize;
                        let v = em.b.build_load(self.vt, accs[at], "acc").map_err(llvm)?;
                        let s = self.across_lanes(v.into_vector_value())?;
                        em.b.build_store(sums[at], s).map_err(llvm)?;
                    }
                }
                // The steps past the last whole vector, one at a time.
                em.range_loop_ptr(s_kk, k_vec, self.k, 1, &mut |_| {
                    let kk = x.get(s_kk)?;
                    let bs: Vec<FloatValue<'c>> = b_rows
                        .iter()
                        .map(|&row| {
                            let at = x.at(self.ft, self.b, x.add(row, kk)?)?;
                            Ok(em
                                .b
                                .build_load(self.ft, at, "b")
                                .map_err(llvm)?
                                .into_float_value())
                        })
                        .collect::<Result<_>>()?;
                    for (i, &start) in starts.iter().enumerate() {
                        let at = x.at(self.ft, self.a, self.a_at(start, kk)?)?;
                        let a = em.b.build_load(self.ft, at, "a").map_err(llvm)?;
                        for (jj, &b) in bs.iter().enumerate() {
                            let slot = sums[i * nv as usize + jj];
                            let s = em.b.build_load(self.ft, slot, "s").map_err(llvm)?;
                            let fma =
                                em.intrinsic("llvm.fmuladd", self.ft.into(), &[a, b.into(), s])?;
                            em.b.build_store(slot, fma).map_err(llvm)?;
                        }
                    }
                    Ok(())
                })?;
                // Each row of the tile that is C's: its `width` sums as one vector's lanes.
                let rows = x.sub(r_hi, r_lo)?;
                for i in 0..mr {
                    let live = x.cmp(IntPredicate::SLT, x.c(i), rows)?;
                    x.branch(
                        live,
                        &mut || {
                            let mut v = self.vt.const_zero();
                            for jj in 0..width {
                                let s =
                                    em.b.build_load(self.ft, sums[(i * nv + jj) as usize], "s")
                                        .map_err(llvm)?;
                                v =
                                    em.b.build_insert_element(v, s, x.c(jj), "row")
                                        .map_err(llvm)?;
                            }
                            let r = x.addc(r_lo, i)?;
                            self.store_acc(
                                out,
                                out_at(r, j)?,
                                width,
                                v.into(),
                                self.update.is_some(),
                            )
                        },
                        &mut || Ok(()),
                    )?;
                }
                Ok(())
            };
            let full_end = x.min(col_hi, x.c(n_full))?;
            if n_full > 0 {
                em.range_loop_ptr(s_j, col_lo, full_end, nv, &mut |_| group(x.get(s_j)?, nv))?;
            }
            if n_full < n {
                let tail = x.cmp(IntPredicate::SGT, col_hi, x.c(n_full))?;
                x.branch(tail, &mut || group(x.c(n_full), n - n_full), &mut || Ok(()))?;
            }
            match epilogue.as_mut() {
                Some(e) => e((r_lo, r_hi), (col_lo, col_hi), out, x.c(0), None),
                None => Ok(()),
            }
        })
    }

    /// The sum of `v`'s lanes: halves added until one lane is left (the same order on every
    /// run and target of the same vector width).
    fn across_lanes(&self, v: VectorValue<'c>) -> Result<BasicValueEnum<'c>> {
        let em = self.x.em;
        let i32t = em.ctx.i32_type();
        let mut v = v;
        let mut width = self.bl.lanes;
        while width > 1 {
            let half = width / 2;
            let pick = |from: u32| {
                let idx: Vec<IntValue<'c>> = (0..half)
                    .map(|l| i32t.const_int((from + l) as u64, false))
                    .collect();
                VectorType::const_vector(&idx)
            };
            let lo =
                em.b.build_shuffle_vector(v, v.get_type().get_undef(), pick(0), "lo")
                    .map_err(llvm)?;
            let hi =
                em.b.build_shuffle_vector(v, v.get_type().get_undef(), pick(half), "hi")
                    .map_err(llvm)?;
            v = em.b.build_float_add(lo, hi, "h").map_err(llvm)?;
            width = half;
        }
        em.b.build_extract_element(v, i32t.const_zero(), "sum")
            .map_err(llvm)
    }
}
