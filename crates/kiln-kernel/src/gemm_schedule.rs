//! A matrix product's blocking, decided for a target: the register tile (`mr` rows by `nv`
//! vectors), the cache blocks (`kc` contraction steps, `mc` rows of A, `nc` columns of B),
//! whether its blocks hold whole rows (a row epilogue), are cut for a chained product or an
//! online softmax, whether its tiles read A in place, whether its threads split columns, and
//! the scratch memory it packs into.
//! The CPU emitter renders a [`GemmSchedule`] (`cpu/gemm.rs`: the BLIS layering); the sizes
//! come from [`TargetInfo::vector_bytes`] and [`GemmLimits`](crate::target::GemmLimits).

use crate::ir::{Kernel, Schedule};
use crate::target::TargetInfo;
use kiln_ir::DType;
use std::fmt;

/// What is decided for one GEMM kernel on a target (see [`gemm_schedule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSchedule {
    /// The product's blocking.
    pub blocking: Blocking,
    /// The chained product's blocking, if a product reads the epilogue's result (see
    /// [`crate::kernel::Chain`]).
    pub chain: Option<Blocking>,
    /// Whether threads split the columns (in panels) rather than the rows (see
    /// [`Blocking::split_columns`]).
    pub split_columns: bool,
    /// Scratch bytes per call: the packed blocks, and a chained product's buffers.
    pub scratch: usize,
}

/// The schedule of GEMM kernel `k` on `target` (`None` if `k` is not a GEMM): blocks of whole
/// rows, split by rows, when its epilogue reduces over rows ([`crate::fuse::row_epilogue`]);
/// a chained product's blocks cut for it ([`Blocking::chained`], [`Blocking::online`]);
/// otherwise threads split the longer side ([`Blocking::split_columns`]). A product of a few
/// panels of columns that is no convolution's reads A in place ([`Blocking::a_in_place`]).
pub fn gemm_schedule(k: &Kernel, target: &TargetInfo) -> Option<GemmSchedule> {
    let Schedule::Gemm {
        batch,
        m,
        n,
        k: kk,
        ref chain,
        ref conv,
        a_trans,
        b_trans,
        ref zero,
        ref unread,
        ..
    } = k.schedule
    else {
        return None;
    };
    // A chained product contracts over the first product's columns.
    let chain_bl = chain
        .as_ref()
        .map(|c| Blocking::new(k.out.dtype, target, c.n, n));
    let bl = Blocking::new(k.out.dtype, target, n, kk);
    // Products that leave zero steps or unread tiles out keep the packed tiles that do so.
    let bl = match (chain, conv, zero, unread) {
        (None, None, None, None) if !b_trans => bl.streaming(m, &target.gemm),
        (None, None, None, None) if !a_trans => bl.streaming_dots(m, &target.gemm),
        _ => bl,
    };
    let row_epilogue = chain.is_none() && crate::fuse::row_epilogue(k);
    let blocking = match (chain, chain_bl) {
        (Some(c), Some(bl2)) if c.online.is_some() => bl.online(kk, bl2),
        (Some(_), _) => bl.whole_rows(n).chained(n, kk),
        _ if row_epilogue => bl.whole_rows(n),
        _ => bl,
    };
    // A chained product's first product reads A in place already.
    let blocking = match chain {
        Some(_) => blocking,
        None if blocking.stream.is_some() => blocking,
        None => blocking.reading_a_in_place((batch, n), (a_trans, conv.is_some()), &target.gemm),
    };
    // Threads split the panels of a plain product (not chained, no row epilogue, which need
    // whole rows) that is wide or small and reads A in place.
    let split_columns = chain.is_none()
        && !row_epilogue
        && (blocking.split_columns(batch, m, n, kk)
            || blocking.splits_columns_in_place(batch, (m, kk, n), target));
    let scratch = match (chain, chain_bl) {
        (Some(c), Some(bl2)) => {
            blocking
                .chain_scratch(
                    n as i64,
                    bl2,
                    c.n as i64,
                    c.online.is_some().then_some(m as i64),
                )
                .bytes
        }
        _ => blocking.scratch_bytes(n as i64),
    };
    Some(GemmSchedule {
        blocking,
        chain: chain_bl,
        split_columns,
        scratch,
    })
}

impl fmt::Display for GemmSchedule {
    /// `gemm 6x16 kc 256 mc 72 nc 4096`, then `, B streamed` (`, B streamed by dot products`)
    /// where the tiles read B in place ([`Blocking::stream`]), `, A in place` where the tiles read A in place
    /// across several panels, `, prefetch B 8 A 16` where the tile's loop asks for them
    /// that many steps ahead, `, C ahead` where it asks for the next tile's C
    /// ([`Blocking::c_ahead`]), `, tail tiles 4 8` for the shorter tiles a block's last rows
    /// take ([`Blocking::tails`]), `, chain 6x16 kc 256` for a chained product and `, split
    /// columns` where threads split them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.blocking;
        write!(
            f,
            "gemm {}x{} kc {} mc {} nc {}",
            b.mr,
            b.nr(),
            b.kc,
            b.mc,
            b.nc
        )?;
        match b.stream {
            Some(Stream::Rows) => f.write_str(", B streamed")?,
            Some(Stream::Dots) => f.write_str(", B streamed by dot products")?,
            None => {}
        }
        if b.a_in_place {
            f.write_str(", A in place")?;
        }
        let p = b.prefetch;
        if !p.is_none() {
            write!(f, ", prefetch B {} A {}", p.b_steps, p.a_steps)?;
        }
        if b.c_ahead {
            f.write_str(", C ahead")?;
        }
        let tails = b.tails.sizes(b.mr);
        if !tails.is_empty() {
            f.write_str(", tail tiles")?;
            for t in tails {
                write!(f, " {t}")?;
            }
        }
        if let Some(c) = &self.chain {
            write!(f, ", chain {}x{} kc {}", c.mr, c.nr(), c.kc)?;
        }
        if self.split_columns {
            f.write_str(", split columns")?;
        }
        Ok(())
    }
}

