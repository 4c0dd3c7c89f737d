//! TF32, the tensor cores' 19-bit float: f32's sign and 8 exponent bits with the upper 10 of
//! its 23 mantissa bits, held in a 32-bit register whose low 13 bits are zero. [`round`] is
//! `cvt.rna.tf32.f32` (what a TF32 product rounds its operands with, [`super::ir::Stmt::RoundTf32`]),
//! [`truncate`] what the tensor cores make of a register that was not rounded (the emulator's
//! reading of an `mma` operand). Both work on f32 bit patterns, so the emulator and the tests'
//! references round exactly as the hardware does.

/// The mantissa bits TF32 drops.
const DROPPED: u32 = 0x1fff;

/// Half an ulp of TF32 in f32's bits: the highest dropped bit.
const HALF_ULP: u32 = 0x1000;

/// `x` rounded to TF32 as `cvt.rna.tf32.f32` rounds it: to the nearest value with 10 mantissa
/// bits, a tie away from zero (half an ulp is added to the magnitude, then the low 13 bits are
/// cleared, so a carry moves into the exponent); subnormals alike; a value at or past half an
/// ulp above TF32's largest finite value becomes an infinity of its sign; infinities and NaN
/// stay what they are.
///
/// # Examples
///
/// ```
/// use kiln_kernel::gpu::tf32::round;
/// assert_eq!(round(1.0 + 2f32.powi(-12)), 1.0); // below half an ulp (2^-11): down
/// assert_eq!(round(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10)); // a tie: away from zero
/// assert_eq!(round(-(1.0 + 2f32.powi(-11))), -(1.0 + 2f32.powi(-10)));
/// assert_eq!(round(f32::MAX), f32::INFINITY);
/// assert!(round(f32::NAN).is_nan());
/// ```
pub fn round(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    // The magnitude's bits plus half an ulp of TF32 (bit 12): at most 0x7f80_0fff, no carry
    // into the sign.
    f32::from_bits((x.to_bits() + HALF_ULP) & !DROPPED)
}

/// `x` as the tensor cores read a TF32 operand: its low 13 bits dropped (toward zero), NaN
/// kept a NaN.
pub fn truncate(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    f32::from_bits(x.to_bits() & !DROPPED)
}

/// Whether `x` is a TF32 value (its low 13 bits are zero, or it is a NaN).
pub fn is_tf32(x: f32) -> bool {
    x.is_nan() || x.to_bits() & DROPPED == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(x: u32) -> f32 {
        f32::from_bits(x)
    }

    #[test]
    fn rounds_to_nearest_with_ties_away_from_zero() {
        let ulp = 2f32.powi(-10);
        for sign in [1.0f32, -1.0] {
            let at = |x: f32| sign * x;
            // Exact values stay.
            for x in [
                0.0,
                1.0,
                1.0 + ulp,
                2.0 - ulp,
                2f32.powi(-126),
                2f32.powi(100),
            ] {
                assert_eq!(round(at(x)).to_bits(), at(x).to_bits(), "{}", at(x));
            }
            // Below half an ulp: down; above: up; a tie: away from zero (not to even: 1 is
            // even, and 1 + ulp is where the tie goes).
            assert_eq!(round(at(1.0 + ulp * 0.25)), at(1.0));
            assert_eq!(round(at(1.0 + ulp * 0.75)), at(1.0 + ulp));
            assert_eq!(round(at(1.0 + ulp * 0.5)), at(1.0 + ulp));
            assert_eq!(round(at(1.0 + ulp * 1.5)), at(1.0 + 2.0 * ulp));
            // Just below the tie (the largest f32 below it): down.
            assert_eq!(round(bits(0x3f80_0fff) * sign), at(1.0));
            // A carry into the exponent: 2 - ulp/2 is a tie, which goes to 2.
            assert_eq!(round(at(2.0 - ulp * 0.5)), at(2.0));
        }
        // The result never has mantissa bits past TF32's.
        for x in [0.1f32, -7.3e-5, 1.0e30, 3.3e-30, -123.456] {
            assert!(is_tf32(round(x)), "{x}");
            assert!((round(x) - x).abs() <= x.abs() * 2f32.powi(-11), "{x}");
        }
    }

    #[test]
    fn subnormals_round_alike() {
        // The smallest f32 subnormal is below half of TF32's smallest (2^-136): to zero.
        assert_eq!(round(bits(1)).to_bits(), 0);
        assert_eq!(round(-bits(1)).to_bits(), 0x8000_0000);
        // TF32's smallest subnormal is 2^13 of f32's; half of it is a tie, away from zero.
        assert_eq!(round(bits(0x1000)).to_bits(), 0x2000);
        assert_eq!(round(bits(0x0fff)).to_bits(), 0);
        // The largest subnormal rounds up to the smallest normal.
        assert_eq!(round(bits(0x007f_ffff)).to_bits(), 0x0080_0000);
    }

    #[test]
    fn infinities_and_nan_are_kept_and_values_past_the_largest_overflow() {
        assert_eq!(round(f32::INFINITY), f32::INFINITY);
        assert_eq!(round(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(round(f32::NAN).is_nan());
        // A NaN whose payload lies in the dropped bits stays a NaN.
        assert!(round(bits(0x7f80_0001)).is_nan());
        assert!(truncate(bits(0x7f80_0001)).is_nan());
        // TF32's largest finite value, (2 - 2^-10) 2^127, stays; half an ulp above it (a tie)
        // and f32's largest round away, to an infinity of their sign.
        let largest = bits(0x7f7f_e000);
        assert_eq!(round(largest), largest);
        assert_eq!(round(-largest), -largest);
        assert_eq!(round(bits(0x7f7f_efff)), largest);
        assert_eq!(round(bits(0x7f7f_f000)), f32::INFINITY);
        assert_eq!(round(f32::MAX), f32::INFINITY);
        assert_eq!(round(f32::MIN), f32::NEG_INFINITY);
    }

    #[test]
    fn truncation_drops_the_low_bits_toward_zero() {
        let ulp = 2f32.powi(-10);
        assert_eq!(truncate(1.0 + ulp * 0.75), 1.0);
        assert_eq!(truncate(-(1.0 + ulp * 0.75)), -1.0);
        assert_eq!(truncate(f32::MAX), bits(0x7f7f_e000));
        assert_eq!(truncate(f32::INFINITY), f32::INFINITY);
        // Rounding and truncation differ exactly where a value lies half an ulp or more above
        // a TF32 value.
        assert_ne!(round(1.0 + ulp * 0.5), truncate(1.0 + ulp * 0.5));
        assert_eq!(round(1.0 + ulp * 0.25), truncate(1.0 + ulp * 0.25));
        assert!(!is_tf32(1.0 + ulp * 0.25) && is_tf32(1.0 + ulp));
    }
}
