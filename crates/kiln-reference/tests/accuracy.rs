//! The one comparison of backend results with the reference (`kiln_reference::accuracy`):
//! planted bugs that the old relative tolerance let through are caught, and honest rounding
//! differences of inexact ops pass.

use kiln_ir::{DType, Literal, TensorType, parse_func_text};
use kiln_reference::accuracy::{check_outputs, output_bounds};

/// The comparison the CPU backend's random-program test used before: a relative tolerance per
/// dtype scaled by the largest finite value of the whole tensor (so an infinite reference
/// accepts any non-NaN value), kept here only to show what it let through.
fn old_close(a: &Literal, e: &Literal) -> bool {
    let rtol = match e.dtype() {
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        DType::F32 => 1e-4,
        DType::F64 => 1e-9,
        _ => 0.0,
    };
    let (av, ev) = (a.to_f64s(), e.to_f64s());
    let scale = ev
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    av.iter().zip(&ev).all(|(x, y)| {
        (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= rtol * (scale + y.abs())
    })
}

fn bf16s(v: &[f64]) -> Literal {
    Literal::from_f64s(TensorType::new(DType::BF16, [v.len()]), v).unwrap()
}

/// A bf16 conversion that rounds one element to the wrong neighbour (one ulp off): an exact op,
/// so the new comparison refuses it; the old one accepted it.
#[test]
fn a_one_ulp_rounding_bug_in_a_bf16_convert_is_caught() {
    let f = parse_func_text(
        "func @main(%0: f32[4]) -> bf16[4] {\n  %1 = convert %0 : bf16[4]\n  return %1\n}\n",
    )
    .unwrap();
    assert!(output_bounds(&f)[0].exact());
    // 1 + 2^-8 + 2^-10 rounds up to 1 + 2^-7 in bf16 (8 bits of precision).
    let x = Literal::from_f64s(
        TensorType::new(DType::F32, [4]),
        &[1.0 + 2f64.powi(-8) + 2f64.powi(-10), 3.0, -0.5, 100.0],
    )
    .unwrap();
    let right = bf16s(&[1.0 + 2f64.powi(-7), 3.0, -0.5, 100.0]);
    let wrong = bf16s(&[1.0, 3.0, -0.5, 100.0]);
    assert_eq!(
        kiln_reference::eval(&f, std::slice::from_ref(&x)).unwrap()[0],
        right
    );
    check_outputs(&f, std::slice::from_ref(&x), std::slice::from_ref(&right)).unwrap();
    let err =
        check_outputs(&f, std::slice::from_ref(&x), std::slice::from_ref(&wrong)).unwrap_err();
    assert!(err.contains("element 0"), "{err}");
    assert!(old_close(&wrong, &right), "the old tolerance accepted it");
}

/// An infinity of the wrong sign: refused now; the old comparison accepted it because the
/// difference (inf) is within "rtol * (scale + inf)".
#[test]
fn an_infinity_of_the_wrong_sign_is_caught() {
    let f = parse_func_text(
        "func @main(%0: f32[3], %1: f32[3]) -> f32[3] {\n  %2 = divide %0, %1 : f32[3]\n  return %2\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::F32, [3]);
    let a = Literal::from_f64s(t.clone(), &[1.0, 2.0, -3.0]).unwrap();
    let b = Literal::from_f64s(t.clone(), &[0.0, 4.0, 2.0]).unwrap();
    let args = [a, b];
    let right = kiln_reference::eval(&f, &args).unwrap().remove(0);
    assert_eq!(right.to_f64s(), [f64::INFINITY, 0.5, -1.5]);
    let wrong = Literal::from_f64s(t.clone(), &[f64::NEG_INFINITY, 0.5, -1.5]).unwrap();
    check_outputs(&f, &args, std::slice::from_ref(&right)).unwrap();
    let err = check_outputs(&f, &args, std::slice::from_ref(&wrong)).unwrap_err();
    assert!(err.contains("element 0"), "{err}");
    assert!(old_close(&wrong, &right), "the old tolerance accepted it");
    // A finite value for an infinite reference is refused too.
    let finite = Literal::from_f64s(t, &[f32::MAX as f64, 0.5, -1.5]).unwrap();
    assert!(check_outputs(&f, &args, &[finite]).is_err());
}

/// Inexact ops are held to their ulp bounds: exp within a few ulps passes, 100 ulps off does
/// not (the old tolerance allowed ~800 ulps at 1.0 in f32 and far more beside a large element).
#[test]
fn transcendental_results_are_held_to_ulps() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = exponential %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::F32, [2]);
    let x = [Literal::from_f64s(t.clone(), &[0.5, 10.0]).unwrap()];
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0);
    let w = want.as_f32s().unwrap().to_vec();
    let near = Literal::f32([2], vec![f32::from_bits(w[0].to_bits() + 2), w[1]]).unwrap();
    check_outputs(&f, &x, &[near]).unwrap();
    let far = Literal::f32([2], vec![f32::from_bits(w[0].to_bits() + 100), w[1]]).unwrap();
    assert!(check_outputs(&f, &x, std::slice::from_ref(&far)).is_err());
    assert!(old_close(&far, &want));
}

/// f64's spacing reaches its subnormals (it was 0 below 2^-971, so that a result one
/// subnormal step from the reference's failed as infinitely many ulps off: random program
/// 28307, `erf` of 4 x 2^-1074, whose libm value is 0.51 ulp off and kiln's 0.49), and an `erf`
/// a step off there passes while one 100 steps off does not.
#[test]
fn f64_subnormal_results_are_held_to_ulps() {
    use kiln_reference::accuracy::ulp;
    let tiny = f64::from_bits(1);
    for x in [0.0, tiny, 2e-323, f64::MIN_POSITIVE / 2.0] {
        assert_eq!(ulp(DType::F64, x), tiny, "at {x:e}");
    }
    assert_eq!(ulp(DType::F64, f64::MIN_POSITIVE), tiny);
    assert_eq!(ulp(DType::F64, 2f64.powi(-960)), 2f64.powi(-1012));
    assert_eq!(ulp(DType::F64, 1.0), f64::EPSILON);
    assert_eq!(ulp(DType::F32, 0.0), f32::from_bits(1) as f64);
    let f = parse_func_text(
        "func @main(%0: f64[1]) -> f64[1] {\n  %1 = erf %0 : f64[1]\n  return %1\n}\n",
    )
    .unwrap();
    let x = [Literal::f64([1], vec![f64::from_bits(4)]).unwrap()];
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0).to_f64s()[0];
    let step = |n: u64| Literal::f64([1], vec![f64::from_bits(want.to_bits() + n)]).unwrap();
    check_outputs(&f, &x, &[step(1)]).unwrap();
    assert!(check_outputs(&f, &x, &[step(100)]).is_err());
}