/// The cache blocks and the register tile of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Bytes per element.
    pub bytes: i64,
    /// Elements per vector.
    pub lanes: u32,
    /// Rows of a register tile.
    pub mr: i64,
    /// Vectors per row of a register tile.
    pub nv: i64,
    /// Contraction steps per block.
    pub kc: i64,
    /// Rows per packed block of A.
    pub mc: i64,
    /// Columns per packed block of B.
    pub nc: i64,
    /// Bytes of a block of rows of the epilogue's result a chained product reads
    /// ([`GemmLimits::chain_block_bytes`](crate::target::GemmLimits::chain_block_bytes)).
    pub chain_bytes: i64,
    /// The register tile is the compact one: a product at most one vector wide (a
    /// classifier's 10 logits and their weight gradient), whose tile reads A in place, takes
    /// A's strides at run time (one routine for A stored either way) and loads and stores C's
    /// rows in a loop instead of one branch per row. Those products are a few MFLOP, and their
    /// 16-row tiles were the costliest routines to compile: 11-12 ms of code generation each
    /// for the MLP step's two (A by rows, A by columns), for well under 1% of its run time.
    pub compact: bool,
    /// The tiles read A where it is stored (by rows or by columns, through its strides)
    /// rather than from packed slivers, although the product has more than one panel of
    /// columns (see [`Blocking::reading_a_in_place`]). Products of one panel always read A in
    /// place.
    pub a_in_place: bool,
    /// The tile loop's software prefetches (the tall tile's,
    /// [`TallTile::prefetch`](crate::target::TallTile::prefetch); none otherwise).
    pub prefetch: crate::target::TilePrefetch,
    /// The shorter tiles a block's last rows take when they are fewer than `mr`
    /// ([`GemmLimits::tail_tiles`](crate::target::GemmLimits::tail_tiles)); none for the
    /// compact tile, which loads and stores its rows in a loop, and for a streaming product,
    /// whose tiles are its own.
    pub tails: crate::target::TailTiles,
    /// How the product streams B, if it does (see [`Blocking::streaming`]): its tiles read B
    /// where it is stored and nothing is packed.
    pub stream: Option<Stream>,
    /// Each whole register tile asks, one line an iteration of its unrolled loop, for the
    /// cache lines of C that the next tile of its panel reads or stores, for writing
    /// ([`GemmLimits::c_ahead`](crate::target::GemmLimits::c_ahead)); not the compact tile,
    /// a streaming product's tiles, tail tiles or tiles storing C by columns.
    pub c_ahead: bool,
    /// Bytes of a cache line ([`TargetInfo::cache_line`]): what each of the tile's software
    /// prefetches asks for.
    pub line: i64,
}

/// How a product of a few rows streams B (see [`Blocking::streaming`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// B stored by rows (`[k, n]`): the tile is `mr` (the rows per matrix) by `nv` vectors of
    /// columns; a pass over a block of `nc` columns takes `kc` contraction steps, reading
    /// that many rows of B side by side, and the block's product is accumulated across all
    /// steps in the scratch memory.
    Rows,
    /// B stored transposed (`[n, k]`, a linear layer's weights by output) and A by rows: each
    /// element of C is the dot product of two contiguous rows. The tile is `mr` rows of A by
    /// `nv` rows of B (columns of C), one vector of partial sums each, summed across lanes at
    /// the end; no scratch memory.
    Dots,
}

impl Blocking {
    /// The blocking for `d` on `target`: with 512-bit vectors (32 vector registers) or
    /// narrower ones (the 256-bit blocking, 16 registers; [`TargetInfo::vector_bytes`]), the
    /// tile uses 24 (8 x 3) or 12 (6 x 2) accumulators, enough independent chains to hide the
    /// FMA latency on two FMA ports, and leaves registers for the B vectors.
    ///
    /// A product with at most one vector of columns (`n`; a classifier's 10 logits) uses the
    /// compact tile, one vector wide ([`Blocking::compact`]): the wide tile would multiply
    /// mostly the zeros padding its panel. It is 8 rows tall with 512-bit vectors (8
    /// independent FMA chains, what two FMA ports of latency 4 need; 16 rows took half again
    /// as long to compile), 12 with narrower ones.
    ///
    /// `k` is the product's contraction length: a target's tall tile
    /// ([`TallTile`](crate::target::TallTile)) is taken only from its `min_steps` on.
    pub fn new(d: DType, target: &TargetInfo, n: usize, k: usize) -> Blocking {
        let wide = target.vector_bytes >= 64;
        let limits = &target.gemm;
        let bytes = d.bytes() as i64;
        let lanes = ((if wide { 64 } else { 32 }) / bytes) as u32;
        // Measured on AVX-512 (matmul_1024/2048, two threads): 8 x 3 vectors with 512-step
        // contraction blocks beat 12 x 2, 6 x 4 and shorter blocks where the columns fill the
        // panels of all three.
        let mut prefetch = crate::target::TilePrefetch::default();
        let compact = n <= lanes as usize;
        let (mut mr, mut nv, kc) = match (wide, compact) {
            (true, false) => (8, 3, limits.kc_512),
            (true, true) => (8, 1, limits.kc_512),
            (false, false) => (6, 2, limits.kc_256),
            (false, true) => (12, 1, limits.kc_256),
        };
        // Where the 8 x 3 tile's panels pad the columns, take the 6 x 4 tile when it pads them
        // less, and when 8 x 3 would pad them by more than a tenth (64 output channels: 96
        // columns computed), the 12 x 2 one too if it pads least (ties to the earlier tile).
        // Measured with alternating calls in one process: conv 3x3 64 -> 64 and attention's
        // 64-wide product, 6 x 4 won 20 of 20 and 33 of 35 pairs, about 10% and 7% faster; on
        // Zen 4, with 6 x 4 wherever it pads less (1024 columns: 16 panels of 64 rather than
        // 21 of 48 and one of 16), the MLP step won 24 of 30 pairs (14.30 -> 14.09 ms) and 16
        // of 30, attention (512 keys) 18 and 16 of 20 (25.0 -> 24.0 ms), matmul_2048 11 of 16
        // (82.0 -> 80.0 ms), 1024 x 1024 x 1024 8 and 13 of 30 (10.06 -> 10.12 and 10.17 ->
        // 10.21 ms), and the MLP step's cold compile takes fewer routines (its LLVM phase
        // 69-75 ms against 77-102).
        if wide && !compact {
            let waste = |nv: i64| {
                let nr = lanes as u64 * nv as u64;
                (n as u64).div_ceil(nr) * nr - n as u64
            };
            let wide_waste = waste(3) > n as u64 / 10;
            (mr, nv) = [(8, 3), (6, 4), (12, 2)]
                .into_iter()
                .filter(|&(_, v)| v != 2 || wide_waste)
                .min_by_key(|&(_, v)| waste(v))
                .unwrap_or((mr, nv));
            // A CPU with two 512-bit FMA ports takes a tall tile past a few panels: it loads
            // half the vectors of B per multiply-add (see `TallTile`).
            if let Some(t) = limits
                .tall_512
                .filter(|t| n > t.min_columns && k >= t.min_steps)
            {
                (mr, nv) = (t.rows, 2);
                prefetch = t.prefetch;
            }
        }
        let nr = lanes as i64 * nv;
        Blocking {
            bytes,
            lanes,
            mr,
            nv,
            kc,
            mc: (limits.a_block_bytes / (kc * bytes) / mr).max(1) * mr,
            nc: (limits.b_block_bytes / (kc * bytes) / nr).max(1) * nr,
            chain_bytes: limits.chain_block_bytes,
            compact,
            a_in_place: false,
            prefetch,
            tails: if compact {
                Default::default()
            } else {
                limits.tail_tiles.for_rows(mr)
            },
            stream: None,
            c_ahead: limits.c_ahead && !compact,
            line: target.cache_line as i64,
        }
    }

