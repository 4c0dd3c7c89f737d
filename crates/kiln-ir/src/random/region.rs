//! Random ops over a computation region (not control flow): `sort` with a comparator, `map`,
//! and `reduce_region` / `reduce_window_region` with argmax, argmin or exclusive-or bodies.

use super::Gen;
use crate::{DType, Func, Op, TensorType, ValueId};

impl Gen<'_> {
    /// With control flow, one step in ten also adds a `map`, `reduce_region` or
    /// `reduce_window_region`. These draw from a stream of their own (the main one is left
    /// where it was), so a seed's program changes only where one is added.
    pub(super) fn maybe_region_op(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() {
            return;
        }
        let v = self.on_side_stream(0xD1B5_4A32_D192_ED03, 10, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            if g.rng.chance(0.3) {
                g.random_map(a, &t)
            } else {
                g.random_reduce_region(a, &t)
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// A `sort` along a random dimension by the first operand (`<` or `>`), with a second
    /// operand carried along half the time. Float keys are parameters (no NaN, whose order a
    /// plain `<` leaves open).
    pub(super) fn random_sort(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let key = if t.dtype.is_float() && !self.b.func().params.contains(&a) {
            self.value_of(&t.with_dtype(DType::I32))
        } else {
            a
        };
        let kt = self.ty(key);
        let mut operands = vec![key];
        if self.rng.chance(0.5) {
            let d = *self.rng.pick(&self.cfg.dtypes);
            operands.push(self.value_of(&t.with_dtype(d)));
        }
        let scalars: Vec<TensorType> = operands
            .iter()
            .flat_map(|&v| {
                let s = TensorType::scalar(self.ty(v).dtype);
                [s.clone(), s]
            })
            .collect();
        let dir = if self.rng.chance(0.5) {
            crate::ComparisonDirection::Lt
        } else {
            crate::ComparisonDirection::Gt
        };
        let comparator = Self::region("comparator", &scalars, |b, ps| {
            Some(vec![b.compare(ps[0], ps[1], dir).ok()?])
        })?;
        let op = Op::Sort {
            dimension: self.rng.below(kt.rank()) as i64,
            is_stable: self.rng.chance(0.5),
            comparator: Box::new(comparator),
        };
        let rs = self.b.push(op, &operands).ok()?;
        Some(*self.rng.pick(&rs))
    }

    /// A `map` of `a` and another value of its type by a computation of one or two
    /// elementwise ops (negated for floats, half the time).
    pub(super) fn random_map(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let x = self.value_of(t);
        let op = self.combine_op(t.dtype);
        let negate = t.dtype.is_float() && self.rng.chance(0.5);
        let s = TensorType::scalar(t.dtype);
        let computation = Self::region("computation", &[s.clone(), s], |b, ps| {
            let v = b.binary(op, ps[0], ps[1]).ok()?;
            Some(vec![if negate {
                b.unary(Op::Negate {}, v).ok()?
            } else {
                v
            }])
        })?;
        let op = Op::Map {
            dimensions: (0..t.rank() as i64).collect(),
            computation: Box::new(computation),
        };
        self.b.inst(op, &[a, x]).ok()
    }

    /// A `reduce_region` over random dimensions of `a`, or a `reduce_window_region` over small
    /// random windows (strides, dilations and padding of 1 or 2): an argmax or argmin (with NaN
    /// greatest, ties to the smaller index of a unique `i32` index per element) or, for `pred`
    /// and integers, an exclusive or (a body that is a named combiner would be a `reduce`).
    /// Every body is associative and commutative (the argmax's a total order), so the results
    /// do not depend on the combining order.
    pub(super) fn random_reduce_region(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let dims: Vec<i64> = (0..t.rank() as i64)
            .filter(|_| self.rng.chance(0.6))
            .collect();
        // Some of the time a `reduce_window_region` of small random windows instead.
        let window = self.rng.chance(0.4).then(|| {
            let r = t.rank();
            let mut pick = |lo: usize, hi: usize| (lo + self.rng.below(hi - lo + 1)) as i64;
            let dims: Vec<i64> = (0..r).map(|_| pick(1, 3)).collect();
            let strides: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let base: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let wdil: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let padding: Vec<(i64, i64)> = (0..r).map(|_| (pick(0, 1), pick(0, 1))).collect();
            (dims, strides, base, wdil, padding)
        });
        let make = |body: Func| match &window {
            Some((wd, ws, bd, wdl, padding)) => Op::ReduceWindowRegion {
                window_dimensions: wd.clone(),
                window_strides: ws.clone(),
                base_dilations: bd.clone(),
                window_dilations: wdl.clone(),
                padding: padding.clone(),
                body: Box::new(body),
            },
            None => Op::ReduceRegion {
                dimensions: dims.clone(),
                body: Box::new(body),
            },
        };
        self.region_reduction(a, t, &make)
    }

    /// `make`'s op (a `reduce_region` or `reduce_window_region` of the body it is given) over
    /// `a` of type `t`: an argmax or argmin with a unique index per element or, for `pred` and
    /// integers, an exclusive or (see [`Gen::random_reduce_region`]).
    pub(super) fn region_reduction(
        &mut self,
        a: ValueId,
        t: &TensorType,
        make: &dyn Fn(Func) -> Op,
    ) -> Option<ValueId> {
        use crate::ComparisonDirection as Cmp;
        let d = t.dtype;
        let s = TensorType::scalar(d);
        if d.is_pred() || (d.is_int() && self.rng.chance(0.3)) {
            let body = Self::region("combine", &[s.clone(), s.clone()], |b, ps| {
                Some(vec![b.binary(Op::Xor {}, ps[0], ps[1]).ok()?])
            })?;
            let init = self.value_of(&s);
            return self.b.push(make(body), &[a, init]).ok().map(|rs| rs[0]);
        }
        // A unique index per element: a flat iota in the operand's shape.
        let it = TensorType::new(DType::I32, [t.numel()]);
        let flat = self
            .b
            .inst_typed(Op::Iota { iota_dimension: 0 }, &[], it)
            .ok()?;
        let index = self.b.reshape(flat, &t.shape).ok()?;
        let dir = if self.rng.chance(0.5) {
            Cmp::Gt
        } else {
            Cmp::Lt
        };
        let i = TensorType::scalar(DType::I32);
        let body = Self::region("argbest", &[s.clone(), i.clone(), s.clone(), i], |b, ps| {
            let (av, ai, xv, xi) = (ps[0], ps[1], ps[2], ps[3]);
            let better = b.compare(xv, av, dir).ok()?;
            let x_nan = b.compare(xv, xv, Cmp::Ne).ok()?;
            let a_nan = b.compare(av, av, Cmp::Ne).ok()?;
            let a_num = b.unary(Op::Not {}, a_nan).ok()?;
            let nan_wins = b.binary(Op::And {}, x_nan, a_num).ok()?;
            let wins = b.binary(Op::Or {}, better, nan_wins).ok()?;
            let eq = b.compare(xv, av, Cmp::Eq).ok()?;
            let both_nan = b.binary(Op::And {}, x_nan, a_nan).ok()?;
            let tie = b.binary(Op::Or {}, eq, both_nan).ok()?;
            let first = b.compare(xi, ai, Cmp::Lt).ok()?;
            let tie_wins = b.binary(Op::And {}, tie, first).ok()?;
            let pick = b.binary(Op::Or {}, wins, tie_wins).ok()?;
            Some(vec![
                b.select(pick, xv, av).ok()?,
                b.select(pick, xi, ai).ok()?,
            ])
        })?;
        let init = self.value_of(&s);
        let init_index = self.scalar_const(DType::I32, 0.0);
        let rs = self
            .b
            .push(make(body), &[a, index, init, init_index])
            .ok()?;
        Some(*self.rng.pick(&rs))
    }
}
