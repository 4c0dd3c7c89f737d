//! The GPU mapping on the emulator against the reference interpreter: every spec example,
//! programs of every mapping, and random programs (with the wide ops that reach the kernels
//! for many updates and long folds; 2,000 by default, on an H200 and again with every
//! reduction cooperative; `KILN_GPU_EMU_PROGRAMS=N` for another count, `=A..B` for seeds `A`
//! to `B - 1`; a few minutes on 2 busy cores), plus the emulator's own checks (races,
//! divergent barriers, shuffles, accesses out of bounds: `gpu_emulator_checks.rs`).

use kiln_ir::random::{Config, Rng, random_func, random_literal_with_specials};
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_kernel::gpu::ir::*;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, EmuReport, V, compile_and_run, run_kernel};
use std::path::PathBuf;

mod products;
use products::{check_exact_product, count, mapped, product_text};

/// The examples of `ir-specs/ops/*.md`: (file:line, program, arguments).
fn spec_examples() -> Vec<(String, Func, Vec<Literal>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ir-specs/ops");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ir-specs/ops")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("readable spec");
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i] != "```kiln" {
                i += 1;
                continue;
            }
            let line = i + 1;
            let mut src = String::new();
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                src.push_str(lines[i]);
                src.push('\n');
                i += 1;
            }
            while i < lines.len() && lines[i] != "```values" {
                i += 1;
            }
            let mut args = Vec::new();
            let mut grid = false;
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                if let Some((k, v)) = lines[i].split_once(" = ")
                    && k.starts_with('%')
                {
                    args.push(v.to_string());
                }
                grid |= lines[i].starts_with("grid = ");
                i += 1;
            }
            // An example for a grid of processes runs on the grid (`tests/lib.rs`), not here.
            if grid {
                continue;
            }
            let name = format!("{}:{line}", p.file_name().unwrap().to_string_lossy());
            let m = kiln_ir::parse_module(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
            let f = m.entry().expect("a function").clone();
            let args = args
                .iter()
                .zip(f.param_types())
                .map(|(s, t)| {
                    kiln_ir::parse_literal(s, &t).unwrap_or_else(|e| panic!("{name}: {e}"))
                })
                .collect();
            out.push((name, f, args));
        }
    }
    out
}

/// Runs `f` on the emulator and compares it with the reference.
fn check(f: &Func, args: &[Literal]) -> Result<EmuReport, String> {
    check_on(f, args, &TargetInfo::h200())
}

/// An H200 that gives every reduction of 2 terms or more a warp, and of 64 or more a block of
/// 128 threads (blocks of at most 128), so random programs exercise the cooperative reductions' shuffles, barriers
/// and shared memory in every dtype and combiner, and a one-warp block tile that small products
/// fill, so they run by tiles.
/// Random arguments for `f`'s parameters, special values (NaN, infinities, zeros) among them,
/// from `seed`.
fn special_args(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect()
}

fn cooperative_target() -> TargetInfo {
    let mut t = TargetInfo::h200();
    let gpu = t.gpu.as_mut().expect("a GPU");
    gpu.warp_reduce_min = 2;
    gpu.block_reduce_min = 64;
    gpu.max_threads_per_block = 128;
    gpu.elementwise_block = 128;
    // A block tile of one warp (8 x 4, an element per thread) that the random programs'
    // small products fill, so they run by tiles.
    gpu.gemm_tiles.push(kiln_kernel::target::GemmTile {
        m: 8,
        n: 4,
        k: 8,
        thread_m: 1,
        thread_n: 1,
    });
    t
}

/// Runs `f` on the emulator for `target` and compares it with the reference.
fn check_on(f: &Func, args: &[Literal], target: &TargetInfo) -> Result<EmuReport, String> {
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(f, &[], &opts, target, args).map_err(|e| e.to_string())?;
    kiln_reference::accuracy::check_outputs(f, args, &got)?;
    // Every kernel is mapped: none falls back to the reference.
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    Ok(rep)
}

fn report(what: &str, n: usize, rep: &EmuReport, secs: f64) {
    let kinds: Vec<String> = rep
        .launches
        .iter()
        .map(|(k, n)| format!("{} {n}", k.name()))
        .collect();
    println!(
        "{what}: {n} programs, {} kernels emulated ({}), {} steps without a kernel interpreted, \
         {secs:.1} s",
        rep.kernels,
        kinds.join(", "),
        rep.interpreted
    );
}