/// A sum is held to the summation bound relative to Σ|terms| (`ir-specs/ops/reduce.md`): a
/// cancelling sum may be off by a few ulps of its terms, not of its tiny result.
#[test]
fn sums_are_bounded_by_the_sum_of_absolute_terms() {
    let f = parse_func_text(
        "func @main(%0: f32[3]) -> f32[] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]\n  return %2\n}\n",
    )
    .unwrap();
    let x = [Literal::f32([3], vec![1e8, 1.0, -1e8]).unwrap()];
    // The reference sums exactly: 1. A left-to-right f32 sum gives 0.
    assert_eq!(kiln_reference::eval(&f, &x).unwrap()[0].to_f64s(), [1.0]);
    check_outputs(&f, &x, &[Literal::f32([], vec![0.0]).unwrap()]).unwrap();
    // Off by far more than K ε Σ|x|: refused.
    assert!(check_outputs(&f, &x, &[Literal::f32([], vec![1e6]).unwrap()]).is_err());
}

/// The bits of an inexact float that are only moved (here broadcast, with another user of the
/// bits beside) are compared as the float: two ulps off passes, a hundred do not. Found by the
/// random programs (seeds 8072 and 9871: a broadcast was not followed, and a second user of
/// the bits made the float program ill-typed).
#[test]
fn moved_bits_of_inexact_floats_are_compared_as_floats() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> (u32[3,2], u32[2]) {\n  %1 = exponential %0 : f32[2]\n  %2 = bitcast_convert %1 : u32[2]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : u32[3,2]\n  %4 = add %2, %2 : u32[2]\n  return %3, %4\n}\n",
    )
    .unwrap();
    let x = [Literal::f32([2], vec![0.5, 10.0]).unwrap()];
    let want = kiln_reference::eval(&f, &x).unwrap();
    let bits = want[0].to_i64s();
    let off = |d: i64| {
        let v: Vec<i64> = bits.iter().map(|b| b + d).collect();
        Literal::from_i64s(want[0].ty().clone(), &v).unwrap()
    };
    let sum = |d: i64| {
        let v: Vec<i64> = bits[..2].iter().map(|b| 2 * (b + d)).collect();
        Literal::from_i64s(want[1].ty().clone(), &v).unwrap()
    };
    check_outputs(&f, &x, &[off(2), sum(2)]).unwrap();
    let e = check_outputs(&f, &x, &[off(100), sum(2)]).unwrap_err();
    assert!(e.starts_with("output 0 (the bits of a f32[3,2])"), "{e}");
}

/// Integer arithmetic on the bits of an inexact float has no bound (a float one ulp off is an
/// integer one off, and an add of it anything): such outputs are checked by type only, and
/// counted as unbounded. The bits of an exact float stay compared exactly. Found by the random
/// programs (seed 3211: a scatter adding the bits of a logistic).
#[test]
fn integer_arithmetic_on_bits_of_inexact_floats_is_unbounded() {
    let src = |op: &str| {
        format!(
            "func @main(%0: f32[2]) -> u32[2] {{\n  %1 = {op} %0 : f32[2]\n  %2 = bitcast_convert %1 : u32[2]\n  %3 = add %2, %2 : u32[2]\n  return %3\n}}\n"
        )
    };
    let x = [Literal::f32([2], vec![0.5, 10.0]).unwrap()];
    let f = parse_func_text(&src("exponential")).unwrap();
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0);
    let v: Vec<i64> = want.to_i64s().iter().map(|b| b + 2).collect();
    let got = Literal::from_i64s(want.ty().clone(), &v).unwrap();
    let s = check_outputs(&f, &x, std::slice::from_ref(&got)).unwrap();
    assert_eq!((s.elements, s.unbounded), (2, 2));
    let g = parse_func_text(&src("negate")).unwrap();
    let want = kiln_reference::eval(&g, &x).unwrap().remove(0);
    let v: Vec<i64> = want.to_i64s().iter().map(|b| b + 2).collect();
    let got = Literal::from_i64s(want.ty().clone(), &v).unwrap();
    assert!(check_outputs(&g, &x, &[got]).is_err());
}

/// The bits of an exact float are compared bit for bit, except that a NaN matches any NaN: no
/// op defines a NaN's sign or payload (the reference's are canonical; the CPU backend's
/// `maximum` passed an operand's on). A zero of the other sign, or another value, fails.
/// Found by the random programs (seeds 37606 and 39919: a clamp and a maximum of NaNs with
/// payloads, bitcast to integers).
#[test]
fn bits_of_nans_match_any_nan() {
    let f = parse_func_text(
        "func @main(%0: f64[3]) -> i64[3] {\n  %1 = maximum %0, %0 : f64[3]\n  %2 = bitcast_convert %1 : i64[3]\n  return %2\n}\n",
    )
    .unwrap();
    let x = [Literal::f64([3], vec![f64::from_bits(0xffff_ffff_ffff_fffa), 0.0, 2.5]).unwrap()];
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0);
    let bits = want.to_i64s();
    let with = |i: usize, b: i64| {
        let mut v = bits.clone();
        v[i] = b;
        Literal::from_i64s(want.ty().clone(), &v).unwrap()
    };
    check_outputs(&f, &x, &[with(0, -6)]).unwrap();
    let e = check_outputs(&f, &x, &[with(1, i64::MIN)]).unwrap_err();
    assert!(
        e.starts_with("output 0 (the bits of a f64[3]): element 1"),
        "{e}"
    );
    assert!(check_outputs(&f, &x, &[with(2, bits[2] + 1)]).is_err());
}

