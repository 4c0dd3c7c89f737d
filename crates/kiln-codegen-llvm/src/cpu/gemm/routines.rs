//! The GEMM routines (register tiles, packing) compiled once per tile shape and machine and
//! shared by every kernel that uses them.

use super::*;

/// The name prefix of the GEMM routines compiled as functions of their own.
pub(crate) const ROUTINE_PREFIX: &str = "kiln_gemm_";

/// A piece of GEMM code compiled as a function of its own and shared by every GEMM kernel (and,
/// through the kernel cache, every function) that uses it. It depends on the register tile and
/// the element type, never on the product's shape, and it is most of a GEMM kernel's code and
/// of its compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Routine {
    /// Register tiles down a panel, `void (ptr c, i64 ldc, i64 rows, ptr a, i64 lda,
    /// i64 step, ptr panel, i64 ldb, i64 kc, i1 first, float scale, i1 update)`: the `rows`
    /// rows of C at `c` (`ldc` apart), `mr` at a time, get the product of A at `a` (read as
    /// [`ARead`] says; `step` is read by [`ARead::Strided`] only) and packed B's `panel` over
    /// `kc` steps (for the compact tile, B's rows `ldb` apart: see [`b_in_place`]), each tile
    /// as [`Regs::tile`] describes; with `update`, in update mode, folded into C as `C + scale
    /// P` (a subtraction passes `-s`: `C + (-s) P` rounds as `C - s P` does, bit for bit). One
    /// call covers a block of rows, so short contractions (attention's 64 steps) do not pay a
    /// call per tile. The mode is an argument rather than part of the routine: a training
    /// step's products that write a fresh result and those that update a parameter in place
    /// share one routine per tile (one compile instead of two, about 16 ms of CPU for the
    /// 14 x 2 tile), and the mode's test costs a branch per row of a tile.
    Tile {
        /// Bytes per element (4 or 8).
        bytes: i64,
        /// Elements per vector.
        lanes: u32,
        /// Rows of the tile.
        mr: i64,
        /// Vectors per row.
        nv: i64,
        /// Columns stored: a whole panel's, or the tail panel's.
        width: i64,
        /// How A is read.
        a: ARead,
        /// C is stored by columns ([`Regs::planes`]): `ldc` is then the distance between
        /// columns, and the tiles' rows are consecutive elements.
        planes: bool,
        /// The loop's software prefetches ([`Blocking::prefetch`]).
        prefetch: kiln_kernel::target::TilePrefetch,
        /// The shorter tiles the rows past the last whole tile take ([`Blocking::tails`]):
        /// none for the compact tile and for tiles storing C by columns.
        tails: kiln_kernel::target::TailTiles,
        /// The whole tiles ask for the next tile's C ahead ([`Blocking::c_ahead`]): not tiles
        /// storing C by columns.
        c_ahead: bool,
        /// Bytes of the cache line each prefetch asks for ([`Blocking::line`]); 0 for a tile
        /// that asks for nothing ahead.
        line: i64,
    },
    /// A block of A packed into slivers, `void (ptr src, i64 ld, i64 rows, i64 span, ptr dst,
    /// i64 stride)`, as [`Regs::pack_a`] describes.
    PackA {
        bytes: i64,
        /// Elements per vector of the GEMM (the width of a block of steps when `mr` is not a
        /// power of two).
        lanes: u32,
        /// Rows per sliver.
        mr: i64,
        /// A stored `[k, m]`.
        trans: bool,
    },
    /// A panel of B packed, `void (ptr src, i64 ld, i64 span, ptr panel)`, as
    /// [`Regs::pack_b`] describes.
    PackB {
        bytes: i64,
        lanes: u32,
        nv: i64,
        /// Columns of the panel read from B (the others are zeros).
        width: i64,
        /// B stored `[n, k]`.
        trans: bool,
    },
}

/// A GEMM's place in a chain of products (see [`crate::kernel::Chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InChain {
    /// A product of its own.
    No,
    /// The first product, whose epilogue's result the second reads (it reads A in place).
    First,
    /// The second product (it packs its B itself).
    Second,
    /// The second product with its B read through strides (see [`crate::kernel::Strides`]),
    /// which it always packs.
    SecondStrided,
}

/// Whether the GEMM kernel of blocking `bl` reads B in place rather than packing it: with the
/// compact tile ([`Blocking::compact`]: one panel of at most a vector's columns, B's rows read
/// by masked loads), where B is stored by rows, unless the product is a convolution's or part
/// of a chain (`in_chain`).
pub(crate) fn b_in_place(bl: &Blocking, b_trans: bool, conv: bool, in_chain: bool) -> bool {
    bl.compact && !b_trans && !conv && !in_chain
}

