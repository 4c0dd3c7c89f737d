//! Complex numbers on the reference: literal text, the scalar formulas at their edge cases, and
//! the verifier's refusal of ordering ops.

use kiln_ir::{DType, Literal, TensorType, parse_func_text, parse_literal};
use kiln_reference::complex::{atan2, cbrt, div, expm1, log, log1p, logistic, sign, sqrt, tan};

fn close(a: [f64; 2], b: [f64; 2]) -> bool {
    let near = |x: f64, y: f64| (x - y).abs() <= 1e-12 * y.abs().max(1e-300);
    near(a[0], b[0]) && near(a[1], b[1])
}

#[test]
fn complex_literals_print_and_parse_back_with_nan_and_infinite_parts() {
    for (d, text) in [
        (
            DType::C64,
            "[(1.5, -2.0), (nan, inf), (-inf, -0.0), (0.1, 3.4028235e38)]",
        ),
        (
            DType::C128,
            "[(1.5, -2.0), (nan, inf), (-inf, -0.0), (0.1, 1e300)]",
        ),
    ] {
        let ty = TensorType::new(d, [4]);
        let l = parse_literal(text, &ty).unwrap();
        let mut s = String::new();
        l.write_nested(&mut s);
        assert_eq!(s, text);
        assert_eq!(
            parse_literal(&s, &ty).unwrap().to_le_bytes(),
            l.to_le_bytes()
        );
        // Stored interleaved: real part, then imaginary part.
        assert_eq!(l.to_le_bytes().len(), 4 * d.bytes());
        assert_eq!(
            &l.to_le_bytes()[..d.bytes() / 2],
            &Literal::from_f64s(TensorType::new(d.part(), [1]), &[1.5])
                .unwrap()
                .to_le_bytes()[..]
        );
    }
    let bad = parse_literal("[(1.0, 2.0]", &TensorType::new(DType::C64, [1]));
    assert!(bad.is_err());
}

#[test]
fn scaled_division_neither_overflows_nor_underflows() {
    assert!(close(div([1e300, 1e300], [1e300, 1e300]), [1.0, 0.0]));
    assert!(close(div([1e-300, 1e-300], [0.0, 1e-300]), [1.0, -1.0]));
    assert!(close(div([5.0, 5.0], [3.0, -1.0]), [1.0, 2.0]));
}

/// `c128` numbers of subnormal parts keep their bits: scaled up before they are halved or
/// divided (the square root of 2^-1074 was NaN, its logarithm at 2^-1074 (1 + i) off by 0.35).
#[test]
fn subnormal_parts_keep_their_bits() {
    let u = f64::from_bits(1);
    let (ln2, s3) = (std::f64::consts::LN_2, 3f64.sqrt());
    assert_eq!(sqrt([u, 0.0]), [2f64.powi(-537), 0.0]);
    assert_eq!(sqrt([4.0 * u, 0.0]), [2f64.powi(-536), 0.0]);
    assert!(close(
        sqrt([0.0, 2.0 * u]),
        [2f64.powi(-537), 2f64.powi(-537)]
    ));
    assert!(close(sqrt([-9.0 * u, 0.0]), [0.0, 3.0 * 2f64.powi(-537)]));
    let pi4 = std::f64::consts::FRAC_PI_4;
    assert!(close(log([u, u]), [-1073.5 * ln2, pi4]));
    assert!(close(
        log([13.0 * u, 0.0]),
        [13f64.ln() - 1074.0 * ln2, 0.0]
    ));
    assert!(close(sign([u, u]), [0.5f64.sqrt(), 0.5f64.sqrt()]));
    assert!(close(sign([3.0 * u, -4.0 * u]), [0.6, -0.8]));
    let c = 3.0 * 2f64.powi(-358);
    assert!(close(cbrt([0.0, 27.0 * u]), [c * s3 / 2.0, c / 2.0]));
    assert!(close(
        cbrt([-8.0 * u, 0.0]),
        [2f64.powi(-358), 2f64.powi(-358) * s3]
    ));
    assert!(close(div([u, u], [2.0 * u, u]), [0.6, 0.2]));
    assert_eq!(div([3.0 * u, 0.0], [1.0, 0.0]), [3.0 * u, 0.0]);
    assert_eq!(
        div([2f64.powi(-60), 0.0], [4.0 * u, 0.0]),
        [2f64.powi(1012), 0.0]
    );
    assert!(close(
        div([2.0 * u, 0.0], [2f64.powi(-1000), 2f64.powi(-1000)]),
        [u * 2f64.powi(1000), -u * 2f64.powi(1000)]
    ));
}

#[test]
fn sign_is_the_unit_in_the_direction_and_zero_at_zero() {
    assert_eq!(sign([0.0, 0.0]), [0.0, 0.0]);
    assert!(close(sign([3.0, -4.0]), [0.6, -0.8]));
    assert_eq!(sign([f64::INFINITY, 2.0]), [1.0, 0.0]);
    assert!(sign([f64::NAN, 1.0])[1].is_nan());
}

