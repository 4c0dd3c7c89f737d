//! One kernel as an LLVM function: its entry and row range, GEMM contraction wrappers,
//! epilogues, online softmax, plane epilogues and scatters.

use super::*;

/// Emits `void name(ptr inputs, ptr out, i64 lo, i64 hi)` computing rows `lo..hi` of the
/// kernel's outermost loop (all of it for a scalar output).
///
/// `alias` is `(pairs, slots)` for a kernel compiled in place: of the `slots` pointers of its
/// table (inputs, then extra outputs), input `q` of each pair `(q, o)` is output `o`'s buffer
/// (0: `out`, then the extra outputs), and the kernel reads it through that output's pointer
/// (one pointer for that memory, so `out` stays `noalias`). `schedule` is a loop nest's loop
/// schedule (see [`kiln_kernel::loop_schedule`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_kernel<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    k: &Kernel,
    schedule: Option<&KernelSchedule>,
    target: Target,
    alias: Option<&Alias>,
    routines: Routines,
    shared_contraction: bool,
) -> Result<FunctionValue<'c>> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let i64t = ctx.i64_type();
    let f = kernel_function(ctx, m, name, target, shared_contraction);
    let b = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    b.position_at_end(entry);
    // A GEMM's variables are its epilogue's (none without one).
    let nvars = k.vars;
    let vars = (0..nvars)
        .map(|_| b.build_alloca(i64t, "var"))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(llvm)?;
    for v in &vars {
        b.build_store(*v, i64t.const_zero()).map_err(llvm)?;
    }
    let inputs = f.get_nth_param(0).expect("declared").into_pointer_value();
    let out = f.get_nth_param(1).expect("declared").into_pointer_value();
    // Only kernels worth splitting across threads take their row range at run time; the
    // others keep constant trip counts, which LLVM optimizes faster and better. A function
    // shared by products of different contraction lengths always takes it: whether a product
    // is split depends on its work, so on its length.
    let Launch { rows, split, .. } = launch_of(k, schedule, target);
    let (lo, hi) = if shared_contraction || split {
        (
            f.get_nth_param(2).expect("declared").into_int_value(),
            f.get_nth_param(3).expect("declared").into_int_value(),
        )
    } else {
        (i64t.const_zero(), i64t.const_int(rows as u64, false))
    };
    let mut em = Emitter::new(ctx, m, b, f, inputs, target, routines);
    em.vars = vars;
    em.schedule = schedule.cloned();
    let mut extents: Vec<Option<usize>> = k.out.shape.iter().map(|&e| Some(e)).collect();
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        nonpositive_exps(body, &mut extents, &mut em.nonpositive);
    }
    if let Some((pairs, slots)) = alias.filter(|a| !a.0.is_empty()) {
        // Each in-place input's slot holds its output's pointer: `out`, or an extra output's
        // (whose own slot is left as it is).
        let targets: Vec<(usize, PointerValue<'c>)> = pairs
            .iter()
            .map(|&(q, o)| {
                if o == 0 {
                    return Ok((q, out));
                }
                let slot = k.extra[o - 1].slot as i64;
                // SAFETY (of the emitted code): the slot is in the runtime's pointer table.
                let at = unsafe {
                    em.b.build_in_bounds_gep(ptr, inputs, &[em.i64c(slot)], "slot")
                }
                .map_err(llvm)?;
                let p = em.b.build_load(ptr, at, "xo").map_err(llvm)?;
                Ok((q, p.into_pointer_value()))
            })
            .collect::<Result<_>>()?;
        em.swap_pointer_table(*slots, &|i| targets.iter().find(|t| t.0 == i).map(|t| t.1))?;
    }
    match k.schedule {
        Schedule::Nest => {
            // Extra outputs are fresh buffers or arena slots apart from every live input,
            // except one written in place of a donated input (which the kernel reads through
            // it): then no scopes.
            let extra_in_place = alias.is_some_and(|a| a.0.iter().any(|&(_, o)| o > 0));
            if !k.extra.is_empty() && !extra_in_place {
                let md = |s: &str| ctx.metadata_string(s);
                let domain = ctx.metadata_node(&[md(&format!("kiln.{name}.domain")).into()]);
                let scope = |what: &str| {
                    let s = ctx
                        .metadata_node(&[md(&format!("kiln.{name}.{what}")).into(), domain.into()]);
                    ctx.metadata_node(&[s.into()])
                };
                em.scopes.set(Some((scope("inputs"), scope("extra"))));
            }
            emit_nest(&em, k, out, lo, hi)?
        }
        Schedule::Gemm {
            batch,
            m: rows,
            n,
            k: kk,
            ref conv,
            a_trans,
            b_trans,
            epilogue,
            ref chain,
            ref strides,
            ref store,
            ref zero,
            ref unread,
        } => {
            let g = gemm_of(k, schedule, target).expect("a GEMM");
            let (bl, split_columns) = (g.blocking, g.split_columns);
            // In place on a donated X: the epilogue X -/+ P s becomes the GEMM's update mode.
            let in_place = alias.and_then(|a| a.0.first());
            let update = match in_place.and_then(|&(q, _)| crate::fuse::gemm_update(k, q)) {
                Some((scale, subtract)) => Some((em.expr(&scale)?, subtract)),
                None if in_place.is_some() => {
                    return Err(Error::Llvm(format!(
                        "{name}: a GEMM compiled in place needs an update epilogue"
                    )));
                }
                None => None,
            };
            let logits = chain.as_ref().and_then(|c| c.online.as_ref());
            let mut apply = |r: (IntValue<'c>, IntValue<'c>),
                             c: (IntValue<'c>, IntValue<'c>),
                             at: PointerValue<'c>,
                             row0: IntValue<'c>,
                             online: Option<&gemm::OnlineBlock<'c>>| {
                let product = epilogue.expect("only called with an epilogue");
                match (conv, online.zip(logits)) {
                    (_, Some((block, h))) => {
                        emit_online_softmax(&em, k, product, h, at, r, c, block)
                    }
                    (Some(p), _) if p.planes => {
                        emit_plane_epilogue(&em, k, product, at, r, c, rows)
                    }
                    _ => emit_epilogue(&em, k, product, (at, row0), r, c, batch * rows, n),
                }
            };
            let chain = chain.as_ref().map(|c| gemm::Chain {
                bl: g.chain.expect("a chained product's blocking"),
                n: c.n as i64,
                b: c.b as i64,
                b_trans: c.b_trans,
                b_strides: c.b_strides.as_ref(),
                out,
                online: c.online.is_some(),
                // The row variable is the row within its batch when the rows per batch are the
                // position's next-to-last dimension.
                masked: c
                    .masked
                    .filter(|_| k.out.rank() >= 2 && k.out.shape[k.out.rank() - 2] == rows),
            });
            gemm::emit(
                &em,
                k.out.dtype,
                bl,
                (rows as i64, n as i64, kk as i64),
                shared_contraction.then(|| f.get_nth_param(5).expect("declared").into_int_value()),
                (a_trans, b_trans),
                strides,
                store.as_ref().map(|s| &s.strides),
                conv.as_ref(),
                out,
                f.get_nth_param(4).expect("declared").into_pointer_value(),
                (lo, hi),
                split_columns,
                epilogue
                    .filter(|_| update.is_none())
                    .map(|_| &mut apply as gemm::Epilogue<'_, 'c>),
                update,
                chain,
                zero.as_ref(),
                unread.as_deref(),
            )?;
        }
        Schedule::Scatter {
            ref updates,
            ref target,
            kind,
        } => emit_scatter(&em, k, updates, target, kind, out)?,
        Schedule::SelectScatter {
            ref grid,
            ref window,
            ref strides,
            ref pad_low,
            select,
            kind,
        } => emit_select_scatter(&em, k, grid, window, strides, pad_low, select, kind, out)?,
    }
    em.b.build_return(None).map_err(llvm)?;
    Ok(f)
}

