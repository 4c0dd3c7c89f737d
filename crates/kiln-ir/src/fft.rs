//! The arithmetic `fft` shares between the type rule, the reference interpreter and the
//! compiled backends' decomposition: the length of a half spectrum and the twiddle factors.

/// The length of the last dimension of a half spectrum of `n` points: `n/2 + 1` (0 for 0).
pub fn half_spectrum(n: usize) -> usize {
    if n == 0 { 0 } else { n / 2 + 1 }
}

/// `(cos θ, sin θ)` for `θ = 2π m / n` (`n > 0`), in f64 within an ulp of the exact values:
/// the angle is reduced exactly, in integers, to the first octant before any rounding, so
/// the multiples of `π/2` give exact zeros and ones and the symmetries of the circle hold
/// exactly (`twiddle(n - m, n)` is the conjugate of `twiddle(m, n)`).
pub fn twiddle(m: u64, n: u64) -> (f64, f64) {
    let n = n as u128;
    let m = m as u128 % n;
    // θ = (π/2) (q + r/n) with the quadrant q in 0..4 and r in 0..n.
    let q = (4 * m) / n;
    let r = 4 * m - q * n;
    // cos and sin of (π/2) (a/n) for a <= n/2, exact or correctly rounded at 0, 30 and 45
    // degrees (so that the twiddles of lengths 3, 6 and 12 sum to exact zeros).
    let octant = |a: u128| -> (f64, f64) {
        if a == 0 {
            (1.0, 0.0)
        } else if 2 * a == n {
            (
                std::f64::consts::FRAC_1_SQRT_2,
                std::f64::consts::FRAC_1_SQRT_2,
            )
        } else if 3 * a == n {
            (3f64.sqrt() / 2.0, 0.5)
        } else {
            let phi = std::f64::consts::FRAC_PI_2 * (a as f64 / n as f64);
            (phi.cos(), phi.sin())
        }
    };
    let (c, s) = if 2 * r <= n {
        octant(r)
    } else {
        // The complement in the quadrant: cos(π/2 - φ) = sin φ.
        let (c, s) = octant(n - r);
        (s, c)
    };
    match q {
        0 => (c, s),
        1 => (-s, c),
        2 => (-c, -s),
        _ => (s, -c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twiddles_match_the_circle() {
        for n in 1..40u64 {
            for m in 0..n {
                let (c, s) = twiddle(m, n);
                let t = 2.0 * std::f64::consts::PI * m as f64 / n as f64;
                assert!((c - t.cos()).abs() < 4e-15, "cos {m}/{n} {c} {}", t.cos());
                assert!((s - t.sin()).abs() < 4e-15, "sin {m}/{n}");
                let (c2, s2) = twiddle(n - m, n);
                assert_eq!((c2, -s2), (c, s + 0.0), "conjugate symmetry {m}/{n}");
            }
        }
        assert_eq!(twiddle(1, 4), (0.0, 1.0));
        assert_eq!(twiddle(3, 4), (0.0, -1.0));
        assert_eq!(twiddle(2, 4), (-1.0, 0.0));
        assert_eq!(half_spectrum(0), 0);
        assert_eq!(half_spectrum(5), 3);
        assert_eq!(half_spectrum(4), 3);
    }
}
