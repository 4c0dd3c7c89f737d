//! Gradient checks generated from the op list: every differentiable op's spec examples,
//! promoted to f64, differentiated in reverse (VJP) and forward (JVP) mode, and compared with
//! central finite differences on random inputs. Backend-independent: the derivatives and the
//! finite differences are evaluated on the reference interpreter, so `KILN_BACKEND` does not
//! apply (the backends' results are checked against that interpreter by the other suites).

use kiln_ir::random::{Rng, random_literal};
use kiln_ir::{DType, Func, Literal, OpKind, Props, TensorType, parse_module};
use kiln_reference::compare::Tolerance;
use kiln_tests::{load_example, load_specs};

/// Ops whose inputs must stay positive for the function to be smooth and finite.
fn positive_domain(op: &str) -> bool {
    matches!(
        op,
        "log" | "sqrt" | "rsqrt" | "power" | "log_plus_one" | "divide" | "remainder"
    )
}

/// Ops whose VJP is a straight-through estimator by design: their derivative is checked
/// against the finite differences of the function with the op replaced by the identity.
fn straight_through(op: &str) -> bool {
    op == "reduce_precision"
}

/// `text` with every `reduce_precision` replaced by an identity `convert`.
fn without_rounding(text: &str) -> String {
    text.lines()
        .map(
            |l| match (l.find("reduce_precision "), l.find('{'), l.find('}')) {
                (Some(a), Some(o), Some(c)) if o > a => {
                    format!(
                        "{}convert {}{}",
                        &l[..a],
                        l[a + "reduce_precision ".len()..o].trim_end(),
                        &l[c + 1..]
                    )
                }
                _ => l.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

fn to_f64(text: &str) -> String {
    let mut text = text
        .replace("bf16[", "f64[")
        .replace("f16[", "f64[")
        .replace("f32[", "f64[");
    // The small floats too (`f8e4m3fn[`, ...): their rounding is a step function, whose finite
    // differences say nothing about the derivative.
    for m in kiln_ir::minifloat::MiniFloat::ALL {
        text = text.replace(&format!("{}[", m.name()), "f64[");
    }
    text
}

/// Inputs of the linear algebra ops, where the function is smooth only on part of the space:
/// `cholesky`'s operand symmetric positive definite (`m mᵀ + n I` for a random `m`, per
/// matrix), `triangular_solve`'s matrix well conditioned (a diagonal in [2, 4)); `None` for
/// every other parameter.
fn matrix_domain(rng: &mut Rng, op: &str, param: usize, t: &TensorType) -> Option<Vec<f64>> {
    let r = t.rank();
    if r < 2 || !matches!((op, param), ("cholesky", 0) | ("triangular_solve", 0)) {
        return None;
    }
    let n = t.shape[r - 1];
    let mut out = Vec::with_capacity(t.numel());
    for _ in 0..t.numel() / (n * n).max(1) {
        let m: Vec<f64> = (0..n * n).map(|_| rng.uniform(-2.0, 2.0)).collect();
        for i in 0..n {
            for j in 0..n {
                out.push(if op == "cholesky" {
                    let dot: f64 = (0..n).map(|q| m[i * n + q] * m[j * n + q]).sum();
                    dot + if i == j { n as f64 } else { 0.0 }
                } else if i == j {
                    2.0 + m[i * n + j].abs()
                } else {
                    m[i * n + j]
                });
            }
        }
    }
    Some(out)
}

fn random_args(
    rng: &mut Rng,
    op: &str,
    f: &Func,
    example_args: &[Literal],
    positive: bool,
) -> Vec<Literal> {
    f.param_types()
        .iter()
        .zip(example_args)
        .enumerate()
        .map(|(p, (t, ex))| {
            if t.dtype == DType::F64
                && let Some(v) = matrix_domain(rng, op, p, t)
            {
                Literal::f64(t.shape.clone(), v).unwrap()
            } else if t.dtype == DType::F64 {
                let v: Vec<f64> = (0..t.numel())
                    .map(|_| {
                        if positive {
                            rng.uniform(0.5, 2.0)
                        } else {
                            rng.uniform(-2.0, 2.0)
                        }
                    })
                    .collect();
                Literal::f64(t.shape.clone(), v).unwrap()
            } else {
                ex.clone()
            }
        })
        .collect()
}

fn eval(f: &Func, args: &[Literal]) -> Vec<Literal> {
    kiln_reference::eval(f, args).unwrap_or_else(|e| panic!("{e}\n{f}"))
}

/// <cts, f(args)> over the float outputs.
fn pairing(f: &Func, args: &[Literal], cts: &[Option<Literal>]) -> f64 {
    eval(f, args)
        .iter()
        .zip(cts)
        .filter_map(|(y, c)| {
            c.as_ref().map(|c| {
                y.to_f64s()
                    .iter()
                    .zip(c.to_f64s())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
        })
        .sum()
}

fn with_element(args: &[Literal], p: usize, j: usize, delta: f64) -> Vec<Literal> {
    let mut out = args.to_vec();
    let mut v = out[p].to_f64s();
    v[j] += delta;
    out[p] = Literal::f64(out[p].shape().to_vec(), v).unwrap();
    out
}

/// Whether a derivative and its finite-difference estimate agree: both finite, and within 1e-5
/// absolute plus 1e-5 relative to the larger of the two.
fn close(a: f64, b: f64) -> bool {
    let tol = Tolerance {
        atol: 1e-5,
        rtol: 1e-5,
    };
    a.is_finite() && b.is_finite() && (tol.accepts(a, b) || tol.accepts(b, a))
}

/// Checks VJP and JVP of `f` at random points against finite differences; returns the number
/// of derivative entries compared.
fn check(name: &str, f: &Func, example_args: &[Literal], rng: &mut Rng) -> usize {
    check_modes(name, f, example_args, rng, true)
}

/// Like [`check`], the VJP only where `reverse` says so.
fn check_modes(
    name: &str,
    f: &Func,
    example_args: &[Literal],
    rng: &mut Rng,
    reverse: bool,
) -> usize {
    // The function whose finite differences the derivatives are compared with.
    let smooth;
    let fd_f = if straight_through(name) {
        let m = parse_module(&without_rounding(&kiln_ir::print_func(f))).unwrap();
        smooth = m.entry().unwrap().clone();
        &smooth
    } else {
        f
    };
    let wrt: Vec<usize> = (0..f.params.len())
        .filter(|&i| f.values[f.params[i].index()].dtype == DType::F64)
        .collect();
    if wrt.is_empty() {
        return 0;
    }
    let args = random_args(rng, name, f, example_args, positive_domain(name));
    let mut n = 0;
    if reverse {
        n += check_vjp(name, f, fd_f, &args, &wrt, rng);
    }
    n + check_jvp(name, f, fd_f, &args, &wrt, rng)
}

/// The VJP of `f` at `args` against finite differences of `fd_f`, with random cotangents.
fn check_vjp(
    name: &str,
    f: &Func,
    fd_f: &Func,
    args: &[Literal],
    wrt: &[usize],
    rng: &mut Rng,
) -> usize {
    const EPS: f64 = 1e-6;
    let cts: Vec<Option<Literal>> = f
        .output_types
        .iter()
        .map(|t| (t.dtype == DType::F64).then(|| random_literal(rng, t)))
        .collect();
    let vjp = kiln_autodiff::vjp(f, wrt).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut vargs = args.to_vec();
    vargs.extend(
        f.output_types
            .iter()
            .zip(&cts)
            .map(|(t, c)| c.clone().unwrap_or_else(|| Literal::zeros(t.clone()))),
    );
    let out = eval(&vjp, &vargs);
    let grads = &out[f.outputs.len()..];
    let mut n = 0;
    for (k, &p) in wrt.iter().enumerate() {
        let g = grads[k].to_f64s();
        for (j, &gj) in g.iter().enumerate() {
            let fd = (pairing(fd_f, &with_element(args, p, j, EPS), &cts)
                - pairing(fd_f, &with_element(args, p, j, -EPS), &cts))
                / (2.0 * EPS);
            assert!(
                close(gj, fd),
                "{name}: d/d(param {p})[{j}]: vjp {gj} vs finite difference {fd}\n{f}\nvjp:\n{vjp}"
            );
            n += 1;
        }
    }
    n
}

/// The JVP of `f` at `args`, in a random direction, against finite differences of `fd_f`.
fn check_jvp(
    name: &str,
    f: &Func,
    fd_f: &Func,
    args: &[Literal],
    wrt: &[usize],
    rng: &mut Rng,
) -> usize {
    const EPS: f64 = 1e-6;
    let mut n = 0;
    let jvp = kiln_autodiff::jvp(f, wrt).unwrap_or_else(|e| panic!("{name}: jvp: {e}"));
    let tangents: Vec<Literal> = wrt
        .iter()
        .map(|&p| random_literal(rng, &f.param_types()[p]))
        .collect();
    let mut jargs = args.to_vec();
    jargs.extend(tangents.iter().cloned());
    let jout = eval(&jvp, &jargs);
    let float_outs: Vec<usize> = (0..f.outputs.len())
        .filter(|&i| f.output_types[i].dtype == DType::F64)
        .collect();
    let shifted = |s: f64| -> Vec<Literal> {
        let mut a = args.to_vec();
        for (k, &p) in wrt.iter().enumerate() {
            let v: Vec<f64> = a[p]
                .to_f64s()
                .iter()
                .zip(tangents[k].to_f64s())
                .map(|(x, t)| x + s * t)
                .collect();
            a[p] = Literal::f64(a[p].shape().to_vec(), v).unwrap();
        }
        a
    };
    let (plus, minus) = (eval(fd_f, &shifted(EPS)), eval(fd_f, &shifted(-EPS)));
    for (k, &o) in float_outs.iter().enumerate() {
        let dot = jout[f.outputs.len() + k].to_f64s();
        for (j, (a, b)) in plus[o].to_f64s().iter().zip(minus[o].to_f64s()).enumerate() {
            let fd = (a - b) / (2.0 * EPS);
            assert!(
                close(dot[j], fd),
                "{name}: jvp output {o}[{j}]: {} vs finite difference {fd}\n{f}\njvp:\n{jvp}",
                dot[j]
            );
            n += 1;
        }
    }
    n
}

/// A spec example's entry function with its floats made f64, and its arguments likewise.
fn promoted_example(ex: &kiln_tests::Example) -> (Func, Vec<Literal>) {
    let (m, ex_args, _) = load_example(ex).unwrap();
    let promoted = parse_module(&to_f64(&kiln_ir::print_module(&m))).unwrap();
    let f = promoted.entry().unwrap().clone();
    let ex_args: Vec<Literal> = ex_args
        .iter()
        .zip(f.param_types())
        .map(|(a, t): (&Literal, TensorType)| {
            if t.dtype == DType::F64 {
                Literal::from_f64s(t, &a.to_f64s()).unwrap()
            } else {
                a.clone()
            }
        })
        .collect();
    (f, ex_args)
}

/// The forward mode through control flow, including loops whose trip count depends on the data
/// (which have no reverse mode), on every example of `while` and `case`.
#[test]
fn forward_mode_through_while_and_case_matches_finite_differences() {
    let mut rng = Rng::new(2027);
    for spec in load_specs() {
        if !matches!(spec.name.as_str(), "while" | "case") {
            continue;
        }
        let mut n_op = 0;
        for ex in &spec.examples {
            let (f, ex_args) = promoted_example(ex);
            for _ in 0..3 {
                n_op += check_modes(&spec.name, &f, &ex_args, &mut rng, false);
            }
        }
        assert!(
            n_op > 0,
            "{}: no example has a float input to check",
            spec.name
        );
    }
}

#[test]
fn every_differentiable_op_matches_finite_differences() {
    let mut rng = Rng::new(2026);
    let mut total = 0;
    let mut checked_ops = Vec::new();
    for spec in load_specs() {
        let kind = OpKind::from_mnemonic(&spec.name).unwrap();
        if !kind.props().contains(Props::DIFFERENTIABLE) {
            continue;
        }
        let mut n_op = 0;
        for ex in &spec.examples {
            let (f, ex_args) = promoted_example(ex);
            for _ in 0..2 {
                n_op += check(&spec.name, &f, &ex_args, &mut rng);
            }
        }
        assert!(
            n_op > 0,
            "{}: differentiable, but no example has a float input to check",
            spec.name
        );
        checked_ops.push(spec.name.clone());
        total += n_op;
    }
    println!(
        "{} differentiable ops, {total} derivative entries checked against finite differences",
        checked_ops.len()
    );
}
