//! What a target is, as data: [`TargetInfo`].
//!
//! Everything the kernel layer decides for a particular machine (how large a fused product's
//! epilogue may be, when a convolution is worth Winograd's transforms, the optimizer's costs,
//! when a loop nest streams its stores or runs in tiles) reads it from a [`TargetInfo`] passed
//! in, never from a constant of one backend or from the host it runs on. This crate does not
//! probe the machine: a backend describes it ([`TargetInfo::cpu_host`] from a [`HostCpu`] the
//! LLVM backend detects), and [`TargetInfo::reference`] is a fixed CPU for dumps and tests, so
//! that their text is the same on every machine.
//!
//! The default values are those measured on the CPU backend's development machine (a Zen 4
//! EPYC); the notes on each field say what they were measured on.

/// A target the kernels are decided for.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetInfo {
    /// Bytes of the widest vector register kernels use (32: AVX2, 64: AVX-512).
    pub vector_bytes: usize,
    /// Threads kernels run on.
    pub threads: usize,
    /// Clock, in GHz (the optimizer's cost model).
    pub ghz: f64,
    /// Memory bandwidth, in GB/s (the optimizer's cost model).
    pub memory_gbps: f64,
    /// Bytes of a cache line: the unit of memory traffic, and the width of one streaming store.
    pub cache_line: usize,
    /// Bytes of the level 1 data cache (per core).
    pub l1_bytes: usize,
    /// Bytes of the level 2 cache (per core).
    pub l2_bytes: usize,
    /// Bytes of the last-level cache (shared).
    pub llc_bytes: usize,
    /// Whether the target has non-temporal (streaming) stores that bypass the caches.
    pub nontemporal_stores: bool,
    /// How large fused kernels may grow (see [`FusionLimits`]).
    pub fusion: FusionLimits,
    /// When loop nests use which loop strategy (see [`LoopLimits`]).
    pub loops: LoopLimits,
    /// The shape of a float sum's tree of partial sums (see [`SumTree`]).
    pub sums: SumTree,
    /// The cache blocks of a matrix product (see [`GemmLimits`]).
    pub gemm: GemmLimits,
    /// When a kernel's rows are split across threads (see [`SplitLimits`]).
    pub splits: SplitLimits,
    /// A GPU's properties (`None` for a CPU); the NVIDIA backend fills them.
    pub gpu: Option<Gpu>,
}

/// The capacities fusion and canonicalization decide with: what the target's blocking of a
/// matrix product can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionLimits {
    /// Widest product (columns) whose epilogue may reduce over its rows: the GEMM then packs
    /// blocks of B that hold whole rows (see [`crate::fuse::row_epilogue`]).
    pub row_epilogue: usize,
    /// Longest contraction of a GEMM whose epilogue's result a chained product reads (see
    /// [`crate::kernel::Chain`]): one contraction block on every target.
    pub chain_k: usize,
    /// Widest product whose epilogue may reduce over its rows when a chained product reads the
    /// result and the epilogue is not a softmax (which runs online, over blocks of columns, for
    /// any width: see [`crate::kernel::Chain::online`]): the blocks of rows are then as few as
    /// one tile's, so the epilogue's result takes `O(rows x columns)` memory for one block
    /// instead of the whole matrix (B's packed blocks take one contraction block of whole
    /// rows).
    pub chain_row: usize,
    /// The smallest input and output feature counts a convolution needs for Winograd's
    /// transforms to pay: they write and read 36 values per 16 outputs per feature, against the
    /// direct GEMM's 9 multiply-adds per output, input and output feature (see
    /// [`crate::canon::winograd_convs`]).
    pub winograd_min_features: usize,
    /// Whether the target's GEMM reads operands in place through strides (see
    /// [`crate::ir::Strides`]), so that transposes, reshapes and slices that only lay an
    /// operand out take no kernel of their own: the CPU's packing and tiles read through
    /// strides, and so do a GPU's GEMM mappings (`gpu/map/strided.rs`: tiles copied with
    /// `cp.async` where the strides keep the copies aligned, else through registers). The
    /// same GEMMs store a plain product through strides into the buffer of a transpose or
    /// reshape of it (see [`crate::ir::Store`]). Off, a kernel copies such layouts.
    pub strided_operands: bool,
    /// The shortest even length of a real transform (`RFFT`/`IRFFT`) done at half length
    /// (see [`crate::fft`]): below it the half length's combination costs about what the
    /// work it saves does (measured on the CPU, docs/performance.md "The small real
    /// transform": on 64 lines 0.34 against 0.52 ms at 2048, 0.30 against 0.29 ms at 1000;
    /// not measured on a GPU, which takes the CPU's value).
    pub fft_half_min: usize,
    /// Whether the target's GEMM tiles leave out contraction steps where one operand is
    /// zero (a causal mask's triangle, checked at run time along with the other operand's
    /// finiteness: see [`crate::ir::ZeroBlocks`]): the CPU's do, and so do a GPU's block
    /// tiles (`gpu/map/zero_steps.rs`; the TMA ring and a thread per element run every step).
    pub zero_steps: bool,
    /// Whether the target's GEMM tiles leave out the elements of a product that no reader
    /// uses (a causal mask's scores above the diagonal, which every reader selects away: see
    /// [`crate::ir::Unread`]), storing zeros there: the CPU's do, and so do a GPU's (a block
    /// tile wholly unread skips its contraction, `gpu/map/skip.rs`).
    pub unread_blocks: bool,
    /// The longest transform done as one product with its DFT matrix (see [`crate::fft`]):
    /// a longer one is factored (four-step, into factors at most this long) or, with no such
    /// factor, done by Bluestein's convolution. Longer direct products do more work per point
    /// (`n` multiply-adds against the factors' sum) in fewer kernels (not measured on a GPU,
    /// which takes the CPU's value).
    pub fft_direct_max: usize,
}

