//! Random programs with complex parameters, compiled for the CPU and checked against the
//! reference under the bounds of `kiln_reference::accuracy` (complex results part by part,
//! norm-wise at each number's modulus). The complex values are computed on their parts by
//! kernels; the only instructions left to the reference interpreter are the ones that keep
//! complex operands or results after `split_complex` (the rare ops without a rewrite on parts),
//! which the test counts and bounds; the parameters' and results' bitcasts between the
//! interleaved layout and the parts are kernels (byte copies), never interpreted.

mod common;

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::random::{Config, Rng, random_func, random_literal_with_specials};
use kiln_ir::{Func, Literal, Op};
use kiln_kernel::Step;

/// The generator's configuration for `seed`: 1 to 10 ops with complex parameters, control flow
/// in one seed in five.
fn config(seed: u64) -> Config {
    Config {
        ops: 1 + (seed as usize % 10),
        control: seed % 5 == 4,
        ..Config::default()
    }
    .with_complex()
}

/// What one program left to the reference interpreter: the mnemonics of its instructions
/// that run there, its regions' included (an error when one of them is a bitcast, which is
/// always a kernel, or has no complex value).
fn by_reference(f: &Func, opts: &kiln_kernel::Options) -> Result<Vec<&'static str>, String> {
    let (g, fused) =
        kiln_kernel::pipeline::lowered_for_printing(f, opts).map_err(|e| e.to_string())?;
    let mut left = Vec::new();
    for (inst, step) in g
        .insts
        .iter()
        .zip(kiln_kernel::pipeline::steps_of(&g, &fused))
    {
        for r in inst.op.regions() {
            left.extend(by_reference(r, opts)?);
        }
        if step != Step::Reference {
            continue;
        }
        let complex = inst
            .operands
            .iter()
            .chain(&inst.results)
            .any(|v| g.values[v.index()].dtype.is_complex());
        if !complex {
            return Err(format!(
                "`{}` without complex values runs on the reference interpreter",
                inst.op.mnemonic()
            ));
        }
        if matches!(inst.op, Op::BitcastConvert {}) {
            return Err("a complex bitcast (a byte copy) runs on the reference interpreter".into());
        }
        left.push(inst.op.mnemonic());
    }
    Ok(left)
}

#[test]
fn random_complex_programs_compile_and_agree_with_the_reference() {
    let opts = common::env_options();
    let (mut ran, mut complex_out, mut failures) = (0, 0, Vec::new());
    let mut left = std::collections::BTreeMap::<&str, usize>::new();
    let knob = std::env::var("KILN_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_PROGRAMS", knob.as_deref(), 0..3000).unwrap();
    for seed in seeds {
        let f = random_func(&mut Rng::new(seed), &config(seed));
        if !f.values.iter().any(|t| t.dtype.is_complex()) {
            continue;
        }
        let mut rng = Rng::new(seed ^ 0xc0);
        let rate = if seed % 2 == 1 { 1.0 / 32.0 } else { 0.0 };
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, rate))
            .collect();
        let mut run = || -> Result<(), String> {
            for name in by_reference(&f, &opts)? {
                *left.entry(name).or_default() += 1;
            }
            let exe =
                CpuExecutable::compile_with_options(&f, &[], &opts).map_err(|e| e.to_string())?;
            let got = exe.run(&args).map_err(|e| e.to_string())?;
            common::check(&f, &args, &got).map(|_| ())
        };
        ran += 1;
        complex_out += f.output_types.iter().any(|t| t.dtype.is_complex()) as usize;
        if let Err(e) = run() {
            failures.push(format!("seed {seed}: {e}\n{f}"));
        }
    }
    eprintln!(
        "{ran} programs, {complex_out} with complex results; left to the reference: {left:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} disagree:\n{}",
        failures.len(),
        failures[..failures.len().min(4)].join("\n")
    );
    assert!(
        ran < 300 || complex_out >= 100,
        "{ran} programs, {complex_out} with complex results"
    );
    // What `split_complex` keeps complex (sorts, loops and scatters with `multiply` on complex
    // values) is rare in these programs: anything more common is a rewrite gone missing.
    let kept: usize = left.values().sum();
    assert!(
        kept * 100 <= ran,
        "{kept} instructions left to the reference: {left:?}"
    );
}

