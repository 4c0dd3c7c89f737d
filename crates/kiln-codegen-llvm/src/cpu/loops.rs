//! Loop strategies of loop-nest kernels: plain nests, streaming stores, transposing tiles,
//! column strips, and the guard segments loops are cut at. Which of them a kernel takes (but
//! column strips) is its [`KernelSchedule`], decided by the kernel layer; this renders it.

use super::*;

pub(super) fn strides_of(shape: &[usize]) -> Vec<i64> {
    strides(shape).iter().map(|&s| s as i64).collect()
}

pub(super) fn emit_nest<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    out: PointerValue<'c>,
    lo: IntValue<'c>,
    hi: IntValue<'c>,
) -> Result<()> {
    // Each loop variable stays within its dimension (a thread's rows too), which decides the
    // guards of dimensions without padding (see `Emitter::known`); loops cut at guards know
    // narrower ranges.
    let mark = em.facts.borrow().len();
    em.facts.borrow_mut().extend(
        k.out
            .shape
            .iter()
            .enumerate()
            .map(|(v, &n)| (v, 0, n as i64)),
    );
    let r = emit_nest_loops(em, k, out, lo, hi);
    em.facts.borrow_mut().truncate(mark);
    r
}

/// [`emit_nest`]'s loops.
pub(super) fn emit_nest_loops<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    out: PointerValue<'c>,
    lo: IntValue<'c>,
    hi: IntValue<'c>,
) -> Result<()> {
    let ost = strides(&k.out.shape);
    let ptr = em.ctx.ptr_type(AddressSpace::default());
    let mut store = |em: &Emitter<'c>| -> Result<()> {
        // Every output's value first, then the stores: the values' loads and arithmetic are
        // then one straight-line block (no store between them), which LLVM shares between the
        // outputs of a multi-output kernel.
        let mut values = vec![(k.out.dtype, out, em.expr(&k.body)?)];
        for x in &k.extra {
            // SAFETY (of the emitted code): the slot is in the pointer table (Program::new's
            // contract: extra outputs follow the inputs).
            let slot = unsafe {
                em.b.build_in_bounds_gep(ptr, em.inputs.get(), &[em.i64c(x.slot as i64)], "slot")
            }
            .map_err(llvm)?;
            let base = em.b.build_load(ptr, slot, "xo").map_err(llvm)?;
            em.scope_input(base)?;
            values.push((x.out.dtype, base.into_pointer_value(), em.expr(&x.body)?));
        }
        let idx = em.position(&ost)?;
        for (n, (dtype, base, v)) in values.into_iter().enumerate() {
            let v = em.store_value(dtype, v)?;
            let st = storage(em.ctx, dtype);
            // SAFETY (of the emitted code): idx is below the output's element count, which
            // every output of the kernel shares.
            let p = unsafe { em.b.build_in_bounds_gep(st, base, &[idx], "po") }.map_err(llvm)?;
            let s = em.b.build_store(p, v).map_err(llvm)?;
            if n > 0 {
                em.scope(Some(s), true)?;
            }
        }
        Ok(())
    };
    let schedule = schedule_of(em)?;
    if let Some(tile) = schedule.tile {
        return emit_tiled(em, k, tile, (lo, hi), out, &mut store);
    }
    let stream = schedule.stream.then_some(out);
    // Loop d runs inside loop d - 1. Before it, every reduction that reads only the variables
    // of the enclosing loops is computed once and reused (a row's max and sum ahead of the
    // loop over its columns, which makes softmax one kernel).
    fn level<'c>(
        em: &Emitter<'c>,
        k: &Kernel,
        d: usize,
        lohi: (IntValue<'c>, IntValue<'c>),
        stream: Option<PointerValue<'c>>,
        store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
    ) -> Result<()> {
        let bodies: Vec<&Expr> = std::iter::once(&k.body)
            .chain(k.extra.iter().map(|x| &x.body))
            .collect();
        let mark = em.hoist(bodies.iter().copied(), d)?;
        let rank = k.out.rank();
        let (from, to) = if d == 0 {
            lohi
        } else {
            (
                em.i64c(0),
                em.i64c(k.out.shape.get(d).copied().unwrap_or(1) as i64),
            )
        };
        if let Some((widths, columns)) = column_reduces(em, k, d)? {
            // The dimensions after the strips' are of extent 1 (`Strips::dim`): their
            // variables stay 0.
            for v in d + 1..rank {
                em.b.build_store(em.vars[v], em.i64c(0)).map_err(llvm)?;
            }
            strips(em, d, (from, to), widths, &columns, store)?;
        } else if d == rank {
            store(em)?;
        } else if let Some(out) = stream.filter(|_| d + 1 == rank) {
            // (A one-dimensional kernel's range is a thread's rows.)
            let segments = &schedule_of(em)?.segments[d];
            for &(s, e) in segments {
                let range = if segments.len() == 1 {
                    (from, to)
                } else {
                    let lo = em.int_max(from, em.i64c(s))?;
                    // An empty range where the thread's rows miss the segment.
                    (lo, em.int_max(lo, em.int_min(to, em.i64c(e))?)?)
                };
                em.facts.borrow_mut().push((d, s, e));
                let r = emit_streaming(em, k, d, range, out, store);
                em.facts.borrow_mut().pop();
                r?;
            }
        } else if d == 0 {
            // A thread's rows, in the segments where the guards on them are decided.
            let segments = &schedule_of(em)?.segments[0];
            for &(s, e) in segments {
                let (from, to) = if segments.len() == 1 {
                    lohi
                } else {
                    (
                        em.int_max(lohi.0, em.i64c(s))?,
                        em.int_min(lohi.1, em.i64c(e))?,
                    )
                };
                em.facts.borrow_mut().push((0, s, e));
                let r = em.range_loop(0, from, to, 1, &mut |em: &Emitter<'c>| {
                    level(em, k, 1, lohi, stream, store)
                });
                em.facts.borrow_mut().pop();
                r?;
            }
        } else {
            let segments = &schedule_of(em)?.segments[d];
            em.segmented(d, segments, &mut |em: &Emitter<'c>| {
                level(em, k, d + 1, lohi, stream, store)
            })?;
        }
        em.hoisted.borrow_mut().truncate(mark);
        Ok(())
    }
    level(em, k, 0, (lo, hi), stream, &mut store)?;
    if stream.is_some() {
        // Streaming stores are weakly ordered: drain them before the kernel returns, so the
        // thread that reads the output next (after joining this one) sees them.
        let sfence = em.m.get_function("llvm.x86.sse.sfence").unwrap_or_else(|| {
            em.m.add_function(
                "llvm.x86.sse.sfence",
                em.ctx.void_type().fn_type(&[], false),
                None,
            )
        });
        em.b.build_call(sfence, &[], "").map_err(llvm)?;
    }
    Ok(())
}

