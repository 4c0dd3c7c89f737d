//! How a kernel's rows are split across threads, decided for a target: its rows (the range the
//! runtime splits), its work, its scratch memory, how many chunks a thread takes, whether it
//! is split at all, and whether, on one thread, it may run beside its independent neighbours.
//! The runtime only reads the decision ([`Launch`]), clamping the chunks to the threads it
//! has.

use crate::gemm_schedule::GemmSchedule;
use crate::ir::{Expr, Kernel, Schedule};
use crate::target::TargetInfo;
use std::fmt;

/// How a kernel is called.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Launch {
    /// Rows of its outermost loop: the range split across threads.
    pub rows: usize,
    /// Total work (elements or multiply-adds), which decided whether to split.
    pub work: usize,
    /// Scratch bytes per call.
    pub scratch: usize,
    /// Chunks per thread when split: more even out threads slowed by other work, fewer save
    /// per-chunk setup (a GEMM chunk packs all of its B operand).
    pub chunks_per_thread: usize,
    /// Whether its rows are split across threads
    /// ([`SplitLimits::splits`](crate::target::SplitLimits::splits)).
    pub split: bool,
    /// Whether, on one thread, it has enough work to run beside its independent neighbours
    /// ([`SplitLimits::concurrent_work`](crate::target::SplitLimits::concurrent_work)).
    pub beside: bool,
}

impl Launch {
    /// A kernel of `rows` rows and `work` work with `scratch` bytes, split in
    /// `chunks_per_thread` chunks a thread where `target`'s limits split it. A target of one
    /// thread splits nothing and runs nothing side by side.
    pub fn new(
        rows: usize,
        work: usize,
        scratch: usize,
        chunks_per_thread: usize,
        target: &TargetInfo,
    ) -> Launch {
        let threads = target.threads >= 2;
        let split = threads && target.splits.splits(rows, work);
        Launch {
            rows,
            work,
            scratch,
            chunks_per_thread,
            split,
            beside: threads && !split && work >= target.splits.concurrent_work,
        }
    }
}

/// How kernel `k` (with its GEMM schedule `gemm`, see [`crate::gemm_schedule`]) is called on
/// `target`: a GEMM's rows are its panels of columns where its threads split them, else its
/// rows; a loop nest's its outermost dimension; a scatter runs on one thread, in order.
pub fn launch(k: &Kernel, gemm: Option<&GemmSchedule>, target: &TargetInfo) -> Launch {
    let mut scratch = 0;
    let (rows, work) = match (&k.schedule, gemm) {
        (
            Schedule::Gemm {
                batch,
                m,
                n,
                k: kk,
                chain,
                ..
            },
            Some(g),
        ) => {
            scratch = g.scratch;
            let rows = if g.split_columns {
                g.blocking.panels(*n) as usize
            } else {
                batch * m
            };
            let chained = chain.as_ref().map_or(0, |c| batch * m * c.n * n);
            (rows, batch * m * n * kk + chained)
        }
        (Schedule::Gemm { .. }, None) => {
            let g = crate::gemm_schedule::gemm_schedule(k, target).expect("a GEMM");
            return launch(k, Some(&g), target);
        }
        (Schedule::Nest, _) => (
            k.out.shape.first().copied().unwrap_or(1),
            k.out.numel()
                * (reduction_work(&k.body)
                    + k.extra
                        .iter()
                        .map(|x| reduction_work(&x.body))
                        .sum::<usize>()),
        ),
        // Updates may hit the same position: one thread, in order.
        (Schedule::Scatter { .. } | Schedule::SelectScatter { .. }, _) => (1, 1),
    };
    // A GEMM chunk packs its whole share of the operand it does not split: one chunk per
    // thread.
    let chunks_per_thread = if scratch > 0 { 1 } else { CHUNKS_PER_THREAD };
    Launch::new(rows, work, scratch, chunks_per_thread, target)
}

/// Chunks a thread takes of a split kernel without scratch memory: more even out threads
/// slowed by other work.
pub const CHUNKS_PER_THREAD: usize = 4;

/// Chunks a thread takes of a loop nest of `rows` rows whose column strips, `width` positions
/// wide, run along the dimension its `threads` threads split (a bias's gradient summed down
/// `[2048, 256]` with its optimizer's update after it): as many as [`CHUNKS_PER_THREAD`] where
/// each chunk still holds a whole strip, else fewer, at least one. A chunk narrower than a
/// strip runs in the narrow strips, one cache line of each row a pass: from memory, a column
/// sum read that way got half the bandwidth of one in wide strips on the Zen 4 (8 against 16
/// GB/s).
pub fn strip_chunks(rows: usize, width: usize, threads: usize) -> usize {
    (rows / (width.max(1) * threads.max(1))).clamp(1, CHUNKS_PER_THREAD)
}

/// Total work of one output element: the product of the reduction extents in the body.
pub fn reduction_work(e: &Expr) -> usize {
    match e {
        Expr::Reduce { vars, body, .. } => {
            vars.iter().map(|v| v.1).product::<usize>().max(1) * reduction_work(body)
        }
        Expr::Fold { fold, .. } => {
            let inner = fold.elems.iter().map(reduction_work).max().unwrap_or(1);
            fold.vars.iter().map(|v| v.1).product::<usize>().max(1) * inner
        }
        Expr::Op { args, .. } => args.iter().map(reduction_work).max().unwrap_or(1),
        Expr::Guard {
            then, otherwise, ..
        } => reduction_work(then).max(reduction_work(otherwise)),
        _ => 1,
    }
}