/// Compiles `src`, checks that nothing runs on the reference interpreter, and
/// compares it with the reference on random arguments (special values on odd seeds).
fn compiles_and_agrees(src: &str) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let opts = common::env_options();
    let left = by_reference(&f, &opts).unwrap_or_else(|e| panic!("{e}\n{src}"));
    assert!(left.is_empty(), "left to the reference: {left:?}\n{src}");
    let exe = CpuExecutable::compile_with_options(&f, &[], &opts).unwrap();
    for seed in 0..4u64 {
        let mut rng = Rng::new(seed);
        let rate = if seed % 2 == 1 { 0.25 } else { 0.0 };
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, rate))
            .collect();
        let got = exe.run(&args).unwrap();
        common::check(&f, &args, &got).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{src}"));
    }
}

/// Loops, branches and sorts over complex values compile with the complex values on parts:
/// the carries, operands and results of the region ops become pairs of real ones.
#[test]
fn control_flow_and_sorts_on_complex_values_compile() {
    // z <- z * w + 1, four times (a static trip count).
    compiles_and_agrees(
        "func @main(%0: c64[3], %1: c64[3]) -> (i32[], c64[3]) {\n  %2 = constant {value = 0} : i32[]\n  %3, %4 = while %2, %0 {cond = func @cond(%0: i32[], %1: c64[3]) -> pred[] {\n      %2 = constant {value = 4} : i32[]\n      %3 = compare %0, %2 {comparison_direction = LT} : pred[]\n      return %3\n    }, body = func @body(%0: i32[], %1: c64[3]) -> (i32[], c64[3]) {\n      %2 = constant {value = 1} : i32[]\n      %3 = add %0, %2 : i32[]\n      %4 = constant {value = (1.0, 0.0)} : c64[]\n      %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : c64[3]\n      %6 = multiply %1, %1 : c64[3]\n      %7 = add %6, %5 : c64[3]\n      return %3, %7\n    }} : i32[], c64[3]\n  return %3, %4\n}\n",
    );
    // A loop whose carry is a c128 matrix, and a real result computed from it.
    compiles_and_agrees(
        "func @main(%0: c128[2,2]) -> f64[2] {\n  %1 = constant {value = 0} : i32[]\n  %2, %3 = while %1, %0 {cond = func @cond(%0: i32[], %1: c128[2,2]) -> pred[] {\n      %2 = constant {value = 3} : i32[]\n      %3 = compare %0, %2 {comparison_direction = LT} : pred[]\n      return %3\n    }, body = func @body(%0: i32[], %1: c128[2,2]) -> (i32[], c128[2,2]) {\n      %2 = constant {value = 1} : i32[]\n      %3 = add %0, %2 : i32[]\n      %4 = dot_general %1, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : c128[2,2]\n      %5 = sqrt %4 : c128[2,2]\n      return %3, %5\n    }} : i32[], c128[2,2]\n  %4 = abs %3 : f64[2,2]\n  %5 = constant {value = 0.0} : f64[]\n  %6 = reduce %4, %5 {dimensions = [1], kind = add} : f64[2]\n  return %6\n}\n",
    );
    // Branches taking and returning complex values.
    compiles_and_agrees(
        "func @main(%0: i32[], %1: c64[4], %2: f32[4]) -> (c64[4], f32[4]) {\n  %3, %4 = case %0, %1, %2 {branches = [func @b0(%0: c64[4], %1: f32[4]) -> (c64[4], f32[4]) {\n      %2 = exponential %0 : c64[4]\n      %3 = real %0 : f32[4]\n      %4 = add %3, %1 : f32[4]\n      return %2, %4\n    }, func @b1(%0: c64[4], %1: f32[4]) -> (c64[4], f32[4]) {\n      %2 = multiply %0, %0 : c64[4]\n      %3 = abs %0 : f32[4]\n      return %2, %3\n    }]} : c64[4], f32[4]\n  return %3, %4\n}\n",
    );
    // Complex numbers sorted by their real parts, a real operand carried along.
    compiles_and_agrees(
        "func @main(%0: c64[6], %1: i32[6]) -> (c64[6], i32[6]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @lt(%0: c64[], %1: c64[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = real %0 : f32[]\n      %5 = real %1 : f32[]\n      %6 = compare %4, %5 {comparison_direction = LT} : pred[]\n      return %6\n    }} : c64[6], i32[6]\n  return %2, %3\n}\n",
    );
}

