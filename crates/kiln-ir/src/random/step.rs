//! One step of the generator: an instruction of a random kind on a random value of the pool,
//! then, from streams of their own, the occasional region op, call, wide op, op of a new
//! element type, data-dependent or nested control flow, or collective.

use super::{Gen, Rng};
use crate::ValueId;

impl Gen<'_> {
    /// One instruction of a random kind on a random value of the pool (control flow and linear
    /// algebra only with [`super::Config::control`]); its result joins the pool.
    pub(super) fn step(&mut self) {
        // Large programs drop an instruction whose results grow too large, and favour matrix
        // products (one step in three) and transposes (one in six).
        let saved = self.cfg.elements.map(|_| (self.b.clone(), self.pool.len()));
        let a = *self.rng.pick(&self.pool);
        let t = self.ty(a);
        let d = t.dtype;
        let r = t.rank();
        let case = match self.cfg.elements.map(|_| self.rng.below(6)) {
            Some(0 | 1) => 14,
            Some(2) => 9,
            _ if self.cfg.control => self.rng.below(30),
            _ => self.rng.below(26),
        };
        let result: Option<ValueId> = match case {
            0 | 1 => self.unary(a, &t),
            2..=4 if d.is_complex() => self.complex_binary(a, &t),
            2..=4 => self.binary(a, &t),
            5 => self.compare_select(a, &t),
            6 => self.convert(a, &t),
            7 => self.broadcast(a, &t),
            8 => self.reshape(a, &t),
            9 => self.transpose(a, &t),
            10 => self.slice(a, &t),
            11 => self.reverse(a, &t),
            12 => self.pad(a, &t),
            13 if r > 0 => self.reduce(a, &t),
            14 if r >= 1 && !d.is_pred() => self.dot(a, &t),
            15 if r >= 1 => self.concatenate(a, &t),
            16 if r >= 1 => self.dynamic_slice(a, &t),
            17 if r >= 2 && t.shape[1] > 0 && self.rng.chance(0.4) => self.gather_batched(a, &t),
            17 if r >= 1 && t.shape[0] > 0 => self.gather_rows(a, &t),
            18 if r >= 2 && !d.is_pred() && self.rng.chance(0.4) => self.scatter_batched(a, &t),
            18 if r >= 1 && !d.is_pred() => self.scatter_rows(a, &t),
            19 if r >= 1 && !d.is_pred() => self.reduce_window(a, &t),
            20 if r >= 1 && d.is_float() => self.select_and_scatter(a, &t),
            21 if d.is_float() => self.convolution(a, &t),
            22 if !d.is_pred() => self.clamp(a, &t),
            23 => self.finite_or_bitcast(a, &t),
            24 if r >= 1 => self.dynamic_update_slice(a, &t),
            25 => {
                if self.rng.chance(0.5) {
                    self.barrier(a)
                } else {
                    self.random_bits()
                }
            }
            26 => self.random_loop(a, &t),
            27 => self.random_case(a, &t),
            28 if r >= 1 => self.random_sort(a, &t),
            29 => self.random_linalg(a, &t),
            _ => self.iota_or_constant(a, &t),
        };
        if let (Some((b, pool)), Some((_, hi))) = (saved, self.cfg.elements) {
            let start = b.func().values.len();
            if self.b.func().values[start..].iter().any(|t| t.numel() > hi) {
                self.b = b;
                self.pool.truncate(pool);
                return;
            }
        }
        if let Some(v) = result {
            self.pool.push(v);
        }
        self.maybe_region_op();
        self.maybe_call();
        self.maybe_wide_op();
        self.maybe_typed_op();
        self.maybe_nested_control();
        self.maybe_rare_op();
    }

    /// With control flow, outside large programs, one step in six also adds one collective
    /// (two times in three), `fft` or `lu`, drawn from a stream of its own. In the main draw
    /// these come only from [`Gen::random_linalg`], about once in 240 steps of control seeds
    /// for each, so a run of 2,000 seeds could miss `fft`, or `all_gather`, `all_to_all` and
    /// `reduce_scatter` (the collectives that need a dimension) altogether.
    pub(super) fn maybe_rare_op(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() || self.pool.is_empty() {
            return;
        }
        let v = self.on_side_stream(0x9B05_688C_2B3E_6C1F, 6, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            match g.rng.below(6) {
                // No `fft` in differentiable programs, whose values stay real.
                4 if !g.cfg.differentiable => g.fft_or_collective(a, &t),
                0..=4 => g.one_collective(a, &t),
                _ => g.random_lu(),
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// One time in `one_in` (drawn from a stream of its own, seeded by the main stream's state
    /// and `salt`), `f` run with that side stream in place of the main one, which is left where
    /// it was: a seed's program changes only where `f` adds something.
    pub(super) fn on_side_stream<T>(
        &mut self,
        salt: u64,
        one_in: usize,
        f: impl FnOnce(&mut Self) -> T,
    ) -> Option<T> {
        let mut aux = Rng::new(self.rng.0 ^ salt);
        if aux.below(one_in) != 0 {
            return None;
        }
        std::mem::swap(&mut *self.rng, &mut aux);
        let r = f(self);
        std::mem::swap(&mut *self.rng, &mut aux);
        Some(r)
    }
}
