//! Gradient checks on random programs: the generator's differentiable profile
//! (`Config::gradient_profile`: `f64` values, control flow, calls, region ops, only ops with a
//! derivative) makes programs whose reverse mode (`vjp`) and forward mode (`jvp`), the
//! transforms users get, are compared with central differences of the reference interpreter.
//!
//! The check is directional, so each point costs a handful of evaluations: for random
//! cotangents `c` of the outputs and tangents `t` of the parameters, `g(s) = <c, f(x + s t)>`
//! has the derivative `g'(0) = <vjp(x, c), t> = <c, jvp(x, t)>`. A point where `g` is not
//! smooth at the scale of the differences (a `floor` stepping, a `sort` swapping two keys, a
//! `maximum` switching sides, the rounding noise of an ill-conditioned program) is skipped, and
//! told apart by the differences themselves: at three step sizes (h, h/2, h/64) the central
//! differences of a smooth `g` agree, and its one-sided differences differ in proportion to
//! the step; a kink or a step within reach breaks one or the other. A point where the program
//! computes a non-finite value (a `log` of a negative number) is skipped too, and so is one
//! where a derivative is not finite because an op meets a singularity of its own at a
//! structural zero (see [`Outcome::Singular`]). Every other point must agree within 1e-8
//! relative, plus the differences' rounding noise (1e-7 of the sum of the pairing's terms'
//! sizes): a wrong rule is off by far more. (Seeds 0 to 9,999 all agree at a thousandth of
//! these bounds too; the margin keeps other machines' libm apart from kiln's bugs.)
//!
//! Seeds 0 to 999 by default, or those `KILN_GRAD_PROGRAMS` names (a count `N`, or a range
//! `A..B` of fresh seeds). The programs checked must hold every differentiable op the profile
//! makes (control and region ops included) on their differentiated paths, and most programs
//! must have a point checked, so that skipping never hides the check. A disagreement is
//! shrunk to a small program (printed with its arguments) before the test fails.

use kiln_ir::random::{Config, Rng, random_func, random_literal, seeds::seed_range};
use kiln_ir::shrink::shrink;
use kiln_ir::{DType, Func, Literal, OpKind, Props, ValueId};
use std::collections::BTreeMap;

/// The larger step of the central differences (arguments and directions are of order 1).
const H: f64 = 1e-5;

/// What one point of a program gave.
#[derive(Debug)]
enum Outcome {
    /// The derivatives agree with the differences.
    Agrees,
    /// The program computes a non-finite value there.
    NotFinite,
    /// `g` is not smooth at the scale of the differences there.
    NotSmooth,
    /// `g` is smooth, but the program computes an exact zero there and a derivative is not
    /// finite: an op evaluated at a singularity of its own (`power`, `atan2`, `sqrt`, `divide`
    /// of a structural zero such as `x - x`, padding or a dilation's holes), where the chain
    /// rule multiplies an infinite local derivative by a zero one, as in every autodiff system.
    Singular,
    /// The derivatives disagree with the differences (a bug, or an error of a transform).
    Disagrees(String),
}

fn eval(f: &Func, args: &[Literal]) -> Result<Vec<Literal>, String> {
    kiln_reference::eval(f, args).map_err(|e| format!("reference: {e}"))
}

/// `f` returning every `f64` value it computes at its top level (parameters included), to
/// tell whether a point keeps them all finite.
fn every_value(f: &Func) -> Func {
    let mut g = f.clone();
    g.outputs = (0..f.values.len() as u32)
        .map(ValueId)
        .filter(|v| f.values[v.index()].dtype == DType::F64)
        .collect();
    g.output_types = g
        .outputs
        .iter()
        .map(|v| f.values[v.index()].clone())
        .collect();
    g
}

/// An error unless the first outputs of `mode`'s function, `got`, equal `f`'s outputs `want`:
/// the transforms compute the function itself as `f` does, on the same reference.
fn same_outputs(mode: &str, want: &[Literal], got: &[Literal]) -> Result<(), String> {
    match want.iter().zip(got).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(k) => Err(format!(
            "{mode}: output {k} is {:?}, the function's is {:?}",
            got[k].to_f64s(),
            want[k].to_f64s()
        )),
    }
}

