//! What the CPU and GPU emitters share: the element operations on scalars ([`scalar`]) and
//! kiln's own transcendental functions as target-independent LLVM IR ([`math`]); and for
//! targets without a C math library (the GPU), an exact float remainder ([`fmod`]), `log1p`,
//! `expm1`, `cbrt` and `power` ([`libm`]; f64 `power` in [`pow64`]), `atan2` and the circular
//! functions ([`trig`]; in f64, [`atan64`] and [`circular64`]), the f64 ones on double-double
//! arithmetic ([`dd`]) and constant tables ([`table`], [`tables64`]). Each emitter implements
//! [`Base`] (its context, module and builder, and the few things that differ by target) and
//! gets them all.

pub(crate) mod atan64;
pub(crate) mod circular64;
pub(crate) mod dd;
pub(crate) mod fmod;
pub(crate) mod libm;
pub(crate) mod math;
pub(crate) mod pow64;
pub(crate) mod scalar;
pub(crate) mod table;
pub(crate) mod tables64;
pub(crate) mod trig;

#[cfg(test)]
pub(crate) mod host;

use crate::{Error, Result};
use inkwell::AddressSpace;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::FloatValue;
use kiln_ir::DType;

pub(crate) fn llvm<E: std::fmt::Display>(e: E) -> Error {
    Error::Llvm(e.to_string())
}

/// What is known of an exponential's argument ([`Base::take_exp_arg`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ExpArg {
    /// Nothing: [`math::Math::exp_fast`].
    #[default]
    Any,
    /// Never positive (`x - max x`): [`math::Math::exp_nonpositive`].
    Nonpositive,
    /// Never positive, and it selects (a masked logit): [`math::Math::exp_masked`].
    Masked,
}

impl ExpArg {
    /// A never-positive argument, masked where it selects.
    pub(crate) fn nonpositive(masked: bool) -> ExpArg {
        if masked {
            ExpArg::Masked
        } else {
            ExpArg::Nonpositive
        }
    }
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
    /// Whether a result that underflows (rounds into the subnormals or to 0) costs the target a
    /// microcode assist, as on x86 cores (about a hundred cycles an instruction): a softmax's
    /// exponentials then select 0 past the bottom of their range rather than scaling down to
    /// it (see [`math::Math::exp_masked`]). GPUs round subnormal results at full speed.
    fn underflow_assists(&self) -> bool {
        false
    }
    /// What is known of the argument of the exponential about to be emitted (taken: the next
    /// call answers [`ExpArg::Any`]).
    fn take_exp_arg(&self) -> ExpArg {
        ExpArg::Any
    }
    /// The C math function `name` (`name` + `f` for f32) of `x`.
    fn libm_call(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>>;
    /// Whether the target has no C math library: float remainders are then computed by
    /// [`fmod::Remainder::fmod_exact`] rather than LLVM's `frem`, powers by
    /// [`libm::Library::pow_narrow`] rather than `llvm.pow`, and `atan2`, `sine`, `cosine`
    /// and `tan` by [`trig::Trig`] rather than LLVM's intrinsics.
    fn inline_library(&self) -> bool {
        false
    }
    /// The address space of constant tables ([`table::Tables`]).
    fn constant_space(&self) -> AddressSpace {
        AddressSpace::default()
    }
}