/// The innermost loop of a streaming kernel (see [`KernelSchedule::stream`]): positions `from..to` of
/// innermost dimension `d` (the other variables set). Positions up to the first cache-line
/// boundary of the output ([`Target::cache_line`]) are stored one by one; then each line's values go through a stack
/// buffer (the loop that fills it vectorizes) and are stored as one aligned non-temporal
/// vector; the positions after the last whole line, one by one again.
pub(super) fn emit_streaming<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    d: usize,
    (from, to): (IntValue<'c>, IntValue<'c>),
    out: PointerValue<'c>,
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    let bytes = k.out.dtype.bytes();
    let line_bytes = em.target.cache_line;
    let lanes = (line_bytes / bytes) as i64;
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(&k.out.shape);
    let int = |v: BasicValueEnum<'c>| v.into_int_value();
    // Elements from `from` to the next line boundary (the output is aligned to its element).
    em.b.build_store(em.vars[d], from).map_err(llvm)?;
    let idx = em.position(&ost)?;
    // SAFETY (of the emitted code): only the address is used.
    let p0 = unsafe { em.b.build_gep(st, out, &[idx], "p0") }.map_err(llvm)?;
    let addr = em.b.build_ptr_to_int(p0, i64t, "a0").map_err(llvm)?;
    let line = em.i64c(line_bytes as i64 - 1);
    let past = em.b.build_and(addr, line, "past").map_err(llvm)?;
    let to_line =
        em.b.build_and(
            em.b.build_int_sub(em.i64c(line_bytes as i64), past, "tl")
                .map_err(llvm)?,
            line,
            "tl",
        )
        .map_err(llvm)?;
    let peel =
        em.b.build_int_unsigned_div(to_line, em.i64c(bytes as i64), "peel")
            .map_err(llvm)?;
    let n = em.b.build_int_sub(to, from, "n").map_err(llvm)?;
    let peel = em.int_min(peel, n)?;
    let mid = em.b.build_int_add(from, peel, "mid").map_err(llvm)?;
    let whole =
        em.b.build_int_signed_div(
            em.b.build_int_sub(to, mid, "rest").map_err(llvm)?,
            em.i64c(lanes),
            "lines",
        )
        .map_err(llvm)?;
    let end =
        em.b.build_int_add(
            mid,
            em.b.build_int_mul(whole, em.i64c(lanes), "span")
                .map_err(llvm)?,
            "end",
        )
        .map_err(llvm)?;
    // Loads of one position (scalars broadcast over the output) ahead of the loops: LLVM
    // hoists them out of a plain loop, but not out of this loop of vectorized lines.
    let mark = em.hoisted.borrow().len();
    for l in invariant_loads(&k.body) {
        em.hoist_one(l)?;
    }
    em.range_loop(d, from, mid, 1, store)?;
    let buf = em.line_buffer(st, lanes as usize)?;
    let (slot, lane) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    let vt = vector_of(st, lanes as usize)?;
    let nontemporal = em.ctx.get_kind_id("nontemporal");
    let one = em
        .ctx
        .metadata_node(&[em.ctx.i32_type().const_int(1, false).into()]);
    em.range_loop_ptr(slot, mid, end, lanes, &mut |em: &Emitter<'c>| {
        let c = int(em.b.build_load(i64t, slot, "c").map_err(llvm)?);
        // A constant trip count (not c..c + lanes), so LLVM turns the loop into vectors.
        em.range_loop_ptr(lane, em.i64c(0), em.i64c(lanes), 1, &mut |em: &Emitter<
            'c,
        >| {
            let at = int(em.b.build_load(i64t, lane, "j").map_err(llvm)?);
            let x = em.b.build_int_nsw_add(c, at, "x").map_err(llvm)?;
            em.b.build_store(em.vars[d], x).map_err(llvm)?;
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            // SAFETY (of the emitted code): `at` is below the buffer's length.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[at], "bp") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        let l = em.b.build_load(vt, buf, "line").map_err(llvm)?;
        l.as_instruction_value()
            .ok_or_else(|| Error::Llvm("a load is an instruction".into()))?
            .set_alignment(em.target.cache_line as u32)
            .map_err(llvm)?;
        em.b.build_store(em.vars[d], c).map_err(llvm)?;
        let idx = em.position(&ost)?;
        // SAFETY (of the emitted code): positions c..c + lanes are in the output, and the
        // address is on a line boundary (c is `mid` plus whole lines).
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
        let s = em.b.build_store(p, l).map_err(llvm)?;
        s.set_alignment(em.target.cache_line as u32).map_err(llvm)?;
        s.set_metadata(one, nontemporal).map_err(llvm)?;
        Ok(())
    })?;
    em.range_loop(d, end, to, 1, store)?;
    em.hoisted.borrow_mut().truncate(mark);
    Ok(())
}

