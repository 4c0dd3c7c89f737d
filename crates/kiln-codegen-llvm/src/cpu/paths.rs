//! The code paths each kernel of a compiled function takes ([`KernelPath`]): read from the
//! kernels, schedules, launches and program the executable was built from, so a test (or the
//! benchmark's check) can assert that an input took the path it was written for.

use super::*;

/// How a GEMM kernel is blocked (see `kiln_kernel::gemm_schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmBlocking {
    /// Blocks of rows and columns, threads splitting rows.
    Plain,
    /// Threads split the columns in panels (a wide product with few rows).
    SplitColumns,
    /// B is read where it is stored, nothing packed (a product of a few rows per matrix; see
    /// `Blocking::stream`).
    Streamed,
    /// Packed blocks of B hold whole rows, for an epilogue that reduces over rows.
    WholeRows,
    /// A chained product multiplies each block of the epilogue's rows while it is in cache.
    Chained,
    /// A chained product after a softmax computed online, over blocks of columns.
    Online,
}

/// The paths one kernel takes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelPath {
    /// The instruction the kernel computes.
    pub inst: usize,
    /// Its op's mnemonic.
    pub op: String,
    /// A GEMM's blocking (`None` for a loop nest or a scatter).
    pub gemm: Option<GemmBlocking>,
    /// Some register tile of a GEMM has shorter variants for a block's last rows (see
    /// `Blocking::tails`; a convolution's tiles storing C by columns or reading its input
    /// inline, which are not routines, take none).
    pub tail_tiles: bool,
    /// The output is written with streaming stores.
    pub stream: bool,
    /// The kernel runs in transposing tiles.
    pub tile: bool,
    /// Some loop runs in more than one segment, cut where its guards change.
    pub guard_cuts: bool,
    /// Reductions keeping a part of their body in a row cache.
    pub row_caches: usize,
    /// The innermost loop computes column sums in strips.
    pub strips: bool,
    /// A fold in the strips reads its elements across the positions (a window's: gathers),
    /// and the loop over the positions reads its accumulators in place.
    pub strip_gathers: bool,
    /// The kernel's rows are split across threads.
    pub threads: bool,
    /// The kernel runs side by side with independent ones (a concurrent group).
    pub concurrent: bool,
}

impl std::fmt::Display for KernelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "k{} {}:", self.inst, self.op)?;
        let mut any = false;
        let mut say = |f: &mut std::fmt::Formatter<'_>, s: &str| {
            any = true;
            write!(f, " {s};")
        };
        if let Some(g) = self.gemm {
            say(
                f,
                match g {
                    GemmBlocking::Plain => "gemm",
                    GemmBlocking::SplitColumns => "gemm split columns",
                    GemmBlocking::Streamed => "gemm streaming B",
                    GemmBlocking::WholeRows => "gemm whole rows",
                    GemmBlocking::Chained => "gemm chained",
                    GemmBlocking::Online => "gemm online softmax chain",
                },
            )?;
        }
        for (on, s) in [
            (self.tail_tiles, "tail tiles"),
            (self.stream, "streaming stores"),
            (self.tile, "transposing tiles"),
            (self.guard_cuts, "guard cuts"),
            (self.row_caches > 0, "row caches"),
            (self.strips, "column strips"),
            (self.strip_gathers, "gathered folds in strips"),
            (self.threads, "threads"),
            (self.concurrent, "concurrent"),
        ] {
            if on {
                say(f, s)?;
            }
        }
        if !any {
            write!(f, " plain loops;")?;
        }
        Ok(())
    }
}

/// The paths of every kernel of `f` (its instructions after lowering), from its kernels `ks`,
/// their loop schedules, launches, and the program's concurrent groups `concurrent`.
pub(super) fn kernel_paths(
    f: &Func,
    ks: &[Option<Kernel>],
    schedules: &[Option<KernelSchedule>],
    launches: &[Launch],
    concurrent: &[Vec<usize>],
) -> Vec<KernelPath> {
    ks.iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let k = k.as_ref()?;
            let s = schedules.get(i).and_then(Option::as_ref);
            let gemm = s.and_then(|s| s.gemm.as_ref()).map(|g| match &k.schedule {
                Schedule::Gemm { chain: Some(c), .. } if c.online.is_some() => GemmBlocking::Online,
                Schedule::Gemm { chain: Some(_), .. } => GemmBlocking::Chained,
                _ if g.blocking.stream.is_some() => GemmBlocking::Streamed,
                _ if crate::fuse::row_epilogue(k) => GemmBlocking::WholeRows,
                _ if g.split_columns => GemmBlocking::SplitColumns,
                _ => GemmBlocking::Plain,
            });
            let launch = launches.get(i).copied().unwrap_or_default();
            // From the routines its tiles run, which decide where tail tiles apply.
            let tail_tiles = s.and_then(|s| s.gemm).is_some_and(|g| {
                super::module::kernel_routines(k, g)
                    .iter()
                    .any(gemm::Routine::has_tails)
            });
            Some(KernelPath {
                inst: i,
                op: f.insts[i].op.mnemonic().to_string(),
                gemm,
                tail_tiles,
                stream: s.is_some_and(|s| s.stream),
                tile: s.is_some_and(|s| s.tile.is_some()),
                guard_cuts: s.is_some_and(|s| s.segments.iter().any(|d| d.len() > 1)),
                row_caches: s.map_or(0, |s| s.row_caches.len()),
                strips: s.is_some_and(|s| s.strips.is_some()),
                strip_gathers: s
                    .and_then(|s| s.strips.as_ref())
                    .is_some_and(|st| !st.gathered.is_empty()),
                threads: launch.split,
                concurrent: concurrent.iter().any(|g| g.len() > 1 && g.contains(&i)),
            })
        })
        .collect()
}
