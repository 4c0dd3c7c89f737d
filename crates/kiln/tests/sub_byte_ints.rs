//! The sub-byte integers `i4`, `u4`, `i2`, `u2`: every elementwise integer op, conversion and
//! reduction compiled for the CPU against the reference interpreter, on every input value (every
//! pair for binary ops), with the compiled results kept in range; a few answers checked by
//! hand (wrapping, division, shifts); and the front end (eager and `jit`) on `i4`.

use kiln::{DType, Tensor, jit};
use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::{Literal, TensorType};

const SUB_BYTE: [DType; 4] = [DType::I4, DType::U4, DType::I2, DType::U2];

/// Every value of `d`, in order.
fn values(d: DType) -> Vec<i64> {
    let (lo, hi) = d.int_bounds().unwrap();
    (lo as i64..=hi as i64).collect()
}

/// Every pair of values of `d`, as two columns.
fn pairs(d: DType) -> (Vec<i64>, Vec<i64>) {
    let v = values(d);
    let a = v.iter().flat_map(|&x| v.iter().map(move |_| x)).collect();
    let b = v.iter().flat_map(|_| v.iter().copied()).collect();
    (a, b)
}

fn lit(d: DType, v: &[i64]) -> Literal {
    Literal::from_i64s(TensorType::new(d, [v.len()]), v).unwrap()
}

/// Runs the program `text` on the reference interpreter and compiled for the CPU (all of it in
/// kernels, none handed to the reference), asserts the two agree and that every compiled
/// sub-byte result is in its type's range, and returns the results.
fn run(text: &str, args: &[Literal]) -> Vec<Literal> {
    let f = kiln_ir::parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let want = kiln_reference::eval(&f, args).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = CpuExecutable::compile(&f).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(
        exe.plan().iter().all(|s| *s != Step::Reference),
        "a step ran on the reference:\n{text}"
    );
    let got = exe.run(args).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for (g, w) in got.iter().zip(&want) {
        // `Literal::new` refuses sub-byte values out of range: the kernel's bytes must be.
        Literal::new(g.ty().clone(), g.data().clone())
            .unwrap_or_else(|e| panic!("compiled result out of range: {e}\n{text}"));
        assert_eq!(g, w, "CPU and reference differ\n{text}\nargs {args:?}");
    }
    want
}

const BINARY: [&str; 14] = [
    "add",
    "subtract",
    "multiply",
    "divide",
    "remainder",
    "maximum",
    "minimum",
    "power",
    "and",
    "or",
    "xor",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
];

const UNARY: [&str; 6] = [
    "negate",
    "abs",
    "sign",
    "not",
    "popcnt",
    "count_leading_zeros",
];

#[test]
fn every_binary_op_on_every_pair_agrees_with_the_reference() {
    for d in SUB_BYTE {
        let (a, b) = pairs(d);
        let n = a.len();
        let args = [lit(d, &a), lit(d, &b)];
        for op in BINARY {
            let text = format!(
                "func @main(%0: {d}[{n}], %1: {d}[{n}]) -> {d}[{n}] {{\n  %2 = {op} %0, %1 : {d}[{n}]\n  return %2\n}}\n"
            );
            run(&text, &args);
        }
        for dir in ["EQ", "NE", "LT", "LE", "GT", "GE"] {
            let text = format!(
                "func @main(%0: {d}[{n}], %1: {d}[{n}]) -> pred[{n}] {{\n  %2 = compare %0, %1 {{comparison_direction = {dir}}} : pred[{n}]\n  return %2\n}}\n"
            );
            run(&text, &args);
        }
    }
}

#[test]
fn every_unary_op_and_clamp_and_select_agree_with_the_reference() {
    for d in SUB_BYTE {
        let v = values(d);
        let n = v.len();
        for op in UNARY {
            if !d.is_signed() && matches!(op, "abs" | "sign") {
                // Defined on signed types only (`abs_c2`, `sign_c2`).
                continue;
            }
            let text = format!(
                "func @main(%0: {d}[{n}]) -> {d}[{n}] {{\n  %1 = {op} %0 : {d}[{n}]\n  return %1\n}}\n"
            );
            run(&text, &[lit(d, &v)]);
        }
        let (a, b) = pairs(d);
        let m = a.len();
        let (lo, hi) = (a.clone(), b.clone());
        let x: Vec<i64> = (0..m).map(|i| v[i % n]).collect();
        let text = format!(
            "func @main(%0: {d}[{m}], %1: {d}[{m}], %2: {d}[{m}]) -> {d}[{m}] {{\n  %3 = clamp %0, %1, %2 : {d}[{m}]\n  return %3\n}}\n"
        );
        run(&text, &[lit(d, &lo), lit(d, &x), lit(d, &hi)]);
        let p: Vec<i64> = (0..m as i64).map(|i| i % 3 % 2).collect();
        let text = format!(
            "func @main(%0: pred[{m}], %1: {d}[{m}], %2: {d}[{m}]) -> {d}[{m}] {{\n  %3 = select %0, %1, %2 : {d}[{m}]\n  return %3\n}}\n"
        );
        run(&text, &[lit(DType::Pred, &p), lit(d, &a), lit(d, &b)]);
    }
}

