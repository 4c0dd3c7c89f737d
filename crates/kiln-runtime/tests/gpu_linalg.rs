//! `cholesky`, `triangular_solve` and `lu` (a thread per problem, `MapKind::Linalg`) and sorts
//! by any comparator (the reference's merge sort, a thread per slice) on the GPU emulator,
//! against the reference: every dtype the kernels take (complex solves too), batches, every
//! form of a solve, matrices that are not positive definite, zero and NaN pivots, pivots of
//! equal magnitude, comparators that are not one key's order (NaN left unordered among them),
//! slices at and around the merge sort's insertion length, empty batches and slices, and a GPU
//! of one small block, whose threads take several problems each. No step runs on the host but a
//! factorization of a matrix past `gpu::linalg::LARGEST`, which is meant to.

use kiln_ir::random::Rng;
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

/// An H200, and a GPU of one multiprocessor running one block of a warp (so a launch's
/// threads each take several problems).
fn targets() -> [TargetInfo; 2] {
    let mut small = TargetInfo::h200();
    let gpu = small.gpu.as_mut().expect("a GPU");
    gpu.sms = 1;
    gpu.blocks_per_sm = 1;
    gpu.elementwise_block = 32;
    [TargetInfo::h200(), small]
}

/// Runs `src` on `args` on each target: its results within the reference's bounds, every
/// step a kernel step, and one launch of mapping `kind` (none for empty results).
fn check(src: &str, args: &[Literal], kind: MapKind) -> Result<(), String> {
    let f: Func = kiln_ir::parse_func_text(src).map_err(|e| format!("{e}\n{src}"))?;
    for target in targets() {
        let opts = kiln_kernel::Options::default();
        let (got, rep) =
            compile_and_run(&f, &[], &opts, &target, args).map_err(|e| format!("{e}\n{src}"))?;
        kiln_reference::accuracy::check_outputs(&f, args, &got)
            .map_err(|e| format!("{e}\n{src}"))?;
        if rep.interpreted > 0 || !rep.fallbacks.is_empty() {
            return Err(format!("on the host: {rep:?}\n{src}"));
        }
        let empty = f.outputs.iter().all(|o| f.values[o.index()].numel() == 0);
        let want = if empty { None } else { Some(&1) };
        if rep.launches.get(&kind) != want {
            return Err(format!("launches {:?}\n{src}", rep.launches));
        }
    }
    Ok(())
}

fn literal(dt: DType, shape: &[usize], v: &[f64]) -> Literal {
    Literal::from_f64s(TensorType::new(dt, shape.to_vec()), v).expect("consistent")
}

fn uniform(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// `batch` symmetric positive definite `n x n` matrices (`m mᵀ + n I`).
fn spd(rng: &mut Rng, batch: usize, n: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for _ in 0..batch {
        let m = uniform(rng, n * n);
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|k| m[i * n + k] * m[j * n + k]).sum();
                out.push(dot + if i == j { n as f64 } else { 0.0 });
            }
        }
    }
    out
}

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