/// A kernel's function `name`, declared: `void (ptr inputs, ptr noalias out, i64 lo, i64 hi,
/// ptr scratch)`, and with `shared_contraction` an `i64` contraction length after them, private
/// to its module and never inlined (it is compiled once for the kernels that call it: see
/// [`contraction_groups`]).
pub(super) fn kernel_function<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    target: Target,
    shared_contraction: bool,
) -> FunctionValue<'c> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let i64t = ctx.i64_type();
    let mut params = vec![ptr.into(), ptr.into(), i64t.into(), i64t.into(), ptr.into()];
    if shared_contraction {
        params.push(i64t.into());
    }
    let f = m.add_function(
        name,
        ctx.void_type().fn_type(&params, false),
        shared_contraction.then_some(Linkage::Private),
    );
    let attr = |name: &str| ctx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0);
    f.add_attribute(AttributeLoc::Param(1), attr("noalias"));
    if shared_contraction {
        f.add_attribute(AttributeLoc::Function, attr("noinline"));
    }
    host_attributes(ctx, f, target);
    f
}

/// Kernel `name` as a call of `shared` (a kernel emitted with `shared_contraction`) with
/// contraction length `k`.
pub(super) fn emit_contraction_wrapper<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    shared: FunctionValue<'c>,
    k: usize,
    target: Target,
) -> Result<()> {
    let f = kernel_function(ctx, m, name, target, false);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(f, "entry"));
    let mut args: Vec<inkwell::values::BasicMetadataValueEnum<'c>> =
        f.get_param_iter().map(Into::into).collect();
    args.push(ctx.i64_type().const_int(k as u64, false).into());
    b.build_call(shared, &args, "").map_err(llvm)?;
    b.build_return(None).map_err(llvm)?;
    Ok(())
}

