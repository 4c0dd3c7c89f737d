//! Register-level helpers of the GEMM: vector loads and stores of columns, lane masks,
//! planes (C stored by columns) and vector transposes.

use super::*;

/// How a register tile's product is folded into C in update mode.
#[derive(Clone, Copy)]
pub(super) struct Update<'c> {
    /// `s`, splat across a vector.
    pub(super) scale: BasicValueEnum<'c>,
    /// `C - s P` rather than `C + s P`.
    pub(super) subtract: bool,
    /// Update mode only where this flag is true at run time, else the product is stored as
    /// without update mode (a shared tile routine's argument: see [`Routine::Tile`]); `None`:
    /// always.
    pub(super) when: Option<IntValue<'c>>,
}

/// What a register tile's code works with: the element and vector types and, in update mode,
/// the scale.
pub(super) struct Regs<'a, 'c> {
    pub(super) x: Arith<'a, 'c>,
    pub(super) bl: Blocking,
    pub(super) ft: FloatType<'c>,
    pub(super) vt: VectorType<'c>,
    /// In update mode, C already holds X and each contraction block's product `P` is folded in
    /// as `C - s P` or `C + s P` (see [`Update`]).
    pub(super) update: Option<Update<'c>>,
    /// C is stored by columns, `ldc` apart: element `(i, j)` of a tile at `c[j * ldc + i]` (a
    /// convolution's NCHW output, [`ConvPatches::planes`]).
    pub(super) planes: bool,
    /// A tail tile (see [`Blocking::tails`]), which runs once per block of rows and panel:
    /// its loop takes one contraction step an iteration, for compile time.
    pub(super) tail: bool,
}

/// The loaded vector types and pointers of one emitted GEMM.
pub(super) struct Gemm<'a, 'c> {
    pub(super) r: Regs<'a, 'c>,
    /// Rows of A and C per batch.
    pub(super) m: i64,
    /// A is stored `[batch, k, m]`.
    pub(super) a_trans: bool,
    /// Contraction length (a constant, or a parameter of a kernel shared by products that
    /// differ only in it).
    pub(super) k: IntValue<'c>,
    pub(super) a: PointerValue<'c>,
    /// Elements between A's stored rows (`k`, `m` when `a_trans`, unless read through
    /// strides).
    pub(super) lda: IntValue<'c>,
    /// Where A's matrices lie when read in place through strides ([`Strides`]).
    pub(super) a_strides: Option<&'a Strides>,
    /// When A is a convolution's patch matrix: its shape and the table of column offsets.
    pub(super) conv: Option<(&'a ConvPatches, PointerValue<'c>)>,
    pub(super) b: PointerValue<'c>,
    pub(super) packed_b: PointerValue<'c>,
    pub(super) packed_a: PointerValue<'c>,
}

impl<'a, 'c> std::ops::Deref for Gemm<'a, 'c> {
    type Target = Regs<'a, 'c>;
    fn deref(&self) -> &Regs<'a, 'c> {
        &self.r
    }
}

