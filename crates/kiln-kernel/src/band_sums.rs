//! Column sums of large float arrays in bands of rows, on a CPU of several threads.
//!
//! A `reduce` adding up dimension 0 of a float array is one kernel over the other dimensions
//! (the columns): its threads split the columns, and each runs down its columns in strips
//! ([`crate::loop_schedule::column_strips`]), a strip's few cache lines of every row a pass.
//! From memory that read gets about half the rate of a pass along the rows (16-17 against
//! 30 GB/s on the Zen 4, `docs/performance.md`). Where the array is larger than a core's
//! level 2 cache ([`bands`]) the sum becomes two: the array, seen as `[bands, rows / bands,
//! ...]`, summed over its second dimension into one partial sum per band and column (a kernel
//! whose threads split the bands, each reading a block of whole consecutive rows), stored
//! (`optimization_barrier`: inlined into its user, the partials would make one sum down the
//! columns again), then the partials summed down their `bands` rows into the sum's init, where
//! the instructions after the sum (an optimizer's update) fuse as before.
//!
//! The bands are static, so every run and every thread split adds in the same order. A band's
//! sum is a sum tree of its own ([`crate::target::SumTree`]) over a `bands`-th of the values,
//! and the partials, at most [`SumTree::fanout`](crate::target::SumTree::fanout) of them, are
//! one node above it: the error stays within the bound of `ir-specs/ops/reduce.md`.

use crate::canon::rebuild;
use crate::target::TargetInfo;
use kiln_ir::{Combiner, DType, Func, Inst, Op, VerifyError};

/// The bands a column sum of `rows` rows and `bytes` bytes in all is summed in on `target`:
/// the most that divide its rows, no more than the sum tree's fanout and no fewer than the
/// target's threads (or the fanout, where it has more), each at least a strip
/// ([`LoopLimits::strip`](crate::target::LoopLimits::strip)) of rows. `None`, one sum down
/// the columns, on a GPU, on one thread, where no such count divides the rows, or where the
/// array fits a core's level 2 cache (then its strips read from the cache at the rate of the
/// rows: the bands would only add a kernel).
pub fn bands(rows: usize, bytes: usize, target: &TargetInfo) -> Option<usize> {
    if target.gpu.is_some() || target.threads < 2 || bytes <= target.l2_bytes {
        return None;
    }
    let most = target.sums.fanout;
    let fewest = target.threads.clamp(2, most.max(2));
    (fewest..=most)
        .rev()
        .find(|&b| rows.is_multiple_of(b) && rows / b >= target.loops.strip.max(1))
}

/// The bands `inst` is summed in on `target`: a float `add` reduction of dimension 0 alone
/// of an array with columns (rank 2 or more) at least a strip wide; see [`bands`].
fn banded(f: &Func, inst: &Inst, target: &TargetInfo) -> Option<usize> {
    let Op::Reduce {
        dimensions,
        kind: Combiner::Add,
    } = &inst.op
    else {
        return None;
    };
    let x = &f.values[inst.operands[0].index()];
    if dimensions.as_slice() != [0]
        || !matches!(x.dtype, DType::F32 | DType::F64)
        || x.rank() < 2
        || x.shape[1..].iter().product::<usize>() < target.loops.strip
    {
        return None;
    }
    bands(x.shape[0], x.numel() * x.dtype.bytes(), target)
}

