//! Random well-typed programs, for property tests and differential testing of backends.
//!
//! The generator is deterministic for a given seed, so a failing case is reproduced by its
//! seed alone.

use crate::{Builder, DType, Func, Literal, Op, TensorType, ValueId};

mod collective;
mod config;
mod control;
mod elementwise;
mod fft;
mod index;
mod linalg;
mod literal;
mod nested;
mod product;
mod reduce;
mod region;
mod rng;
pub mod seeds;
mod shape;
mod sources;
mod step;
mod typed;
mod types;
mod wide;

pub use config::{Config, LARGE_DIMS, LARGE_ELEMENTS, VECTOR_DIMS};
pub use literal::{random_literal, random_literal_with_specials};
pub use rng::Rng;

struct Gen<'a> {
    rng: &'a mut Rng,
    cfg: &'a Config,
    b: Builder,
    pool: Vec<ValueId>,
    /// The results of `random/wide.rs`'s ops, each also an output (later ops would leave
    /// most of them dead).
    wide: Vec<ValueId>,
}

impl Gen<'_> {
    fn ty(&self, v: ValueId) -> TensorType {
        self.b.ty(v).expect("pool values exist").clone()
    }

    fn param(&mut self, ty: TensorType) -> ValueId {
        let v = self.b.param(ty);
        self.pool.push(v);
        v
    }

    /// A value of exactly this type: from the pool when one exists, else a new parameter.
    fn value_of(&mut self, ty: &TensorType) -> ValueId {
        let same: Vec<ValueId> = self
            .pool
            .iter()
            .copied()
            .filter(|&v| self.b.ty(v) == Some(ty))
            .collect();
        if !same.is_empty() && self.rng.chance(0.7) {
            *self.rng.pick(&same)
        } else {
            self.param(ty.clone())
        }
    }

    fn scalar_const(&mut self, dtype: DType, x: f64) -> ValueId {
        let value = Literal::from_f64s(TensorType::scalar(dtype), &[x]).expect("scalar");
        self.b
            .inst(Op::Constant { value }, &[])
            .expect("constants are well-typed")
    }

    /// The last value computed from a parameter (through at least one instruction) with an
    /// element, if any.
    fn last_computed(&self) -> Option<ValueId> {
        let f = self.b.func();
        let computed = computed_from_inputs(f);
        f.insts
            .iter()
            .rev()
            .flat_map(|i| i.results.iter().rev().copied())
            .find(|r| computed[r.index()] && f.values[r.index()].numel() > 0)
    }
}

/// For each value of `f`, whether an instruction computed it from a parameter (constants, iotas
/// and the parameters themselves are not computed from one).
pub fn computed_from_inputs(f: &Func) -> Vec<bool> {
    let mut from_param = vec![false; f.values.len()];
    for &p in &f.params {
        from_param[p.index()] = true;
    }
    let mut computed = vec![false; f.values.len()];
    for inst in &f.insts {
        let hit = inst.operands.iter().any(|o| from_param[o.index()]);
        for r in &inst.results {
            from_param[r.index()] = hit;
            computed[r.index()] = hit;
        }
    }
    computed
}

/// Whether `f` computes something from its inputs: an output with an element that an
/// instruction computed from a parameter (not only empty, constant or passed-through outputs).
pub fn computes_from_inputs(f: &Func) -> bool {
    let computed = computed_from_inputs(f);
    f.outputs
        .iter()
        .any(|o| computed[o.index()] && f.values[o.index()].numel() > 0)
}

/// A random well-typed function named `main`.
pub fn random_func(rng: &mut Rng, cfg: &Config) -> Func {
    let mut g = Gen {
        rng,
        cfg,
        b: Builder::new("main"),
        pool: Vec::new(),
        wide: Vec::new(),
    };
    let t = g.random_type();
    g.param(t);
    for _ in 0..cfg.ops {
        g.step();
    }
    // The first output computes something from an input: the last value that does, after a
    // few more instructions if none does yet, or else the negation of a new parameter.
    for _ in 0..2 * cfg.ops.max(2) {
        if g.last_computed().is_some() {
            break;
        }
        g.step();
    }
    let last = g.last_computed().unwrap_or_else(|| {
        let mut t = g.random_type();
        t.shape.iter_mut().for_each(|d| *d = (*d).max(1));
        let p = g.param(t.clone());
        let op = if t.dtype.is_pred() {
            Op::Not {}
        } else {
            Op::Negate {}
        };
        g.b.inst(op, &[p]).expect("negation is well-typed")
    });
    let mut outs = vec![last];
    if g.pool.len() > 2 && g.rng.chance(0.5) {
        let other = *g.rng.pick(&g.pool);
        outs.push(other);
    }
    for v in std::mem::take(&mut g.wide) {
        if !outs.contains(&v) {
            outs.push(v);
        }
    }
    g.b.finish(&outs).expect("outputs come from the pool")
}

#[cfg(test)]
mod tests;