#[test]
fn spec_examples_agree_with_the_reference_on_the_emulator() {
    let t = std::time::Instant::now();
    let mut rep = EmuReport::default();
    let mut failures = Vec::new();
    let mut host = Vec::new();
    let examples = spec_examples();
    for (name, f, args) in &examples {
        match check(f, args) {
            Ok(r) => {
                host.extend(r.interpreted_ops.iter().map(|op| format!("{name} {op}")));
                rep += r
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    report(
        "spec examples",
        examples.len(),
        &rep,
        t.elapsed().as_secs_f64(),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every other step is a GPU kernel; these stay on the host by design (docs/gpu.md, "What
    // runs on the host"): the collectives and the grid position, which the runtime's host
    // code exchanges with the other processes.
    let expected = [
        "all_gather.md:70 all_gather",
        "all_reduce.md:58 all_reduce",
        "all_to_all.md:60 all_to_all",
        "collective_broadcast.md:56 collective_broadcast",
        "collective_permute.md:49 collective_permute",
        "collective_reduce.md:50 collective_reduce",
        "partition_id.md:32 partition_id",
        "reduce_scatter.md:59 reduce_scatter",
        "replica_id.md:32 replica_id",
    ];
    assert_eq!(host, expected, "the spec examples' steps on the host");
}

/// The sub-byte integers on the emulator: every elementwise integer op on every pair of
/// values, conversions both ways, and reductions by one thread and cooperative ones.
#[test]
fn sub_byte_integers_agree_with_the_reference_on_the_emulator() {
    let binary = [
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
    let mut failures = Vec::new();
    for d in [DType::I4, DType::U4, DType::I2, DType::U2] {
        let (lo, hi) = d.int_bounds().unwrap();
        let v: Vec<i64> = (lo as i64..=hi as i64).collect();
        let n = v.len() * v.len();
        let a: Vec<i64> = v.iter().flat_map(|&x| v.iter().map(move |_| x)).collect();
        let b: Vec<i64> = v.iter().flat_map(|_| v.iter().copied()).collect();
        let mut body = String::new();
        let mut results = Vec::new();
        for (i, op) in binary.iter().enumerate() {
            body += &format!("  %r{i} = {op} %0, %1 : {d}[{n}]\n");
            results.push((format!("%r{i}"), format!("{d}[{n}]")));
        }
        let unary: &[&str] = if d.is_signed() {
            &[
                "negate",
                "abs",
                "sign",
                "not",
                "popcnt",
                "count_leading_zeros",
            ]
        } else {
            &["negate", "not", "popcnt", "count_leading_zeros"]
        };
        for (i, op) in unary.iter().enumerate() {
            body += &format!("  %u{i} = {op} %0 : {d}[{n}]\n");
            results.push((format!("%u{i}"), format!("{d}[{n}]")));
        }
        body += &format!("  %lt = compare %0, %1 {{comparison_direction = LT}} : pred[{n}]\n");
        results.push(("%lt".into(), format!("pred[{n}]")));
        body += &format!("  %f = convert %0 : f32[{n}]\n  %w = convert %f : i32[{n}]\n");
        body += &format!("  %s = multiply %w, %w : i32[{n}]\n  %back = convert %s : {d}[{n}]\n");
        results.push(("%back".into(), format!("{d}[{n}]")));
        let m = v.len();
        body +=
            &format!("  %2d = reshape %0 : {d}[{m},{m}]\n  %z = constant {{value = 0}} : {d}[]\n");
        for (i, kind) in ["add", "max", "min", "mul"].iter().enumerate() {
            body += &format!(
                "  %red{i} = reduce %2d, %z {{dimensions = [1], kind = {kind}}} : {d}[{m}]\n"
            );
            results.push((format!("%red{i}"), format!("{d}[{m}]")));
        }
        let names: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
        let types: Vec<&str> = results.iter().map(|r| r.1.as_str()).collect();
        let text = format!(
            "func @main(%0: {d}[{n}], %1: {d}[{n}]) -> ({}) {{\n{body}  return {}\n}}\n",
            types.join(", "),
            names.join(", ")
        );
        let f = kiln_ir::parse_func_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let args = [
            Literal::from_i64s(TensorType::new(d, [n]), &a).unwrap(),
            Literal::from_i64s(TensorType::new(d, [n]), &b).unwrap(),
        ];
        for target in [TargetInfo::h200(), cooperative_target()] {
            if let Err(e) = check_on(&f, &args, &target) {
                failures.push(format!("{d}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn random_programs_agree_with_the_reference_on_the_emulator() {
    random_programs("random programs", &TargetInfo::h200(), 2000, &|seed| {
        Some(random_func(
            &mut Rng::new(seed),
            &Config::profile(seed).with_wide(),
        ))
    });
}

/// Programs with complex parameters: their complex values computed on parts by the same
/// kernels, each complex result checked part by part (`kiln_reference::accuracy`).
#[test]
fn random_complex_programs_agree_with_the_reference_on_the_emulator() {
    random_programs(
        "random complex programs",
        &TargetInfo::h200(),
        3000,
        &|seed| {
            let cfg = Config {
                ops: 1 + (seed as usize % 10),
                ..Config::default()
            }
            .with_complex();
            let f = random_func(&mut Rng::new(seed), &cfg);
            f.values.iter().any(|t| t.dtype.is_complex()).then_some(f)
        },
    );
}

/// Complex numbers whose parts are subnormal (the bits of small `u64`s, random seed 48895):
/// scaled up before they are halved, divided or measured, so the roots, logarithm, sign and
/// quotients keep their bits (the square root of 2^-149 + 0i was NaN on both targets).
#[test]
fn complex_functions_of_subnormal_parts_agree_on_the_emulator() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: u64[8], %1: u64[8]) -> (c64[8], c64[8], c64[8], c64[8], c64[8], c64[8]) {\n  %2 = bitcast_convert %0 : c64[8]\n  %3 = bitcast_convert %1 : c64[8]\n  %4 = sqrt %2 : c64[8]\n  %5 = rsqrt %2 : c64[8]\n  %6 = log %2 : c64[8]\n  %7 = sign %2 : c64[8]\n  %8 = cbrt %2 : c64[8]\n  %9 = divide %2, %3 : c64[8]\n  return %4, %5, %6, %7, %8, %9\n}\n",
    )
    .unwrap();
    let t = TensorType::new(DType::U64, [8]);
    // Low word the real part's bits, high word the imaginary part's.
    let words = |v: [u64; 8]| Literal::from_i64s(t.clone(), &v.map(|x| x as i64)).unwrap();
    let hi = 1 << 32;
    let x = words([
        1,
        13,
        36,
        7 * hi + 3,
        2 * hi,
        hi | 0x8000_0000,
        0x0080_0000,
        4,
    ]);
    let y = words([
        3 * hi + 2,
        1,
        5 * hi,
        9,
        hi + 1,
        0x0040_0000,
        2,
        0x3f80_0000,
    ]);
    check(&f, &[x, y]).unwrap();
}

/// `fft` programs with complex parameters and results run in kernels alone on the GPU mapping:
/// the transform as products (`kiln_kernel::fft`) on the parts, the interleaved parameters
/// and results as byte copies; nothing is left to the reference interpreter.
#[test]
fn fft_programs_run_in_kernels_alone() {
    for (x, t, n, r) in [
        ("c64[3,12]", "FFT", "[12]", "c64[3,12]"),
        ("c64[2,97]", "IFFT", "[97]", "c64[2,97]"),
        ("f32[2,100]", "RFFT", "[100]", "c64[2,51]"),
        ("c64[4,3]", "IRFFT", "[4, 5]", "f32[4,5]"),
    ] {
        let src = format!(
            "func @main(%0: {x}) -> {r} {{\n  %1 = fft %0 {{fft_type = {t}, fft_length = {n}}} : {r}\n  return %1\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let rep = check_on(&f, &special_args(&f, 3), &TargetInfo::h200())
            .unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(rep.interpreted, 0, "{src}");
        assert!(rep.kernels > 0, "{src}");
    }
}

/// A product inlined into a pad: the padding's guard keeps the positions past the product from
/// reading its operands, so its reduction is not computed ahead of the guard (random seed 1603
/// read past the end of `%1` on the cooperative target).
#[test]
fn a_reduction_under_a_guard_is_not_computed_ahead_of_it() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f16[2], %1: f16[2,4]) -> f16[6] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : f16[4]\n  %3 = constant {value = 0.0} : f16[]\n  %4 = pad %2, %3 {edge_padding_low = [0], edge_padding_high = [2], interior_padding = [0]} : f16[6]\n  return %4\n}\n",
    )
    .unwrap();
    let args = special_args(&f, 5);
    check_on(&f, &args, &cooperative_target()).unwrap();
}

/// A byte copy (a bitcast of `bf16[1]` to `f16[1]`: two bytes) beside a kernel over two
/// elements: merged into it, the copy's input was read as `bf16` elements, past the one it has
/// (random seed 17423, beside an argmin's fold); it keeps its own kernel.
#[test]
fn a_byte_copy_beside_a_sibling_reads_its_input_as_bytes() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: bf16[2], %1: bf16[1]) -> (f16[1], bf16[2]) {\n  %2 = exponential %0 : bf16[2]\n  %3 = bitcast_convert %1 : f16[1]\n  return %3, %2\n}\n",
    )
    .unwrap();
    let args = special_args(&f, 5);
    check(&f, &args).unwrap();
}

#[test]
fn random_programs_agree_with_the_reference_with_every_reduction_cooperative() {
    random_programs(
        "random programs, cooperative reductions",
        &cooperative_target(),
        2000,
        &|seed| {
            Some(random_func(
                &mut Rng::new(seed),
                &Config::profile(seed).with_wide(),
            ))
        },
    );
}

/// The programs `program` makes of seeds `0..n` (or those `KILN_GPU_EMU_PROGRAMS` names: a
/// count `N` for `0..N`, or a range `A..B` for fresh seeds; `None` skips a seed) on the
/// emulator for `target` against the reference.
fn random_programs(what: &str, target: &TargetInfo, n: u64, program: &dyn Fn(u64) -> Option<Func>) {
    let knob = std::env::var("KILN_GPU_EMU_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_GPU_EMU_PROGRAMS", knob.as_deref(), 0..n).unwrap();
    let t = std::time::Instant::now();
    let mut rep = EmuReport::default();
    let (mut ran, mut failures) = (0, Vec::new());
    for seed in seeds {
        let Some(f) = program(seed) else { continue };
        ran += 1;
        let mut rng = Rng::new(seed ^ 77);
        let rate = if seed % 2 == 1 && Config::profile(seed).elements.is_none() {
            1.0 / 32.0
        } else {
            0.0
        };
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, rate))
            .collect();
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_on(&f, &args, target)))
                .unwrap_or_else(|_| Err("panicked".into()));
        match r {
            Ok(r) => rep += r,
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    report(what, ran, &rep, t.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{} of {ran} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Whether two regions share a byte.
fn overlap(a: &kiln_kernel::gpu::plan::Region, b: &kiln_kernel::gpu::plan::Region) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.offset < b.end() && b.offset < a.end()
}

/// The device plans of 500 random programs (and the spec examples) keep what the PTX kernels
/// assume: every region inside the arena, a kernel step's outputs apart from each other, from
/// its inputs and from its scratch buffers (the kernels take them `noalias`), scratch inside
/// the scratch region, parameters and constants apart from every kernel's outputs; and some
/// plans pack their intermediates into less memory than a region each would take.
#[test]
fn device_plans_keep_each_launchs_buffers_apart() {
    use kiln_kernel::gpu::plan::{DeviceStep, device_plan};
    let target = TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    let mut programs: Vec<(String, Func)> = spec_examples()
        .into_iter()
        .map(|(name, f, _)| (name, f))
        .collect();
    for seed in 0..500u64 {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        programs.push((format!("seed {seed}"), f));
    }
    // A chain of products: the first product is dead once the second is computed, so the third
    // can take its memory (random programs seldom have such chains: one in 600 or none).
    let dot = |a: usize, b: usize| {
        format!(
            "  %{b} = dot_general %{a}, %{a} {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[64,64]\n"
        )
    };
    let chain = format!(
        "func @main(%0: f32[64,64]) -> f32[64,64] {{\n{}{}{}{}  return %4\n}}\n",
        dot(0, 1),
        dot(1, 2),
        dot(2, 3),
        dot(3, 4)
    );
    programs.push((
        "a chain of products".into(),
        kiln_ir::parse_func_text(&chain).unwrap(),
    ));
    let (mut reused, mut steps) = (0, 0);
    for (name, f) in &programs {
        let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, &target, None, &mut |_| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = device_plan(&l, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
        reused += usize::from(plan.intermediate_bytes < plan.unplanned_bytes);
        let fixed: Vec<_> = plan
            .func
            .params
            .iter()
            .chain(plan.constants.iter().map(|(v, _)| v))
            .map(|v| plan.places[v.index()].unwrap())
            .collect();
        for r in plan.places.iter().flatten() {
            assert!(r.end() <= plan.arena_bytes, "{name}: {r:?} past the arena");
        }
        for step in &plan.steps {
            let DeviceStep::Kernel(k) = step else {
                continue;
            };
            steps += 1;
            for (i, (v, out)) in k.outputs.iter().enumerate() {
                for (w, other) in k.outputs.iter().skip(i + 1) {
                    assert!(
                        !overlap(out, other),
                        "{name}: %{} and %{} overlap",
                        v.index(),
                        w.index()
                    );
                }
                for (w, input) in &k.inputs {
                    assert!(
                        !overlap(out, input),
                        "{name}: %{} overlaps input %{}",
                        v.index(),
                        w.index()
                    );
                }
                for s in &k.scratch {
                    assert!(!overlap(out, s), "{name}: %{} overlaps scratch", v.index());
                }
                for f in &fixed {
                    assert!(
                        !overlap(out, f),
                        "{name}: %{} overlaps a parameter or constant",
                        v.index()
                    );
                }
            }
            for s in &k.scratch {
                assert!(
                    s.offset >= plan.scratch.offset && s.end() <= plan.scratch.end(),
                    "{name}: scratch {s:?} outside {:?}",
                    plan.scratch
                );
            }
        }
    }
    println!(
        "{} device plans, {steps} kernel steps, {reused} reusing intermediates' memory",
        programs.len()
    );
    assert!(reused > 0, "no plan reused memory");
}

fn tid() -> Sc {
    Sc::Special(Special::Thread)
}

/// A softmax over the last dimension of `shape` in `dt`.
fn softmax_text(dt: &str, shape: &[usize]) -> String {
    let list = |s: &[usize]| {
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let r = shape.len();
    let full = format!("{dt}[{}]", list(shape));
    let red = format!("{dt}[{}]", list(&shape[..r - 1]));
    let bd = (0..r - 1)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let last = r - 1;
    format!(
        "func @main(%0: {full}) -> {full} {{\n  %1 = constant {{value = -inf}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [{last}], kind = max}} : {red}\n  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [{bd}]}} : {full}\n  %4 = subtract %0, %3 : {full}\n  %5 = exponential %4 : {full}\n  %6 = constant {{value = 0.0}} : {dt}[]\n  %7 = reduce %5, %6 {{dimensions = [{last}], kind = add}} : {red}\n  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [{bd}]}} : {full}\n  %9 = divide %5, %8 : {full}\n  return %9\n}}\n"
    )
}

/// Attention, `softmax(q kᵀ / 8) v`: two products chained through a row epilogue.
fn attention_text(b: usize, m: usize, keys: usize, k: usize, n2: usize) -> String {
    let s = format!("f32[{b},{m},{keys}]");
    format!(
        "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{keys},{k}], %2: f32[{b},{keys},{n2}]) -> f32[{b},{m},{n2}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}
  %4 = constant {{value = 0.125}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
  %6 = multiply %3, %5 : {s}
  %7 = constant {{value = -inf}} : f32[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : f32[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : f32[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : f32[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{b},{m},{n2}]
  return %16
}}
"
    )
}

/// Programs that exercise every mapping: softmaxes by warps and by blocks, long sums (a whole
/// tensor to one value, rows, columns), a layer norm's mean and variance, matrix products with
/// and without epilogues, attention's chained products, convolutions (by feature planes and by
/// rows), in f32, f16 and f64.
#[test]
fn every_mapping_agrees_with_the_reference() {
    let conv = |x: &str, w: &str, y: &str, attrs: &str| {
        format!(
            "func @main(%0: {x}, %1: {w}) -> {y} {{\n  %2 = convolution %0, %1 {{{attrs}}} : {y}\n  return %2\n}}\n"
        )
    };
    let nchw = "window_strides = [2, 2], padding = [[1, 0], [0, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 2], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]";
    let nhwc = "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]";
    let sum = |x: &str, dims: &str, r: &str| {
        format!(
            "func @main(%0: {x}) -> {r} {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [{dims}], kind = add}} : {r}\n  return %2\n}}\n"
        )
    };
    let layer_norm = "func @main(%0: f32[6,3000]) -> f32[6,3000] {
  %1 = constant {value = 0.0} : f32[]
  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[6]
  %3 = constant {value = 0.000333333} : f32[]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = []} : f32[6]
  %5 = multiply %2, %4 : f32[6]
  %6 = broadcast_in_dim %5 {broadcast_dimensions = [0]} : f32[6,3000]
  %7 = subtract %0, %6 : f32[6,3000]
  %8 = multiply %7, %7 : f32[6,3000]
  %9 = reduce %8, %1 {dimensions = [1], kind = add} : f32[6]
  %10 = multiply %9, %4 : f32[6]
  %11 = rsqrt %10 : f32[6]
  %12 = broadcast_in_dim %11 {broadcast_dimensions = [0]} : f32[6,3000]
  %13 = multiply %7, %12 : f32[6,3000]
  return %13
}
"
    .to_string();
    let product = |b: usize, m: usize, k: usize, n: usize| {
        format!(
            "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{k},{n}], %2: f32[{n}]) -> f32[{b},{m},{n}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{b},{m},{n}]
  %4 = broadcast_in_dim %2 {{broadcast_dimensions = [2]}} : f32[{b},{m},{n}]
  %5 = add %3, %4 : f32[{b},{m},{n}]
  %6 = tanh %5 : f32[{b},{m},{n}]
  return %6
}}
"
        )
    };
    let programs = [
        softmax_text("f32", &[37, 500]),
        softmax_text("f16", &[4, 9, 300]),
        softmax_text("f64", &[3, 20000]),
        softmax_text("f32", &[2, 40000]),
        // Rows cached in registers (above: 500 on a warp, 20000 on a block) and in shared
        // memory (1100 on a warp).
        softmax_text("bf16", &[5, 1100]),
        sum("f32[300000]", "0", "f32[]"),
        sum("f32[40,700]", "1", "f32[40]"),
        sum("f32[700,40]", "0", "f32[40]"),
        sum("f32[5,6,7,300]", "1, 3", "f32[5,7]"),
        layer_norm,
        product(2, 17, 300, 33),
        product(1, 64, 1000, 8),
        // A's contraction first (stored transposed), in f16 and in i32.
        "func @main(%0: f16[300,17], %1: f16[300,9]) -> f16[17,9] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : f16[17,9]\n  return %2\n}\n".to_string(),
        "func @main(%0: i32[30,7], %1: i32[30,5]) -> i32[7,5] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : i32[7,5]\n  return %2\n}\n".to_string(),
        attention_text(2, 9, 40, 8, 12),
        attention_text(1, 5, 3000, 16, 7),
        conv("f32[2,3,9,8]", "f32[4,3,3,2]", "f32[2,4,4,4]", nchw),
        conv("f32[2,7,7,3]", "f32[3,3,3,5]", "f32[2,7,7,5]", nhwc),
    ];
    let mut rep = EmuReport::default();
    let mut failures = Vec::new();
    for (i, src) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let mut rng = Rng::new(i as u64);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        match check(&f, &args) {
            Ok(r) => rep += r,
            Err(e) => failures.push(format!("program {i}: {e}\n{src}")),
        }
    }
    report("every mapping", programs.len(), &rep, 0.0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in [
        MapKind::Elementwise,
        MapKind::WarpRows,
        MapKind::BlockRows,
        MapKind::GemmTiled,
    ] {
        assert!(
            rep.launches.contains_key(&kind),
            "no {} launch: {rep:?}",
            kind.name()
        );
    }
}

/// Rows long enough for each thread to add many chunks (a tree of chunk results two levels
/// deep with blocks of 128 threads) stay within the sum's error bound, ones and random values.
/// On a GPU of two multiprocessors, so that the two rows keep a block each rather than split
/// over blocks (`gpu_split_reduce.rs`).
#[test]
fn long_rows_sum_chunk_results_in_a_tree() {
    let src = "func @main(%0: f32[2,700000]) -> f32[2] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[2]\n  return %2\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let ty = f.param_types()[0].clone();
    let ones = Literal::from_f64s(ty.clone(), &vec![0.1; ty.numel()]).unwrap();
    let random = random_literal_with_specials(&mut Rng::new(3), &ty, 0.0);
    for args in [vec![ones], vec![random]] {
        let mut target = cooperative_target();
        target.gpu.as_mut().expect("a GPU").sms = 2;
        let rep = check_on(&f, &args, &target).unwrap();
        assert_eq!(rep.launches.get(&MapKind::BlockRows), Some(&1), "{rep:?}");
    }
}

/// Products by block tiles against the reference: every tile size of an H200 (the shape picks
/// it), rows, columns and contractions that are not multiples of the tiles, a contraction of
/// one, contractions past one chunk of the sum tree and past sixteen (two levels above the
/// chunks), batches, both operands transposed or not, f32 and f64, f16 and bf16 operands with
/// an f32 result (on the tensor cores), with and without an epilogue (the last field: whether
/// the product runs by tiles: on the CUDA cores, or on the tensor cores for 16-bit operands). Products of 16-bit operands with a result of their dtype run on the tensor cores, the conversion in their launch; products the lowering keeps as loop nests (an integer result) and
/// products too thin for a tile (a matrix times a vector) agree too.
#[test]
fn products_by_block_tiles_agree_with_the_reference() {
    type Case = (
        (usize, usize, usize, usize),
        (&'static str, &'static str),
        bool,
        bool,
        bool,
        bool,
    );
    let cases: &[Case] = &[
        ((1, 130, 17, 129), ("f32", "f32"), false, false, false, true),
        ((2, 67, 9, 70), ("f32", "f32"), true, true, true, true),
        ((3, 33, 1, 40), ("f64", "f64"), false, true, true, true),
        ((1, 20, 600, 24), ("f32", "f32"), true, false, false, true),
        ((1, 9, 4100, 8), ("f32", "f32"), false, false, false, true),
        ((2, 19, 40, 17), ("f16", "f32"), false, false, true, true),
        ((1, 70, 33, 65), ("bf16", "f32"), false, true, false, true),
        ((2, 18, 300, 21), ("bf16", "f32"), true, false, true, true),
        ((2, 64, 40, 96), ("f32", "f32"), true, false, true, true),
        ((1, 36, 24, 20), ("f64", "f64"), true, false, false, true),
        ((1, 72, 48, 40), ("bf16", "f32"), false, true, true, true),
        ((2, 40, 24, 72), ("f16", "f32"), false, false, false, true),
        ((1, 1, 1, 1), ("f32", "f32"), false, false, false, false),
        ((2, 30, 50, 3), ("f32", "f32"), false, true, false, false),
        ((2, 18, 30, 21), ("bf16", "bf16"), true, false, true, true),
        ((1, 40, 48, 72), ("f16", "f16"), false, true, false, true),
        ((1, 17, 31, 66), ("i32", "i32"), true, true, false, false),
        ((2, 9, 12, 8), ("u8", "u8"), false, false, false, false),
    ];
    let mut failures = Vec::new();
    for (i, &(shape, dts, at, bt, ep, tiled)) in cases.iter().enumerate() {
        let src = product_text(shape, dts, at, bt, ep);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("case {i}: {e}\n{src}"));
        let mut rng = Rng::new(100 + i as u64);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        // Products of 16-bit operands run on the tensor cores (with an f32 result, or with
        // their own, the f32 product converted as it is stored).
        let half = matches!(dts.0, "bf16" | "f16");
        let (simt, mma) = (tiled && !half, tiled && half);
        match check(&f, &args) {
            Ok(r)
                if r.launches.contains_key(&MapKind::GemmTiled) != simt
                    || r.launches.contains_key(&MapKind::GemmMma) != mma =>
            {
                failures.push(format!(
                    "case {i}: by tiles expected {simt}, on tensor cores {mma}: {:?}\n{src}",
                    r.launches
                ))
            }
            // The epilogue (bias and tanh) runs in the product's launch.
            Ok(r) if r.launches.values().sum::<usize>() != 1 => failures.push(format!(
                "case {i}: one launch expected: {:?}\n{src}",
                r.launches
            )),
            Ok(_) => {}
            Err(e) => failures.push(format!("case {i}: {e}\n{src}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A target without block tiles keeps the one-thread-per-element product, which agrees too.
#[test]
fn products_without_tiles_run_one_thread_per_element() {
    let mut t = TargetInfo::h200();
    t.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    let src = product_text((2, 9, 40, 5), ("f32", "f32"), true, false, true);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let args = special_args(&f, 7);
    let rep = check_on(&f, &args, &t).unwrap();
    assert_eq!(rep.launches.get(&MapKind::Gemm), Some(&1), "{rep:?}");
    assert_eq!(rep.launches.get(&MapKind::GemmTiled), None, "{rep:?}");
}

/// One warp's tensor-core tile (`ldmatrix` of A and B from packed shared memory, one
/// `mma.m16n8k16`, C and D by the accumulator layout) on known matrices, bf16 and f16: small
/// integers, so every product and sum is exact and D must be `A x B + C` exactly. A wrong
/// fragment layout (of A, B, C or D) puts elements elsewhere and fails.
#[test]
fn a_warp_tile_on_tensor_cores_computes_the_product() {
    for dtype in [DType::BF16, DType::F16] {
        let k = kiln_kernel::gpu::mma::warp_tile(dtype, TargetInfo::h200().sums);
        kiln_kernel::gpu::print::verify(&k, TargetInfo::h200().gpu.as_ref().unwrap()).unwrap();
        let a = |r: usize, c: usize| ((r * 3 + c * 5) % 11) as f64 - 5.0;
        let b = |kk: usize, n: usize| ((kk * 7 + n * 2) % 9) as f64 - 4.0;
        let cm = |r: usize, n: usize| (r * 8 + n) as f64 * 0.5;
        let buf = |name: &str, dtype, data: Vec<f64>| Buffer {
            name: name.into(),
            dtype,
            data: data.into_iter().map(V::F).collect(),
        };
        let a_buf = buf("%a", dtype, (0..256).map(|i| a(i / 16, i % 16)).collect());
        // B by columns: element `n * 16 + k` is B's (k, n).
        let b_buf = buf("%b", dtype, (0..128).map(|i| b(i % 16, i / 16)).collect());
        let c_buf = buf(
            "%c",
            DType::F32,
            (0..128).map(|i| cm(i / 8, i % 8)).collect(),
        );
        let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
        run_kernel(&k, &[&a_buf, &b_buf, &c_buf], &mut out).unwrap();
        for r in 0..16 {
            for n in 0..8 {
                let want = cm(r, n) + (0..16).map(|kk| a(r, kk) * b(kk, n)).sum::<f64>();
                assert_eq!(out[0].data[r * 8 + n], V::F(want), "{dtype} D[{r}][{n}]");
            }
        }
    }
}

/// `ldmatrix` and `mma` need the whole warp, and `ldmatrix` reads a packed array in bounds.
#[test]
fn tensor_core_statements_need_the_whole_warp() {
    let mut k = kiln_kernel::gpu::mma::warp_tile(DType::BF16, TargetInfo::h200().sums);
    let at = k
        .body
        .iter()
        .position(|s| matches!(s, Stmt::LdMatrix { .. }))
        .unwrap();
    let ld = k.body[at].clone();
    k.body[at] = Stmt::If {
        cond: Sc::lt(tid(), Sc::Const(16)),
        body: vec![ld],
    };
    let zeros = |n: usize, dtype| Buffer {
        name: "%x".into(),
        dtype,
        data: vec![V::F(0.0); n],
    };
    let (a, b, c) = (
        zeros(256, DType::BF16),
        zeros(128, DType::BF16),
        zeros(128, DType::F32),
    );
    let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("an ldmatrix by 16 of the 32 lanes"), "{e}");
    let mut k = kiln_kernel::gpu::mma::warp_tile(DType::BF16, TargetInfo::h200().sums);
    k.shared[0].len = 200;
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("out-of-bounds"), "{e}");
}

/// `cp.async` copies land only when waited for: without the wait, reading the elements they
/// copy into is an error. A copy from a misaligned element is an error.
#[test]
fn async_copies_land_when_waited_for() {
    let buf = |name: &str, dtype, n: usize, x: f64| Buffer {
        name: name.into(),
        dtype,
        data: vec![V::F(x); n],
    };
    let (a, b, c) = (
        buf("%a", DType::BF16, 256, 1.0),
        buf("%b", DType::BF16, 128, 2.0),
        buf("%c", DType::F32, 128, 0.5),
    );
    let mut k = kiln_kernel::gpu::mma::warp_tile(DType::BF16, TargetInfo::h200().sums);
    let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
    run_kernel(&k, &[&a, &b, &c], &mut out).unwrap();
    assert!(
        out[0].data.iter().all(|&v| v == V::F(32.5)),
        "{:?}",
        out[0].data
    );
    k.body.retain(|s| !matches!(s, Stmt::CopyWait { .. }));
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("while a cp.async into it is in flight"), "{e}");
    let mut k = kiln_kernel::gpu::mma::warp_tile(DType::BF16, TargetInfo::h200().sums);
    if let Some(Stmt::CopyAsync { src, .. }) = k.body.first_mut() {
        *src = Sc::plus(src.clone(), Sc::Const(1));
    }
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("misaligned cp.async"), "{e}");
}

/// The GEMM kernel of the product `(batch, m, k, n)` (A with its contraction first when
/// `a_trans`, B with its contraction last when `b_trans`), lowered for `target` in f32, mapped
/// with its operands of `dtype` instead: what a product of bf16 or f16 operands with an f32
/// result is mapped as.
fn product_on(
    target: &TargetInfo,
    (batch, m, k, n): (usize, usize, usize, usize),
    a_trans: bool,
    b_trans: bool,
    dtype: DType,
) -> GpuProgram {
    let src = product_text((batch, m, k, n), ("f32", "f32"), a_trans, b_trans, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    mapped(&f, target, Some(dtype)).remove(0)
}

/// An H200 whose tensor-core products run `stages` stages of `k` contraction indices (and
/// CUDA-core products `stages` stages of their tiles), its kernels free to declare all of a
/// block's shared memory (as with dynamic shared memory), so that every ring fits.
fn pipeline_target(stages: usize, k: usize) -> TargetInfo {
    let mut t = TargetInfo::h200();
    let gpu = t.gpu.as_mut().expect("a GPU");
    gpu.static_shared_bytes = gpu.shared_memory_per_block;
    gpu.mma_stages = stages;
    gpu.gemm_stages = stages;
    for tile in &mut gpu.mma_tiles {
        tile.k = k;
    }
    t
}

/// The stages and contraction per stage of tensor-core launch `l` of a product of contraction
/// `k` on [`pipeline_target`]`(stages, kt)`, checked against what the mapping must choose
/// there (the shared memory of an H200 holds every such ring): a stage of `kt`, or of the
/// contraction rounded up to 16 when it is shorter; at most one stage more than the steps,
/// and two where no operand is copied with `cp.async`; the loop waiting for all but
/// `stages - 2` groups.
fn check_pipeline(l: &GpuKernel, k: usize, (stages, kt): (usize, usize), what: &str) {
    let kt = kt.min(k.next_multiple_of(16));
    let copies = count(&l.body, &|s| matches!(s, Stmt::CopyAsync { .. })) > 0;
    let stages = if copies {
        stages.min(k.div_ceil(kt) + 1).max(2)
    } else {
        2
    };
    let rows = l.shared[0].len / (stages * kt);
    assert!(
        l.shared[0].len == rows * stages * kt && [16, 64, 128].contains(&rows),
        "{what}: shared0 of {} elements for {stages} stages of {kt}",
        l.shared[0].len
    );
    let wait = |s: &Stmt| matches!(s, Stmt::CopyWait { pending } if *pending == stages - 2);
    assert_eq!(count(&l.body, &wait), usize::from(copies), "{what}");
}

/// Products of bf16 and f16 operands with an f32 result on the tensor cores (`ldmatrix`,
/// `mma`): both tile sizes of an H200, rows, columns and contractions that are not multiples
/// of the tiles, a contraction of one and one past a chunk of the sum tree, batches, both
/// operands transposed or not, for bf16 under every pipeline of 2 to 4 stages of 16, 32 or 64
/// (contractions that end inside a stage and inside the ring, operands copied with `cp.async`
/// and through registers). The operands are small integers, so every sum is exact in f32 and
/// the result must be the exact product: a wrong fragment layout, staging or store fails.
#[test]
fn products_on_tensor_cores_are_exact_on_integers() {
    let cases = [
        ((1, 64, 32, 64), false, false),
        ((2, 70, 40, 65), true, true),
        ((1, 20, 17, 24), false, true),
        ((1, 9, 300, 8), true, false),
        ((3, 33, 1, 17), false, false),
        ((2, 24, 200, 40), false, false),
        ((1, 40, 72, 17), false, true),
        ((1, 70, 96, 66), false, false),
    ];
    let mut runs = vec![(DType::F16, (3, 32))];
    for stages in 2..=4 {
        for kt in [16, 32, 64] {
            runs.push((DType::BF16, (stages, kt)));
        }
    }
    for (dtype, (stages, kt)) in runs {
        let target = pipeline_target(stages, kt);
        for (c, &((batch, m, k, n), at, bt)) in cases.iter().enumerate() {
            let what = format!("{dtype} case {c}, {stages} stages of {kt}");
            let p = product_on(&target, (batch, m, k, n), at, bt, dtype);
            assert_eq!(p.launches.len(), 1, "{what}");
            assert_eq!(p.launches[0].kind, MapKind::GemmMma, "{what}");
            check_pipeline(&p.launches[0], k, (stages, kt), &what);
            check_exact_product(&p, (batch, m, k, n), (at, bt), dtype)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}

/// Every statement list in `body`, nested ones too, given to `f`.
fn each_body(body: &mut Vec<Stmt>, f: &mut dyn FnMut(&mut Vec<Stmt>)) {
    f(body);
    for s in body.iter_mut() {
        if let Stmt::For { body, .. } | Stmt::If { body, .. } = s {
            each_body(body, f);
        }
    }
}

/// The pipelined products stage their tiles with `cp.async` where the operand's contiguous
/// dimension is the tile's (on the tensor cores A by rows and B either way; on the CUDA cores
/// A transposed and B by rows), with one barrier per contraction step, in rings of 2, 3 and 4
/// stages (the first `stages - 1` steps staged before the loop). Their results are exact on
/// small integers. Without the wait for the copies, or waiting for all but one group more
/// than the ring allows (so the step being multiplied may still be in flight), the emulator
/// refuses the read of a shared element a copy is still landing in.
#[test]
fn pipelined_products_need_their_copy_waits() {
    let cases = [
        ((1, 72, 112, 40), false, true, DType::BF16, MapKind::GemmMma),
        // B by rows, staged by rows and loaded with `ldmatrix.trans`.
        ((2, 40, 104, 72), false, false, DType::F16, MapKind::GemmMma),
        ((2, 64, 40, 96), true, false, DType::F32, MapKind::GemmTiled),
    ];
    let runs = cases.into_iter().flat_map(|c| (2..=4).map(move |s| (c, s)));
    for (((batch, m, k, n), at, bt, dtype, kind), stages) in runs {
        let target = pipeline_target(stages, 32);
        let p = product_on(&target, (batch, m, k, n), at, bt, dtype);
        let l = &p.launches[0];
        assert_eq!(l.kind, kind);
        // Both tiles, before the loop (`stages - 1` times) and in it.
        assert_eq!(
            count(&l.body, &|s| matches!(s, Stmt::CopyAsync { .. })),
            2 * stages,
            "{kind:?}, {stages} stages"
        );
        assert_eq!(
            count(&l.body, &|s| matches!(s, Stmt::Barrier)),
            1,
            "{kind:?}"
        );
        let av = |i: usize| (i % 7) as f64 - 3.0;
        let bv = |i: usize| (i % 5) as f64 - 2.0;
        let buf = |name: &str, n: usize, v: &dyn Fn(usize) -> f64| Buffer {
            name: name.into(),
            dtype,
            data: (0..n).map(|i| V::F(v(i))).collect(),
        };
        let (a, b) = (buf("%a", batch * m * k, &av), buf("%b", batch * k * n, &bv));
        let out_t = TensorType {
            dtype: p.launches[0].outputs[0].1.dtype,
            shape: vec![batch, m, n],
        };
        let mut out = vec![Buffer::zeros("%d", &out_t)];
        kiln_runtime::gpu_emu::run_program(&p, &[&a, &b], &mut out).unwrap();
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let ai = |kk: usize| {
                        if at {
                            (bi * k + kk) * m + i
                        } else {
                            (bi * m + i) * k + kk
                        }
                    };
                    let bi_ = |kk: usize| {
                        if bt {
                            (bi * n + j) * k + kk
                        } else {
                            (bi * k + kk) * n + j
                        }
                    };
                    let want: f64 = (0..k).map(|kk| av(ai(kk)) * bv(bi_(kk))).sum();
                    assert_eq!(out[0].data[(bi * m + i) * n + j], V::F(want), "{kind:?}");
                }
            }
        }
        let broken = |f: &mut dyn FnMut(&mut Vec<Stmt>)| {
            let mut p = p.clone();
            each_body(&mut p.launches[0].body, f);
            let mut out = vec![Buffer::zeros("%d", &out_t)];
            kiln_runtime::gpu_emu::run_program(&p, &[&a, &b], &mut out)
                .unwrap_err()
                .to_string()
        };
        let e = broken(&mut |b| b.retain(|s| !matches!(s, Stmt::CopyWait { .. })));
        assert!(e.contains("while a cp.async into it is in flight"), "{e}");
        let e = broken(&mut |b| {
            for s in b.iter_mut() {
                if let Stmt::CopyWait { pending } = s {
                    *pending += 1;
                }
            }
        });
        assert!(e.contains("while a cp.async into it is in flight"), "{e}");
    }
}

/// A product with a bias, a relu and a residual added, on `(inp, dt)` operands and result.
fn epilogue_text(
    (batch, m, k, n): (usize, usize, usize, usize),
    (inp, dt): (&str, &str),
) -> String {
    let y = format!("{dt}[{batch},{m},{n}]");
    format!(
        "func @main(%0: {inp}[{batch},{m},{k}], %1: {inp}[{batch},{k},{n}], %2: {dt}[{n}], %3: {y}) -> {y} {{
  %4 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {y}
  %5 = broadcast_in_dim %2 {{broadcast_dimensions = [2]}} : {y}
  %6 = add %4, %5 : {y}
  %7 = constant {{value = 0.0}} : {dt}[]
  %8 = broadcast_in_dim %7 {{broadcast_dimensions = []}} : {y}
  %9 = maximum %6, %8 : {y}
  %10 = add %9, %3 : {y}
  return %10
}}
"
    )
}

