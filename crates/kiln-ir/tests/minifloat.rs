//! The small float formats' conversions (`kiln_ir::minifloat`): every pattern round trips,
//! rounding is monotone and to nearest even, overflow follows each family, literals read and
//! print, and encoding and decoding agree with ml_dtypes on every pattern and rounding midpoint
//! (with `KILN_JAX_PYTHON`, or the venv `cargo xtask test` installs; skipped without one).

use kiln_ir::minifloat::{Family, MiniFloat};

fn all_codes(f: MiniFloat) -> Vec<u8> {
    (0..(1u32 << f.bits())).map(|c| c as u8).collect()
}

#[test]
fn names_are_stablehlo_names_lowercased() {
    for f in MiniFloat::ALL {
        assert_eq!(f.name(), f.stablehlo_name().to_lowercase());
    }
    assert_eq!(MiniFloat::F8E4M3FN.ml_dtypes_name(), "float8_e4m3fn");
    assert_eq!(MiniFloat::F4E2M1FN.ml_dtypes_name(), "float4_e2m1fn");
}

#[test]
fn largest_values_are_the_formats_own() {
    let max = |f: MiniFloat| f.max_value();
    assert_eq!(max(MiniFloat::F8E4M3FN), 448.0);
    assert_eq!(max(MiniFloat::F8E5M2), 57344.0);
    assert_eq!(max(MiniFloat::F8E4M3), 240.0);
    assert_eq!(max(MiniFloat::F8E3M4), 15.5);
    assert_eq!(max(MiniFloat::F8E4M3FNUZ), 240.0);
    assert_eq!(max(MiniFloat::F8E5M2FNUZ), 57344.0);
    assert_eq!(max(MiniFloat::F8E4M3B11FNUZ), 30.0);
    assert_eq!(max(MiniFloat::F8E8M0FNU), 2f64.powi(127));
    assert_eq!(max(MiniFloat::F6E2M3FN), 7.5);
    assert_eq!(max(MiniFloat::F6E3M2FN), 28.0);
    assert_eq!(max(MiniFloat::F4E2M1FN), 6.0);
}

#[test]
fn every_pattern_round_trips_nans_included() {
    for f in MiniFloat::ALL {
        for c in all_codes(f) {
            let v = f.to_f64(c);
            if v.is_nan() {
                // A NaN keeps its pattern through f64 and f32 (the IEEE formats' payloads
                // below the wide NaN's quiet bit), also when the wide NaN is quieted again.
                assert_eq!(f.from_f64(v), c, "{f} {c:#x}");
                let w = f.to_f32(c);
                assert!(w.is_nan(), "{f} {c:#x}");
                assert_eq!(f.from_f32(w), c, "{f} {c:#x}");
                assert_eq!(f.from_f64(w as f64), c, "{f} {c:#x}");
                assert_eq!(f.from_f32(v as f32), c, "{f} {c:#x}");
                let quiet = f32::from_bits(w.to_bits() | 0x0040_0000);
                assert_eq!(f.from_f32(quiet), c, "{f} {c:#x}");
                continue;
            }
            // FNUZ has one zero; every other pattern comes back as itself.
            assert_eq!(f.from_f64(v), c, "{f} {c:#x} = {v}");
            assert_eq!(f.from_f32(v as f32), c, "{f} {c:#x} = {v}");
            assert_eq!(v as f32 as f64, v, "{f} {c:#x}: an f32");
        }
    }
}

/// The finite values in increasing order, each with its pattern (one zero).
fn ladder(f: MiniFloat) -> Vec<(f64, u8)> {
    let mut v: Vec<(f64, u8)> = all_codes(f)
        .into_iter()
        .map(|c| (f.to_f64(c), c))
        .filter(|(x, c)| x.is_finite() && !(*x == 0.0 && x.is_sign_negative() && *c != 0))
        .collect();
    v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    v
}