/// The sizes at which a loop nest changes its loop strategy (see
/// [`crate::loop_schedule::KernelSchedule`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopLimits {
    /// Outputs at least this large are written with streaming (non-temporal) stores: they do
    /// not fit the last-level cache together with their inputs (48 MiB on the Zen 4 EPYC), so
    /// each line written would otherwise first be read from memory (write-allocate), a third
    /// more traffic for an elementwise kernel, and would evict the inputs still to be read.
    /// A host's comes from its cache ([`LoopLimits::stream_bytes_for`]).
    pub stream_bytes: usize,
    /// The fewest cache lines an output row must span for streaming stores: shorter rows spend
    /// more on each row's unaligned head and tail, stored one by one, than the stores save (a
    /// pad of `[64, 56, 56, 64]` to `[64, 58, 58, 64]`, rows of 4 lines: 93 ms with them, 19
    /// without).
    pub stream_row_lines: usize,
    /// Edge of the square tiles a transposing kernel runs in (a cache line of f32).
    pub transpose_tile: usize,
    /// The most places a loop is cut at to decide guards (see
    /// [`crate::loop_schedule::guard_segments`]).
    pub guard_cuts: usize,
    /// The most places a kernel's rows (its outermost loop) are cut at to decide guards: a
    /// concatenation of many pieces along its first dimension then runs each piece as a loop
    /// nest of its own, with no guard tree per element (measured on 36 pieces of
    /// `[12544, 64]`: 168 -> 61 ms). Every segment holds only the pieces it decides, so the
    /// code grows by a loop per segment.
    pub row_guard_cuts: usize,
    /// The largest row cache, in bytes (see [`crate::loop_schedule::row_caches`]): a softmax
    /// row of 4096 f32 values (16 KiB), which stays in the L1 cache between the reduction that
    /// fills it and the loop that reads it.
    pub row_cache_bytes: usize,
    /// Positions of the innermost loop a strip-mined column sum computes side by side (see
    /// [`crate::loop_schedule::column_strips`]): each reduction runs once per strip with one
    /// accumulator per position, so its loop reads a contiguous run of the row it is at (one
    /// vector) instead of one strided element per output.
    pub strip: usize,
    /// Vector registers a kernel's column sums may hold side by side: a strip is as wide as
    /// that many vectors of f32 over its column sums allow, at least [`Self::strip`] (each row
    /// then reads a longer contiguous run: a 1024-column sum over 2048 rows of two operands,
    /// 0.90 ms in strips of 16, 0.36 ms in strips of 128 on the Zen 4).
    pub strip_vectors: usize,
    /// Rows a kernel's column sums must reduce for strips as wide as [`Self::strip_vectors`];
    /// sums over fewer rows take strips half as wide. A wide strip pays over many rows (each
    /// row read in longer runs), but over a few hundred it runs even with a half-width one
    /// while its unrolled body costs twice the compile: the MLP step's bias gradients (256
    /// rows of 1,024 columns) took 0.114-0.130 ms in strips of 64 against 0.100-0.111 ms in
    /// strips of 32, and the strips of 32 took its non-product module's compile from 65-67 to
    /// 52-55 ms of CPU (Intel Xeon, family 6 model 207; docs/performance.md, "The MLP step's
    /// cold compile, accounted by CPU time"). 512.
    pub wide_strip_rows: usize,
}

/// The cache blocks a matrix product's blocking is sized by (see
/// [`crate::gemm_schedule::Blocking`]). Measured on the Zen 4 EPYC and an AVX-512 Xeon
/// (matmul_1024/2048, two threads); the register tile itself follows from
/// [`TargetInfo::vector_bytes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmLimits {
    /// Bytes of a packed block of A, kept in the L2 cache across the panels of B (192 KiB).
    pub a_block_bytes: i64,
    /// Bytes of a packed block of B, kept in the L3 cache across the blocks of rows (4 MiB).
    pub b_block_bytes: i64,
    /// Bytes of a block of rows of a GEMM's epilogue result that a chained product reads, kept
    /// in the L2 cache between the epilogue and the second product (64 KiB).
    pub chain_block_bytes: i64,
    /// Contraction steps per block with 256-bit vectors (256).
    pub kc_256: i64,
    /// Contraction steps per block with 512-bit vectors: 8 x 3 vectors with 512-step blocks
    /// beat 12 x 2, 6 x 4 and shorter blocks where the columns fill the panels of all three
    /// (matmul_1024/2048 on AVX-512, two threads).
    pub kc_512: i64,
    /// Panels of columns up to which any product's tiles (not a convolution's) read A where it
    /// is stored instead of packing it (see
    /// [`Blocking::a_in_place`](crate::gemm_schedule::Blocking::a_in_place)): packing A pays
    /// for itself across many panels, not across one or two (2; attention's heads, batched,
    /// A by rows or by columns).
    pub a_in_place_panels: i64,
    /// The most panels of columns a product of one matrix with A stored by rows may have whose
    /// tiles read A in place: the packing costs about as much per element of A as a few
    /// panels' multiply-adds by it, and the tiles read A's rows in place about as fast as
    /// packed slivers (4; the transformer's products of 256 columns).
    pub a_in_place_panels_rows: i64,
    /// The 512-bit register tile of products wider than [`TallTile::min_columns`], where the
    /// target takes a tall one (see [`TallTile`]); `None`: every 512-bit product takes the
    /// tile of 8 x 3, 6 x 4 or 12 x 2 vectors that pads its columns least (the Zen 4, whose
    /// 512-bit multiply-adds are double-pumped: one a cycle).
    pub tall_512: Option<TallTile>,
    /// The most rows per matrix of a product whose tiles stream B, reading its rows where
    /// they are stored, instead of packing it (see
    /// [`Blocking::stream`](crate::gemm_schedule::Blocking::stream)): packing copies every
    /// element of B for `m` multiply-adds, which for a few rows (a few tokens' activations
    /// times a weight matrix) costs more than the product (32; 0: never). Measured on `[m,
    /// 4096] x [4096, 4096]` (the Xeon VM of family 6 model 167, 2 threads; docs/performance.md,
    /// "Products of a few rows stream B"), packed against streamed: 8 rows 5.4 against 1.9 ms,
    /// 16 rows 7.9 against 3.6, 32 rows 9.5 against 7.0, 48 rows 10.8 against 10.0, 64 rows
    /// 12.4 against 13.4.
    pub stream_rows: i64,
    /// The most rows of A a streaming product's register tile holds: more rows run in groups
    /// of at most this many, each group's tile reading the pass's rows of B in turn (8).
    pub stream_tile_rows: i64,
    /// Contraction steps a streaming product's tiles take per pass over their block of
    /// columns: rows of B read side by side, each from start to end of the block (16).
    /// Measured on `[m, 4096] x [4096, 4096]` (the Xeon VM of family 6 model 167, 2 threads;
    /// docs/performance.md, "Products of a few rows stream B"): with 8 steps and blocks of 16
    /// KiB, 8 rows took 2.7-3.1 ms, with 16 steps and 64 KiB 1.9-2.2; one row even.
    pub stream_steps: i64,
    /// Bytes of the block of the product a streaming GEMM accumulates across all its
    /// contraction steps (64 KiB): the longer the block, the longer each pass's runs of B's
    /// rows, which the prefetchers follow further (see [`Self::stream_steps`]).
    pub stream_block_bytes: i64,
    /// The shorter register tiles a block's last rows take when they are fewer than the
    /// tile's (see [`TailTiles`]).
    pub tail_tiles: TailTiles,
    /// Whether a register tile asks, while it multiplies, for the cache lines of C the next
    /// tile of its panel (the next `mr` rows) will read or store: one line for writing per
    /// iteration of its unrolled loop (see
    /// [`Blocking::c_ahead`](crate::gemm_schedule::Blocking::c_ahead)). A product's C is
    /// usually not in the cache when it is written (a training step's products write
    /// megabytes that the kernels since have pushed out), and a tile's 28 or 24 lines of it
    /// were each read for ownership when the tile stored them, one after another at the end
    /// of its loop. Measured on the Xeon VM of family 6 model 167 (2 threads, alternating
    /// pairs; docs/performance.md, fiftieth session): `[2048,256] x [256,1024]` after a
    /// kernel that evicts the caches 3.49-3.66 -> 3.22-3.40 ms a call (4 of 4), with its C
    /// in the cache even (2.87-3.12 against 2.85-3.22); the transformer step's kernels
    /// (`KILN_PROFILE=1`) 178-182 -> 168-179 ms (4 of 4).
    pub c_ahead: bool,
}