/// Complex functions of numbers with subnormal and tiny parts (scaled up before they are
/// halved, divided or measured: `kiln_kernel`'s `scale_tiny`), `c64` and `c128`, against the
/// reference: the square root of 2^-149 + 0i was NaN, the logarithm, sign, cube root and
/// quotients of such numbers off by 1% to 30%.
#[test]
fn complex_functions_of_subnormal_parts_agree_with_the_reference() {
    let unary = [
        "sqrt",
        "rsqrt",
        "log",
        "log_plus_one",
        "exponential",
        "tan",
        "tanh",
        "sign",
        "logistic",
        "cbrt",
        "sine",
    ];
    let binary = ["divide", "multiply", "power", "atan2"];
    for (ct, dt, least, emin) in [
        ("c64", kiln_ir::DType::C64, 2f64.powi(-149), -126),
        ("c128", kiln_ir::DType::C128, f64::from_bits(1), -1022),
    ] {
        let parts = [
            0.0,
            least,
            -least,
            13.0 * least,
            -7.0 * least,
            1000.0 * least,
            -12345.0 * least,
            2f64.powi(emin + 3),
            3.0 * 2f64.powi(emin - 5),
            1e-20,
            1.0,
        ];
        let vals: Vec<[f64; 2]> = parts
            .iter()
            .flat_map(|&a| parts.iter().map(move |&b| [a, b]))
            .collect();
        let n = vals.len();
        let ty = kiln_ir::TensorType::new(dt, [n]);
        let x = Literal::from_complex_f64s(ty.clone(), &vals).unwrap();
        let rev: Vec<[f64; 2]> = vals.iter().rev().copied().collect();
        let y = Literal::from_complex_f64s(ty, &rev).unwrap();
        for op in unary.iter().chain(&binary) {
            let operands = if binary.contains(op) { "%0, %1" } else { "%0" };
            let src = format!(
                "func @main(%0: {ct}[{n}], %1: {ct}[{n}]) -> {ct}[{n}] {{\n  %2 = {op} {operands} : {ct}[{n}]\n  return %2\n}}\n"
            );
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let args = [x.clone(), y.clone()];
            let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
            let got = exe.run(&args).unwrap();
            common::check(&f, &args, &got).unwrap_or_else(|e| panic!("{ct} {op}: {e}"));
        }
    }
}

/// A complex triangular solve whose parts are subnormal: its quotients by the diagonal scale
/// a tiny numerator and divisor up first, as the reference's division does.
#[test]
fn complex_solves_of_subnormal_parts_agree_with_the_reference() {
    for (ct, dt, s) in [
        ("c64", kiln_ir::DType::C64, 2f64.powi(-140)),
        ("c128", kiln_ir::DType::C128, 2f64.powi(-1060)),
    ] {
        let src = format!(
            "func @main(%0: {ct}[2,2], %1: {ct}[2,2]) -> {ct}[2,2] {{\n  %2 = triangular_solve %0, %1 {{left_side = true, lower = true, unit_diagonal = false, transpose_a = ADJOINT}} : {ct}[2,2]\n  return %2\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let lit = |v: [[f64; 2]; 4]| {
            let v = v.map(|[x, y]| [x * s, y * s]);
            Literal::from_complex_f64s(kiln_ir::TensorType::new(dt, [2, 2]), &v).unwrap()
        };
        let args = [
            lit([[3.0, 1.0], [0.0, 0.0], [1.0, -2.0], [2.0, 5.0]]),
            lit([[1.0, 2.0], [-1.0, 0.5], [0.25, 1.0], [3.0, -1.0]]),
        ];
        let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
        common::compiled_whole(&exe).unwrap();
        let got = exe.run(&args).unwrap();
        common::check(&f, &args, &got).unwrap_or_else(|e| panic!("{ct}: {e}"));
    }
}