#[test]
fn conversions_to_and_from_every_dtype_agree_with_the_reference() {
    let floats = [
        -100.0, -9.0, -8.5, -8.0, -2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0, 7.0, 7.5, 15.0, 15.9,
        16.0, 300.0,
    ];
    for d in SUB_BYTE {
        let v = values(d);
        let n = v.len();
        // Complex results are joined from their parts on the reference interpreter, which
        // `run` refuses: the real types only.
        for to in DType::ALL.into_iter().filter(|t| !t.is_complex()) {
            let text = format!(
                "func @main(%0: {d}[{n}]) -> {to}[{n}] {{\n  %1 = convert %0 : {to}[{n}]\n  return %1\n}}\n"
            );
            let out = run(&text, &[lit(d, &v)]);
            if to.mini().is_some() {
                // Rounded once to the small float (f4e2m1fn has no 5; f8e8m0fnu no negatives).
                let want: Vec<u64> = v
                    .iter()
                    .map(|&x| kiln_ir::literal::round_to(to, x as f64).to_bits())
                    .collect();
                let got: Vec<u64> = out[0].to_f64s().iter().map(|x| x.to_bits()).collect();
                let nan = |b: &u64| f64::from_bits(*b).is_nan();
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(g, w)| g == w || nan(g) && nan(w)),
                    "{d} to {to}: {got:?}"
                );
            } else if to.is_float() || to.int_bounds().unwrap().1 >= 15 && to.is_signed() {
                // Exact: every value of the narrow type is one of these.
                assert_eq!(
                    out[0].to_f64s(),
                    v.iter().map(|&x| x as f64).collect::<Vec<_>>()
                );
            }
            // Into the narrow type: integers wrap, floats truncate and saturate.
            let (src, m) = if to.is_float() {
                let f: Vec<f64> = floats.to_vec();
                let len = f.len();
                (
                    Literal::from_f64s(TensorType::new(to, [len]), &f).unwrap(),
                    len,
                )
            } else {
                let wide: Vec<i64> = (-40..40).collect();
                let l = Literal::from_i64s(TensorType::new(to, [80]), &wide).unwrap();
                (l, 80)
            };
            let text = format!(
                "func @main(%0: {to}[{m}]) -> {d}[{m}] {{\n  %1 = convert %0 : {d}[{m}]\n  return %1\n}}\n"
            );
            run(&text, &[src]);
        }
    }
    // By hand: i32 to i4 wraps, f32 to i4 truncates toward zero and saturates, u4 to i2 wraps.
    let wrap = run(
        "func @main(%0: i32[4]) -> i4[4] {\n  %1 = convert %0 : i4[4]\n  return %1\n}\n",
        &[lit(DType::I32, &[8, 17, -9, 100])],
    );
    assert_eq!(wrap[0].to_i64s(), [-8, 1, 7, 4]);
    let sat = run(
        "func @main(%0: f32[5]) -> i4[5] {\n  %1 = convert %0 : i4[5]\n  return %1\n}\n",
        &[Literal::f32([5], vec![7.9, -8.9, 100.0, -2.5, f32::NAN]).unwrap()],
    );
    assert_eq!(sat[0].to_i64s(), [7, -8, 7, -2, 0]);
    let narrow = run(
        "func @main(%0: u4[4]) -> i2[4] {\n  %1 = convert %0 : i2[4]\n  return %1\n}\n",
        &[lit(DType::U4, &[2, 3, 5, 15])],
    );
    assert_eq!(narrow[0].to_i64s(), [-2, -1, 1, -1]);
}

#[test]
fn reductions_and_bitcasts_agree_with_the_reference() {
    for d in SUB_BYTE {
        let (a, _) = pairs(d);
        let n = values(d).len();
        for (kind, init) in [
            ("add", 0),
            ("mul", 1),
            ("max", d.int_bounds().unwrap().0 as i64),
            ("min", d.int_bounds().unwrap().1 as i64),
            ("and", -1),
            ("or", 0),
        ] {
            let text = format!(
                "func @main(%0: {d}[{n},{n}], %1: {d}[]) -> {d}[{n}] {{\n  %2 = reduce %0, %1 {{dimensions = [1], kind = {kind}}} : {d}[{n}]\n  return %2\n}}\n"
            );
            let x = Literal::from_i64s(TensorType::new(d, [n, n]), &a).unwrap();
            let init = Literal::from_i64s(TensorType::scalar(d), &[init]).unwrap();
            run(&text, &[x, init]);
        }
        let other = match d {
            DType::I4 => DType::U4,
            DType::U4 => DType::I4,
            DType::I2 => DType::U2,
            _ => DType::I2,
        };
        let v = values(d);
        let text = format!(
            "func @main(%0: {d}[{n}]) -> {other}[{n}] {{\n  %1 = bitcast_convert %0 : {other}[{n}]\n  return %1\n}}\n"
        );
        let out = run(&text, &[lit(d, &v)]);
        let bits = d.bits();
        let want: Vec<i64> = v
            .iter()
            .map(|&x| kiln_ir::literal::wrap_to(other, x & ((1 << bits) - 1)))
            .collect();
        assert_eq!(out[0].to_i64s(), want, "{d} as {other}");
    }
}