/// Shorter variants of a register tile for the rows a block leaves past its last whole tile:
/// tiles of `rows`, `2 rows`, ... (at most `count` of them) rows by the tile's vectors, each
/// taken by the rows it covers and the tile's rows do not. The full tile multiplies every row
/// it has, so without them 256 rows on the 14 x 2 tile cost as much as 266 (`[256,1024] x
/// [1024,1024]`: 1.80 ms against 1.74 for 252 rows and 1.79 for 266, the Xeon VM of family 6
/// model 167, 2 threads), and 64 rows as much as 70. A variant is kept where it leaves at
/// least two rows of the tile out (`rows` 4, `count` 2: 4 and 8 rows below 14, 4 below 6 and
/// 8). `count` 0: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TailTiles {
    /// Rows of the shortest variant, and the step between variants.
    pub rows: i64,
    /// The most variants.
    pub count: i64,
}

impl TailTiles {
    /// The variants' rows for a tile of `mr` rows, shortest first.
    pub fn sizes(&self, mr: i64) -> Vec<i64> {
        if self.rows <= 0 {
            return Vec::new();
        }
        (1..=self.count.max(0))
            .map(|j| j * self.rows)
            .filter(|&s| s + 2 <= mr)
            .collect()
    }

    /// These variants as a tile of `mr` rows takes them: none where it takes none, so that a
    /// tile without variants compares and prints the same whatever the target's limits.
    pub fn for_rows(self, mr: i64) -> TailTiles {
        if self.sizes(mr).is_empty() {
            TailTiles::default()
        } else {
            self
        }
    }
}

/// A register tile of `rows` x 2 vectors of 512 bits, for CPUs with two 512-bit FMA ports a core
/// (Intel's AVX-512 Xeons): a contraction step loads 2 vectors of packed B and broadcasts
/// `rows` elements of A for `2 rows` multiply-adds, where 6 x 4 loads 4 for 24. B's panels
/// (`kc` x 32 elements, 64 KiB) do not stay in the 48 KiB level 1 cache across the slivers
/// either way; each step's B comes from the level 2 cache, and at two 512-bit multiply-adds a
/// cycle 6 x 4 asks it for 21 bytes a cycle, 14 x 2 for 9 (see docs/performance.md, "Tall
/// tiles on Intel").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TallTile {
    /// Rows of the tile: 2 rows accumulators, 2 B vectors and a broadcast within the 32
    /// vector registers.
    pub rows: i64,
    /// The most columns a product may have and keep the tile that pads least: a product of a
    /// few panels reads A in place ([`GemmLimits::a_in_place_panels_rows`]) and has too few
    /// rows and steps for the tall tile to pay (`[256,256] x [256,256]` ran 4% slower with it).
    pub min_columns: usize,
    /// The fewest contraction steps a product must have to take the tall tile. Over fewer,
    /// the 6 x 4 tile's panel of B (steps x 64 elements: 32 KiB at 128 steps of f32) stays in
    /// the level 1 cache from one sliver of A to the next, so halving B's loads buys nothing,
    /// while the tall tile stores its 28 vectors of C every few steps and, reading A in place
    /// (a chain's first product), reloads spilled row pointers every step. Measured on the
    /// Xeon VM of family 6 model 167 (docs/performance.md, forty-fifth session): attention's
    /// 64-step product of the scores faster with 6 x 4 in 8 of 8 alternating pairs (about
    /// 7%), `[2048,64] x [64,1024]` and `[2048,128] x [128,1024]` 3-5%. From 256 steps the
    /// tall tile stays, as measured when it was chosen.
    pub min_steps: usize,
    /// What the tile's loop asks the caches for ahead of its use (see [`TilePrefetch`]).
    pub prefetch: TilePrefetch,
}

/// Software prefetches in a register tile's loop: each contraction step asks for the packed B
/// row `b_steps` steps ahead (its cache lines) and the packed A column `a_steps` steps ahead
/// (0: none). The tall tile reads its panel of B (`kc` x 32 elements, 64 KiB) from the level 2
/// cache at every sliver of A; on a Xeon VM whose tile ran at about 78% of one core's 512-bit
/// FMA rate, B 8 and A 16 steps ahead took 3-4% less CPU a `[2048,2048]` product (one thread,
/// six alternating pairs, all six faster; docs/performance.md, forty-second session).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TilePrefetch {
    /// Contraction steps ahead the tile asks for packed B's row (0: not asked).
    pub b_steps: i64,
    /// Contraction steps ahead the tile asks for A's column (0: not asked).
    pub a_steps: i64,
}

