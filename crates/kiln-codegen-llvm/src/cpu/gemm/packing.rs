//! Packing of A and B blocks into scratch memory, and A's addressing (rows, windows of a
//! convolution's input).

use super::*;

/// Contraction steps per block when A stored transposed is packed (see
/// [`Regs::pack_a_by_steps`]).
const PACK_STEPS: i64 = 16;

impl<'c> Regs<'_, 'c> {
    /// Packs `span` contraction steps of a panel of B into `panel` (`span` rows of
    /// `nr = lanes * nv` elements): column `t` at step `s` is `src[t * ld + s]` when B is stored
    /// transposed (`[n, k]`: `trans`), else `src[s * ld + t]`; columns from `width` on are
    /// zeros.
    pub(super) fn pack_b(
        &self,
        src: PointerValue<'c>,
        ld: IntValue<'c>,
        span: IntValue<'c>,
        width: i64,
        trans: bool,
        panel: PointerValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let (lanes, nr) = (self.bl.lanes as i64, self.bl.nr());
        let dst = |s: IntValue<'c>, col: IntValue<'c>| -> Result<PointerValue<'c>> {
            x.at(self.ft, panel, x.add(x.mulc(s, nr)?, col)?)
        };
        if trans {
            // Whole panels: blocks of `lanes` columns by `lanes` contraction steps are loaded
            // as one vector per column, transposed in registers and stored as one vector per
            // step; the steps past the last whole block, and a tail panel, column by column.
            let from = if width == nr {
                let rem =
                    x.em.b
                        .build_int_signed_rem(span, x.c(lanes), "r")
                        .map_err(llvm)?;
                let whole = x.sub(span, rem)?;
                let (s_k, s_c) = (x.slot()?, x.slot()?);
                x.em.range_loop_ptr(s_k, x.c(0), whole, lanes, &mut |_| {
                    let k0 = x.get(s_k)?;
                    // The panel's vectors of columns in a loop, not unrolled: each is `lanes`
                    // loads, `lanes * log2(lanes)` shuffles and `lanes` stores, and unrolled
                    // `nv` times their code generation took 50-80 ms of the routine's compile.
                    x.em.range_loop_ptr(s_c, x.c(0), x.c(nr), lanes, &mut |_| {
                        let c0 = x.get(s_c)?;
                        let rows: Vec<VectorValue<'c>> = (0..lanes)
                            .map(|t| {
                                let at = x.add(x.mul(ld, x.addc(c0, t)?)?, k0)?;
                                let l =
                                    x.em.b
                                        .build_load(self.vt, x.at(self.ft, src, at)?, "bt")
                                        .map_err(llvm)?;
                                Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                            })
                            .collect::<Result<_>>()?;
                        for (u, c) in self.transpose(rows)?.into_iter().enumerate() {
                            let at = dst(x.addc(k0, u as i64)?, c0)?;
                            let st = x.em.b.build_store(at, c).map_err(llvm)?;
                            st.set_alignment(self.vbytes()).map_err(llvm)?;
                        }
                        Ok(())
                    })
                })?;
                whole
            } else {
                x.c(0)
            };
            let s_jj = x.slot()?;
            return x.em.range_loop_ptr(s_jj, x.c(0), x.c(nr), 1, &mut |_| {
                let jj = x.get(s_jj)?;
                let row = x.mul(jj, ld)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, jj, x.c(width))?,
                    (from, span),
                    &|kk| x.at(self.ft, src, x.add(row, kk)?),
                    &|kk| dst(kk, jj),
                )
            });
        }
        let s_kk = x.slot()?;
        x.em.range_loop_ptr(s_kk, x.c(0), span, 1, &mut |em: &Emitter<'c>| {
            let kk = x.get(s_kk)?;
            let row = x.mul(kk, ld)?;
            for v in 0..self.bl.nv {
                let val = self.load_cols(src, x.addc(row, v * lanes)?, width - v * lanes)?;
                let s =
                    em.b.build_store(dst(kk, x.c(v * lanes))?, val)
                        .map_err(llvm)?;
                s.set_alignment(self.vbytes()).map_err(llvm)?;
            }
            Ok(())
        })
    }

    /// Packs the first `rows` rows of A by `span` contraction steps into slivers of `mr` rows
    /// at `dst`, `stride` elements apart (step `s` of a sliver's row `i` at `s * mr + i`; rows
    /// past `rows` are zeros). Row `i` at step `s` is `src[i + s * ld]` when A is stored
    /// transposed (`[k, m]`: `trans`, see [`Self::pack_a_by_steps`]), else `src[i * ld + s]`.
    /// Stored by rows, whole slivers go by vectors: blocks of `mr` rows by `mr` steps are
    /// transposed in registers, or, when `mr` is not a power of two, blocks of `lanes` steps
    /// (see [`Self::pack_a_grouped`]). The rest goes element by element: a contiguous read and
    /// a store every `mr` elements.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack_a(
        &self,
        src: PointerValue<'c>,
        ld: IntValue<'c>,
        rows: IntValue<'c>,
        span: IntValue<'c>,
        dst: PointerValue<'c>,
        stride: IntValue<'c>,
        trans: bool,
    ) -> Result<()> {
        if trans {
            return self.pack_a_by_steps(src, ld, rows, span, dst, stride);
        }
        let x = &self.x;
        let mr = self.bl.mr;
        let (s_r, s_i) = (x.slot()?, x.slot()?);
        let lanes = self.bl.lanes as i64;
        // With `mr` not a power of two (tiles of 6 and 12 rows): blocks of `lanes` steps,
        // transposed `lanes` rows at a time.
        let grouped = !(mr as u64).is_power_of_two();
        let mt = self.ft.vec_type(mr as u32);
        let at = |row: IntValue<'c>, kk: IntValue<'c>| -> Result<PointerValue<'c>> {
            x.at(self.ft, src, x.add(x.mul(row, ld)?, kk)?)
        };
        x.em.range_loop_ptr(s_r, x.c(0), rows, mr, &mut |_| {
            let r = x.get(s_r)?;
            let sliver = x.mul(r, stride)?;
            let whole = x.cmp(IntPredicate::SLE, x.addc(r, mr)?, rows)?;
            let step = if grouped { lanes } else { mr };
            let rem =
                x.em.b
                    .build_int_signed_rem(span, x.c(step), "r")
                    .map_err(llvm)?;
            // Whole slivers: vectors up to the last whole block, the rest as below.
            let kfull =
                x.em.b
                    .build_select(whole, x.sub(span, rem)?, x.c(0), "kf")
                    .map_err(llvm)?
                    .into_int_value();
            let s_k = x.slot()?;
            x.em.range_loop_ptr(s_k, x.c(0), kfull, step, &mut |em| {
                let k0 = x.get(s_k)?;
                let store = |u: i64, v: VectorValue<'c>| -> Result<()> {
                    let idx = x.add(sliver, x.mulc(x.addc(k0, u)?, mr)?)?;
                    em.b.build_store(x.at(self.ft, dst, idx)?, v)
                        .map_err(llvm)?
                        .set_alignment(self.bl.bytes as u32)
                        .map_err(llvm)
                };
                let load = |p: PointerValue<'c>| -> Result<VectorValue<'c>> {
                    let l = em.b.build_load(mt, p, "av").map_err(llvm)?;
                    Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                };
                if grouped {
                    return self.pack_a_grouped(r, k0, sliver, &at, dst);
                }
                let block: Vec<VectorValue<'c>> = (0..mr)
                    .map(|i| load(at(x.addc(r, i)?, k0)?))
                    .collect::<Result<_>>()?;
                for (u, v) in self.transpose(block)?.into_iter().enumerate() {
                    store(u as i64, v)?;
                }
                Ok(())
            })?;
            x.em.range_loop_ptr(s_i, x.c(0), x.c(mr), 1, &mut |_| {
                let i = x.get(s_i)?;
                let row = x.add(r, i)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, row, rows)?,
                    (kfull, span),
                    &|kk| at(row, kk),
                    &|kk| x.at(self.ft, dst, x.add(x.add(sliver, x.mulc(kk, mr)?)?, i)?),
                )
            })
        })
    }

    /// [`Self::pack_a`] for A stored transposed (`[k, m]`), where each step of a sliver is
    /// `mr` consecutive elements of a stored row of A: in blocks of [`PACK_STEPS`] steps, and
    /// within a block sliver by sliver, each sliver's steps of the block (`mr` elements each,
    /// one vector load and store); the steps past the last whole block the same, one at a
    /// time; then the last sliver, if not whole, element by element (its other rows zeros).
    ///
    /// Sliver by sliver over the whole contraction block (512 steps), each sliver read one
    /// cache line from each of 512 stored rows and the next sliver the same lines again,
    /// long evicted where the rows are 1-4 KiB apart (a weight gradient's `[2048, m]`
    /// operand: every such line falls in one of a few sets of the level 1 cache). A block of
    /// steps keeps its few lines of each row in the level 1 cache while every sliver takes its
    /// part. Measured on the 2-core Xeon (on-CPU time of the routine per call in `perf
    /// record`, both threads, `kiln bench` of the transformer step's weight gradients alone):
    /// `[1024,2048] x [2048,256]` 2.26 -> 1.37 ms, `[256,2048] x [2048,768]` 0.61 -> 0.36 ms,
    /// `[256,2048] x [2048,256]` 0.38 -> 0.28 ms; step by step across all slivers (each step's
    /// stores `mr * kc` elements apart, in one set) was slower than sliver by sliver (2.61,
    /// 0.55 ms), blocks of 4 steps in between (1.60, 0.36 ms).
    fn pack_a_by_steps(
        &self,
        src: PointerValue<'c>,
        ld: IntValue<'c>,
        rows: IntValue<'c>,
        span: IntValue<'c>,
        dst: PointerValue<'c>,
        stride: IntValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let b = &x.em.b;
        let mr = self.bl.mr;
        let lanes = self.bl.lanes as i64;
        let rem = b.build_int_signed_rem(rows, x.c(mr), "r").map_err(llvm)?;
        let whole = x.sub(rows, rem)?;
        let krem = b
            .build_int_signed_rem(span, x.c(PACK_STEPS), "kr")
            .map_err(llvm)?;
        let kwhole = x.sub(span, krem)?;
        let (s_k, s_r, s_i) = (x.slot()?, x.slot()?, x.slot()?);
        // Step `kk` of the whole sliver of rows `r..r + mr`: vectors of the GEMM's width, the
        // last masked (14 of 16 lanes for the 14 x 2 tile). One load and store of `mr` lanes
        // (`<14 x float>`) was split by instruction selection into pieces: the routine's code
        // generation took about a quarter more (callgrind of `llc`).
        let copy = |kk: IntValue<'c>, r: IntValue<'c>| -> Result<()> {
            let from = x.add(x.mul(kk, ld)?, r)?;
            let to = x.add(x.mul(r, stride)?, x.mulc(kk, mr)?)?;
            for c0 in (0..mr).step_by(lanes as usize) {
                let w = (mr - c0).min(lanes);
                let v = self.load_cols(src, x.addc(from, c0)?, w)?;
                self.store_cols(dst, x.addc(to, c0)?, w, v)?;
            }
            Ok(())
        };
        x.em.range_loop_ptr(s_k, x.c(0), kwhole, PACK_STEPS, &mut |em| {
            let k0 = x.get(s_k)?;
            em.range_loop_ptr(s_r, x.c(0), whole, mr, &mut |_| {
                let r = x.get(s_r)?;
                (0..PACK_STEPS).try_for_each(|u| copy(x.addc(k0, u)?, r))
            })
        })?;
        x.em.range_loop_ptr(s_k, kwhole, span, 1, &mut |em| {
            let kk = x.get(s_k)?;
            em.range_loop_ptr(s_r, x.c(0), whole, mr, &mut |_| copy(kk, x.get(s_r)?))
        })?;
        x.branch(
            x.cmp(IntPredicate::SGT, rem, x.c(0))?,
            &mut || {
                let sliver = x.mul(whole, stride)?;
                x.em.range_loop_ptr(s_i, x.c(0), x.c(mr), 1, &mut |_| {
                    let i = x.get(s_i)?;
                    let row = x.add(whole, i)?;
                    self.strided_run(
                        x.cmp(IntPredicate::SLT, row, rows)?,
                        (x.c(0), span),
                        &|kk| x.at(self.ft, src, x.add(row, x.mul(kk, ld)?)?),
                        &|kk| x.at(self.ft, dst, x.add(x.add(sliver, x.mulc(kk, mr)?)?, i)?),
                    )
                })
            },
            &mut || Ok(()),
        )
    }

    /// One block of `lanes` steps (from `k0`) of the whole sliver of rows `r..r + mr` at
    /// `sliver` in `dst`, when `mr` is not a power of two: each group of `lanes` rows (the last
    /// padded) is loaded by rows and transposed in registers, then step `u` of group `g` is
    /// stored at `(k0 + u) * mr + g * lanes`. A short last group is still stored a whole vector
    /// wide where that stays inside the block (all steps but the last one or two): its extra
    /// lanes land on the next steps' elements, which are stored after it.
    pub(super) fn pack_a_grouped(
        &self,
        r: IntValue<'c>,
        k0: IntValue<'c>,
        sliver: IntValue<'c>,
        at: &dyn Fn(IntValue<'c>, IntValue<'c>) -> Result<PointerValue<'c>>,
        dst: PointerValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let b = &x.em.b;
        let (mr, lanes) = (self.bl.mr, self.bl.lanes as i64);
        let groups = (mr + lanes - 1) / lanes;
        let mut cols = Vec::new();
        for g in 0..groups {
            let rows: Vec<VectorValue<'c>> = (0..lanes)
                .map(|j| {
                    let i = g * lanes + j;
                    if i >= mr {
                        return Ok(self.vt.get_poison());
                    }
                    let l = b
                        .build_load(self.vt, at(x.addc(r, i)?, k0)?, "ar")
                        .map_err(llvm)?;
                    Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                })
                .collect::<Result<_>>()?;
            cols.push(self.transpose(rows)?);
        }
        let i32t = x.em.ctx.i32_type();
        for u in 0..lanes {
            for (g, col) in cols.iter().enumerate() {
                let g = g as i64;
                let n = grouped_store_lanes(mr, lanes, u, g);
                let v = if n == lanes {
                    col[u as usize]
                } else {
                    let first = VectorType::const_vector(
                        &(0..n)
                            .map(|k| i32t.const_int(k as u64, false))
                            .collect::<Vec<_>>(),
                    );
                    b.build_shuffle_vector(col[u as usize], self.vt.get_poison(), first, "aw")
                        .map_err(llvm)?
                };
                let idx = x.add(sliver, x.addc(x.mulc(x.addc(k0, u)?, mr)?, g * lanes)?)?;
                b.build_store(x.at(self.ft, dst, idx)?, v)
                    .map_err(llvm)?
                    .set_alignment(self.bl.bytes as u32)
                    .map_err(llvm)?;
            }
        }
        Ok(())
    }

    /// For kk in `kb..kend`: `*dst(kk) = *src(kk)` where `live`, else zeros. The stores are
    /// volatile: they land `mr` or `nr` elements apart, which the loop vectorizer would
    /// otherwise turn into (slow) scatters.
    pub(super) fn strided_run(
        &self,
        live: IntValue<'c>,
        (kb, kend): (IntValue<'c>, IntValue<'c>),
        src: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
        dst: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
    ) -> Result<()> {
        let x = &self.x;
        let s_kk = x.slot()?;
        let store = |em: &Emitter<'c>, kk: IntValue<'c>, v: BasicValueEnum<'c>| -> Result<()> {
            em.b.build_store(dst(kk)?, v)
                .map_err(llvm)?
                .set_volatile(true)
                .map_err(llvm)
        };
        x.branch(
            live,
            &mut || {
                x.em.range_loop_ptr(s_kk, kb, kend, 1, &mut |em| {
                    let kk = x.get(s_kk)?;
                    let v = em.b.build_load(self.ft, src(kk)?, "v").map_err(llvm)?;
                    store(em, kk, v)
                })
            },
            &mut || {
                x.em.range_loop_ptr(s_kk, kb, kend, 1, &mut |em| {
                    store(em, x.get(s_kk)?, self.ft.const_zero().into())
                })
            },
        )
    }
}