/// For each of the kernels `ks` (compiled with in-place outputs `aliases`), the first kernel
/// whose matrix product differs from its own only in the contraction length (`Some(i)` for the
/// first itself), when there is another such kernel: they share one function taking the
/// length as a parameter (an MLP's layers of equal width: `[256, 784] x [784, 1024]` and
/// `[256, 1024] x [1024, 1024]`, both with a bias and a ReLU), and each kernel is a call of
/// it. The function is emitted with the first kernel's GEMM schedule on `info`, so kernels
/// share it only where the schedule is the same for both: a short contraction may take
/// another tile ([`kiln_kernel::target::TallTile::min_steps`]; the MLP step's 10-step
/// `dlogits · W3ᵀ` and 1024-step `dz2 · W2ᵀ`). Convolutions and empty contractions keep their
/// own.
pub(super) fn contraction_groups(
    ks: &[Option<Kernel>],
    aliases: &[Alias],
    info: &TargetInfo,
) -> Vec<Option<usize>> {
    let key = |k: &Kernel| -> Option<(Kernel, GemmSchedule)> {
        match k.schedule {
            Schedule::Gemm {
                conv: None,
                chain: None,
                k: kk,
                ..
            } if kk > 0 => {
                let mut key = k.clone();
                if let Schedule::Gemm { k: kk, .. } = &mut key.schedule {
                    *kk = 0;
                }
                Some((key, gemm_schedule(k, info)?))
            }
            _ => None,
        }
    };
    let keys: Vec<Option<(Kernel, GemmSchedule)>> =
        ks.iter().map(|k| k.as_ref().and_then(key)).collect();
    let first = first_equal(&keys, aliases);
    first
        .iter()
        .map(|&f| {
            let f = f?;
            (first.iter().filter(|&&g| g == Some(f)).count() > 1).then_some(f)
        })
        .collect()
}

/// Sets the loop variables of dimensions `dims` of `shape` from `x`, their flat (row-major)
/// index.
pub(super) fn set_index_vars<'c>(
    em: &Emitter<'c>,
    x: IntValue<'c>,
    shape: &[usize],
    dims: std::ops::Range<usize>,
) -> Result<()> {
    for d in dims.clone() {
        let inner: usize = shape[d + 1..dims.end].iter().product();
        let v = if shape[d] == 1 {
            em.i64c(0)
        } else {
            let q =
                em.b.build_int_signed_div(x, em.i64c(inner as i64), "q")
                    .map_err(llvm)?;
            if d == dims.start {
                q
            } else {
                em.b.build_int_signed_rem(q, em.i64c(shape[d] as i64), "v")
                    .map_err(llvm)?
            }
        };
        em.b.build_store(em.vars[d], v).map_err(llvm)?;
    }
    Ok(())
}

/// Applies a GEMM kernel's epilogue (its body) in place to rows `rows` and columns `cols` of
/// the `[m, n]` product, which the body reads as input `product`: stored at `out` from row
/// `row0` on (0 for the kernel's output; a block's first row for a chained GEMM's block
/// buffer).
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_epilogue<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    (out, row0): (PointerValue<'c>, IntValue<'c>),
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    m: usize,
    n: usize,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    // The kernel's inputs with the product (this kernel's output buffer) after them.
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(out))?;
    // The elements before `out` (none when it holds the product from row 0).
    let first = match row0.get_zero_extended_constant() {
        Some(0) => None,
        _ => Some(
            em.b.build_int_mul(row0, em.i64c(n as i64), "first")
                .map_err(llvm)?,
        ),
    };
    em.shifted.set(first.map(|f| (product, f)));
    let shape = &k.out.shape;
    let split = crate::fuse::row_split(shape, m, n).ok_or_else(|| {
        Error::Llvm(format!(
            "epilogue over {shape:?} is not a [{m}, {n}] matrix"
        ))
    })?;
    // Dimension d of the output from a row (d < split) or column index.
    let set_vars = |em: &Emitter<'c>, x: IntValue<'c>, dims: std::ops::Range<usize>| {
        set_index_vars(em, x, shape, dims)
    };
    let (s_r, s_c) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(shape);
    em.range_loop_ptr(s_r, rows.0, rows.1, 1, &mut |em: &Emitter<'c>| {
        let r =
            em.b.build_load(i64t, s_r, "r")
                .map_err(llvm)?
                .into_int_value();
        set_vars(em, r, 0..split)?;
        // The row's reductions (a softmax's max and sum) before any of its elements is
        // overwritten: the block holds whole rows (crate::fuse::row_epilogue).
        let mark = em.hoist(std::iter::once(&k.body), split)?;
        em.range_loop_ptr(s_c, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let c =
                em.b.build_load(i64t, s_c, "c")
                    .map_err(llvm)?
                    .into_int_value();
            set_vars(em, c, split..shape.len())?;
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            // The position from the variables, as the body's loads of the product at their
            // own position compute it: LLVM then sees each element read before it is
            // overwritten at the same address, and vectorizes without run-time overlap checks
            // (which fail here, since the row is read and written in place).
            let idx = em.position(&ost)?;
            let idx = match first {
                Some(f) => em.b.build_int_sub(idx, f, "pi").map_err(llvm)?,
                None => idx,
            };
            // SAFETY (of the emitted code): idx is below m * n, the output's element count,
            // less the elements before `out`.
            let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        em.hoisted.borrow_mut().truncate(mark);
        Ok(())
    })?;
    em.inputs.set(saved);
    em.shifted.set(None);
    Ok(())
}

