//! Random control flow beyond `random/control.rs`'s: `while` loops whose trip count depends on
//! the data (bounded by a counter, so each ends within a few trips), and control flow nested in
//! regions (a loop or `case` inside a loop's body, a `case` branch or a called function).

use super::control::combine_op;
use super::{Gen, Rng};
use crate::{Builder, Combiner, ComparisonDirection as Cmp, DType, Func, Op, TensorType, ValueId};

/// Parameters of a region, or `None` when one fails to build.
fn region(
    name: &str,
    params: &[TensorType],
    emit: impl FnOnce(&mut Builder, &[ValueId]) -> Option<Vec<ValueId>>,
) -> Option<Func> {
    Gen::region(name, params, emit)
}

/// An elementwise op combining two values of dtype `d` whose result is exactly rounded
/// (no `atan2`), so that a condition on it decides the same on every backend.
fn exact_combine_op(rng: &mut Rng, d: DType) -> Op {
    if d.is_float() {
        rng.pick(&[Op::Add {}, Op::Multiply {}, Op::Subtract {}, Op::Maximum {}])
            .clone()
    } else {
        combine_op(rng, d)
    }
}

/// In `b`, a `while` of `trips` trips (0 to 3, static) stepping `x` by an elementwise op
/// with `y`; its stepped carry.
fn static_loop(
    rng: &mut Rng,
    b: &mut Builder,
    x: ValueId,
    y: ValueId,
    t: &TensorType,
) -> Option<ValueId> {
    let trips = rng.below(4) as f64;
    let op = combine_op(rng, t.dtype);
    let carries = [TensorType::scalar(DType::I32), t.clone(), t.clone()];
    let cond = region("cond", &carries, |b, ps| {
        let k = b.scalar(DType::I32, trips).ok()?;
        Some(vec![b.compare(ps[0], k, Cmp::Lt).ok()?])
    })?;
    let body = region("body", &carries, |b, ps| {
        let one = b.scalar(DType::I32, 1.0).ok()?;
        let i = b.binary(Op::Add {}, ps[0], one).ok()?;
        Some(vec![i, b.binary(op, ps[1], ps[2]).ok()?, ps[2]])
    })?;
    let zero = b.scalar(DType::I32, 0.0).ok()?;
    let op = Op::While {
        cond: Box::new(cond),
        body: Box::new(body),
    };
    Some(b.push(op, &[zero, x, y]).ok()?[1])
}

/// In `b`, a `case` on `index` (an `i32[]`) of two or three branches, each combining `x`
/// with `y` by an elementwise op.
fn flat_case(
    rng: &mut Rng,
    b: &mut Builder,
    index: ValueId,
    x: ValueId,
    y: ValueId,
    t: &TensorType,
) -> Option<ValueId> {
    let n = 2 + rng.below(2);
    let mut branches = Vec::with_capacity(n);
    for k in 0..n {
        let op = combine_op(rng, t.dtype);
        branches.push(region(
            &format!("branch{k}"),
            &[t.clone(), t.clone()],
            |b, ps| Some(vec![b.binary(op, ps[0], ps[1]).ok()?]),
        )?);
    }
    Some(b.push(Op::Case { branches }, &[index, x, y]).ok()?[0])
}

/// In `b`, a static loop or a `case` on `index` over `x` and `y`: the control flow a region
/// nests.
fn inner_control(
    rng: &mut Rng,
    b: &mut Builder,
    index: ValueId,
    x: ValueId,
    y: ValueId,
    t: &TensorType,
) -> Option<ValueId> {
    if rng.chance(0.5) {
        static_loop(rng, b, x, y, t)
    } else {
        flat_case(rng, b, index, x, y, t)
    }
}