impl<'c> Regs<'_, 'c> {
    /// Bytes of one vector (the alignment of packed vectors).
    pub(super) fn vbytes(&self) -> u32 {
        self.bl.lanes * self.bl.bytes as u32
    }

    /// Transposes `lanes` vectors of `lanes` elements (row `t` in, column `t` out): at each
    /// level, rows `i` and `i + b` (bit `b` of `i` clear) swap their off-diagonal blocks of `b`
    /// elements, for `b` = lanes/2 down to 1; two two-source shuffles per pair and level.
    pub(super) fn transpose(&self, r: Vec<VectorValue<'c>>) -> Result<Vec<VectorValue<'c>>> {
        transpose_vectors(self.x.em, r)
    }

    /// `width` consecutive elements at `p[idx..]` as a vector (zeros past `width`), by a masked
    /// load when `width` is short of a whole vector (the lanes past it are not read).
    pub(super) fn load_cols(
        &self,
        p: PointerValue<'c>,
        idx: IntValue<'c>,
        width: i64,
    ) -> Result<BasicValueEnum<'c>> {
        let b = &self.x.em.b;
        let at = self.x.at(self.ft, p, idx)?;
        if width >= self.bl.lanes as i64 {
            let v = b.build_load(self.vt, at, "lv").map_err(llvm)?;
            return align(v, self.bl.bytes as u32);
        }
        if width <= 0 {
            return Ok(self.vt.const_zero().into());
        }
        let mask = self.lane_mask(width);
        self.masked(
            "llvm.masked.load",
            at,
            &[at.into(), mask.into(), self.vt.const_zero().into()],
        )
        .map(|v| v.expect("a masked load returns its vector"))
    }

    /// Stores the first `width` lanes of `v` at `p[idx..]` (a masked store when `width` is
    /// short of a whole vector).
    pub(super) fn store_cols(
        &self,
        p: PointerValue<'c>,
        idx: IntValue<'c>,
        width: i64,
        v: BasicValueEnum<'c>,
    ) -> Result<()> {
        let b = &self.x.em.b;
        let at = self.x.at(self.ft, p, idx)?;
        if width >= self.bl.lanes as i64 {
            let s = b.build_store(at, v).map_err(llvm)?;
            s.set_alignment(self.bl.bytes as u32).map_err(llvm)?;
            return Ok(());
        }
        if width <= 0 {
            return Ok(());
        }
        let mask = self.lane_mask(width);
        self.masked("llvm.masked.store", at, &[v, at.into(), mask.into()])?;
        Ok(())
    }

    /// The mask of a vector's first `width` lanes.
    pub(super) fn lane_mask(&self, width: i64) -> VectorValue<'c> {
        let i1 = self.x.em.ctx.bool_type();
        let lanes: Vec<IntValue<'c>> = (0..self.bl.lanes as i64)
            .map(|l| i1.const_int((l < width) as u64, false))
            .collect();
        VectorType::const_vector(&lanes)
    }

    /// A call of the masked load or store intrinsic `name` on this tile's vectors at `at`
    /// (element-aligned), with `args`; its result, for a load.
    pub(super) fn masked(
        &self,
        name: &str,
        at: PointerValue<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        self.masked_as(self.vt, name, at, args)
    }

    /// [`Self::masked`] on vectors of type `vt`.
    pub(super) fn masked_as(
        &self,
        vt: VectorType<'c>,
        name: &str,
        at: PointerValue<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        let em = self.x.em;
        let decl = inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|i| i.get_declaration(em.m, &[vt.into(), at.get_type().into()]))
            .ok_or_else(|| crate::Error::Llvm(format!("cannot declare {name}")))?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        let call = em.b.build_call(decl, &args, "m").map_err(llvm)?;
        let ptr_arg = args.iter().position(|a| a.is_pointer_value()).unwrap_or(0) as u32;
        let align_kind = Attribute::get_named_enum_kind_id("align");
        call.add_attribute(
            AttributeLoc::Param(ptr_arg),
            em.ctx
                .create_enum_attribute(align_kind, self.bl.bytes as u64),
        );
        Ok(call.try_as_basic_value().basic())
    }

    /// Rows per group of a tile stored by columns: `mr` rounded up to a power of two, at most
    /// a vector. Each group's column is one vector of this many lanes.
    pub(super) fn plane_group(&self) -> i64 {
        (self.bl.mr as u64)
            .next_power_of_two()
            .min(self.bl.lanes as u64) as i64
    }

    /// Lanes `lo..lo + len` of `v`.
    pub(super) fn lanes_of(
        &self,
        v: VectorValue<'c>,
        lo: i64,
        len: i64,
    ) -> Result<VectorValue<'c>> {
        let i32t = self.x.em.ctx.i32_type();
        let idx: Vec<IntValue<'c>> = (lo..lo + len)
            .map(|l| i32t.const_int(l as u64, false))
            .collect();
        self.x
            .em
            .b
            .build_shuffle_vector(
                v,
                v.get_type().get_undef(),
                VectorType::const_vector(&idx),
                "sub",
            )
            .map_err(llvm)
    }

    /// The vectors `parts` (of equal length) one after another in one vector.
    pub(super) fn concat(&self, mut parts: Vec<VectorValue<'c>>) -> Result<VectorValue<'c>> {
        let i32t = self.x.em.ctx.i32_type();
        while parts.len() > 1 {
            let len = parts[0].get_type().get_size() as u64;
            let idx: Vec<IntValue<'c>> = (0..2 * len).map(|l| i32t.const_int(l, false)).collect();
            parts = parts
                .chunks(2)
                .map(|p| {
                    self.x
                        .em
                        .b
                        .build_shuffle_vector(p[0], p[1], VectorType::const_vector(&idx), "cat")
                        .map_err(llvm)
                })
                .collect::<Result<_>>()?;
        }
        Ok(parts[0])
    }

    /// The mask of the lanes of a group of `q` rows starting at tile row `g0` that are among
    /// the tile's first `live` rows.
    pub(super) fn group_mask(
        &self,
        q: i64,
        g0: i64,
        live: IntValue<'c>,
    ) -> Result<VectorValue<'c>> {
        let em = self.x.em;
        let i64t = em.ctx.i64_type();
        let idx: Vec<IntValue<'c>> = (0..q).map(|l| i64t.const_int(l as u64, false)).collect();
        let left = self.x.sub(live, self.x.c(g0))?;
        let vt = i64t.vec_type(q as u32);
        let one =
            em.b.build_insert_element(vt.get_undef(), left, self.x.c(0), "l1")
                .map_err(llvm)?;
        let splat =
            em.b.build_shuffle_vector(
                one,
                vt.get_undef(),
                em.ctx.i32_type().vec_type(q as u32).const_zero(),
                "ls",
            )
            .map_err(llvm)?;
        em.b.build_int_compare(
            IntPredicate::SLT,
            VectorType::const_vector(&idx),
            splat,
            "gm",
        )
        .map_err(llvm)
    }

    /// Stores the tile `tile` (`mr` rows of `nv` vectors) by columns (see [`Regs::planes`]):
    /// its first `live` rows and `width` columns at `c`, columns `ldc` apart. Each group of
    /// rows ([`Self::plane_group`]) is transposed in registers a square block at a time, and
    /// each column of the group stored as one masked vector.
    pub(super) fn store_planes(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        live: IntValue<'c>,
        width: i64,
        tile: &[Vec<VectorValue<'c>>],
    ) -> Result<()> {
        let (mr, lanes, q) = (self.bl.mr, self.bl.lanes as i64, self.plane_group());
        let qt = self.ft.vec_type(q as u32);
        for g0 in (0..mr).step_by(q as usize) {
            let mask = self.group_mask(q, g0, live)?;
            for (v, s0) in
                (0..self.bl.nv).flat_map(|v| (0..lanes).step_by(q as usize).map(move |s| (v, s)))
            {
                let col0 = v * lanes + s0;
                if col0 >= width {
                    continue;
                }
                let block: Vec<VectorValue<'c>> = (g0..g0 + q)
                    .map(|i| match tile.get(i as usize) {
                        Some(row) => self.lanes_of(row[v as usize], s0, q),
                        None => Ok(qt.get_undef()),
                    })
                    .collect::<Result<_>>()?;
                for (t, col) in transpose_vectors(self.x.em, block)?.into_iter().enumerate() {
                    let j = col0 + t as i64;
                    if j >= width {
                        break;
                    }
                    let at = self
                        .x
                        .at(self.ft, c, self.x.addc(self.x.mulc(ldc, j)?, g0)?)?;
                    self.masked_as(
                        qt,
                        "llvm.masked.store",
                        at,
                        &[col.into(), at.into(), mask.into()],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The tile stored by columns at `c` ([`Self::store_planes`]), as `mr` rows of `nv`
    /// vectors: rows from `live` on and columns from `width` on are zeros.
    pub(super) fn load_planes(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        live: IntValue<'c>,
        width: i64,
    ) -> Result<Vec<Vec<VectorValue<'c>>>> {
        let (mr, nv, lanes, q) = (
            self.bl.mr,
            self.bl.nv,
            self.bl.lanes as i64,
            self.plane_group(),
        );
        let qt = self.ft.vec_type(q as u32);
        // parts[i][v]: row i's vector v, as lanes / q pieces of q lanes.
        let mut parts = vec![vec![Vec::new(); nv as usize]; mr as usize];
        for g0 in (0..mr).step_by(q as usize) {
            let mask = self.group_mask(q, g0, live)?;
            for v in 0..nv {
                for s0 in (0..lanes).step_by(q as usize) {
                    let cols: Vec<VectorValue<'c>> = (0..q)
                        .map(|t| {
                            let j = v * lanes + s0 + t;
                            if j >= width {
                                return Ok(qt.const_zero());
                            }
                            let at =
                                self.x
                                    .at(self.ft, c, self.x.addc(self.x.mulc(ldc, j)?, g0)?)?;
                            let v = self.masked_as(
                                qt,
                                "llvm.masked.load",
                                at,
                                &[at.into(), mask.into(), qt.const_zero().into()],
                            )?;
                            Ok(v.expect("a masked load returns its vector")
                                .into_vector_value())
                        })
                        .collect::<Result<_>>()?;
                    for (i, row) in transpose_vectors(self.x.em, cols)?.into_iter().enumerate() {
                        if let Some(p) = parts.get_mut(g0 as usize + i) {
                            p[v as usize].push(row);
                        }
                    }
                }
            }
        }
        parts
            .into_iter()
            .map(|row| row.into_iter().map(|p| self.concat(p)).collect())
            .collect()
    }
}