fn dot(a: &Literal, b: &Literal) -> f64 {
    a.to_f64s()
        .iter()
        .zip(b.to_f64s())
        .map(|(x, y)| x * y)
        .sum()
}

/// The arguments of a point: `f64` parameters uniform in `range`, `i32` ones in -1 to 3 (a
/// `case` index picks every branch, out of range included; sort keys tie), others random.
fn point(f: &Func, rng: &mut Rng, range: (f64, f64)) -> Vec<Literal> {
    f.param_types()
        .iter()
        .map(|t| match t.dtype {
            DType::F64 => {
                let v = (0..t.numel())
                    .map(|_| rng.uniform(range.0, range.1))
                    .collect();
                Literal::f64(t.shape.clone(), v).expect("sizes match")
            }
            DType::I32 => {
                let v: Vec<i64> = (0..t.numel()).map(|_| rng.below(5) as i64 - 1).collect();
                Literal::from_i64s(t.clone(), &v).expect("sizes match")
            }
            _ => random_literal(rng, t),
        })
        .collect()
}

/// The `f64` parameters of `f`, which the derivatives are taken with respect to.
fn float_params(f: &Func) -> Vec<usize> {
    (0..f.params.len())
        .filter(|&p| f.values[f.params[p].index()].dtype == DType::F64)
        .collect()
}

/// The derivatives of `f` at `args` against central differences, in a direction and with
/// cotangents drawn from `rng` (see the module documentation).
fn check_point(f: &Func, args: &[Literal], rng: &mut Rng) -> Outcome {
    match try_check_point(f, args, rng) {
        Ok(o) => o,
        Err(e) => Outcome::Disagrees(e),
    }
}