impl TilePrefetch {
    /// Whether the tile asks for nothing ahead.
    pub fn is_none(&self) -> bool {
        self.b_steps <= 0 && self.a_steps <= 0
    }
}

/// When a kernel runs on several threads (see [`crate::threads`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitLimits {
    /// Work (multiply-adds or elements) below which a kernel runs on one thread (`1 << 16`).
    /// Kept when launches moved to the runtime's thread team (`kiln-team`), which wakes no
    /// thread between back-to-back launches: this limit and the next at `1 << 14` measured
    /// slower on the transformer step (docs/performance.md, "Launches through a thread team").
    pub parallel_work: usize,
    /// Work from which a one-thread kernel runs beside its independent neighbours: waking the
    /// pool's threads cost about 20 us, more than smaller kernels take. Measured with 8
    /// independent kernels of `tanh(x) * x` (one process, alternating calls, 30 pairs each,
    /// side by side against one after the other, both doing the same arithmetic): 40000
    /// elements each 0.150 -> 0.173 ms, 50000 0.185 -> 0.186, 56000 0.206 -> 0.218, 60000
    /// 0.235 -> 0.213 (see docs/performance.md); `7 << 13`.
    pub concurrent_work: usize,
}

impl SplitLimits {
    /// Whether a kernel of `rows` rows and `work` work is split across threads.
    pub fn splits(&self, rows: usize, work: usize) -> bool {
        work >= self.parallel_work && rows >= 2
    }
}

impl Default for GemmLimits {
    fn default() -> GemmLimits {
        GemmLimits {
            a_block_bytes: 192 * 1024,
            b_block_bytes: 4 * 1024 * 1024,
            chain_block_bytes: 64 * 1024,
            kc_256: 256,
            kc_512: 512,
            a_in_place_panels: 2,
            a_in_place_panels_rows: 4,
            tall_512: None,
            stream_rows: 32,
            stream_tile_rows: 8,
            stream_steps: 16,
            stream_block_bytes: 64 * 1024,
            tail_tiles: TailTiles { rows: 4, count: 2 },
            c_ahead: false,
        }
    }
}

impl GemmLimits {
    /// The blocks of a CPU with two 512-bit FMA ports a core (an Intel Xeon with AVX-512): the
    /// defaults, with tiles of 14 x 2 vectors for products of more than 256 columns (measured
    /// on a Xeon of family 6 model 207, one thread, on-CPU time per call: `[2048,2048]` 5.6%
    /// and `[1024,1024]` 4.6% less than 6 x 4, 12 x 2 in between; docs/performance.md), and
    /// tiles that ask for the next tile's C ahead ([`GemmLimits::c_ahead`], measured there
    /// only).
    pub fn two_fma512_ports() -> GemmLimits {
        GemmLimits {
            tall_512: Some(TallTile {
                rows: 14,
                min_columns: 256,
                min_steps: 256,
                prefetch: TilePrefetch {
                    b_steps: 8,
                    a_steps: 16,
                },
            }),
            c_ahead: true,
            ..GemmLimits::default()
        }
    }
}

impl Default for SplitLimits {
    fn default() -> SplitLimits {
        SplitLimits {
            parallel_work: 1 << 16,
            concurrent_work: 7 << 13,
        }
    }
}

/// The shape of the tree of partial sums a float sum is computed as, so that its rounding error
/// grows with the logarithm of its length rather than with its length (a plain loop adding `n`
/// values into one accumulator loses up to about `n·ε/2`: the mean of 10⁷ copies of 0.1f32
/// came out 0.09985, and a sum of 2⁴⁰ ones stopped growing at 2²⁴·64). The error bound stated
/// in `ir-specs/ops/reduce.md` is in these values: changing them changes the results of sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SumTree {
    /// The most values a leaf of the tree adds into one accumulator.
    pub leaf: usize,
    /// The most partial sums a node of the tree adds in one chain. Pairwise (2) rounds least
    /// but nests a loop per level, which costs compile time; 16 keeps four levels up to 2^24
    /// values.
    pub fanout: usize,
}

