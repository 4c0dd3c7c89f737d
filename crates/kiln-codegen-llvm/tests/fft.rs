//! `fft` compiled for the CPU (its expansion in `kiln_kernel::fft` into products, twiddle
//! multiplies and layout ops, on the parts of the complex values), on random inputs of many
//! lengths: direct, factored (four-step) and prime (Bluestein) lengths, batched, 2-D and 3-D,
//! every `fft_type`. Each program runs with every instruction in a kernel (the complex
//! parameters and results as byte copies), and agrees with the reference under the bound of
//! `ir-specs/ops/fft.md` (`kiln_reference::accuracy`) and, norm-wise, within `8 ε log2(2n)` of
//! the reference relative to the norm of the result (NumPy's and pocketfft's `O(ε log n)`).

mod common;

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{DType, Literal};

/// The real and imaginary parts of `l`, or its values when it is real.
fn parts(l: &Literal) -> Vec<f64> {
    if l.dtype().is_complex() {
        l.to_complex_f64s().into_iter().flatten().collect()
    } else {
        l.to_f64s()
    }
}

/// Compiles `fft` of an `x` operand into `out` and checks it on two random inputs.
fn check(x: &str, t: &str, lengths: &[usize], out: &str) {
    let n: usize = lengths.iter().product();
    let ls: Vec<String> = lengths.iter().map(|l| l.to_string()).collect();
    let src = format!(
        "func @main(%0: {x}) -> {out} {{\n  %1 = fft %0 {{fft_type = {t}, fft_length = [{}]}} : {out}\n  return %1\n}}\n",
        ls.join(", ")
    );
    let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    common::compiled_whole(&exe).unwrap_or_else(|e| panic!("{src}: {e}"));
    for seed in 0..2 {
        let args = common::random_args(&f, seed + n as u64);
        let got = exe.run(&args).unwrap_or_else(|e| panic!("{src}: {e}"));
        let want = kiln_reference::eval(&f, &args).expect("the reference runs");
        kiln_reference::accuracy::check_outputs_against(&f, &args, &got, &want)
            .unwrap_or_else(|e| panic!("{src}: seed {seed}: {e}"));
        let (g, w) = (parts(&got[0]), parts(&want[0]));
        let err = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
        let norm = w.iter().map(|b| b * b).sum::<f64>().sqrt();
        let eps = match got[0].dtype().part() {
            DType::F64 => f64::EPSILON,
            _ => f32::EPSILON as f64,
        };
        let bound = 8.0 * eps * (2.0 * n as f64).log2() * norm.max(f64::MIN_POSITIVE);
        assert!(
            err <= bound,
            "{src}: seed {seed}: |error| {err:e} against |result| {norm:e} (bound {bound:e})"
        );
    }
}

#[test]
fn one_dimensional_transforms_of_many_lengths() {
    for n in [1, 2, 3, 5, 7, 8, 12, 64, 97, 1000, 1024, 4096] {
        check(&format!("c64[{n}]"), "FFT", &[n], &format!("c64[{n}]"));
        check(
            &format!("c128[2,{n}]"),
            "IFFT",
            &[n],
            &format!("c128[2,{n}]"),
        );
        let h = n / 2 + 1;
        check(&format!("f32[2,{n}]"), "RFFT", &[n], &format!("c64[2,{h}]"));
        check(&format!("c64[{h}]"), "IRFFT", &[n], &format!("f32[{n}]"));
    }
}

#[test]
fn batched_and_multidimensional_transforms() {
    check("c64[16,1000]", "FFT", &[1000], "c64[16,1000]");
    check("c64[3,12,97]", "FFT", &[12, 97], "c64[3,12,97]");
    check("c128[4,8,5,7]", "IFFT", &[8, 5, 7], "c128[4,8,5,7]");
    check("f32[2,64,12]", "RFFT", &[64, 12], "c64[2,64,7]");
    check("f64[3,5,8]", "RFFT", &[3, 5, 8], "c128[3,5,5]");
    check("c64[2,12,3]", "IRFFT", &[12, 5], "f32[2,12,5]");
    check("c128[3,7,33]", "IRFFT", &[3, 7, 64], "f64[3,7,64]");
}
