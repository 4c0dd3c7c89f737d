//! The split of complex values into real parts (`kiln_kernel::complex::split_complex`) keeps
//! every program's meaning: the split program, run on the reference interpreter, gives the
//! original's results within a few ulps of the part type (relative to each result's larger
//! part), and leaves complex values only at the parameters, the results and the ops it keeps.

use kiln_ir::{DType, Func, Literal, Op, TensorType, parse_func_text, parse_literal};
use kiln_kernel::complex::split_complex;
use kiln_reference::compare::{Tolerance, check_close};

/// Complex values with parts of every kind the rewrites treat apart: zeros (signed),
/// infinities, NaN, tiny and huge magnitudes, ordinary values.
fn values(d: DType, n: usize, seed: u64) -> Literal {
    let special = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        0.75,
        3.0,
        1e-30,
        1e30,
        f64::INFINITY,
        f64::NAN,
        -7.0,
        0.125,
    ];
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let v: Vec<[f64; 2]> = (0..n)
        .map(|_| {
            let pick = |k: usize| {
                if k.is_multiple_of(3) {
                    special[k / 3 % special.len()]
                } else {
                    (k % 2001) as f64 / 100.0 - 10.0
                }
            };
            [pick(next()), pick(next())]
        })
        .collect();
    Literal::from_complex_f64s(TensorType::new(d, [n]), &v).unwrap()
}

fn check(src: &str, args: &[Literal]) {
    check_within(src, args, 8.0)
}

/// [`check`] within `ulps` of the part type.
fn check_within(src: &str, args: &[Literal], ulps: f64) {
    let f = parse_func_text(src).unwrap();
    let g = split_complex(&f).unwrap();
    kiln_ir::verify(&g).unwrap();
    // Complex values remain only where the parts are joined or split, and at kept ops.
    for inst in &g.insts {
        let complex = inst
            .operands
            .iter()
            .chain(&inst.results)
            .any(|v| g.values[v.index()].dtype.is_complex());
        assert!(
            !complex || matches!(inst.op, Op::BitcastConvert {} | Op::TriangularSolve { .. }),
            "{} kept on complex values in\n{g}",
            inst.op.mnemonic()
        );
    }
    let want = kiln_reference::eval(&f, args).unwrap();
    let got = kiln_reference::eval(&g, args).unwrap();
    for (w, o) in want.iter().zip(&got) {
        let tol = Tolerance::ulps(w.dtype(), ulps);
        if let Err(e) = check_close(o, w, tol) {
            panic!("{e}\nprogram:\n{src}\nsplit:\n{g}");
        }
    }
}

#[test]
fn arithmetic_on_parts_matches_the_reference() {
    for (d, p) in [(DType::C64, "f32"), (DType::C128, "f64")] {
        let t = d.name();
        for op in [
            "add", "subtract", "multiply", "divide", "maximum", "minimum",
        ] {
            check(
                &format!(
                    "func @main(%0: {t}[60], %1: {t}[60]) -> {t}[60] {{\n  %2 = {op} %0, %1 : {t}[60]\n  return %2\n}}\n"
                ),
                &[values(d, 60, 1), values(d, 60, 2)],
            );
        }
        // Equal real parts leave the order to the imaginary parts.
        for op in ["maximum", "minimum"] {
            check(
                &format!(
                    "func @main(%0: {t}[60], %1: {t}[60]) -> {t}[60] {{\n  %2 = real %0 : {p}[60]\n  %3 = imag %1 : {p}[60]\n  %4 = complex %2, %3 : {t}[60]\n  %5 = {op} %0, %4 : {t}[60]\n  return %5\n}}\n"
                ),
                &[values(d, 60, 1), values(d, 60, 2)],
            );
        }
        for op in ["negate", "exponential", "log", "sine", "cosine"] {
            check(
                &format!(
                    "func @main(%0: {t}[60]) -> {t}[60] {{\n  %1 = {op} %0 : {t}[60]\n  return %1\n}}\n"
                ),
                &[values(d, 60, 3)],
            );
        }
        check(
            &format!(
                "func @main(%0: {t}[60]) -> ({p}[60], {p}[60], {p}[60]) {{\n  %1 = abs %0 : {p}[60]\n  %2 = real %0 : {p}[60]\n  %3 = imag %0 : {p}[60]\n  return %1, %2, %3\n}}\n"
            ),
            &[values(d, 60, 4)],
        );
        check(
            &format!(
                "func @main(%0: {t}[60], %1: {t}[60]) -> (pred[60], pred[60], {t}[60]) {{\n  %2 = compare %0, %1 {{comparison_direction = EQ}} : pred[60]\n  %3 = compare %0, %0 {{comparison_direction = NE}} : pred[60]\n  %4 = select %2, %0, %1 : {t}[60]\n  return %2, %3, %4\n}}\n"
            ),
            &[values(d, 60, 5), values(d, 60, 5)],
        );
    }
}

