//! f64 values rounded to `f16` and `bf16` correctly: to the nearest value, ties to even,
//! decided on every bit of the f64.
//!
//! `half`'s own `from_f64` keeps only the upper 32 bits of the f64 (20 bits of its
//! significand) before it rounds, so a value just above a tie whose deciding bits lie lower
//! rounds as if it were the tie: the f32 `0x406E8001` (3.72656274, just above the bf16 tie
//! 3.7265625) came out as 3.71875 instead of 3.734375. The reference interpreter, the GPU
//! emulator and the literals round through these functions instead.

use crate::minifloat::{exponent_of, scale};
use half::{bf16, f16};

/// `x` rounded to the nearest `f16` (ties to even; an infinity past the largest finite value,
/// a NaN keeping its sign).
pub fn f16_from_f64(x: f64) -> f16 {
    f16::from_bits(round_binary16(x, 10, 15))
}

/// `x` rounded to the nearest `bf16` (ties to even; an infinity past the largest finite
/// value, a NaN keeping its sign).
pub fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_bits(round_binary16(x, 7, 127))
}

/// The bits of the 16-bit binary float with `m` significand bits (after the leading one) and
/// exponent bias `bias` nearest to `x`.
fn round_binary16(x: f64, m: u32, bias: i32) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    // The exponent field all ones: an infinity, or with a significand bit a NaN.
    let inf = ((2 * bias + 1) as u32) << m;
    if x.is_nan() {
        return sign | (inf | 1 << (m - 1)) as u16;
    }
    let a = x.abs();
    if a.is_infinite() {
        return sign | inf as u16;
    }
    // The spacing of the values near `a` is 2^(e - m), `e` the exponent of a's binade or of
    // the subnormals.
    let emin = 1 - bias;
    let e = if a == 0.0 {
        emin
    } else {
        exponent_of(a).max(emin)
    };
    // `a` in units of that spacing, exact (a power of two scales an f64 without rounding
    // here), rounded to an integer ties to even: the significand with its leading one.
    let n = scale(a, m as i32 - e).round_ties_even() as u32;
    let code = if n < 1 << m {
        // A subnormal or zero.
        n
    } else {
        // Rounding up to 2^(m + 1) carries into the next binade's exponent, as it should.
        (((e + bias) as u32) << m) + n - (1 << m)
    };
    sign | code.min(inf) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f32 near a tie of either format (all patterns of the low 16 bits around the
    /// rounding position, over exponents from subnormal to overflow) rounds as `half` rounds
    /// the f32 itself, which sees all of its bits.
    #[test]
    fn f32_values_round_as_from_f32_rounds_them() {
        let mut checked = 0;
        for exp in (0u32..=255).step_by(3).chain([0, 1, 254, 255]) {
            for hi in [0u32, 0x1234, 0x7f00, 0x7fff] {
                for lo in (0u32..0x1_0000)
                    .step_by(7)
                    .chain([0x8000, 0x8001, 0x7fff, 0xffff, 0x1000, 0x1001, 0x0fff])
                {
                    for s in [0u32, 1] {
                        let bits = s << 31 | exp << 23 | (hi & 0x7f) << 16 | lo;
                        let x = f32::from_bits(bits);
                        let b = bf16_from_f64(x as f64);
                        let want = bf16::from_f32(x);
                        assert!(
                            b.to_bits() == want.to_bits() || (x.is_nan() && b.is_nan()),
                            "bf16 of {x:e} ({bits:#010x}): {:#06x}, want {:#06x}",
                            b.to_bits(),
                            want.to_bits()
                        );
                        let h = f16_from_f64(x as f64);
                        let want = f16::from_f32(x);
                        assert!(
                            h.to_bits() == want.to_bits() || (x.is_nan() && h.is_nan()),
                            "f16 of {x:e} ({bits:#010x}): {:#06x}, want {:#06x}",
                            h.to_bits(),
                            want.to_bits()
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100_000);
    }

    /// The case the differential test found: bits below the f64's upper half decide.
    #[test]
    fn bits_past_the_upper_half_of_the_f64_decide_a_near_tie() {
        let x = f32::from_bits(0x406E_8001) as f64;
        assert_eq!(bf16_from_f64(x).to_f64(), 3.734375);
        assert_eq!(
            bf16_from_f64(3.7265625).to_f64(),
            3.71875,
            "a tie goes to even"
        );
        // 1 + 2^-8 is a bf16 tie, 1 + 2^-11 an f16 tie; 2^-40 more is above either.
        let above = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(bf16_from_f64(above).to_f64(), 1.0 + 2f64.powi(-7));
        let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16_from_f64(above).to_f64(), 1.0 + 2f64.powi(-10));
        let below = 1.0 + 2f64.powi(-11) - 2f64.powi(-40);
        assert_eq!(f16_from_f64(below).to_f64(), 1.0);
        // The same below the normal range, and past the largest finite value.
        let tie = 2f64.powi(-25);
        assert_eq!(
            f16_from_f64(tie).to_bits(),
            0,
            "half the least subnormal ties to zero"
        );
        assert_eq!(f16_from_f64(tie * (1.0 + 2f64.powi(-45))).to_bits(), 1);
        assert_eq!(f16_from_f64(65520.0 - 2f64.powi(-30)).to_f64(), 65504.0);
        assert!(f16_from_f64(65520.0).is_infinite());
        assert!(bf16_from_f64(-1e300).is_infinite() && bf16_from_f64(-1e300).is_sign_negative());
        assert_eq!(bf16_from_f64(5e-324).to_bits(), 0);
        assert_eq!(bf16_from_f64(-0.0).to_bits(), 0x8000);
        assert!(f16_from_f64(f64::NAN).is_nan() && bf16_from_f64(-f64::NAN).is_sign_negative());
    }
}