/// Elementwise epilogues (a bias, a relu, a residual) run inside the product's launch on every
/// product mapping (by tiles on the CUDA cores, on the tensor cores with pipelines of 2 to 4
/// stages, one thread per element),
/// and so does the conversion of a bf16 product's f32 accumulators to bf16:
/// one launch, no scratch product, results that agree with the reference. A softmax epilogue
/// (which needs whole rows) not chained into a second product keeps its own launch.
#[test]
fn elementwise_epilogues_run_in_the_products_launch() {
    let mut untiled = TargetInfo::h200();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    let cases = [
        (
            (2, 70, 40, 65),
            ("f32", "f32"),
            MapKind::GemmTiled,
            TargetInfo::h200(),
        ),
        (
            (1, 72, 48, 40),
            ("bf16", "f32"),
            MapKind::GemmMma,
            TargetInfo::h200(),
        ),
        ((2, 9, 20, 5), ("f32", "f32"), MapKind::Gemm, untiled),
        (
            (1, 130, 24, 129),
            ("f64", "f64"),
            MapKind::GemmTiled,
            TargetInfo::h200(),
        ),
        (
            (2, 40, 32, 24),
            ("bf16", "bf16"),
            MapKind::GemmMma,
            TargetInfo::h200(),
        ),
        // Deeper and shallower pipelines, contractions ending inside a stage.
        (
            (1, 72, 200, 40),
            ("bf16", "f32"),
            MapKind::GemmMma,
            pipeline_target(4, 64),
        ),
        (
            (2, 40, 56, 24),
            ("f16", "f16"),
            MapKind::GemmMma,
            pipeline_target(2, 16),
        ),
    ];
    for (i, (shape, dts, kind, target)) in cases.into_iter().enumerate() {
        let src = epilogue_text(shape, dts);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("case {i}: {e}\n{src}"));
        let mut rng = Rng::new(40 + i as u64);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        let rep = check_on(&f, &args, &target).unwrap_or_else(|e| panic!("case {i}: {e}"));
        let want: std::collections::BTreeMap<MapKind, usize> = [(kind, 1)].into();
        assert_eq!(rep.launches, want, "case {i}");
    }
    // A convolution stored by feature planes with a bias and a relu: the epilogue's variables
    // are the planes' position, not the product's (on every target: by tiles and not).
    let conv = "func @main(%0: f32[2,2,5,5], %1: f32[3,2,3,3], %2: f32[3]) -> f32[2,3,5,5] {
  %3 = convolution %0, %1 {window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]} : f32[2,3,5,5]
  %4 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[2,3,5,5]
  %5 = add %3, %4 : f32[2,3,5,5]
  %6 = constant {value = 0.0} : f32[]
  %7 = broadcast_in_dim %6 {broadcast_dimensions = []} : f32[2,3,5,5]
  %8 = maximum %5, %7 : f32[2,3,5,5]
  return %8
}
";
    let f = kiln_ir::parse_func_text(conv).unwrap();
    let mut untiled = TargetInfo::h200();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    for (seed, target) in [(1, TargetInfo::h200()), (2, untiled)] {
        let mut rng = Rng::new(seed);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        check_on(&f, &args, &target).unwrap_or_else(|e| panic!("conv {seed}: {e}"));
    }
    let f = kiln_ir::parse_func_text(&softmax_product_text(2, 9, 40, 12)).unwrap();
    let args = special_args(&f, 3);
    let rep = check(&f, &args).unwrap();
    assert!(rep.launches.values().sum::<usize>() > 1, "{rep:?}");
}