#[test]
fn rounding_is_monotone_nearest_and_ties_go_to_even() {
    for f in MiniFloat::ALL {
        let l = ladder(f);
        for w in l.windows(2) {
            let ((a, ca), (b, cb)) = (w[0], w[1]);
            assert!(a < b, "{f}: {a} {b}");
            let mid = (a + b) / 2.0;
            let below = mid - (b - a) / 64.0;
            let above = mid + (b - a) / 64.0;
            assert_eq!(
                f.round_f64(below),
                a,
                "{f}: just below the middle of {a} and {b}"
            );
            assert_eq!(
                f.round_f64(above),
                b,
                "{f}: just above the middle of {a} and {b}"
            );
            let tie = f.from_f64(mid);
            if f == MiniFloat::F8E8M0FNU {
                // No mantissa: ties go up.
                assert_eq!(tie, cb, "{f}: the tie between {a} and {b}");
            } else if a != 0.0 && b != 0.0 {
                // The even pattern of the two (compare magnitudes: the sign bit is not
                // the last bit).
                let even = if (ca & 1) == 0 { ca } else { cb };
                assert_eq!(tie, even, "{f}: the tie between {a} and {b}");
            }
        }
        // Monotone over a dense sweep.
        let top = f.max_value() * 1.2;
        let mut prev = f64::NEG_INFINITY;
        for i in 0..=20000 {
            let x = if f == MiniFloat::F8E8M0FNU {
                2f64.powf(-130.0 + 260.0 * i as f64 / 20000.0)
            } else {
                -top + 2.0 * top * i as f64 / 20000.0
            };
            let r = f.round_f64(x);
            if r.is_nan() {
                continue;
            }
            assert!(r >= prev, "{f}: {x} rounds to {r}, below {prev}");
            prev = r;
        }
    }
}

#[test]
fn what_a_format_cannot_hold_follows_its_family() {
    use MiniFloat::*;
    assert_eq!(F8E4M3FN.from_f64(1e9), 0x7f);
    assert_eq!(F8E4M3FN.from_f64(-f64::INFINITY), 0xff);
    assert_eq!(
        F8E4M3FN.from_f64(464.0),
        0x7e,
        "a tie rounds down to the even 448"
    );
    assert_eq!(F8E4M3FN.from_f64(464.1), 0x7f);
    assert_eq!(F8E5M2.from_f64(1e9), 0x7c);
    assert_eq!(F8E5M2.from_f64(f64::NAN), 0x7e);
    // An IEEE-family NaN's payload rides below the wide NaN's quiet bit.
    assert_eq!(F8E5M2.to_f32(0x7d).to_bits(), 0x7fd0_0000);
    assert_eq!(F8E5M2.to_f32(0xfe).to_bits(), 0xffe0_0000);
    assert_eq!(F8E5M2.to_f64(0x7f).to_bits(), 0x7ffe_0000_0000_0000);
    assert_eq!(F8E5M2.from_f32(f32::from_bits(0x7fd0_0000)), 0x7d);
    assert_eq!(F8E5M2.from_f32(f32::from_bits(0xffc0_0001)), 0xfe);
    assert_eq!(F8E3M4.from_f32(f32::from_bits(0x7ffc_0000)), 0x7f);
    assert_eq!(F8E4M3.from_f64(-1e9), 0xf8);
    assert_eq!(F8E4M3FNUZ.from_f64(-0.0), 0);
    assert_eq!(F8E4M3FNUZ.from_f64(-1e-30), 0);
    assert_eq!(F8E5M2FNUZ.from_f64(f64::INFINITY), 0x80);
    assert_eq!(F8E8M0FNU.from_f64(0.0), 0xff);
    assert_eq!(F8E8M0FNU.from_f64(-1.0), 0xff);
    assert_eq!(F8E8M0FNU.from_f64(3.0), 0x81);
    assert_eq!(F8E8M0FNU.from_f64(1e-300), 0x00);
    assert_eq!(F6E2M3FN.from_f64(1e9), 0x1f);
    assert_eq!(F6E3M2FN.from_f64(-f64::INFINITY), 0x3f);
    assert_eq!(F4E2M1FN.from_f64(-100.0), 0xf);
    assert_eq!(F4E2M1FN.from_f64(f64::NAN), 0);
    // Decoding.
    assert_eq!(F4E2M1FN.to_f64(0x9), -0.5);
    assert_eq!(F8E3M4.to_f64(0x70), f64::INFINITY);
    assert!(F8E4M3B11FNUZ.to_f64(0x80).is_nan());
    assert_eq!(F8E4M3B11FNUZ.to_f64(0x7f), 30.0);
    assert_eq!(F8E8M0FNU.to_f64(0), 2f64.powi(-127));
}

/// The inputs checked against ml_dtypes: every value, the midpoints, a little either side of
/// them, and values past the range.
fn probes(f: MiniFloat) -> Vec<f32> {
    let l = ladder(f);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        1e-30,
    ];
    for w in l.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        let mid = ((a + b) / 2.0) as f32;
        xs.extend([a as f32, -(a as f32), mid, -mid]);
        xs.push(f32::from_bits(mid.to_bits() + 1));
        xs.push(f32::from_bits(mid.to_bits().saturating_sub(1)));
    }
    let top = l.last().unwrap().0 as f32;
    xs.extend([top * 1.03, top * 1.1, top * 2.0, -top * 1.1]);
    if f.family() == Family::Mx {
        // ml_dtypes' NaN to these formats is its own choice; kiln's is stated in the docs.
        xs.retain(|x| !x.is_nan());
    }
    xs
}