/// One block of a softmax computed online ([`crate::kernel::Chain::online`]): rows `rows` and
/// columns `cols` of the first product, stored at `p` (the block's first row and column first,
/// rows `block.ld` apart). For each row: its logits `h` (from the product, stored over it) and
/// their maximum; the row's running maximum raised to that; the exponentials from it (stored
/// over the logits, for the chained product) and their sum, added to the running sum rescaled
/// by `exp(old maximum - new maximum)`; and after the row's first block, the chained product's
/// row rescaled by the same. While a row's maximum is -inf (every logit so far masked out) its
/// exponentials are taken from 0, so they are 0 rather than NaN; if no finite logit comes, its
/// sum stays 0 and the division at the end gives NaN, as the softmax does.
///
/// The block's maximum is taken with a plain comparison (one `vmaxps` a vector) while whether
/// a logit is NaN is noted beside it (an unordered compare and a mask `or`), and a NaN seen
/// makes the maximum NaN after the loop: the maximum NaN-propagating `llvm.maximum` gives,
/// which on x86 took a compare, two masked moves and a blend besides the `vmaxps` per vector
/// (the sign of a zero maximum, which `llvm.maximum` orders and the comparison need not, does
/// not change `x - max` or its exponential).
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_online_softmax<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    logits: &Expr,
    p: PointerValue<'c>,
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    block: &gemm::OnlineBlock<'c>,
) -> Result<()> {
    let shape = &k.out.shape;
    let col = shape.len() - 1;
    let n = shape[col];
    let d = k.out.dtype;
    let ft = em.ftype(d);
    let i64t = em.ctx.i64_type();
    let own: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    // In the block buffer, rows are `ld` apart.
    let blocked: Vec<i64> = own
        .iter()
        .enumerate()
        .map(|(v, &s)| if v == col { s } else { s / n as i64 * block.ld })
        .collect();
    let h = crate::kernel::reindex_input(logits, product, (&own, &blocked), shape).ok_or_else(
        || {
            Error::Llvm(format!(
                "{}: the online softmax's logits read the product off their own position",
                k.out
            ))
        },
    )?;
    let blocked: Vec<usize> = blocked.iter().map(|&s| s as usize).collect();
    // Logits a mask may set to -inf take the exponential that selects 0 past the bottom.
    let exp_arg = ExpArg::nonpositive(super::loops::maskable(&h));
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(p))?;
    let b = &em.b;
    let shift = b
        .build_int_add(
            b.build_int_mul(rows.0, em.i64c(block.ld), "sr")
                .map_err(llvm)?,
            cols.0,
            "shift",
        )
        .map_err(llvm)?;
    em.shifted.set(Some((product, shift)));
    // The block buffer's element at the current position.
    let here = |em: &Emitter<'c>| -> Result<PointerValue<'c>> {
        let idx = em.position(&blocked)?;
        let idx = em.b.build_int_sub(idx, shift, "bi").map_err(llvm)?;
        // SAFETY (of the emitted code): the position lies in the block: its rows and columns.
        unsafe { em.b.build_in_bounds_gep(ft, p, &[idx], "pb") }.map_err(llvm)
    };
    let c = |v: f64| ft.const_float(v);
    let s_r = em.entry_alloca(i64t.into())?;
    let (acc_max, acc_sum) = (em.entry_alloca(ft.into())?, em.entry_alloca(ft.into())?);
    let bool_t = em.ctx.bool_type();
    let acc_nan = em.entry_alloca(bool_t.into())?;
    let load_f = |em: &Emitter<'c>, at: PointerValue<'c>| -> Result<FloatValue<'c>> {
        Ok(em
            .b
            .build_load(ft, at, "f")
            .map_err(llvm)?
            .into_float_value())
    };
    em.range_loop_ptr(s_r, rows.0, rows.1, 1, &mut |em: &Emitter<'c>| {
        let r =
            em.b.build_load(i64t, s_r, "r")
                .map_err(llvm)?
                .into_int_value();
        set_index_vars(em, r, shape, 0..col)?;
        em.b.build_store(acc_max, c(f64::NEG_INFINITY))
            .map_err(llvm)?;
        em.b.build_store(acc_nan, bool_t.const_zero())
            .map_err(llvm)?;
        em.range_loop(col, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let h = em.expr(&h)?;
            em.b.build_store(here(em)?, h).map_err(llvm)?;
            let m = load_f(em, acc_max)?;
            let (m, nan) = max_noting_nan(em, m, h.into_float_value())?;
            em.b.build_store(acc_max, m).map_err(llvm)?;
            let seen = em.b.build_load(bool_t, acc_nan, "seen").map_err(llvm)?;
            let seen =
                em.b.build_or(seen.into_int_value(), nan, "seen")
                    .map_err(llvm)?;
            em.b.build_store(acc_nan, seen).map_err(llvm)?;
            Ok(())
        })?;
        let b = &em.b;
        let seen = b
            .build_load(bool_t, acc_nan, "seen")
            .map_err(llvm)?
            .into_int_value();
        let block_max = b
            .build_select(seen, c(f64::NAN), load_f(em, acc_max)?, "bm")
            .map_err(llvm)?;
        b.build_store(acc_max, block_max).map_err(llvm)?;
        let at = |what: PointerValue<'c>| -> Result<PointerValue<'c>> {
            let i = b.build_int_sub(r, block.base, "rl").map_err(llvm)?;
            // SAFETY (of the emitted code): the row lies in its batch, whose rows the state
            // arrays hold.
            unsafe { b.build_in_bounds_gep(ft, what, &[i], "st") }.map_err(llvm)
        };
        let old_max = b
            .build_select(
                block.first,
                c(f64::NEG_INFINITY),
                load_f(em, at(block.max)?)?,
                "m0",
            )
            .map_err(llvm)?;
        let m = load_f(em, acc_max)?;
        let new_max = em
            .combine_with(Combiner::Max, d, old_max, m.into(), false)?
            .into_float_value();
        let masked = b
            .build_float_compare(FloatPredicate::OEQ, new_max, c(f64::NEG_INFINITY), "none")
            .map_err(llvm)?;
        let from = b
            .build_select(masked, c(0.0), new_max, "from")
            .map_err(llvm)?
            .into_float_value();
        // The old state's scale, `exp(old maximum - new)`. While the old maximum is -inf (the
        // row's first block, or every logit so far masked out) the running sum and the chained
        // product's row are zeros (or NaN) and any finite scale keeps them: 1, from `exp(0)`,
        // rather than `exp(-inf)`, whose underflow costs a microcode assist on Intel cores
        // (a third of the online softmax's time in attention_8x8x512x64, once per row).
        let none_yet = b
            .build_float_compare(
                FloatPredicate::OEQ,
                old_max.into_float_value(),
                c(f64::NEG_INFINITY),
                "none0",
            )
            .map_err(llvm)?;
        let d_old = b
            .build_float_sub(old_max.into_float_value(), from, "dm")
            .map_err(llvm)?;
        let d_old = b
            .build_select(none_yet, c(0.0), d_old, "dm0")
            .map_err(llvm)?
            .into_float_value();
        let scale = em.exp_nonpositive(d, d_old)?;
        b.build_store(acc_sum, c(0.0)).map_err(llvm)?;
        em.range_loop(col, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let at = here(em)?;
            let x = load_f(em, at)?;
            let x = em.b.build_float_sub(x, from, "hd").map_err(llvm)?;
            let e = em.exp_known(exp_arg, d, x)?;
            em.b.build_store(at, e).map_err(llvm)?;
            let s = em.b.build_load(ft, acc_sum, "s").map_err(llvm)?;
            let s = em.combine_with(Combiner::Add, d, s, e.into(), true)?;
            em.b.build_store(acc_sum, s).map_err(llvm)?;
            Ok(())
        })?;
        let b = &em.b;
        let old_sum = b
            .build_select(block.first, c(0.0), load_f(em, at(block.sum)?)?, "s0")
            .map_err(llvm)?
            .into_float_value();
        let kept = b.build_float_mul(old_sum, scale, "sk").map_err(llvm)?;
        let new_sum = b
            .build_float_add(kept, load_f(em, acc_sum)?, "s1")
            .map_err(llvm)?;
        b.build_store(at(block.max)?, new_max).map_err(llvm)?;
        b.build_store(at(block.sum)?, new_sum).map_err(llvm)?;
        // The chained product's row, from the earlier blocks, rescaled to the new maximum.
        let not_first = b.build_not(block.first, "nf").map_err(llvm)?;
        let then = em.ctx.append_basic_block(em.f, "rescale");
        let join = em.ctx.append_basic_block(em.f, "rescaled");
        b.build_conditional_branch(not_first, then, join)
            .map_err(llvm)?;
        b.position_at_end(then);
        gemm::map_row(em, ft, (block.out, block.n2), r, &|em, v| {
            em.b.build_float_mul(v, scale, "os").map_err(llvm)
        })?;
        em.b.build_unconditional_branch(join).map_err(llvm)?;
        em.b.position_at_end(join);
        Ok(())
    })?;
    em.inputs.set(saved);
    em.shifted.set(None);
    Ok(())
}