/// A GPU's properties, for the kernels decided for it (filled by the NVIDIA backend).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Threads of a warp, which run in lockstep.
    pub warp_size: usize,
    /// Bytes of shared memory one block may use.
    pub shared_memory_per_block: usize,
    /// Bytes of shared memory a kernel may declare statically (48 KiB on NVIDIA GPUs): a
    /// kernel whose arrays take more holds them in one dynamic array
    /// ([`crate::gpu::ir::GpuKernel::dynamic_shared`]), within `dynamic_shared_bytes`.
    pub static_shared_bytes: usize,
    /// Bytes of dynamic shared memory a block may take when its kernel opts in (the driver's
    /// `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`: 227 KiB on an H200, sm_90; 163 KiB on an A100,
    /// sm_80). Only the mappings `tile_dynamic_bytes` lets go beyond the static limit use it.
    pub dynamic_shared_bytes: usize,
    /// The most shared memory per block a tensor-core product's ring of stages
    /// (`mma_tiles`, `mma_stages`) and an attention tile's arrays (`attention_tiles`) may take
    /// with dynamic shared memory (within `dynamic_shared_bytes`); 0: none, they stay within
    /// [`Gpu::shared_limit`] as every other mapping does (see [`Gpu::tile_limit`]).
    pub tile_dynamic_bytes: usize,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// The `(m, n, k)` shapes of the tensor cores' matrix multiply-adds.
    pub tensor_core_shapes: Vec<(usize, usize, usize)>,
    /// The most threads a block may have.
    pub max_threads_per_block: usize,
    /// Threads per block of an elementwise kernel's grid-stride loop.
    pub elementwise_block: usize,
    /// Bytes of one thread's widest load or store (16: 128-bit accesses). An elementwise
    /// kernel whose outputs divide into such groups gives each thread a group of consecutive
    /// elements per iteration, so contiguous reads and writes are whole vectors.
    pub vector_bytes: usize,
    /// Blocks per multiprocessor a grid-stride grid is given (the grid is `sms` times this,
    /// or fewer when the output has fewer elements): enough resident blocks to hide latency.
    pub blocks_per_sm: usize,
    /// The shortest reduction that gets a warp of its own (one warp per output row, lanes
    /// taking strided chunks); shorter ones run inside one thread per output element.
    pub warp_reduce_min: usize,
    /// The shortest reduction that gets a whole block (`max_threads_per_block` threads, the
    /// warps' partial results combined through shared memory).
    pub block_reduce_min: usize,
    /// Row caches in registers: the most 32-bit registers (an f64 element takes two) that
    /// cached rows may take in one thread of a warp- or block-per-row kernel (its slots
    /// unrolled, each a register), so that a row its reductions and its elements read in
    /// several passes is loaded from global memory once (`gpu/map/row_cache.rs`); 0 turns
    /// register caches off.
    pub row_registers: usize,
    /// Row caches in shared memory: the most bytes of shared memory per block that cached
    /// rows too long for `row_registers` may take; 0 turns shared-memory caches off (rows
    /// that fit neither are read from global memory in every pass).
    pub row_shared_bytes: usize,
    /// The block tiles of a matrix product on the CUDA cores (shared-memory tiles, a register
    /// tile per thread), largest first: a product takes the first that its rows and columns
    /// fill at least half of, so small products get small blocks; a product too thin for any
    /// (a matrix times a vector) runs one thread per element.
    pub gemm_tiles: Vec<GemmTile>,
    /// Shared-memory stages of a CUDA-core product's tiles (at least 2), as `mma_stages` is
    /// for the tensor cores: `gemm_stages - 1` steps of `cp.async` copies in flight, fewer
    /// stages where they do not fit, two for operands staged through registers.
    pub gemm_stages: usize,
    /// The block tiles of a matrix product on the tensor cores (bf16 or f16 operands, an f32
    /// result; `mma.m16n8k16` from `tensor_core_shapes`), largest first, chosen as
    /// `gemm_tiles` are: here `thread_m x thread_n` is one warp's tile (multiples of 16) and
    /// `k` the contraction one shared-memory stage holds (a multiple of 16: `k / 16` `mma`
    /// k-steps per stage; a contraction shorter than `k` stages only what it has, rounded up to
    /// 16).
    pub mma_tiles: Vec<GemmTile>,
    /// Shared-memory stages of a tensor-core product's operand tiles (at least 2): while the
    /// block multiplies one stage, the `cp.async` copies of the next `mma_stages - 1` are in
    /// flight. A tile whose stages do not fit `shared_memory_per_block` gets fewer (then a
    /// smaller `k`), and operands staged through registers keep two.
    pub mma_stages: usize,
    /// Whether a tensor-core product's staged tiles are swizzled in shared memory
    /// ([`crate::gpu::ir::SharedArray::swizzle`]), so that `ldmatrix` and `cp.async` meet
    /// no bank conflicts: unswizzled, the 8 rows of one `ldmatrix` matrix lie `kt` or `tile.n`
    /// elements apart and share 2 to 8 of the 8 bank groups' places.
    pub mma_swizzle: bool,
    /// Whether the tensor cores multiply TF32 operands (`mma.m16n8k8` with `.tf32` A and B and
    /// f32 accumulators: sm_80 and newer). f32 products run there, on `mma_tiles` with their
    /// operands rounded to TF32, only when the options allow it
    /// ([`crate::options::MatmulPrecision::Tf32`]).
    pub tf32: bool,
    /// Whether the GPU runs warpgroup products (`wgmma.mma_async`: 128 threads, operands read
    /// from shared memory through matrix descriptors; sm_90a, whose PTX runs on sm_90 devices
    /// only). Kernels with [`crate::gpu::ir::Stmt::Wgmma`] verify only where it is set.
    pub wgmma: bool,
    /// The block tiles of a product on warpgroups (`wgmma`, where `wgmma` is set; bf16 or f16
    /// operands, an f32 result), largest first, chosen as `mma_tiles` are: `m` 64 or 128 (one
    /// or two warpgroups of 64 rows each), `n` a multiple of 8 up to 256 (one `wgmma`'s
    /// columns), `k` 64 (a stage: one 128-byte swizzle row), `thread_m` 64 and `thread_n` `n`;
    /// stages as `mma_stages` says, within `Gpu::tile_limit`. Empty: products stay on
    /// `mma.sync` (`mma_tiles`).
    pub wgmma_tiles: Vec<GemmTile>,
    /// Whether a product on warpgroups (`wgmma_tiles`) loads its operands by TMA in a
    /// warp-specialized ring (`gpu/map/warpgroup_tma.rs`: a producer warp, the consumers'
    /// warpgroups, full and empty mbarriers) where its operands are plain row-major tensors,
    /// rather than through the `cp.async` ring. Off until the pack's sweep measures it.
    pub wgmma_tma: bool,
    /// With `wgmma_tma`: the loads issued by the consumers' first thread, `stages - 1` steps
    /// ahead, rather than by a producer warp of their own (which ptxas budgets as a whole
    /// warpgroup of registers).
    pub wgmma_tma_inline: bool,
    /// Query rows (a warp each) an attention block takes, most first: a block takes the first
    /// whose tiles fit its shared memory and threads. Each block stages every key and value
    /// once for its rows, so more rows read K and V fewer times. This is the warp-per-row
    /// mapping, the fallback where no `attention_tiles` entry fits.
    pub attention_warps: Vec<usize>,
    /// The register tiles of attention on the CUDA cores (`gpu/map/attention_tiles.rs`),
    /// largest first: an attention takes the first that fits the GPU, its head dimension and
    /// its output columns and whose rows its queries fill at least half of, else the last
    /// that fits; none fitting (or an empty list), it runs a warp per query row
    /// (`attention_warps`).
    pub attention_tiles: Vec<AttentionTile>,
    /// Keys per step of attention on the tensor cores (`gpu/map/attention_mma.rs`: bf16 or f16
    /// Q, K and V, `mma.m16n8k16`, f32 softmax), a multiple of 16; fewer (halved, down to 16)
    /// where the shared arrays do not fit [`Gpu::tile_limit`]. 0 turns that mapping off: such
    /// attention then runs as separate launches.
    pub mma_attention_keys: usize,
    /// Warps of a block of attention on the tensor cores, 16 query rows each.
    pub mma_attention_warps: usize,
    /// Shared-memory stages of the keys' and values' ring of attention on the tensor cores (at
    /// least 2: the next step's `cp.async` copies in flight while one step computes; fewer
    /// where they do not fit).
    pub mma_attention_stages: usize,
}