/// The bits of an inexact complex number that are only moved (a `c64` product bitcast to
/// `i64`, then reversed) are compared as the number, under the product's bound: its real part
/// one ulp off (one apart in the integer) passes, a thousand ulps off does not, nor does the
/// conjugate. Found by the complex split test (seed 8345, which compared the integers exactly).
#[test]
fn moved_bits_of_inexact_complex_numbers_are_compared_as_complex_numbers() {
    let f = parse_func_text(
        "func @main(%0: c64[1,4]) -> i64[1,4] {\n  %1 = multiply %0, %0 : c64[1,4]\n  %2 = bitcast_convert %1 : i64[1,4]\n  %3 = reverse %2 {dimensions = [1]} : i64[1,4]\n  return %3\n}\n",
    )
    .unwrap();
    let z = [[1.5, -0.25], [0.1, 3.0], [-7.0, 0.3], [2.0, 2.0]];
    let x = [Literal::from_complex_f64s(TensorType::new(DType::C64, [1, 4]), &z).unwrap()];
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0);
    // An i64 element holds the real part's bits in its low word, the imaginary part's above.
    let bits = want.to_i64s();
    let with = |i: usize, b: i64| {
        let mut v = bits.clone();
        v[i] = b;
        Literal::from_i64s(want.ty().clone(), &v).unwrap()
    };
    check_outputs(&f, &x, &[with(2, bits[2] + 1)]).unwrap();
    let e = check_outputs(&f, &x, &[with(2, bits[2] + 1000)]).unwrap_err();
    assert!(
        e.starts_with("output 0 (the bits of a c64[1,4]): element 2"),
        "{e}"
    );
    let conjugate = bits[1] ^ i64::MIN;
    assert!(check_outputs(&f, &x, &[with(1, conjugate)]).is_err());
}

/// The same through a bitcast to another float type of the width: an f16 NaN's bits read as
/// bf16 are a number (0xFE00 is -2^125), and its sign is still the NaN's own (seed 44202: a
/// clamp passed a NaN operand's sign on, the reference's is canonical). Another number fails.
#[test]
fn bits_of_nans_as_another_float_type_match_any_nan() {
    let f = parse_func_text(
        "func @main(%0: f16[2]) -> bf16[2] {\n  %1 = maximum %0, %0 : f16[2]\n  %2 = bitcast_convert %1 : bf16[2]\n  return %2\n}\n",
    )
    .unwrap();
    let x = [
        Literal::from_le_bytes(TensorType::new(DType::F16, [2]), &[0x00, 0xfe, 0x00, 0x3c])
            .unwrap(),
    ];
    let want = kiln_reference::eval(&f, &x).unwrap().remove(0);
    let as_bits = |b: [u8; 4]| Literal::from_le_bytes(want.ty().clone(), &b).unwrap();
    let mut b = want.to_le_bytes();
    b[1] ^= 0x80;
    check_outputs(&f, &x, &[as_bits([b[0], b[1], b[2], b[3]])]).unwrap();
    let e = check_outputs(&f, &x, &[as_bits([b[0], b[1], b[2], b[3] ^ 0x80])]).unwrap_err();
    assert!(
        e.starts_with("output 0 (the bits of a f16[2]): element 1"),
        "{e}"
    );
    // Computed on as bf16 (the seed's dot product), the NaN's sign is the sum's: by class.
    let g = parse_func_text(
        "func @main(%0: f16[2]) -> bf16[2] {\n  %1 = maximum %0, %0 : f16[2]\n  %2 = bitcast_convert %1 : bf16[2]\n  %3 = add %2, %2 : bf16[2]\n  return %3\n}\n",
    )
    .unwrap();
    let mut b = kiln_reference::eval(&g, &x)
        .unwrap()
        .remove(0)
        .to_le_bytes();
    b[1] ^= 0x80;
    check_outputs(&g, &x, &[as_bits([b[0], b[1], b[2], b[3]])]).unwrap();
}

