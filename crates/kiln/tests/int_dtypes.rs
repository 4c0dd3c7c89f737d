//! The 16-bit and u64 integer types through the front end: eager and `jit` give the same
//! values, and those are the unsigned (or 16-bit wrapping) answers, past 2^63 for u64.

use kiln::{DType, Tensor, jit};

const BIG: [u64; 4] = [u64::MAX, 1 << 63, 3, 0];
const SMALL: [u64; 4] = [2, 1, (1 << 63) + 5, 7];

fn u64s(v: &[u64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()]).unwrap()
}

/// `f` eagerly and under `jit`, which must agree bit for bit.
fn both(f: impl Fn(&Tensor, &Tensor) -> Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    let eager = f(a, b);
    let traced = jit(|(a, b): &(Tensor, Tensor)| f(a, b))
        .call(&(a.clone(), b.clone()))
        .unwrap();
    assert_eq!(
        eager.to_literal().unwrap(),
        traced.to_literal().unwrap(),
        "eager and jit differ"
    );
    eager
}

#[test]
fn u64_orders_divides_and_converts_as_unsigned() {
    let (a, b) = (u64s(&BIG), u64s(&SMALL));
    let lt = both(|a, b| a.lt(b), &a, &b);
    assert_eq!(lt.to_vec::<bool>().unwrap(), [false, false, true, true]);
    let max = both(|a, b| a.maximum(b), &a, &b);
    assert_eq!(
        max.to_vec::<u64>().unwrap(),
        [u64::MAX, 1 << 63, (1 << 63) + 5, 7]
    );
    let q = both(|a, b| a.div_trunc(b), &a, &b);
    assert_eq!(q.to_vec::<u64>().unwrap(), [u64::MAX / 2, 1 << 63, 0, 0]);
    let r = both(|a, b| a.rem(b), &a, &b);
    assert_eq!(r.to_vec::<u64>().unwrap(), [1, 0, 3, 0]);
    let f = both(|a, _| a.cast(DType::F64), &a, &b);
    assert_eq!(
        f.to_vec::<f64>().unwrap(),
        [u64::MAX as f64, (1u64 << 63) as f64, 3.0, 0.0]
    );
    let back = both(|a, _| a.cast(DType::F64).cast(DType::U64), &a, &b);
    // 2^64 - 1 rounds to 2^64 in f64, which saturates back to 2^64 - 1.
    assert_eq!(back.to_vec::<u64>().unwrap(), BIG);
    let top = both(|a, _| a.max(&[0], false), &a, &b);
    assert_eq!(top.to_vec::<u64>().unwrap(), [u64::MAX]);
    let low = both(|a, _| a.max(&[0], false).cast(DType::U64), &b, &a);
    assert_eq!(low.to_vec::<u64>().unwrap(), [(1 << 63) + 5]);
    let sorted = both(|a, _| a.sort(0, false), &a, &b);
    assert_eq!(sorted.to_vec::<u64>().unwrap(), [0, 3, 1 << 63, u64::MAX]);
}

#[test]
fn sixteen_bit_integers_wrap_and_promote() {
    let i = Tensor::from_vec(vec![i16::MAX, i16::MIN, -7], [3]).unwrap();
    let u = Tensor::from_vec(vec![u16::MAX, 1 << 15, 2], [3]).unwrap();
    let ones_i = Tensor::from_vec(vec![1i16; 3], [3]).unwrap();
    let ones_u = Tensor::from_vec(vec![1u16; 3], [3]).unwrap();
    let si = both(|a, b| a + b, &i, &ones_i);
    assert_eq!(si.to_vec::<i16>().unwrap(), [i16::MIN, i16::MIN + 1, -6]);
    let su = both(|a, b| a + b, &u, &ones_u);
    assert_eq!(su.to_vec::<u16>().unwrap(), [0, (1 << 15) + 1, 3]);
    // i16 with u16 meets in i32, so nothing wraps.
    let mixed = both(|a, b| a + b, &i, &u);
    assert_eq!(mixed.dtype(), DType::I32);
    assert_eq!(
        mixed.to_vec::<i32>().unwrap(),
        [
            i16::MAX as i32 + u16::MAX as i32,
            i16::MIN as i32 + (1 << 15),
            -5
        ]
    );
    // u8 with i8 meets in i16.
    let a = Tensor::from_vec(vec![200u8], [1]).unwrap();
    let b = Tensor::from_vec(vec![-100i8], [1]).unwrap();
    let s = both(|a, b| a + b, &a, &b);
    assert_eq!(
        (s.dtype(), s.to_vec::<i16>().unwrap()),
        (DType::I16, vec![100])
    );
    // u64 with a signed type has no integer join: f64, as NumPy and JAX give.
    let s = both(
        |a, b| a + b,
        &u64s(&[1 << 63]),
        &Tensor::from_vec(vec![-1i32], [1]).unwrap(),
    );
    assert_eq!(
        (s.dtype(), s.to_vec::<f64>().unwrap()),
        (DType::F64, vec![(1u64 << 63) as f64 - 1.0])
    );
}

#[test]
fn f16_bits_are_i16_and_u16() {
    let h = Tensor::from_vec(
        vec![half::f16::from_f32(1.0), half::f16::from_f32(-2.0)],
        [2],
    )
    .unwrap();
    let bits = both(|a, _| a.bitcast(DType::U16), &h, &h);
    assert_eq!(bits.to_vec::<u16>().unwrap(), [0x3C00, 0xC000]);
    let signed = both(|a, _| a.bitcast(DType::I16), &h, &h);
    assert_eq!(signed.to_vec::<i16>().unwrap(), [0x3C00, -0x4000]);
}

#[test]
fn a_bitcast_between_widths_is_an_error_naming_the_line() {
    let h = Tensor::from_vec(vec![half::f16::from_f32(1.0)], [1]).unwrap();
    let line = line!() + 1;
    let e = h.bitcast(DType::F32).to_literal().unwrap_err().to_string();
    assert!(
        e.contains("bitcast") && e.contains("f16 as f32") && e.contains(&format!(":{line}")),
        "{e}"
    );
}