fn try_check_point(f: &Func, args: &[Literal], rng: &mut Rng) -> Result<Outcome, String> {
    let wrt = float_params(f);
    let every = every_value(f);
    let values = eval(&every, args)?;
    if values
        .iter()
        .flat_map(Literal::to_f64s)
        .any(|x| !x.is_finite())
    {
        return Ok(Outcome::NotFinite);
    }
    // Whether an instruction computes an exact zero from the parameters (`x - x`, padding):
    // with random arguments, only the program's structure gives one.
    let computed = kiln_ir::random::computed_from_inputs(f);
    let structural_zero = every
        .outputs
        .iter()
        .zip(&values)
        .any(|(v, l)| computed[v.index()] && l.to_f64s().contains(&0.0));
    let unit = |rng: &mut Rng, t: &kiln_ir::TensorType| {
        let v = (0..t.numel()).map(|_| rng.uniform(-1.0, 1.0)).collect();
        Literal::f64(t.shape.clone(), v).expect("sizes match")
    };
    // Cotangents of the f64 outputs (zeros for the others), tangents of the f64 parameters.
    let cts: Vec<Literal> = f
        .output_types
        .iter()
        .map(|t| {
            if t.dtype == DType::F64 {
                unit(rng, t)
            } else {
                Literal::zeros(t.clone())
            }
        })
        .collect();
    let types = f.param_types();
    let tangents: Vec<Literal> = wrt.iter().map(|&p| unit(rng, &types[p])).collect();
    let outs = eval(f, args)?;
    let pairing = |ys: &[Literal]| -> f64 { ys.iter().zip(&cts).map(|(y, c)| dot(y, c)).sum() };
    let scale: f64 = outs
        .iter()
        .zip(&cts)
        .map(|(y, c)| {
            let (y, c) = (y.to_f64s(), c.to_f64s());
            y.iter().zip(c).map(|(a, b)| (a * b).abs()).sum::<f64>()
        })
        .sum();

    // Reverse mode: <vjp(x, c), t>.
    let vjp = kiln_autodiff::vjp(f, &wrt).map_err(|e| format!("vjp: {e}"))?;
    let mut vargs = args.to_vec();
    vargs.extend(cts.iter().cloned());
    let vout = eval(&vjp, &vargs).map_err(|e| format!("vjp: {e}\n{vjp}"))?;
    same_outputs("vjp", &outs, &vout)?;
    let grads = &vout[f.outputs.len()..];
    let reverse: f64 = grads.iter().zip(&tangents).map(|(g, t)| dot(g, t)).sum();
    // Forward mode: <c, jvp(x, t)> over the float outputs.
    let jvp = kiln_autodiff::jvp(f, &wrt).map_err(|e| format!("jvp: {e}"))?;
    let mut jargs = args.to_vec();
    jargs.extend(tangents.iter().cloned());
    let jout = eval(&jvp, &jargs).map_err(|e| format!("jvp: {e}\n{jvp}"))?;
    same_outputs("jvp", &outs, &jout)?;
    let float_cts = f
        .output_types
        .iter()
        .zip(&cts)
        .filter(|(t, _)| t.dtype.is_float())
        .map(|(_, c)| c);
    let forward: f64 = jout[f.outputs.len()..]
        .iter()
        .zip(float_cts)
        .map(|(d, c)| dot(d, c))
        .sum();

    // g(s) = <c, f(x + s t)> at s = 0, ±h, ±h/2 and ±h/64.
    let g = |s: f64| -> Result<f64, String> {
        let mut a = args.to_vec();
        for (&p, t) in wrt.iter().zip(&tangents) {
            let v = a[p]
                .to_f64s()
                .iter()
                .zip(t.to_f64s())
                .map(|(x, d)| x + s * d)
                .collect();
            a[p] = Literal::f64(a[p].shape().to_vec(), v).expect("sizes match");
        }
        Ok(pairing(&eval(f, &a)?))
    };
    let g0 = pairing(&outs);
    let (gm, gm2, gp2, gp) = (g(-H)?, g(-H / 2.0)?, g(H / 2.0)?, g(H)?);
    let central = |plus: f64, minus: f64, h: f64| (plus - minus) / (2.0 * h);
    let (d1, d2) = (central(gp, gm, H), central(gp2, gm2, H / 2.0));
    // A step 64 times smaller sees features the larger ones step over: the teeth of a
    // `remainder` by a tiny divisor, sampled at h and h/2 in step with their period, give
    // central differences that agree on the slope of the teeth's trend, not of a tooth.
    let d3 = central(g(H / 64.0)?, g(-H / 64.0)?, H / 64.0);
    // One-sided differences' gap: h g'' for a smooth g, the jump of g' at a kink.
    let (a1, a2) = ((gp - 2.0 * g0 + gm) / H, (gp2 - 2.0 * g0 + gm2) / (H / 2.0));
    let estimate = (4.0 * d2 - d1) / 3.0;
    let tol = |d: f64| 1e-8 * (d.abs() + estimate.abs()) + 1e-12 * (1.0 + scale) / H;
    // The smaller step's rounding noise is 64 times the others'.
    let tol3 = 1e-8 * (d3.abs() + estimate.abs()) + 64e-12 * (1.0 + scale) / H;
    if !(d1 - d2).is_finite()
        || !(d3 - estimate).is_finite()
        || (d3 - estimate).abs() > tol3
        || (d1 - d2).abs() > tol(d2)
        || !(a1 - 2.0 * a2).is_finite()
        || (a1 - 2.0 * a2).abs() > tol(d2)
    {
        return Ok(Outcome::NotSmooth);
    }
    if !(reverse.is_finite() && forward.is_finite()) && structural_zero {
        return Ok(Outcome::Singular);
    }
    let mut wrong = Vec::new();
    for (mode, d) in [("vjp", reverse), ("jvp", forward)] {
        if !(d - estimate).is_finite() || (d - estimate).abs() > tol(d) {
            wrong.push(format!("{mode} gives {d}"));
        }
    }
    if wrong.is_empty() {
        return Ok(Outcome::Agrees);
    }
    Ok(Outcome::Disagrees(format!(
        "{} where the differences give {estimate} (steps {H} and {}: {d1}, {d2})",
        wrong.join(", "),
        H / 2.0
    )))
}