#[test]
fn cholesky_on_the_emulator() {
    let mut rng = Rng::new(7);
    let mut failures = Vec::new();
    for dt in FLOATS {
        for (batch, n) in [(0, 3), (2, 0), (1, 1), (1, 3), (2, 5), (40, 4)] {
            for lower in [true, false] {
                let shape = [batch, n, n];
                let t = format!("{dt}[{batch},{n},{n}]");
                let src = format!(
                    "func @main(%0: {t}) -> {t} {{\n  %1 = cholesky %0 {{lower = {lower}}} : {t}\n  return %1\n}}\n"
                );
                let mut v = spd(&mut rng, batch, n);
                if batch > 1 && n > 0 {
                    // The second matrix is not positive definite: all NaN.
                    v[n * n] = -1.0;
                }
                if let Err(e) = check(&src, &[literal(dt, &shape, &v)], MapKind::Linalg) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn triangular_solves_of_every_form_on_the_emulator() {
    let mut rng = Rng::new(11);
    let mut failures = Vec::new();
    let mut cases = Vec::new();
    for left in [true, false] {
        for lower in [true, false] {
            for unit in [true, false] {
                for tr in ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"] {
                    cases.push((DType::F32, 2, 4, 3, left, lower, unit, tr));
                }
            }
        }
    }
    for dt in FLOATS {
        cases.push((dt, 3, 5, 2, true, true, false, "NO_TRANSPOSE"));
        cases.push((dt, 1, 3, 4, false, false, false, "TRANSPOSE"));
    }
    // Many right-hand sides: several per thread on the small GPU.
    cases.push((DType::F32, 2, 3, 50, true, false, false, "NO_TRANSPOSE"));
    // Empty systems (0 x 0 matrices) on either side, either triangle; and no right-hand side
    // (random program 42731's upper solve of a 0 x 0 matrix stopped the mapping on an
    // overflow: its last row is n - 1).
    for left in [true, false] {
        for lower in [true, false] {
            cases.push((DType::F32, 2, 0, 3, left, lower, false, "NO_TRANSPOSE"));
            cases.push((DType::F32, 2, 3, 0, left, lower, false, "TRANSPOSE"));
        }
    }
    // Complex systems, solved on their parts: every side and triangle, the adjoint
    // conjugating, a unit diagonal.
    for dt in [DType::C64, DType::C128] {
        for left in [true, false] {
            for lower in [true, false] {
                for tr in ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"] {
                    cases.push((dt, 2, 3, 2, left, lower, tr == "TRANSPOSE", tr));
                }
                // Empty complex systems, and none to solve.
                cases.push((dt, 2, 0, 3, left, lower, false, "ADJOINT"));
                cases.push((dt, 1, 3, 0, left, lower, false, "NO_TRANSPOSE"));
            }
        }
    }
    for (dt, batch, n, m, left, lower, unit, tr) in cases {
        let a_shape = [batch, n, n];
        let b_shape = if left { [batch, n, m] } else { [batch, m, n] };
        let ty = |s: [usize; 3]| format!("{dt}[{},{},{}]", s[0], s[1], s[2]);
        let src = format!(
            "func @main(%0: {a}, %1: {b}) -> {b} {{\n  %2 = triangular_solve %0, %1 {{left_side = {left}, lower = {lower}, unit_diagonal = {unit}, transpose_a = {tr}}} : {b}\n  return %2\n}}\n",
            a = ty(a_shape),
            b = ty(b_shape)
        );
        // A dominant diagonal keeps the systems well conditioned.
        let mut a = uniform(&mut rng, batch * n * n);
        for k in 0..batch {
            for i in 0..n {
                a[k * n * n + i * n + i] = 2.0 + i as f64;
            }
        }
        let b = uniform(&mut rng, batch * n * m);
        let args = if dt.is_complex() {
            // The imaginary parts: smaller than the real ones off the diagonal, and larger on
            // some of it, so Smith's division takes both of its branches.
            let complex = |re: &[f64], rng: &mut Rng, diagonal: bool| -> Vec<[f64; 2]> {
                re.iter()
                    .enumerate()
                    .map(|(k, &x)| {
                        let on = diagonal && (k % (n * n)) % (n + 1) == 0;
                        let y = if on && k % 2 == 0 {
                            3.0 * x + 1.0
                        } else {
                            rng.uniform(-0.5, 0.5)
                        };
                        [x, y]
                    })
                    .collect()
            };
            let ca = complex(&a, &mut rng, true);
            let cb = complex(&b, &mut rng, false);
            let lit = |s: &[usize], v: &[[f64; 2]]| {
                Literal::from_complex_f64s(TensorType::new(dt, s.to_vec()), v).expect("consistent")
            };
            [lit(&a_shape, &ca), lit(&b_shape, &cb)]
        } else {
            [literal(dt, &a_shape, &a), literal(dt, &b_shape, &b)]
        };
        if let Err(e) = check(&src, &args, MapKind::Linalg) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Complex systems whose parts are subnormal (`c64` below 2^-126, `c128` below 2^-1022): the
/// quotients by the diagonal scale a tiny numerator and divisor up first, as the reference's
/// division does, so no bits go in the subnormal range.
#[test]
fn complex_solves_of_subnormal_parts_on_the_emulator() {
    for (dt, s) in [
        (DType::C64, 2f64.powi(-140)),
        (DType::C128, 2f64.powi(-1060)),
    ] {
        let src = format!(
            "func @main(%0: {dt}[1,2,2], %1: {dt}[1,2,2]) -> {dt}[1,2,2] {{\n  %2 = triangular_solve %0, %1 {{left_side = true, lower = true, unit_diagonal = false, transpose_a = NO_TRANSPOSE}} : {dt}[1,2,2]\n  return %2\n}}\n"
        );
        let lit = |v: [[f64; 2]; 4]| {
            let v = v.map(|[x, y]| [x * s, y * s]);
            Literal::from_complex_f64s(TensorType::new(dt, [1, 2, 2]), &v).unwrap()
        };
        let a = lit([[3.0, 1.0], [0.0, 0.0], [1.0, -2.0], [2.0, 5.0]]);
        let b = lit([[1.0, 2.0], [-1.0, 0.5], [0.25, 1.0], [3.0, -1.0]]);
        check(&src, &[a, b], MapKind::Linalg).unwrap();
    }
}

#[test]
fn lu_on_the_emulator() {
    let mut rng = Rng::new(13);
    let mut failures = Vec::new();
    let mut cases: Vec<(DType, usize, usize, Vec<f64>)> = Vec::new();
    for dt in FLOATS {
        cases.push((dt, 3, 5, uniform(&mut rng, 75)));
    }
    cases.push((DType::F32, 40, 3, uniform(&mut rng, 360)));
    // 0 x 0 matrices: empty results, nothing launched.
    cases.push((DType::F32, 2, 0, Vec::new()));
    // A zero column (its pivot is zero: the column below stays undivided), pivots of equal
    // magnitude (the first is kept), and a NaN (the largest).
    cases.push((
        DType::F32,
        3,
        3,
        vec![
            0.0,
            1.0,
            2.0,
            0.0,
            3.0,
            4.0,
            0.0,
            5.0,
            7.0, //
            1.0,
            2.0,
            0.5,
            -1.0,
            3.0,
            1.0,
            1.0,
            -2.0,
            4.0, //
            1.0,
            2.0,
            3.0,
            f64::NAN,
            1.0,
            0.0,
            2.0,
            0.0,
            1.0,
        ],
    ));
    for (dt, batch, n, v) in cases {
        let t = format!("{dt}[{batch},{n},{n}]");
        let p = format!("i32[{batch},{n}]");
        let src = format!(
            "func @main(%0: {t}) -> ({t}, {p}, {p}) {{\n  %1, %2, %3 = lu %0 : {t}, {p}, {p}\n  return %1, %2, %3\n}}\n"
        );
        if let Err(e) = check(&src, &[literal(dt, &[batch, n, n], &v)], MapKind::Linalg) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A sort of `x: dt[shape]` along `dim` by a comparator with body `body` (over `%0`, `%1`,
/// the two elements, of `dt[]`), returning the sorted tensor; with `values`, an i32 operand
/// sorted along with it.
fn sort_src(dt: DType, shape: &[usize], dim: usize, body: &str, values: bool) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let t = format!("{dt}[{}]", dims.join(","));
    let v = format!("i32[{}]", dims.join(","));
    if values {
        format!(
            "func @main(%0: {t}, %1: {v}) -> ({t}, {v}) {{\n  %2, %3 = sort %0, %1 {{dimension = {dim}, is_stable = true, comparator = func @c(%0: {dt}[], %1: {dt}[], %2: i32[], %3: i32[]) -> pred[] {{\n{body}    }}}} : {t}, {v}\n  return %2, %3\n}}\n"
        )
    } else {
        format!(
            "func @main(%0: {t}) -> {t} {{\n  %1 = sort %0 {{dimension = {dim}, is_stable = true, comparator = func @c(%0: {dt}[], %1: {dt}[]) -> pred[] {{\n{body}    }}}} : {t}\n  return %1\n}}\n"
        )
    }
}

#[test]
fn sorts_by_any_comparator_on_the_emulator() {
    let lt = "      %2 = compare %0, %1 {comparison_direction = LT} : pred[]\n      return %2\n";
    let by_abs = "      %2 = abs %0 : DT[]\n      %3 = abs %1 : DT[]\n      %4 = compare %2, %3 {comparison_direction = LT} : pred[]\n      return %4\n";
    // Not a strict weak order at all: "goes before" when the first is below the second + 1.
    let loose = "      %2 = constant {value = 1.0} : DT[]\n      %3 = add %1, %2 : DT[]\n      %4 = compare %0, %3 {comparison_direction = LT} : pred[]\n      return %4\n";
    let mut rng = Rng::new(17);
    let mut failures = Vec::new();
    for dt in [DType::F32, DType::F64, DType::F16] {
        for body in [lt, by_abs, loose] {
            let body = body.replace("DT", &dt.to_string());
            for shape in [
                vec![0],
                vec![1],
                vec![8],
                vec![9],
                vec![17],
                vec![40],
                vec![3, 23],
                vec![70, 2],
            ] {
                let dim = if shape == [70, 2] { 0 } else { shape.len() - 1 };
                let n: usize = shape.iter().product();
                // Few distinct values (ties), negative zeros and NaNs.
                let v: Vec<f64> = (0..n)
                    .map(|_| match rng.below(12) {
                        0 => f64::NAN,
                        1 => -0.0,
                        2 => 0.0,
                        _ => (rng.below(9) as f64 - 4.0) * 0.5,
                    })
                    .collect();
                let src = sort_src(dt, &shape, dim, &body, false);
                if let Err(e) = check(&src, &[literal(dt, &shape, &v)], MapKind::Sort) {
                    failures.push(e);
                }
            }
        }
    }
    // Two keys: by the first, ties by the second descending; the values move along.
    let two = "      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %5 = compare %0, %1 {comparison_direction = EQ} : pred[]\n      %6 = compare %2, %3 {comparison_direction = GT} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8\n";
    let shape = [4, 30];
    let keys: Vec<f64> = (0..120).map(|_| rng.below(4) as f64).collect();
    let values: Vec<f64> = (0..120).map(|_| rng.below(50) as f64).collect();
    let src = sort_src(DType::F32, &shape, 1, two, true);
    let args = [
        literal(DType::F32, &shape, &keys),
        literal(DType::I32, &shape, &values),
    ];
    if let Err(e) = check(&src, &args, MapKind::Sort) {
        failures.push(e);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Matrices larger than `gpu::linalg::LARGEST` stay with the host's blocked routines: a host
/// step, not a fallback, and the results still within the bounds.
#[test]
fn large_matrices_stay_on_the_host() {
    let n = kiln_kernel::gpu::linalg::LARGEST + 1;
    let t = format!("f32[{n},{n}]");
    let src = format!(
        "func @main(%0: {t}) -> {t} {{\n  %1 = cholesky %0 {{lower = true}} : {t}\n  return %1\n}}\n"
    );
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let args = [literal(DType::F32, &[n, n], &spd(&mut Rng::new(3), 1, n))];
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, &TargetInfo::h200(), &args).unwrap();
    kiln_reference::accuracy::check_outputs(&f, &args, &got).unwrap();
    assert_eq!(rep.interpreted_ops, ["cholesky"], "{rep:?}");
    assert!(
        rep.fallbacks.is_empty() && rep.launches.is_empty(),
        "{rep:?}"
    );
}