    /// This blocking for a product of `batch` matrices of `n` columns with A stored
    /// transposed or not (`a_trans`), or a convolution's (`conv`), reading A in place
    /// ([`Self::a_in_place`]) where its panels are more than one and, for no convolution, at
    /// most [`GemmLimits::a_in_place_panels`], or at most
    /// [`GemmLimits::a_in_place_panels_rows`] for one matrix stored by rows.
    ///
    /// Across two panels (attention's heads, batched, on 2 threads of an AVX-512 Xeon): the
    /// scores `[128, 64] x [64, 128]` spent 16% of their CPU time packing A and took 17% less
    /// reading it in place, `dOᵀ P` (`[64, 128] x [128, 128]`, A by columns) 11% less.
    /// Packing a block of A by rows into slivers of 6 rows transposes it in registers: on the
    /// same Xeon about 10% of the time of the transformer step's products of 256 columns (4
    /// panels), which multiply each element of A by only 256 columns. Read in place, their
    /// tiles took about what they took on packed slivers (on-CPU time per call in `perf
    /// record`, both threads, tiles and packing of A: `[2048,1024] x [1024,256]` 10.0 -> 8.8
    /// ms, `[2048,1024] x [256,1024]ᵀ` 9.5 -> 8.8, `[2048,256] x [256,256]` 2.38 -> 2.24);
    /// with 16 panels the packing is 2-4% and the tiles read in place ran 0-9% slower
    /// (`[2048,256] x [256,1024]` 10.0 -> 10.5 ms, `[1024,1024] x [1024,1024]` 19.6 -> 19.2).
    /// Stored transposed, A's rows in place are a stored column each, one cache line per
    /// step, so A by columns past two panels keeps packing.
    ///
    /// [`GemmLimits::a_in_place_panels`]: crate::target::GemmLimits::a_in_place_panels
    /// [`GemmLimits::a_in_place_panels_rows`]: crate::target::GemmLimits::a_in_place_panels_rows
    pub fn reading_a_in_place(
        self,
        (batch, n): (usize, usize),
        (a_trans, conv): (bool, bool),
        limits: &crate::target::GemmLimits,
    ) -> Blocking {
        let panels = self.panels(n);
        let rows = batch == 1 && !a_trans && panels <= limits.a_in_place_panels_rows;
        Blocking {
            a_in_place: !conv && panels > 1 && (panels <= limits.a_in_place_panels || rows),
            ..self
        }
    }

    /// This blocking for a product of `m` rows per matrix, streaming B where `m` is at most
    /// [`GemmLimits::stream_rows`] and the product is wider than a vector (narrower ones take
    /// the compact tile, which reads B in place already): the rows in the fewest groups of at
    /// most [`GemmLimits::stream_tile_rows`], as even as they go (`mr` rows each, `mc` in all,
    /// padded), a tile of a group's rows by as many vectors (up to 4) as leave registers for
    /// B's vectors and A's broadcasts (24 accumulators with 32 vector registers, 12 with 16),
    /// passes of [`GemmLimits::stream_steps`] contraction steps, and blocks of columns whose
    /// product, `mc` rows of them, fills [`GemmLimits::stream_block_bytes`]. Each group's
    /// tile takes the pass's rows of B in turn; the later groups find them in the level 1
    /// cache.
    ///
    /// Packing copies each element of B to be multiplied by `m` elements of A: for one row (a
    /// token's activations times a weight matrix) the copy costs more than the product, and a
    /// tall tile multiplies mostly padding. Streamed, each pass reads `stream_steps` rows of B
    /// side by side, every one from start to end of the block, which the hardware prefetchers
    /// follow.
    ///
    /// [`GemmLimits::stream_rows`]: crate::target::GemmLimits::stream_rows
    /// [`GemmLimits::stream_tile_rows`]: crate::target::GemmLimits::stream_tile_rows
    /// [`GemmLimits::stream_steps`]: crate::target::GemmLimits::stream_steps
    /// [`GemmLimits::stream_block_bytes`]: crate::target::GemmLimits::stream_block_bytes
    pub fn streaming(self, m: usize, limits: &crate::target::GemmLimits) -> Blocking {
        let m = m as i64;
        if self.compact
            || m == 0
            || m > limits.stream_rows
            || limits.stream_steps <= 0
            || limits.stream_tile_rows <= 0
        {
            return self;
        }
        let groups = (m + limits.stream_tile_rows - 1) / limits.stream_tile_rows;
        let mr = (m + groups - 1) / groups;
        let nv = (self.stream_accumulators() / mr).clamp(1, 4);
        let nr = self.lanes as i64 * nv;
        let mc = mr * groups;
        Blocking {
            mr,
            nv,
            kc: limits.stream_steps,
            mc,
            nc: (limits.stream_block_bytes / (mc * self.bytes) / nr).max(1) * nr,
            a_in_place: false,
            prefetch: Default::default(),
            tails: Default::default(),
            stream: Some(Stream::Rows),
            c_ahead: false,
            ..self
        }
    }

    /// This blocking for a product of `m` rows whose B is stored transposed and A by rows
    /// (`a_trans` false), streaming B by dot products ([`Stream::Dots`]) where `m` is at most
    /// [`GemmLimits::stream_rows`] and [`GemmLimits::stream_tile_rows`] and the product is
    /// wider than a vector: a tile of all `m`
    /// rows by as many rows of B (up to 8, and no more than a vector's lanes) as leave
    /// registers, as [`Self::streaming`] counts them. Packing B stored transposed transposes
    /// it in registers, for `m` multiply-adds an element.
    ///
    /// [`GemmLimits::stream_rows`]: crate::target::GemmLimits::stream_rows
    /// [`GemmLimits::stream_tile_rows`]: crate::target::GemmLimits::stream_tile_rows
    pub fn streaming_dots(self, m: usize, limits: &crate::target::GemmLimits) -> Blocking {
        let m = m as i64;
        if self.compact || m == 0 || m > limits.stream_rows.min(limits.stream_tile_rows) {
            return self;
        }
        Blocking {
            mr: m,
            nv: (self.stream_accumulators() / m).clamp(1, (self.lanes as i64).min(8)),
            mc: m,
            a_in_place: false,
            prefetch: Default::default(),
            tails: Default::default(),
            stream: Some(Stream::Dots),
            c_ahead: false,
            ..self
        }
    }