/// A product with a softmax along its rows, not chained into a second product.
fn softmax_product_text(b: usize, m: usize, k: usize, n: usize) -> String {
    let s = format!("f32[{b},{m},{n}]");
    format!(
        "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{k},{n}]) -> {s} {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {s}
  %3 = constant {{value = -inf}} : f32[]
  %4 = reduce %2, %3 {{dimensions = [2], kind = max}} : f32[{b},{m}]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = [0, 1]}} : {s}
  %6 = subtract %2, %5 : {s}
  %7 = exponential %6 : {s}
  %8 = constant {{value = 0.0}} : f32[]
  %9 = reduce %7, %8 {{dimensions = [2], kind = add}} : f32[{b},{m}]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = [0, 1]}} : {s}
  %11 = divide %7, %10 : {s}
  return %11
}}
"
    )
}

/// Causal attention: query `i` keeps keys `j <= i` (the others' logits are -inf).
fn causal_attention_text(b: usize, m: usize, keys: usize, k: usize, n2: usize) -> String {
    let s = format!("f32[{b},{m},{keys}]");
    let i = format!("i64[{b},{m},{keys}]");
    attention_text(b, m, keys, k, n2).replace(
        &format!("  %6 = multiply %3, %5 : {s}\n"),
        &format!(
            "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n  %26 = compare %21, %22 {{comparison_direction = LE}} : pred[{b},{m},{keys}]\n  %27 = constant {{value = -inf}} : f32[]\n  %28 = broadcast_in_dim %27 {{broadcast_dimensions = []}} : {s}\n  %6 = select %26, %20, %28 : {s}\n"
        ),
    )
}