/// The kinds of `f`'s instructions on a differentiated path (reached from an `f64` parameter,
/// reaching an `f64` output), with every instruction of their regions, at any depth.
fn kinds_on_path(f: &Func, into: &mut BTreeMap<OpKind, usize>) {
    let mut reached = vec![false; f.values.len()];
    for p in float_params(f) {
        reached[f.params[p].index()] = true;
    }
    for inst in &f.insts {
        if inst.operands.iter().any(|o| reached[o.index()]) {
            for r in &inst.results {
                reached[r.index()] = true;
            }
        }
    }
    let mut reaches = vec![false; f.values.len()];
    for o in &f.outputs {
        reaches[o.index()] = f.values[o.index()].dtype == DType::F64;
    }
    let mut on_path = vec![false; f.insts.len()];
    for (k, inst) in f.insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| reaches[r.index()]) {
            for o in &inst.operands {
                reaches[o.index()] = true;
            }
            on_path[k] = inst.operands.iter().any(|o| reached[o.index()]);
        }
    }
    fn all(f: &Func, into: &mut BTreeMap<OpKind, usize>) {
        for inst in &f.insts {
            *into.entry(inst.op.kind()).or_default() += 1;
            for r in inst.op.regions() {
                all(r, into);
            }
        }
    }
    for (inst, _) in f.insts.iter().zip(&on_path).filter(|(_, on)| **on) {
        *into.entry(inst.op.kind()).or_default() += 1;
        for r in inst.op.regions() {
            all(r, into);
        }
    }
}

/// Value `v` of `f` on `args`, for the shrinker's new parameters.
fn value_of(f: &Func, args: &[Literal], v: ValueId) -> Option<Literal> {
    let mut g = f.clone();
    g.outputs = vec![v];
    g.output_types = vec![f.values[v.index()].clone()];
    eval(&g, args).ok()?.pop()
}

/// The argument ranges of the points tried, in order: positive (where `log`, `sqrt` and
/// `power` are defined), either sign, small positive, negative.
const RANGES: [(f64, f64); 4] = [(0.5, 2.0), (-2.0, 2.0), (0.1, 1.0), (-2.0, -0.5)];

/// What a run over seeds found.
#[derive(Default)]
struct Tally {
    programs: usize,
    without_float_params: usize,
    checked: usize,
    points: usize,
    not_finite: usize,
    not_smooth: usize,
    singular: usize,
    kinds: BTreeMap<OpKind, usize>,
    failures: Vec<String>,
}

/// Checks seed `seed`'s program at up to two points where it is finite and smooth.
fn check_seed(seed: u64, tally: &mut Tally) {
    let f = random_func(&mut Rng::new(seed), &Config::gradient_profile(seed));
    tally.programs += 1;
    if float_params(&f).is_empty() {
        tally.without_float_params += 1;
        return;
    }
    let mut rng = Rng::new(seed ^ 0x9e37);
    let mut agreed = 0;
    for (k, &range) in RANGES.iter().cycle().take(6).enumerate() {
        let args = point(&f, &mut rng, range);
        let salt = seed.wrapping_mul(31).wrapping_add(k as u64);
        match check_point(&f, &args, &mut Rng::new(salt)) {
            Outcome::Agrees => {
                agreed += 1;
                tally.points += 1;
            }
            Outcome::NotFinite => tally.not_finite += 1,
            Outcome::NotSmooth => tally.not_smooth += 1,
            Outcome::Singular => tally.singular += 1,
            Outcome::Disagrees(why) => {
                tally.failures.push(report(seed, &f, &args, salt, &why));
                return;
            }
        }
        if agreed == 2 {
            break;
        }
    }
    if agreed > 0 {
        tally.checked += 1;
        kinds_on_path(&f, &mut tally.kinds);
    }
}

