//! The GEMM kernel's loops: column, contraction and row blocks around the routines, and the
//! epilogue over each finished block.

use super::*;

/// Code applied to a finished block of C: rows `.0`, columns `.1`, with C stored at `.2` from
/// row `.3` on (`out` from row 0, or a chained GEMM's block buffer from the block's first row);
/// `.4` for a block of a softmax computed online (whose buffer holds the block's columns
/// only).
pub(crate) type Epilogue<'a, 'c> = &'a mut dyn FnMut(
    (IntValue<'c>, IntValue<'c>),
    (IntValue<'c>, IntValue<'c>),
    PointerValue<'c>,
    IntValue<'c>,
    Option<&OnlineBlock<'c>>,
) -> Result<()>;

/// Emits the GEMM over rows `lo..hi` of `[batch * m, n]` C, then `epilogue` over each block of
/// C as soon as its last contraction block is done (while the block is still in cache). `scratch` holds at least
/// [`Blocking::scratch_bytes`] bytes, 64-byte aligned.
///
/// With `update = Some((s, subtract))` (and no epilogue) C already holds a matrix X, and the
/// GEMM computes `X - s P` (or `X + s P`) in place: an SGD step written into the donated
/// parameter. With one contraction block that is bit for bit the epilogue's `X - P s`; with
/// several, each block's product is folded in on its own.
///
/// With `k_at_run`, the contraction length is that value (the kernel's parameter), not `k`:
/// one function then serves products that differ only in it (`k` is one of them, not 0).
///
/// With `chain` (a row epilogue, `k` at most one contraction block), each block of rows of C
/// lives in the scratch memory instead of `out`: after the epilogue the chained product
/// multiplies it by its B, packed once per batch, into the chain's `out` (see
/// [`crate::kernel::Chain`]).
///
/// With `zero` (see [`crate::kernel::ZeroBlocks`]), tiles that read A packed leave out the
/// contraction steps where the hint's operand is checked zero and the other finite
/// (`zero_steps.rs`).
///
/// With `unread` (see [`crate::kernel::Unread`]), the tile routine runs over the rows of each
/// block that each panel's columns need, and zeros are stored in the others (`unread.rs`);
/// only for a product stored by rows with no chained product, update or convolution, and
/// without zero steps (else every tile is computed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit<'c>(
    em: &Emitter<'c>,
    d: DType,
    bl: Blocking,
    (m, n, k): (i64, i64, i64),
    k_at_run: Option<IntValue<'c>>,
    (a_trans, b_trans): (bool, bool),
    strides: &[Option<Strides>; 2],
    store: Option<&Strides>,
    conv: Option<&ConvPatches>,
    out: PointerValue<'c>,
    scratch: PointerValue<'c>,
    (lo, hi): (IntValue<'c>, IntValue<'c>),
    split_columns: bool,
    epilogue: Option<Epilogue<'_, 'c>>,
    update: Option<(BasicValueEnum<'c>, bool)>,
    chain: Option<Chain<'_, 'c>>,
    zero: Option<&ZeroBlocks>,
    unread: Option<&Unread>,
) -> Result<()> {
    let mut epilogue = epilogue;
    let x = Arith { em };
    let planes = conv.is_some_and(|p| p.planes);
    if planes && (update.is_some() || chain.is_some()) {
        return Err(crate::Error::Llvm(
            "a convolution's GEMM storing its output by planes takes no update or chained \
             product"
                .into(),
        ));
    }
    if store.is_some() && (planes || update.is_some() || chain.is_some() || epilogue.is_some()) {
        return Err(crate::Error::Llvm(
            "a GEMM storing its product through strides takes no epilogue, update, chained \
             product or convolution"
                .into(),
        ));
    }
    // lo..hi are rows, or with `split_columns` panels of columns (all rows).
    let (lo, hi, col_lo, col_hi) = if split_columns {
        let nr = bl.nr();
        let col_hi = x.min(x.mulc(hi, nr)?, x.c(n))?;
        (x.c(0), x.c(m), x.mulc(lo, nr)?, col_hi)
    } else {
        (lo, hi, x.c(0), x.c(n))
    };
    let ft = em.ftype(d);
    let ptr = em.ctx.ptr_type(AddressSpace::default());
    let base = |i: i64| -> Result<PointerValue<'c>> {
        let slot = x.at(ptr, em.inputs.get(), x.c(i))?;
        Ok(em
            .b
            .build_load(ptr, slot, "base")
            .map_err(llvm)?
            .into_pointer_value())
    };
    let nc = bl.nc_for(n);
    // Zero steps are left out of tiles reading packed slivers of A and packed panels of B.
    let zero_steps = match zero {
        Some(z) if chain.is_none() && conv.is_none() && update.is_none() && !bl.compact => {
            let panels = (nc / bl.nr() + 1) as u32;
            Some(ZeroSteps {
                z: z.clone(),
                flags: em.entry_alloca(em.ctx.i8_type().array_type(panels).into())?,
            })
        }
        _ => None,
    };
    // Unread rows are left out of tiles called through the shared routines.
    let unread = match unread {
        Some(u)
            if chain.is_none()
                && conv.is_none()
                && update.is_none()
                && store.is_none()
                && zero_steps.is_none() =>
        {
            Some(UnreadRows { at: u.at })
        }
        _ => None,
    };
    // A convolution's column offsets, as a constant table in the module.
    let conv = match conv {
        None => None,
        Some(p) => {
            let i64t = em.ctx.i64_type();
            let offsets: Vec<IntValue<'c>> = p
                .column_offsets()
                .iter()
                .map(|&o| i64t.const_int(o as u64, true))
                .collect();
            let table = i64t.const_array(&offsets);
            let name = format!("{}.patch_offsets", em.f.get_name().to_string_lossy());
            let global = em.m.add_global(table.get_type(), None, &name);
            global.set_initializer(&table);
            global.set_constant(true);
            global.set_linkage(inkwell::module::Linkage::Private);
            Some((p, global.as_pointer_value()))
        }
    };
    let g = Gemm {
        r: Regs {
            x: Arith { em },
            bl,
            ft,
            vt: ft.vec_type(bl.lanes),
            update: match update {
                None => None,
                Some((scale, subtract)) => Some(Update {
                    scale: splat(em, ft, bl.lanes, scale)?.into(),
                    subtract,
                    when: None,
                }),
            },
            planes,
            tail: false,
        },
        m,
        a_trans,
        k: k_at_run.unwrap_or(x.c(k)),
        lda: match &strides[0] {
            Some(s) => x.c(s.ld as i64),
            None if a_trans => x.c(m),
            None => k_at_run.unwrap_or(x.c(k)),
        },
        a_strides: strides[0].as_ref(),
        a: base(0)?,
        conv,
        b: base(1)?,
        packed_b: scratch,
        packed_a: x.at(ft, scratch, x.c(bl.kc * nc))?,
    };
    let (s_r, s_j) = (x.slot()?, x.slot()?);
    // Where element (r, j) of C lies in `out`: by rows, or, stored by planes, column j of
    // batch r / m's `[m, n]` product at `(r / m) * m * n + j * m + r % m`, or, stored through
    // strides, row r % m of batch r / m's matrix where the strides put it.
    let out_at = |r: IntValue<'c>, j: IntValue<'c>| -> Result<IntValue<'c>> {
        if let Some(s) = store {
            let bt = x.sdiv(r, m)?;
            let i = x.sub(r, x.mulc(bt, m)?)?;
            x.add(x.add(batch_start(&x, s, bt)?, x.mulc(i, s.ld as i64)?)?, j)
        } else if planes {
            let bt = x.sdiv(r, m)?;
            x.add(x.add(r, x.mulc(bt, m * (n - 1))?)?, x.mulc(j, m)?)
        } else {
            x.add(x.mulc(r, n)?, j)
        }
    };
    // The distance between C's rows (its columns, by planes) that tiles are given.
    let ldc = x.c(match store {
        Some(s) => s.ld as i64,
        None if planes => m,
        None => n,
    });
    if k == 0 && planes {
        // An empty contraction: the product is zero, then the epilogue, an image at a time.
        let s_bt = x.slot()?;
        x.batches(s_bt, (lo, hi), m, &mut |_bt, r_lo, r_hi| {
            em.range_loop_ptr(s_r, r_lo, r_hi, 1, &mut |em| {
                let r = x.get(s_r)?;
                em.range_loop_ptr(s_j, x.c(0), x.c(n), 1, &mut |em| {
                    let p = x.at(ft, out, out_at(r, x.get(s_j)?)?)?;
                    em.b.build_store(p, ft.const_zero()).map_err(llvm)?;
                    Ok(())
                })
            })?;
            match epilogue.as_mut() {
                Some(e) => e((r_lo, r_hi), (x.c(0), x.c(n)), out, x.c(0), None),
                None => Ok(()),
            }
        })?;
        return Ok(());
    }
    if k == 0 && store.is_some() {
        // An empty contraction stored through strides: zeros, a row at a time.
        em.range_loop_ptr(s_r, lo, hi, 1, &mut |em| {
            let r = x.get(s_r)?;
            em.range_loop_ptr(s_j, col_lo, col_hi, 1, &mut |em| {
                let p = x.at(ft, out, out_at(r, x.get(s_j)?)?)?;
                em.b.build_store(p, ft.const_zero()).map_err(llvm)?;
                Ok(())
            })
        })?;
        return Ok(());
    }
    if k == 0 {
        // An empty contraction: the product is zero.
        em.range_loop_ptr(s_r, x.mulc(lo, n)?, x.mulc(hi, n)?, 1, &mut |em| {
            let p = x.at(ft, out, x.get(s_r)?)?;
            let v = match update {
                None => ft.const_zero(),
                Some((scale, subtract)) => {
                    let old =
                        em.b.build_load(ft, p, "x")
                            .map_err(llvm)?
                            .into_float_value();
                    let sp =
                        em.b.build_float_mul(ft.const_zero(), scale.into_float_value(), "sp")
                            .map_err(llvm)?;
                    if subtract {
                        em.b.build_float_sub(old, sp, "upd")
                    } else {
                        em.b.build_float_add(old, sp, "upd")
                    }
                    .map_err(llvm)?
                }
            };
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        if let Some(e) = epilogue.as_mut() {
            e((lo, hi), (col_lo, col_hi), out, x.c(0), None)?;
        }
        return Ok(());
    }
    if let Some(stream) = bl.stream {
        let by_rows = stream == Stream::Rows;
        if chain.is_some() || g.conv.is_some() || b_trans == by_rows || (!by_rows && a_trans) {
            return Err(crate::Error::Llvm(
                "a GEMM streaming B reads it by rows, or by dot products with A by rows and B \
                 transposed, with no chained product or convolution"
                    .into(),
            ));
        }
        let rows = (lo, hi);
        let cols = (col_lo, col_hi);
        return if by_rows {
            g.streamed(
                n,
                rows,
                cols,
                strides[1].as_ref(),
                out,
                &out_at,
                scratch,
                epilogue,
            )
        } else {
            g.dots(n, rows, cols, strides[1].as_ref(), out, &out_at, epilogue)
        };
    }
    // A chained product's buffers, and where the block of C starting at row `ic` lies.
    let chained = match &chain {
        None => None,
        Some(ch) => {
            let at = bl.chain_scratch(n, ch.bl, ch.n, ch.online.then_some(m));
            Some(Chained {
                ch,
                ft,
                k: n,
                cols2: at.cols2,
                p: x.at(ft, scratch, x.c(at.p))?,
                b2: x.at(ft, scratch, x.c(at.b2))?,
                a2: x.at(ft, scratch, x.c(at.a2))?,
                max: x.at(ft, scratch, x.c(at.max))?,
                sum: x.at(ft, scratch, x.c(at.sum))?,
                online_ld: bl.nc,
                b: base(ch.b)?,
            })
        }
    };
    let online = chain.as_ref().is_some_and(|c| c.online);
    let c_block = |ic: IntValue<'c>| -> (PointerValue<'c>, IntValue<'c>) {
        match &chained {
            None => (out, x.c(0)),
            Some(c) => (c.p, ic),
        }
    };
    // Element (r, j) of C, in the block of rows starting at row `ic` (and, for an online
    // softmax, of columns starting at `jc`: its buffer holds those only, `nc` to a row).
    let c_at = |ic: IntValue<'c>, jc: IntValue<'c>, r: IntValue<'c>, j: IntValue<'c>| {
        let at = match &chained {
            None => out_at(r, j)?,
            Some(_) if online => x.add(x.mulc(x.sub(r, ic)?, bl.nc)?, x.sub(j, jc)?)?,
            Some(_) => out_at(x.sub(r, ic)?, j)?,
        };
        x.at(ft, c_block(ic).0, at)
    };
    let ldc = if online { x.c(bl.nc) } else { ldc };
    let nr = bl.nr();
    let n_full = n - n % nr;
    let (s_bt, s_jc, s_kb, s_ic) = (x.slot()?, x.slot()?, x.slot()?, x.slot()?);
    // The batches that rows lo..hi touch.
    x.batches(s_bt, (lo, hi), m, &mut |bt, r_lo, r_hi| {
        // A convolution's kernel is the B of every batch.
        let b_base = match &strides[1] {
            _ if g.conv.is_some() => x.c(0),
            Some(s) => batch_start(&x, s, bt)?,
            None => x.mul(bt, x.mul(g.k, x.c(n))?)?,
        };
        // Elements between B's stored rows.
        let ldb_stored = match &strides[1] {
            Some(s) => x.c(s.ld as i64),
            None if b_trans => g.k,
            None => x.c(n),
        };
        match &chained {
            Some(c) if !online => c.pack_b(em, bt)?,
            _ => {}
        }
        x.em.range_loop_ptr(s_jc, col_lo, col_hi, nc, &mut |_| {
            let jc = x.get(s_jc)?;
            let jc_end = x.min(x.addc(jc, nc)?, col_hi)?;
            // An online softmax's chained product takes this block's rows of its B.
            match &chained {
                Some(c) if online => c.pack_b_rows(em, bt, (jc, x.sub(jc_end, jc)?), c.b2)?,
                _ => {}
            }
            let full_end = x.min(jc_end, x.c(n_full))?;
            // The tail panel (fewer than nr columns) is the last one of the last block.
            let has_tail = x.cmp(IntPredicate::SGT, jc_end, x.c(n_full))?;
            let panel_of = |j: IntValue<'c>| -> Result<PointerValue<'c>> {
                x.at(ft, g.packed_b, x.mulc(x.sub(j, jc)?, bl.kc)?)
            };
            x.em.range_loop_ptr(s_kb, x.c(0), g.k, bl.kc, &mut |_| {
                let kb = x.get(s_kb)?;
                let kend = x.min(x.addc(kb, bl.kc)?, g.k)?;
                let kc = x.sub(kend, kb)?;
                let first = x.cmp(IntPredicate::EQ, kb, x.c(0))?;
                // Panel `j` of B (`width` columns) through its packing routine.
                let source = BSource {
                    b: g.b,
                    base: b_base,
                    ld: ldb_stored,
                    trans: b_trans,
                };
                // The compact tile reads B where it is (see `b_in_place`): its panel is B's
                // rows from `kb` on, `n` apart; other tiles read B's packed panels.
                let in_place = b_in_place(&bl, b_trans, g.conv.is_some(), chain.is_some());
                let ldb = if in_place { ldb_stored } else { x.c(nr) };
                let panel_at = |j: IntValue<'c>| -> Result<PointerValue<'c>> {
                    if in_place {
                        x.at(ft, g.b, x.add(x.add(b_base, x.mul(kb, ldb_stored)?)?, j)?)
                    } else {
                        panel_of(j)
                    }
                };
                let pack = |j: IntValue<'c>, width: i64| -> Result<()> {
                    if in_place {
                        return Ok(());
                    }
                    pack_b_panel(&x, ft, bl, &source, (j, width), (kb, kc), panel_of(j)?)?;
                    match &zero_steps {
                        Some(zs) => {
                            zs.check_panel(&x, ft, bl, (panel_of(j)?, jc), (j, width), (kb, kend))
                        }
                        None => Ok(()),
                    }
                };
                // (Whole panels only when there are any: no dead code calling routines the
                // kernel cache does not compile.)
                if n_full > 0 {
                    x.em.range_loop_ptr(s_j, jc, full_end, nr, &mut |_| pack(x.get(s_j)?, nr))?;
                }
                if n_full < n {
                    x.branch(
                        has_tail,
                        &mut || {
                            let j = x.c(n_full);
                            pack(j, n - n_full)
                        },
                        &mut || Ok(()),
                    )?;
                }
                x.em.range_loop_ptr(s_ic, r_lo, r_hi, bl.mc, &mut |_| {
                    let ic = x.get(s_ic)?;
                    let ic_end = x.min(x.addc(ic, bl.mc)?, r_hi)?;
                    // The block itself, unless a mask leaves nothing of it.
                    let mut block = || -> Result<()> {
                        // One panel: each sliver of A meets one panel, so the tile reads A where it
                        // is instead of packing it first. For a convolution that is its input
                        // through the column offset table (an implicit im2col with no patch matrix
                        // at all): measured on conv 3x3 64 -> 64 and conv 7x7/2 3 -> 64 (alternating
                        // A/B calls), 14 of 15 and 15 of 15 pairs won, about 20% and 11% faster.
                        // A chained product's first product (one short contraction block, attention's
                        // queries) reads A in place too: measured on attention_8x8x512x64 (one
                        // process, alternating calls), 17 of 20 pairs won, 23.40 -> 23.22 ms.
                        // So does a product of a few panels whose schedule says so
                        // ([`Blocking::a_in_place`]).
                        let direct = n <= nr || chain.is_some() || bl.a_in_place;
                        if !direct {
                            g.pack_a(ic, ic_end, kb, kend)?;
                        }
                        // Whether A's rows pass the zero steps' check, once for all panels.
                        let a_ok = match &zero_steps {
                            Some(zs) => Some(zs.a_block(
                                &g,
                                ft,
                                (ic, ic_end, x.mulc(bt, m)?),
                                (kb, kend),
                            )?),
                            None => None,
                        };
                        let slivers = |j: IntValue<'c>, width: i64| -> Result<()> {
                            let panel = panel_at(j)?;
                            // The tile's code is a function shared by every GEMM with the same
                            // tile (see [`Routine`]), except a convolution's reading its input in
                            // place, emitted here with the column offset table.
                            let compact = bl.compact && chain.is_none();
                            let read = ARead::of(compact, direct, g.conv.is_some(), g.a_trans);
                            let shared = match read {
                                None => None,
                                Some(a) => {
                                    let t = Routine::tile(bl, width, a, planes);
                                    Some((t.function(em.ctx, em.m, em.routines, em.target)?, a))
                                }
                            };
                            // The shared tile routine `f` over rows r0..r1 of this panel, A
                            // read at (at, lda, step), in update mode if the kernel is, C + s P
                            // (`s` negated for a subtraction).
                            let (scale, updating) = routine_update(em, ft, update)?;
                            let call_tile = |f: FunctionValue<'c>,
                                             (r0, r1): (IntValue<'c>, IntValue<'c>),
                                             (at, lda, step): (
                                PointerValue<'c>,
                                IntValue<'c>,
                                IntValue<'c>,
                            ),
                                             scale: BasicValueEnum<'c>|
                             -> Result<()> {
                                em.b.build_call(
                                    f,
                                    &[
                                        c_at(ic, jc, r0, j)?.into(),
                                        ldc.into(),
                                        x.sub(r1, r0)?.into(),
                                        at.into(),
                                        lda.into(),
                                        step.into(),
                                        panel.into(),
                                        ldb.into(),
                                        kc.into(),
                                        first.into(),
                                        scale.into(),
                                        updating.into(),
                                    ],
                                    "",
                                )
                                .map_err(llvm)?;
                                Ok(())
                            };
                            if let (Some((f, a)), Some(zs), Some(a_ok)) =
                                (shared, &zero_steps, a_ok)
                            {
                                // A's arguments for the sliver from row `r`, from step `kk`.
                                let a_at = |r: IntValue<'c>, kk: IntValue<'c>| match a {
                                    ARead::Packed => {
                                        let at = x.add(
                                            x.mulc(x.sub(r, ic)?, bl.kc)?,
                                            x.mulc(x.sub(kk, kb)?, bl.mr)?,
                                        )?;
                                        Ok((x.at(ft, g.packed_a, at)?, x.c(bl.kc), x.c(1)))
                                    }
                                    _ => a.args(
                                        &x,
                                        ft,
                                        (g.a, g.packed_a),
                                        (g.a_row(r)?, kk),
                                        (g.lda, bl.kc),
                                        g.a_trans,
                                    ),
                                };
                                return zs.slivers(
                                    &x,
                                    (f, ft, bl),
                                    (ic, ic_end, x.mulc(bt, m)?, a_ok),
                                    (j, width, jc),
                                    (kb, kend),
                                    (&a_at, panel),
                                    (&|r| c_at(ic, jc, r, j), ldc),
                                    (first, ft.const_zero().into()),
                                );
                            }
                            if let (Some((f, a)), Some(u)) = (shared, &unread) {
                                // The tile over rows r0..r1 (r0 at a sliver's start).
                                let tile = |r0: IntValue<'c>, r1: IntValue<'c>| -> Result<()> {
                                    let (at, lda, step) = match a {
                                        ARead::Packed => {
                                            let at = x.mulc(x.sub(r0, ic)?, bl.kc)?;
                                            (x.at(ft, g.packed_a, at)?, x.c(bl.kc), x.c(1))
                                        }
                                        _ => a.args(
                                            &x,
                                            ft,
                                            (g.a, g.packed_a),
                                            (g.a_row(r0)?, kb),
                                            (g.lda, bl.kc),
                                            g.a_trans,
                                        )?,
                                    };
                                    call_tile(f, (r0, r1), (at, lda, step), ft.const_zero().into())
                                };
                                let base = x.mulc(bt, m)?;
                                return u.panel(
                                    &x,
                                    ft,
                                    bl.mr,
                                    (ic, ic_end, base),
                                    (j, width),
                                    &tile,
                                    &|r| c_at(ic, jc, r, j),
                                );
                            }
                            if let Some((f, a)) = shared {
                                let (at, lda, step) = a.args(
                                    &x,
                                    ft,
                                    (g.a, g.packed_a),
                                    (g.a_row(ic)?, kb),
                                    (g.lda, bl.kc),
                                    g.a_trans,
                                )?;
                                return call_tile(f, (ic, ic_end), (at, lda, step), scale);
                            }
                            x.em.range_loop_ptr(s_r, ic, ic_end, bl.mr, &mut |_| {
                                let r = x.get(s_r)?;
                                let c = c_at(ic, jc, r, j)?;
                                let rows = x.sub(ic_end, r)?;
                                // Where each row of the tile starts (rows past the block read the
                                // last one; their results are not stored).
                                let last = x.sub(ic_end, x.c(1))?;
                                let starts: Vec<IntValue<'c>> = (0..bl.mr)
                                    .map(|i| g.a_row(x.min(x.addc(r, i)?, last)?))
                                    .collect::<Result<_>>()?;
                                let a = |i: i64, kk: IntValue<'c>| {
                                    x.at(ft, g.a, g.a_at(starts[i as usize], x.add(kb, kk)?)?)
                                };
                                g.tile(c, ldc, rows, width, &a, (panel, ldb), kc, first)
                            })
                        };
                        if n_full > 0 {
                            x.em.range_loop_ptr(s_j, jc, full_end, nr, &mut |_| {
                                slivers(x.get(s_j)?, nr)
                            })?;
                        }
                        if n_full < n {
                            x.branch(
                                has_tail,
                                &mut || slivers(x.c(n_full), n - n_full),
                                &mut || Ok(()),
                            )?;
                        }
                        if let Some(e) = epilogue.as_mut() {
                            let last = x.cmp(IntPredicate::SGE, kend, g.k)?;
                            let (c, row0) = c_block(ic);
                            x.branch(
                                last,
                                &mut || match &chained {
                                    Some(ch) if online => {
                                        let block = OnlineBlock {
                                            first: x.cmp(IntPredicate::EQ, jc, col_lo)?,
                                            ld: bl.nc,
                                            max: ch.max,
                                            sum: ch.sum,
                                            base: x.mulc(bt, m)?,
                                            out: ch.ch.out,
                                            n2: ch.ch.n,
                                        };
                                        e((ic, ic_end), (jc, jc_end), c, row0, Some(&block))?;
                                        ch.product_block(
                                            em,
                                            (bt, (ic, ic_end)),
                                            (jc, x.sub(jc_end, jc)?),
                                            block.first,
                                        )
                                    }
                                    Some(ch) => {
                                        e((ic, ic_end), (jc, jc_end), c, row0, None)?;
                                        ch.product(em, bt, (ic, ic_end))
                                    }
                                    None => e((ic, ic_end), (jc, jc_end), c, row0, None),
                                },
                                &mut || Ok(()),
                            )?;
                        }
                        Ok(())
                    };
                    match (&chained, chain.as_ref().and_then(|c| c.masked)) {
                        (Some(ch), Some(mask)) if online => {
                            let base = x.mulc(bt, m)?;
                            let skip = all_masked(
                                &x,
                                mask,
                                (x.sub(ic, base)?, x.sub(ic_end, base)?),
                                (jc, jc_end),
                            )?;
                            let first = x.cmp(IntPredicate::EQ, jc, col_lo)?;
                            x.branch(
                                skip,
                                &mut || {
                                    x.branch(
                                        first,
                                        &mut || ch.clear_rows(em, (ic, ic_end), base),
                                        &mut || Ok(()),
                                    )
                                },
                                &mut block,
                            )
                        }
                        _ => block(),
                    }
                })
            })
        })?;
        // An online softmax's rows are divided by their sums once all their columns are in.
        match &chained {
            Some(ch) if online => ch.normalize(em, (r_lo, r_hi), x.mulc(bt, m)?),
            _ => Ok(()),
        }
    })
}

