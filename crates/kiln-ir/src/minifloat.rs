//! The small floating-point formats (StableHLO's `f8E4M3FN`, `f8E5M2`, ..., `f4E2M1FN`) and the
//! one exact conversion between their bit patterns and f64 / f32 that every layer uses.
//!
//! A value of one of these types is stored as its bit pattern in the low bits of a byte (the
//! 6- and 4-bit types one per byte, like `i4`). Decoding is exact: every value of every format
//! is an f32. Encoding rounds to the nearest value, ties to the even bit pattern (ties away
//! from zero in `f8e8m0fnu`, which has no mantissa: as ml_dtypes does), then applies the
//! format's rules for what it cannot hold:
//!
//! | family | formats | overflow | NaN | negative zero |
//! |---|---|---|---|---|
//! | IEEE | `f8e5m2`, `f8e4m3`, `f8e3m4` | infinity | a NaN with the sign and payload (below) | kept |
//! | FN | `f8e4m3fn` | NaN (`0x7f`, with the sign) | the same | kept |
//! | FNUZ | `f8e4m3fnuz`, `f8e5m2fnuz`, `f8e4m3b11fnuz` | NaN (`0x80`) | `0x80` | becomes +0 |
//! | FNU | `f8e8m0fnu` (powers of two only) | NaN (`0xff`) | `0xff` | zero and negatives are NaN |
//! | MX | `f6e2m3fn`, `f6e3m2fn`, `f4e2m1fn` | the largest finite value | zero, with the sign | kept |
//!
//! A NaN of the IEEE family keeps its pattern through f32 and f64: its mantissa (the payload,
//! never zero) is carried in the bits just below the wide NaN's quiet bit, which is set
//! (`0x7fc00000 | q << (22 - m)` in f32 for a mantissa `q` of `m` bits), and a wide NaN rounds
//! back to the sign, the exponent of all ones and those bits (the quiet NaN, top mantissa bit
//! set, when they are zero, as for the canonical `0x7fc00000`). So a value held in f32 (as the
//! compiled backends hold every small float between kernels) comes back with its bits, a NaN
//! made by a `bitcast_convert` included, and quieting a wide NaN (which sets only the quiet
//! bit) changes no pattern. The other families have one NaN of each sign.
//!
//! Infinities count as overflow. Arithmetic on these types computes in f32 or wider (the
//! reference in f64) and rounds the result once to the type; for `+ - * /` and `sqrt` both give
//! the same result, f32 having more than twice the precision plus two bits.

use std::fmt;

/// One of the small floating-point formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MiniFloat {
    /// `f8e4m3fn`: 4 exponent bits (bias 7), 3 mantissa bits, no infinity, NaN `s1111111`.
    F8E4M3FN,
    /// `f8e5m2`: IEEE-like, 5 exponent bits (bias 15), 2 mantissa bits.
    F8E5M2,
    /// `f8e4m3`: IEEE-like, 4 exponent bits (bias 7), 3 mantissa bits.
    F8E4M3,
    /// `f8e3m4`: IEEE-like, 3 exponent bits (bias 3), 4 mantissa bits.
    F8E3M4,
    /// `f8e4m3fnuz`: 4 exponent bits (bias 8), 3 mantissa bits, one NaN (`0x80`), no -0.
    F8E4M3FNUZ,
    /// `f8e5m2fnuz`: 5 exponent bits (bias 16), 2 mantissa bits, one NaN (`0x80`), no -0.
    F8E5M2FNUZ,
    /// `f8e4m3b11fnuz`: 4 exponent bits (bias 11), 3 mantissa bits, one NaN (`0x80`), no -0.
    F8E4M3B11FNUZ,
    /// `f8e8m0fnu`: an unsigned 8-bit exponent (bias 127), the values 2^-127..2^127; `0xff`
    /// is NaN.
    F8E8M0FNU,
    /// `f6e2m3fn`: 2 exponent bits (bias 1), 3 mantissa bits, finite values only.
    F6E2M3FN,
    /// `f6e3m2fn`: 3 exponent bits (bias 3), 2 mantissa bits, finite values only.
    F6E3M2FN,
    /// `f4e2m1fn`: 2 exponent bits (bias 1), 1 mantissa bit, finite values only.
    F4E2M1FN,
}

/// How a format treats what it cannot represent (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Infinities and NaNs where IEEE puts them (exponent all ones).
    Ieee,
    /// No infinity; NaN is the all-ones pattern.
    Fn,
    /// No infinity and no negative zero; NaN is `0x80`.
    Fnuz,
    /// Unsigned powers of two; NaN is `0xff`.
    Fnu,
    /// Finite values only; overflow saturates.
    Mx,
}