impl fmt::Display for Launch {
    /// `128 rows split, 4 chunks a thread`, `4 rows on one thread` or `4 rows on one thread,
    /// beside others`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        write!(f, "{} row{} ", self.rows, plural(self.rows))?;
        if self.split {
            let c = self.chunks_per_thread;
            write!(f, "split, {c} chunk{} a thread", plural(c))
        } else if self.beside {
            f.write_str("on one thread, beside others")
        } else {
            f.write_str("on one thread")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    /// The launch of the first kernel of `src`, fused for `target`.
    fn first_launch(src: &str, target: &TargetInfo) -> Launch {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let fused = crate::pipeline::fused_kernels(&f, &Options::default(), target);
        let k = fused.kernels.iter().flatten().next().expect("a kernel");
        launch(k, None, target)
    }

    fn exp(n: usize) -> String {
        format!(
            "func @e(%0: f32[{n},256]) -> f32[{n},256] {{\n  %1 = exponential %0 : f32[{n},256]\n  return %1\n}}\n"
        )
    }

    #[test]
    fn a_small_kernel_runs_on_one_thread() {
        let l = first_launch(&exp(4), &TargetInfo::reference());
        assert_eq!((l.rows, l.work, l.split, l.beside), (4, 1024, false, false));
        assert_eq!(l.to_string(), "4 rows on one thread");
    }

    #[test]
    fn a_large_kernel_splits_its_rows() {
        let l = first_launch(&exp(1024), &TargetInfo::reference());
        assert_eq!((l.rows, l.split, l.chunks_per_thread), (1024, true, 4));
        assert_eq!(l.to_string(), "1024 rows split, 4 chunks a thread");
        // The limit is the target's.
        let mut t = TargetInfo::reference();
        t.splits.parallel_work = 1 << 20;
        let l = first_launch(&exp(1024), &t);
        assert!(!l.split && l.beside, "{l}");
    }

    #[test]
    fn strips_split_across_threads_keep_a_whole_strip_a_chunk() {
        // 128-column strips on two threads: 256 columns in one chunk a thread, 768 in three,
        // 4096 in the usual four; fewer columns than the threads' strips still one.
        assert_eq!(strip_chunks(256, 128, 2), 1);
        assert_eq!(strip_chunks(768, 128, 2), 3);
        assert_eq!(strip_chunks(4096, 128, 2), CHUNKS_PER_THREAD);
        assert_eq!(strip_chunks(100, 128, 2), 1);
    }

    #[test]
    fn a_target_of_one_thread_splits_nothing() {
        let one = TargetInfo {
            threads: 1,
            ..TargetInfo::reference()
        };
        for rows in [224, 1024] {
            let l = first_launch(&exp(rows), &one);
            assert_eq!((l.split, l.beside), (false, false), "{rows} rows");
        }
    }

    #[test]
    fn a_kernel_just_below_the_split_runs_beside_its_neighbours() {
        // 224 rows of 256: 57344 elements, from `concurrent_work` up to `parallel_work`.
        let l = first_launch(&exp(224), &TargetInfo::reference());
        assert!(!l.split && l.beside, "{l}");
    }

    /// A wide product with few rows (more than stream B) splits its columns; with a row
    /// epilogue (a softmax over the row) it keeps whole rows and splits them.
    #[test]
    fn a_row_epilogue_gemm_splits_rows_not_columns() {
        let plain = "func @g(%0: f32[48,512], %1: f32[512,1024]) -> f32[48,1024] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[48,1024]\n  return %2\n}\n";
        let t = TargetInfo::reference();
        let l = first_launch(plain, &t);
        // 1024 columns in 64 panels of 16 (6 x 2 tiles of 8 lanes), not 48 rows.
        assert_eq!((l.rows, l.split, l.chunks_per_thread), (64, true, 1));
        assert!(l.scratch > 0);
        let softmax = "func @s(%0: f32[48,512], %1: f32[512,1024]) -> f32[48,1024] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[48,1024]\n  %3 = constant {value = -inf} : f32[]\n  %4 = reduce %2, %3 {dimensions = [1], kind = max} : f32[48]\n  %5 = broadcast_in_dim %4 {broadcast_dimensions = [0]} : f32[48,1024]\n  %6 = subtract %2, %5 : f32[48,1024]\n  %7 = exponential %6 : f32[48,1024]\n  return %7\n}\n";
        let f = kiln_ir::parse_func_text(softmax).expect("valid IR");
        let fused = crate::pipeline::fused_kernels(&f, &Options::default(), &t);
        let k = fused
            .kernels
            .iter()
            .flatten()
            .find(|k| matches!(k.schedule, Schedule::Gemm { .. }))
            .expect("a GEMM");
        assert!(
            crate::fuse::row_epilogue(k),
            "the softmax fuses into the product"
        );
        let g = crate::gemm_schedule::gemm_schedule(k, &t).expect("a GEMM");
        assert!(!g.split_columns);
        assert!(g.blocking.nc >= 1024, "blocks of whole rows");
        let l = launch(k, Some(&g), &t);
        assert_eq!((l.rows, l.split), (48, true));
    }
}