/// Collects into `out` the keys of the exponentials in `e` whose argument is `a - m`, `m` a
/// maximum over one variable `v` of an expression that is `a` with `v` in place of one of
/// `a`'s variables, `w`, whose range (`extents[w]`, where known) lies inside `v`'s: `m` is then
/// at least `a` (a softmax's `exp(x - max(x))`), so the argument is at most 0 or NaN, and
/// [`Emitter::exp_nonpositive`] computes it with the same bits as [`Emitter::exp_fast`] in
/// fewer operations; where `a` selects ([`maskable`]), [`Emitter::exp_masked`]. `extents`
/// holds the enclosing loops' trip counts by variable.
pub(super) fn nonpositive_exps(
    e: &Expr,
    extents: &mut Vec<Option<usize>>,
    out: &mut std::collections::HashMap<crate::kernel::ValueKey, ExpArg>,
) {
    match e {
        Expr::Op {
            op: Ew::Kind(OpKind::Exponential),
            args,
            ..
        } if max_difference(&args[0], extents) => {
            out.insert(value_key(e), ExpArg::nonpositive(maskable(&args[0])));
            nonpositive_exps(&args[0], extents, out);
        }
        Expr::Op { args, .. } => args.iter().for_each(|a| nonpositive_exps(a, extents, out)),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            nonpositive_exps(init, extents, out);
            let saved = extents.clone();
            for &(v, n) in vars {
                if extents.len() <= v {
                    extents.resize(v + 1, None);
                }
                extents[v] = Some(n);
            }
            nonpositive_exps(body, extents, out);
            *extents = saved;
        }
        Expr::Guard {
            then, otherwise, ..
        } => {
            nonpositive_exps(then, extents, out);
            nonpositive_exps(otherwise, extents, out);
        }
        _ => {}
    }
}