impl MiniFloat {
    /// Every format, in declaration order.
    pub const ALL: [MiniFloat; 11] = [
        MiniFloat::F8E4M3FN,
        MiniFloat::F8E5M2,
        MiniFloat::F8E4M3,
        MiniFloat::F8E3M4,
        MiniFloat::F8E4M3FNUZ,
        MiniFloat::F8E5M2FNUZ,
        MiniFloat::F8E4M3B11FNUZ,
        MiniFloat::F8E8M0FNU,
        MiniFloat::F6E2M3FN,
        MiniFloat::F6E3M2FN,
        MiniFloat::F4E2M1FN,
    ];

    /// kiln's name: StableHLO's, lowercase (`f8e4m3fn` for `f8E4M3FN`).
    pub fn name(self) -> &'static str {
        match self {
            MiniFloat::F8E4M3FN => "f8e4m3fn",
            MiniFloat::F8E5M2 => "f8e5m2",
            MiniFloat::F8E4M3 => "f8e4m3",
            MiniFloat::F8E3M4 => "f8e3m4",
            MiniFloat::F8E4M3FNUZ => "f8e4m3fnuz",
            MiniFloat::F8E5M2FNUZ => "f8e5m2fnuz",
            MiniFloat::F8E4M3B11FNUZ => "f8e4m3b11fnuz",
            MiniFloat::F8E8M0FNU => "f8e8m0fnu",
            MiniFloat::F6E2M3FN => "f6e2m3fn",
            MiniFloat::F6E3M2FN => "f6e3m2fn",
            MiniFloat::F4E2M1FN => "f4e2m1fn",
        }
    }

    /// StableHLO's name (`f8E4M3FN`).
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            MiniFloat::F8E4M3FN => "f8E4M3FN",
            MiniFloat::F8E5M2 => "f8E5M2",
            MiniFloat::F8E4M3 => "f8E4M3",
            MiniFloat::F8E3M4 => "f8E3M4",
            MiniFloat::F8E4M3FNUZ => "f8E4M3FNUZ",
            MiniFloat::F8E5M2FNUZ => "f8E5M2FNUZ",
            MiniFloat::F8E4M3B11FNUZ => "f8E4M3B11FNUZ",
            MiniFloat::F8E8M0FNU => "f8E8M0FNU",
            MiniFloat::F6E2M3FN => "f6E2M3FN",
            MiniFloat::F6E3M2FN => "f6E3M2FN",
            MiniFloat::F4E2M1FN => "f4E2M1FN",
        }
    }

    /// The ml_dtypes / JAX name (`float8_e4m3fn`).
    pub fn ml_dtypes_name(self) -> String {
        let n = self.name();
        format!("float{}_{}", &n[1..2], &n[2..])
    }

    /// Width of the bit pattern: 8, 6 or 4.
    pub fn bits(self) -> u32 {
        match self {
            MiniFloat::F6E2M3FN | MiniFloat::F6E3M2FN => 6,
            MiniFloat::F4E2M1FN => 4,
            _ => 8,
        }
    }

    /// (exponent bits, mantissa bits, exponent bias).
    pub fn layout(self) -> (u32, u32, i32) {
        match self {
            MiniFloat::F8E4M3FN | MiniFloat::F8E4M3 => (4, 3, 7),
            MiniFloat::F8E5M2 => (5, 2, 15),
            MiniFloat::F8E3M4 => (3, 4, 3),
            MiniFloat::F8E4M3FNUZ => (4, 3, 8),
            MiniFloat::F8E5M2FNUZ => (5, 2, 16),
            MiniFloat::F8E4M3B11FNUZ => (4, 3, 11),
            MiniFloat::F8E8M0FNU => (8, 0, 127),
            MiniFloat::F6E2M3FN => (2, 3, 1),
            MiniFloat::F6E3M2FN => (3, 2, 3),
            MiniFloat::F4E2M1FN => (2, 1, 1),
        }
    }

    /// The format's family: its rules for overflow, NaN and zero.
    pub fn family(self) -> Family {
        match self {
            MiniFloat::F8E5M2 | MiniFloat::F8E4M3 | MiniFloat::F8E3M4 => Family::Ieee,
            MiniFloat::F8E4M3FN => Family::Fn,
            MiniFloat::F8E4M3FNUZ | MiniFloat::F8E5M2FNUZ | MiniFloat::F8E4M3B11FNUZ => {
                Family::Fnuz
            }
            MiniFloat::F8E8M0FNU => Family::Fnu,
            MiniFloat::F6E2M3FN | MiniFloat::F6E3M2FN | MiniFloat::F4E2M1FN => Family::Mx,
        }
    }

    /// The sign bit's mask (0 for `f8e8m0fnu`, which has none).
    pub fn sign_mask(self) -> u8 {
        if self.family() == Family::Fnu {
            0
        } else {
            1 << (self.bits() - 1)
        }
    }

    /// The magnitude pattern of the largest finite value.
    pub fn max_code(self) -> u8 {
        let (e, m, _) = self.layout();
        match self.family() {
            Family::Ieee => (((1u32 << e) - 1) << m) as u8 - 1,
            Family::Fn => 0x7e,
            Family::Fnuz => 0x7f,
            Family::Fnu => 0xfe,
            Family::Mx => self.sign_mask() - 1,
        }
    }

    /// The pattern an overflow of the given sign becomes.
    pub fn overflow_code(self, negative: bool) -> u8 {
        let s = if negative { self.sign_mask() } else { 0 };
        let (e, m, _) = self.layout();
        match self.family() {
            Family::Ieee => s | (((1u32 << e) - 1) << m) as u8,
            Family::Fn => s | 0x7f,
            Family::Fnuz => 0x80,
            Family::Fnu => 0xff,
            Family::Mx => s | self.max_code(),
        }
    }

    /// The pattern a NaN of the given sign becomes.
    pub fn nan_code(self, negative: bool) -> u8 {
        let s = if negative { self.sign_mask() } else { 0 };
        let (e, m, _) = self.layout();
        match self.family() {
            // Exponent all ones, the top mantissa bit set: quiet.
            Family::Ieee => s | ((((1u32 << e) - 1) << m) | (1 << (m - 1))) as u8,
            Family::Fn => s | 0x7f,
            Family::Fnuz => 0x80,
            Family::Fnu => 0xff,
            Family::Mx => s,
        }
    }

    /// The pattern of the IEEE-family NaN held in `bits`, a wide NaN with `frac` fraction bits
    /// (23 for f32, 52 for f64): the sign, the exponent of all ones, and the mantissa from
    /// the bits just below the quiet bit (the quiet NaN when they are zero). See the module
    /// docs.
    fn ieee_nan_code(self, bits: u64, frac: u32, negative: bool) -> u8 {
        let (e, m, _) = self.layout();
        let q = (bits >> (frac - 1 - m)) & ((1 << m) - 1);
        let q = if q == 0 { 1 << (m - 1) } else { q };
        let s = if negative { self.sign_mask() } else { 0 };
        s | ((((1u64 << e) - 1) << m) | q) as u8
    }

    /// The wide NaN (`frac` fraction bits, `exp` exponent bits) holding the IEEE-family NaN
    /// pattern `code` (see the module docs), as bits; `None` when `code` is not such a NaN.
    fn ieee_nan_bits(self, code: u8, frac: u32, exp: u32) -> Option<u64> {
        let (e, m, _) = self.layout();
        let mag = code & !self.sign_mask();
        let mant = (mag & ((1u8 << m) - 1)) as u64;
        if self.family() != Family::Ieee || (mag >> m) as u64 != (1 << e) - 1 || mant == 0 {
            return None;
        }
        let sign = u64::from(code & self.sign_mask() != 0) << (frac + exp);
        Some(sign | ((1 << exp) - 1) << frac | 1 << (frac - 1) | mant << (frac - 1 - m))
    }

    /// True when the format has a NaN.
    pub fn has_nan(self) -> bool {
        self.family() != Family::Mx
    }

    /// True when the format has infinities.
    pub fn has_inf(self) -> bool {
        self.family() == Family::Ieee
    }

    /// The exact value of the bit pattern `code` (its low [`MiniFloat::bits`] bits).
    pub fn to_f64(self, code: u8) -> f64 {
        let code = code & ((1u32 << self.bits()) - 1) as u8;
        if let Some(bits) = self.ieee_nan_bits(code, 52, 11) {
            return f64::from_bits(bits);
        }
        let (e, m, bias) = self.layout();
        if self.family() == Family::Fnu {
            return if code == 0xff {
                f64::NAN
            } else {
                2f64.powi(code as i32 - bias)
            };
        }
        if self.family() == Family::Fnuz && code == 0x80 {
            return f64::NAN;
        }
        let negative = code & self.sign_mask() != 0;
        let mag = code & !self.sign_mask();
        let ef = (mag >> m) as u32;
        let mant = (mag & ((1u8 << m) - 1)) as u32;
        let all_ones = (1u32 << e) - 1;
        let v = match self.family() {
            Family::Ieee if ef == all_ones => {
                if mant == 0 {
                    f64::INFINITY
                } else {
                    f64::NAN
                }
            }
            Family::Fn if mag == 0x7f => f64::NAN,
            _ => {
                let (sig, exp) = if ef == 0 {
                    (mant, 1 - bias - m as i32)
                } else {
                    (mant | (1 << m), ef as i32 - bias - m as i32)
                };
                sig as f64 * 2f64.powi(exp)
            }
        };
        if negative { -v } else { v }
    }

    /// The exact value of `code` as f32 (every value of every format is one).
    pub fn to_f32(self, code: u8) -> f32 {
        let code = code & ((1u32 << self.bits()) - 1) as u8;
        match self.ieee_nan_bits(code, 23, 8) {
            Some(bits) => f32::from_bits(bits as u32),
            None => self.to_f64(code) as f32,
        }
    }

    /// `x` rounded to this format (see the module docs), as its bit pattern.
    pub fn from_f64(self, x: f64) -> u8 {
        let negative = x.is_sign_negative();
        if x.is_nan() {
            return match self.family() {
                Family::Ieee => self.ieee_nan_code(x.to_bits(), 52, negative),
                _ => self.nan_code(negative),
            };
        }
        let (_, m, bias) = self.layout();
        let a = x.abs();
        if self.family() == Family::Fnu {
            if negative || a == 0.0 {
                return 0xff;
            }
            if a.is_infinite() {
                return 0xff;
            }
            // The nearest power of two, ties (1.5 * 2^k) up.
            let k = a.log2().floor() as i32;
            // `log2` of an f64 may be off by one near powers of two: settle k exactly.
            let mut k = k;
            while 2f64.powi(k) > a {
                k -= 1;
            }
            while 2f64.powi(k + 1) <= a {
                k += 1;
            }
            let k = if a >= 1.5 * 2f64.powi(k) { k + 1 } else { k };
            let k = k.max(-bias);
            return if k > bias { 0xff } else { (k + bias) as u8 };
        }
        if a.is_infinite() {
            return self.overflow_code(negative);
        }
        // The exponent of the spacing at a: that of a's binade, or of the subnormals.
        let emin = 1 - bias;
        let e = if a == 0.0 {
            emin
        } else {
            exponent_of(a).max(emin)
        };
        let q = e - m as i32;
        // a / 2^q, exact: a power of two scales without rounding unless a goes subnormal in
        // f64, which no value near these formats' range does.
        let n = round_ties_even(scale(a, -q));
        let code: i64 = if n < (1u64 << m) as f64 {
            // Subnormal (or zero).
            n as i64
        } else {
            (((e + bias) as i64) << m) + n as i64 - (1i64 << m)
        };
        let mag = if code > self.max_code() as i64 {
            return self.overflow_code(negative);
        } else {
            code as u8
        };
        let s = if negative { self.sign_mask() } else { 0 };
        if self.family() == Family::Fnuz && mag == 0 {
            0
        } else {
            s | mag
        }
    }

    /// `x` rounded to this format, as its bit pattern. Rounding the f32 directly: no double
    /// rounding through f64, which holds every f32 exactly.
    pub fn from_f32(self, x: f32) -> u8 {
        if x.is_nan() && self.family() == Family::Ieee {
            return self.ieee_nan_code(x.to_bits() as u64, 23, x.is_sign_negative());
        }
        self.from_f64(x as f64)
    }

    /// `x` rounded to the nearest value of this format (the format's rules for overflow and
    /// NaN applied), as an f64.
    pub fn round_f64(self, x: f64) -> f64 {
        self.to_f64(self.from_f64(x))
    }

    /// The largest finite value.
    pub fn max_value(self) -> f64 {
        self.to_f64(self.max_code())
    }
}

/// floor(log2 a) for a finite positive a, exactly.
pub(crate) fn exponent_of(a: f64) -> i32 {
    let bits = a.to_bits();
    let ef = ((bits >> 52) & 0x7ff) as i32;
    if ef == 0 {
        // Subnormal: the position of the leading one.
        let mant = bits & ((1u64 << 52) - 1);
        -1074 + 63 - mant.leading_zeros() as i32
    } else {
        ef - 1023
    }
}

/// a * 2^k, exactly while the result stays normal.
pub(crate) fn scale(a: f64, k: i32) -> f64 {
    // Two steps, so that neither power of two leaves f64's range.
    let h = k / 2;
    a * 2f64.powi(h) * 2f64.powi(k - h)
}

/// Rounds to the nearest integer, ties to even.
fn round_ties_even(x: f64) -> f64 {
    x.round_ties_even()
}

impl fmt::Display for MiniFloat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