/// Attention where query `i` keeps only keys `j >= i + shift`: later queries see nothing in
/// the first steps of keys.
fn shifted_attention_text(
    b: usize,
    m: usize,
    keys: usize,
    k: usize,
    n2: usize,
    shift: i64,
) -> String {
    let s = format!("f32[{b},{m},{keys}]");
    let i = format!("i64[{b},{m},{keys}]");
    attention_text(b, m, keys, k, n2).replace(
        &format!("  %6 = multiply %3, %5 : {s}\n"),
        &format!(
            "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n  %23 = constant {{value = {shift}}} : i64[]\n  %24 = broadcast_in_dim %23 {{broadcast_dimensions = []}} : {i}\n  %25 = add %22, %24 : {i}\n  %26 = compare %21, %25 {{comparison_direction = GE}} : pred[{b},{m},{keys}]\n  %27 = constant {{value = -inf}} : f32[]\n  %28 = broadcast_in_dim %27 {{broadcast_dimensions = []}} : {s}\n  %6 = select %26, %20, %28 : {s}\n"
        ),
    )
}

/// Attention (`softmax(Q Kᵀ / 8) V`, the softmax online) runs as one launch, flash-attention
/// style, and agrees with the reference: keys that are not a multiple of the 32 a step takes,
/// queries that are not a multiple of a block's warps, one key, several steps, output widths
/// past one accumulator a lane, and causal masks (each query sees only the keys up to its
/// own), and masks that leave a query nothing in its first steps of keys (the running maximum
/// stays finite, so they add nothing rather than NaN) or nothing at all (a row of NaN).
#[test]
fn attention_runs_as_one_launch() {
    let programs = [
        attention_text(2, 9, 40, 8, 12),
        attention_text(1, 5, 300, 16, 7),
        attention_text(1, 3, 1, 4, 70),
        attention_text(3, 33, 64, 32, 33),
        causal_attention_text(2, 9, 40, 8, 12),
        causal_attention_text(1, 70, 70, 16, 40),
        shifted_attention_text(1, 20, 100, 8, 12, 40),
        // Queries 10 and later see no key at all: NaN, as the reference says.
        shifted_attention_text(1, 20, 100, 8, 12, 90),
    ];
    for (i, src) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let mut rng = Rng::new(60 + i as u64);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        let rep = check(&f, &args).unwrap_or_else(|e| panic!("program {i}: {e}\n{src}"));
        let want: std::collections::BTreeMap<MapKind, usize> =
            [(MapKind::AttentionTiled, 1)].into();
        assert_eq!(rep.launches, want, "program {i}\n{src}");
    }
}
