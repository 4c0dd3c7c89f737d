//! Chained products: each block of rows of one product's epilogue multiplied by the next
//! product's B as soon as it is done (and the online softmax between them).

use super::*;

/// A chained product (see [`Chain`]) as [`emit`] runs it, with its buffers: the block of the
/// first product's epilogue result at `p` (`k` columns), its B packed at `b2` and its block of
/// A packed at `a2` (see [`kiln_kernel::gemm_schedule::ChainScratch`]), and its B's kernel input at `b`.
pub(super) struct Chained<'a, 'c> {
    pub(super) ch: &'a Chain<'a, 'c>,
    pub(super) ft: FloatType<'c>,
    /// The contraction length: the first product's columns.
    pub(super) k: i64,
    /// Columns of each packed contraction block of B2.
    pub(super) cols2: i64,
    pub(super) p: PointerValue<'c>,
    pub(super) b2: PointerValue<'c>,
    pub(super) a2: PointerValue<'c>,
    /// An online softmax's running maximum and sum per row of a batch.
    pub(super) max: PointerValue<'c>,
    pub(super) sum: PointerValue<'c>,
    /// Columns per row of an online softmax's block buffer.
    pub(super) online_ld: i64,
    pub(super) b: PointerValue<'c>,
}

impl<'c> Chained<'_, 'c> {
    /// Whether the tiles read the chained product's B where it is (see [`chain_b_in_place`]):
    /// then nothing is packed. A B read through strides is packed (the tiles read packed
    /// panels `nr` apart).
    fn b_in_place(&self) -> bool {
        self.ch.b_strides.is_none() && chain_b_in_place(&self.ch.bl, self.ch.n, self.ch.b_trans)
    }

    /// Where batch `bt` of the chained product's B starts, and the elements between its
    /// stored rows: `[k, n]` matrices one after another, or where its strides say.
    fn b_batch(&self, x: &Arith<'_, 'c>, bt: IntValue<'c>) -> Result<(IntValue<'c>, i64)> {
        let (k, n) = (self.k, self.ch.n);
        match self.ch.b_strides {
            Some(s) => Ok((batch_start(x, s, bt)?, s.ld as i64)),
            None => Ok((x.mulc(bt, k * n)?, if self.ch.b_trans { k } else { n })),
        }
    }

    /// Where the tiles find contraction steps `kb..` of batch `bt` of the chained product's B
    /// read in place, and the elements between its rows: its rows from `kb` on, `n` (the
    /// tile's width) apart, or as its strides say.
    fn b_rows(
        &self,
        x: &Arith<'_, 'c>,
        bt: IntValue<'c>,
        kb: IntValue<'c>,
    ) -> Result<(PointerValue<'c>, i64)> {
        let (start, ld) = self.b_batch(x, bt)?;
        Ok((x.at(self.ft, self.b, x.add(start, x.mulc(kb, ld)?)?)?, ld))
    }

    /// Packs batch `bt` of the chained product's B (`[batch, k, n]`, `[batch, n, k]`
    /// transposed) whole at `b2`: contraction block `kb` (of the chain's `kc` steps) at
    /// `kb * cols2`, each as [`Self::pack_b_rows`] packs it (nothing where the tiles read B in
    /// place).
    pub(super) fn pack_b(&self, em: &Emitter<'c>, bt: IntValue<'c>) -> Result<()> {
        if self.b_in_place() {
            return Ok(());
        }
        let (bl, k) = (self.ch.bl, self.k);
        let x = Arith { em };
        let s_kb = x.slot()?;
        em.range_loop_ptr(s_kb, x.c(0), x.c(k), bl.kc, &mut |_| {
            let kb = x.get(s_kb)?;
            let span = x.sub(x.min(x.addc(kb, bl.kc)?, x.c(k))?, kb)?;
            self.pack_b_rows(
                em,
                bt,
                (kb, span),
                x.at(self.ft, self.b2, x.mulc(kb, self.cols2)?)?,
            )
        })
    }

    /// Packs contraction steps `kb..kb + span` (at most the chain's `kc`) of batch `bt` of the
    /// chained product's B at `to`, as [`emit`] packs B's panels: panel `j` (a column index)
    /// at `j * kc` (nothing where the tiles read B in place).
    pub(super) fn pack_b_rows(
        &self,
        em: &Emitter<'c>,
        bt: IntValue<'c>,
        (kb, span): (IntValue<'c>, IntValue<'c>),
        to: PointerValue<'c>,
    ) -> Result<()> {
        if self.b_in_place() {
            return Ok(());
        }
        let (ch, ft) = (self.ch, self.ft);
        let x = Arith { em };
        let bl = ch.bl;
        let (base, ld) = self.b_batch(&x, bt)?;
        let source = BSource {
            b: self.b,
            base,
            ld: x.c(ld),
            trans: ch.b_trans,
        };
        self.panels(em, &|j, width| {
            let at = x.at(ft, to, x.mulc(j, bl.kc)?)?;
            pack_b_panel(&x, ft, bl, &source, (j, width), (kb, span), at)
        })
    }

    /// Runs `f` on each panel of the chained product's columns: its first column and its width
    /// (whole panels in a loop, then the tail panel's).
    pub(super) fn panels(
        &self,
        em: &Emitter<'c>,
        f: &dyn Fn(IntValue<'c>, i64) -> Result<()>,
    ) -> Result<()> {
        let x = Arith { em };
        let (nr, n) = (self.ch.bl.nr(), self.ch.n);
        let n_full = n - n % nr;
        let s_j = x.slot()?;
        if n_full > 0 {
            em.range_loop_ptr(s_j, x.c(0), x.c(n_full), nr, &mut |_| f(x.get(s_j)?, nr))?;
        }
        if n_full < n {
            f(x.c(n_full), n - n_full)?;
        }
        Ok(())
    }

    /// The chained product of rows `ic..ic_end` (of batch `bt`): their block of the first
    /// product's epilogue result (at `p` from row `ic` on) times its B packed at `b2` (see
    /// [`Self::pack_b`]) or read in place, into rows `ic..ic_end` of the chain's `out`, by
    /// contraction blocks (see [`Self::step`]).
    pub(super) fn product(
        &self,
        em: &Emitter<'c>,
        bt: IntValue<'c>,
        (ic, ic_end): (IntValue<'c>, IntValue<'c>),
    ) -> Result<()> {
        let (ft, k, bl) = (self.ft, self.k, self.ch.bl);
        let x = Arith { em };
        let s_kb = x.slot()?;
        em.range_loop_ptr(s_kb, x.c(0), x.c(k), bl.kc, &mut |_| {
            let kb = x.get(s_kb)?;
            let kc = x.sub(x.min(x.addc(kb, bl.kc)?, x.c(k))?, kb)?;
            let first = x.cmp(IntPredicate::EQ, kb, x.c(0))?;
            let panels = if self.b_in_place() {
                self.b_rows(&x, bt, kb)?
            } else {
                (x.at(ft, self.b2, x.mulc(kb, self.cols2)?)?, bl.nr())
            };
            self.step(
                em,
                (ic, ic_end),
                (x.at(ft, self.p, kb)?, k),
                (kc, panels),
                first,
            )
        })
    }

    /// The chained product of rows `rows` (of batch `bt`) for one block of an online softmax,
    /// its columns from `jc` on: the block's `kc` columns of exponentials (at `p`, `nc` to a
    /// row) times its rows of B (packed at `b2` by [`Self::pack_b_rows`], or read in place),
    /// added into the rows of the chain's `out` (rescaled by the epilogue), or stored there for
    /// the rows' `first` block.
    pub(super) fn product_block(
        &self,
        em: &Emitter<'c>,
        (bt, rows): (IntValue<'c>, (IntValue<'c>, IntValue<'c>)),
        (jc, kc): (IntValue<'c>, IntValue<'c>),
        first: IntValue<'c>,
    ) -> Result<()> {
        let panels = if self.b_in_place() {
            self.b_rows(&Arith { em }, bt, jc)?
        } else {
            (self.b2, self.ch.bl.nr())
        };
        self.step(em, rows, (self.p, self.online_ld), (kc, panels), first)
    }

    /// One contraction block of `kc` steps of the chained product of rows `ic..ic_end`: A at
    /// `a` (rows `lda` apart), B's panels packed at `panels`, into rows `ic..ic_end` of the
    /// chain's `out` (added to them unless `first`), through the shared routines: A packed at
    /// `a2` (or read in place when there is one panel of columns), then the tiles down each
    /// panel.
    pub(super) fn step(
        &self,
        em: &Emitter<'c>,
        (ic, ic_end): (IntValue<'c>, IntValue<'c>),
        (a_in, lda_in): (PointerValue<'c>, i64),
        (kc, (panels, ldb)): (IntValue<'c>, (PointerValue<'c>, i64)),
        first: IntValue<'c>,
    ) -> Result<()> {
        let (ch, ft, a2) = (self.ch, self.ft, self.a2);
        let x = Arith { em };
        let (bl, n) = (ch.bl, ch.n);
        let rows = x.sub(ic_end, ic)?;
        let direct = n <= bl.nr();
        let (a, lda, read) = if direct {
            // As `Routine::of_gemm` plans it: a compact tile reads A through its strides.
            let read = ARead::of(bl.compact, true, false, false).unwrap_or(ARead::Rows);
            (a_in, x.c(lda_in), read)
        } else {
            let f = Routine::pack_a(bl, false).function(em.ctx, em.m, em.routines, em.target)?;
            let args = [
                a_in.into(),
                x.c(lda_in).into(),
                rows.into(),
                kc.into(),
                a2.into(),
                x.c(bl.kc).into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            (a2, x.c(bl.kc), ARead::Packed)
        };
        let tiles = |j: IntValue<'c>, width: i64| -> Result<()> {
            let f = Routine::tile(bl, width, read, false).function(
                em.ctx,
                em.m,
                em.routines,
                em.target,
            )?;
            let args = [
                x.at(ft, ch.out, x.add(x.mulc(ic, n)?, j)?)?.into(),
                x.c(n).into(),
                rows.into(),
                a.into(),
                lda.into(),
                x.c(1).into(),
                x.at(ft, panels, x.mulc(j, bl.kc)?)?.into(),
                x.c(ldb).into(),
                kc.into(),
                first.into(),
                ft.const_zero().into(),
                em.ctx.bool_type().const_zero().into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            Ok(())
        };
        self.panels(em, &tiles)
    }

    /// Starts rows `ic..ic_end` of an online softmax (the batch's first row `base`) as its
    /// first block would, for a first block that is skipped: a running maximum of -inf, a sum
    /// of 0 and rows of zeros in the chain's `out`.
    pub(super) fn clear_rows(
        &self,
        em: &Emitter<'c>,
        (ic, ic_end): (IntValue<'c>, IntValue<'c>),
        base: IntValue<'c>,
    ) -> Result<()> {
        let ft = self.ft;
        let x = Arith { em };
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, ic, ic_end, 1, &mut |em| {
            let r = x.get(s_r)?;
            let rl = x.sub(r, base)?;
            let ninf = ft.const_float(f64::NEG_INFINITY);
            em.b.build_store(x.at(ft, self.max, rl)?, ninf)
                .map_err(llvm)?;
            em.b.build_store(x.at(ft, self.sum, rl)?, ft.const_zero())
                .map_err(llvm)?;
            map_row(em, ft, (self.ch.out, self.ch.n), r, &|_, _| {
                Ok(ft.const_zero())
            })
        })
    }

    /// Divides rows `r_lo..r_hi` of the chain's `out` (an online softmax's, the batch's first
    /// row `base`) by their sums.
    pub(super) fn normalize(
        &self,
        em: &Emitter<'c>,
        (r_lo, r_hi): (IntValue<'c>, IntValue<'c>),
        base: IntValue<'c>,
    ) -> Result<()> {
        let ft = self.ft;
        let x = Arith { em };
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, r_lo, r_hi, 1, &mut |em| {
            let r = x.get(s_r)?;
            let sum =
                em.b.build_load(ft, x.at(ft, self.sum, x.sub(r, base)?)?, "s")
                    .map_err(llvm)?
                    .into_float_value();
            map_row(em, ft, (self.ch.out, self.ch.n), r, &|em, v| {
                em.b.build_float_div(v, sum, "on").map_err(llvm)
            })
        })
    }
}