/// A power's bound follows its condition numbers where an operand is inexact: `x^(exp(y))`
/// with the exponent a few ulps off moves the result by `|ln x|` times that (seed 12754's
/// failure: the convolution's rounding grown through `power`), and the comparison accepts it;
/// a power of exact operands keeps the bound of its own rounding (4 ulps and the magnitude's
/// share), and 40 ulps off is refused.
#[test]
fn powers_are_bounded_through_their_condition_numbers() {
    let f = parse_func_text(
        "func @main(%0: f32[1], %1: f32[1]) -> (f32[1], f32[1]) {\n  %2 = exponential %1 : f32[1]\n  %3 = power %0, %2 : f32[1]\n  %4 = power %0, %1 : f32[1]\n  return %3, %4\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::F32, [1]);
    let x = Literal::from_f64s(t.clone(), &[1.0e4]).unwrap();
    let y = Literal::from_f64s(t.clone(), &[2.0]).unwrap();
    let args = [x, y];
    let want = kiln_reference::eval(&f, &args).unwrap();
    let w: Vec<f64> = want.iter().map(|l| l.to_f64s()[0]).collect();
    // exp(2) = 7.389, one f32 ulp of it 4.8e-7 (relative 6.5e-8); |ln 1e4| = 9.2: four ulps of
    // the exponent move the power by 4 * 6.5e-8 * 7.389 * 9.2 = 1.8e-5 relative, about 150
    // ulps of the result.
    let ulp = |v: f64| {
        let b = (v as f32).to_bits();
        f64::from(f32::from_bits(b + 1)) - v
    };
    let off = |v: f64, n: f64| Literal::from_f64s(t.clone(), &[v + n * ulp(v)]).unwrap();
    check_outputs(&f, &args, &[off(w[0], 150.0), want[1].clone()]).unwrap();
    let e = check_outputs(&f, &args, &[want[0].clone(), off(w[1], 40.0)]).unwrap_err();
    assert!(e.contains("output 1"), "{e}");
}

fn c64s(v: &[[f64; 2]]) -> Literal {
    Literal::from_complex_f64s(TensorType::new(DType::C64, [v.len()]), v).unwrap()
}

/// Complex results are compared part by part as floats: an imaginary part one ulp off in an
/// exact op is caught (compared as integers, the parts' whole numbers hid it), and so is a
/// sign error in a product's imaginary part.
#[test]
fn complex_results_are_compared_as_floats() {
    let add = parse_func_text(
        "func @main(%0: c64[2], %1: c64[2]) -> c64[2] {\n  %2 = add %0, %1 : c64[2]\n  return %2\n}\n",
    )
    .unwrap();
    assert!(output_bounds(&add)[0].exact());
    let (x, y) = (
        c64s(&[[1.5, 0.25], [3.0, -2.0]]),
        c64s(&[[0.5, 0.5], [1.0, 1.0]]),
    );
    let args = [x.clone(), y.clone()];
    let right = kiln_reference::eval(&add, &args).unwrap().remove(0);
    check_outputs(&add, &args, std::slice::from_ref(&right)).unwrap();
    let off = c64s(&[[2.0, 0.75 + 2f64.powi(-24)], [4.0, -1.0]]);
    let err = check_outputs(&add, &args, &[off]).unwrap_err();
    assert!(
        err.contains("element 0") && err.contains("imaginary"),
        "{err}"
    );

    let mul = parse_func_text(
        "func @main(%0: c64[2], %1: c64[2]) -> c64[2] {\n  %2 = multiply %0, %1 : c64[2]\n  return %2\n}\n",
    )
    .unwrap();
    let right = kiln_reference::eval(&mul, &args).unwrap().remove(0);
    let conj: Vec<[f64; 2]> = right
        .to_complex_f64s()
        .iter()
        .map(|z| [z[0], -z[1]])
        .collect();
    let err = check_outputs(&mul, &args, &[c64s(&conj)]).unwrap_err();
    assert!(err.contains("imaginary"), "{err}");
}

/// A complex product computed on its parts in f32 steps, (ac - bd) + i(ad + bc), errs from the
/// reference's once-rounded result by a few ulps of the product's modulus: it passes, even where
/// the real part cancels to almost nothing; ten times the modulus' ulps do not.
#[test]
fn complex_products_on_parts_pass_under_a_norm_wise_bound() {
    let f = parse_func_text(
        "func @main(%0: c64[3], %1: c64[3]) -> c64[3] {\n  %2 = multiply %0, %1 : c64[3]\n  return %2\n}\n",
    )
    .unwrap();
    let x = c64s(&[[1.1, 2.3], [1e3, 1.0 / 3.0], [0.1, 0.7]]);
    let y = c64s(&[[2.3, 1.1], [1e-3, 3.0], [7.0, -1.0]]);
    let parts = |l: &Literal| -> Vec<[f32; 2]> {
        l.to_complex_f64s()
            .iter()
            .map(|z| [z[0] as f32, z[1] as f32])
            .collect()
    };
    let on_parts: Vec<[f64; 2]> = parts(&x)
        .iter()
        .zip(parts(&y))
        .map(|([a, b], [c, d])| [(a * c - b * d) as f64, (a * d + b * c) as f64])
        .collect();
    let args = [x, y];
    check_outputs(&f, &args, &[c64s(&on_parts)]).unwrap();
    let want = kiln_reference::eval(&f, &args).unwrap().remove(0);
    let far: Vec<[f64; 2]> = want
        .to_complex_f64s()
        .iter()
        .map(|z| [z[0] + 10.0 * 2f64.powi(-23) * z[0].hypot(z[1]) * 4.0, z[1]])
        .collect();
    assert!(check_outputs(&f, &args, &[c64s(&far)]).is_err());
}

/// Attention, `softmax(q kᵀ / 8) v` with a head of 64: its scores have magnitudes of a few
/// hundred, and an exponential's magnitude taken as `exp M` (as before) was beyond any float,
/// which left every output unchecked. Carried through the derivative (`exp x · M`), the bound
/// stays near the outputs' size: an f32 computation in another order passes, a result 0.01
/// off in one element does not.
#[test]
fn attention_outputs_are_bounded_through_the_softmax() {
    let (n, d) = (8usize, 64usize);
    let f = parse_func_text(&format!(
        "func @main(%0: f32[{n},{d}], %1: f32[{n},{d}], %2: f32[{n},{d}]) -> f32[{n},{d}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]}} : f32[{n},{n}]
  %4 = constant {{value = 0.125}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : f32[{n},{n}]
  %6 = multiply %3, %5 : f32[{n},{n}]
  %7 = constant {{value = -inf}} : f32[]
  %8 = reduce %6, %7 {{dimensions = [1], kind = max}} : f32[{n}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0]}} : f32[{n},{n}]
  %10 = subtract %6, %9 : f32[{n},{n}]
  %11 = exponential %10 : f32[{n},{n}]
  %12 = constant {{value = 0.0}} : f32[]
  %13 = reduce %11, %12 {{dimensions = [1], kind = add}} : f32[{n}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0]}} : f32[{n},{n}]
  %15 = divide %11, %14 : f32[{n},{n}]
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{n},{d}]
  return %16
}}
"
    ))
    .unwrap();
    let qkv = draws(12345, 3 * n * d);
    let (q, k, v) = (&qkv[..n * d], &qkv[n * d..2 * n * d], &qkv[2 * n * d..]);
    let lit = |x: &[f32]| f32s(&[n, d], x);
    let args = [lit(q), lit(k), lit(v)];
    // The same attention in f32, every sum from the last term to the first.
    let mut out = vec![0f32; n * d];
    for i in 0..n {
        let s: Vec<f32> = (0..n)
            .map(|j| {
                (0..d)
                    .rev()
                    .map(|c| q[i * d + c] * k[j * d + c])
                    .sum::<f32>()
                    * 0.125
            })
            .collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
        let l: f32 = e.iter().rev().sum();
        for c in 0..d {
            out[i * d + c] = (0..n).rev().map(|j| e[j] / l * v[j * d + c]).sum();
        }
    }
    check_outputs(&f, &args, &[lit(&out)]).unwrap();
    let mut off = out.clone();
    off[3 * d + 5] += 1e-2;
    let e = check_outputs(&f, &args, &[lit(&off)]).unwrap_err();
    assert!(e.contains("output 0"), "{e}");
}

/// Values in [-2, 2] from a fixed linear congruential sequence, rounded to f32.
fn draws(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f64 / (1u64 << 24) as f64 * 4.0 - 2.0) as f32
        })
        .collect()
}

fn f32s(shape: &[usize], x: &[f32]) -> Literal {
    Literal::from_f64s(
        TensorType::new(DType::F32, shape.to_vec()),
        &x.iter().map(|&e| f64::from(e)).collect::<Vec<_>>(),
    )
    .unwrap()
}

