//! The `chlo` special functions (`erfc`, `lgamma`, `digamma`, `polygamma`, `zeta`,
//! `bessel_i1e`, `next_after`, `top_k`) as JAX emits them (`tests/data/jax/special_functions`,
//! written by `scripts/export_jax.py`), against SciPy's values of the same inputs in f64 and
//! against XLA's outputs, on the reference interpreter and the CPU backend; the same
//! functions in f64 against SciPy, on those inputs and on dense sweeps
//! (`tests/data/jax/special_sweep`, also written by the script); `next_after` of every f16
//! and bf16 value against a bit-level model; and their bad inputs.
//!
//! Accuracy: kiln computes these functions in f64 and rounds once, so its f32 results are
//! within one f32 ulp of SciPy's f64 values (`F32_ULPS`), and its f64 results within the
//! relative bounds `special.rs` states; only lgamma, digamma and polygamma, which have
//! zeros, get an absolute slack `F64_ABS` there.
//! XLA computes them in f32 with errors of its own (up to about 1e-5 relative for lgamma
//! and digamma near their zeros, more for zeta); kiln must agree with it within `XLA_RTOL`
//! of each value plus `XLA_ATOL` of the output's largest, and exactly on which elements are
//! NaN or infinite. `next_after` and `top_k` are exact, so they must equal XLA's.

#[allow(dead_code)]
mod npy;

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{DType, Literal, TensorType};
use kiln_stablehlo::{ErrorKind, parse};
use std::path::Path;

/// Ulps of f32 kiln may be from SciPy's f64 value.
const F32_ULPS: f64 = 1.0;
/// Absolute slack for the functions with zeros (lgamma, digamma, and polygamma through
/// digamma), where relative error is unbounded; the others are held to relative bounds.
const F64_ABS: f64 = 1e-12;

/// The absolute slack of a function: [`F64_ABS`] where it has zeros, else none.
fn abs_slack(name: &str) -> f64 {
    match name {
        "lgamma" | "digamma" | "polygamma" => F64_ABS,
        _ => 0.0,
    }
}
/// Agreement with XLA's f32 results, relative to each value.
const XLA_RTOL: f64 = 2e-4;
/// Agreement with XLA's f32 results, relative to the output's largest magnitude.
const XLA_ATOL: f64 = 1e-5;

/// The names of the float outputs with SciPy references, in output order.
const FUNCS: [&str; 6] = [
    "erfc",
    "lgamma",
    "digamma",
    "polygamma",
    "zeta",
    "bessel_i1e",
];

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax/special_functions")
}