    /// The accumulators a streaming tile may keep ([`Self::streaming`],
    /// [`Self::streaming_dots`]): 24 with 512-bit vectors (32 registers), 12 with narrower
    /// ones (16), leaving registers for B's vectors and A's.
    fn stream_accumulators(&self) -> i64 {
        if self.lanes as i64 * self.bytes >= 64 {
            24
        } else {
            12
        }
    }

    /// Rows per packed block of A.
    pub fn rows_per_block(&self) -> i64 {
        self.mc
    }

    /// Columns per packed block of B.
    pub fn columns_per_block(&self) -> i64 {
        self.nc
    }

    /// Columns per panel of packed B.
    pub fn nr(&self) -> i64 {
        self.lanes as i64 * self.nv
    }

    /// Panels of packed B that `n` columns take (the last one padded).
    pub fn panels(&self, n: usize) -> i64 {
        (n as i64 + self.nr() - 1) / self.nr()
    }

    /// Whether a GEMM's threads split its columns (in panels) rather than its rows: each thread
    /// packs the operand whose block it splits, so split the longer side (a wide product with
    /// few rows, like a training step's, would otherwise pack all of B once per row chunk).
    pub fn split_columns(&self, batch: usize, m: usize, n: usize, k: usize) -> bool {
        batch == 1 && k > 0 && m < n && n as i64 > self.nr()
    }

    /// Whether the threads of a product whose tiles read A in place ([`Self::a_in_place`])
    /// split its columns: one matrix of `m` rows, `k` steps and `n` columns, whose panels
    /// divide evenly among `target`'s threads and whose A takes at most a quarter of the
    /// level 2 cache. Split by rows, each thread packs all of B and reads its rows of A once
    /// per panel; split by panels, it packs only its panels of B and reads all of A once per
    /// panel: the same bytes of A, which stay in its level 2 cache while they are few.
    /// Measured on two threads of the Xeon VM of family 6 model 167 (`kiln bench`, three or
    /// four alternating pairs): `[256,256] x [256,256]` 0.102-0.103 -> 0.095-0.101 ms (packing
    /// B was 6.6% of its samples); 512 and 1024 rows even; 2048 rows (A 2 MiB) 2-3% slower.
    pub fn splits_columns_in_place(
        &self,
        batch: usize,
        (m, k, n): (usize, usize, usize),
        target: &TargetInfo,
    ) -> bool {
        let panels = self.panels(n);
        let threads = target.threads.max(1) as i64;
        let a_bytes = (m * k) as i64 * self.bytes;
        self.a_in_place
            && batch == 1
            && panels >= threads
            && panels % threads == 0
            && a_bytes * 4 <= target.l2_bytes as i64
    }

    /// This blocking with packed B blocks of at least `n` columns, so every block of C holds
    /// whole rows (for an epilogue that reduces over rows).
    pub fn whole_rows(self, n: usize) -> Blocking {
        let nr = self.nr();
        Blocking {
            nc: self.nc.max((n as i64 + nr - 1) / nr * nr),
            ..self
        }
    }

    /// This blocking for a GEMM of `n` columns and `k` contraction steps (one block) whose
    /// epilogue's result a chained product reads (see [`crate::kernel::Chain`]): blocks of rows
    /// of at most `chain_bytes` (at least one tile's rows, no more than before), and
    /// contraction blocks of `k` steps rounded up to 16, so that B's packed block of whole rows
    /// (up to the target's `FusionLimits::chain_row` columns) takes no more room than it needs.
    pub fn chained(self, n: usize, k: usize) -> Blocking {
        let row = n as i64 * self.bytes;
        Blocking {
            mc: ((self.chain_bytes / row / self.mr).max(1) * self.mr).min(self.mc),
            kc: self.kc.min((k as i64 + 15) / 16 * 16),
            ..self
        }
    }

    /// This blocking for a GEMM of `k` contraction steps (one block) whose epilogue is a
    /// softmax computed online for a chained product with blocking `bl2` (see
    /// [`crate::kernel::Chain::online`]): blocks of columns (of keys) of whole panels, at most
    /// the chained product's contraction block, so that each block of its rows is one
    /// contraction block of the second product; blocks of rows of at most `chain_bytes` of
    /// such a block (at least one tile's rows, no more than before); contraction blocks as
    /// [`Self::chained`] cuts them.
    pub fn online(self, k: usize, bl2: Blocking) -> Blocking {
        let nr = self.nr();
        let nc = (bl2.kc / nr).max(1) * nr;
        let row = nc * self.bytes;
        Blocking {
            nc,
            mc: ((self.chain_bytes / row / self.mr).max(1) * self.mr).min(self.mc),
            kc: self.kc.min((k as i64 + 15) / 16 * 16),
            ..self
        }
    }

    /// Columns of the packed B block for `n` columns: whole panels, at most `nc`.
    pub fn nc_for(&self, n: i64) -> i64 {
        let nr = self.nr();
        ((n + nr - 1) / nr * nr).min(self.nc)
    }

    /// Scratch bytes a kernel with `n` columns needs per call: one packed block of B and one of
    /// A, each a multiple of 64 bytes.
    /// A product streaming B ([`Self::stream`]) needs its block of `mc` rows of the product by
    /// rows of B, nothing by dot products.
    pub fn scratch_bytes(&self, n: i64) -> usize {
        match self.stream {
            Some(Stream::Rows) => return (self.mc * self.nc_for(n) * self.bytes) as usize,
            Some(Stream::Dots) => return 0,
            None => {}
        }
        ((self.kc * self.nc_for(n) + self.mc * self.kc) * self.bytes) as usize
    }

    /// Where a chained product's buffers lie in the scratch memory of this blocking's GEMM of
    /// `n` columns, after its own (see [`ChainScratch`]), for a second product of `n2` columns
    /// with blocking `bl2`.
    ///
    /// With `online` (a softmax computed online, [`Self::online`]; the value is the rows per
    /// batch), the block of the epilogue's result holds the block's `nc` columns only, B2 is
    /// packed one contraction block at a time, and each row of a batch has its running
    /// maximum and sum after the chained product's packed A.
    pub fn chain_scratch(
        &self,
        n: i64,
        bl2: Blocking,
        n2: i64,
        online: Option<i64>,
    ) -> ChainScratch {
        let line = 64 / self.bytes;
        let up = |x: i64, to: i64| (x + to - 1) / to * to;
        let block = self.kc * self.nc_for(n) + self.mc * self.kc;
        let (p_cols, b2_rows) = match online {
            Some(_) => (self.nc, bl2.kc),
            None => (n, up(n, bl2.kc)),
        };
        let b2 = block + up(self.mc * p_cols, line);
        let cols2 = up(n2, bl2.nr());
        let a2 = b2 + b2_rows * cols2;
        let state = a2 + up(self.mc, bl2.mr) * bl2.kc;
        let rows = up(online.unwrap_or(0), line);
        let end = state + 2 * rows;
        ChainScratch {
            p: block,
            b2,
            cols2,
            a2,
            max: state,
            sum: state + rows,
            bytes: (end * self.bytes) as usize,
        }
    }
}

