//! Programs exported from JAX (`scripts/export_jax.py`, data in `tests/data/jax/<name>/`):
//! each module is imported, run on the reference interpreter and on the CPU backend with the
//! inputs JAX was given, and compared with what JAX (XLA's CPU backend) computed.
//!
//! Tolerances: XLA and kiln compute the same f32 formulas, but sum reductions and dot
//! products in other orders (XLA vectorizes and splits them, kiln's reference sums in
//! order) and may fuse multiply-adds, so each f32 output may differ by a few units of the
//! last place of its partial sums. Those are at most the output's largest magnitude, so
//! every element of an f32 output must be within `RTOL` of its own magnitude plus `ATOL` of
//! the output's largest one: `|got - want| <= RTOL |want| + ATOL max|want|`. The programs are
//! a few hundred operations deep with condition numbers near one (a training step, a
//! gradient), where 1e-4 relative leaves room for those orders and catches any wrong op
//! (whose errors are of the order of the values); the largest difference measured with
//! JAX 0.10.2's data is 5e-5 of an element's magnitude (a transformer gradient's element
//! near a thousandth of its output's largest), so the bound has a margin of two. Integer
//! and `ui32` outputs (threefry's bits, the step count) must be equal.

#[allow(dead_code)]
mod npy;

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{DType, Func, Literal, Module};
use std::path::{Path, PathBuf};

/// Relative tolerance per element (see the module docs).
const RTOL: f64 = 1e-4;
/// Tolerance relative to the output's largest magnitude.
const ATOL: f64 = 1e-5;

/// The directory of one exported program.
fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jax")
        .join(name)
}

/// Reads `<prefix><i>.npy` for each type.
fn read_all(d: &Path, prefix: &str, types: &[kiln_ir::TensorType]) -> Vec<Literal> {
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = d.join(format!("{prefix}{i}.npy"));
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            npy::read(&bytes, t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect()
}

/// The imported module of one program, its inputs and JAX's outputs.
fn load(name: &str) -> (Module, Vec<Literal>, Vec<Literal>) {
    let d = dir(name);
    let m = kiln_stablehlo::parse_file(d.join("module.mlir"))
        .unwrap_or_else(|e| panic!("{name}: import failed: {e}"));
    kiln_ir::verify_module(&m).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let f = entry(&m);
    let inputs = read_all(&d, "in", &f.param_types());
    let outputs = read_all(&d, "out", &f.output_types);
    (m, inputs, outputs)
}

fn entry(m: &Module) -> &Func {
    m.funcs
        .iter()
        .find(|f| f.name == "main")
        .expect("a @main function")
}

/// Fails unless `got` is within the tolerances of `want` (f32), or equal (other types).
fn close(what: &str, got: &Literal, want: &Literal, rtol: f64, atol: f64) {
    assert_eq!(got.ty(), want.ty(), "{what}: types differ");
    if !want.dtype().is_float() {
        assert_eq!(got, want, "{what}: differs");
        return;
    }
    let (g, w) = (got.to_f64s(), want.to_f64s());
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a - b).abs() <= rtol * b.abs() + atol * scale || a == b;
        assert!(ok, "{what}[{i}]: kiln {a}, JAX {b} (largest |JAX| {scale})");
    }
}

