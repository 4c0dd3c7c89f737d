//! Random ops over more elements than small programs' values hold, so the kernels for many
//! updates and long folds run: a scatter of hundreds of updates (repeated and out-of-range
//! targets, every combiner its element type takes), a `select_and_scatter` of overlapping
//! windows with any order and combiner, a `reduce_region` over a few long rows (an argmax of
//! thousands of elements) and a `reduce_window_region` whose windows hold more than 256
//! elements. Their large operands are new parameters kept out of the pool (so later ops stay
//! small); their results join it and are outputs of the program.

use super::Gen;
use crate::{Combiner, ComparisonDirection, DType, Func, Literal, Op, TensorType, ValueId};

/// The combiners a scatter or `select_and_scatter` of element type `d` may take (`replace`
/// only for a scatter).
fn combiners(d: DType, replace: bool) -> Vec<Combiner> {
    let mut v = Vec::new();
    if replace {
        v.push(Combiner::Replace);
    }
    if d.is_pred() || d.is_int() {
        v.extend([Combiner::And, Combiner::Or]);
    }
    if !d.is_pred() {
        v.extend([Combiner::Add, Combiner::Mul, Combiner::Max, Combiner::Min]);
    }
    v
}

impl Gen<'_> {
    /// With [`super::Config::wide`], outside large programs, one step in twelve also adds one
    /// of this module's ops, drawn from a stream of its own (as [`Gen::maybe_region_op`]'s),
    /// so a seed's program changes only where one is added.
    pub(super) fn maybe_wide_op(&mut self) {
        if !self.cfg.wide || self.cfg.elements.is_some() || self.pool.is_empty() {
            return;
        }
        let v = self.on_side_stream(0x3C6E_F372_FE94_F82B, 12, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            match g.rng.below(4) {
                0 => g.many_updates_scatter(a, &t),
                1 => g.overlapping_select_and_scatter(t.dtype),
                2 => g.long_reduce_region(t.dtype),
                _ => g.wide_reduce_window_region(t.dtype),
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
            self.wide.push(v);
        }
    }

    /// Rows of `a` (rank 1 or more) combined with between 1 and about 1,000 update rows of a
    /// new parameter, their targets in `-2..rows + 2` (so most repeat and some are out of
    /// range), by any combiner `a`'s element type takes.
    fn many_updates_scatter(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        if t.rank() == 0 || d.is_complex() {
            return None;
        }
        let rows = t.shape[0];
        let row: usize = t.shape[1..].iter().product();
        let n = self.log_uniform(1, (4096 / row.max(1)).clamp(1, 1200));
        let idx: Vec<i64> = (0..n)
            .map(|_| self.rng.below(rows + 4) as i64 - 2)
            .collect();
        let value = Literal::from_i64s(TensorType::new(DType::I32, [n, 1]), &idx).ok()?;
        let ids = self.b.inst(Op::Constant { value }, &[]).ok()?;
        let mut ushape = vec![n];
        ushape.extend(&t.shape[1..]);
        let u = self.b.param(TensorType::new(d, ushape));
        let kind = *self.rng.pick(&combiners(d, true));
        let op = Op::Scatter {
            update_window_dims: (1..t.rank() as i64).collect(),
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![0],
            index_vector_dim: 1,
            kind,
            input_batching_dims: Vec::new(),
            scatter_indices_batching_dims: Vec::new(),
        };
        self.b.inst(op, &[a, ids, u]).ok()
    }

    /// A `select_and_scatter` over a new parameter of rank 1 or 2 (up to 256 elements) whose
    /// windows (up to 4 wide) mostly overlap (strides up to 3, padding up to 2), selecting by
    /// any order and combining by any combiner but `replace`.
    fn overlapping_select_and_scatter(&mut self, d: DType) -> Option<ValueId> {
        use ComparisonDirection as Cmp;
        if d.is_complex() || d.mini().is_some() {
            return None;
        }
        let r = 1 + self.rng.below(2);
        let side = if r == 1 { 256 } else { 16 };
        let shape: Vec<usize> = (0..r).map(|_| 1 + self.rng.below(side)).collect();
        let wd: Vec<i64> = (0..r).map(|_| 1 + self.rng.below(4) as i64).collect();
        let ws: Vec<i64> = (0..r).map(|_| 1 + self.rng.below(3) as i64).collect();
        let padding: Vec<(i64, i64)> = (0..r)
            .map(|_| (self.rng.below(3) as i64, self.rng.below(3) as i64))
            .collect();
        let grid: Vec<usize> = (0..r)
            .map(|i| crate::verify::window_output_size(shape[i], 1, padding[i], wd[i], 1, ws[i]))
            .collect();
        let operand = self.b.param(TensorType::new(d, shape));
        let src = self.b.param(TensorType::new(d, grid));
        let init = self.scalar_const(d, if d.is_pred() { 0.0 } else { 1.0 });
        let select = *self.rng.pick(&[Cmp::Ge, Cmp::Gt, Cmp::Le, Cmp::Lt]);
        let kind = *self.rng.pick(&combiners(d, false));
        let op = Op::SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select,
            kind,
        };
        self.b.inst(op, &[operand, src, init]).ok()
    }

    /// A `reduce_region` (an argmax or argmin, or an exclusive or) over the last dimension of
    /// a new parameter of 1 to 3 rows of 2,000 to 9,000 elements, or over all of it: long rows,
    /// fewer than a GPU has multiprocessors.
    fn long_reduce_region(&mut self, d: DType) -> Option<ValueId> {
        if d.is_complex() {
            return None;
        }
        let rows = 1 + self.rng.below(3);
        let n = self.log_uniform(2000, 9000);
        let t = TensorType::new(d, [rows, n]);
        let a = self.b.param(t.clone());
        let dimensions = if self.rng.chance(0.3) {
            vec![0, 1]
        } else {
            vec![1]
        };
        let make = |body: Func| Op::ReduceRegion {
            dimensions: dimensions.clone(),
            body: Box::new(body),
        };
        self.region_reduction(a, &t, &make)
    }

    /// A `reduce_window_region` (as [`Gen::long_reduce_region`]'s bodies) over a new
    /// parameter of rank 2 whose windows hold 257 to about 1,200 elements: a few rows by 90
    /// to 400 columns, with window dilations, base dilations, padding and strides of 1 or 2,
    /// the parameter sized to give a few windows.
    fn wide_reduce_window_region(&mut self, d: DType) -> Option<ValueId> {
        if d.is_complex() {
            return None;
        }
        let w0 = 1 + self.rng.below(3);
        let w1 = (257usize.div_ceil(w0)).max(90) + self.rng.below(140);
        let window = [w0, w1];
        let mut pick = |lo: usize, hi: usize| lo + self.rng.below(hi - lo + 1);
        let base: Vec<usize> = (0..2).map(|_| pick(1, 2)).collect();
        let wdil: Vec<usize> = (0..2).map(|_| pick(1, 2)).collect();
        let strides: Vec<usize> = (0..2).map(|_| pick(1, 2)).collect();
        let padding: Vec<(usize, usize)> = (0..2).map(|_| (pick(0, 2), pick(0, 2))).collect();
        let extra: Vec<usize> = (0..2).map(|_| pick(0, 2)).collect();
        // The smallest size whose dilated, padded extent holds a dilated window, plus a few.
        let shape: Vec<usize> = (0..2)
            .map(|i| {
                let reach = (window[i] - 1) * wdil[i] + 1;
                let pad = padding[i].0 + padding[i].1;
                reach.saturating_sub(pad + 1).div_ceil(base[i]) + 1 + extra[i]
            })
            .collect();
        let t = TensorType::new(d, shape);
        let a = self.b.param(t.clone());
        let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
        let make = |body: Func| Op::ReduceWindowRegion {
            window_dimensions: as_i64(&window),
            window_strides: as_i64(&strides),
            base_dilations: as_i64(&base),
            window_dilations: as_i64(&wdil),
            padding: padding.iter().map(|&(l, h)| (l as i64, h as i64)).collect(),
            body: Box::new(body),
        };
        self.region_reduction(a, &t, &make)
    }
}