/// A chained product's buffers in a GEMM's scratch memory, as element offsets (each a multiple
/// of 64 bytes): the block of the epilogue's result (`mc` rows), the second product's B packed
/// whole (every contraction block of `kc2` steps, `cols2` columns each, packed once per batch
/// and read by every block of rows; one contraction block at a time for an online softmax),
/// its packed block of A, and for an online softmax each row's running maximum and sum.
#[derive(Clone, Copy, Debug)]
pub struct ChainScratch {
    pub p: i64,
    pub b2: i64,
    /// Columns of each packed contraction block of B2: whole panels.
    pub cols2: i64,
    pub a2: i64,
    pub max: i64,
    pub sum: i64,
    /// The whole scratch memory's size.
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedule of the first GEMM of program `src` on `t`, canonicalized as the backend
    /// does (a convolution becomes a GEMM there).
    fn schedule(src: &str, t: &TargetInfo) -> GemmSchedule {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let opts = crate::Options::default();
        let g = crate::pipeline::prepare(&f, &opts, t).expect("prepared");
        let fused = crate::pipeline::fused_kernels(&g, &opts, t);
        let k = fused
            .kernels
            .iter()
            .flatten()
            .find_map(|k| gemm_schedule(k, t));
        k.expect("a GEMM")
    }

    /// The reference target with vectors of `bytes` bytes.
    fn vectors(bytes: usize) -> TargetInfo {
        TargetInfo {
            vector_bytes: bytes,
            ..TargetInfo::reference()
        }
    }

    /// A small product whose tiles read A in place splits its panels of columns among the
    /// threads; one whose A is large, whose panels do not divide evenly, or whose A is packed
    /// splits its rows.
    #[test]
    fn small_products_reading_a_in_place_split_their_columns() {
        let t = vectors(64);
        let split = |m: usize, k: usize, n: usize, threads: usize| {
            let t = TargetInfo {
                threads,
                ..t.clone()
            };
            let bl = Blocking::new(DType::F32, &t, n, k).reading_a_in_place(
                (1, n),
                (false, false),
                &t.gemm,
            );
            bl.splits_columns_in_place(1, (m, k, n), &t)
        };
        // 4 panels of 64 columns, A 256 KiB: split by panels on 2 and 4 threads.
        assert!(split(256, 256, 256, 2));
        assert!(split(256, 256, 256, 4));
        // A of 2 MiB would not stay in the level 2 cache; 3 panels of 48 on 2 threads, 8 threads
        // for 4 panels, and 16 panels (A packed) keep rows.
        assert!(!split(2048, 256, 256, 2));
        assert!(!split(256, 256, 144, 2));
        assert!(!split(256, 256, 256, 8));
        assert!(!split(256, 256, 1024, 2));
        // Batched products keep rows.
        let bl = Blocking::new(DType::F32, &t, 256, 256).reading_a_in_place(
            (1, 256),
            (false, false),
            &t.gemm,
        );
        assert!(!bl.splits_columns_in_place(2, (256, 256, 256), &t));
    }

    /// 512-bit products take the 8 x 3, 6 x 4 or 12 x 2 tile that pads the columns least, 12 x 2
    /// only where 8 x 3 would pad them by more than a tenth; 256-bit ones keep 6 x 2.
    #[test]
    fn products_take_the_tile_that_pads_least() {
        for (d, n, tile) in [
            (DType::F32, 1024, (6, 4)),
            (DType::F32, 2048, (6, 4)),
            (DType::F32, 512, (6, 4)),
            (DType::F32, 250, (6, 4)),
            (DType::F32, 96, (8, 3)),
            (DType::F32, 960, (8, 3)),
            (DType::F32, 1000, (8, 3)),
            (DType::F32, 600, (8, 3)),
            (DType::F32, 64, (6, 4)),
            (DType::F32, 160, (12, 2)),
            (DType::F32, 32, (12, 2)),
            (DType::F32, 10, (8, 1)),
            (DType::F64, 1024, (6, 4)),
            (DType::F64, 600, (8, 3)),
        ] {
            let bl = Blocking::new(d, &vectors(64), n, 512);
            assert_eq!((bl.mr, bl.nv), tile, "{d:?}, {n} columns");
            assert_eq!(bl.mc % bl.mr, 0);
            assert_eq!(bl.nc % bl.nr(), 0);
        }
        let bl = Blocking::new(DType::F32, &vectors(32), 1000, 512);
        assert_eq!((bl.mr, bl.nv), (6, 2));
    }

    /// With two 512-bit FMA ports (an Intel Xeon), products of more than 256 columns and at
    /// least 256 steps take the 14 x 2 tile, narrower or shorter ones the tile that pads least;
    /// 256-bit products keep 6 x 2.
    #[test]
    fn two_fma_ports_take_the_tall_tile_past_256_columns() {
        let intel = |bytes: usize| TargetInfo {
            gemm: crate::target::GemmLimits::two_fma512_ports(),
            ..vectors(bytes)
        };
        for (d, n, tile) in [
            (DType::F32, 2048, (14, 2)),
            (DType::F32, 1024, (14, 2)),
            (DType::F32, 1000, (14, 2)),
            (DType::F32, 257, (14, 2)),
            (DType::F32, 256, (6, 4)),
            (DType::F32, 96, (8, 3)),
            (DType::F32, 10, (8, 1)),
            (DType::F64, 1024, (14, 2)),
        ] {
            let bl = Blocking::new(d, &intel(64), n, 512);
            assert_eq!((bl.mr, bl.nv), tile, "{d:?}, {n} columns");
            assert_eq!(bl.mc % bl.mr, 0);
            // The tall tile's loop prefetches B 8 steps and A 16 steps ahead; no other does.
            let ahead = (bl.prefetch.b_steps, bl.prefetch.a_steps);
            assert_eq!(ahead, if tile.0 == 14 { (8, 16) } else { (0, 0) });
        }
        // Short contractions keep the tile that pads least (attention's 64-step scores).
        for (k, tile) in [(64, (6, 4)), (255, (6, 4)), (256, (14, 2)), (2048, (14, 2))] {
            let bl = Blocking::new(DType::F32, &intel(64), 2048, k);
            assert_eq!((bl.mr, bl.nv), tile, "{k} steps");
        }
        let bl = Blocking::new(DType::F32, &intel(32), 2048, 512);
        assert_eq!((bl.mr, bl.nv), (6, 2));
        assert_eq!(bl.prefetch, crate::target::TilePrefetch::default());
        let bl = Blocking::new(DType::F32, &vectors(64), 2048, 512);
        assert_eq!(bl.prefetch, crate::target::TilePrefetch::default());
    }