/// Whether `e` selects between values (a mask: `select(mask, x, -inf)`, as a causal
/// attention's scores are; the `-inf` is an input of the kernel, as constants are): its
/// exponential is then taken by [`crate::common::math::Math::exp_masked`].
pub(super) fn maskable(e: &Expr) -> bool {
    match e {
        Expr::Op { op, args, .. } => matches!(op, Ew::Select) || args.iter().any(maskable),
        Expr::Guard {
            then, otherwise, ..
        } => maskable(then) || maskable(otherwise),
        Expr::Reduce { init, body, .. } => maskable(init) || maskable(body),
        _ => false,
    }
}

/// Whether `e` is `a - m` with `m` a maximum of `a` over a range holding `a`'s position (see
/// [`nonpositive_exps`]), through round trips of bit casts (a stop-gradient's).
pub(super) fn max_difference(e: &Expr, extents: &[Option<usize>]) -> bool {
    let Some((a, m)) = crate::kernel::minus_max(e) else {
        return false;
    };
    let Expr::Reduce { vars, body, .. } = m else {
        return false;
    };
    let [(v, n)] = vars[..] else {
        return false;
    };
    let (fa, fm) = (free_vars(a), free_vars(m));
    fa.difference(&fm).any(|&w| {
        extents
            .get(w)
            .copied()
            .flatten()
            .is_some_and(|ext| ext <= n)
            && crate::kernel::rename_var(body, v, w) == *a
    })
}

/// The loads in `e` that read one position whatever the loop variables.
pub(super) fn invariant_loads(e: &Expr) -> Vec<&Expr> {
    use crate::kernel::Visitor;
    struct Invariant<'e>(Vec<&'e Expr>);
    impl<'e> Visitor<'e> for Invariant<'e> {
        fn expr(&mut self, e: &'e Expr) {
            match e {
                Expr::Load { coef, .. } if coef.iter().all(|&c| c == 0) => self.0.push(e),
                Expr::Op { .. } | Expr::Reduce { .. } => e.for_each_child(self),
                // Not under guards: what they guard may be out of range.
                _ => {}
            }
        }
    }
    let mut found = Invariant(Vec::new());
    found.expr(e);
    found.0
}

/// The loop schedule of the kernel `em` emits (see [`KernelSchedule`]).
pub(super) fn schedule_of<'e>(em: &'e Emitter<'_>) -> Result<&'e KernelSchedule> {
    em.schedule
        .as_ref()
        .ok_or_else(|| Error::Llvm("a loop-nest kernel without its loop schedule".into()))
}

