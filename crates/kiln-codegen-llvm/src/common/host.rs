//! What the host tests of the shared math functions share: a [`Base`] on a host module (its
//! functions run through LLVM's JIT and are compared with Rust's), ulp distances and a
//! deterministic random source.

use super::Base;
use crate::Result;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FloatValue;
use kiln_ir::DType;

pub(crate) struct Host<'a, 'c> {
    pub(crate) ctx: &'c Context,
    pub(crate) m: &'a Module<'c>,
    pub(crate) b: Builder<'c>,
}

impl<'c> Base<'c> for Host<'_, 'c> {
    fn ctx(&self) -> &'c Context {
        self.ctx
    }
    fn module(&self) -> &Module<'c> {
        self.m
    }
    fn builder(&self) -> &Builder<'c> {
        &self.b
    }
    fn libm_call(&self, _: &str, _: DType, _: FloatValue<'c>) -> Result<FloatValue<'c>> {
        unreachable!("the host tests call no library function")
    }
}

/// Adds `name`, an f64 function of `arity` f64 arguments whose body `body` emits.
pub(crate) fn define<'c>(
    ctx: &'c Context,
    m: &Module<'c>,
    name: &str,
    arity: usize,
    body: impl FnOnce(&Host<'_, 'c>, &[FloatValue<'c>]) -> Result<FloatValue<'c>>,
) {
    let ft = ctx.f64_type();
    let f = m.add_function(name, ft.fn_type(&vec![ft.into(); arity], false), None);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(f, "entry"));
    let h = Host { ctx, m, b };
    let args: Vec<FloatValue> = f.get_param_iter().map(|p| p.into_float_value()).collect();
    let r = body(&h, &args).unwrap();
    h.b.build_return(Some(&r)).unwrap();
}

/// Ulps between `a` and `b` in f64: 0 for two NaNs or the same value; `u64::MAX` (no bound
/// passes it) for a NaN against a number and for zeros of different signs.
pub(crate) fn ulps64(a: f64, b: f64) -> u64 {
    if a.is_nan() && b.is_nan() || a.to_bits() == b.to_bits() {
        return 0;
    }
    if a.is_nan() || b.is_nan() || a == b {
        return u64::MAX;
    }
    let key = |v: f64| {
        let i = v.to_bits() as i64;
        if i < 0 { i64::MIN - i } else { i }
    };
    key(a).abs_diff(key(b)).max(1)
}

/// A deterministic xorshift source.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform value in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Any f64 bit pattern (NaNs, infinities and subnormals included).
    pub(crate) fn bits(&mut self) -> f64 {
        f64::from_bits(self.next())
    }
}