#[test]
fn i4_arithmetic_wraps_as_stablehlo_says() {
    let d = DType::I4;
    let bin = |op: &str, a: &[i64], b: &[i64]| {
        let n = a.len();
        let text = format!(
            "func @main(%0: i4[{n}], %1: i4[{n}]) -> i4[{n}] {{\n  %2 = {op} %0, %1 : i4[{n}]\n  return %2\n}}\n"
        );
        run(&text, &[lit(d, a), lit(d, b)])[0].to_i64s()
    };
    assert_eq!(bin("add", &[7, -8, 3], &[1, -1, 4]), [-8, 7, 7]);
    assert_eq!(bin("multiply", &[4, -3, 7], &[2, 3, 7]), [-8, 7, 1]);
    // Division truncates; x / 0 is -1, x % 0 is x, -8 / -1 wraps to -8.
    assert_eq!(
        bin("divide", &[7, -7, 5, -8], &[2, 2, 0, -1]),
        [3, -3, -1, -8]
    );
    assert_eq!(
        bin("remainder", &[7, -7, 5, -8], &[2, 2, 0, -1]),
        [1, -1, 5, 0]
    );
    // Shifts by 4 or more (or a negative amount) give 0, or the sign for the arithmetic one.
    assert_eq!(
        bin("shift_left", &[1, 1, 3, 1], &[3, 4, 2, -1]),
        [-8, 0, -4, 0]
    );
    assert_eq!(
        bin("shift_right_logical", &[-8, -1, 7], &[1, 3, 4]),
        [4, 1, 0]
    );
    assert_eq!(
        bin("shift_right_arithmetic", &[-8, -1, 7], &[1, 5, 4]),
        [-4, -1, 0]
    );
    let u = DType::U4;
    let text = "func @main(%0: u4[3], %1: u4[3]) -> u4[3] {\n  %2 = subtract %0, %1 : u4[3]\n  return %2\n}\n";
    assert_eq!(
        run(text, &[lit(u, &[0, 3, 15]), lit(u, &[1, 5, 15])])[0].to_i64s(),
        [15, 14, 0]
    );
}

/// `f` eagerly and under `jit`, which must agree.
fn both(f: impl Fn(&Tensor) -> Tensor, a: &Tensor) -> Tensor {
    let eager = f(a);
    let traced = jit(|a: &Tensor| f(a)).call(a).unwrap();
    assert_eq!(
        eager.to_literal().unwrap(),
        traced.to_literal().unwrap(),
        "eager and jit differ"
    );
    eager
}

#[test]
fn i4_tensors_wrap_promote_and_reduce_eagerly_and_under_jit() {
    let a = Tensor::from_vec(vec![7i8, -8, 3, -1, 5, 0], [2, 3])
        .unwrap()
        .cast(DType::I4);
    assert_eq!(a.dtype(), DType::I4);
    let s = both(|a| a + a, &a);
    assert_eq!(s.dtype(), DType::I4);
    assert_eq!(
        s.cast(DType::I8).to_vec::<i8>().unwrap(),
        [-2, 0, 6, -2, -6, 0]
    );
    // A weak integer scalar keeps i4 (and wraps); i4 with i8 is i8, with u4 it is i8 too.
    let p = both(|a| a + 1, &a);
    assert_eq!(p.dtype(), DType::I4);
    assert_eq!(
        p.cast(DType::I8).to_vec::<i8>().unwrap(),
        [-8, -7, 4, 0, 6, 1]
    );
    let wide = both(|a| a + &a.cast(DType::I8), &a);
    assert_eq!(wide.dtype(), DType::I8);
    assert_eq!(wide.to_vec::<i8>().unwrap(), [14, -16, 6, -2, 10, 0]);
    let mixed = both(|a| a.cast(DType::U4) + a, &a);
    assert_eq!(mixed.dtype(), DType::I8);
    assert_eq!(mixed.to_vec::<i8>().unwrap(), [14, 0, 6, 14, 10, 0]);
    let m = both(|a| a.max(&[1], false), &a);
    assert_eq!(m.cast(DType::I8).to_vec::<i8>().unwrap(), [7, 5]);
    let t = both(|a| a.transpose(&[1, 0]).reshape(&[6]), &a);
    assert_eq!(
        t.cast(DType::I8).to_vec::<i8>().unwrap(),
        [7, -1, -8, 5, 3, 0]
    );
    let f = both(|a| a.cast(DType::F32) * 0.5, &a);
    assert_eq!(f.to_vec::<f32>().unwrap(), [3.5, -4.0, 1.5, -0.5, 2.5, 0.0]);
    let b = both(|a| a.bitcast(DType::U4), &a);
    assert_eq!(
        b.cast(DType::U8).to_vec::<u8>().unwrap(),
        [7, 8, 3, 15, 5, 0]
    );
}