/// Causal attention: the scores above the diagonal are replaced by `-inf` (`select`) before the
/// row's maximum and the exponential. The mask's infinities made the maximum's magnitude
/// infinite, so every output was checked by class only; a maximum's operand at an infinity now
/// bounds only a result that is that infinity, and the exponential of `-inf` carries no error.
/// An f32 computation in another order passes, one element 0.01 off does not (the old rule let
/// both through).
#[test]
fn causal_attention_outputs_are_bounded_through_the_mask() {
    let (n, d) = (8usize, 64usize);
    let f = parse_func_text(&format!(
        "func @main(%0: f32[{n},{d}], %1: f32[{n},{d}], %2: f32[{n},{d}]) -> f32[{n},{d}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]}} : f32[{n},{n}]
  %4 = constant {{value = 0.125}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : f32[{n},{n}]
  %6 = multiply %3, %5 : f32[{n},{n}]
  %20 = iota {{iota_dimension = 0}} : i32[{n},{n}]
  %21 = iota {{iota_dimension = 1}} : i32[{n},{n}]
  %22 = compare %21, %20 {{comparison_direction = LE}} : pred[{n},{n}]
  %7 = constant {{value = -inf}} : f32[]
  %23 = broadcast_in_dim %7 {{broadcast_dimensions = []}} : f32[{n},{n}]
  %24 = select %22, %6, %23 : f32[{n},{n}]
  %8 = reduce %24, %7 {{dimensions = [1], kind = max}} : f32[{n}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0]}} : f32[{n},{n}]
  %10 = subtract %24, %9 : f32[{n},{n}]
  %11 = exponential %10 : f32[{n},{n}]
  %12 = constant {{value = 0.0}} : f32[]
  %13 = reduce %11, %12 {{dimensions = [1], kind = add}} : f32[{n}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0]}} : f32[{n},{n}]
  %15 = divide %11, %14 : f32[{n},{n}]
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{n},{d}]
  return %16
}}
"
    ))
    .unwrap();
    let (q, k, v) = (draws(7, n * d), draws(8, n * d), draws(9, n * d));
    let args = [f32s(&[n, d], &q), f32s(&[n, d], &k), f32s(&[n, d], &v)];
    // The same attention in f32, every sum from the last term to the first, the masked
    // scores' exponentials 0.
    let mut out = vec![0f32; n * d];
    for i in 0..n {
        let s: Vec<f32> = (0..n)
            .map(|j| {
                if j > i {
                    return f32::NEG_INFINITY;
                }
                (0..d)
                    .rev()
                    .map(|c| q[i * d + c] * k[j * d + c])
                    .sum::<f32>()
                    * 0.125
            })
            .collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
        let l: f32 = e.iter().rev().sum();
        for c in 0..d {
            out[i * d + c] = (0..n).rev().map(|j| e[j] / l * v[j * d + c]).sum();
        }
    }
    let s = check_outputs(&f, &args, &[f32s(&[n, d], &out)]).unwrap();
    assert_eq!((s.elements, s.unbounded), (n * d, 0));
    let mut off = out.clone();
    off[3 * d + 5] += 1e-2;
    let e = check_outputs(&f, &args, &[f32s(&[n, d], &off)]).unwrap_err();
    assert!(e.contains("element"), "{e}");
}

/// Layer norm, `(x - mean) · rsqrt(var + 1e-5)` over rows of 64: bounded (the variance's
/// magnitude carried through the root's derivative), an f32 computation in another order
/// passes, one element 1e-3 off does not.
#[test]
fn layer_norm_outputs_are_bounded() {
    let (n, d) = (4usize, 64usize);
    let f = parse_func_text(&format!(
        "func @main(%0: f32[{n},{d}]) -> f32[{n},{d}] {{
  %1 = constant {{value = 0.0}} : f32[]
  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : f32[{n}]
  %3 = constant {{value = 0.015625}} : f32[]
  %4 = broadcast_in_dim %3 {{broadcast_dimensions = []}} : f32[{n}]
  %5 = multiply %2, %4 : f32[{n}]
  %6 = broadcast_in_dim %5 {{broadcast_dimensions = [0]}} : f32[{n},{d}]
  %7 = subtract %0, %6 : f32[{n},{d}]
  %8 = multiply %7, %7 : f32[{n},{d}]
  %9 = reduce %8, %1 {{dimensions = [1], kind = add}} : f32[{n}]
  %10 = multiply %9, %4 : f32[{n}]
  %11 = constant {{value = 1e-5}} : f32[]
  %12 = broadcast_in_dim %11 {{broadcast_dimensions = []}} : f32[{n}]
  %13 = add %10, %12 : f32[{n}]
  %14 = rsqrt %13 : f32[{n}]
  %15 = broadcast_in_dim %14 {{broadcast_dimensions = [0]}} : f32[{n},{d}]
  %16 = multiply %7, %15 : f32[{n},{d}]
  return %16
}}
"
    ))
    .unwrap();
    let x = draws(11, n * d);
    let args = [f32s(&[n, d], &x)];
    let mut out = vec![0f32; n * d];
    for i in 0..n {
        let row = &x[i * d..(i + 1) * d];
        let mean = row.iter().rev().sum::<f32>() * 0.015625;
        let var = row
            .iter()
            .rev()
            .map(|&v| (v - mean) * (v - mean))
            .sum::<f32>()
            * 0.015625;
        let r = 1.0 / (var + 1e-5).sqrt();
        for c in 0..d {
            out[i * d + c] = (row[c] - mean) * r;
        }
    }
    let s = check_outputs(&f, &args, std::slice::from_ref(&f32s(&[n, d], &out))).unwrap();
    assert_eq!((s.elements, s.unbounded), (n * d, 0));
    let mut off = out.clone();
    off[70] += 1e-3;
    assert!(check_outputs(&f, &args, &[f32s(&[n, d], &off)]).is_err());
}