/// One block tile of attention on the CUDA cores: the block takes `rows` query rows and steps
/// through the keys `keys` at a time; each thread holds a `thread_rows x thread_keys` tile of
/// the step's scores and the `thread_rows x ⌈columns / (keys / thread_keys)⌉` output
/// elements of its rows, so that each element it loads from shared memory feeds several
/// multiply-adds. The `keys / thread_keys` lanes that share rows (a power of two dividing the
/// warp) combine a row's maximum and sum by shuffles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionTile {
    /// Query rows per block.
    pub rows: usize,
    /// Keys per step (staged in shared memory together).
    pub keys: usize,
    /// Query rows of a thread's tile.
    pub thread_rows: usize,
    /// Keys of a thread's tile per step.
    pub thread_keys: usize,
    /// The most output columns a thread accumulates per row: a wider output does not fit the
    /// tile (its accumulators would spill out of registers).
    pub thread_cols: usize,
}

impl AttentionTile {
    /// Lanes sharing a thread's rows, each with its own keys: `keys / thread_keys`.
    pub fn lanes_per_row(&self) -> usize {
        self.keys / self.thread_keys.max(1)
    }

    /// Threads per block: `rows / thread_rows` row groups of
    /// [`AttentionTile::lanes_per_row`] lanes.
    pub fn threads(&self) -> usize {
        (self.rows / self.thread_rows.max(1)) * self.lanes_per_row()
    }
}

/// One block tile of a matrix product: the block computes `m x n` elements of the result,
/// staging `m x k` of A and `k x n` of B through shared memory per step of the contraction,
/// each of its `(m / thread_m) * (n / thread_n)` threads accumulating a `thread_m x thread_n`
/// tile in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTile {
    /// Rows of the result per block.
    pub m: usize,
    /// Columns of the result per block.
    pub n: usize,
    /// Steps of the contraction staged at once (on the CUDA cores a divisor of
    /// [`SumTree::leaf`]; on the tensor cores a multiple of 16).
    pub k: usize,
    /// Rows of a thread's register tile (a divisor of `m`).
    pub thread_m: usize,
    /// Columns of a thread's register tile (a divisor of `n`).
    pub thread_n: usize,
}

impl GemmTile {
    /// Threads per block.
    pub fn threads(&self) -> usize {
        (self.m / self.thread_m.max(1)) * (self.n / self.thread_n.max(1))
    }
}

impl Gpu {
    /// The shared memory one block's arrays may take: the block's, within what a kernel
    /// declares statically ([`Gpu::static_shared_bytes`]). Every mapping fits its arrays in
    /// it, and `gpu::print::verify` checks it.
    pub fn shared_limit(&self) -> usize {
        self.shared_memory_per_block.min(self.static_shared_bytes)
    }

    /// The shared memory a kernel that opts into dynamic shared memory may take per block:
    /// [`Gpu::dynamic_shared_bytes`], never less than [`Gpu::shared_limit`].
    pub fn dynamic_limit(&self) -> usize {
        self.dynamic_shared_bytes.max(self.shared_limit())
    }

    /// The shared memory a tensor-core product's ring of stages and an attention tile's
    /// arrays may take per block: [`Gpu::shared_limit`], or up to
    /// [`Gpu::tile_dynamic_bytes`] within [`Gpu::dynamic_limit`] where that is more.
    pub fn tile_limit(&self) -> usize {
        self.shared_limit()
            .max(self.tile_dynamic_bytes.min(self.dynamic_limit()))
    }

    /// An NVIDIA H200 (sm_90): 132 multiprocessors, warps of 32, 1024 threads and 227 KiB of
    /// shared memory per block, the `m16n8k16` tensor-core shape, and TF32 tensor cores.
    pub fn h200() -> Gpu {
        // The block sizes, tiles and rows per attention block are the fastest of the GPU
        // pack's sweep on an H200 (docs/performance.md, "On an NVIDIA H200").
        Gpu {
            warp_size: 32,
            shared_memory_per_block: 227 << 10,
            static_shared_bytes: 48 << 10,
            dynamic_shared_bytes: 227 << 10,
            // Dynamic shared memory is not measured yet (docs/performance.md): the rings and
            // attention tiles keep within 48 KiB until a GPU run times the pack's sweep of
            // deeper rings and larger tiles.
            tile_dynamic_bytes: 0,
            sms: 132,
            tensor_core_shapes: vec![(16, 8, 16)],
            max_threads_per_block: 1024,
            elementwise_block: 256,
            vector_bytes: 16,
            blocks_per_sm: 16,
            warp_reduce_min: 128,
            block_reduce_min: 4096,
            // 32 f32 (16 f64) per thread: a warp holds f32 rows of 1024, a block of 1024
            // threads rows of 32768, within the 64 registers a thread of such a block has. Shared memory up to what the PTX emitter declares statically (48 KiB).
            row_registers: 32,
            row_shared_bytes: 48 << 10,
            gemm_tiles: vec![
                GemmTile {
                    m: 128,
                    n: 64,
                    k: 8,
                    thread_m: 8,
                    thread_n: 8,
                },
                GemmTile {
                    m: 64,
                    n: 64,
                    k: 8,
                    thread_m: 4,
                    thread_n: 4,
                },
                GemmTile {
                    m: 16,
                    n: 16,
                    k: 8,
                    thread_m: 2,
                    thread_n: 2,
                },
            ],
            // Double buffered: the third GPU run timed 3 and 4 stages no faster (6.71 and
            // 6.77 ms against 6.61 for linear_bias_gelu_4096).
            gemm_stages: 2,
            mma_tiles: vec![
                GemmTile {
                    m: 128,
                    n: 64,
                    k: 64,
                    thread_m: 64,
                    thread_n: 32,
                },
                GemmTile {
                    m: 64,
                    n: 64,
                    k: 16,
                    thread_m: 32,
                    thread_n: 32,
                },
                GemmTile {
                    m: 16,
                    n: 16,
                    k: 16,
                    thread_m: 16,
                    thread_n: 16,
                },
            ],
            // With swizzled tiles, the fourth GPU run's fastest: blocks of 128 x 64 in 2
            // stages of 64 (4.55 ms for the bf16 product of 8192, against 5.10 for 128 x 128 in
            // 4 stages of 16 and 10.2 unswizzled); the 4 asked for is cut back to the 2 of 64
            // that fit 48 KiB, and smaller tiles keep 4 stages of 16.
            mma_stages: 4,
            mma_swizzle: true,
            tf32: true,
            // Hopper's warpgroup tensor cores, once the PTX is rendered for sm_90a.
            wgmma: true,
            // Not measured on a GPU yet: the pack's sweep times warpgroup tiles against the
            // `mma.sync` ones before any becomes a default.
            wgmma_tiles: Vec::new(),
            wgmma_tma: false,
            wgmma_tma_inline: false,
            attention_warps: vec![16, 8, 4, 2, 1],
            // Not measured on a GPU yet (the pack's sweep times the neighbours): 64 query rows
            // of 4 warps, each thread 4 rows x 4 keys of a step of 32 (0.5 shared loads per
            // multiply-add of the scores, 0.375 of the output, against 2 a warp per row),
            // then narrower tiles for wider outputs and heads.
            attention_tiles: vec![
                AttentionTile {
                    rows: 64,
                    keys: 32,
                    thread_rows: 4,
                    thread_keys: 4,
                    thread_cols: 8,
                },
                AttentionTile {
                    rows: 32,
                    keys: 32,
                    thread_rows: 2,
                    thread_keys: 4,
                    thread_cols: 16,
                },
                AttentionTile {
                    rows: 16,
                    keys: 32,
                    thread_rows: 1,
                    thread_keys: 4,
                    thread_cols: 16,
                },
            ],
            // Not measured on a GPU yet: 64 query rows of 4 warps (16 each, one `mma` row
            // tile), steps of 64 keys double buffered, as flash attention 2 runs on sm_80.
            mma_attention_keys: 64,
            mma_attention_warps: 4,
            mma_attention_stages: 2,
        }
    }
}