/// The larger of the running maximum `m` and `h` by a plain comparison, `h > m ? h : m`
/// (marked free of NaNs and signed zeros, so LLVM's vectorizer takes it as a maximum reduction
/// and x86 as one `vmaxps`), and whether `h` is NaN: a NaN makes the comparison's result
/// poison, which the caller replaces by NaN once the loop has seen one (see
/// [`emit_online_softmax`]).
fn max_noting_nan<'c>(
    em: &Emitter<'c>,
    m: FloatValue<'c>,
    h: FloatValue<'c>,
) -> Result<(FloatValue<'c>, IntValue<'c>)> {
    use inkwell::values::FastMathFlags;
    let b = &em.b;
    let flags = FastMathFlags::NoNaNs | FastMathFlags::NoSignedZeros;
    let flag = |v: Option<inkwell::values::InstructionValue<'c>>| -> Result<()> {
        v.ok_or_else(|| Error::Llvm("a compare and a select are instructions".into()))?
            .set_fast_math_flags(flags)
            .map_err(llvm)
    };
    let gt = b
        .build_float_compare(FloatPredicate::OGT, h, m, "gt")
        .map_err(llvm)?;
    flag(gt.as_instruction_value())?;
    let max = b.build_select(gt, h, m, "mx").map_err(llvm)?;
    flag(max.as_instruction_value())?;
    let nan = b
        .build_float_compare(FloatPredicate::UNO, h, h, "nan")
        .map_err(llvm)?;
    Ok((max.into_float_value(), nan))
}