/// `maximum(x, -inf)` and `clamp(-inf, x, +inf)` are `x`: their magnitude is `x`'s, not the
/// infinity's, so an exponential of them is bounded: one ulp off passes, 1000 do not (the old
/// rule left both unbounded). `cbrt` of an exact 0 keeps its own (zero) bound.
#[test]
fn maxima_with_infinite_operands_and_exact_roots_are_bounded() {
    let f = parse_func_text(
        "func @main(%0: f32[3]) -> (f32[3], f32[3], f32[3]) {
  %1 = exponential %0 : f32[3]
  %2 = constant {value = -inf} : f32[]
  %3 = broadcast_in_dim %2 {broadcast_dimensions = []} : f32[3]
  %4 = maximum %1, %3 : f32[3]
  %5 = constant {value = inf} : f32[]
  %6 = broadcast_in_dim %5 {broadcast_dimensions = []} : f32[3]
  %7 = clamp %3, %1, %6 : f32[3]
  %8 = subtract %0, %0 : f32[3]
  %9 = cbrt %8 : f32[3]
  %10 = add %9, %4 : f32[3]
  return %4, %7, %10
}
",
    )
    .unwrap();
    let x = f32s(&[3], &[0.5, -1.25, 2.0]);
    let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).unwrap();
    let nudge = |l: &Literal, ulps: f32| {
        let v: Vec<f32> = l
            .to_f64s()
            .iter()
            .map(|&e| (e as f32) * (1.0 + ulps * f32::EPSILON))
            .collect();
        f32s(&[3], &v)
    };
    let near: Vec<Literal> = want.iter().map(|l| nudge(l, 1.0)).collect();
    let s = check_outputs(&f, std::slice::from_ref(&x), &near).unwrap();
    assert_eq!((s.elements, s.unbounded), (9, 0));
    for k in 0..3 {
        let mut far = want.clone();
        far[k] = nudge(&want[k], 1000.0);
        let e = check_outputs(&f, std::slice::from_ref(&x), &far).unwrap_err();
        assert!(e.contains(&format!("output {k}")), "{e}");
    }
}

/// The sine, cosine and tangent of exact arguments are within their own ulps of the result:
/// the argument's size (1e5 here) no longer widens the bound, which let a result 1e-3 off
/// through. Rust's f32 functions pass.
#[test]
fn functions_of_exact_arguments_keep_their_own_bound() {
    let f = parse_func_text(
        "func @main(%0: f32[3]) -> (f32[3], f32[3], f32[3]) {
  %1 = sine %0 : f32[3]
  %2 = cosine %0 : f32[3]
  %3 = tanh %0 : f32[3]
  return %1, %2, %3
}
",
    )
    .unwrap();
    let xs = [1e5f32, -31415.5, 0.75];
    let x = f32s(&[3], &xs);
    let honest = [
        f32s(&[3], &xs.map(f32::sin)),
        f32s(&[3], &xs.map(f32::cos)),
        f32s(&[3], &xs.map(f32::tanh)),
    ];
    let s = check_outputs(&f, std::slice::from_ref(&x), &honest).unwrap();
    assert_eq!((s.elements, s.unbounded), (9, 0));
    for k in 0..3 {
        let mut far = honest.clone();
        let mut v: Vec<f32> = far[k].to_f64s().iter().map(|&e| e as f32).collect();
        v[0] += 1e-3;
        far[k] = f32s(&[3], &v);
        let e = check_outputs(&f, std::slice::from_ref(&x), &far).unwrap_err();
        assert!(e.contains(&format!("output {k}")), "{e}");
    }
}

/// The bits of an inexact float bitcast to `u32` and straight back to `f32` (an identity that
/// traced training steps contain, around a softmax's maximum) keep the float's bound: one ulp
/// off passes, 100 do not (the old rule checked them by class only).
#[test]
fn a_round_trip_of_float_bits_through_integers_keeps_the_bound() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {
  %1 = exponential %0 : f32[2]
  %2 = bitcast_convert %1 : u32[2]
  %3 = bitcast_convert %2 : f32[2]
  %4 = multiply %3, %3 : f32[2]
  return %4
}
",
    )
    .unwrap();
    assert!(output_bounds(&f)[0].ulps.is_finite());
    let x = f32s(&[2], &[0.5, -3.0]);
    let e: Vec<f32> = [0.5f32, -3.0].iter().map(|v| v.exp() * v.exp()).collect();
    let s = check_outputs(&f, std::slice::from_ref(&x), &[f32s(&[2], &e)]).unwrap();
    assert_eq!((s.elements, s.unbounded), (2, 0));
    let far = [e[0] * (1.0 + 100.0 * f32::EPSILON), e[1]];
    assert!(check_outputs(&f, std::slice::from_ref(&x), &[f32s(&[2], &far)]).is_err());
}

/// A `call` runs its callee once, as a branch taken: its results keep the callee's bound (a
/// softmax here) instead of being checked by class only, as a loop's are. An f32 softmax in
/// another order passes; 0.01 off in one element does not.
#[test]
fn results_of_calls_are_bounded_by_their_callee() {
    let f = parse_func_text(
        "func @main(%0: f32[2,4]) -> f32[2,4] {
  %1 = call %0 {callee = @softmax} : f32[2,4]
  return %1
}

func @softmax(%0: f32[2,4]) -> f32[2,4] {
  %1 = constant {value = -inf} : f32[]
  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[2]
  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[2,4]
  %4 = subtract %0, %3 : f32[2,4]
  %5 = exponential %4 : f32[2,4]
  %6 = constant {value = 0.0} : f32[]
  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[2]
  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[2,4]
  %9 = divide %5, %8 : f32[2,4]
  return %9
}
",
    )
    .unwrap();
    let x = [0.5f32, -1.25, 3.0, 2.0, -0.75, 0.125, 1.5, -2.5];
    let lit = |v: &[f32]| f32s(&[2, 4], v);
    let mut out = [0f32; 8];
    for r in 0..2 {
        let row = &x[4 * r..4 * r + 4];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|&v| (v - m).exp()).collect();
        let l: f32 = e.iter().rev().sum();
        for c in 0..4 {
            out[4 * r + c] = e[c] / l;
        }
    }
    let args = [lit(&x)];
    let s = check_outputs(&f, &args, &[lit(&out)]).unwrap();
    assert_eq!(s.unbounded, 0, "{s:?}");
    let mut off = out;
    off[6] += 0.01;
    let e = check_outputs(&f, &args, &[lit(&off)]).unwrap_err();
    assert!(e.contains("output 0"), "{e}");
}