/// Runs one program on the reference and the CPU backend and compares both with JAX.
fn check(name: &str, rtol: f64, atol: f64) {
    let (m, inputs, want) = load(name);
    let f = entry(&m);
    let reference = kiln_reference::eval(f, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let exe = CpuExecutable::compile_with_cache(f, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cpu = exe.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(reference.len(), want.len(), "{name}: output count");
    for (i, w) in want.iter().enumerate() {
        close(
            &format!("{name} reference output {i}"),
            &reference[i],
            w,
            rtol,
            atol,
        );
        close(&format!("{name} cpu output {i}"), &cpu[i], w, rtol, atol);
    }
}

#[test]
fn mlp_train_step_matches_jax() {
    check("mlp_train_step", RTOL, ATOL);
}

#[test]
fn cnn_grad_matches_jax() {
    check("cnn_grad", RTOL, ATOL);
}

#[test]
fn transformer_block_grad_matches_jax() {
    check("transformer_block_grad", RTOL, ATOL);
}

#[test]
fn threefry_bits_match_jax() {
    // The bits are integers (equal); `uniform` is exact arithmetic on them; `normal` goes
    // through `erf_inv`, the same polynomial as XLA's, up to rounding (a few ulps).
    check("threefry_bits", 1e-6, 1e-6);
    let (m, inputs, _) = load("threefry_bits");
    assert_eq!(entry(&m).param_types()[0].dtype, DType::U32);
    // The key is an input: another key gives other bits.
    let mut other = inputs[0].to_i64s();
    other[1] ^= 1;
    let key = Literal::from_i64s(inputs[0].ty().clone(), &other).unwrap();
    let a = kiln_reference::eval(entry(&m), &inputs).unwrap();
    let b = kiln_reference::eval(entry(&m), &[key]).unwrap();
    assert_ne!(a[0], b[0]);
}

#[test]
fn threefry_bits_x64_match_jax() {
    // With 64-bit types: the ui64 values must be equal; `uniform` in f64 is exact
    // arithmetic on them; `normal` goes through f64 `erf_inv` (within 1e-14 of the true
    // value, as is XLA's), so 1e-13 relative.
    check("threefry_bits_x64", 1e-13, 1e-15);
}

#[test]
fn ui64_counters_wrap_shift_and_truncate() {
    // As threefry's counters: wrapping arithmetic, a logical shift, truncation to ui32.
    let text =
        "func.func @main(%x: tensor<3xui64>) -> (tensor<3xui32>, tensor<3xui32>, tensor<3xi1>) {
  %max = stablehlo.constant dense<18446744073709551615> : tensor<3xui64>
  %s = stablehlo.add %x, %max : tensor<3xui64>
  %k = stablehlo.constant dense<32> : tensor<3xui64>
  %hi = stablehlo.shift_right_logical %s, %k : tensor<3xui64>
  %0 = stablehlo.convert %s : (tensor<3xui64>) -> tensor<3xui32>
  %1 = stablehlo.convert %hi : (tensor<3xui64>) -> tensor<3xui32>
  %2 = stablehlo.compare EQ, %s, %max : (tensor<3xui64>, tensor<3xui64>) -> tensor<3xi1>
  func.return %0, %1, %2 : tensor<3xui32>, tensor<3xui32>, tensor<3xi1>
}";
    let m = kiln_stablehlo::parse(text).unwrap();
    let f = &m.funcs[0];
    assert_eq!(f.param_types()[0].dtype, DType::U64);
    let x = Literal::from_i64s(f.param_types()[0].clone(), &[0, 1, 1 << 40]).unwrap();
    let want_lo: Vec<i64> = vec![0xFFFF_FFFF, 0, 0xFFFF_FFFF];
    let want_hi: Vec<i64> = vec![0xFFFF_FFFF, 0, 0xFF];
    let reference = kiln_reference::eval(f, std::slice::from_ref(&x)).unwrap();
    let cpu = CpuExecutable::compile_with_cache(f, None)
        .unwrap()
        .run(&[x])
        .unwrap();
    for out in [reference, cpu] {
        assert_eq!(out[0].to_i64s(), want_lo);
        assert_eq!(out[1].to_i64s(), want_hi);
        assert_eq!(out[2].to_i64s(), vec![1, 0, 0]);
    }
}

#[test]
fn ui64_orders_as_unsigned() {
    let text = "func.func @main(%a: tensor<4xui64>, %b: tensor<4xui64>) -> (tensor<4xi1>, tensor<4xi1>, tensor<4xui64>, tensor<4xui64>) {
  %0 = stablehlo.compare LT, %a, %b : (tensor<4xui64>, tensor<4xui64>) -> tensor<4xi1>
  %1 = stablehlo.compare GE, %a, %b, UNSIGNED : (tensor<4xui64>, tensor<4xui64>) -> tensor<4xi1>
  %2 = stablehlo.maximum %a, %b : tensor<4xui64>
  %3 = stablehlo.minimum %a, %b : tensor<4xui64>
  func.return %0, %1, %2, %3 : tensor<4xi1>, tensor<4xi1>, tensor<4xui64>, tensor<4xui64>
}";
    let m = kiln_stablehlo::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let f = &m.funcs[0];
    let t = f.param_types()[0].clone();
    // As u64: 2^64-1 > 1, 2^63 > 2^63-1, 0 < 5, 7 = 7.
    let a = Literal::from_i64s(t.clone(), &[-1, i64::MIN, 0, 7]).unwrap();
    let b = Literal::from_i64s(t, &[1, i64::MAX, 5, 7]).unwrap();
    let reference = kiln_reference::eval(f, &[a.clone(), b.clone()]).unwrap();
    let cpu = CpuExecutable::compile_with_cache(f, None)
        .unwrap()
        .run(&[a, b])
        .unwrap();
    for out in [reference, cpu] {
        assert_eq!(out[0].to_i64s(), vec![0, 0, 1, 0]);
        assert_eq!(out[1].to_i64s(), vec![1, 1, 0, 1]);
        assert_eq!(out[2].to_i64s(), vec![-1, i64::MIN, 5, 7]);
        assert_eq!(out[3].to_i64s(), vec![1, i64::MAX, 0, 7]);
    }
}