#[test]
fn layout_products_reductions_and_conversions_match_the_reference() {
    let d = DType::C64;
    let x = values(d, 12, 7).reshaped([3, 4]).unwrap();
    let y = values(d, 12, 8).reshaped([4, 3]).unwrap();
    check(
        "func @main(%0: c64[3,4], %1: c64[4,3]) -> (c64[3,3], c64[4], c64[3,4], c64[4,3]) {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : c64[3,3]\n  %3 = constant {value = (0.0, 0.0)} : c64[]\n  %4 = reduce %0, %3 {dimensions = [0], kind = add} : c64[4]\n  %5 = transpose %1 {permutation = [1, 0]} : c64[3,4]\n  %6 = reverse %5 {dimensions = [1]} : c64[3,4]\n  %7 = slice %6 {start_indices = [0, 1], limit_indices = [3, 3], strides = [1, 1]} : c64[3,2]\n  %8 = pad %7, %3 {edge_padding_low = [0, 1], edge_padding_high = [0, 1], interior_padding = [0, 0]} : c64[3,4]\n  %9 = add %8, %0 : c64[3,4]\n  %10 = reshape %9 : c64[4,3]\n  return %2, %4, %9, %10\n}\n",
        &[x.clone(), y],
    );
    check(
        "func @main(%0: c64[3,4], %1: f32[3,4]) -> (f32[3,4], c128[3,4], c64[3,4], c64[3,8]) {\n  %2 = convert %0 : f32[3,4]\n  %3 = convert %0 : c128[3,4]\n  %4 = convert %1 : c64[3,4]\n  %5 = complex %1, %2 : c64[3,4]\n  %6 = concatenate %5, %4 {dimension = 1} : c64[3,8]\n  return %2, %3, %5, %6\n}\n",
        &[
            x,
            parse_literal(
                "[[1.5, -2.0, 0.0, 3.0], [nan, inf, -0.0, 1e-3], [7.0, 8.0, 9.0, 10.0]]",
                &TensorType::new(DType::F32, [3, 4]),
            )
            .unwrap(),
        ],
    );
}

/// The elementary functions of `kiln_kernel::complex_math`, on parts of every kind `values`
/// gives (zeros, infinities, NaN, tiny and huge parts), agree with the reference's special
/// values and formulas, and leave no complex value but the parameters' and results' bitcasts.
#[test]
fn elementary_functions_on_parts_match_the_reference() {
    for (d, ulps) in [(DType::C64, 16.0), (DType::C128, 16.0)] {
        let t = d.name();
        for op in [
            "sqrt",
            "rsqrt",
            "cbrt",
            "exponential_minus_one",
            "log_plus_one",
            "tan",
            "tanh",
            "sign",
            "logistic",
        ] {
            check_within(
                &format!(
                    "func @main(%0: {t}[96]) -> {t}[96] {{\n  %1 = {op} %0 : {t}[96]\n  return %1\n}}\n"
                ),
                &[values(d, 96, 11)],
                ulps,
            );
        }
        // A power's exponent without huge parts: w ln z of magnitude 1e30 has a phase no part
        // type resolves, so the sign of an overflowing result is noise in the reference too.
        // e^(w ln z) moves by |w ln z| times the rounding of w ln z (up to about 100 here): the
        // power's bound is that many times the others'. atan2 squares its operands (StableHLO's
        // formula): parts of 1e30 overflow in f32 where the reference's f64 squares do not; its
        // ln of a quotient of modulus near 1 cancels, so it has the power's bound.
        let moderate = |l: Literal| {
            let v: Vec<[f64; 2]> = l
                .to_complex_f64s()
                .iter()
                .map(|z| z.map(|x| if x.abs() >= 1e29 { 3.0 } else { x }))
                .collect();
            Literal::from_complex_f64s(l.ty().clone(), &v).unwrap()
        };
        for (op, z, w, bound) in [
            (
                "power",
                values(d, 96, 12),
                moderate(values(d, 96, 13)),
                100.0 * ulps,
            ),
            (
                "atan2",
                moderate(values(d, 96, 12)),
                moderate(values(d, 96, 13)),
                100.0 * ulps,
            ),
        ] {
            check_within(
                &format!(
                    "func @main(%0: {t}[96], %1: {t}[96]) -> {t}[96] {{\n  %2 = {op} %0, %1 : {t}[96]\n  return %2\n}}\n"
                ),
                &[z, w],
                bound,
            );
        }
    }
}