fn read(name: &str, t: &TensorType) -> Literal {
    let p = data().join(name);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    npy::read(&bytes, t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The JAX module's inputs, XLA's outputs, SciPy's references, and kiln's outputs on the
/// reference interpreter and the CPU backend.
struct Run {
    inputs: Vec<Literal>,
    xla: Vec<Literal>,
    scipy: Vec<Literal>,
    kiln: Vec<(&'static str, Vec<Literal>)>,
}

fn run_jax_module() -> Run {
    let m = kiln_stablehlo::parse_file(data().join("module.mlir"))
        .unwrap_or_else(|e| panic!("import failed: {e}"));
    let f = m.funcs.iter().find(|f| f.name == "main").expect("@main");
    let inputs: Vec<Literal> = f
        .param_types()
        .iter()
        .enumerate()
        .map(|(i, t)| read(&format!("in{i}.npy"), t))
        .collect();
    let xla: Vec<Literal> = f
        .output_types
        .iter()
        .enumerate()
        .map(|(i, t)| read(&format!("out{i}.npy"), t))
        .collect();
    let scipy = (0..FUNCS.len())
        .map(|i| {
            read(
                &format!("ref{i}.npy"),
                &f.output_types[i].with_dtype(DType::F64),
            )
        })
        .collect();
    let reference = kiln_reference::eval(f, &inputs).expect("runs on the reference");
    let exe = CpuExecutable::compile_with_cache(f, None).expect("compiles");
    let cpu = exe.run(&inputs).expect("runs on the CPU");
    Run {
        inputs,
        xla,
        scipy,
        kiln: vec![("reference", reference), ("cpu", cpu)],
    }
}

/// One f32 ulp at `x` (of its binade).
fn ulp32(x: f64) -> f64 {
    let a = (x.abs() as f32).max(f32::MIN_POSITIVE);
    let b = f32::from_bits(a.to_bits() + 1);
    (b - a) as f64
}

/// The same class: both NaN, both the same infinity, or both finite.
fn same_class(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b) || (a.is_finite() && b.is_finite())
}

#[test]
fn jax_special_functions_are_within_an_ulp_of_scipy() {
    let r = run_jax_module();
    for (backend, outs) in &r.kiln {
        for (k, name) in FUNCS.iter().enumerate() {
            let got = outs[k].to_f64s();
            let want = r.scipy[k].to_f64s();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let w32 = w as f32 as f64;
                let ok = if w32.is_finite() {
                    (g - w).abs() <= F32_ULPS * ulp32(w) + abs_slack(name)
                } else {
                    g.to_bits() == w32.to_bits() || g.is_nan() && w.is_nan()
                };
                assert!(
                    ok,
                    "{backend} {name}[{i}]: kiln {g:e}, SciPy {w:e} (inputs: {})",
                    inputs_at(&r, k, i)
                );
            }
        }
    }
}

/// The inputs of element `i` of float output `k`, for messages.
fn inputs_at(r: &Run, k: usize, i: usize) -> String {
    let idx: &[usize] = match k {
        0 => &[0],
        1 | 2 => &[1],
        3 => &[2, 3],
        4 => &[4, 5],
        _ => &[6],
    };
    idx.iter()
        .map(|&j| format!("{:e}", r.inputs[j].to_f64s()[i]))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn jax_special_functions_agree_with_xla() {
    let r = run_jax_module();
    for (backend, outs) in &r.kiln {
        for (k, name) in FUNCS.iter().enumerate() {
            let got = outs[k].to_f64s();
            let want = r.xla[k].to_f64s();
            let scale = want
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0f64, |m, x| m.max(x.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same_class(g, w),
                    "{backend} {name}[{i}]: kiln {g}, XLA {w} (inputs: {})",
                    inputs_at(&r, k, i)
                );
                if w.is_finite() {
                    assert!(
                        (g - w).abs() <= XLA_RTOL * w.abs() + XLA_ATOL * scale,
                        "{backend} {name}[{i}]: kiln {g:e}, XLA {w:e} (inputs: {})",
                        inputs_at(&r, k, i)
                    );
                }
            }
        }
        // next_after, top_k's values and indices: exact.
        for (k, (got, want)) in outs.iter().zip(&r.xla).enumerate().skip(FUNCS.len()) {
            assert_eq!(
                got.to_le_bytes(),
                want.to_le_bytes(),
                "{backend} output {k}: kiln {got:?}, XLA {want:?}"
            );
        }
    }
}

/// Runs `text` (one function) on the reference and the CPU backend; both results.
fn run_both(text: &str, args: &[Literal]) -> [Vec<Literal>; 2] {
    let m = parse(text).unwrap_or_else(|e| panic!("import failed: {e}"));
    let f = &m.funcs[0];
    let reference = kiln_reference::eval(f, args).expect("runs");
    let cpu = CpuExecutable::compile_with_cache(f, None)
        .expect("compiles")
        .run(args)
        .expect("runs");
    [reference, cpu]
}

#[test]
fn special_functions_in_f64_match_scipy() {
    let r = run_jax_module();
    let f64s = |l: &Literal| {
        Literal::from_f64s(l.ty().with_dtype(DType::F64), &l.to_f64s()).expect("f64 literal")
    };
    let n = |k: usize| r.inputs[k].ty().numel();
    let text = format!(
        "func.func @main(%e: tensor<{0}xf64>, %g: tensor<{1}xf64>, %pn: tensor<{2}xf64>, %px: tensor<{2}xf64>, %zs: tensor<{3}xf64>, %zq: tensor<{3}xf64>, %b: tensor<{4}xf64>) -> (tensor<{0}xf64>, tensor<{1}xf64>, tensor<{1}xf64>, tensor<{2}xf64>, tensor<{3}xf64>, tensor<{4}xf64>) {{
  %0 = chlo.erfc %e : tensor<{0}xf64> -> tensor<{0}xf64>
  %1 = chlo.lgamma %g : tensor<{1}xf64> -> tensor<{1}xf64>
  %2 = chlo.digamma %g : tensor<{1}xf64> -> tensor<{1}xf64>
  %3 = chlo.polygamma %pn, %px : tensor<{2}xf64>, tensor<{2}xf64> -> tensor<{2}xf64>
  %4 = \"chlo.zeta\"(%zs, %zq) : (tensor<{3}xf64>, tensor<{3}xf64>) -> tensor<{3}xf64>
  %5 = \"chlo.bessel_i1e\"(%b) : (tensor<{4}xf64>) -> tensor<{4}xf64>
  func.return %0, %1, %2, %3, %4, %5 : tensor<{0}xf64>, tensor<{1}xf64>, tensor<{1}xf64>, tensor<{2}xf64>, tensor<{3}xf64>, tensor<{4}xf64>
}}",
        n(0),
        n(1),
        n(3),
        n(4),
        n(6)
    );
    let args: Vec<Literal> = [0, 1, 2, 3, 4, 5, 6]
        .iter()
        .map(|&k| f64s(&r.inputs[k]))
        .collect();
    // Relative bounds of the f64 formulas (module docs of `special`), with the absolute
    // `F64_ABS` near zeros.
    let rel = [1e-14, 1e-13, 1e-13, 1e-12, 1e-13, 1e-13];
    for (backend, outs) in ["reference", "cpu"].iter().zip(run_both(&text, &args)) {
        for (k, name) in FUNCS.iter().enumerate() {
            let got = outs[k].to_f64s();
            let want = r.scipy[k].to_f64s();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let ok = if w.is_finite() {
                    (g - w).abs() <= rel[k] * w.abs() + abs_slack(name)
                } else {
                    g == w || g.is_nan() && w.is_nan()
                };
                assert!(ok, "{backend} f64 {name}[{i}]: kiln {g:e}, SciPy {w:e}");
            }
        }
    }
}

