//! Random control flow and calls: `while` loops with a static trip count, `case`, `call`
//! of new functions (nested, repeated) and optimization barriers, with the regions they hold.

use super::{Gen, Rng};
use crate::{Builder, DType, Func, Op, TensorType, ValueId};

impl Gen<'_> {
    /// With control flow, one step in twenty adds a `call` (from a stream of its own, as
    /// [`Gen::maybe_region_op`]'s).
    pub(super) fn maybe_call(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() {
            return;
        }
        let v = self.on_side_stream(0x6A09_E667_F3BC_C909, 20, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            g.random_call(a, &t)
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// A `call` of a new function combining `a` with another value by two elementwise ops
    /// (the second through a nested call half the time); half the time the function is called
    /// again on its own result.
    pub(super) fn random_call(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let x = self.value_of(t);
        let n = self.b.func().values.len();
        let (op1, op2) = (self.combine_op(t.dtype), self.combine_op(t.dtype));
        let inner = Self::region(
            &format!("callee{n}_inner"),
            &[t.clone(), t.clone()],
            |b, ps| Some(vec![b.binary(op2.clone(), ps[0], ps[1]).ok()?]),
        )?;
        let nested = self.rng.chance(0.5);
        let callee = Self::region(&format!("callee{n}"), &[t.clone(), t.clone()], |b, ps| {
            let v = b.binary(op1, ps[0], ps[1]).ok()?;
            let w = if nested {
                let callee = crate::Callee::of(&inner);
                b.push(Op::Call { callee }, &[v, ps[1]]).ok()?[0]
            } else {
                b.binary(op2, v, ps[1]).ok()?
            };
            Some(vec![w])
        })?;
        let op = Op::Call {
            callee: crate::Callee::of(&callee),
        };
        let r = self.b.push(op.clone(), &[a, x]).ok()?[0];
        if self.rng.chance(0.5) {
            return self.b.push(op, &[r, x]).ok().map(|rs| rs[0]);
        }
        Some(r)
    }

    /// A random elementwise op combining two values of dtype `d`.
    pub(super) fn combine_op(&mut self, d: DType) -> Op {
        combine_op(self.rng, d)
    }

    /// A region of parameters `params` returning `emit`'s values.
    pub(super) fn region(
        name: &str,
        params: &[TensorType],
        emit: impl FnOnce(&mut Builder, &[ValueId]) -> Option<Vec<ValueId>>,
    ) -> Option<Func> {
        let mut b = Builder::new(name);
        let ps: Vec<ValueId> = params.iter().map(|t| b.param(t.clone())).collect();
        let outs = emit(&mut b, &ps)?;
        b.finish(&outs).ok()
    }

    /// A `while` with a static trip count (0 to 3): a counter from 0 and a carry of `a`'s
    /// type stepped by an elementwise op with a value passed through unchanged.
    pub(super) fn random_loop(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let trips = self.rng.below(4) as f64;
        let x = self.value_of(t);
        let op = self.combine_op(t.dtype);
        let counter = TensorType::scalar(DType::I32);
        let carries = [counter.clone(), t.clone(), t.clone()];
        let cond = Self::region("cond", &carries, |b, ps| {
            let k = b.scalar(DType::I32, trips).ok()?;
            Some(vec![
                b.compare(ps[0], k, crate::ComparisonDirection::Lt).ok()?,
            ])
        })?;
        let body = Self::region("body", &carries, |b, ps| {
            let one = b.scalar(DType::I32, 1.0).ok()?;
            let i = b.binary(Op::Add {}, ps[0], one).ok()?;
            let v = b.binary(op, ps[1], ps[2]).ok()?;
            Some(vec![i, v, ps[2]])
        })?;
        let zero = self.scalar_const(DType::I32, 0.0);
        let rs = self
            .b
            .push(
                Op::While {
                    cond: Box::new(cond),
                    body: Box::new(body),
                },
                &[zero, a, x],
            )
            .ok()?;
        Some(rs[1])
    }

    /// A `case` over two or three branches, each combining `a` with another value by a
    /// different op; the index is an `i32[]` input (out of range: the last branch).
    pub(super) fn random_case(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let index = self.value_of(&TensorType::scalar(DType::I32));
        let x = self.value_of(t);
        let n = 2 + self.rng.below(2);
        let mut branches = Vec::with_capacity(n);
        for k in 0..n {
            let op = self.combine_op(t.dtype);
            branches.push(Self::region(
                &format!("branch{k}"),
                &[t.clone(), t.clone()],
                |b, ps| Some(vec![b.binary(op, ps[0], ps[1]).ok()?]),
            )?);
        }
        self.b
            .push(Op::Case { branches }, &[index, a, x])
            .ok()
            .map(|rs| rs[0])
    }

    /// An `optimization_barrier` over `a` and another value of the pool (or `a` alone); its
    /// first result.
    pub(super) fn barrier(&mut self, a: ValueId) -> Option<ValueId> {
        let b = *self.rng.pick(&self.pool);
        let ops = if a == b { vec![a] } else { vec![a, b] };
        self.b
            .push(Op::OptimizationBarrier {}, &ops)
            .ok()
            .map(|rs| rs[0])
    }
}

/// A random elementwise op combining two values of dtype `d` (atan2 among them for floats).
pub(super) fn combine_op(rng: &mut Rng, d: DType) -> Op {
    let ops: Vec<Op> = if d.is_pred() {
        vec![Op::Xor {}, Op::And {}, Op::Or {}]
    } else if d.is_float() {
        vec![
            Op::Add {},
            Op::Multiply {},
            Op::Subtract {},
            Op::Maximum {},
            Op::Atan2 {},
        ]
    } else {
        vec![Op::Add {}, Op::Xor {}, Op::Maximum {}, Op::Multiply {}]
    };
    rng.pick(&ops).clone()
}