/// Emits loop-nest kernel `k` (no reductions) with its output dimension `tile.dim` and its
/// innermost one in square tiles of edge `tile.edge`, inside loops over the other dimensions
/// in order (see [`kiln_kernel::loop_schedule::transpose_tile_dim`]); `lohi` is this call's
/// range of dimension 0.
pub(super) fn emit_tiled<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    Tile { dim: a, edge }: Tile,
    lohi: (IntValue<'c>, IntValue<'c>),
    out: PointerValue<'c>,
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let rank = k.out.rank();
    let inner = rank - 1;
    let range = |d: usize| -> (IntValue<'c>, IntValue<'c>) {
        if d == 0 {
            lohi
        } else {
            (em.i64c(0), em.i64c(k.out.shape[d] as i64))
        }
    };
    let i64t = em.ctx.i64_type();
    let (s_a, s_b) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    // Whole tiles go through a stack tile and in-register transposes when the kernel writes
    // one output of 4-byte elements.
    let whole_tiles =
        k.extra.is_empty() && matches!(k.out.dtype, DType::F32 | DType::I32 | DType::U32);
    // The tile a loop counter in `slot` is at: its start, and its end (at most `hi`).
    let tile = |em: &Emitter<'c>,
                slot: PointerValue<'c>,
                hi: IntValue<'c>|
     -> Result<(IntValue<'c>, IntValue<'c>)> {
        let x0 =
            em.b.build_load(i64t, slot, "t0")
                .map_err(llvm)?
                .into_int_value();
        let x1 =
            em.b.build_int_add(x0, em.i64c(edge as i64), "t1")
                .map_err(llvm)?;
        Ok((x0, em.int_min(x1, hi)?))
    };
    let schedule = schedule_of(em)?;
    // Dimension `a` in segments where the guards on it are decided (see
    // `KernelSchedule::segments`):
    // the tiles inside a pad's interior then need no check per element.
    // (from, to, the fact that the variable lies in from..to, when both are constants)
    type Segment<'c> = (IntValue<'c>, IntValue<'c>, Option<(i64, i64)>);
    let a_segments: Vec<Segment<'c>> = if a == 0 {
        vec![(range(0).0, range(0).1, None)]
    } else {
        schedule.segments[a]
            .iter()
            .map(|&(s, e)| (em.i64c(s), em.i64c(e), Some((s, e))))
            .collect()
    };
    let mut a_tiles = |em: &Emitter<'c>, a_lo: IntValue<'c>, a_hi: IntValue<'c>| -> Result<()> {
        // A stack tile for each copy of the loops (one per segment): with one for all, its
        // many uses exceeded what LLVM's capture tracking follows, and LLVM then guarded the
        // tile's fill against overlapping the input and vectorized it into gathers.
        let buf = if whole_tiles {
            Some(em.line_buffer(storage(em.ctx, k.out.dtype), edge * edge)?)
        } else {
            None
        };
        let (b_lo, b_hi) = range(inner);
        em.range_loop_ptr(s_a, a_lo, a_hi, edge as i64, &mut |em: &Emitter<'c>| {
            let (a0, a1) = tile(em, s_a, a_hi)?;
            em.range_loop_ptr(s_b, b_lo, b_hi, edge as i64, &mut |em: &Emitter<'c>| {
                let (b0, b1) = tile(em, s_b, b_hi)?;
                // Along `a` innermost: the reads are contiguous there, so that loop vectorizes
                // (measured against the other order: conv 7x7's output transpose 46 -> 29 ms,
                // conv 3x3's transposing pad 30 -> 22 ms, its output transpose 12 -> 15 ms).
                let mut elementwise = |em: &Emitter<'c>| -> Result<()> {
                    em.range_loop(inner, b0, b1, 1, &mut |em: &Emitter<'c>| {
                        em.range_loop(a, a0, a1, 1, &mut |em: &Emitter<'c>| store(em))
                    })
                };
                let Some(buf) = buf else {
                    return elementwise(em);
                };
                // A whole tile: its values into the stack tile (rows along `a`, contiguous
                // reads and writes), then 16 vectors transposed in registers and stored along
                // the innermost dimension.
                let full_a =
                    em.b.build_int_compare(
                        IntPredicate::EQ,
                        a1,
                        em.b.build_int_add(a0, em.i64c(edge as i64), "af")
                            .map_err(llvm)?,
                        "fa",
                    )
                    .map_err(llvm)?;
                let full_b =
                    em.b.build_int_compare(
                        IntPredicate::EQ,
                        b1,
                        em.b.build_int_add(b0, em.i64c(edge as i64), "bf")
                            .map_err(llvm)?,
                        "fb",
                    )
                    .map_err(llvm)?;
                let full = em.b.build_and(full_a, full_b, "full").map_err(llvm)?;
                let (t, e, j) = (
                    em.ctx.append_basic_block(em.f, "tile"),
                    em.ctx.append_basic_block(em.f, "edge"),
                    em.ctx.append_basic_block(em.f, "tiled"),
                );
                em.b.build_conditional_branch(full, t, e).map_err(llvm)?;
                em.b.position_at_end(t);
                whole_tile(em, k, (a, edge), (a0, b0), buf, out)?;
                em.b.build_unconditional_branch(j).map_err(llvm)?;
                em.b.position_at_end(e);
                elementwise(em)?;
                em.b.build_unconditional_branch(j).map_err(llvm)?;
                em.b.position_at_end(j);
                Ok(())
            })
        })
    };
    let mut tiles = |em: &Emitter<'c>| -> Result<()> {
        for &(a_lo, a_hi, fact) in &a_segments {
            if let Some((s, e)) = fact {
                em.facts.borrow_mut().push((a, s, e));
            }
            let r = a_tiles(em, a_lo, a_hi);
            if fact.is_some() {
                em.facts.borrow_mut().pop();
            }
            r?;
        }
        Ok(())
    };
    // The other dimensions, outside the tiles; those after the first in segments where the
    // guards on them are decided.
    fn outer<'c>(
        em: &Emitter<'c>,
        d: usize,
        (skip, inner): (usize, usize),
        range: &dyn Fn(usize) -> (IntValue<'c>, IntValue<'c>),
        segments: &dyn Fn(usize) -> Vec<(i64, i64)>,
        tiles: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
    ) -> Result<()> {
        if d == inner {
            return tiles(em);
        }
        if d == skip {
            return outer(em, d + 1, (skip, inner), range, segments, tiles);
        }
        let mut next = |em: &Emitter<'c>| outer(em, d + 1, (skip, inner), range, segments, tiles);
        if d == 0 {
            let (from, to) = range(d);
            em.range_loop(d, from, to, 1, &mut next)
        } else {
            em.segmented(d, &segments(d), &mut next)
        }
    }
    let segments = |d: usize| schedule.segments[d].clone();
    outer(em, 0, (a, inner), &range, &segments, &mut tiles)
}

