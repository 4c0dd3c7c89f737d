//! Comparing results against the reference, with per-dtype tolerances.

use kiln_ir::{DType, Literal};

/// How close two float results must be: |a - e| <= atol + rtol * |e|.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// A few units in the last place of `dtype` (of its part type for a complex dtype; exact
    /// for integers and `pred`).
    pub fn ulps(dtype: DType, ulps: f64) -> Tolerance {
        let dtype = dtype.part();
        let eps = match dtype {
            DType::F16 => 2f64.powi(-10),
            DType::BF16 => 2f64.powi(-7),
            DType::F32 => 2f64.powi(-23),
            DType::F64 => 2f64.powi(-52),
            DType::Mini(m) => 2f64.powi(-(m.layout().1 as i32)),
            _ => 0.0,
        };
        let tiny = match dtype {
            DType::F16 => 6.0e-8,
            DType::BF16 | DType::F32 => 1.0e-37,
            DType::F64 => 1.0e-300,
            // The smallest positive value.
            DType::Mini(m) => m.to_f64(1),
            _ => 0.0,
        };
        Tolerance {
            atol: tiny,
            rtol: eps * ulps,
        }
    }

    /// Whether `actual` is close enough to `expected`: NaN matches NaN, an infinity only itself,
    /// and finite values within `atol + rtol * |expected|`.
    pub fn accepts(&self, actual: f64, expected: f64) -> bool {
        if expected.is_nan() {
            actual.is_nan()
        } else if expected.is_infinite() || actual.is_infinite() {
            actual == expected
        } else {
            (actual - expected).abs() <= self.atol + self.rtol * expected.abs()
        }
    }
}

/// Checks that `actual` matches `expected`: same type; integers and `pred` equal; floats within
/// `tol`, with NaN matching NaN and infinities matching exactly. The error names the first
/// mismatching element.
pub fn check_close(actual: &Literal, expected: &Literal, tol: Tolerance) -> Result<(), String> {
    if actual.ty() != expected.ty() {
        return Err(format!(
            "type {} differs from the expected {}",
            actual.ty(),
            expected.ty()
        ));
    }
    if actual.dtype().is_complex() {
        // Each part within the tolerance relative to the larger part of the expected number
        // (a normwise error: the small part of a product may cancel).
        let (a, e) = (actual.to_complex_f64s(), expected.to_complex_f64s());
        for i in 0..a.len() {
            let scale = Tolerance {
                atol: tol.atol + tol.rtol * e[i][0].abs().max(e[i][1].abs()),
                rtol: 0.0,
            };
            let finite = |z: [f64; 2]| z[0].is_finite() && z[1].is_finite();
            let t = if finite(e[i]) { scale } else { tol };
            if !(t.accepts(a[i][0], e[i][0]) && t.accepts(a[i][1], e[i][1])) {
                return Err(format!(
                    "element {i}: {} differs from the expected {} (tolerance {:e} + {:e} relative)",
                    actual.format_elem(i),
                    expected.format_elem(i),
                    tol.atol,
                    tol.rtol
                ));
            }
        }
        return Ok(());
    }
    if !actual.dtype().is_float() {
        let (a, e) = (actual.to_i64s(), expected.to_i64s());
        return match a.iter().zip(&e).position(|(x, y)| x != y) {
            None => Ok(()),
            Some(i) => Err(format!(
                "element {i}: {} differs from the expected {}",
                actual.format_elem(i),
                expected.format_elem(i)
            )),
        };
    }
    let (a, e) = (actual.to_f64s(), expected.to_f64s());
    for i in 0..a.len() {
        if !tol.accepts(a[i], e[i]) {
            return Err(format!(
                "element {i}: {} differs from the expected {} (tolerance {:e} + {:e} relative)",
                actual.format_elem(i),
                expected.format_elem(i),
                tol.atol,
                tol.rtol
            ));
        }
    }
    Ok(())
}