/// What kind of disagreement `why` tells: numbers, or the error of a transform or the
/// reference (its first two parts, `vjp: no derivative rule`, say).
fn class(why: &str) -> String {
    if why.contains("where the differences give") {
        "differences".into()
    } else {
        why.split(':').take(2).collect::<Vec<_>>().join(":")
    }
}

/// A disagreement at `args`, with the program shrunk to the smallest that still disagrees
/// in the same way.
fn report(seed: u64, f: &Func, args: &[Literal], salt: u64, why: &str) -> String {
    let mut fails = |g: &Func, a: &[Literal]| {
        !float_params(g).is_empty()
            && matches!(
                check_point(g, a, &mut Rng::new(salt)),
                Outcome::Disagrees(w) if class(&w) == class(why)
            )
    };
    let small = shrink(f, args, 400, &mut fails, &mut value_of);
    let small_why = match check_point(&small.func, &small.args, &mut Rng::new(salt)) {
        Outcome::Disagrees(w) => w,
        o => format!("{o:?}"),
    };
    let args_text: Vec<String> = small
        .args
        .iter()
        .map(|a| format!("{:?}: {:?}", a.ty(), a.to_f64s()))
        .collect();
    format!(
        "seed {seed}: {why}\nshrunk ({} steps, direction seed {salt}): {small_why}\n{}args: {}\n",
        small.steps,
        small.func,
        args_text.join("; ")
    )
}

/// The differentiable ops the default seeds need not check on a differentiated path (every
/// other one they must): `reduce_precision`, left out of the profile (its VJP is a
/// straight-through estimator by design, checked alone in `tests/gradcheck.rs`), `sign`, which
/// the generator makes for integers only, and the collectives, of which a program has one on
/// its path at most (one of [`REDUCING_COLLECTIVES`] must be checked).
const NOT_REQUIRED: [OpKind; 9] = [
    OpKind::ReducePrecision,
    OpKind::Sign,
    OpKind::AllGather,
    OpKind::AllReduce,
    OpKind::AllToAll,
    OpKind::ReduceScatter,
    OpKind::CollectivePermute,
    OpKind::CollectiveBroadcast,
    OpKind::CollectiveReduce,
];

/// The collectives that hold a computation region (each program has one collective on its
/// differentiated path at most, so the default seeds check only a few).
const REDUCING_COLLECTIVES: [OpKind; 3] = [
    OpKind::AllReduce,
    OpKind::ReduceScatter,
    OpKind::CollectiveReduce,
];

#[test]
fn random_programs_have_the_derivatives_of_their_differences() {
    let knob = std::env::var("KILN_GRAD_PROGRAMS").ok();
    let default = 0..1000;
    let seeds = seed_range("KILN_GRAD_PROGRAMS", knob.as_deref(), default.clone()).unwrap();
    let full = seeds == default;
    let mut tally = Tally::default();
    for seed in seeds {
        check_seed(seed, &mut tally);
    }
    println!(
        "{} programs ({} without f64 parameters), {} checked at {} points; points skipped: {} not finite, {} not smooth, {} singular",
        tally.programs,
        tally.without_float_params,
        tally.checked,
        tally.points,
        tally.not_finite,
        tally.not_smooth,
        tally.singular
    );
    println!("ops checked on a differentiated path: {:?}", tally.kinds);
    assert!(
        tally.failures.is_empty(),
        "{} of {} programs disagree with their differences:\n{}",
        tally.failures.len(),
        tally.programs,
        tally.failures.join("\n")
    );
    let with_floats = tally.programs - tally.without_float_params;
    assert!(
        10 * tally.checked >= 7 * with_floats,
        "only {} of {with_floats} programs were checked at a point",
        tally.checked
    );
    if full {
        let missing: Vec<&OpKind> = OpKind::ALL
            .iter()
            .filter(|k| k.props().contains(Props::DIFFERENTIABLE) && !NOT_REQUIRED.contains(k))
            .filter(|k| !tally.kinds.contains_key(k))
            .collect();
        assert!(missing.is_empty(), "never checked: {missing:?}");
        assert!(
            REDUCING_COLLECTIVES
                .iter()
                .any(|k| tally.kinds.contains_key(k)),
            "no collective with a computation region checked"
        );
    }
}