    /// A block's last rows, fewer than a tile's, take the shortest tail tile that covers them:
    /// 4 and 8 rows below the tall tile's 14, 4 below 8 x 3's, 6 x 4's and 256-bit 6 x 2's;
    /// none for the compact tile, a streaming product or a target without them. The kernels
    /// dump says which.
    #[test]
    fn a_blocks_last_rows_take_a_shorter_tile() {
        let intel = TargetInfo {
            gemm: crate::target::GemmLimits::two_fma512_ports(),
            ..vectors(64)
        };
        for (target, n, k, mr, tails) in [
            (&intel, 1024, 1024, 14, vec![4, 8]),
            (&intel, 96, 512, 8, vec![4]),
            (&intel, 256, 512, 6, vec![4]),
            (&vectors(32), 1024, 512, 6, vec![4]),
            (&intel, 10, 512, 8, vec![]),
        ] {
            let bl = Blocking::new(DType::F32, target, n, k);
            assert_eq!(bl.mr, mr, "{n} columns");
            assert_eq!(bl.tails.sizes(bl.mr), tails, "{n} columns");
        }
        let none = TargetInfo {
            gemm: crate::target::GemmLimits {
                tail_tiles: Default::default(),
                ..crate::target::GemmLimits::two_fma512_ports()
            },
            ..vectors(64)
        };
        let bl = Blocking::new(DType::F32, &none, 1024, 1024);
        assert_eq!((bl.mr, bl.tails), (14, Default::default()));
        let bl = Blocking::new(DType::F32, &intel, 1024, 1024).streaming(5, &intel.gemm);
        assert!(bl.stream.is_some() && bl.tails.sizes(bl.mr).is_empty());
        // A variant leaves at least two rows of the tile out; at most `count` of them.
        let t = crate::target::TailTiles { rows: 4, count: 3 };
        assert_eq!(t.sizes(14), [4, 8, 12]);
        assert_eq!(t.sizes(13), [4, 8]);
        assert_eq!(t.sizes(5), Vec::<i64>::new());
        assert_eq!(t.for_rows(5), Default::default());
        let dump =
            |target: &TargetInfo| schedule_text(Blocking::new(DType::F32, target, 1024, 1024));
        assert!(dump(&intel).ends_with(", prefetch B 8 A 16, C ahead, tail tiles 4 8"));
        assert!(!dump(&none).contains("tail"));
    }

    /// With two 512-bit FMA ports (an Intel Xeon), every whole tile asks for the next tile's
    /// C ahead: the tall one, those that pad least, 256-bit ones on that CPU; not the compact
    /// tile or a streaming product's, nor any tile of a target without it (the reference
    /// target, the Zen 4's limits). The kernels dump says which.
    #[test]
    fn intel_tiles_ask_for_the_next_tiles_c_ahead() {
        let intel = |bytes: usize| TargetInfo {
            gemm: crate::target::GemmLimits::two_fma512_ports(),
            ..vectors(bytes)
        };
        for (bytes, n, k, ahead) in [
            (64, 2048, 2048, true),
            (64, 256, 256, true),
            (64, 96, 64, true),
            (32, 1024, 512, true),
            (64, 10, 512, false),
            (32, 8, 512, false),
        ] {
            let bl = Blocking::new(DType::F32, &intel(bytes), n, k);
            assert_eq!(bl.c_ahead, ahead, "{bytes} bytes, {n} columns, {k} steps");
            assert!(!Blocking::new(DType::F32, &vectors(bytes), n, k).c_ahead);
        }
        let bl = Blocking::new(DType::F32, &intel(64), 1024, 1024);
        assert!(!bl.streaming(5, &intel(64).gemm).c_ahead);
        assert!(!bl.streaming_dots(5, &intel(64).gemm).c_ahead);
        assert!(!Blocking::new(DType::F32, &TargetInfo::reference(), 1024, 1024).c_ahead);
        let six = schedule_text(Blocking::new(DType::F32, &intel(64), 256, 256));
        assert!(six.ends_with(", C ahead, tail tiles 4"), "{six}");
        let plain = schedule_text(Blocking::new(DType::F32, &vectors(64), 256, 256));
        assert!(!plain.contains("ahead"), "{plain}");
    }

    /// The kernels dump's line for a product of one matrix with blocking `bl`.
    fn schedule_text(bl: Blocking) -> String {
        GemmSchedule {
            blocking: bl,
            chain: None,
            split_columns: false,
            scratch: 0,
        }
        .to_string()
    }

    /// Products at most one vector wide, and only those, take the compact tile: 10 and 16
    /// columns of f32 with 512-bit vectors, 8 with 256-bit ones; not 17, nor 9 with 256-bit.
    #[test]
    fn only_products_one_vector_wide_take_the_compact_tile() {
        for (bytes, d, n, compact) in [
            (64, DType::F32, 10, true),
            (64, DType::F32, 16, true),
            (64, DType::F32, 17, false),
            (64, DType::F64, 8, true),
            (64, DType::F64, 9, false),
            (32, DType::F32, 8, true),
            (32, DType::F32, 9, false),
            (64, DType::F32, 1024, false),
        ] {
            let bl = Blocking::new(d, &vectors(bytes), n, 512);
            assert_eq!(
                bl.compact, compact,
                "{d:?}, {n} columns, {bytes}-byte vectors"
            );
            assert_eq!(
                bl.compact,
                bl.nv == 1,
                "{d:?}, {n} columns, {bytes}-byte vectors"
            );
        }
    }