/// Runs `script` (which reads whitespace-separated hex words on stdin and prints some) in the
/// Python that has ml_dtypes; `None` without one.
fn python(script: &str, input: &[String]) -> Option<Vec<u64>> {
    let python = std::env::var("KILN_JAX_PYTHON").ok().or_else(|| {
        let p = std::path::PathBuf::from(std::env::var("HOME").ok()?)
            .join(".cache/kiln/jax-venv/bin/python");
        p.exists().then(|| p.to_string_lossy().into_owned())
    })?;
    let mut child = std::process::Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.join(" ").as_bytes())
        .unwrap();
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .collect(),
    )
}

/// The patterns ml_dtypes rounds `xs` to.
fn ml_encode(f: MiniFloat, xs: &[f32]) -> Option<Vec<u8>> {
    let hex: Vec<String> = xs.iter().map(|x| format!("{:08x}", x.to_bits())).collect();
    let script = format!(
        "import sys, numpy as np, ml_dtypes\n\
         x = np.array([int(h, 16) for h in sys.stdin.read().split()], dtype=np.uint32).view(np.float32)\n\
         print(' '.join('%02x' % b for b in x.astype(ml_dtypes.{}).view(np.uint8)))\n",
        f.ml_dtypes_name()
    );
    Some(
        python(&script, &hex)?
            .into_iter()
            .map(|b| b as u8)
            .collect(),
    )
}

/// The f32 bits of the values ml_dtypes gives the patterns `codes`.
fn ml_decode(f: MiniFloat, codes: &[u8]) -> Option<Vec<u32>> {
    let hex: Vec<String> = codes.iter().map(|c| format!("{c:02x}")).collect();
    let script = format!(
        "import sys, numpy as np, ml_dtypes\n\
         x = np.array([int(h, 16) for h in sys.stdin.read().split()], dtype=np.uint8).view(ml_dtypes.{})\n\
         print(' '.join('%08x' % b for b in x.astype(np.float32).view(np.uint32)))\n",
        f.ml_dtypes_name()
    );
    Some(
        python(&script, &hex)?
            .into_iter()
            .map(|b| b as u32)
            .collect(),
    )
}

#[test]
fn encoding_and_decoding_agree_with_ml_dtypes() {
    let mut checked = 0;
    for f in MiniFloat::ALL {
        let xs = probes(f);
        let Some(want) = ml_encode(f, &xs) else {
            eprintln!("no Python with ml_dtypes (KILN_JAX_PYTHON): not compared");
            return;
        };
        assert_eq!(want.len(), xs.len());
        for (x, w) in xs.iter().zip(&want) {
            let got = f.from_f32(*x);
            let same = got == *w || (f.to_f64(got).is_nan() && f.to_f64(*w).is_nan());
            assert!(
                same,
                "{f}: {x:e} ({:#010x}) is {got:#04x}, ml_dtypes {w:#04x}",
                x.to_bits()
            );
        }
        let codes = all_codes(f);
        let values = ml_decode(f, &codes).unwrap();
        for (c, v) in codes.into_iter().zip(values) {
            let (got, want) = (f.to_f32(c), f32::from_bits(v));
            assert!(
                (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits(),
                "{f}: {c:#04x} decodes to {got:e}, ml_dtypes {want:e}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, MiniFloat::ALL.len());
}

#[test]
fn literals_read_decimals_and_bit_patterns_and_print_back() {
    use kiln_ir::{DType, TensorType, parse_literal};
    let ty = TensorType::new(DType::F8E4M3FN, [6]);
    let l = parse_literal("[0.1, 0x7e, -0x0, 0xff, 1000.0, -0.0]", &ty);
    // `-0x0` is no pattern: refused.
    assert!(l.is_err());
    let l = parse_literal("[0.1, 0x7e, 0x80, 0xff, 1000.0, -0.0]", &ty).unwrap();
    assert_eq!(l.to_le_bytes(), [0x1d, 0x7e, 0x80, 0xff, 0x7f, 0x80]);
    let mut text = String::new();
    l.write_nested(&mut text);
    assert_eq!(text, "[0.1015625, 448.0, -0.0, -nan, nan, -0.0]");
    assert_eq!(parse_literal(&text, &ty).unwrap(), l);
    // A pattern wider than the type.
    let e = parse_literal("[0x10]", &TensorType::new(DType::F4E2M1FN, [1])).unwrap_err();
    assert!(
        e.to_string().contains("not a bit pattern of f4e2m1fn"),
        "{e}"
    );
}