/// `reduce` with `multiply` is a tree of complex products, within the bound of a product of
/// its factors however they are ordered; an empty reduction is the init value.
#[test]
fn products_reduce_to_the_reference() {
    let pick = |k: usize| [0.5 + (k % 7) as f64 / 8.0, (k % 5) as f64 / 4.0 - 0.5];
    for n in [1usize, 2, 5, 7, 8] {
        let v: Vec<[f64; 2]> = (0..3 * n).map(pick).collect();
        let x = Literal::from_complex_f64s(TensorType::new(DType::C64, [3, n]), &v).unwrap();
        check_within(
            &format!(
                "func @main(%0: c64[3,{n}]) -> (c64[3], c64[{n}], c64[]) {{\n  %1 = constant {{value = (0.5, 2.0)}} : c64[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = mul}} : c64[3]\n  %3 = reduce %0, %1 {{dimensions = [0], kind = mul}} : c64[{n}]\n  %4 = reduce %0, %1 {{dimensions = [0, 1], kind = mul}} : c64[]\n  return %2, %3, %4\n}}\n"
            ),
            &[x],
            8.0 * (3 * n) as f64,
        );
    }
    check(
        "func @main(%0: c128[2,0]) -> c128[2] {\n  %1 = constant {value = (0.5, 2.0)} : c128[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = mul} : c128[2]\n  return %2\n}\n",
        &[Literal::from_complex_f64s(TensorType::new(DType::C128, [2, 0]), &[]).unwrap()],
    );
}

#[test]
fn ops_without_a_rewrite_keep_their_complex_values() {
    let a = values(DType::C128, 9, 9).reshaped([3, 3]).unwrap();
    check(
        "func @main(%0: c128[3,3], %1: c128[3,3]) -> c128[3,3] {\n  %2 = sqrt %1 : c128[3,3]\n  %3 = triangular_solve %0, %2 {left_side = true, lower = true, unit_diagonal = false, transpose_a = ADJOINT} : c128[3,3]\n  %4 = add %3, %2 : c128[3,3]\n  return %4\n}\n",
        &[a.clone(), a],
    );
}

#[test]
fn a_program_without_complex_values_is_left_alone() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = negate %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    assert_eq!(split_complex(&f).unwrap(), f);
}

/// Whether `got`, the split program's results on `args` (run on the reference), agree with
/// `want`, the original's, under the bounds of `kiln_reference::accuracy`: per output, the
/// ulps of the ops in its cone (for a complex op the bound of computing it on parts, as the
/// split does, in f32 steps for a `c64` where the reference rounds once from f64) grown
/// through the program by the magnitudes of what each result is computed from. The bits of a
/// complex number only moved (bitcast to an integer) are compared as that number.
fn split_agrees(
    f: &Func,
    args: &[Literal],
    got: &[Literal],
    want: &[Literal],
) -> Result<(), String> {
    kiln_reference::accuracy::check_outputs_against(f, args, got, want).map(|_| ())
}