#[test]
fn a_bitcast_of_i4_to_i8_is_an_error_naming_the_line() {
    let a = Tensor::from_vec(vec![1i8, 2], [2]).unwrap().cast(DType::I4);
    let line = line!() + 1;
    let e = a.bitcast(DType::I8).to_literal().unwrap_err().to_string();
    assert!(
        e.contains("bitcast") && e.contains("i4 as i8") && e.contains(&format!(":{line}")),
        "{e}"
    );
}

#[test]
fn npy_files_hold_sub_byte_tensors_as_bytes() {
    let a = Tensor::from_vec(vec![-8i8, 7, -1], [3])
        .unwrap()
        .cast(DType::I4);
    let back = kiln::npy::from_npy_bytes(&kiln::npy::to_npy_bytes(&a).unwrap()).unwrap();
    assert_eq!(back.dtype(), DType::I8);
    assert_eq!(back.to_vec::<i8>().unwrap(), [-8, 7, -1]);
    let u = Tensor::from_vec(vec![3u8, 0, 2], [3])
        .unwrap()
        .cast(DType::U2);
    let back = kiln::npy::from_npy_bytes(&kiln::npy::to_npy_bytes(&u).unwrap()).unwrap();
    assert_eq!(back.dtype(), DType::U8);
    assert_eq!(back.to_vec::<u8>().unwrap(), [3, 0, 2]);
}

#[test]
fn checkpoints_keep_sub_byte_leaves_and_refuse_bytes_out_of_range() {
    use kiln::checkpoint::{self, Metadata};
    let i4 = Tensor::from_vec(vec![-8i8, 7, -1, 0], [2, 2])
        .unwrap()
        .cast(DType::I4);
    let u2 = Tensor::from_vec(vec![3u8, 1], [2]).unwrap().cast(DType::U2);
    let tree = (i4.clone(), u2.clone());
    let bytes = checkpoint::to_bytes(&tree, &Metadata::new(1)).unwrap();
    let ((a, b), _) = checkpoint::from_bytes(&bytes, &tree).unwrap();
    assert_eq!(a.to_literal().unwrap(), i4.to_literal().unwrap());
    assert_eq!(b.to_literal().unwrap(), u2.to_literal().unwrap());
    // Bytes saved from an i8 leaf load into an i4 one only when every value fits.
    let wide = (
        Tensor::from_vec(vec![-8i8, 7, 100, 0], [2, 2]).unwrap(),
        Tensor::from_vec(vec![3u8, 1], [2]).unwrap(),
    );
    let bytes = checkpoint::to_bytes(&wide, &Metadata::new(1)).unwrap();
    let e = checkpoint::from_bytes(&bytes, &tree)
        .unwrap_err()
        .to_string();
    assert!(e.contains("100 is out of range for i4"), "{e}");
}

#[test]
fn sub_byte_literals_print_and_parse_in_range_only() {
    let f = kiln_ir::parse_func_text(
        "func @main() -> (i4[3], u2[2]) {\n  %0 = constant {value = [-8, 7, -1]} : i4[3]\n  %1 = constant {value = [3, 0]} : u2[2]\n  return %0, %1\n}\n",
    )
    .unwrap();
    let text = kiln_ir::print_func(&f);
    assert!(
        text.contains("[-8, 7, -1]") && text.contains("[3, 0]"),
        "{text}"
    );
    let out = run(&text, &[]);
    assert_eq!(out[0].to_i64s(), [-8, 7, -1]);
    for (ty, bad) in [
        ("i4", "8"),
        ("i4", "-9"),
        ("u4", "16"),
        ("u2", "-1"),
        ("i2", "2"),
    ] {
        let src = format!(
            "func @main() -> {ty}[] {{\n  %0 = constant {{value = {bad}}} : {ty}[]\n  return %0\n}}\n"
        );
        let e = kiln_ir::parse_func_text(&src).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{bad} is out of range for {ty}")),
            "{e}"
        );
    }
}