#[test]
fn ui64_divides_shifts_and_converts_as_unsigned() {
    let text = "func.func @main(%a: tensor<2xui64>, %b: tensor<2xui64>) -> (tensor<2xui64>, tensor<2xui64>, tensor<2xf64>, tensor<2xui64>) {
  %0 = stablehlo.divide %a, %b : tensor<2xui64>
  %1 = stablehlo.remainder %a, %b : tensor<2xui64>
  %2 = stablehlo.convert %a : (tensor<2xui64>) -> tensor<2xf64>
  %3 = stablehlo.shift_right_arithmetic %a, %b : tensor<2xui64>
  func.return %0, %1, %2, %3 : tensor<2xui64>, tensor<2xui64>, tensor<2xf64>, tensor<2xui64>
}";
    let m = kiln_stablehlo::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let f = &m.funcs[0];
    let t = f.param_types()[0].clone();
    // As u64: a = [2^64 - 1, 2^63], b = [16, 3].
    let a = Literal::from_i64s(t.clone(), &[-1, i64::MIN]).unwrap();
    let b = Literal::from_i64s(t, &[16, 3]).unwrap();
    let reference = kiln_reference::eval(f, &[a.clone(), b.clone()]).unwrap();
    let cpu = CpuExecutable::compile_with_cache(f, None)
        .unwrap()
        .run(&[a, b])
        .unwrap();
    for out in [reference, cpu] {
        let u = |l: &Literal| -> Vec<u64> { l.to_i64s().into_iter().map(|x| x as u64).collect() };
        assert_eq!(u(&out[0]), [u64::MAX / 16, (1 << 63) / 3]);
        assert_eq!(u(&out[1]), [15, 2]);
        assert_eq!(out[2].to_f64s(), [u64::MAX as f64, (1u64 << 63) as f64]);
        // The sign bit shifted in: the bits as a two's-complement number.
        assert_eq!(u(&out[3]), [u64::MAX, 0xF000_0000_0000_0000]);
    }
    let e = kiln_stablehlo::parse(
        "func.func @main() -> tensor<ui64> {
  %0 = stablehlo.constant dense<-1> : tensor<ui64>
  func.return %0 : tensor<ui64>
}",
    )
    .expect_err("a negative ui64");
    assert!(e.to_string().contains("out of range for ui64"), "{e}");
}