/// Random programs with complex parameters (the generator's `with_complex`), split and run on
/// the reference, agree with the original under the accuracy bounds ([`split_agrees`]).
#[test]
fn random_complex_programs_keep_their_meaning() {
    use kiln_ir::random::{Config, Rng, random_func, random_literal};
    let (mut ran, mut failures) = (0, Vec::new());
    // Seeds 0 to 3,999, or those `KILN_COMPLEX_PROGRAMS` names (a count `N` or a range `A..B`).
    let knob = std::env::var("KILN_COMPLEX_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_COMPLEX_PROGRAMS", knob.as_deref(), 0..4000)
            .unwrap();
    for seed in seeds {
        let cfg = Config {
            ops: 1 + (seed as usize % 10),
            ..Config::default()
        }
        .with_complex();
        let f = random_func(&mut Rng::new(seed), &cfg);
        if !f.values.iter().any(|t| t.dtype.is_complex()) {
            continue;
        }
        let mut rng = Rng::new(seed ^ 0x5eed);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .enumerate()
            .map(|(k, t)| {
                if t.dtype.is_complex() {
                    values(t.dtype, t.numel(), seed * 31 + k as u64)
                        .reshaped(t.shape.clone())
                        .unwrap()
                } else {
                    random_literal(&mut rng, t)
                }
            })
            .collect();
        let g = split_complex(&f).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = kiln_reference::eval(&g, &args).unwrap();
        ran += 1;
        if let Err(e) = split_agrees(&f, &args, &got, &want) {
            failures.push(format!("seed {seed}: {e}\n{f}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} disagree:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(ran >= 500, "only {ran} programs with complex values");
}

/// `real` and `imag` of a real operand are rewritten like the others (the operand, and zeros):
/// a program without complex values keeps none of them for the reference interpreter.
#[test]
fn real_and_imag_of_real_operands_are_rewritten() {
    let src = "func @main(%0: f64[2]) -> (f64[2], f64[2]) {\n  %1 = real %0 : f64[2]\n  %2 = imag %0 : f64[2]\n  return %1, %2\n}\n";
    let f = parse_func_text(src).unwrap();
    let g = split_complex(&f).unwrap();
    assert!(
        !g.insts
            .iter()
            .any(|i| matches!(i.op, Op::Real {} | Op::Imag {} | Op::Complex {})),
        "{g}"
    );
    check(
        src,
        &[parse_literal("[2.5, -1.0]", &TensorType::new(DType::F64, [2])).unwrap()],
    );
}

/// The bitcasts between a complex tensor and its parts' interleaved layout (the part type with a
/// trailing dimension of 2) are kernels: byte copies, which compute nothing complex.
#[test]
fn complex_bitcasts_are_byte_copies() {
    let c = TensorType::new(DType::C64, [3]);
    let p = TensorType::new(DType::F32, [3, 2]);
    for (x, out) in [(&c, &p), (&p, &c)] {
        let k = kiln_kernel::lower::lower(&Op::BitcastConvert {}, std::slice::from_ref(x), out)
            .unwrap_or_else(|e| panic!("{x} -> {out}: {e}"));
        assert_eq!(k.out, TensorType::new(DType::I8, [24]));
    }
    // Any other op on a complex operand still has no kernel of its own.
    assert!(kiln_kernel::lower::lower(&Op::Negate {}, std::slice::from_ref(&c), &c).is_err());
}

/// The two random programs whose split the old comparison (64 ulps of the part type, integers
/// exactly) refused agree under the accuracy bounds, and the comparison still refuses a wrong
/// split: the same programs' split with its first `subtract` made an `add`. Seed 8345 bitcasts
/// a `c64` product to `i64` (one ulp of the product is one in the integer); seed 9705 is
/// `power(x, tanh x)` of a tiny number, whose rounding grows with the exponent's error, 68
/// ulps where the old comparison allowed 64.
#[test]
fn seeds_8345_and_9705_agree_under_the_accuracy_bounds_and_a_wrong_split_does_not() {
    let programs = [
        (
            8345,
            "func @main(%0: c64[1,4]) -> i64[1,4] {\n  %1 = multiply %0, %0 : c64[1,4]\n  %2 = bitcast_convert %1 : i64[1,4]\n  %3 = reverse %2 {dimensions = [0]} : i64[1,4]\n  return %3\n}\n",
        ),
        (
            9705,
            "func @main(%0: c64[]) -> c64[] {\n  %1 = tanh %0 : c64[]\n  %2 = power %0, %1 : c64[]\n  return %2\n}\n",
        ),
    ];
    for (seed, src) in programs {
        let f = parse_func_text(src).unwrap();
        // The random test's arguments of that seed (its only parameter is number 0).
        let t = f.param_types()[0].clone();
        let args = [values(t.dtype, t.numel(), seed * 31)
            .reshaped(t.shape.clone())
            .unwrap()];
        let mut g = split_complex(&f).unwrap();
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = kiln_reference::eval(&g, &args).unwrap();
        split_agrees(&f, &args, &got, &want).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{g}"));
        let sub = g
            .insts
            .iter()
            .position(|i| matches!(i.op, Op::Subtract {}))
            .unwrap_or_else(|| panic!("seed {seed}: no subtract in\n{g}"));
        g.insts[sub].op = Op::Add {};
        let wrong = kiln_reference::eval(&g, &args).unwrap();
        assert!(
            split_agrees(&f, &args, &wrong, &want).is_err(),
            "seed {seed}: a wrong split passes\n{g}"
        );
    }
}