/// What a backend knows of the CPU it compiles for (see [`TargetInfo::cpu_host`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostCpu {
    /// Bytes of the widest vector register (16: SSE, 32: AVX2, 64: AVX-512).
    pub vector_bytes: usize,
    /// Threads kernels run on.
    pub threads: usize,
    /// Who made the CPU: the vector units behind the same instructions differ (see
    /// [`GemmLimits::two_fma512_ports`]).
    pub vendor: CpuVendor,
    /// Bytes of the last-level cache one core sees, as the CPU reports it (`None`: not known;
    /// the reference's then). It decides when outputs stream (see
    /// [`LoopLimits::stream_bytes_for`]).
    pub llc_bytes: Option<usize>,
}

/// The maker of a CPU, as far as its kernels are decided differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuVendor {
    /// Intel: with AVX-512, two 512-bit FMA ports a core (the Xeons kiln is measured on).
    Intel,
    /// AMD: the Zen 4 runs 512-bit multiply-adds as two 256-bit halves.
    Amd,
    /// Any other, or not known (code for a named CPU ahead of time).
    Other,
}

impl Default for FusionLimits {
    fn default() -> FusionLimits {
        FusionLimits {
            row_epilogue: 2048,
            chain_k: 256,
            chain_row: 16384,
            winograd_min_features: 32,
            strided_operands: true,
            fft_half_min: 2048,
            zero_steps: true,
            unread_blocks: true,
            fft_direct_max: 64,
        }
    }
}

impl Default for SumTree {
    fn default() -> SumTree {
        SumTree {
            leaf: 256,
            fanout: 16,
        }
    }
}

impl LoopLimits {
    /// The most of a host's last-level cache a kernel's output and inputs are counted to stay
    /// in: a virtual machine's socket-wide cache is shared with the other guests. On a 2-core
    /// guest whose CPU reports 480 MiB of L3 (docs/performance.md, "Streaming stores by the
    /// host's cache"), an elementwise kernel's 64 MiB of input and output stayed in it between
    /// calls (layernorm's 32 MiB output: 1.22-1.29 ms written through the cache, 1.44-1.49
    /// streamed) and 128 MiB did not (gelu's and softmax's 64 MiB outputs: 5.2-5.9 and 4.8-5.4
    /// ms streamed, 6.7-7.0 and 6.6-7.9 through the cache).
    pub const LLC_COUNTED_MAX: usize = 128 << 20;

    /// [`Self::stream_bytes`] for a host with `llc_bytes` of last-level cache: outputs that,
    /// with an input of their size, fill the cache counted (half of it, at most
    /// [`Self::LLC_COUNTED_MAX`]), and never smaller ones than the reference's 32 MiB, which
    /// was measured on the Zen 4 EPYC (32 MiB of L3 a core complex: layernorm's 32 MiB output
    /// 3.70 -> 3.13 ms streamed).
    pub fn stream_bytes_for(llc_bytes: usize) -> usize {
        (llc_bytes.min(Self::LLC_COUNTED_MAX) / 2).max(LoopLimits::default().stream_bytes)
    }
}

impl Default for LoopLimits {
    fn default() -> LoopLimits {
        LoopLimits {
            stream_bytes: 32 << 20,
            stream_row_lines: 16,
            transpose_tile: 16,
            guard_cuts: 4,
            row_guard_cuts: 63,
            row_cache_bytes: 16 * 1024,
            strip: 16,
            strip_vectors: 8,
            wide_strip_rows: 512,
        }
    }
}

impl TargetInfo {
    /// A fixed x86-64 CPU (AVX2, 2 threads, 2.5 GHz, 15 GB/s, the Zen 4 EPYC's caches), for
    /// dumps and tests whose text must be the same on every machine.
    pub fn reference() -> TargetInfo {
        TargetInfo {
            vector_bytes: 32,
            threads: 2,
            ghz: 2.5,
            memory_gbps: 15.0,
            cache_line: 64,
            l1_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            llc_bytes: 48 << 20,
            nontemporal_stores: true,
            fusion: FusionLimits::default(),
            loops: LoopLimits::default(),
            sums: SumTree::default(),
            gemm: GemmLimits::default(),
            splits: SplitLimits::default(),
            gpu: None,
        }
    }