impl<'c> Gemm<'_, 'c> {
    /// Where row `row` of A starts: `row * k` in a matrix, its window corner in a
    /// convolution's input.
    pub(super) fn a_row(&self, row: IntValue<'c>) -> Result<IntValue<'c>> {
        let x = &self.x;
        let Some((p, _)) = self.conv else {
            if let Some(s) = self.a_strides {
                // Row i of batch bt: the batch's first row, then i rows (i elements when A
                // is stored transposed) on.
                let bt = x.sdiv(row, self.m)?;
                let i = x.sub(row, x.mulc(bt, self.m)?)?;
                let start = batch_start(x, s, bt)?;
                let i = if self.a_trans { i } else { x.mul(i, self.lda)? };
                return x.add(start, i);
            }
            if self.a_trans {
                // [batch, k, m]: row i of batch bt starts at bt * k * m + i.
                let bt = x.sdiv(row, self.m)?;
                let i = x.sub(row, x.mulc(bt, self.m)?)?;
                return x.add(x.mul(bt, x.mul(self.k, x.c(self.m))?)?, i);
            }
            return x.mul(row, self.k);
        };
        let (oh, ow) = (p.oh as i64, p.ow as i64);
        let n = x.sdiv(row, oh * ow)?;
        let rest = x.sub(row, x.mulc(n, oh * ow)?)?;
        let y = x.sdiv(rest, ow)?;
        let xx = x.sub(rest, x.mulc(y, ow)?)?;
        let (h, w, c) = (p.h as i64, p.w as i64, p.c as i64);
        let top = x.add(x.mulc(n, h)?, x.mulc(y, p.stride[0] as i64)?)?;
        let corner = x.add(x.mulc(top, w)?, x.mulc(xx, p.stride[1] as i64)?)?;
        x.mulc(corner, c)
    }

    /// The element of A at column `kk` of the row starting at `row_start` (from `a_row`).
    pub(super) fn a_at(&self, row_start: IntValue<'c>, kk: IntValue<'c>) -> Result<IntValue<'c>> {
        let x = &self.x;
        match self.conv {
            None if self.a_trans => x.add(row_start, x.mul(kk, self.lda)?),
            None => x.add(row_start, kk),
            Some((_, table)) => {
                let i64t = x.em.ctx.i64_type();
                let off =
                    x.em.b
                        .build_load(i64t, x.at(i64t, table, kk)?, "off")
                        .map_err(llvm)?
                        .into_int_value();
                x.add(row_start, off)
            }
        }
    }

    /// Packs rows `ic..ic_end` (columns `kb..kend`) of A into slivers of `mr` rows (see
    /// [`Regs::pack_a`]): a matrix through its shared routine; a convolution's patches, read
    /// through the column offset table, here, row by row (a contiguous read and a store every
    /// `mr` elements; rows past the block are zeros).
    pub(super) fn pack_a(
        &self,
        ic: IntValue<'c>,
        ic_end: IntValue<'c>,
        kb: IntValue<'c>,
        kend: IntValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let (mr, kc) = (self.bl.mr, self.bl.kc);
        if self.conv.is_none() {
            let f = Routine::pack_a(self.bl, self.a_trans).function(
                em.ctx,
                em.m,
                em.routines,
                em.target,
            )?;
            let at = if self.a_trans {
                x.add(self.a_row(ic)?, x.mul(kb, self.lda)?)?
            } else {
                x.add(self.a_row(ic)?, kb)?
            };
            let ld = self.lda;
            let args = [
                x.at(self.ft, self.a, at)?.into(),
                ld.into(),
                x.sub(ic_end, ic)?.into(),
                x.sub(kend, kb)?.into(),
                self.packed_a.into(),
                x.c(kc).into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            return Ok(());
        }
        let (s_r, s_i) = (x.slot()?, x.slot()?);
        x.em.range_loop_ptr(s_r, ic, ic_end, mr, &mut |_| {
            let r = x.get(s_r)?;
            let sliver = x.mulc(x.sub(r, ic)?, kc)?;
            x.em.range_loop_ptr(s_i, x.c(0), x.c(mr), 1, &mut |_| {
                let i = x.get(s_i)?;
                let row = x.add(r, i)?;
                let dst = |kk: IntValue<'c>| -> Result<PointerValue<'c>> {
                    let at = x.add(x.add(sliver, x.mulc(x.sub(kk, kb)?, mr)?)?, i)?;
                    x.at(self.ft, self.packed_a, at)
                };
                let src = self.a_row(row)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, row, ic_end)?,
                    (kb, kend),
                    &|kk| x.at(self.ft, self.a, self.a_at(src, kk)?),
                    &dst,
                )
            })
        })
    }
}

/// Where batch `bt` of an operand read through strides `s` starts: its offset, plus each
/// batch dimension's index (`bt` split over the extents, row-major) times its stride.
pub(super) fn batch_start<'c>(
    x: &Arith<'_, 'c>,
    s: &Strides,
    bt: IntValue<'c>,
) -> Result<IntValue<'c>> {
    let mut at = x.c(s.offset as i64);
    let mut rest = bt;
    for (d, &(extent, stride)) in s.batch.iter().enumerate().rev() {
        let index = if d == 0 {
            rest
        } else {
            let q = x.sdiv(rest, extent as i64)?;
            let index = x.sub(rest, x.mulc(q, extent as i64)?)?;
            rest = q;
            index
        };
        at = x.add(at, x.mulc(index, stride as i64)?)?;
    }
    Ok(at)
}