/// Replaces each element `v` of row `r` of the `n`-column matrix at `out` by `f(v)`.
pub(crate) fn map_row<'c>(
    em: &Emitter<'c>,
    ft: FloatType<'c>,
    (out, n): (PointerValue<'c>, i64),
    r: IntValue<'c>,
    f: &dyn Fn(&Emitter<'c>, FloatValue<'c>) -> Result<FloatValue<'c>>,
) -> Result<()> {
    let x = Arith { em };
    let row = x.mulc(r, n)?;
    let s_c = x.slot()?;
    em.range_loop_ptr(s_c, x.c(0), x.c(n), 1, &mut |em| {
        let p = x.at(ft, out, x.add(row, x.get(s_c)?)?)?;
        let v =
            em.b.build_load(ft, p, "o")
                .map_err(llvm)?
                .into_float_value();
        let y = f(em, v)?;
        em.b.build_store(p, y).map_err(llvm)?;
        Ok(())
    })
}

/// Transposes `n` vectors of `n` elements (row `t` in, column `t` out; `n` a power of two): at
/// each level, rows `i` and `i + b` (bit `b` of `i` clear) swap their off-diagonal blocks of
/// `b` elements, for `b` = n/2 down to 1; two two-source shuffles per pair and level.
pub(crate) fn transpose_vectors<'c>(
    em: &Emitter<'c>,
    mut r: Vec<VectorValue<'c>>,
) -> Result<Vec<VectorValue<'c>>> {
    let n = r.len();
    let i32t = em.ctx.i32_type();
    let mask = |f: &dyn Fn(usize) -> usize| {
        VectorType::const_vector(
            &(0..n)
                .map(|k| i32t.const_int(f(k) as u64, false))
                .collect::<Vec<_>>(),
        )
    };
    let permute = permutes(em, r.first().map(|v| v.get_type()))?;
    let mut b = n / 2;
    while b >= 1 {
        let lo = mask(&|k| if k & b == 0 { k } else { n + k - b });
        let hi = mask(&|k| if k & b == 0 { k + b } else { n + k });
        let (lo_at, hi_at) = match permute {
            Some((_, it)) => (opaque(em, it, lo)?, opaque(em, it, hi)?),
            None => (lo, hi),
        };
        for i in (0..n).filter(|i| i & b == 0) {
            let (a, c) = (r[i], r[i + b]);
            (r[i], r[i + b]) = match permute {
                Some((f, _)) => (permute2(em, f, a, lo_at, c)?, permute2(em, f, a, hi_at, c)?),
                None => (
                    em.b.build_shuffle_vector(a, c, lo, "tl").map_err(llvm)?,
                    em.b.build_shuffle_vector(a, c, hi, "th").map_err(llvm)?,
                ),
            };
        }
        b /= 2;
    }
    Ok(r)
}