/// Whether every position of a block of rows `rows` (within their batch) and columns `cols`
/// (both half-open) is masked out by `(a, b, c)` (see [`crate::kernel::Chain::masked`]):
/// whether `col * a + row * b + c`, least at one of the block's corners, is positive there.
/// The scale and update flag a shared tile routine is called with (see [`Routine::Tile`]) for
/// a kernel's update mode `update` (`(s, subtract)`): `C + s P` with `s` negated for `C - s P`
/// (the same value, bit for bit: the product's sign flips exactly), or zero and no update.
fn routine_update<'c>(
    em: &Emitter<'c>,
    ft: FloatType<'c>,
    update: Option<(BasicValueEnum<'c>, bool)>,
) -> Result<(BasicValueEnum<'c>, IntValue<'c>)> {
    let flag = |on: bool| em.ctx.bool_type().const_int(on as u64, false);
    Ok(match update {
        None => (ft.const_zero().into(), flag(false)),
        Some((s, false)) => (s, flag(true)),
        Some((s, true)) => (
            em.b.build_float_neg(s.into_float_value(), "ns")
                .map_err(llvm)?
                .into(),
            flag(true),
        ),
    })
}

pub(super) fn all_masked<'c>(
    x: &Arith<'_, 'c>,
    (a, b, c): (i64, i64, i64),
    (r0, r1): (IntValue<'c>, IntValue<'c>),
    (j0, j1): (IntValue<'c>, IntValue<'c>),
) -> Result<IntValue<'c>> {
    let j = if a >= 0 { j0 } else { x.addc(j1, -1)? };
    let r = if b >= 0 { r0 } else { x.addc(r1, -1)? };
    let least = x.addc(x.add(x.mulc(j, a)?, x.mulc(r, b)?)?, c)?;
    x.cmp(IntPredicate::SGT, least, x.c(0))
}