/// `nextafter` on the bits of a 16-bit float, as sign and magnitude: the model (`None` for
/// NaN).
fn next_after_bits(x: u16, y: u16, to_f64: impl Fn(u16) -> f64) -> Option<u16> {
    let (fx, fy) = (to_f64(x), to_f64(y));
    if fx.is_nan() || fy.is_nan() {
        return None;
    }
    Some(next_bits(x, y, fx, fy))
}

fn next_bits(x: u16, y: u16, fx: f64, fy: f64) -> u16 {
    if fx == fy {
        return y;
    }
    if fx == 0.0 {
        return if fy > 0.0 { 1 } else { 0x8001 };
    }
    if (fy > fx) == (fx > 0.0) {
        x + 1
    } else {
        x - 1
    }
}

#[test]
fn next_after_of_every_half_and_bfloat16_value() {
    for dt in [DType::F16, DType::BF16] {
        let to_f64 = |b: u16| match dt {
            DType::F16 => half::f16::from_bits(b).to_f64(),
            _ => half::bf16::from_bits(b).to_f64(),
        };
        // Every bit pattern, toward +inf and toward -inf, and a few toward zero.
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for b in 0..=u16::MAX {
            for y in [f64::INFINITY, f64::NEG_INFINITY, 0.0] {
                xs.push(to_f64(b));
                ys.push(y);
            }
        }
        let t = TensorType::new(dt, [xs.len()]);
        let name = if dt == DType::F16 { "f16" } else { "bf16" };
        let text = format!(
            "func.func @main(%x: tensor<{0}x{name}>, %y: tensor<{0}x{name}>) -> tensor<{0}x{name}> {{
  %0 = chlo.next_after %x, %y : tensor<{0}x{name}>, tensor<{0}x{name}> -> tensor<{0}x{name}>
  func.return %0 : tensor<{0}x{name}>
}}",
            xs.len()
        );
        let args = [
            Literal::from_f64s(t.clone(), &xs).unwrap(),
            Literal::from_f64s(t.clone(), &ys).unwrap(),
        ];
        let xb: Vec<u16> = bits16(&args[0]);
        let yb: Vec<u16> = bits16(&args[1]);
        for (backend, out) in ["reference", "cpu"].iter().zip(run_both(&text, &args)) {
            let got = bits16(&out[0]);
            for i in 0..xb.len() {
                let want = next_after_bits(xb[i], yb[i], to_f64);
                let ok = match want {
                    Some(w) => got[i] == w,
                    None => to_f64(got[i]).is_nan(),
                };
                assert!(
                    ok,
                    "{backend} {name} next_after({:e}, {:e}): got {:#06x}, want {want:?}",
                    to_f64(xb[i]),
                    to_f64(yb[i]),
                    got[i]
                );
            }
        }
    }
}