#[test]
fn square_root_log1p_expm1_and_tan_at_their_edges() {
    assert!(close(sqrt([-4.0, 0.0]), [0.0, 2.0]));
    assert!(close(sqrt([3.0, 4.0]), [2.0, 1.0]));
    assert!(sqrt([1e308, 1e308])[0].is_finite());
    // Near 0 the results are the arguments to first order.
    let z = [1e-20, 1e-20];
    assert!(close(log1p(z), z));
    assert!(close(expm1(z), z));
    // Far up the imaginary axis tan tends to i, without overflow to NaN.
    let t = tan([0.5, 400.0]);
    assert_eq!(t[1], 1.0);
    assert!(t[0].abs() < 1e-300);
    // Near a pole of the real tangent, as accurate as the real tangent.
    let a = std::f64::consts::FRAC_PI_2 - 1e-9;
    assert!((tan([a, 0.0])[0] - a.tan()).abs() <= 1e-6 * a.tan());
}

#[test]
fn cube_root_logistic_and_atan2_at_their_edges() {
    // The principal cube root: off the real axis for a negative real number.
    assert!(close(cbrt([-8.0, 0.0]), [1.0, 3f64.sqrt()]));
    assert_eq!(cbrt([27.0, -0.0]), [3.0, -0.0]);
    assert!(cbrt([1e308, 1e308])[0].is_finite());
    // StableHLO's test value.
    assert!(close(
        cbrt([3.0, 4.0]),
        [1.628_937_145_922_176, 0.520_174_502_304_545_8]
    ));
    // A real part of large magnitude overflows no exponential: near 0 or near 1, never NaN.
    let far_left = logistic([-1000.0, 1.0]);
    assert!(far_left[0].abs() < 1e-300 && far_left[1].abs() < 1e-300);
    assert!(close(logistic([1000.0, 1.0]), [1.0, 0.0]));
    assert!(close(
        logistic([1.0, 2.0]),
        [1.021_415_364_172_180_5, 0.403_438_706_081_542_5]
    ));
    // The real atan2 for real operands, quadrants and all.
    for (y, x) in [(1.0, 1.0), (1.0, -1.0), (-1.0, -1.0), (-2.0, 0.5)] {
        let r = atan2([y, 0.0], [x, 0.0]);
        assert!((r[0] - f64::atan2(y, x)).abs() < 1e-15 && r[1].abs() < 1e-15);
    }
    // StableHLO's test values, zeros of their signs.
    let r = atan2([1.0, 0.0], [0.0, 0.0]);
    assert_eq!(r, [std::f64::consts::FRAC_PI_2, -0.0]);
    assert!(r[1].is_sign_negative());
    let r = atan2([-1.0, 0.0], [0.0, 0.0]);
    assert!(r[0] == -std::f64::consts::FRAC_PI_2 && r[1] == 0.0 && r[1].is_sign_positive());
}

#[test]
fn complex_programs_run_and_ordering_comparisons_are_refused() {
    let f = parse_func_text(
        "func @main(%0: c64[2], %1: c64[2]) -> f32[2] {\n  %2 = multiply %0, %1 : c64[2]\n  %3 = constant {value = (0.0, 0.0)} : c64[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = add} : c64[]\n  %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : c64[2]\n  %6 = abs %5 : f32[2]\n  return %6\n}\n",
    )
    .unwrap();
    let ty = TensorType::new(DType::C64, [2]);
    let a = parse_literal("[(1.0, 2.0), (0.0, 1.0)]", &ty).unwrap();
    let b = parse_literal("[(3.0, -1.0), (0.0, 1.0)]", &ty).unwrap();
    // (5 + 5i) + (-1 + 0i) = 4 + 5i, |4 + 5i| = sqrt(41).
    let out = kiln_reference::eval(&f, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(out[0].to_f64s(), vec![41f32.sqrt() as f64; 2]);
    // maximum and minimum order lexicographically: (1, 2) after (0, 1); (0, 1) ties.
    for (op, want) in [
        ("maximum", "[(1.0, 2.0), (0.0, 1.0)]"),
        ("minimum", "[(0.0, 1.0), (0.0, 1.0)]"),
    ] {
        let text = format!(
            "func @main(%0: c64[2], %1: c64[2]) -> c64[2] {{\n  %2 = {op} %0, %1 : c64[2]\n  return %2\n}}\n"
        );
        let g = parse_func_text(&text).unwrap();
        let c = parse_literal("[(0.0, 1.0), (0.0, 1.0)]", &ty).unwrap();
        let out = kiln_reference::eval(&g, &[a.clone(), c]).unwrap();
        assert_eq!(out[0], parse_literal(want, &ty).unwrap(), "{op}");
    }
    for bad in [
        "func @main(%0: c64[2]) -> pred[2] {\n  %1 = compare %0, %0 {comparison_direction = LT} : pred[2]\n  return %1\n}\n",
        "func @main(%0: c64[2]) -> c64[] {\n  %1 = constant {value = (0.0, 0.0)} : c64[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = max} : c64[]\n  return %2\n}\n",
    ] {
        let f = parse_func_text(bad).unwrap();
        assert!(kiln_ir::verify(&f).is_err(), "{bad}");
    }
}