/// An RNN's recurrence `h <- tanh(W h + x)` for `n` trips, on an `i32` counter and an
/// `f32[4]` carry.
fn recurrence(n: i32) -> kiln_ir::Func {
    parse_func_text(&format!(
        "func @main(%0: f32[4], %1: f32[4,4], %2: f32[4]) -> f32[4] {{
  %3 = constant {{value = 0}} : i32[]
  %4, %5, %6, %7 = while %3, %0, %1, %2 {{cond = func @cond(%0: i32[], %1: f32[4], %2: f32[4,4], %3: f32[4]) -> pred[] {{
      %4 = constant {{value = {n}}} : i32[]
      %5 = compare %0, %4 {{comparison_direction = LT}} : pred[]
      return %5
    }}, body = func @body(%0: i32[], %1: f32[4], %2: f32[4,4], %3: f32[4]) -> (i32[], f32[4], f32[4,4], f32[4]) {{
      %4 = constant {{value = 1}} : i32[]
      %5 = add %0, %4 : i32[]
      %6 = dot_general %2, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[4]
      %7 = add %6, %3 : f32[4]
      %8 = tanh %7 : f32[4]
      return %5, %8, %2, %3
    }}}} : i32[], f32[4], f32[4,4], f32[4]
  return %5
}}
"
    ))
    .unwrap()
}

#[test]
fn loops_with_exact_trip_counts_are_bounded_by_their_trips() {
    // Computed in f32 with the products summed in the other order and the C library's
    // `tanhf`: 100 trips drift from the reference's (sums in f64, tanh rounded once) by
    // several ulps, within 100 trips' bound.
    let n = 100;
    let f = recurrence(n);
    assert!(output_bounds(&f)[0].ulps.is_infinite(), "no trips known");
    let h0 = draws(1, 4);
    let w: Vec<f32> = draws(2, 16).iter().map(|v| v * 0.6).collect();
    let x = draws(3, 4);
    let mut h = h0.clone();
    for _ in 0..n {
        h = (0..4)
            .map(|i| {
                let s: f32 = (0..4).rev().map(|j| w[4 * i + j] * h[j]).sum();
                (s + x[i]).tanh()
            })
            .collect();
    }
    let args = [f32s(&[4], &h0), f32s(&[4, 4], &w), f32s(&[4], &x)];
    let want = kiln_reference::eval(&f, &args).unwrap()[0].to_f64s();
    assert!(
        h.iter().zip(&want).any(|(&a, &e)| a as f64 != e),
        "the f32 order differs from the reference's somewhere: {h:?} {want:?}"
    );
    let s = check_outputs(&f, &args, &[f32s(&[4], &h)]).unwrap();
    assert_eq!(s.unbounded, 0, "{s:?}");
    // A planted error of one part in 10^3 after the loop (one trip's tanh off by as much
    // would do that), past 100 trips' worst-case rounding.
    let mut off = h.clone();
    off[2] *= 1.001;
    let e = check_outputs(&f, &args, &[f32s(&[4], &off)]).unwrap_err();
    assert!(e.contains("element 2"), "{e}");
    // Without the trips (the bound it had before), anything finite passed.
    let mut wild = h.clone();
    wild[2] = -wild[2] * 3.0;
    assert!(check_outputs(&f, &args, &[f32s(&[4], &wild)]).is_err());
}

#[test]
fn loops_whose_trips_depend_on_inexact_carries_are_checked_by_class() {
    // `while x < 100: x = x * e^0.1`: a backend's x one ulp off may take one trip more or
    // less.
    let f = parse_func_text(
        "func @main(%0: f32[]) -> f32[] {
  %1 = while %0 {cond = func @cond(%0: f32[]) -> pred[] {
      %1 = constant {value = 100.0} : f32[]
      %2 = compare %0, %1 {comparison_direction = LT} : pred[]
      return %2
    }, body = func @body(%0: f32[]) -> f32[] {
      %1 = constant {value = 0.1} : f32[]
      %2 = exponential %1 : f32[]
      %3 = multiply %0, %2 : f32[]
      return %3
    }} : f32[]
  return %1
}
",
    )
    .unwrap();
    let args = [f32s(&[], &[1.0])];
    let want = kiln_reference::eval(&f, &args).unwrap();
    let s = check_outputs(&f, &args, &want).unwrap();
    assert_eq!(s.unbounded, 1, "{s:?}");
    let other = f32s(&[], &[want[0].to_f64s()[0] as f32 * 1.1]);
    assert!(check_outputs(&f, &args, &[other]).is_ok());
    assert!(check_outputs(&f, &args, &[f32s(&[], &[f32::NAN])]).is_err());
}

#[test]
fn results_of_maps_are_bounded_by_their_computation() {
    // `tanh(x) * y` element by element: a `map`'s results were checked by class only.
    let f = parse_func_text(
        "func @main(%0: f32[8], %1: f32[8]) -> f32[8] {
  %2 = map %0, %1 {dimensions = [0], computation = func @g(%0: f32[], %1: f32[]) -> f32[] {
      %2 = tanh %0 : f32[]
      %3 = multiply %2, %1 : f32[]
      return %3
    }} : f32[8]
  return %2
}
",
    )
    .unwrap();
    let (x, y) = (draws(4, 8), draws(5, 8));
    let got: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a.tanh() * b).collect();
    let args = [f32s(&[8], &x), f32s(&[8], &y)];
    let s = check_outputs(&f, &args, &[f32s(&[8], &got)]).unwrap();
    assert_eq!(s.unbounded, 0, "{s:?}");
    let mut off = got.clone();
    off[5] *= 1.001;
    let e = check_outputs(&f, &args, &[f32s(&[8], &off)]).unwrap_err();
    assert!(e.contains("element 5"), "{e}");
}