fn bits16(l: &Literal) -> Vec<u16> {
    l.to_le_bytes()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

#[test]
fn next_after_in_f64_steps_one_bit() {
    let xs = [
        1.0,
        1.0,
        -1.0,
        0.0,
        -0.0,
        f64::MAX,
        f64::INFINITY,
        5e-324,
        f64::NAN,
        2.0,
    ];
    let ys = [2.0, 0.0, -2.0, -1.0, 1.0, f64::INFINITY, 0.0, 0.0, 1.0, 2.0];
    let t = TensorType::new(DType::F64, [xs.len()]);
    let text = "func.func @main(%x: tensor<10xf64>, %y: tensor<10xf64>) -> tensor<10xf64> {
  %0 = chlo.next_after %x, %y : tensor<10xf64>, tensor<10xf64> -> tensor<10xf64>
  func.return %0 : tensor<10xf64>
}";
    let args = [
        Literal::from_f64s(t.clone(), &xs).unwrap(),
        Literal::from_f64s(t, &ys).unwrap(),
    ];
    let want = [
        f64::from_bits(1.0f64.to_bits() + 1),
        f64::from_bits(1.0f64.to_bits() - 1),
        -f64::from_bits(1.0f64.to_bits() + 1),
        -5e-324,
        5e-324,
        f64::INFINITY,
        f64::MAX,
        0.0,
        f64::NAN,
        2.0,
    ];
    for out in run_both(text, &args) {
        for (g, w) in out[0].to_f64s().iter().zip(want) {
            assert!(
                g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                "{g:e} vs {w:e}"
            );
        }
    }
}

#[test]
fn top_k_of_integers_and_rank_one() {
    let text = "func.func @main(%x: tensor<7xi32>) -> (tensor<4xi32>, tensor<4xi32>) {
  %v, %i = chlo.top_k(%x, k = 4) : tensor<7xi32> -> (tensor<4xi32>, tensor<4xi32>)
  func.return %v, %i : tensor<4xi32>, tensor<4xi32>
}";
    let x = Literal::i32([7], vec![3, -1, 9, 3, 9, 0, 3]).unwrap();
    for out in run_both(text, &[x]) {
        assert_eq!(out[0].to_i64s(), vec![9, 9, 3, 3]);
        assert_eq!(out[1].to_i64s(), vec![2, 4, 0, 3]);
    }
}

/// The import error of `text`: its kind and message.
fn import_error(text: &str) -> (ErrorKind, String) {
    let e = parse(text).expect_err("the import must fail");
    (e.kind, e.to_string())
}