/// Whether the second product of a chain (its blocking `bl`, `n` columns) reads its B
/// (`[batch, k, n]`) in place rather than packing it: stored by rows and one whole panel wide
/// (`n` is the tile's width), B is laid out as its packed panel would be, rows `nr` apart, so
/// packing would only copy it (attention's values, `[512, 64]` a batch).
pub(crate) fn chain_b_in_place(bl: &Blocking, n: i64, b_trans: bool) -> bool {
    !b_trans && n == bl.nr()
}

/// How a register tile reads A: row `i` (of the tile) at contraction step `kk`, from `a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ARead {
    /// Packed slivers, `lda` elements apart: `a[kk * mr + i]` in each.
    Packed,
    /// A matrix stored by rows, read in place: `a[i * lda + kk]`.
    Rows,
    /// A matrix stored transposed (`[k, m]`), read in place: `a[i + kk * lda]`.
    Cols,
    /// A matrix read in place through strides given at run time, `a[i * lda + kk * step]`:
    /// either layout in one routine, for the compact tile ([`Blocking::compact`]), whose C
    /// rows [`Regs::tile`] also loads and stores in a loop.
    Strided,
}

impl ARead {
    /// How the tile of a GEMM reads A: packed unless `in_place` (a product of one panel of
    /// columns, the first of a chain, or one whose blocking says so: [`Blocking::a_in_place`]);
    /// in place, through strides for a `compact` tile ([`Blocking::compact`], unless the
    /// product is the first of a chain), else by rows or by columns (`a_trans`), or, for a
    /// convolution (`conv`, one panel), through its column offset table inline (`None`: no
    /// routine).
    pub(super) fn of(compact: bool, in_place: bool, conv: bool, a_trans: bool) -> Option<ARead> {
        match (in_place, conv, a_trans) {
            (false, _, _) => Some(ARead::Packed),
            (true, true, _) => None,
            _ if compact => Some(ARead::Strided),
            (true, false, false) => Some(ARead::Rows),
            (true, false, true) => Some(ARead::Cols),
        }
    }

    /// The tile's `(a, lda, step)` arguments for rows from `row` (A's offset of its first
    /// element, [`Gemm::a_row`]) over the contraction block from step `kb`, with A `[m, k]`
    /// (`[k, m]` when `a_trans`) at `a`, its stored rows `ld` apart, or packed at `packed` in
    /// slivers of `kc` steps.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn args<'c>(
        self,
        x: &Arith<'_, 'c>,
        ft: FloatType<'c>,
        (a, packed): (PointerValue<'c>, PointerValue<'c>),
        (row, kb): (IntValue<'c>, IntValue<'c>),
        (ld, kc): (IntValue<'c>, i64),
        a_trans: bool,
    ) -> Result<(PointerValue<'c>, IntValue<'c>, IntValue<'c>)> {
        let one = x.c(1);
        let by_cols = || -> Result<PointerValue<'c>> { x.at(ft, a, x.add(row, x.mul(kb, ld)?)?) };
        let by_rows = || -> Result<PointerValue<'c>> { x.at(ft, a, x.add(row, kb)?) };
        Ok(match self {
            ARead::Packed => (packed, x.c(kc), one),
            ARead::Rows => (by_rows()?, ld, one),
            ARead::Cols => (by_cols()?, ld, one),
            ARead::Strided if a_trans => (by_cols()?, one, ld),
            ARead::Strided => (by_rows()?, ld, one),
        })
    }
}

impl Routine {
    pub(super) fn tile(bl: Blocking, width: i64, a: ARead, planes: bool) -> Routine {
        let c_ahead = bl.c_ahead && !planes && a != ARead::Strided;
        Routine::Tile {
            bytes: bl.bytes,
            lanes: bl.lanes,
            mr: bl.mr,
            nv: bl.nv,
            width,
            a,
            planes,
            prefetch: bl.prefetch,
            tails: if planes || a == ARead::Strided {
                Default::default()
            } else {
                bl.tails
            },
            c_ahead,
            line: if c_ahead || !bl.prefetch.is_none() {
                bl.line
            } else {
                0
            },
        }
    }

    /// Whether this is a tile with tail tiles ([`Blocking::tails`]).
    pub(crate) fn has_tails(&self) -> bool {
        matches!(*self, Routine::Tile { mr, tails, .. } if !tails.sizes(mr).is_empty())
    }

