//! The optimizer's rules and extraction, checked on the reference interpreter. No backend
//! runs here, so `KILN_BACKEND` does not apply: a rewrite is checked by evaluating the program
//! before and after it on the reference.

use kiln_ir::random::{Config, Rng, random_func, random_literal};
use kiln_ir::{Func, Literal, parse_func_text};
use kiln_opt::rules::{Tag, all_rules};
use kiln_reference::compare::{Tolerance, check_close};
use kiln_tests::root;

/// Bit-for-bit equality, with any NaN equal to any NaN.
fn same_bits(a: &Literal, e: &Literal) -> Result<(), String> {
    if a.ty() != e.ty() {
        return Err(format!("type {} differs from {}", a.ty(), e.ty()));
    }
    if !a.dtype().is_float() {
        return check_close(a, e, Tolerance::ulps(a.dtype(), 0.0));
    }
    for (i, (x, y)) in a.to_f64s().iter().zip(e.to_f64s()).enumerate() {
        if !(x.is_nan() && y.is_nan()) && x.to_bits() != y.to_bits() {
            return Err(format!("element {i}: {x:e} differs from {y:e} in its bits"));
        }
    }
    Ok(())
}

/// The seeds of the random-program tests: `default`, or those `KILN_OPT_PROGRAMS` names (a
/// count `N` or a range `A..B` of fresh seeds).
fn seeds(default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let knob = std::env::var("KILN_OPT_PROGRAMS").ok();
    kiln_ir::random::seeds::seed_range("KILN_OPT_PROGRAMS", knob.as_deref(), default).unwrap()
}

fn random_args(f: &Func, rng: &mut Rng) -> Vec<Literal> {
    f.param_types()
        .iter()
        .map(|t| random_literal(rng, t))
        .collect()
}

/// Every rule has a filetest named after it that it fires on, and on that program the rewrite
/// and the original agree on random inputs: bit for bit for `exact` rules, up to rounding for
/// `reassoc` ones.
#[test]
fn every_rule_holds_on_random_inputs() {
    let rules = all_rules();
    assert!(rules.len() >= 40, "{} rules", rules.len());
    let mut checked = 0;
    for r in &rules {
        let path = root().join(format!("tests/filetests/rules/{}.kir", r.name));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("rule {}: no filetest {}: {e}", r.name, path.display()));
        let f = parse_func_text(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let rewritten = kiln_opt::rewrite_once(&f, &r.name).unwrap();
        assert!(!rewritten.is_empty(), "rule {} does not fire", r.name);
        for g in &rewritten {
            assert_ne!(
                g.to_string(),
                f.to_string(),
                "rule {} changed nothing",
                r.name
            );
            let mut rng = Rng::new(0x5EED ^ checked as u64);
            for _ in 0..25 {
                let args = random_args(&f, &mut rng);
                let want = kiln_reference::eval(&f, &args).unwrap();
                let got = kiln_reference::eval(g, &args).unwrap();
                for (a, e) in got.iter().zip(&want) {
                    let res = match r.tag {
                        Tag::Exact => same_bits(a, e),
                        Tag::Reassoc => check_close(
                            a,
                            e,
                            Tolerance {
                                atol: 1e-5,
                                rtol: 1e-5,
                            },
                        ),
                    };
                    if let Err(e) = res {
                        panic!(
                            "rule {} ({:?}) is wrong: {e}\nbefore:\n{f}after:\n{g}",
                            r.name, r.tag
                        );
                    }
                }
            }
            checked += 1;
        }
    }
    println!(
        "{} rules, {checked} rewrites checked on 25 random inputs each",
        rules.len()
    );
}

/// Exact optimization of random programs (seeds 0 to 399, or `KILN_OPT_PROGRAMS`) changes no
/// bit of any result on the reference interpreter, never mis-types a rewrite, and prints the
/// same program every time.
#[test]
fn optimized_random_programs_are_bit_identical() {
    let mut changed = 0;
    let seeds = seeds(0..400);
    let n = seeds.end - seeds.start;
    for seed in seeds {
        let cfg = Config {
            ops: 1 + (seed as usize % 30),
            control: seed % 5 == 2,
            ..Config::default()
        }
        .with_wide();
        let f = random_func(&mut Rng::new(seed), &cfg);
        let opts = kiln_opt::Options {
            machine: kiln_opt::cost::Machine::REFERENCE,
            ..kiln_opt::Options::default()
        };
        let (g, report) =
            kiln_opt::optimize(&f, &opts).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        assert_eq!(report.type_mismatches, 0, "seed {seed}: {report}");
        let (again, _) = kiln_opt::optimize(&f, &opts).unwrap();
        assert_eq!(
            g.to_string(),
            again.to_string(),
            "seed {seed}: not deterministic"
        );
        if g.to_string() != f.to_string() {
            changed += 1;
        }
        let mut rng = Rng::new(seed ^ 0x0F7);
        let args = random_args(&f, &mut rng);
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = kiln_reference::eval(&g, &args).unwrap();
        for (a, e) in got.iter().zip(&want) {
            if let Err(e) = same_bits(a, e) {
                panic!("seed {seed}: {e}\nbefore:\n{f}after:\n{g}{report}");
            }
        }
    }
    println!("{n} random programs optimized, {changed} changed, all bit-identical");
}