#[test]
fn bad_special_function_operands_are_located_errors() {
    let cases = [
        (
            "func.func @main(%x: tensor<3xf32>) -> (tensor<4xf32>, tensor<4xi32>) {
  %v, %i = chlo.top_k(%x, k = 4) : tensor<3xf32> -> (tensor<4xf32>, tensor<4xi32>)
  func.return %v, %i : tensor<4xf32>, tensor<4xi32>
}",
            "k = 4 is not in [0, 3]",
        ),
        (
            "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = \"chlo.zeta\"(%x) : (tensor<3xf32>) -> tensor<3xf32>
  func.return %0 : tensor<3xf32>
}",
            "`chlo.zeta` takes 2 operands",
        ),
        (
            "func.func @main(%x: tensor<3xi32>) -> tensor<3xi32> {
  %0 = \"chlo.lgamma\"(%x) : (tensor<3xi32>) -> tensor<3xi32>
  func.return %0 : tensor<3xi32>
}",
            "`chlo.lgamma` takes floats",
        ),
        (
            "func.func @main(%x: tensor<3xf32>, %y: tensor<3xf64>) -> tensor<3xf32> {
  %0 = chlo.next_after %x, %y : tensor<3xf32>, tensor<3xf64> -> tensor<3xf32>
  func.return %0 : tensor<3xf32>
}",
            "`chlo.next_after` takes two floats of one type",
        ),
    ];
    for (text, want) in cases {
        let (kind, msg) = import_error(text);
        assert_eq!(kind, ErrorKind::Invalid, "{msg}");
        assert!(msg.contains(want), "{msg}");
        assert!(msg.starts_with("2:"), "located at the op's line: {msg}");
    }
}

/// The f64 bound of each function in `special.rs`'s table: relative, with `F64_ABS` near
/// zeros.
fn f64_bound(name: &str) -> f64 {
    match name {
        "erfc" | "erf_inv" => 1e-14,
        "polygamma" => 1e-12,
        _ => 1e-13,
    }
}

#[test]
fn dense_f64_sweeps_are_within_the_stated_bounds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax/special_sweep");
    for (name, arity) in [
        ("erf_inv", 1),
        ("erfc", 1),
        ("lgamma", 1),
        ("digamma", 1),
        ("polygamma", 2),
        ("zeta", 2),
        ("bessel_i1e", 1),
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.npy"))).expect("sweep data");
        let cols = arity + 1;
        // The row count from the file's length: a version-1 header (its length at bytes 8
        // and 9), then 8 bytes a value.
        let header = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        let rows = (bytes.len() - header) / (8 * cols);
        let table = npy::read(&bytes, &TensorType::new(DType::F64, [rows, cols]))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .to_f64s();
        let col = |j: usize| -> Vec<f64> { (0..rows).map(|i| table[i * cols + j]).collect() };
        let t = format!("tensor<{rows}xf64>");
        let params: Vec<String> = (0..arity).map(|j| format!("%a{j}: {t}")).collect();
        let operands: Vec<String> = (0..arity).map(|j| format!("%a{j}")).collect();
        let text = format!(
            "func.func @main({}) -> {t} {{\n  %0 = \"chlo.{name}\"({}) : ({}) -> {t}\n  func.return %0 : {t}\n}}",
            params.join(", "),
            operands.join(", "),
            vec![t.as_str(); arity].join(", ")
        );
        let ty = TensorType::new(DType::F64, [rows]);
        let args: Vec<Literal> = (0..arity)
            .map(|j| Literal::from_f64s(ty.clone(), &col(j)).unwrap())
            .collect();
        let want = col(arity);
        let bound = f64_bound(name);
        for (backend, out) in ["reference", "cpu"].iter().zip(run_both(&text, &args)) {
            let got = out[0].to_f64s();
            let mut worst = (0.0f64, 0usize);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let err = if g == w {
                    0.0
                } else {
                    (g - w).abs() / (w.abs() + abs_slack(name) / bound)
                };
                if err > worst.0 || err.is_nan() {
                    worst = (if err.is_nan() { f64::INFINITY } else { err }, i);
                }
            }
            let i = worst.1;
            let inputs: Vec<String> = (0..arity).map(|j| format!("{:e}", col(j)[i])).collect();
            assert!(
                worst.0 <= bound,
                "{backend} {name}({}): kiln {:e}, SciPy {:e} (relative {:e} > {bound:e})",
                inputs.join(", "),
                got[i],
                want[i],
                worst.0
            );
        }
    }
}