/// Applies the epilogue of a convolution's GEMM kernel whose `[N, O, OH, OW]` output is stored
/// by planes (see [`crate::kernel::ConvPatches::planes`]) in place to the product's rows `rows`
/// (pixels of one image, `per` to an image) and columns `cols` (output features), at `out`:
/// for each feature, a loop over the block's output rows and one along each row, so that the
/// innermost loop runs over consecutive elements.
pub(super) fn emit_plane_epilogue<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    out: PointerValue<'c>,
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    per: usize,
) -> Result<()> {
    let shape = &k.out.shape;
    if shape.len() != 4 || shape[2] * shape[3] != per {
        return Err(Error::Llvm(format!(
            "an epilogue stored by planes over {shape:?} is not [N, O, OH, OW] with {per} pixels \
             per image"
        )));
    }
    let i64t = em.ctx.i64_type();
    let b = &em.b;
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(out))?;
    let ow = em.i64c(shape[3] as i64);
    let load = |slot: PointerValue<'c>| -> Result<IntValue<'c>> {
        Ok(b.build_load(i64t, slot, "v")
            .map_err(llvm)?
            .into_int_value())
    };
    // The block's image, and its pixels within it.
    let image = b
        .build_int_signed_div(rows.0, em.i64c(per as i64), "img")
        .map_err(llvm)?;
    let first = b
        .build_int_mul(image, em.i64c(per as i64), "p0")
        .map_err(llvm)?;
    let p0 = b.build_int_sub(rows.0, first, "p0").map_err(llvm)?;
    let p1 = b.build_int_sub(rows.1, first, "p1").map_err(llvm)?;
    b.build_store(em.vars[0], image).map_err(llvm)?;
    let y0 = b.build_int_signed_div(p0, ow, "y0").map_err(llvm)?;
    let y1 = b
        .build_int_signed_div(
            b.build_int_add(p1, em.i64c(shape[3] as i64 - 1), "p1r")
                .map_err(llvm)?,
            ow,
            "y1",
        )
        .map_err(llvm)?;
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(shape);
    em.range_loop(1, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
        em.range_loop(2, y0, y1, 1, &mut |em: &Emitter<'c>| {
            let b = &em.b;
            let row = b
                .build_int_mul(load(em.vars[2])?, ow, "row")
                .map_err(llvm)?;
            // The row's pixels inside the block.
            let lo = b.build_int_sub(p0, row, "lo").map_err(llvm)?;
            let hi = b.build_int_sub(p1, row, "hi").map_err(llvm)?;
            let lo = em
                .intrinsic("llvm.smax", i64t.into(), &[lo.into(), em.i64c(0).into()])?
                .into_int_value();
            let hi = em
                .intrinsic("llvm.smin", i64t.into(), &[hi.into(), ow.into()])?
                .into_int_value();
            em.range_loop(3, lo, hi, 1, &mut |em: &Emitter<'c>| {
                let v = em.expr(&k.body)?;
                let v = em.store_value(k.out.dtype, v)?;
                // As in `emit_epilogue`: the position from the variables, as the body's load
                // of the product computes it.
                let idx = em.position(&ost)?;
                // SAFETY (of the emitted code): the variables index the output's shape.
                let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
                em.b.build_store(p, v).map_err(llvm)?;
                Ok(())
            })
        })
    })?;
    em.inputs.set(saved);
    Ok(())
}