/// With 512-bit vectors (AVX-512), the two-source permute for vectors of type `vt`
/// (`vpermt2ps`/`vpermt2pd`) and its index vector type, which [`transpose_vectors`] takes
/// instead of shuffles; `None` elsewhere. Its indices pass through an empty `asm` (see
/// [`opaque`]), so instruction selection takes each permute as one instruction: as shuffles
/// with constant masks, the 64 of a 16 x 16 transpose went through LLVM's shuffle combining,
/// which spent about 75 M instructions of `llc` on each such transpose (callgrind), about 18 M
/// as permutes; the same number of permutes is emitted either way.
fn permutes<'c>(
    em: &Emitter<'c>,
    vt: Option<VectorType<'c>>,
) -> Result<Option<(FunctionValue<'c>, VectorType<'c>)>> {
    let Some(vt) = vt.filter(|_| crate::cpu::wide_vectors(em.target)) else {
        return Ok(None);
    };
    let lanes = vt.get_size();
    let (name, it) = match (vt.get_element_type(), lanes) {
        (t, 16) if t == em.ctx.f32_type().into() => (
            "llvm.x86.avx512.vpermi2var.ps.512",
            em.ctx.i32_type().vec_type(16),
        ),
        (t, 8) if t == em.ctx.f64_type().into() => (
            "llvm.x86.avx512.vpermi2var.pd.512",
            em.ctx.i64_type().vec_type(8),
        ),
        _ => return Ok(None),
    };
    let f = inkwell::intrinsics::Intrinsic::find(name)
        .and_then(|i| i.get_declaration(em.m, &[]))
        .ok_or_else(|| crate::Error::Llvm(format!("cannot declare {name}")))?;
    Ok(Some((f, it)))
}