/// A batch of a GEMM's B, as its panels are packed: `[k, n]` from element `base` of `b`
/// (`[n, k]` with `trans`), its stored rows `ld` apart.
pub(super) struct BSource<'c> {
    pub(super) b: PointerValue<'c>,
    pub(super) base: IntValue<'c>,
    pub(super) ld: IntValue<'c>,
    pub(super) trans: bool,
}

/// Packs panel `j` of `src` (`width` columns, the others zeros), contraction steps
/// `kb..kb + span`, at `dst` through its routine (see [`Regs::pack_b`]).
pub(super) fn pack_b_panel<'c>(
    x: &Arith<'_, 'c>,
    ft: FloatType<'c>,
    bl: Blocking,
    src: &BSource<'c>,
    (j, width): (IntValue<'c>, i64),
    (kb, span): (IntValue<'c>, IntValue<'c>),
    dst: PointerValue<'c>,
) -> Result<()> {
    let em = x.em;
    let f = Routine::pack_b(bl, width, src.trans).function(em.ctx, em.m, em.routines, em.target)?;
    let ld = src.ld;
    let at = if src.trans {
        x.add(x.add(src.base, x.mul(j, ld)?)?, kb)?
    } else {
        x.add(x.add(src.base, x.mul(kb, ld)?)?, j)?
    };
    let args = [
        x.at(ft, src.b, at)?.into(),
        ld.into(),
        span.into(),
        dst.into(),
    ];
    em.b.build_call(f, &args, "").map_err(llvm)?;
    Ok(())
}