pub(super) fn emit_scatter<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    updates: &[usize],
    target: &[Idx],
    kind: Combiner,
    out: PointerValue<'c>,
) -> Result<()> {
    let ctx = em.ctx;
    let d = k.out.dtype;
    let st = storage(ctx, d);
    let ptr = ctx.ptr_type(AddressSpace::default());
    // out = operand.
    // SAFETY (of the emitted code): input 0 is the operand, of the output's type.
    let slot = unsafe {
        em.b.build_in_bounds_gep(ptr, em.inputs.get(), &[em.i64c(0)], "slot")
    }
    .map_err(llvm)?;
    let src =
        em.b.build_load(ptr, slot, "src")
            .map_err(llvm)?
            .into_pointer_value();
    let bytes = (k.out.numel() * d.bytes()) as i64;
    if bytes > 0 {
        em.b.build_memcpy(out, 1, src, 1, em.i64c(bytes))
            .map_err(llvm)?;
    }
    let ost = strides(&k.out.shape);
    let vars: Vec<(usize, usize)> = updates.iter().copied().enumerate().collect();
    em.nest(&vars, &mut |em: &Emitter<'c>| {
        let mut ok = ctx.bool_type().const_int(1, false);
        let mut flat = em.i64c(0);
        for (dim, t) in target.iter().enumerate() {
            let v = em.idx(t)?;
            let inside = em.cond(&Cond::InRange(t.clone(), 0, k.out.shape[dim] as i64))?;
            ok = em.b.build_and(ok, inside, "ok").map_err(llvm)?;
            let term =
                em.b.build_int_mul(v, em.i64c(ost[dim] as i64), "t")
                    .map_err(llvm)?;
            flat = em.b.build_int_add(flat, term, "f").map_err(llvm)?;
        }
        let write = ctx.append_basic_block(em.f, "write");
        let done = ctx.append_basic_block(em.f, "done");
        em.b.build_conditional_branch(ok, write, done)
            .map_err(llvm)?;
        em.b.position_at_end(write);
        let upd = em.expr(&k.body)?;
        // SAFETY (of the emitted code): the target was checked to be inside the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[flat], "pt") }.map_err(llvm)?;
        let new = if kind == Combiner::Replace {
            upd
        } else {
            let raw = em.b.build_load(st, p, "old").map_err(llvm)?;
            let old = em.load_value(d, raw)?;
            em.combine(kind, d, old, upd)?
        };
        let v = em.store_value(d, new)?;
        em.b.build_store(p, v).map_err(llvm)?;
        em.b.build_unconditional_branch(done).map_err(llvm)?;
        em.b.position_at_end(done);
        Ok(())
    })
}

