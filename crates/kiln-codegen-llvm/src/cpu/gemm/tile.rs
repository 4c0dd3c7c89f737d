//! The micro-kernel: one register tile of C accumulating a sliver of A times a panel of B.

use super::*;

impl<'c> Regs<'_, 'c> {
    /// One register tile: the first `rows` of its `mr` rows (all when `rows >= mr`) by
    /// `width` columns of C, at `c` with rows `ldc` apart (columns, when C is stored by
    /// columns: [`Regs::planes`]), accumulate A times `panel` of packed B over `kc` steps, A's
    /// row `i` at step `kk` read at `a(i, kk)`; C is read first unless `first` (the first
    /// contraction block). In update mode the product starts from zero and is folded into C at
    /// the end. The compact tile ([`Blocking::compact`]) reads B's rows `ldb` apart (B itself,
    /// or its packed panel: `ldb` is then `nr`), others the packed panel's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tile(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        rows: IntValue<'c>,
        width: i64,
        a: &dyn Fn(i64, IntValue<'c>) -> Result<PointerValue<'c>>,
        (panel, ldb): (PointerValue<'c>, IntValue<'c>),
        kc: IntValue<'c>,
        first: IntValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let (mr, nv, lanes) = (self.bl.mr, self.bl.nv, self.bl.lanes as i64);
        let accs: Vec<PointerValue<'c>> = (0..mr * nv)
            .map(|_| em.entry_alloca(self.vt.into()))
            .collect::<Result<_>>()?;
        let c_at = |i: i64| x.mulc(ldc, i);
        let live: Vec<IntValue<'c>> = (0..mr)
            .map(|i| x.cmp(IntPredicate::SLT, x.c(i), rows))
            .collect::<Result<_>>()?;
        // Rows stored, for a tile stored by columns.
        let n_live = if self.planes {
            Some(x.min(rows, x.c(mr))?)
        } else {
            None
        };
        if let Some(n_live) = n_live {
            if self.update.is_some() {
                return Err(crate::Error::Llvm(
                    "a GEMM storing C by columns has no update mode".into(),
                ));
            }
            let zero = |em: &Emitter<'c>| -> Result<()> {
                for &acc in &accs {
                    em.b.build_store(acc, self.vt.const_zero()).map_err(llvm)?;
                }
                Ok(())
            };
            x.branch(first, &mut || zero(em), &mut || {
                let t = self.load_planes(c, ldc, n_live, width)?;
                for (i, row) in t.iter().enumerate() {
                    for (v, &r) in row.iter().enumerate() {
                        em.b.build_store(accs[i * nv as usize + v], r)
                            .map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        // The compact tile ([`Blocking::compact`]) loads and stores its rows of C in a loop
        // through a buffer on the stack: a few instructions per call instead of a branch, a
        // masked load and a masked store per row, for a quarter of its compile time.
        let rolled = self.bl.compact && n_live.is_none();
        if rolled {
            self.load_rows(c, ldc, rows, width, first, &accs)?;
        }
        // C is read into the accumulators unless `first`, or in update mode (which folds the
        // product in at the end).
        let fresh = self.starts_from_zero(first)?;
        for i in (0..mr).filter(|_| n_live.is_none() && !rolled) {
            let read = match fresh {
                None => em.ctx.bool_type().const_zero(),
                Some(fresh) => {
                    em.b.build_and(
                        live[i as usize],
                        em.b.build_not(fresh, "nf").map_err(llvm)?,
                        "rd",
                    )
                    .map_err(llvm)?
                }
            };
            let row = c_at(i)?;
            x.branch(
                read,
                &mut || {
                    for v in 0..nv {
                        let c = self.load_cols(c, x.addc(row, v * lanes)?, width - v * lanes)?;
                        em.b.build_store(accs[(i * nv + v) as usize], c)
                            .map_err(llvm)?;
                    }
                    Ok(())
                },
                &mut || {
                    for v in 0..nv {
                        em.b.build_store(accs[(i * nv + v) as usize], self.vt.const_zero())
                            .map_err(llvm)?;
                    }
                    Ok(())
                },
            )?;
        }
        let s_kk = x.slot()?;
        let step = |em: &Emitter<'c>, kk: IntValue<'c>| -> Result<()> {
            let bvs: Vec<BasicValueEnum<'c>> = if self.bl.compact {
                // B's row by a masked load: B is not packed for the compact tile.
                let prow = x.mul(kk, ldb)?;
                (0..nv)
                    .map(|v| self.load_cols(panel, x.addc(prow, v * lanes)?, width - v * lanes))
                    .collect::<Result<_>>()?
            } else {
                // Aligned to the element only: the packed panels are aligned to a vector, but
                // a chain's second product reads its B in place (see `chain_b_in_place`), and
                // x86 loads unaligned vectors at the same speed when they are aligned.
                let prow = x.mulc(kk, self.bl.nr())?;
                (0..nv)
                    .map(|v| {
                        let p = x.at(self.ft, panel, x.addc(prow, v * lanes)?)?;
                        align(
                            em.b.build_load(self.vt, p, "bv").map_err(llvm)?,
                            self.bl.bytes as u32,
                        )
                    })
                    .collect::<Result<_>>()?
            };
            self.prefetch(panel, a, kk)?;
            for i in 0..mr {
                let at = a(i, kk)?;
                let a = em.b.build_load(self.ft, at, "a").map_err(llvm)?;
                let one =
                    em.b.build_insert_element(self.vt.get_undef(), a, x.c(0), "a1")
                        .map_err(llvm)?;
                let splat =
                    em.b.build_shuffle_vector(
                        one,
                        self.vt.get_undef(),
                        em.ctx.i32_type().vec_type(self.bl.lanes).const_zero(),
                        "as",
                    )
                    .map_err(llvm)?;
                for (v, bv) in bvs.iter().enumerate() {
                    let slot = accs[(i * nv) as usize + v];
                    let acc = em.b.build_load(self.vt, slot, "acc").map_err(llvm)?;
                    let fma =
                        em.intrinsic("llvm.fmuladd", self.vt.into(), &[splat.into(), *bv, acc])?;
                    em.b.build_store(slot, fma).map_err(llvm)?;
                }
            }
            Ok(())
        };
        // Full-width tiles take UNROLL contraction steps per loop iteration (fewer loop and
        // pointer instructions between the FMAs); column tails and tail tiles, which run once
        // per row block, keep one, for compile time.
        let unroll = if width == self.bl.nr() && !self.tail {
            UNROLL
        } else {
            1
        };
        let main_end = if unroll > 1 {
            let rem =
                em.b.build_int_signed_rem(kc, x.c(unroll), "kr")
                    .map_err(llvm)?;
            let end = x.sub(kc, rem)?;
            em.range_loop_ptr(s_kk, x.c(0), end, unroll, &mut |em: &Emitter<'c>| {
                let kk = x.get(s_kk)?;
                self.c_ahead(c, ldc, rows, width, (kk, unroll))?;
                for u in 0..unroll {
                    step(em, x.addc(kk, u)?)?;
                }
                Ok(())
            })?;
            end
        } else {
            x.c(0)
        };
        em.range_loop_ptr(s_kk, main_end, kc, 1, &mut |em: &Emitter<'c>| {
            let kk = x.get(s_kk)?;
            step(em, kk)
        })?;
        if let Some(n_live) = n_live {
            let tile: Vec<Vec<VectorValue<'c>>> = (0..mr)
                .map(|i| {
                    (0..nv)
                        .map(|v| {
                            Ok(em
                                .b
                                .build_load(self.vt, accs[(i * nv + v) as usize], "acc")
                                .map_err(llvm)?
                                .into_vector_value())
                        })
                        .collect()
                })
                .collect::<Result<_>>()?;
            return self.store_planes(c, ldc, n_live, width, &tile);
        }
        if rolled {
            return self.by_mode(&|fold| self.store_rows(c, ldc, rows, width, &accs, fold));
        }
        // Row by row, each behind its row's test.
        let unrolled = |fold: bool| -> Result<()> {
            for i in 0..mr {
                let row = c_at(i)?;
                x.branch(
                    live[i as usize],
                    &mut || {
                        let accs: Vec<BasicValueEnum<'c>> = (0..nv)
                            .map(|v| {
                                em.b.build_load(self.vt, accs[(i * nv + v) as usize], "acc")
                                    .map_err(llvm)
                            })
                            .collect::<Result<_>>()?;
                        self.store_row(c, row, width, &accs, fold)
                    },
                    &mut || Ok(()),
                )?;
            }
            Ok(())
        };
        // Both ways unrolled when the mode is decided at run time: the 14 x 2 tile's code
        // generation takes a fifth more than with the plain stores alone (callgrind of `llc`:
        // 107 M instructions past an empty module's, 132 M with both), half what a second
        // routine took; folding the rows in a loop instead (121 M) would cost a weight update
        // a few percent of a 256-step tile's time on every call.
        self.by_mode(&unrolled)
    }

    /// `stores(fold)` as the update mode says: folding into C (`true`) in update mode, storing
    /// (`false`) without; when the mode is decided at run time, both behind its flag.
    fn by_mode(&self, stores: &dyn Fn(bool) -> Result<()>) -> Result<()> {
        match self.update {
            None => stores(false),
            Some(Update { when: None, .. }) => stores(true),
            Some(Update { when: Some(w), .. }) => {
                self.x
                    .branch(w, &mut || stores(true), &mut || stores(false))
            }
        }
    }

    /// When a tile's accumulators start from zero rather than from C: `None` for always (update
    /// mode decided when emitting), else the flag that says so: `first`, or, when the update
    /// mode is decided at run time, `first` or that mode.
    fn starts_from_zero(&self, first: IntValue<'c>) -> Result<Option<IntValue<'c>>> {
        Ok(match self.update {
            None => Some(first),
            Some(Update { when: None, .. }) => None,
            Some(Update { when: Some(w), .. }) => {
                Some(self.x.em.b.build_or(first, w, "z").map_err(llvm)?)
            }
        })
    }

    /// Stores the accumulators `accs` of one row of a tile as the first `width` columns at
    /// `c[at..]`, vector by vector, folded into C with `fold` (see [`Self::store_acc`]).
    fn store_row(
        &self,
        c: PointerValue<'c>,
        at: IntValue<'c>,
        width: i64,
        accs: &[BasicValueEnum<'c>],
        fold: bool,
    ) -> Result<()> {
        let x = &self.x;
        let lanes = self.bl.lanes as i64;
        for (v, &acc) in accs.iter().enumerate() {
            let v = v as i64;
            self.store_acc(c, x.addc(at, v * lanes)?, width - v * lanes, acc, fold)?;
        }
        Ok(())
    }

    /// Stores accumulator `acc` as the first `width` columns at `c[at..]`: with `fold` (in
    /// update mode) folded into C there, `C - s P` (or `C + s P`): the product scaled, then
    /// folded in, as the epilogue computes it.
    pub(super) fn store_acc(
        &self,
        c: PointerValue<'c>,
        at: IntValue<'c>,
        width: i64,
        acc: BasicValueEnum<'c>,
        fold: bool,
    ) -> Result<()> {
        let b = &self.x.em.b;
        let mut acc = acc;
        if let Some(Update {
            scale, subtract, ..
        }) = self.update.filter(|_| fold)
        {
            let old = self.load_cols(c, at, width)?.into_vector_value();
            let sp = b
                .build_float_mul(acc.into_vector_value(), scale.into_vector_value(), "sp")
                .map_err(llvm)?;
            acc = if subtract {
                b.build_float_sub(old, sp, "upd")
            } else {
                b.build_float_add(old, sp, "upd")
            }
            .map_err(llvm)?
            .into();
        }
        self.store_cols(c, at, width, acc)
    }

    /// A buffer on the stack for a tile's accumulators, row by row, and the number of the
    /// tile's rows that are C's (the first `rows`, at most `mr`).
    fn row_buffer(&self, rows: IntValue<'c>) -> Result<(PointerValue<'c>, IntValue<'c>)> {
        let x = &self.x;
        let n = (self.bl.mr * self.bl.nv) as u32;
        let buf = x.em.entry_alloca(self.vt.array_type(n).into())?;
        Ok((buf, x.min(rows, x.c(self.bl.mr))?))
    }

    /// The compact tile's start: every accumulator zero, then, unless `first` (or in update
    /// mode, which folds the product in at the end), C's rows of the tile read into them by a
    /// loop over the rows.
    fn load_rows(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        rows: IntValue<'c>,
        width: i64,
        first: IntValue<'c>,
        accs: &[PointerValue<'c>],
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let (nv, lanes) = (self.bl.nv, self.bl.lanes as i64);
        let (buf, live) = self.row_buffer(rows)?;
        for j in 0..accs.len() {
            let at = x.at(self.vt, buf, x.c(j as i64))?;
            em.b.build_store(at, self.vt.const_zero()).map_err(llvm)?;
        }
        if let Some(fresh) = self.starts_from_zero(first)? {
            let s_i = x.slot()?;
            x.branch(fresh, &mut || Ok(()), &mut || {
                em.range_loop_ptr(s_i, x.c(0), live, 1, &mut |_| {
                    let i = x.get(s_i)?;
                    let row = x.mul(i, ldc)?;
                    for v in 0..nv {
                        let cv = self.load_cols(c, x.addc(row, v * lanes)?, width - v * lanes)?;
                        let at = x.at(self.vt, buf, x.addc(x.mulc(i, nv)?, v)?)?;
                        em.b.build_store(at, cv).map_err(llvm)?;
                    }
                    Ok(())
                })
            })?;
        }
        for (j, &acc) in accs.iter().enumerate() {
            let at = x.at(self.vt, buf, x.c(j as i64))?;
            let v = em.b.build_load(self.vt, at, "c").map_err(llvm)?;
            em.b.build_store(acc, v).map_err(llvm)?;
        }
        Ok(())
    }

    /// The compact tile's end: the accumulators into a buffer, then a loop over the tile's rows
    /// that are C's storing them (folded into C with `fold`).
    fn store_rows(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        rows: IntValue<'c>,
        width: i64,
        accs: &[PointerValue<'c>],
        fold: bool,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let nv = self.bl.nv;
        let (buf, live) = self.row_buffer(rows)?;
        for (j, &acc) in accs.iter().enumerate() {
            let v = em.b.build_load(self.vt, acc, "acc").map_err(llvm)?;
            let at = x.at(self.vt, buf, x.c(j as i64))?;
            em.b.build_store(at, v).map_err(llvm)?;
        }
        let s_i = x.slot()?;
        em.range_loop_ptr(s_i, x.c(0), live, 1, &mut |_| {
            let i = x.get(s_i)?;
            let row = x.mul(i, ldc)?;
            let accs: Vec<BasicValueEnum<'c>> = (0..nv)
                .map(|v| {
                    let at = x.at(self.vt, buf, x.addc(x.mulc(i, nv)?, v)?)?;
                    em.b.build_load(self.vt, at, "acc").map_err(llvm)
                })
                .collect::<Result<_>>()?;
            self.store_row(c, row, width, &accs, fold)
        })
    }
}

/// How many lanes [`Regs::pack_a_grouped`] stores for step `u` of group `g`: the group's rows,
/// or a whole vector where its extra lanes stay inside the block of `lanes` steps, so later
/// steps' stores overwrite them (with 6 rows of 16 lanes they reach over a whole step).
pub(super) fn grouped_store_lanes(mr: i64, lanes: i64, u: i64, g: i64) -> i64 {
    let w = (mr - g * lanes).min(lanes);
    if u * mr + g * lanes + lanes <= lanes * mr {
        lanes
    } else {
        w
    }
}

/// `v` in every lane of a vector of `lanes` `ft`s.
pub(super) fn splat<'c>(
    em: &Emitter<'c>,
    ft: FloatType<'c>,
    lanes: u32,
    v: BasicValueEnum<'c>,
) -> Result<VectorValue<'c>> {
    let vt = ft.vec_type(lanes);
    let one =
        em.b.build_insert_element(vt.get_undef(), v, em.i64c(0), "s1")
            .map_err(llvm)?;
    em.b.build_shuffle_vector(
        one,
        vt.get_undef(),
        em.ctx.i32_type().vec_type(lanes).const_zero(),
        "ss",
    )
    .map_err(llvm)
}

impl<'c> Regs<'_, 'c> {
    /// The tile loop's software prefetches at step `kk` ([`Blocking::prefetch`]): packed B's
    /// row (each of its cache lines) `b_steps` ahead in `panel`, and the element of A's first
    /// row `a_steps` ahead (a packed sliver's column: 14 elements, one line). The addresses
    /// may lie past the panel or the sliver near the end of the loop: a prefetch there reads
    /// nothing and cannot fault, and they are computed without `inbounds`.
    fn prefetch(
        &self,
        panel: PointerValue<'c>,
        a: &dyn Fn(i64, IntValue<'c>) -> Result<PointerValue<'c>>,
        kk: IntValue<'c>,
    ) -> Result<()> {
        let p = self.bl.prefetch;
        if self.bl.compact || p.is_none() {
            return Ok(());
        }
        let x = &self.x;
        let em = x.em;
        let mut at = Vec::new();
        let byte = |base, off| self.byte_address(base, off);
        if p.b_steps > 0 {
            let row = x.mulc(x.addc(kk, p.b_steps)?, self.bl.nr() * self.bl.bytes)?;
            let line = self.bl.line;
            for l in 0..(self.bl.nr() * self.bl.bytes + line - 1) / line {
                at.push(byte(panel, x.addc(row, l * line)?)?);
            }
        }
        if p.a_steps > 0 {
            // A's element `a_steps` ahead: the distance between two steps as the tile reads
            // A (step `kk + 1` is at most one past the end), times `a_steps`.
            let here = a(0, kk)?;
            let next = a(0, x.addc(kk, 1)?)?;
            let int = |q: PointerValue<'c>| em.b.build_ptr_to_int(q, em.ctx.i64_type(), "pi");
            let step =
                em.b.build_int_sub(int(next).map_err(llvm)?, int(here).map_err(llvm)?, "ps")
                    .map_err(llvm)?;
            at.push(byte(here, x.mulc(step, p.a_steps)?)?);
        }
        self.prefetch_lines(&at, false)
    }

    /// The whole tile's request for the next tile's C ([`Blocking::c_ahead`]) in the
    /// iteration of its unrolled loop (`unroll` steps an iteration) that starts at step `kk`,
    /// iteration `it`: line `it` of the `mr` rows after the tile's (each row's
    /// `width` columns as whole lines from its start), the last line again once they are all
    /// asked for, for writing. The next tile of a panel is the next `mr` rows of C, where
    /// the block of `rows` rows from this tile's first has them; the block's last tile asks
    /// for its own lines instead, which it stores at its end: the rows past the block are
    /// another block's, stored much later, or another thread's, which would lose them to
    /// this one's request. The address is computed without `inbounds`.
    fn c_ahead(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        rows: IntValue<'c>,
        width: i64,
        (kk, unroll): (IntValue<'c>, i64),
    ) -> Result<()> {
        if !self.bl.c_ahead || self.bl.compact || self.planes || self.tail {
            return Ok(());
        }
        let x = &self.x;
        let em = x.em;
        let it = x.sdiv(kk, unroll)?;
        let (bytes, mr, line_bytes) = (self.bl.bytes, self.bl.mr, self.bl.line);
        let per_row = (width * bytes + line_bytes - 1) / line_bytes;
        let line = x.min(it, x.c(mr * per_row - 1))?;
        let row = x.sdiv(line, per_row)?;
        let part = x.sub(line, x.mulc(row, per_row)?)?;
        let more = x.cmp(IntPredicate::SGT, rows, x.c(mr))?;
        let next =
            em.b.build_select(more, x.c(mr), x.c(0), "next")
                .map_err(llvm)?
                .into_int_value();
        let at = x.add(
            x.mul(x.add(row, next)?, ldc)?,
            x.mulc(part, line_bytes / bytes)?,
        )?;
        self.prefetch_lines(&[self.byte_address(c, x.mulc(at, bytes)?)?], true)
    }

    /// `base` plus `off` bytes, for a prefetch: computed without `inbounds` (the address may
    /// lie past the object; it is only prefetched, never accessed).
    fn byte_address(&self, base: PointerValue<'c>, off: IntValue<'c>) -> Result<PointerValue<'c>> {
        let em = self.x.em;
        // SAFETY (of the emitted code): the address is only prefetched, never accessed.
        unsafe { em.b.build_gep(em.ctx.i8_type(), base, &[off], "pf") }.map_err(llvm)
    }

    /// Software prefetches of the lines at `addresses` into all cache levels: for reading,
    /// or for writing (`write`: each line is asked for with ownership, so a store to it later
    /// does not wait for it to be read).
    fn prefetch_lines(&self, addresses: &[PointerValue<'c>], write: bool) -> Result<()> {
        let em = self.x.em;
        let ptr = em.ctx.ptr_type(AddressSpace::default());
        let decl = inkwell::intrinsics::Intrinsic::find("llvm.prefetch")
            .and_then(|i| i.get_declaration(em.m, &[ptr.into()]))
            .ok_or_else(|| crate::Error::Llvm("cannot declare llvm.prefetch".into()))?;
        // Read (0) or write (1), keep in all levels (locality 3), data (1).
        let flag = |v: u64| em.ctx.i32_type().const_int(v, false).into();
        for &address in addresses {
            em.b.build_call(
                decl,
                &[address.into(), flag(write as u64), flag(3), flag(1)],
                "",
            )
            .map_err(llvm)?;
        }
        Ok(())
    }
}
