//! The reference's bit-level elementwise ops against independent definitions: `reduce_precision`
//! against the `half` crate's conversions (round to nearest even), the integer bit ops against
//! Rust's own.

use kiln_ir::random::Rng;
use kiln_ir::{DType, Op};
use kiln_reference::scalar::{int_binary, int_unary, reduce_precision};

/// Random f32 values over every binade, both signs, subnormals, zeros, infinities and NaN.
fn f32s(n: usize) -> Vec<f32> {
    let mut rng = Rng::new(7);
    let mut v: Vec<f32> = (0..n)
        .map(|_| f32::from_bits(rng.below(u32::MAX as usize) as u32))
        .collect();
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
    ]);
    v
}

#[test]
fn reduce_precision_to_bf16_and_f16_formats_rounds_as_the_conversions_do() {
    for x in f32s(200_000) {
        let got = reduce_precision(DType::F32, x as f64, 8, 7) as f32;
        let want = half::bf16::from_f32(x).to_f32();
        if x.is_nan() {
            assert!(got.is_nan(), "{x:e}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "bf16 format of {x:e}");
        }
        // f16's format on f32: as the conversion where the result is a normal f16 or an
        // infinity; f16's subnormals (and what rounds to them) flush to zero.
        let got = reduce_precision(DType::F32, x as f64, 5, 10) as f32;
        let h = half::f16::from_f32(x);
        let min_normal = 2f32.powi(-14);
        if x.is_nan() {
            assert!(got.is_nan(), "{x:e}");
        } else if x.abs() < min_normal {
            // Rounded at f32's relative spacing first (to 2^-14 from 2^-14 - 2^-26 up), then
            // flushed when below f16's normal range.
            let want = if x.abs() >= min_normal - 2f32.powi(-26) {
                min_normal
            } else {
                0.0
            };
            assert_eq!(got.abs(), want, "f16 format of {x:e}");
            assert_eq!(got.is_sign_negative(), x.is_sign_negative(), "{x:e}");
        } else if h.is_normal() || h.is_infinite() {
            assert_eq!(got.to_bits(), h.to_f32().to_bits(), "f16 format of {x:e}");
        } else {
            assert_eq!(got, 0.0, "f16 format of {x:e}");
            assert_eq!(got.is_sign_negative(), x.is_sign_negative(), "{x:e}");
        }
    }
}

#[test]
fn reduce_precision_keeps_what_the_format_holds_and_handles_nan() {
    for x in f32s(20_000).into_iter().filter(|x| !x.is_nan()) {
        // As wide as f32 or wider: nothing changes, subnormals included.
        assert_eq!(
            (reduce_precision(DType::F32, x as f64, 8, 23) as f32).to_bits(),
            x.to_bits()
        );
        assert_eq!(
            (reduce_precision(DType::F32, x as f64, 11, 40) as f32).to_bits(),
            x.to_bits()
        );
        // Rounding twice to the same format changes nothing more.
        let once = reduce_precision(DType::F32, x as f64, 4, 3);
        assert_eq!(
            reduce_precision(DType::F32, once, 4, 3).to_bits(),
            once.to_bits()
        );
    }
    assert!(reduce_precision(DType::F32, f64::NAN, 5, 1).is_nan());
    assert_eq!(reduce_precision(DType::F32, f64::NAN, 5, 0), f64::INFINITY);
    assert_eq!(
        reduce_precision(DType::F64, -f64::NAN, 5, 0),
        f64::NEG_INFINITY
    );
}

#[test]
fn integer_bit_ops_agree_with_rust() {
    let mut rng = Rng::new(11);
    for _ in 0..20_000 {
        let x = rng.below(u32::MAX as usize) as u32 as i32;
        let s = rng.below(40) as i32 - 4;
        let sra = int_binary(&Op::ShiftRightArithmetic {}, DType::I32, x as i64, s as i64);
        let want = if (0..32).contains(&s) {
            x >> s
        } else if x < 0 {
            -1
        } else {
            0
        };
        assert_eq!(sra, want as i64, "{x} >> {s}");
        // Unsigned: the bits shift as a signed number's.
        let u = x as u32;
        let usra = int_binary(
            &Op::ShiftRightArithmetic {},
            DType::U32,
            u as i64,
            s.rem_euclid(40) as i64,
        );
        let su = s.rem_euclid(40);
        let uwant = if su < 32 {
            (x >> su) as u32
        } else {
            (x >> 31) as u32
        };
        assert_eq!(usra, uwant as i64, "u32 {u} >> {su}");
        assert_eq!(
            int_unary(&Op::Popcnt {}, DType::I32, x as i64),
            x.count_ones() as i64
        );
        assert_eq!(
            int_unary(&Op::CountLeadingZeros {}, DType::I32, x as i64),
            x.leading_zeros() as i64
        );
        let b = x as i8;
        assert_eq!(
            int_unary(&Op::CountLeadingZeros {}, DType::I8, b as i64),
            b.leading_zeros() as i64
        );
        assert_eq!(
            int_unary(&Op::Popcnt {}, DType::I8, b as i64),
            b.count_ones() as i64
        );
    }
}