    pub(super) fn pack_a(bl: Blocking, trans: bool) -> Routine {
        Routine::PackA {
            bytes: bl.bytes,
            lanes: bl.lanes,
            mr: bl.mr,
            trans,
        }
    }

    pub(super) fn pack_b(bl: Blocking, width: i64, trans: bool) -> Routine {
        Routine::PackB {
            bytes: bl.bytes,
            lanes: bl.lanes,
            nv: bl.nv,
            width,
            trans,
        }
    }

    /// The routines a GEMM of `n` columns calls: a pack of B for each panel width (whole
    /// panels and the tail's), and a tile for each, except for a convolution with a single
    /// panel of columns (its tile reads the input in place through the column offset table,
    /// emitted inline); and with several panels, unless it is a convolution's, the first
    /// product of a chain (`in_chain`, which reads A in place) or one whose blocking reads A
    /// in place ([`Blocking::a_in_place`]), the pack of A; none of B where
    /// the kernel reads it in place ([`b_in_place`], [`chain_b_in_place`]). A convolution's
    /// output stored by planes has tiles that store C by columns.
    pub(crate) fn of_gemm(
        bl: Blocking,
        n: i64,
        (a_trans, b_trans): (bool, bool),
        conv: Option<&ConvPatches>,
        in_chain: InChain,
    ) -> Vec<Routine> {
        let chained = in_chain == InChain::First;
        let planes = conv.is_some_and(|p| p.planes);
        let conv = conv.is_some();
        let nr = bl.nr();
        let widths: Vec<i64> = (n >= nr)
            .then_some(nr)
            .into_iter()
            .chain((n % nr != 0).then_some(n % nr))
            .collect();
        let in_place = b_in_place(&bl, b_trans, conv, in_chain != InChain::No)
            || (in_chain == InChain::Second && chain_b_in_place(&bl, n, b_trans));
        let packs = widths
            .iter()
            .filter(|_| !in_place)
            .map(|&w| Routine::pack_b(bl, w, b_trans));
        let direct = n <= nr || chained || bl.a_in_place;
        let a = ARead::of(bl.compact && !chained, direct, conv, a_trans);
        let tiles = widths
            .iter()
            .filter_map(|&w| Some(Routine::tile(bl, w, a?, planes)));
        let pack_a = (!direct && !conv).then(|| Routine::pack_a(bl, a_trans));
        packs.chain(tiles).chain(pack_a).collect()
    }

    /// The function's symbol, which names every field.
    pub(crate) fn name(&self) -> String {
        match *self {
            Routine::Tile {
                bytes,
                lanes,
                mr,
                nv,
                width,
                a,
                planes,
                prefetch,
                tails,
                c_ahead,
                line,
            } => {
                // Prefetches, where the tile asks for them: `_pf8x16` (B 8 steps ahead, A 16),
                // `_ca` (the next tile's C), and lines of other than 64 bytes (`_l128`).
                let mut pf = if prefetch.is_none() {
                    String::new()
                } else {
                    format!("_pf{}x{}", prefetch.b_steps, prefetch.a_steps)
                };
                if c_ahead {
                    pf += "_ca";
                }
                if line != 0 && line != 64 {
                    pf += &format!("_l{line}");
                }
                // Tail tiles, where it has them: `_t4_8` (4 and 8 rows).
                let tails: String = tails
                    .sizes(mr)
                    .iter()
                    .enumerate()
                    .map(|(i, s)| format!("{}{s}", if i == 0 { "_t" } else { "_" }))
                    .collect();
                let a = match a {
                    ARead::Packed => "p",
                    ARead::Rows => "r",
                    ARead::Cols => "c",
                    ARead::Strided => "s",
                };
                format!(
                    "{ROUTINE_PREFIX}tile_f{}_{lanes}x{mr}x{nv}_w{width}_{a}{}{pf}{tails}",
                    bytes * 8,
                    if planes { "_planes" } else { "" }
                )
            }
            Routine::PackA {
                bytes,
                lanes,
                mr,
                trans,
            } => format!(
                "{ROUTINE_PREFIX}packa_f{}_{mr}x{lanes}_{}",
                bytes * 8,
                if trans { "t" } else { "n" }
            ),
            Routine::PackB {
                bytes,
                lanes,
                nv,
                width,
                trans,
            } => format!(
                "{ROUTINE_PREFIX}packb_f{}_{lanes}x{nv}_w{width}_{}",
                bytes * 8,
                if trans { "t" } else { "n" }
            ),
        }
    }

