//! Double-double arithmetic: a value carried as the unevaluated sum of two f64s `(hi, lo)`
//! with |lo| at most half an ulp of hi, so about 106 bits. The error-free steps (Knuth's
//! two-sum, Dekker's fast two-sum, the fused product's rounding error) that kiln's f64
//! sine, cosine, tan, atan2 and power on the GPU build on. Every step is an exact identity
//! in IEEE arithmetic rounded to nearest, so LLVM must not reassociate or contract them: they
//! are built without fast-math flags, and the products whose rounding error matters are
//! explicit `llvm.fma` calls.

use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::values::FloatValue;

/// A value as hi + lo.
pub(crate) type Dd<'c> = (FloatValue<'c>, FloatValue<'c>);

/// The double-double steps, on any [`Base`].
pub(crate) trait DoubleDouble<'c>: Base<'c> {
    /// a b + c rounded once.
    fn fma(
        &self,
        a: FloatValue<'c>,
        b: FloatValue<'c>,
        c: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        Ok(self
            .intrinsic(
                "llvm.fma",
                a.get_type().into(),
                &[a.into(), b.into(), c.into()],
            )?
            .into_float_value())
    }

    /// a + b exactly, as the rounded sum and its rounding error (any magnitudes).
    fn two_sum(&self, a: FloatValue<'c>, b: FloatValue<'c>) -> Result<Dd<'c>> {
        let bl = self.builder();
        let s = bl.build_float_add(a, b, "s").map_err(llvm)?;
        let bb = bl.build_float_sub(s, a, "bb").map_err(llvm)?;
        let ab = bl.build_float_sub(s, bb, "ab").map_err(llvm)?;
        let eb = bl.build_float_sub(b, bb, "eb").map_err(llvm)?;
        let ea = bl.build_float_sub(a, ab, "ea").map_err(llvm)?;
        Ok((s, bl.build_float_add(ea, eb, "e").map_err(llvm)?))
    }

    /// a + b exactly where |a| >= |b| (or a is 0): the rounded sum and its rounding error.
    fn fast_two_sum(&self, a: FloatValue<'c>, b: FloatValue<'c>) -> Result<Dd<'c>> {
        let bl = self.builder();
        let s = bl.build_float_add(a, b, "s").map_err(llvm)?;
        let z = bl.build_float_sub(s, a, "z").map_err(llvm)?;
        Ok((s, bl.build_float_sub(b, z, "e").map_err(llvm)?))
    }

    /// a b exactly (barring underflow), as the rounded product and its rounding error.
    fn two_prod(&self, a: FloatValue<'c>, b: FloatValue<'c>) -> Result<Dd<'c>> {
        let p = self.builder().build_float_mul(a, b, "p").map_err(llvm)?;
        let neg = self.builder().build_float_neg(p, "np").map_err(llvm)?;
        Ok((p, self.fma(a, b, neg)?))
    }

    /// (nh + nl) / (dh + dl) to about 100 bits: the rounded quotient q corrected by the exact
    /// remainder nh - q dh.
    fn dd_div(&self, n: Dd<'c>, d: Dd<'c>) -> Result<Dd<'c>> {
        let bl = self.builder();
        let q = bl.build_float_div(n.0, d.0, "q").map_err(llvm)?;
        let nq = bl.build_float_neg(q, "nq").map_err(llvm)?;
        let rem = self.fma(nq, d.0, n.0)?;
        let rem = bl.build_float_add(rem, n.1, "rem").map_err(llvm)?;
        let rem = self.fma(nq, d.1, rem)?;
        let c = bl.build_float_div(rem, d.0, "c").map_err(llvm)?;
        self.fast_two_sum(q, c)
    }
}

impl<'c, T: Base<'c> + ?Sized> DoubleDouble<'c> for T {}