/// `text` (a program over `f64` parameters) checked at the point `args` (one list of elements
/// per parameter), for the shrunk disagreements below.
fn regression(text: &str, args: &[&[f64]]) {
    let f = kiln_ir::parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let args: Vec<Literal> = f
        .param_types()
        .iter()
        .zip(args)
        .map(|(t, v)| Literal::f64(t.shape.clone(), v.to_vec()).expect("sizes match"))
        .collect();
    for salt in 0..4 {
        match check_point(&f, &args, &mut Rng::new(salt)) {
            Outcome::Agrees => {}
            o => panic!("{o:?}\n{f}"),
        }
    }
}

/// Seeds 14, 53 and 208: a `select_and_scatter` with no window (an empty source) built slices
/// at window offsets past its padded operand, in its VJP and so in the forward mode of a
/// `reduce_window` of maxima (whose VJP is a `select_and_scatter`) with an empty result.
#[test]
fn windows_of_maxima_with_no_window_have_derivatives() {
    regression(
        "func @main(%0: f64[0,3], %1: f64[0,3]) -> f64[0,3] {
  %2 = constant {value = 0.0} : f64[]
  %3 = select_and_scatter %0, %1, %2 {window_dimensions = [2, 1], window_strides = [2, 1], padding = [[0, 0], [0, 0]], select = GE, kind = add} : f64[0,3]
  return %3
}",
        &[&[], &[]],
    );
    regression(
        "func @main(%0: f64[1,1], %1: f64[]) -> f64[0,2] {
  %2 = reduce_window %0, %1 {window_dimensions = [3, 1], window_strides = [1, 1], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 0], [0, 1]], kind = max} : f64[0,2]
  return %2
}",
        &[&[1.2], &[-100.0]],
    );
    regression(
        "func @main(%0: f64[], %1: f64[2,0]) -> f64[1,0] {
  %2 = reduce_window %1, %0 {window_dimensions = [2, 2], window_strides = [2, 1], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 1], [0, 0]], kind = max} : f64[1,0]
  return %2
}",
        &[&[-100.0], &[]],
    );
}

/// Seed 14 (before the `select_and_scatter` fix): the forward mode, instruction by
/// instruction for a program with a loop, also differentiated instructions nothing reads, so
/// a rule failing on one (here a dilated window of maxima, which has no VJP) failed `jvp`
/// where `vjp` worked.
#[test]
fn the_forward_mode_leaves_dead_instructions_alone() {
    regression(
        "func @main(%0: f64[4], %1: f64[]) -> f64[] {
  %2 = reduce_window %0, %1 {window_dimensions = [2], window_strides = [1], base_dilations = [1], window_dilations = [2], padding = [[0, 0]], kind = max} : f64[2]
  %3 = constant {value = 0} : i32[]
  %4, %5 = while %3, %1 {cond = func @cond(%0: i32[], %1: f64[]) -> pred[] {
      %2 = constant {value = 2} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f64[]) -> (i32[], f64[]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = multiply %1, %1 : f64[]
      return %3, %4
    }} : i32[], f64[]
  return %5
}",
        &[&[0.5, 1.5, -0.3, 0.9], &[0.8]],
    );
}

/// Seeds 329, 613 and 2265: `vjp` takes a cotangent for every output, and one for a `pred`
/// output (a `pad` of `is_finite`) went into the `pad` rule, which subtracts.
#[test]
fn outputs_without_derivatives_take_no_cotangent() {
    regression(
        "func @main(%0: f64[2,3]) -> (pred[4,4], f64[2,3]) {
  %1 = is_finite %0 : pred[2,3]
  %2 = constant {value = false} : pred[]
  %3 = pad %1, %2 {edge_padding_low = [0, 0], edge_padding_high = [1, 1], interior_padding = [1, 0]} : pred[4,4]
  %4 = sine %0 : f64[2,3]
  return %3, %4
}",
        &[&[0.9, 1.4, 1.6, 0.9, 1.4, 1.6]],
    );
}

