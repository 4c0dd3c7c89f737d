//! Complex elementary functions, `power`, `atan2` and `reduce` with `multiply`, compiled for
//! the CPU: each is computed by kernels on the real parts (no instruction but the parameters'
//! and results' bitcasts runs on the reference interpreter), and agrees with the reference on
//! parts of every kind: zeros of both signs, infinities, NaN, tiny and huge magnitudes.

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{DType, Literal, Op, TensorType, parse_func_text};
use kiln_kernel::Step;
use kiln_reference::compare::{Tolerance, check_close};

/// `n` complex values whose parts cycle through the edge cases and some ordinary numbers,
/// pairing each part with every other (so both orders of every pair occur); `huge` keeps
/// parts of 1e30 (else they are 3).
fn values(d: DType, huge: bool) -> Literal {
    let huge_part = if huge { 1e30 } else { 3.0 };
    let parts = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        0.75,
        1e-30,
        huge_part,
        -huge_part,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -7.0,
    ];
    let v: Vec<[f64; 2]> = parts
        .iter()
        .flat_map(|&a| parts.iter().map(move |&b| [a, b]))
        .collect();
    Literal::from_complex_f64s(TensorType::new(d, [v.len()]), &v).unwrap()
}

/// Compiles `src`, checks that only bitcasts run on the reference interpreter, runs it and
/// compares each result with the reference's within `ulps` of the part type, relative to the
/// larger part of the expected number.
fn compiled_agrees(src: &str, args: &[Literal], ulps: f64) {
    let f = parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let opts = kiln_kernel::Options {
        optimize: false,
        ..kiln_kernel::Options::from_vars(&|name| std::env::var(name).ok())
    };
    let (g, fused) = kiln_kernel::pipeline::lowered_for_printing(&f, &opts).unwrap();
    for (inst, step) in g
        .insts
        .iter()
        .zip(kiln_kernel::pipeline::steps_of(&g, &fused))
    {
        assert!(
            step != Step::Reference || matches!(inst.op, Op::BitcastConvert {}),
            "`{}` runs on the reference interpreter in\n{g}",
            inst.op.mnemonic()
        );
    }
    let exe = CpuExecutable::compile_with_options(&f, &[], &opts).unwrap();
    let got = exe.run(args).unwrap();
    let want = kiln_reference::eval(&f, args).unwrap();
    for (o, w) in got.iter().zip(&want) {
        if let Err(e) = check_close(o, w, Tolerance::ulps(w.dtype(), ulps)) {
            panic!("{e}\nprogram:\n{src}");
        }
    }
}

#[test]
fn elementary_functions_compile_to_kernels_and_agree_with_the_reference() {
    for d in [DType::C64, DType::C128] {
        let t = d.name();
        let x = values(d, true);
        let n = x.numel();
        for op in [
            "sqrt",
            "rsqrt",
            "cbrt",
            "exponential",
            "exponential_minus_one",
            "log_plus_one",
            "tan",
            "tanh",
            "sign",
            "logistic",
        ] {
            compiled_agrees(
                &format!(
                    "func @main(%0: {t}[{n}]) -> {t}[{n}] {{\n  %1 = {op} %0 : {t}[{n}]\n  return %1\n}}\n"
                ),
                std::slice::from_ref(&x),
                16.0,
            );
        }
    }
}

/// `power` and `atan2` on every pair of the edge values but the huge ones (w ln z of
/// magnitude 1e30 has a phase no part type resolves; atan2 squares its operands, which
/// overflow in f32 where the reference's f64 squares do not); e^(w ln z) and the logarithm of
/// a quotient of modulus near 1 move by many roundings of their operand, hence the wider bound.
#[test]
fn power_and_atan2_compile_to_kernels_and_agree_with_the_reference() {
    for d in [DType::C64, DType::C128] {
        let t = d.name();
        let z = values(d, false);
        let n = z.numel();
        let rev: Vec<[f64; 2]> = z.to_complex_f64s().into_iter().rev().collect();
        let w = Literal::from_complex_f64s(z.ty().clone(), &rev).unwrap();
        for op in ["power", "atan2"] {
            compiled_agrees(
                &format!(
                    "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> {t}[{n}] {{\n  %2 = {op} %0, %1 : {t}[{n}]\n  return %2\n}}\n"
                ),
                &[z.clone(), w.clone()],
                1600.0,
            );
        }
    }
}

#[test]
fn products_reduce_in_kernels_and_agree_with_the_reference() {
    let pick = |k: usize| [0.5 + (k % 7) as f64 / 8.0, (k % 5) as f64 / 4.0 - 0.5];
    for n in [1usize, 6, 13] {
        let v: Vec<[f64; 2]> = (0..4 * n).map(pick).collect();
        let x = Literal::from_complex_f64s(TensorType::new(DType::C64, [4, n]), &v).unwrap();
        compiled_agrees(
            &format!(
                "func @main(%0: c64[4,{n}]) -> (c64[4], c64[]) {{\n  %1 = constant {{value = (0.5, 2.0)}} : c64[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = mul}} : c64[4]\n  %3 = reduce %0, %1 {{dimensions = [0, 1], kind = mul}} : c64[]\n  return %2, %3\n}}\n"
            ),
            &[x],
            8.0 * (4 * n) as f64,
        );
    }
}