    /// Products of one matrix stored by rows with 2 to `a_in_place_panels` panels of columns
    /// read A in place; one panel (always in place), more panels, A stored transposed,
    /// batched products and a convolution's keep their own way.
    #[test]
    fn products_of_a_few_panels_read_a_in_place() {
        let t = vectors(64);
        assert_eq!(
            (t.gemm.a_in_place_panels, t.gemm.a_in_place_panels_rows),
            (2, 4)
        );
        for (batch, n, a_trans, conv, in_place) in [
            (1, 256, false, false, true),
            (1, 192, false, false, true),
            (1, 128, false, false, true),
            (1, 64, false, false, false),
            (1, 257, false, false, false),
            (1, 1024, false, false, false),
            (1, 256, true, false, false),
            (1, 192, true, false, false),
            (1, 128, true, false, true),
            (64, 128, false, false, true),
            (64, 128, true, false, true),
            (64, 192, false, false, false),
            (1, 256, false, true, false),
            (1, 128, false, true, false),
        ] {
            let bl = Blocking::new(DType::F32, &t, n, 512).reading_a_in_place(
                (batch, n),
                (a_trans, conv),
                &t.gemm,
            );
            assert_eq!(
                bl.a_in_place, in_place,
                "batch {batch}, {n} columns, a_trans {a_trans}, conv {conv}"
            );
        }
        // The schedule of the transformer step's `[2048,1024] x [1024,256]` says so; 1024
        // columns do not.
        let schedule = |n: usize| {
            let text = format!(
                "func @g(%0: f32[2048,1024], %1: f32[1024,{n}]) -> f32[2048,{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[2048,{n}]\n  return %2\n}}\n"
            );
            let f = kiln_ir::parse_func_text(&text).expect("valid IR");
            let fused = crate::pipeline::fused_kernels(&f, &crate::Options::default(), &t);
            let k = fused.kernels.iter().flatten().next().expect("a kernel");
            gemm_schedule(k, &t).expect("a GEMM").to_string()
        };
        assert_eq!(
            schedule(256),
            "gemm 6x64 kc 512 mc 96 nc 2048, A in place, tail tiles 4"
        );
        assert_eq!(
            schedule(1024),
            "gemm 6x64 kc 512 mc 96 nc 2048, tail tiles 4"
        );
    }

    /// A chained product's buffers lie after the GEMM's own, in order, 64-byte aligned, each as
    /// large as what is stored in it: the block of rows of the epilogue's result, the second
    /// product's B packed whole (every contraction block, whole panels) and its packed A (the
    /// block's rows in whole slivers of its own tile).
    #[test]
    fn chained_buffers_are_aligned_and_do_not_overlap() {
        for d in [DType::F32, DType::F64] {
            for wide in [false, true] {
                for (n, n2, k) in [
                    (4, 8, 8),
                    (512, 64, 64),
                    (600, 37, 40),
                    (97, 13, 256),
                    (2048, 200, 64),
                    (16384, 64, 128),
                ] {
                    let bl = Blocking::new(d, &vectors(if wide { 64 } else { 32 }), n as usize, k)
                        .whole_rows(n as usize)
                        .chained(n as usize, k);
                    assert!(bl.kc >= k as i64 && bl.kc % 16 == 0);
                    let bl2 = Blocking::new(
                        d,
                        &vectors(if wide { 64 } else { 32 }),
                        n2 as usize,
                        n as usize,
                    );
                    let at = bl.chain_scratch(n, bl2, n2, None);
                    let up = |x: i64, to: i64| (x + to - 1) / to * to;
                    let line = 64 / bl.bytes;
                    let what = format!("{d:?} wide {wide}, {n} then {n2} columns, {k} steps");
                    for off in [at.p, at.b2, at.a2] {
                        assert_eq!(off % line, 0, "{what}");
                    }
                    assert!(
                        bl.mc * n * bl.bytes <= 64 * 1024 || bl.mc == bl.mr,
                        "{what}"
                    );
                    assert_eq!(at.p, bl.scratch_bytes(n) as i64 / bl.bytes, "{what}");
                    assert!(at.b2 >= at.p + bl.mc * n, "{what}");
                    assert_eq!(at.cols2, up(n2, bl2.nr()), "{what}");
                    assert!(at.a2 >= at.b2 + up(n, bl2.kc) * at.cols2, "{what}");
                    let end = at.a2 + up(bl.mc, bl2.mr) * bl2.kc;
                    assert!(at.bytes as i64 >= end * bl.bytes, "{what}");
                }
            }
        }
    }

    /// An online softmax's buffers: the block buffer holds a block of rows of one block of
    /// columns (whole panels, at most the second product's contraction block), B2 one packed
    /// contraction block, then the packed A and each row's maximum and sum, all 64-byte
    /// aligned and apart.
    #[test]
    fn online_buffers_are_aligned_and_do_not_overlap() {
        for d in [DType::F32, DType::F64] {
            for wide in [false, true] {
                for (n, n2, k, m) in [
                    (16385, 8, 8, 3),
                    (20000, 70, 16, 45),
                    (512, 64, 64, 512),
                    (100000, 13, 256, 1000),
                ] {
                    let bl2 = Blocking::new(
                        d,
                        &vectors(if wide { 64 } else { 32 }),
                        n2 as usize,
                        n as usize,
                    );
                    let bl = Blocking::new(d, &vectors(if wide { 64 } else { 32 }), n as usize, k)
                        .online(k, bl2);
                    let what = format!("{d:?} wide {wide}, {n} then {n2} columns, {k} steps");
                    assert!(bl.nc % bl.nr() == 0 && bl.nc <= bl2.kc, "{what}");
                    assert!(bl.kc >= k as i64 && bl.kc % 16 == 0, "{what}");
                    assert!(
                        bl.mc * bl.nc * bl.bytes <= 64 * 1024 || bl.mc == bl.mr,
                        "{what}"
                    );
                    let at = bl.chain_scratch(n, bl2, n2, Some(m));
                    let up = |x: i64, to: i64| (x + to - 1) / to * to;
                    let line = 64 / bl.bytes;
                    for off in [at.p, at.b2, at.a2, at.max, at.sum] {
                        assert_eq!(off % line, 0, "{what}");
                    }
                    assert_eq!(at.p, bl.scratch_bytes(n) as i64 / bl.bytes, "{what}");
                    assert!(at.b2 >= at.p + bl.mc * bl.nc, "{what}");
                    assert!(at.a2 >= at.b2 + bl2.kc * at.cols2, "{what}");
                    assert!(at.max >= at.a2 + up(bl.mc, bl2.mr) * bl2.kc, "{what}");
                    assert!(at.sum >= at.max + m, "{what}");
                    assert!(at.bytes as i64 >= (at.sum + m) * bl.bytes, "{what}");
                }
            }
        }
    }

    /// Products of two panels of columns read A in place, and say so; one panel (in place
    /// anyway), three panels and a convolution's product of two do not take the flag.
    #[test]
    fn products_of_two_panels_read_a_in_place() {
        let product = |batch: usize, m: usize, k: usize, n: usize| {
            format!(
                "func @g(%0: f32[{batch},{m},{k}], %1: f32[{batch},{k},{n}]) -> f32[{batch},{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{batch},{m},{n}]\n  return %2\n}}\n"
            )
        };
        // The heads' scores on AVX-512 (two panels of 64) and on AVX2 (two of 16).
        for (bytes, n, in_place) in [
            (64, 128, true),
            (64, 64, false),
            (64, 192, false),
            (32, 32, true),
            (32, 128, false),
        ] {
            let g = schedule(&product(64, 128, 64, n), &vectors(bytes));
            assert_eq!(g.blocking.a_in_place, in_place, "{bytes}-byte vectors, {n}");
            assert_eq!(g.to_string().contains(", A in place"), in_place, "{g}");
        }
        let conv = "func @c(%0: f32[1,8,10,10], %1: f32[128,8,3,3]) -> f32[1,128,8,8] {\n  %2 = convolution %0, %1 {window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]} : f32[1,128,8,8]\n  return %2\n}\n";
        let g = schedule(conv, &vectors(64));
        assert!(!g.blocking.a_in_place, "{g}");
    }