/// One whole `edge` x `edge` tile of kernel `k` (one output of 4-byte elements, no
/// reductions) at `a0` along dimension `a` and `b0` along the innermost one (the variables of
/// the other dimensions set): its values computed into the stack tile `buf`, row `b` holding
/// positions `a0..a0 + edge` (contiguous reads of the input), then the rows transposed in
/// registers and each column stored as one vector along the innermost dimension.
pub(super) fn whole_tile<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    (a, edge): (usize, usize),
    (a0, b0): (IntValue<'c>, IntValue<'c>),
    buf: PointerValue<'c>,
    out: PointerValue<'c>,
) -> Result<()> {
    let inner = k.out.rank() - 1;
    let st = storage(em.ctx, k.out.dtype);
    let t = edge as i64;
    let end = |x: IntValue<'c>| em.b.build_int_add(x, em.i64c(t), "e").map_err(llvm);
    em.range_loop(inner, b0, end(b0)?, 1, &mut |em: &Emitter<'c>| {
        em.range_loop(a, a0, end(a0)?, 1, &mut |em: &Emitter<'c>| {
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            let bi = em.b.build_int_sub(em.var(inner)?, b0, "bi").map_err(llvm)?;
            let ai = em.b.build_int_sub(em.var(a)?, a0, "ai").map_err(llvm)?;
            let at =
                em.b.build_int_add(
                    em.b.build_int_mul(bi, em.i64c(t), "r").map_err(llvm)?,
                    ai,
                    "at",
                )
                .map_err(llvm)?;
            // SAFETY (of the emitted code): bi and ai are below the edge.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[at], "tp") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })
    })?;
    let vt = vector_of(st, edge)?;
    let rows: Vec<inkwell::values::VectorValue<'c>> = (0..t)
        .map(|r| {
            // SAFETY (of the emitted code): row r of the tile is in the buffer.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[em.i64c(r * t)], "tr") }
                .map_err(llvm)?;
            let l = em.b.build_load(vt, p, "row").map_err(llvm)?;
            l.as_instruction_value()
                .ok_or_else(|| Error::Llvm("a load is an instruction".into()))?
                .set_alignment(em.target.cache_line as u32)
                .map_err(llvm)?;
            Ok(l.into_vector_value())
        })
        .collect::<Result<_>>()?;
    let cols = gemm::transpose_vectors(em, rows)?;
    let ost = strides(&k.out.shape);
    em.b.build_store(em.vars[inner], b0).map_err(llvm)?;
    for (i, col) in cols.into_iter().enumerate() {
        let ai =
            em.b.build_int_add(a0, em.i64c(i as i64), "ac")
                .map_err(llvm)?;
        em.b.build_store(em.vars[a], ai).map_err(llvm)?;
        let idx = em.position(&ost)?;
        // SAFETY (of the emitted code): the tile is whole, so positions b0..b0 + edge along the
        // innermost dimension are in the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "to") }.map_err(llvm)?;
        let s = em.b.build_store(p, col).map_err(llvm)?;
        s.set_alignment(4).map_err(llvm)?;
    }
    Ok(())
}

