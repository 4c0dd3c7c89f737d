//! The generator's own tests: every op appears, and the profiles' programs are what they say.

use super::*;
use crate::{Combiner, ComparisonDirection, OpKind};

/// Every op of `OpKind::ALL` appears in the random programs of a thousand seeds (control
/// flow in the seeds that allow it, complex parameters in all).
#[test]
fn every_op_is_generated() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..1000u64 {
        let cfg = Config {
            ops: 1 + (seed as usize % 12),
            control: seed % 2 == 1,
            ..Config::default()
        };
        let cfg = cfg.with_complex();
        let f = random_func(&mut Rng::new(seed), &cfg);
        crate::verify(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        seen.extend(f.insts.iter().map(|i| i.op.kind()));
    }
    let missing: Vec<&OpKind> = OpKind::ALL.iter().filter(|k| !seen.contains(k)).collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
}

/// Every program of the differential tests' profile computes something from its inputs,
/// and the large ones reach 10^5 elements and more, with matrix products among them.
#[test]
fn profiled_programs_compute_from_their_inputs() {
    let (mut trivial, mut large, mut largest, mut large_dots) = (vec![], 0, 0, 0);
    for seed in 0..10_000u64 {
        let cfg = Config::profile(seed);
        let f = random_func(&mut Rng::new(seed), &cfg);
        crate::verify(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        if !computes_from_inputs(&f) {
            trivial.push(seed);
        }
        let most = f.values.iter().map(|t| t.numel()).max().unwrap_or(0);
        if cfg.elements.is_some() {
            large += 1;
            largest = largest.max(most);
            assert!(most >= LARGE_ELEMENTS.0, "seed {seed}: {most}\n{f}");
            assert!(most <= LARGE_ELEMENTS.1, "seed {seed}: {most}\n{f}");
            large_dots += f
                .insts
                .iter()
                .filter(|i| i.op.kind() == OpKind::DotGeneral)
                .count();
        } else {
            assert!(most < LARGE_ELEMENTS.0, "seed {seed}: {most}\n{f}");
        }
    }
    println!(
        "trivial: {} {:?}; large: {large} (largest {largest}, {large_dots} products)",
        trivial.len(),
        &trivial[..trivial.len().min(20)]
    );
    assert!(trivial.is_empty(), "trivial programs: {trivial:?}");
    assert_eq!(large, 50);
    assert!(large_dots >= 10, "{large_dots} products in large programs");
}

/// The differential tests' profile with wide ops reaches the kernels for many updates and long folds
/// (`random/wide.rs`): scatters of hundreds of update elements with every combiner but
/// `and`/`or` among them, `select_and_scatter` selecting by `LT` or combining by `max`,
/// `reduce_region` over rows of 2,000 elements or more, `reduce_window_region` with windows
/// of more than 256 elements.
#[test]
fn profiled_programs_hold_wide_scatters_and_long_folds() {
    let (mut scatters, mut kinds, mut selects, mut long_rows, mut wide_windows) =
        (0, std::collections::BTreeSet::new(), 0, 0, 0);
    for seed in 0..2000u64 {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        crate::verify(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        for inst in &f.insts {
            let operand = |i: usize| f.values[inst.operands[i].index()].clone();
            match &inst.op {
                Op::Scatter { kind, .. } if operand(2).numel() > 256 => {
                    scatters += 1;
                    kinds.insert(kind.to_string());
                }
                Op::SelectAndScatter { select, kind, .. }
                    if *select == ComparisonDirection::Lt || *kind == Combiner::Max =>
                {
                    selects += 1
                }
                Op::ReduceRegion { dimensions, .. } => {
                    let t = operand(0);
                    let row: usize = dimensions.iter().map(|&d| t.shape[d as usize]).product();
                    long_rows += usize::from(row >= 2000);
                }
                Op::ReduceWindowRegion {
                    window_dimensions, ..
                } => {
                    wide_windows += usize::from(window_dimensions.iter().product::<i64>() > 256);
                }
                _ => {}
            }
        }
    }
    println!(
        "{scatters} wide scatters ({kinds:?}), {selects} select_and_scatter, {long_rows} long reduce_region rows, {wide_windows} wide windows"
    );
    for k in ["replace", "add", "mul", "max", "min"] {
        assert!(kinds.contains(k), "no wide scatter by {k}: {kinds:?}");
    }
    for (what, n) in [
        ("wide scatters", scatters),
        ("select_and_scatter by LT or max", selects),
        ("long reduce_region rows", long_rows),
        (
            "reduce_window_region windows over 256 elements",
            wide_windows,
        ),
    ] {
        assert!(n >= 20, "{n} {what}");
    }
}

/// A seed knob names a count or a range; unset it gives the default, and anything else (a
/// mistyped range, a backwards one) is an error naming the knob, never the default seeds.
#[test]
fn seed_knobs_name_a_count_or_a_range() {
    use super::seeds::seed_range;
    assert_eq!(seed_range("K", None, 0..400), Ok(0..400));
    assert_eq!(seed_range("K", Some("25"), 0..400), Ok(0..25));
    assert_eq!(seed_range("K", Some("4000..8000"), 0..400), Ok(4000..8000));
    assert_eq!(
        seed_range("K", Some("46_000..48_000"), 0..1),
        Ok(46_000..48_000)
    );
    assert_eq!(seed_range("K", Some(" 7 .. 9 "), 0..1), Ok(7..9));
    for bad in ["", "4000-8000", "..9", "9..", "x", "9..7"] {
        let e = seed_range("KILN_X", Some(bad), 0..400).unwrap_err();
        assert!(e.starts_with(&format!("KILN_X={bad}:")), "{e}");
    }
}

/// The differential tests' profile (with wide ops) generates every op but `real`, `imag` and
/// `complex` in each run of 1,000 seeds it is given, and at least 20 times in the six runs
/// here (old and fresh seeds): the ranges `KILN_PROGRAMS` runs (2,000 seeds) assert every op
/// appears, which an op made a few times per thousand seeds fails by chance. `all_gather`,
/// `all_to_all` and `reduce_scatter` did (seeds 72,000 to 76,000), before
/// `Gen::maybe_collective`.
#[test]
fn every_profiled_thousand_seeds_generate_every_op() {
    let complex_only = [OpKind::Real, OpKind::Imag, OpKind::Complex];
    let mut total = std::collections::BTreeMap::<OpKind, usize>::new();
    for start in [0u64, 72_000, 73_000, 74_000, 75_000, 1_000_000] {
        let mut seen = std::collections::BTreeMap::<OpKind, usize>::new();
        for seed in start..start + 1000 {
            let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
            for inst in &f.insts {
                *seen.entry(inst.op.kind()).or_default() += 1;
            }
        }
        let missing: Vec<&OpKind> = (OpKind::ALL.iter())
            .filter(|k| !complex_only.contains(k) && !seen.contains_key(k))
            .collect();
        assert!(
            missing.is_empty(),
            "seeds {start}..+1000 never make {missing:?}"
        );
        for (k, n) in seen {
            *total.entry(k).or_default() += n;
        }
    }
    let mut counts: Vec<(usize, OpKind)> = total.iter().map(|(&k, &n)| (n, k)).collect();
    counts.sort();
    println!(
        "the rarest ops in 6,000 seeds: {:?}",
        &counts[..12.min(counts.len())]
    );
    let rare: Vec<&(usize, OpKind)> = (counts.iter())
        .filter(|(n, k)| *n < 20 && !complex_only.contains(k))
        .collect();
    assert!(
        rare.is_empty(),
        "ops made under 20 times in 6,000 seeds: {rare:?}"
    );
}

/// Each instruction of `f` and of the regions it holds, with its depth (0 for `f`'s own).
fn all_insts<'a>(f: &'a Func, depth: usize, out: &mut Vec<(usize, &'a crate::Inst)>) {
    for inst in &f.insts {
        out.push((depth, inst));
        for r in inst.op.regions() {
            all_insts(r, depth + 1, out);
        }
    }
}

/// The differential tests' profile makes what the generator long did not: `bitcast_convert`
/// to and from `pred`, `dot_general` and `convolution` with a wider result type than their
/// operands', `while` loops whose condition reads the data (a reduction of the carry, not
/// only the counter), and loops and `case`s nested in loop bodies, branches and called
/// functions; each at least 20 times in 2,000 seeds. Every program verifies.
#[test]
fn profiled_programs_hold_typed_ops_and_nested_control() {
    let mut n = std::collections::BTreeMap::<&str, usize>::new();
    for seed in 0..2000u64 {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        crate::verify(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        let mut insts = Vec::new();
        all_insts(&f, 0, &mut insts);
        for (depth, inst) in &insts {
            let ty = |v: ValueId| f.values.get(v.index()).map(|t| t.dtype);
            let kind = match &inst.op {
                Op::BitcastConvert {} if *depth == 0 => {
                    match (ty(inst.operands[0]), ty(inst.results[0])) {
                        (Some(DType::Pred), Some(DType::Pred)) => None,
                        (_, Some(DType::Pred)) => Some("bitcast to pred"),
                        (Some(DType::Pred), _) => Some("bitcast from pred"),
                        _ => None,
                    }
                }
                Op::DotGeneral { .. } | Op::Convolution { .. } if *depth == 0 => {
                    let (a, r) = (ty(inst.operands[0]), ty(inst.results[0]));
                    (a != r).then_some(if matches!(inst.op, Op::Convolution { .. }) {
                        "wider convolution"
                    } else {
                        "wider dot_general"
                    })
                }
                Op::While { cond, .. }
                    if cond.insts.iter().any(|i| matches!(i.op, Op::Reduce { .. })) =>
                {
                    Some("data-dependent while")
                }
                Op::While { .. } | Op::Case { .. } if *depth > 0 => Some("nested control"),
                _ => None,
            };
            if let Some(k) = kind {
                *n.entry(k).or_default() += 1;
            }
        }
        // A called function's control flow is nested too.
        for inst in &f.insts {
            if let Op::Call { callee } = &inst.op {
                let body = callee.func.as_deref().expect("resolved");
                if (body.insts.iter()).any(|i| matches!(i.op, Op::While { .. } | Op::Case { .. })) {
                    *n.entry("control in a called function").or_default() += 1;
                }
            }
        }
    }
    println!("{n:?}");
    for k in [
        "bitcast to pred",
        "bitcast from pred",
        "wider dot_general",
        "wider convolution",
        "data-dependent while",
        "nested control",
        "control in a called function",
    ] {
        let got = n.get(k).copied().unwrap_or(0);
        assert!(got >= 20, "{got} {k} in 2,000 seeds: {n:?}");
    }
}

/// The gradient checks' profile keeps to what has a derivative: every float is `f64`, in the
/// regions too, and no bits are reinterpreted, no `reduce_precision` or `fft` is made, and
/// `reduce_window`'s maxima have no dilation; control flow, calls and region ops are there.
#[test]
fn gradient_profile_programs_are_differentiable() {
    fn walk(f: &Func, seen: &mut std::collections::BTreeSet<OpKind>) -> Result<(), String> {
        if let Some(t) = f
            .values
            .iter()
            .find(|t| t.dtype.is_float() && t.dtype != DType::F64)
        {
            return Err(format!("a {t} value"));
        }
        for inst in &f.insts {
            seen.insert(inst.op.kind());
            match &inst.op {
                Op::BitcastConvert {} | Op::ReducePrecision { .. } | Op::Fft { .. } => {
                    return Err(format!("a {}", inst.op.mnemonic()));
                }
                Op::ReduceWindow {
                    kind: Combiner::Max,
                    base_dilations,
                    window_dilations,
                    ..
                } if base_dilations
                    .iter()
                    .chain(window_dilations)
                    .any(|&d| d != 1) =>
                {
                    return Err("a dilated reduce_window of maxima".into());
                }
                op => {
                    for r in op.regions() {
                        walk(r, seen)?;
                    }
                }
            }
        }
        Ok(())
    }
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..2000u64 {
        let f = random_func(&mut Rng::new(seed), &Config::gradient_profile(seed));
        crate::verify(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        walk(&f, &mut seen).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
    }
    for k in [
        OpKind::While,
        OpKind::Case,
        OpKind::Call,
        OpKind::Sort,
        OpKind::Map,
        OpKind::ReduceRegion,
        OpKind::ReduceWindowRegion,
        OpKind::Cholesky,
        OpKind::Lu,
    ] {
        assert!(
            seen.contains(&k),
            "no {k:?} in the gradient profile's programs"
        );
    }
}