/// What JAX prints for `jit(f, in_shardings=...)` with `with_sharding_constraint` on one
/// device, with Shardy (the default) and with GSPMD (`jax_use_shardy_partitioner=False`).
const SHARDY: &str = r#"module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=1]> {stablehlo.mesh = {axes = [{name = "x", size = 1 : i64}]}}
  func.func public @main(%arg0: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}, %arg1: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> (tensor<4xf32> {jax.result_info = "result[0]", sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}, tensor<f32> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %1 = stablehlo.multiply %arg0, %0 : tensor<4xf32>
    %2 = sdy.sharding_constraint %1 <@mesh, [{"x"}]> : tensor<4xf32>
    %3 = stablehlo.add %2, %arg1 : tensor<4xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %4 = stablehlo.reduce(%arg1 init: %cst_0) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    return %3, %4 : tensor<4xf32>, tensor<f32>
  }
}"#;

const GSPMD: &str = r#"module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32> {mhlo.sharding = "{replicated}"}, %arg1: tensor<4xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4xf32> {jax.result_info = "result[0]", mhlo.sharding = "{replicated}"}, tensor<f32> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %1 = stablehlo.multiply %arg0, %0 : tensor<4xf32>
    %2 = stablehlo.custom_call @Sharding(%1) {backend_config = "", mhlo.sharding = "{replicated}"} : (tensor<4xf32>) -> tensor<4xf32>
    %3 = stablehlo.add %2, %arg1 : tensor<4xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %4 = stablehlo.reduce(%arg1 init: %cst_0) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    return %3, %4 : tensor<4xf32>, tensor<f32>
  }
}"#;

#[test]
fn sharding_annotations_leave_the_values_as_they_are() {
    let a = Literal::f32([4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let b = Literal::f32([4], vec![0.5, -1.0, 0.0, 2.0]).unwrap();
    for text in [SHARDY, GSPMD] {
        let m = kiln_stablehlo::parse(text).unwrap_or_else(|e| panic!("{e}"));
        let out = kiln_reference::eval(entry(&m), &[a.clone(), b.clone()]).unwrap();
        assert_eq!(out[0].as_f32s().unwrap(), &[2.5, 3.0, 6.0, 10.0]);
        assert_eq!(out[1].as_f32s().unwrap(), &[1.5]);
    }
}

#[test]
fn partitioned_computations_are_refused() {
    let text = r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"x"}]>] out_shardings=[<@mesh, [{"x"}]>] manual_axes={"x"} (%a: tensor<2xf32>) {
    sdy.return %a : tensor<2xf32>
  } : (tensor<4xf32>) -> tensor<4xf32>
  func.return %0 : tensor<4xf32>
}"#;
    let e = kiln_stablehlo::parse(text).expect_err("refused");
    assert_eq!(e.kind, kiln_stablehlo::ErrorKind::Unsupported, "{e}");
    assert!(
        e.to_string().starts_with("2:8:") && e.to_string().contains("sdy.manual_computation"),
        "{e}"
    );
}

#[test]
fn custom_calls_kiln_cannot_run_are_named() {
    // LAPACK on the CPU, as `jnp.linalg.cholesky` lowers; and partitioning across devices.
    for (call, target) in [
        (
            "%0 = stablehlo.custom_call @lapack_spotrf_ffi(%x) {mhlo.backend_config = {uplo = 76 : ui8}} : (tensor<2x2xf32>) -> tensor<2x2xf32>",
            "lapack_spotrf_ffi",
        ),
        (
            "%0 = stablehlo.custom_call @SPMDFullToShardShape(%x) {mhlo.sharding = \"{manual}\"} : (tensor<2x2xf32>) -> tensor<2x2xf32>",
            "SPMDFullToShardShape",
        ),
    ] {
        let text = format!(
            "func.func @main(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {{\n  {call}\n  func.return %0 : tensor<2x2xf32>\n}}"
        );
        let e = kiln_stablehlo::parse(&text).expect_err("refused");
        assert_eq!(e.kind, kiln_stablehlo::ErrorKind::Unsupported, "{e}");
        assert!(
            e.to_string().starts_with("2:") && e.to_string().contains(target),
            "{e}"
        );
    }
}