/// A strip's positions, and the narrower strips' past the last of them.
type StripWidths = (i64, i64);

/// A reduction a strip computes, and whether it is a fold the loop over the positions reads
/// in place ([`kiln_kernel::loop_schedule::Strips::gathered`]).
type Column<'e> = (&'e Expr, bool);

/// The strips' widths (wide, then the tail's) and the reductions of `k`'s bodies its loop over
/// dimension `d` computes in strips (see [`strips`]), as its loop schedule decided them
/// ([`kiln_kernel::loop_schedule::column_strips`]); `None` without strips along `d`.
pub(super) fn column_reduces<'e>(
    em: &Emitter<'_>,
    k: &'e Kernel,
    d: usize,
) -> Result<Option<(StripWidths, Vec<Column<'e>>)>> {
    let Some(st) = schedule_of(em)?.strips.as_ref().filter(|st| st.dim == d) else {
        return Ok(None);
    };
    let reduces: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .flat_map(hoistable_reduces)
        .collect();
    let columns = st
        .reduces
        .iter()
        .map(|key| {
            reduces
                .iter()
                .copied()
                .find(|r| kiln_kernel::fold::fold_key(r) == *key)
                .map(|r| (r, st.gathered.contains(key)))
                .ok_or_else(|| {
                    Error::Llvm("a column strip's reduction is not in the kernel".into())
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(((st.width as i64, st.tail as i64), columns)))
}

/// The innermost output loop (variable `d` over `range`) in strips of `width` consecutive
/// positions: each reduction of `columns` runs once per strip with one accumulator per
/// position, so its loop reads a contiguous run of the row it is at (one vector) instead of
/// one strided element per output; then each position's body runs with the sums ready. The
/// positions past the last whole strip run in strips of `narrow` positions, and those past the
/// last of these one by one.
pub(super) fn strips<'c>(
    em: &Emitter<'c>,
    d: usize,
    range: (IntValue<'c>, IntValue<'c>),
    (width, narrow): (i64, i64),
    columns: &[Column<'_>],
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    let n = em.b.build_int_sub(range.1, range.0, "n").map_err(llvm)?;
    let tail =
        em.b.build_int_signed_rem(n, em.i64c(width), "tail")
            .map_err(llvm)?;
    let end = em.b.build_int_sub(range.1, tail, "end").map_err(llvm)?;
    let s_j = em.entry_alloca(i64t.into())?;
    em.range_loop_ptr(s_j, range.0, end, width, &mut |em: &Emitter<'c>| {
        let j0 =
            em.b.build_load(i64t, s_j, "j0")
                .map_err(llvm)?
                .into_int_value();
        let at = |em: &Emitter<'c>, w: i64| -> Result<()> {
            let j = em.b.build_int_add(j0, em.i64c(w), "j").map_err(llvm)?;
            em.b.build_store(em.vars[d], j).map_err(llvm)?;
            Ok(())
        };
        let mut sums: Vec<(
            crate::kernel::ValueKey,
            Vec<PointerValue<'c>>,
            BasicTypeEnum<'c>,
        )> = Vec::new();
        // The gathered folds' results, read in the arrays of the positions they were computed
        // in (see `Emitter::fold_strip`); the other folds' are copied out per position below,
        // like the sums.
        let mut arrays = Vec::with_capacity(columns.len());
        for &(r, gathered) in columns {
            if let Expr::Fold { .. } = r {
                let folded = em.fold_strip(r, width as usize, (d, j0))?;
                if gathered {
                    arrays.extend(folded);
                    continue;
                }
                for (key, array, ct) in folded {
                    let slots = (0..width)
                        .map(|w| {
                            // SAFETY (of the emitted code): `w` is below the array's length.
                            unsafe { em.b.build_in_bounds_gep(ct, array, &[em.i64c(w)], "set") }
                                .map_err(llvm)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    sums.push((key, slots, ct));
                }
                continue;
            }
            let Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } = r
            else {
                continue;
            };
            let ct: BasicTypeEnum = if dtype.is_float() && dtype.mini().is_none() {
                em.ftype(*dtype).into()
            } else {
                em.itype(*dtype).into()
            };
            let accs = (0..width)
                .map(|_| em.entry_alloca(ct))
                .collect::<Result<Vec<_>>>()?;
            let i = em.expr(init)?;
            for a in &accs {
                em.b.build_store(*a, i).map_err(llvm)?;
            }
            let sum = sum_tree::Sum::new(*kind, *dtype, ct);
            let none = std::collections::BTreeSet::new();
            em.accumulate(vars, &[], &none, &sum, &accs, &mut |em, accs| {
                for (w, acc) in accs.iter().enumerate() {
                    at(em, w as i64)?;
                    let x = em.expr(body)?;
                    let a = em.b.build_load(ct, *acc, "a").map_err(llvm)?;
                    // In order along the column: the positions' chains are then vectorized
                    // side by side (one vector per row), not each along its strided column.
                    let c = em.combine_with(*kind, *dtype, a, x, false)?;
                    em.b.build_store(*acc, c).map_err(llvm)?;
                }
                Ok(())
            })?;
            sums.push((value_key(r), accs, ct));
        }
        // Each reduction's sums into an array, then the positions' bodies as a loop over the
        // strip: one copy of the body however wide the strip (the sums stay in registers while
        // they accumulate).
        for (key, accs, ct) in sums {
            let arr =
                em.entry_alloca(inkwell::types::BasicType::array_type(&ct, width as u32).into())?;
            for (w, acc) in accs.iter().enumerate() {
                let v = em.b.build_load(ct, *acc, "sum").map_err(llvm)?;
                let p = unsafe {
                    em.b.build_in_bounds_gep(ct, arr, &[em.i64c(w as i64)], "at")
                }
                .map_err(llvm)?;
                em.b.build_store(p, v).map_err(llvm)?;
            }
            arrays.push((key, arr, ct));
        }
        let s_w = em.entry_alloca(i64t.into())?;
        em.labeled_loop("strip", s_w, (em.i64c(0), em.i64c(width)), 1, &mut |em| {
            let w =
                em.b.build_load(i64t, s_w, "w")
                    .map_err(llvm)?
                    .into_int_value();
            let j = em.b.build_int_add(j0, w, "j").map_err(llvm)?;
            em.b.build_store(em.vars[d], j).map_err(llvm)?;
            let mark = em.hoisted.borrow().len();
            for (key, arr, ct) in &arrays {
                let p = unsafe { em.b.build_in_bounds_gep(*ct, *arr, &[w], "at") }.map_err(llvm)?;
                let v = em.b.build_load(*ct, p, "sum").map_err(llvm)?;
                em.hoisted
                    .borrow_mut()
                    .push(((*key).clone(), Hoisted::Value(v)));
            }
            store(em)?;
            em.hoisted.borrow_mut().truncate(mark);
            Ok(())
        })?;
        Ok(())
    })?;
    if narrow < width {
        return strips(em, d, (end, range.1), (narrow, narrow), columns, store);
    }
    let was = em.in_order.replace(true);
    em.range_loop(d, end, range.1, 1, &mut |em: &Emitter<'c>| store(em))?;
    em.in_order.set(was);
    Ok(())
}