/// Random programs (seeds 0 to 199, or `KILN_OPT_PROGRAMS`) optimized in regions of a few
/// instructions (parameters passed between them, constants copied, the results stitched and
/// deduplicated) still compute the same bits, verify and print the same every time.
#[test]
fn random_programs_optimized_in_regions_are_bit_identical() {
    let seeds = seeds(0..200);
    let n = seeds.end - seeds.start;
    let mut split = 0;
    for seed in seeds {
        let cfg = Config {
            ops: 10 + (seed as usize % 40),
            ..Config::default()
        }
        .with_wide();
        let f = random_func(&mut Rng::new(seed), &cfg);
        let opts = kiln_opt::Options {
            machine: kiln_opt::cost::Machine::REFERENCE,
            region_insts: 3 + (seed as usize % 7),
            ..kiln_opt::Options::default()
        };
        let (g, report) =
            kiln_opt::optimize(&f, &opts).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        assert_eq!(report.type_mismatches, 0, "seed {seed}: {report}");
        if report.regions > 1 {
            split += 1;
        }
        let (again, _) = kiln_opt::optimize(&f, &opts).unwrap();
        assert_eq!(
            g.to_string(),
            again.to_string(),
            "seed {seed}: not deterministic"
        );
        let mut rng = Rng::new(seed ^ 0x0F7);
        let args = random_args(&f, &mut rng);
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = kiln_reference::eval(&g, &args).unwrap();
        for (a, e) in got.iter().zip(&want) {
            if let Err(e) = same_bits(a, e) {
                panic!("seed {seed}: {e}\nbefore:\n{f}after:\n{g}{report}");
            }
        }
    }
    assert!(
        split > n / 2,
        "only {split} of {n} programs had several regions"
    );
}

/// `random_literal`'s values with special ones mixed in at a third of the elements: ±0, ±inf,
/// NaNs with payloads, subnormals, the largest finite values and ±1.
fn special_literal(rng: &mut Rng, ty: &kiln_ir::TensorType) -> Literal {
    let l = random_literal(rng, ty);
    if !ty.dtype.is_float() {
        return l;
    }
    // The smallest positive subnormal and the largest finite value of the dtype.
    let (tiny, max) = match ty.dtype {
        kiln_ir::DType::F16 => (2f64.powi(-24), 65504.0),
        kiln_ir::DType::BF16 => (2f64.powi(-133), 3.3895313892515355e38),
        kiln_ir::DType::F32 => (f32::from_bits(1) as f64, f32::MAX as f64),
        _ => (f64::from_bits(1), f64::MAX),
    };
    let specials = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::from_bits(0x7FF8_0000_0000_0123),
        -f64::NAN,
        tiny,
        -tiny,
        3.0 * tiny,
        max,
        -max,
        1.0,
        -1.0,
    ];
    let mut v = l.to_f64s();
    for x in v.iter_mut() {
        if rng.chance(0.33) {
            *x = *rng.pick(&specials);
        }
    }
    Literal::from_f64s(ty.clone(), &v).unwrap()
}

/// Bit-for-bit equality that tells -0 from +0 (any NaN still equals any NaN: IEEE leaves NaN
/// payloads to the implementation).
fn same_bits_signed_zero(a: &Literal, e: &Literal) -> Result<(), String> {
    same_bits(a, e)?;
    for (i, (x, y)) in a.to_f64s().iter().zip(e.to_f64s()).enumerate() {
        if *x == 0.0 && y == 0.0 && x.is_sign_negative() != y.is_sign_negative() {
            return Err(format!("element {i}: {x:e} differs from {y:e} in its sign"));
        }
    }
    Ok(())
}

/// Every rule tagged exact keeps every bit (the sign of zero included) on inputs full of
/// special values, in every float dtype its filetest retyped to f16, bf16 and f64 still fires
/// on.
#[test]
fn exact_rules_keep_every_bit_on_special_values_in_every_float_dtype() {
    let mut checked = 0;
    for r in all_rules().iter().filter(|r| r.tag == Tag::Exact) {
        let path = root().join(format!("tests/filetests/rules/{}.kir", r.name));
        let text = std::fs::read_to_string(&path).unwrap();
        for dtype in ["f32", "f64", "f16", "bf16"] {
            if dtype != "f32" && !text.contains("f32") {
                continue;
            }
            let retyped = text.replace("f32", dtype);
            let Ok(f) = parse_func_text(&retyped) else {
                continue;
            };
            if kiln_ir::verify(&f).is_err() {
                continue;
            }
            let rewritten = kiln_opt::rewrite_once(&f, &r.name).unwrap();
            for g in &rewritten {
                let mut rng = Rng::new(0x5BEC ^ checked as u64);
                for _ in 0..50 {
                    let args: Vec<Literal> = f
                        .param_types()
                        .iter()
                        .map(|t| special_literal(&mut rng, t))
                        .collect();
                    let want = kiln_reference::eval(&f, &args).unwrap();
                    let got = kiln_reference::eval(g, &args).unwrap();
                    for (a, e) in got.iter().zip(&want) {
                        if let Err(e) = same_bits_signed_zero(a, e) {
                            panic!(
                                "exact rule {} is not exact in {dtype}: {e}\nbefore:\n{f}after:\n{g}",
                                r.name
                            );
                        }
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "{checked} rewrites checked");
    println!("{checked} exact rewrites checked on 50 inputs with special values each");
}