/// The constant index vector `mask` (of `i32`s) as a vector of type `it`, passed through an
/// empty `asm` so that no pass sees its value (see [`permutes`]).
fn opaque<'c>(
    em: &Emitter<'c>,
    it: VectorType<'c>,
    mask: VectorValue<'c>,
) -> Result<VectorValue<'c>> {
    let et = it.get_element_type().into_int_type();
    let values: Vec<IntValue<'c>> = (0..mask.get_type().get_size())
        .map(|k| {
            let v = mask
                .get_element_as_constant(k)
                .into_int_value()
                .get_zero_extended_constant()
                .unwrap_or(0);
            et.const_int(v, false)
        })
        .collect();
    let constant = VectorType::const_vector(&values);
    let asm = em.ctx.create_inline_asm(
        it.fn_type(&[it.into()], false),
        String::new(),
        "=v,0".into(),
        false,
        false,
        None,
        false,
    );
    let call =
        em.b.build_indirect_call(
            it.fn_type(&[it.into()], false),
            asm,
            &[constant.into()],
            "ix",
        )
        .map_err(llvm)?;
    Ok(call
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| crate::Error::Llvm("an asm without a value".into()))?
        .into_vector_value())
}

/// `f(a, at, c)`: lanes of `a` and `c` by the indices `at` (a two-source permute).
fn permute2<'c>(
    em: &Emitter<'c>,
    f: FunctionValue<'c>,
    a: VectorValue<'c>,
    at: VectorValue<'c>,
    c: VectorValue<'c>,
) -> Result<VectorValue<'c>> {
    Ok(em
        .b
        .build_call(f, &[a.into(), at.into(), c.into()], "tp")
        .map_err(llvm)?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| crate::Error::Llvm("a permute without a value".into()))?
        .into_vector_value())
}