/// Seeds 774, 991, 1569 and 2501: a scatter with batching dimensions over an empty batch (so
/// no update) had a VJP gathering slices of size 1 along that empty dimension.
#[test]
fn scatters_of_no_update_have_derivatives() {
    for kind in ["add", "replace"] {
        regression(
            &format!(
                "func @main(%0: f64[0,2], %1: f64[0,3]) -> f64[0,2] {{
  %2 = iota {{iota_dimension = 0}} : i32[0,3]
  %3 = scatter %0, %2, %1 {{update_window_dims = [], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 2, kind = {kind}, input_batching_dims = [0], scatter_indices_batching_dims = [0]}} : f64[0,2]
  return %3
}}"
            ),
            &[&[], &[]],
        );
    }
}

/// `text` (one `f64` parameter) at `x`: what the check makes of it.
fn outcome(text: &str, x: &[f64]) -> Outcome {
    let f = kiln_ir::parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let arg = Literal::f64(f.param_types()[0].shape.clone(), x.to_vec()).expect("sizes match");
    check_point(&f, &[arg], &mut Rng::new(1))
}

/// Seeds 50904 and 67508: the teeth of a `remainder` by a divisor of 6e-4 are about 4e-6
/// apart along the direction, and the steps h and h/2 sampled them in step with their period:
/// their central differences agreed exactly on the slope of the teeth's trend (6.96), not on
/// the derivative (-90). The step h/64 falls within a tooth and tells the two apart.
#[test]
fn teeth_finer_than_the_step_are_not_smooth() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f64[1,1,2], %1: f64[1,1,2]) -> f64[1,1,2] {
  %2 = remainder %0, %1 : f64[1,1,2]
  return %2
}",
    )
    .unwrap();
    let args = [
        Literal::f64([1, 1, 2], vec![-0.33894508011949, -0.09002248429630999]).unwrap(),
        Literal::f64([1, 1, 2], vec![-0.9784509907565835, 0.0006217057079300758]).unwrap(),
    ];
    let o = check_point(&f, &args, &mut Rng::new(1578025));
    assert!(matches!(o, Outcome::NotSmooth), "{o:?}");
}

/// The skips are told apart by the differences: a kink at the point (`abs` at 0) and a step
/// within the differences' reach (`floor` just below 1) are not smooth, a structural zero
/// under `sqrt` is singular, a `log` of a negative number is not finite, and the same programs
/// elsewhere are checked.
#[test]
fn kinks_steps_and_singularities_are_told_apart() {
    let abs = "func @main(%0: f64[]) -> f64[] {\n  %1 = abs %0 : f64[]\n  return %1\n}";
    let floor = "func @main(%0: f64[]) -> f64[] {\n  %1 = floor %0 : f64[]\n  %2 = multiply %1, %0 : f64[]\n  return %2\n}";
    let sqrt = "func @main(%0: f64[]) -> f64[] {\n  %1 = subtract %0, %0 : f64[]\n  %2 = sqrt %1 : f64[]\n  %3 = add %2, %0 : f64[]\n  return %3\n}";
    let log = "func @main(%0: f64[]) -> f64[] {\n  %1 = log %0 : f64[]\n  return %1\n}";
    assert!(matches!(outcome(abs, &[0.0]), Outcome::NotSmooth));
    assert!(matches!(outcome(abs, &[0.3]), Outcome::Agrees));
    assert!(matches!(outcome(floor, &[1.0 - 1e-6]), Outcome::NotSmooth));
    assert!(matches!(outcome(floor, &[1.5]), Outcome::Agrees));
    assert!(matches!(outcome(sqrt, &[0.7]), Outcome::Singular));
    assert!(matches!(outcome(log, &[-0.7]), Outcome::NotFinite));
    assert!(matches!(outcome(log, &[0.7]), Outcome::Agrees));
}