    /// The register tile and element type this routine works with (only those fields of the
    /// blocking are read).
    pub(super) fn regs_blocking(&self) -> Blocking {
        let (bytes, lanes, mr, nv) = match *self {
            Routine::Tile {
                bytes,
                lanes,
                mr,
                nv,
                ..
            } => (bytes, lanes, mr, nv),
            Routine::PackA {
                bytes, lanes, mr, ..
            } => (bytes, lanes, mr, 0),
            Routine::PackB {
                bytes, lanes, nv, ..
            } => (bytes, lanes, 0, nv),
        };
        let (prefetch, tails, c_ahead, line) = match *self {
            Routine::Tile {
                prefetch,
                tails,
                c_ahead,
                line,
                ..
            } => (prefetch, tails, c_ahead, line),
            _ => (Default::default(), Default::default(), false, 0),
        };
        Blocking {
            bytes,
            lanes,
            mr,
            nv,
            kc: 0,
            mc: 0,
            nc: 0,
            chain_bytes: 0,
            a_in_place: false,
            prefetch,
            tails,
            stream: None,
            c_ahead,
            line,
            compact: matches!(
                *self,
                Routine::Tile {
                    a: ARead::Strided,
                    ..
                }
            ),
        }
    }

    /// The function in module `m`: declared, or (with [`Routines::Here`]) defined there once.
    pub(crate) fn function<'c>(
        &self,
        ctx: &'c Context,
        m: &'c Module<'c>,
        routines: Routines,
        target: Target,
    ) -> Result<FunctionValue<'c>> {
        let name = self.name();
        if let Some(f) = m.get_function(&name) {
            return Ok(f);
        }
        let bl = self.regs_blocking();
        let ptr = ctx.ptr_type(AddressSpace::default());
        let i64t = ctx.i64_type();
        let ft = if bl.bytes == 8 {
            ctx.f64_type()
        } else {
            ctx.f32_type()
        };
        // The parameters (see each variant): pointers (`p`, none aliasing another), 64-bit
        // integers (`i`), a flag (`b`) and a float (`f`).
        let sig = match self {
            Routine::Tile { .. } => "piipiipiibfb",
            Routine::PackA { .. } => "piiipi",
            Routine::PackB { .. } => "piip",
        };
        let params: Vec<BasicMetadataTypeEnum<'c>> = sig
            .chars()
            .map(|c| match c {
                'p' => ptr.into(),
                'i' => i64t.into(),
                'b' => ctx.bool_type().into(),
                _ => ft.into(),
            })
            .collect();
        let ty = ctx.void_type().fn_type(&params, false);
        let f = m.add_function(&name, ty, None);
        // Hidden: a library's kernels call its own copy directly, not through the PLT.
        f.as_global_value()
            .set_visibility(inkwell::GlobalVisibility::Hidden);
        let attr =
            |name: &str| ctx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0);
        // No pointer is kept past the call (`captures(none)`: the attribute's value 0 is no
        // capture). Without it LLVM must assume a routine stored the kernel's output pointer
        // where the pointer table is, so an epilogue after the calls reads its inputs through
        // pointers that might be the output: its vectorized loops then carry run-time overlap
        // checks and a second scalar path (the MLP step's GEMM kernels: 2-3 ms of code
        // generation each, see docs/performance.md).
        for (i, _) in sig.char_indices().filter(|&(_, c)| c == 'p') {
            f.add_attribute(AttributeLoc::Param(i as u32), attr("noalias"));
            f.add_attribute(AttributeLoc::Param(i as u32), attr("captures"));
        }
        if routines == Routines::Apart {
            return Ok(f);
        }
        // Not inlined, so that a module that defines it compiles the same code as the kernel
        // cache, which links it in.
        f.add_attribute(AttributeLoc::Function, attr("noinline"));
        host_attributes(ctx, f, target);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        let param = |i: u32| f.get_nth_param(i).expect("declared");
        let first = param(0).into_pointer_value();
        let te = Emitter::new(ctx, m, b, f, first, target, routines);
        // Update mode where the call asks for it (C + s P, `s` negated for a subtraction);
        // a tile storing C by columns has none.
        let update = match *self {
            Routine::Tile { planes: false, .. } => Some(Update {
                scale: splat(&te, ft, bl.lanes, param(10))?.into(),
                subtract: false,
                when: Some(param(11).into_int_value()),
            }),
            _ => None,
        };
        let regs = Regs {
            x: Arith { em: &te },
            bl,
            ft,
            vt: ft.vec_type(bl.lanes),
            update,
            planes: matches!(*self, Routine::Tile { planes: true, .. }),
            tail: false,
        };
        match *self {
            Routine::Tile {
                mr,
                width,
                a,
                planes,
                tails,
                ..
            } => {
                let (base, lda) = (param(3).into_pointer_value(), param(4).into_int_value());
                let step = param(5).into_int_value();
                let (ldc, rows) = (param(1).into_int_value(), param(2).into_int_value());
                let x = &regs.x;
                // One tile per `mr` rows: rows `r..` of C, and of A (a sliver `lda` elements
                // after the last when packed).
                let s_r = x.slot()?;
                te.range_loop_ptr(s_r, x.c(0), rows, mr, &mut |_| {
                    let r = x.get(s_r)?;
                    let left = x.sub(rows, r)?;
                    let base = x.at(ft, base, if a == ARead::Cols { r } else { x.mul(r, lda)? })?;
                    // Read in place, rows past the block read the last one (their results are
                    // not stored).
                    let starts: Vec<IntValue<'c>> = match a {
                        ARead::Packed => Vec::new(),
                        ARead::Rows | ARead::Cols | ARead::Strided => {
                            let last = x.sub(left, x.c(1))?;
                            (0..mr)
                                .map(|i| {
                                    let i = x.min(x.c(i), last)?;
                                    if a == ARead::Cols {
                                        Ok(i)
                                    } else {
                                        x.mul(i, lda)
                                    }
                                })
                                .collect::<Result<_>>()?
                        }
                    };
                    let at = |i: i64, kk: IntValue<'c>| -> Result<PointerValue<'c>> {
                        let idx = match a {
                            ARead::Packed => x.addc(x.mulc(kk, mr)?, i)?,
                            ARead::Rows => x.add(starts[i as usize], kk)?,
                            ARead::Cols => x.add(starts[i as usize], x.mul(kk, lda)?)?,
                            ARead::Strided => x.add(starts[i as usize], x.mul(kk, step)?)?,
                        };
                        x.at(ft, base, idx)
                    };
                    let c = x.at(ft, first, if planes { r } else { x.mul(r, ldc)? })?;
                    let tile = |regs: &Regs<'_, 'c>| {
                        regs.tile(
                            c,
                            ldc,
                            left,
                            width,
                            &at,
                            (param(6).into_pointer_value(), param(7).into_int_value()),
                            param(8).into_int_value(),
                            param(9).into_int_value(),
                        )
                    };
                    // The rows past the last whole tile on the shortest tail tile that covers
                    // them (`tails`, shortest first), reading A as the whole tile does.
                    let sizes = tails.sizes(mr);
                    let shorter = |s: i64| Regs {
                        x: Arith { em: &te },
                        bl: Blocking {
                            mr: s,
                            tails: Default::default(),
                            ..regs.bl
                        },
                        ft: regs.ft,
                        vt: regs.vt,
                        update: regs.update,
                        planes: regs.planes,
                        tail: true,
                    };
                    tails_or_whole(x, left, &sizes, &|s| match s {
                        None => tile(&regs),
                        Some(s) => tile(&shorter(s)),
                    })
                })?;
            }
            Routine::PackA { trans, .. } => regs.pack_a(
                first,
                param(1).into_int_value(),
                param(2).into_int_value(),
                param(3).into_int_value(),
                param(4).into_pointer_value(),
                param(5).into_int_value(),
                trans,
            )?,
            Routine::PackB { width, trans, .. } => regs.pack_b(
                first,
                param(1).into_int_value(),
                param(2).into_int_value(),
                width,
                trans,
                param(3).into_pointer_value(),
            )?,
        }
        te.b.build_return(None).map_err(llvm)?;
        Ok(f)
    }
}

/// `tile(Some(s))` for the shortest of the tail tiles' `sizes` (shortest first) that covers
/// `left` rows, or `tile(None)`, the whole tile, where none does.
fn tails_or_whole<'c>(
    x: &Arith<'_, 'c>,
    left: IntValue<'c>,
    sizes: &[i64],
    tile: &dyn Fn(Option<i64>) -> Result<()>,
) -> Result<()> {
    let Some((&longest, shorter)) = sizes.split_last() else {
        return tile(None);
    };
    // The whole tile first: all of a block's tiles but its last take it.
    x.branch(
        x.cmp(IntPredicate::SGT, left, x.c(longest))?,
        &mut || tile(None),
        &mut || tails_or_whole(x, left, shorter, &|s| tile(Some(s.unwrap_or(longest)))),
    )
}