    /// Products of at most `stream_rows` rows per matrix, wider than a vector, with B stored by
    /// rows and no chained product, stream B: their rows in the fewest even groups of at most
    /// `stream_tile_rows`, a tile of a group's rows by as many vectors as leave registers (24
    /// accumulators with 512-bit vectors, 12 with 256-bit ones, at most 4 vectors),
    /// `stream_steps` steps a pass, and a block of the product of `stream_block_bytes` in the
    /// scratch memory; with B stored transposed (and A by rows),
    /// dot products; more rows, both stored transposed, a product at most a vector wide (the
    /// compact tile) or a target that never streams pack B.
    #[test]
    fn products_of_a_few_rows_stream_b() {
        let product = |m: usize, n: usize, b_contract: usize| {
            let b = if b_contract == 0 {
                format!("f32[700,{n}]")
            } else {
                format!("f32[{n},700]")
            };
            format!(
                "func @g(%0: f32[{m},700], %1: {b}) -> f32[{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [{b_contract}]}} : f32[{m},{n}]\n  return %2\n}}\n"
            )
        };
        // (vector bytes, rows, columns, the tile's rows and vectors, the block's rows).
        for (bytes, m, n, mr, nv, mc) in [
            (64, 1, 4096, 1, 4, 1),
            (64, 6, 1000, 6, 4, 6),
            (64, 7, 1000, 7, 3, 7),
            (64, 8, 300, 8, 3, 8),
            (64, 9, 1000, 5, 4, 10),
            (64, 12, 1000, 6, 4, 12),
            (64, 32, 1000, 8, 3, 32),
            (32, 1, 4096, 1, 4, 1),
            (32, 4, 1000, 4, 3, 4),
            (32, 8, 100, 8, 1, 8),
            (32, 20, 500, 7, 1, 21),
        ] {
            let t = vectors(bytes);
            let g = schedule(&product(m, n, 0), &t);
            let b = g.blocking;
            let what = format!("{bytes}-byte vectors, {m} x {n}: {g}");
            assert!(
                b.stream == Some(Stream::Rows) && g.to_string().contains(", B streamed"),
                "{what}"
            );
            assert_eq!(
                (b.mr, b.nv, b.mc, b.kc),
                (mr, nv, mc, t.gemm.stream_steps),
                "{what}"
            );
            assert_eq!(b.nc % b.nr(), 0, "{what}");
            assert!(
                b.mc * b.nc * 4 <= t.gemm.stream_block_bytes || b.nc == b.nr(),
                "{what}"
            );
            assert_eq!(g.scratch, b.scratch_bytes(n as i64), "{what}");
            assert_eq!(
                g.scratch as i64,
                b.mc * b.nc.min((n as i64 + b.nr() - 1) / b.nr() * b.nr()) * 4,
                "{what}"
            );
            assert!(!b.a_in_place, "{what}");
        }
        // B stored transposed: dot products, up to 8 rows of B a tile and no scratch memory.
        for (bytes, m, n, nv) in [
            (64, 1, 4096, 8),
            (64, 4, 1000, 6),
            (64, 8, 300, 3),
            (32, 1, 4096, 8),
            (32, 4, 1000, 3),
        ] {
            let g = schedule(&product(m, n, 1), &vectors(bytes));
            let what = format!("{bytes}-byte vectors, {m} x {n}, B transposed: {g}");
            assert_eq!(g.blocking.stream, Some(Stream::Dots), "{what}");
            assert!(
                g.to_string().contains(", B streamed by dot products"),
                "{what}"
            );
            assert_eq!(
                (g.blocking.mr, g.blocking.nv, g.scratch),
                (m as i64, nv, 0),
                "{what}"
            );
        }
        let t = vectors(64);
        for (m, n, b_contract) in [(33, 1000, 0), (9, 1000, 1), (4, 16, 0)] {
            let g = schedule(&product(m, n, b_contract), &t);
            assert!(
                g.blocking.stream.is_none(),
                "{m} x {n}, B contracted on {b_contract}: {g}"
            );
        }
        let never = TargetInfo {
            gemm: crate::target::GemmLimits {
                stream_rows: 0,
                ..Default::default()
            },
            ..vectors(64)
        };
        assert!(
            schedule(&product(1, 4096, 0), &never)
                .blocking
                .stream
                .is_none()
        );
        // A stored transposed and B transposed: packed.
        let both = "func @g(%0: f32[700,2], %1: f32[1000,700]) -> f32[2,1000] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [1]} : f32[2,1000]\n  return %2\n}\n";
        assert!(schedule(both, &t).blocking.stream.is_none());
    }

    /// The target's vector width decides the tile and the contraction block: 256-bit vectors
    /// (AVX2, or AVX-512 hosts with `narrow_vectors`) take 6 x 2 tiles of 256 steps, 512-bit
    /// ones 6 x 4 (where it pads least) of 512.
    #[test]
    fn wide_and_narrow_vectors_block_differently() {
        let product = "func @g(%0: f32[512,512], %1: f32[512,1024]) -> f32[512,1024] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[512,1024]\n  return %2\n}\n";
        let f = kiln_ir::parse_func_text(product).expect("valid IR");
        let schedule = |t: &TargetInfo| {
            let fused = crate::pipeline::fused_kernels(&f, &crate::Options::default(), t);
            let k = fused.kernels.iter().flatten().next().expect("a kernel");
            gemm_schedule(k, t).expect("a GEMM")
        };
        let narrow = schedule(&vectors(32));
        assert_eq!(
            narrow.to_string(),
            "gemm 6x16 kc 256 mc 192 nc 4096, tail tiles 4, split columns"
        );
        let wide = schedule(&vectors(64));
        assert_eq!(
            wide.to_string(),
            "gemm 6x64 kc 512 mc 96 nc 2048, tail tiles 4, split columns"
        );
        assert_ne!(narrow.blocking, wide.blocking);
        // Narrower targets than AVX2 keep the 256-bit blocking.
        assert_eq!(schedule(&vectors(16)), narrow);
        // The cache blocks are the target's.
        let mut t = vectors(32);
        t.gemm.a_block_bytes /= 2;
        assert_eq!(schedule(&t).blocking.mc, 96);
    }
}