/// See [`Schedule::SelectScatter`]. Input 0 is the operand, 1 the source, 2 the init value.
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_select_scatter<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    grid: &[usize],
    window: &[usize],
    strides: &[i64],
    pad_low: &[i64],
    select: Cmp,
    kind: Combiner,
    out: PointerValue<'c>,
) -> Result<()> {
    let ctx = em.ctx;
    let d = k.out.dtype;
    let st = storage(ctx, d);
    let r = k.out.rank();
    let rt: BasicTypeEnum = if d.is_float() && d.mini().is_none() {
        em.ftype(d).into()
    } else {
        em.itype(d).into()
    };
    // out = init.
    let init = em.load(2, d, &vec![0; k.vars], 0)?;
    let init_raw = em.store_value(d, init)?;
    let n = k.out.numel() as i64;
    let flat = em.entry_alloca(ctx.i64_type().into())?;
    em.range_loop_ptr(flat, em.i64c(0), em.i64c(n), 1, &mut |em: &Emitter<'c>| {
        let i =
            em.b.build_load(ctx.i64_type(), flat, "i")
                .map_err(llvm)?
                .into_int_value();
        // SAFETY (of the emitted code): i < the output's element count.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[i], "po") }.map_err(llvm)?;
        em.b.build_store(p, init_raw).map_err(llvm)?;
        Ok(())
    })?;
    let best_v = em.entry_alloca(rt)?;
    let best_i = em.entry_alloca(ctx.i64_type().into())?;
    let have = em.entry_alloca(ctx.bool_type().into())?;
    let ost = strides_of(&k.out.shape);
    let grid_vars: Vec<(usize, usize)> = grid.iter().copied().enumerate().collect();
    let win_vars: Vec<(usize, usize)> = window
        .iter()
        .enumerate()
        .map(|(i, &w)| (r + i, w))
        .collect();
    em.nest(&grid_vars, &mut |em: &Emitter<'c>| {
        em.b.build_store(have, ctx.bool_type().const_zero())
            .map_err(llvm)?;
        em.nest(&win_vars, &mut |em: &Emitter<'c>| {
            let mut ok = ctx.bool_type().const_int(1, false);
            let mut pos = em.i64c(0);
            for dim in 0..r {
                let p = Idx::Add(vec![
                    Idx::Mul(Box::new(Idx::Var(dim)), strides[dim]),
                    Idx::Const(-pad_low[dim]),
                    Idx::Var(r + dim),
                ]);
                ok =
                    em.b.build_and(
                        ok,
                        em.cond(&Cond::InRange(p.clone(), 0, k.out.shape[dim] as i64))?,
                        "ok",
                    )
                    .map_err(llvm)?;
                let term =
                    em.b.build_int_mul(em.idx(&p)?, em.i64c(ost[dim]), "t")
                        .map_err(llvm)?;
                pos = em.b.build_int_add(pos, term, "pos").map_err(llvm)?;
            }
            let visit = ctx.append_basic_block(em.f, "visit");
            let next = ctx.append_basic_block(em.f, "next");
            em.b.build_conditional_branch(ok, visit, next)
                .map_err(llvm)?;
            em.b.position_at_end(visit);
            let cand = em.load_at(0, d, pos)?;
            let cur = em.b.build_load(rt, best_v, "cur").map_err(llvm)?;
            let keep = em
                .op(&Ew::Cmp(select), d, DType::Pred, &[cur, cand])?
                .into_int_value();
            let had =
                em.b.build_load(ctx.bool_type(), have, "had")
                    .map_err(llvm)?
                    .into_int_value();
            let keep = em.b.build_and(keep, had, "keep").map_err(llvm)?;
            let v = em.b.build_select(keep, cur, cand, "v").map_err(llvm)?;
            let prev =
                em.b.build_load(ctx.i64_type(), best_i, "pi")
                    .map_err(llvm)?;
            let idx =
                em.b.build_select(keep, prev, pos.into(), "bi")
                    .map_err(llvm)?;
            em.b.build_store(best_v, v).map_err(llvm)?;
            em.b.build_store(best_i, idx).map_err(llvm)?;
            em.b.build_store(have, ctx.bool_type().const_int(1, false))
                .map_err(llvm)?;
            em.b.build_unconditional_branch(next).map_err(llvm)?;
            em.b.position_at_end(next);
            Ok(())
        })?;
        let found =
            em.b.build_load(ctx.bool_type(), have, "found")
                .map_err(llvm)?
                .into_int_value();
        let write = ctx.append_basic_block(em.f, "write");
        let done = ctx.append_basic_block(em.f, "done");
        em.b.build_conditional_branch(found, write, done)
            .map_err(llvm)?;
        em.b.position_at_end(write);
        let src = em.expr(&k.body)?;
        let at =
            em.b.build_load(ctx.i64_type(), best_i, "at")
                .map_err(llvm)?
                .into_int_value();
        // SAFETY (of the emitted code): the selected position is inside the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[at], "pt") }.map_err(llvm)?;
        let raw = em.b.build_load(st, p, "old").map_err(llvm)?;
        let old = em.load_value(d, raw)?;
        let new = em.combine(kind, d, old, src)?;
        em.b.build_store(p, em.store_value(d, new)?).map_err(llvm)?;
        em.b.build_unconditional_branch(done).map_err(llvm)?;
        em.b.position_at_end(done);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products differing only in their contraction length share one function where the
    /// target's GEMM schedule is the same for all of them: on the reference target 10, 300 and
    /// 1024 steps do; on an Intel target with AVX-512, whose tall tile starts at 256 steps, the
    /// 10-step product keeps a function of its own and the other two share one.
    #[test]
    fn products_share_a_function_only_where_their_schedules_agree() {
        let steps = [10, 300, 1024];
        let mut params = Vec::new();
        let mut body = String::new();
        for (i, k) in steps.iter().enumerate() {
            let (a, b) = (2 * i, 2 * i + 1);
            params.push(format!("%{a}: f32[64,{k}], %{b}: f32[{k},1024]"));
            body += &format!(
                "  %{} = dot_general %{a}, %{b} {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[64,1024]\n",
                6 + i
            );
        }
        let src = format!(
            "func @main({}) -> (f32[64,1024], f32[64,1024], f32[64,1024]) {{\n{body}  return %6, %7, %8\n}}\n",
            params.join(", ")
        );
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let (_, fused) =
            kiln_kernel::pipeline::lowered_for_printing(&f, &kiln_kernel::Options::default())
                .unwrap();
        let ks = &fused.kernels;
        // The kernel of each product, by its contraction length.
        let of = |k: usize| {
            ks.iter()
                .position(|x| {
                    x.as_ref().is_some_and(
                        |x| matches!(x.schedule, Schedule::Gemm { k: kk, .. } if kk == k),
                    )
                })
                .unwrap_or_else(|| panic!("a product of {k} steps"))
        };
        let (short, mid, long) = (of(10), of(300), of(1024));
        let reference = contraction_groups(ks, &[], &TargetInfo::reference());
        let first = reference[short].expect("shared");
        assert_eq!(
            (reference[mid], reference[long]),
            (Some(first), Some(first))
        );
        let intel = TargetInfo {
            vector_bytes: 64,
            gemm: kiln_kernel::target::GemmLimits::two_fma512_ports(),
            ..TargetInfo::reference()
        };
        let groups = contraction_groups(ks, &[], &intel);
        assert_eq!(groups[short], None);
        let first = groups[mid].expect("shared");
        assert_eq!(groups[long], Some(first));
        // Their schedules: the 10-step product on the 6 x 4 tile, the others on the tall one.
        let tile = |i: usize| {
            let b = gemm_schedule(ks[i].as_ref().unwrap(), &intel)
                .unwrap()
                .blocking;
            (b.mr, b.nv)
        };
        assert_eq!(
            (tile(short), tile(mid), tile(long)),
            ((6, 4), (14, 2), (14, 2))
        );
    }
}