    /// An NVIDIA H200 (sm_90, see [`Gpu::h200`]) with the reference capacities and the
    /// reference sum tree (so its sums keep the bound of `ir-specs/ops/reduce.md`); 4.8 TB/s of
    /// memory bandwidth, 1.98 GHz.
    pub fn h200() -> TargetInfo {
        TargetInfo {
            vector_bytes: 4,
            threads: 132 * 2048,
            ghz: 1.98,
            memory_gbps: 4800.0,
            cache_line: 128,
            l1_bytes: 256 << 10,
            l2_bytes: 50 << 20,
            llc_bytes: 50 << 20,
            nontemporal_stores: false,
            fusion: FusionLimits::default(),
            gpu: Some(Gpu::h200()),
            ..TargetInfo::reference()
        }
    }

    /// The CPU `host` describes: its vector width, threads and last-level cache (and the
    /// output size from which loop nests stream, [`LoopLimits::stream_bytes_for`]), with the
    /// reference clock, bandwidth, level 1 and 2 caches and capacities (see
    /// [`TargetInfo::reference`]), and an Intel CPU's GEMM blocks with AVX-512
    /// ([`GemmLimits::two_fma512_ports`]).
    pub fn cpu_host(host: HostCpu) -> TargetInfo {
        let gemm = if host.vendor == CpuVendor::Intel && host.vector_bytes >= 64 {
            GemmLimits::two_fma512_ports()
        } else {
            GemmLimits::default()
        };
        let reference = TargetInfo::reference();
        let llc_bytes = host.llc_bytes.unwrap_or(reference.llc_bytes);
        TargetInfo {
            vector_bytes: host.vector_bytes,
            threads: host.threads.max(1),
            llc_bytes,
            loops: LoopLimits {
                stream_bytes: LoopLimits::stream_bytes_for(llc_bytes),
                ..reference.loops.clone()
            },
            gemm,
            ..reference
        }
    }

    /// Whether the target takes fold kernels ([`crate::fold`]: a `reduce_region` with an
    /// elementwise body as one loop nest of coupled accumulators): the CPU emitter renders
    /// them, and a GPU's mapping (`crate::gpu`) runs them as one launch (a warp or block per
    /// long row, else a thread per output): every target. Where a body is one the kernels
    /// cannot express ([`crate::fold::fold_body`]) the op expands into a tree of elementwise
    /// kernels instead ([`crate::reduce_tree`]).
    pub fn folds(&self) -> bool {
        true
    }

    /// The lanes a fold over rows keeps accumulators for, for accumulators of `bytes` bytes
    /// at most: one vector register of them (two, 32 f32 lanes with AVX-512, ran an argmax
    /// over 4096-element rows in 3.2 ms instead of 2.6), at least one.
    pub fn fold_lanes(&self, bytes: usize) -> usize {
        (self.vector_bytes / bytes.max(1)).max(1)
    }
    /// The optimizer's cost model for this target (f32 lanes per vector, threads, clock and
    /// bandwidth).
    pub fn cost_machine(&self) -> kiln_opt::cost::Machine {
        kiln_opt::cost::Machine {
            lanes: (self.vector_bytes / 4) as f64,
            threads: self.threads as f64,
            ghz: self.ghz,
            gbps: self.memory_gbps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_target_costs_as_the_reference_machine() {
        assert_eq!(
            TargetInfo::reference().cost_machine(),
            kiln_opt::cost::Machine::REFERENCE
        );
    }

    #[test]
    fn a_host_keeps_its_vectors_and_threads() {
        let t = TargetInfo::cpu_host(HostCpu {
            vector_bytes: 64,
            threads: 16,
            vendor: CpuVendor::Amd,
            llc_bytes: None,
        });
        assert_eq!(
            (t.cost_machine().lanes, t.cost_machine().threads),
            (16.0, 16.0)
        );
        assert_eq!(t.fusion, TargetInfo::reference().fusion);
    }

    /// A host's outputs stream from half its last-level cache on, as counted (at most 128
    /// MiB), and never below the reference's 32 MiB; a host whose cache is not known keeps
    /// the reference's cache and threshold.
    #[test]
    fn a_hosts_outputs_stream_by_its_cache() {
        let host = |llc_bytes| {
            let t = TargetInfo::cpu_host(HostCpu {
                vector_bytes: 64,
                threads: 2,
                vendor: CpuVendor::Intel,
                llc_bytes,
            });
            (t.llc_bytes >> 20, t.loops.stream_bytes >> 20)
        };
        assert_eq!(host(Some(480 << 20)), (480, 64));
        assert_eq!(host(Some(96 << 20)), (96, 48));
        assert_eq!(host(Some(32 << 20)), (32, 32));
        assert_eq!(host(None), (48, 32));
        assert_eq!(
            LoopLimits::stream_bytes_for(TargetInfo::reference().llc_bytes),
            TargetInfo::reference().loops.stream_bytes
        );
    }

    /// Intel CPUs with AVX-512 take tall 512-bit tiles; the Zen 4, other CPUs and Intel CPUs
    /// without AVX-512 keep the reference blocks.
    #[test]
    fn intel_avx512_hosts_take_tall_tiles() {
        let host = |vendor, vector_bytes| {
            TargetInfo::cpu_host(HostCpu {
                vector_bytes,
                threads: 2,
                vendor,
                llc_bytes: None,
            })
            .gemm
        };
        assert_eq!(
            host(CpuVendor::Intel, 64).tall_512,
            Some(TallTile {
                rows: 14,
                min_columns: 256,
                min_steps: 256,
                prefetch: TilePrefetch {
                    b_steps: 8,
                    a_steps: 16
                }
            })
        );
        for (vendor, bytes) in [
            (CpuVendor::Amd, 64),
            (CpuVendor::Other, 64),
            (CpuVendor::Intel, 32),
        ] {
            assert_eq!(
                host(vendor, bytes),
                GemmLimits::default(),
                "{vendor:?}, {bytes}"
            );
        }
    }

    #[test]
    fn sums_keep_the_tree_their_error_bound_states() {
        // `ir-specs/ops/reduce.md` states the bound in these values.
        assert_eq!(
            TargetInfo::reference().sums,
            SumTree {
                leaf: 256,
                fanout: 16
            }
        );
    }
}