/// `f` with every column sum [`bands`] cuts summed in its bands of rows, then their partial
/// sums (see the module documentation); `f` itself where there is none.
pub fn band_column_sums(f: &Func, target: &TargetInfo) -> Result<Func, VerifyError> {
    if !f.insts.iter().any(|i| banded(f, i, target).is_some()) {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let Some(n) = banded(f, inst, target) else {
            return Ok(None);
        };
        let x = &f.values[inst.operands[0].index()];
        let mut shape = vec![n, x.shape[0] / n];
        shape.extend_from_slice(&x.shape[1..]);
        let bands = b.reshape(ops[0], &shape)?;
        // The identity of a float sum: a band of negative zeros sums to one.
        let zero = b.scalar(x.dtype, -0.0)?;
        let partials = b.inst(
            Op::Reduce {
                dimensions: vec![1],
                kind: Combiner::Add,
            },
            &[bands, zero],
        )?;
        let partials = b.inst(Op::OptimizationBarrier {}, &[partials])?;
        let sum = b.inst(
            Op::Reduce {
                dimensions: vec![0],
                kind: Combiner::Add,
            },
            &[partials, ops[1]],
        )?;
        Ok(Some(vec![sum]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Literal, TensorType};

    fn column_sum(rows: usize, cols: usize) -> Func {
        let src = format!(
            "func @c(%0: f32[{rows},{cols}]) -> f32[{cols}] {{\n  %1 = constant {{value = 0.5}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : f32[{cols}]\n  return %2\n}}\n"
        );
        kiln_ir::parse_func_text(&src).expect("valid IR")
    }

    fn reduces(f: &Func) -> Vec<Vec<usize>> {
        f.insts
            .iter()
            .filter(|i| matches!(i.op, Op::Reduce { .. }))
            .map(|i| f.values[i.results[0].index()].shape.clone())
            .collect()
    }

    #[test]
    fn bands_divide_the_rows_up_to_the_fanout_for_arrays_past_the_level_2_cache() {
        let t = TargetInfo::reference();
        let mib = 1 << 20;
        // AdamW's bias gradients: 2048 rows of 256 or 1024 f32, 2 and 8 MiB.
        assert_eq!(bands(2048, 2 * mib, &t), Some(16));
        assert_eq!(bands(2048, 8 * mib, &t), Some(16));
        // Within the level 2 cache: one sum.
        assert_eq!(bands(2048, t.l2_bytes, &t), None);
        // The most bands that divide the rows; none where only one or too short a band does.
        assert_eq!(bands(300, 4 * mib, &t), Some(15));
        assert_eq!(bands(1009, 4 * mib, &t), None);
        assert_eq!(bands(32, 4 * mib, &t), Some(2));
        // One thread, or a GPU: one sum.
        let one = TargetInfo {
            threads: 1,
            ..TargetInfo::reference()
        };
        assert_eq!(bands(2048, 2 * mib, &one), None);
    }

    #[test]
    fn a_large_column_sum_becomes_partials_per_band_then_their_sum() {
        let t = TargetInfo::reference();
        let g = band_column_sums(&column_sum(2048, 256), &t).expect("valid");
        assert_eq!(reduces(&g), [vec![16, 256], vec![256]], "{g}");
        assert!(
            g.insts
                .iter()
                .any(|i| matches!(i.op, Op::OptimizationBarrier {})),
            "the partials are stored:\n{g}"
        );
        // A small one, a row sum and a GPU's stay as they are.
        let small = column_sum(256, 256);
        assert_eq!(band_column_sums(&small, &t).expect("valid"), small);
        let rows = kiln_ir::parse_func_text(
            "func @r(%0: f32[2048,256]) -> f32[2048] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[2048]\n  return %2\n}\n",
        )
        .expect("valid IR");
        assert_eq!(band_column_sums(&rows, &t).expect("valid"), rows);
        let gpu = TargetInfo::h200();
        let big = column_sum(2048, 256);
        assert_eq!(band_column_sums(&big, &gpu).expect("valid"), big);
    }

    #[test]
    fn the_banded_sum_agrees_with_the_sum_down_the_columns() {
        let (rows, cols) = (2048, 256);
        let f = column_sum(rows, cols);
        let g = band_column_sums(&f, &TargetInfo::reference()).expect("valid");
        let xs: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                ((h as f64 / (1u64 << 24) as f64 - 0.5) as f32) as f64
            })
            .collect();
        let x = Literal::from_f64s(TensorType::new(DType::F32, [rows, cols]), &xs).expect("f32");
        let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).expect("runs")[0].to_f64s();
        let got = kiln_reference::eval(&g, std::slice::from_ref(&x)).expect("runs")[0].to_f64s();
        for c in 0..cols {
            let abs: f64 = (0..rows).map(|r| xs[r * cols + c].abs()).sum::<f64>() + 0.5;
            let err = (got[c] - want[c]).abs();
            assert!(
                err <= 1e-6 * abs,
                "column {c}: {} against {}",
                got[c],
                want[c]
            );
        }
    }
}
