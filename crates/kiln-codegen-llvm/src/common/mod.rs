//! What the CPU and GPU emitters share: the element operations on scalars ([`scalar`]) and
//! kiln's own transcendental functions as target-independent LLVM IR ([`math`]); and for
//! targets without a C math library (the GPU), an exact float remainder ([`fmod`]), `log1p`,
//! `expm1`, `cbrt` and `power` ([`libm`]), and `atan2` ([`trig`]). Each emitter implements
//! [`Base`] (its context, module and builder, and the few things that differ by target) and
//! gets them all.

pub(crate) mod fmod;
pub(crate) mod libm;
pub(crate) mod math;
pub(crate) mod scalar;
pub(crate) mod trig;

use crate::{Error, Result};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FloatValue;
use kiln_ir::{DType, OpKind};

pub(crate) fn llvm<E: std::fmt::Display>(e: E) -> Error {
    Error::Llvm(e.to_string())
}

/// What an emitter provides the shared element code.
pub(crate) trait Base<'c> {
    /// The LLVM context.
    fn ctx(&self) -> &'c Context;
    /// The module being emitted.
    fn module(&self) -> &Module<'c>;
    /// The builder, positioned where code goes.
    fn builder(&self) -> &Builder<'c>;
    /// Whether `llvm.ldexp` is one instruction on the target (see [`math::Math::exp_fast`]).
    fn scalef(&self) -> bool {
        false
    }
    /// Whether the exponential about to be emitted is known to have a nonpositive argument
    /// (taken: the next call answers false).
    fn take_exp_nonpositive(&self) -> bool {
        false
    }
    /// The C math function `name` (`name` + `f` for f32) of `x`.
    fn libm_call(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>>;
    /// Whether the target has no C math library: float remainders are then computed by
    /// [`fmod::Remainder::fmod_exact`] rather than LLVM's `frem`, powers by
    /// [`libm::Library::pow_narrow`] rather than `llvm.pow`, and `atan2` by
    /// [`trig::Trig::atan2_narrow`].
    fn inline_library(&self) -> bool {
        false
    }
    /// Whether the float op `k` on `d` renders on this target; an [`Error::Unsupported`]
    /// naming it where it does not.
    fn float_op_renders(&self, _k: OpKind, _d: DType) -> Result<()> {
        Ok(())
    }
}