#[test]
fn sorted_values_keep_their_magnitudes() {
    // `exp(x) - exp(y)` (a cancellation, magnitude exp(x) + exp(y)) sorted by exact integer
    // keys: an f32 computation of the exponentials is a few ulps of exp(x) off, many ulps of
    // the small difference. The sorted result's magnitude was its own size, so that honest
    // result failed; now it passes, and a planted error still fails.
    let f = parse_func_text(
        "func @main(%0: i32[6], %1: f32[6], %2: f32[6]) -> f32[6] {
  %3 = exponential %1 : f32[6]
  %4 = exponential %2 : f32[6]
  %5 = subtract %3, %4 : f32[6]
  %6, %7 = sort %0, %5 {dimension = 0, is_stable = true, comparator = func @lt(%0: i32[], %1: i32[], %2: f32[], %3: f32[]) -> pred[] {
      %4 = compare %0, %1 {comparison_direction = LT} : pred[]
      return %4
    }} : i32[6], f32[6]
  return %7
}
",
    )
    .unwrap();
    let keys = [5i32, 0, 3, 1, 4, 2];
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let y: Vec<f32> = x.iter().map(|v| v + 1e-4).collect();
    // exp rounded to f32 and then nudged by one ulp: within exp's own bound.
    let nudge = |v: f32| f32::from_bits(v.to_bits() + 1);
    let mut got = [0f32; 6];
    for (i, &k) in keys.iter().enumerate() {
        got[k as usize] = nudge(x[i].exp()) - y[i].exp();
    }
    let args = [
        Literal::from_i64s(TensorType::new(DType::I32, [6]), &keys.map(i64::from)).unwrap(),
        f32s(&[6], &x),
        f32s(&[6], &y),
    ];
    let s = check_outputs(&f, &args, &[f32s(&[6], &got)]).unwrap();
    assert_eq!(s.unbounded, 0, "{s:?}");
    let mut off = got;
    off[3] *= 1.5;
    let e = check_outputs(&f, &args, &[f32s(&[6], &off)]).unwrap_err();
    assert!(e.contains("element 3"), "{e}");
}

/// An infinite element of a sum whose finite terms pass f32's range (seed 129799: a bf16
/// convolution beside an input's `-inf`): a backend's partial sums may overflow to `+inf` and
/// meet the `-inf` (NaN), which a maximum after it passes on, so that maximum is not compared.
/// Where the finite terms are small, the infinity is every backend's, the maximum does not
/// select it, and a NaN there is refused.
#[test]
fn a_maximum_after_a_sum_that_may_meet_both_infinities_is_not_compared() {
    let f = parse_func_text(
        "func @main(%0: f32[2,3], %1: f32[3]) -> f32[] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[2]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = max} : f32[]\n  return %4\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::F32, [2, 3]);
    let v = Literal::from_f64s(TensorType::new(DType::F32, [3]), &[2.0, 2.0, 1.0]).unwrap();
    let nan = Literal::from_f64s(TensorType::new(DType::F32, []), &[f64::NAN]).unwrap();
    let rows = |first: [f64; 3]| {
        let a = Literal::from_f64s(t.clone(), &[first, [1.0, 2.0, 3.0]].concat()).unwrap();
        [a, v.clone()]
    };
    // 3e38 · 2 overflows f32: the first row is -inf on the reference, NaN on such a backend.
    let big = rows([3e38, 3e38, f64::NEG_INFINITY]);
    assert_eq!(kiln_reference::eval(&f, &big).unwrap()[0].to_f64s(), [9.0]);
    check_outputs(&f, &big, std::slice::from_ref(&nan)).unwrap();
    let small = rows([1.0, 2.0, f64::NEG_INFINITY]);
    assert!(check_outputs(&f, &small, std::slice::from_ref(&nan)).is_err());
    let nine = Literal::from_f64s(TensorType::new(DType::F32, []), &[9.0]).unwrap();
    check_outputs(&f, &small, &[nine]).unwrap();
}

/// Infinities every backend has keep a maximum or minimum over them as tight as over finite
/// values, and a wrong finite result is refused: `ln 0` of an exact 0, and an f16 sum past
/// 65504 whose terms stay in f32's range (a backend's may round to 65504, never to NaN). (A
/// guard against loosening: two earlier versions of the NaN rule above let these through.)
#[test]
fn maxima_over_infinities_every_backend_has_stay_bounded() {
    let scalar = |d: DType, v: f64| Literal::from_f64s(TensorType::new(d, []), &[v]).unwrap();
    let f = parse_func_text(
        "func @main(%0: f32[3]) -> f32[] {\n  %1 = log %0 : f32[3]\n  %2 = constant {value = -inf} : f32[]\n  %3 = reduce %1, %2 {dimensions = [0], kind = max} : f32[]\n  return %3\n}\n",
    )
    .unwrap();
    let x = Literal::from_f64s(TensorType::new(DType::F32, [3]), &[0.0, 1.0, 2.0]).unwrap();
    let args = [x];
    check_outputs(&f, &args, &[scalar(DType::F32, 2f64.ln())]).unwrap();
    assert!(check_outputs(&f, &args, &[scalar(DType::F32, 0.7)]).is_err());
    let f = parse_func_text(
        "func @main(%0: f16[2], %1: f16[]) -> f16[] {\n  %2 = constant {value = 0.0} : f16[]\n  %3 = reduce %0, %2 {dimensions = [0], kind = add} : f16[]\n  %4 = minimum %3, %1 : f16[]\n  return %4\n}\n",
    )
    .unwrap();
    let x = Literal::from_f64s(TensorType::new(DType::F16, [2]), &[60000.0, 10000.0]).unwrap();
    let args = [x, scalar(DType::F16, 1.0)];
    assert_eq!(kiln_reference::eval(&f, &args).unwrap()[0].to_f64s(), [1.0]);
    check_outputs(&f, &args, &[scalar(DType::F16, 1.0)]).unwrap();
    assert!(check_outputs(&f, &args, &[scalar(DType::F16, 5.0)]).is_err());
}

/// An exponential of a sum's `-inf` that may be NaN in a backend (its finite terms past f32's
/// range) is not compared either; of a `-inf` every backend has, it is 0 and checked.
#[test]
fn an_exponential_of_a_sum_that_may_be_nan_is_not_compared() {
    let f = parse_func_text(
        "func @main(%0: f32[3], %1: f32[3]) -> f32[] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : f32[]\n  %3 = exponential %2 : f32[]\n  return %3\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::F32, [3]);
    let v = Literal::from_f64s(t.clone(), &[2.0, 2.0, 1.0]).unwrap();
    let nan = Literal::from_f64s(TensorType::new(DType::F32, []), &[f64::NAN]).unwrap();
    let big = [
        Literal::from_f64s(t.clone(), &[3e38, 3e38, f64::NEG_INFINITY]).unwrap(),
        v.clone(),
    ];
    assert_eq!(kiln_reference::eval(&f, &big).unwrap()[0].to_f64s(), [0.0]);
    check_outputs(&f, &big, std::slice::from_ref(&nan)).unwrap();
    let small = [
        Literal::from_f64s(t, &[1.0, 2.0, f64::NEG_INFINITY]).unwrap(),
        v,
    ];
    assert!(check_outputs(&f, &small, &[nan]).is_err());
}