impl Gen<'_> {
    /// With control flow, outside large programs, one step in eight also adds a data-dependent
    /// `while` (not in [`super::Config::differentiable`] programs) or control flow nested in a
    /// region, drawn from a stream of its own (as
    /// [`Gen::maybe_region_op`]'s), so a seed's program changes only where one is added.
    pub(super) fn maybe_nested_control(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() || self.pool.is_empty() {
            return;
        }
        let v = self.on_side_stream(0x510E_527F_ADE6_82D1, 8, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            match g.rng.below(4) {
                // Reverse mode refuses a data-dependent loop: a static one for differentiable
                // programs.
                0 if !g.cfg.differentiable => g.data_dependent_loop(a, &t),
                0 | 1 => g.loop_nesting(a, &t),
                2 => g.case_nesting(a, &t),
                _ => g.call_nesting(a, &t),
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// A `while` whose condition reads the data: it runs while a counter is below a small
    /// bound (1 to 4) and a reduction of the carry (a sum of integers, a maximum of floats, an
    /// `or` of `pred`s) compares with a scalar input as drawn. Its body steps the carry by an
    /// exactly rounded elementwise op with another value, so the trip count is the same on
    /// every backend. The carry, or half the time the trip count itself.
    pub(super) fn data_dependent_loop(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        let most = 1 + self.rng.below(4);
        let op = exact_combine_op(self.rng, d);
        let (kind, dir) = if d.is_pred() {
            (Combiner::Or, *self.rng.pick(&[Cmp::Eq, Cmp::Ne]))
        } else if d.is_float() {
            (Combiner::Max, *self.rng.pick(&[Cmp::Lt, Cmp::Gt, Cmp::Ne]))
        } else {
            (Combiner::Add, *self.rng.pick(&[Cmp::Lt, Cmp::Gt, Cmp::Ne]))
        };
        let s = TensorType::scalar(d);
        let bound = self.value_of(&s);
        let x = self.value_of(t);
        let counter = TensorType::scalar(DType::I32);
        let carries = [counter.clone(), s, t.clone(), t.clone()];
        let rank = t.rank() as i64;
        let cond = Self::region("cond", &carries, |b, ps| {
            let k = b.scalar(DType::I32, most as f64).ok()?;
            let more = b.compare(ps[0], k, Cmp::Lt).ok()?;
            let zero = b.scalar(d, 0.0).ok()?;
            let dimensions = (0..rank).collect();
            let r = b
                .inst(Op::Reduce { dimensions, kind }, &[ps[2], zero])
                .ok()?;
            let go = b.compare(r, ps[1], dir).ok()?;
            Some(vec![b.binary(Op::And {}, more, go).ok()?])
        })?;
        let body = Self::region("body", &carries, |b, ps| {
            let one = b.scalar(DType::I32, 1.0).ok()?;
            let i = b.binary(Op::Add {}, ps[0], one).ok()?;
            let v = b.binary(op, ps[2], ps[3]).ok()?;
            Some(vec![i, ps[1], v, ps[3]])
        })?;
        let zero = self.scalar_const(DType::I32, 0.0);
        let op = Op::While {
            cond: Box::new(cond),
            body: Box::new(body),
        };
        let rs = self.b.push(op, &[zero, bound, a, x]).ok()?;
        Some(if self.rng.chance(0.5) { rs[0] } else { rs[2] })
    }

    /// A static loop (0 to 3 trips) whose body holds a `case` on the trip counter or a loop of
    /// its own.
    pub(super) fn loop_nesting(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let trips = self.rng.below(4) as f64;
        let x = self.value_of(t);
        let carries = [TensorType::scalar(DType::I32), t.clone(), t.clone()];
        let cond = Self::region("cond", &carries, |b, ps| {
            let k = b.scalar(DType::I32, trips).ok()?;
            Some(vec![b.compare(ps[0], k, Cmp::Lt).ok()?])
        })?;
        let rng = &mut *self.rng;
        let body = Self::region("body", &carries, |b, ps| {
            let one = b.scalar(DType::I32, 1.0).ok()?;
            let i = b.binary(Op::Add {}, ps[0], one).ok()?;
            let v = inner_control(rng, b, ps[0], ps[1], ps[2], t)?;
            Some(vec![i, v, ps[2]])
        })?;
        let zero = self.scalar_const(DType::I32, 0.0);
        let op = Op::While {
            cond: Box::new(cond),
            body: Box::new(body),
        };
        Some(self.b.push(op, &[zero, a, x]).ok()?[1])
    }

    /// A `case` on an `i32[]` input of two or three branches, one of which holds a loop or a
    /// `case` (on the same index, or one more); the others combine by an elementwise op.
    pub(super) fn case_nesting(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let index = self.value_of(&TensorType::scalar(DType::I32));
        let x = self.value_of(t);
        let n = 2 + self.rng.below(2);
        let nests = self.rng.below(n);
        let params = [TensorType::scalar(DType::I32), t.clone(), t.clone()];
        let mut branches = Vec::with_capacity(n);
        for k in 0..n {
            let rng = &mut *self.rng;
            branches.push(Self::region(&format!("branch{k}"), &params, |b, ps| {
                if k != nests {
                    let op = combine_op(rng, t.dtype);
                    return Some(vec![b.binary(op, ps[1], ps[2]).ok()?]);
                }
                let index = if rng.chance(0.5) {
                    let one = b.scalar(DType::I32, 1.0).ok()?;
                    b.binary(Op::Add {}, ps[0], one).ok()?
                } else {
                    ps[0]
                };
                Some(vec![inner_control(rng, b, index, ps[1], ps[2], t)?])
            })?);
        }
        Some(
            self.b
                .push(Op::Case { branches }, &[index, index, a, x])
                .ok()?[0],
        )
    }

    /// A `call` of a new function of an `i32[]` and two values of `a`'s type holding a loop or
    /// a `case` on that index; called again on its result half the time.
    pub(super) fn call_nesting(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let index = self.value_of(&TensorType::scalar(DType::I32));
        let x = self.value_of(t);
        let n = self.b.func().values.len();
        let params = [TensorType::scalar(DType::I32), t.clone(), t.clone()];
        let rng = &mut *self.rng;
        let callee = Self::region(&format!("nest{n}"), &params, |b, ps| {
            Some(vec![inner_control(rng, b, ps[0], ps[1], ps[2], t)?])
        })?;
        let op = Op::Call {
            callee: crate::Callee::of(&callee),
        };
        let r = self.b.push(op.clone(), &[index, a, x]).ok()?[0];
        if self.rng.chance(0.5) {
            return Some(self.b.push(op, &[index, r, x]).ok()?[0]);
        }
        Some(r)
    }
}
