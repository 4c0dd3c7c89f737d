//! The CPU backend against the reference interpreter: every spec example and random programs
//! over every dtype.

mod common;

use common::agrees;
use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::random::{
    Config, Rng, computes_from_inputs, random_func, random_literal, random_literal_with_specials,
};
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_reference::accuracy::Stats;

/// What the random programs exercised.
#[derive(Default)]
struct Report {
    programs: usize,
    /// Programs with an output computed from a parameter through at least one op.
    nontrivial: usize,
    /// Programs of the large profile (10^5 to 10^6 elements), and the most elements of a value
    /// in any program.
    large: usize,
    largest: usize,
    /// The large programs' kernels: all, split across threads, matrix products, and
    /// transposes in tiles.
    large_kernels: [usize; 4],
    kernels: usize,
    by_reference: usize,
    ops: std::collections::BTreeSet<kiln_ir::OpKind>,
    stats: Stats,
    /// Special input elements (-0, ±inf, NaN, subnormals, the largest finite values).
    special_inputs: usize,
    /// Seeds whose program disagreed with the reference (or failed), and why.
    failures: Vec<(u64, String)>,
    /// Seconds compiling, running and comparing the small programs, and the large ones.
    seconds: [[f64; 3]; 2],
    /// Programs compiled for [`small_target`].
    small_target: usize,
    /// Kernels that took each code path (`KernelPath`'s names), over all programs and over
    /// those compiled for [`small_target`].
    paths: std::collections::BTreeMap<String, [usize; 2]>,
}

/// The host's target with its loop thresholds lowered, so that moderately sized random
/// programs reach the loop strategies of large outputs: streaming stores from 1 KiB of output
/// (rows of one cache line), transposing tiles of 4 x 4.
fn small_target() -> kiln_kernel::target::TargetInfo {
    let mut t = kiln_codegen_llvm::cpu::host_target_info();
    t.loops.stream_bytes = 1024;
    t.loops.stream_row_lines = 1;
    t.loops.transpose_tile = 4;
    t
}

/// Whether seed `seed`'s program is compiled for [`small_target`]: one in four.
fn on_small_target(seed: u64) -> bool {
    seed % 4 == 3
}

thread_local! {
    /// Whether [`compare`] compiles for [`small_target`] (set per seed).
    static SMALL_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The generator's configuration for `seed` (see [`Config::profile`]), with the ops over many
/// elements that reach the kernels for many updates and long folds ([`Config::with_wide`]).
fn config(seed: u64) -> Config {
    Config::profile(seed).with_wide()
}

/// The arguments of `f` for `seed`: random values, with 1 in 32 float elements special on odd
/// seeds; in large programs none on half of them and 1 in 100,000 on the others (more would
/// make every long sum NaN).
fn test_args(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed ^ 77);
    let rate = match (config(seed).elements.is_some(), seed % 2, (seed / 200) % 2) {
        (false, 1, _) => 1.0 / 32.0,
        (true, _, 1) => 1e-5,
        _ => 0.0,
    };
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, rate))
        .collect()
}

/// One program compiled, run and compared with the reference.
struct Compared {
    kernels: usize,
    by_reference: usize,
    stats: Stats,
    /// Seconds compiling, running, and comparing (the reference's evaluations included).
    seconds: [f64; 3],
    /// The names of the code paths each kernel took.
    paths: Vec<Vec<&'static str>>,
}

/// The names of the code paths `p` took.
fn path_names(p: &kiln_codegen_llvm::cpu::KernelPath) -> Vec<&'static str> {
    use kiln_codegen_llvm::cpu::GemmBlocking as G;
    let mut v = Vec::new();
    if let Some(g) = p.gemm {
        v.push(match g {
            G::Plain => "gemm plain",
            G::SplitColumns => "gemm split columns",
            G::Streamed => "gemm streaming B",
            G::WholeRows => "gemm whole rows",
            G::Chained => "gemm chained",
            G::Online => "gemm online",
        });
    }
    for (on, name) in [
        (p.stream, "streaming stores"),
        (p.tile, "transposing tiles"),
        (p.guard_cuts, "guard cuts"),
        (p.row_caches > 0, "row caches"),
        (p.strips, "column strips"),
        (p.threads, "thread splits"),
        (p.concurrent, "concurrent"),
    ] {
        if on {
            v.push(name);
        }
    }
    v
}

/// Compiles `f`, runs it on `args` and compares it with the reference; the error says what
/// failed.
fn compare(f: &Func, args: &[Literal]) -> Result<Compared, String> {
    let t = std::time::Instant::now();
    let opts = common::env_options();
    let exe = if SMALL_TARGET.with(|s| s.get()) {
        let lowered =
            kiln_kernel::pipeline::lower_program(f, &[], &opts, &small_target(), None, &mut |_| {})
                .map_err(|e| e.to_string())?;
        CpuExecutable::render(lowered, &opts)
    } else {
        CpuExecutable::compile_with_options(f, &[], &opts)
    }
    .map_err(|e| e.to_string())?;
    let paths = exe.kernel_paths().iter().map(path_names).collect();
    let compiled = t.elapsed().as_secs_f64();
    let kernels = exe.plan().iter().filter(|s| **s == Step::Kernel).count();
    let by_reference = exe.plan().iter().filter(|s| **s == Step::Reference).count();
    common::compiled_whole(&exe)?;
    let got = exe.run(args).map_err(|e| e.to_string())?;
    let ran = t.elapsed().as_secs_f64();
    let stats = common::check(f, args, &got)?;
    let checked = t.elapsed().as_secs_f64();
    Ok(Compared {
        kernels,
        by_reference,
        stats,
        seconds: [compiled, ran - compiled, checked - ran],
        paths,
    })
}

/// Compiles and runs the random programs of `seeds` (with the arguments of [`test_args`]),
/// compares them with the reference, and reports what they covered and which seeds failed.
fn check_random_programs(seeds: impl Iterator<Item = u64>) -> Report {
    let mut rep = Report::default();
    for seed in seeds {
        let f = random_func(&mut Rng::new(seed), &config(seed));
        let args = test_args(&f, seed);
        for a in args.iter().filter(|a| a.dtype().is_float()) {
            rep.special_inputs += a
                .to_f64s()
                .iter()
                .filter(|x| {
                    !x.is_finite()
                        || (**x == 0.0 && x.is_sign_negative())
                        || x.abs() < 1e-37 && **x != 0.0
                        || x.abs() > 6e4
                })
                .count();
        }
        let small = on_small_target(seed);
        SMALL_TARGET.with(|s| s.set(small));
        rep.small_target += small as usize;
        match compare(&f, &args) {
            Ok(c) => {
                for name in c.paths.iter().flatten() {
                    let n = rep.paths.entry(name.to_string()).or_default();
                    n[0] += 1;
                    n[1] += small as usize;
                }
                rep.kernels += c.kernels;
                rep.by_reference += c.by_reference;
                rep.stats += c.stats;
                let large = config(seed).elements.is_some() as usize;
                for (s, t) in rep.seconds[large].iter_mut().zip(c.seconds) {
                    *s += t;
                }
            }
            Err(e) => rep.failures.push((seed, e)),
        }
        rep.programs += 1;
        rep.nontrivial += computes_from_inputs(&f) as usize;
        if config(seed).elements.is_some() {
            rep.large += 1;
            for (n, k) in rep.large_kernels.iter_mut().zip(large_kernels(&f)) {
                *n += k;
            }
        }
        rep.largest = rep
            .largest
            .max(f.values.iter().map(|t| t.numel()).max().unwrap_or(0));
        rep.ops.extend(f.insts.iter().map(|i| i.op.kind()));
    }
    rep
}

/// The kernels of `f` (from `describe_fusion`): all, split across threads, matrix products,
/// and transposes in tiles.
fn large_kernels(f: &Func) -> [usize; 4] {
    let mut n = [0; 4];
    let text =
        kiln_codegen_llvm::cpu::describe_fusion(f, &common::env_options()).unwrap_or_default();
    for line in text.lines().filter(|l| l.starts_with("kernel ")) {
        let number = |key: &str| -> usize {
            line.split(key)
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|x| x.parse().ok())
                .unwrap_or(0)
        };
        n[0] += 1;
        n[1] += kiln_kernel::TargetInfo::reference()
            .splits
            .splits(number("rows "), number("work ")) as usize;
        n[2] += line.contains(": dot_general ->") as usize;
        n[3] += line.contains("tiles of dimensions") as usize;
    }
    n
}

/// Whether the CPU backend disagrees with the reference on `f` with `args` (or fails to
/// compile or run it, or panics).
fn fails(f: &Func, args: &[Literal]) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compare(f, args)))
        .map_or(true, |r| r.is_err())
}

/// The reference's value of `v` in `f` on `args`.
fn reference_value(f: &Func, args: &[Literal], v: kiln_ir::ValueId) -> Option<Literal> {
    let mut g = f.clone();
    g.outputs = vec![v];
    g.output_types = vec![g.values[v.index()].clone()];
    kiln_reference::eval(&g, args).ok()?.pop()
}

/// Shrinks the program of a failing `seed` (at most 3,000 compilations, 10 minutes) and saves
/// it as a differential filetest, `tests/filetests/differential/seed-N.kir`, with its
/// snapshot (so the file passes once the backend agrees with the reference on it); the
/// message names the file and shows the shrunk program.
fn shrink_and_save(seed: u64, error: &str) -> String {
    let f = random_func(&mut Rng::new(seed), &config(seed));
    // (A failure only on the small target shrinks on it, and its filetest runs on the host's.)
    SMALL_TARGET.with(|s| s.set(on_small_target(seed)));
    let start = std::time::Instant::now();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let shrunk = kiln_ir::shrink::shrink(
        &f,
        &test_args(&f, seed),
        3000,
        &mut |g, a| start.elapsed().as_secs() < 600 && fails(g, a),
        &mut reference_value,
    );
    std::panic::set_hook(hook);
    let (g, args) = (&shrunk.func, &shrunk.args);
    let why = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compare(g, args))) {
        Ok(Err(e)) => e,
        Ok(Ok(_)) => "agrees (a flaky failure)".to_string(),
        Err(_) => "the backend panicked".to_string(),
    };
    let notes = format!(
        "Random program {seed} of the differential test, shrunk from {} to {} instructions \
         ({} steps, {} compilations{}):\n{why}\nThe original: KILN_SEED={seed} cargo test -p \
         kiln-codegen-llvm --test differential random_programs_agree_with_the_reference",
        f.insts.len(),
        g.insts.len(),
        shrunk.steps,
        shrunk.tries,
        if shrunk.out_of_budget {
            ", out of budget"
        } else {
            ""
        }
    );
    let text = kiln_ir::shrink::differential_filetest(g, args, &notes);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root");
    let path = root.join(format!("tests/filetests/differential/seed-{seed}.kir"));
    let snap = root.join(format!("tests/snapshots/differential__seed-{seed}.snap"));
    let written = std::fs::create_dir_all(path.parent().expect("a directory"))
        .and_then(|_| std::fs::write(&path, &text))
        .and_then(|_| {
            std::fs::write(
                &snap,
                format!(
                    "---\nsource: tests/integration.rs\nexpression: out\n---\n{} outputs agree with the reference\n",
                    g.outputs.len()
                ),
            )
        });
    let saved = match written {
        Ok(()) => format!(
            "saved as {} (fails until fixed: cargo test -p kiln-tests --test integration filetests)",
            path.display()
        ),
        Err(e) => format!("not saved: {e}"),
    };
    format!("seed {seed}: {error}\n{f}shrunk: {why}\n{g}{saved}")
}

#[test]
fn random_programs_agree_with_the_reference() {
    // Seeds 0 to 9,999; `KILN_PROGRAMS=A..B` runs seeds A to B - 1 instead.
    let knob = std::env::var("KILN_PROGRAMS").ok();
    let std::ops::Range { start: first, end } =
        kiln_ir::random::seeds::seed_range("KILN_PROGRAMS", knob.as_deref(), 0..10_000).unwrap();
    let programs = end.saturating_sub(first);
    // `KILN_SEED=N` (or a list, `N,M,...`) runs those seeds alone.
    if let Ok(list) = std::env::var("KILN_SEED") {
        let mut failed = Vec::new();
        for seed in list.split(',').filter_map(|s| s.trim().parse::<u64>().ok()) {
            let f = random_func(&mut Rng::new(seed), &config(seed));
            println!("seed {seed}:\n{f}");
            let mut rep = check_random_programs(seed..seed + 1);
            if rep.large > 0 {
                println!("large kernels: {:?}", rep.large_kernels);
            }
            println!(
                "seconds compiling, running, comparing: {:.2?}",
                rep.seconds[config(seed).elements.is_some() as usize]
            );
            if let Some((_, e)) = rep.failures.pop() {
                failed.push(shrink_and_save(seed, &e));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n\n"));
        return;
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1)
        .max(1);
    let parts: Vec<Report> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || check_random_programs((first + t..end).step_by(threads as usize)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker panicked"))
            .collect()
    });
    let mut rep = Report::default();
    for p in parts {
        rep.failures.extend(p.failures);
        for (a, b) in rep
            .seconds
            .iter_mut()
            .flatten()
            .zip(p.seconds.iter().flatten())
        {
            *a += b;
        }
        rep.programs += p.programs;
        rep.nontrivial += p.nontrivial;
        rep.large += p.large;
        for (n, k) in rep.large_kernels.iter_mut().zip(p.large_kernels) {
            *n += k;
        }
        rep.largest = rep.largest.max(p.largest);
        rep.kernels += p.kernels;
        rep.by_reference += p.by_reference;
        rep.ops.extend(p.ops);
        rep.stats += p.stats;
        rep.special_inputs += p.special_inputs;
        rep.small_target += p.small_target;
        for (k, v) in p.paths {
            let n = rep.paths.entry(k).or_default();
            n[0] += v[0];
            n[1] += v[1];
        }
    }
    assert_eq!(rep.programs as u64, programs);
    if !rep.failures.is_empty() {
        rep.failures.sort();
        let first = shrink_and_save(rep.failures[0].0, &rep.failures[0].1);
        let all: Vec<String> = rep
            .failures
            .iter()
            .map(|(seed, e)| format!("seed {seed}: {e}"))
            .collect();
        panic!(
            "{} of {programs} random programs disagree with the reference:\n{}\n\nthe first, shrunk:\n{first}\nreproduce: KILN_SEED={} cargo test -p kiln-codegen-llvm --test differential random_programs_agree_with_the_reference",
            rep.failures.len(),
            all.join("\n"),
            rep.failures
                .iter()
                .map(|(s, _)| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    let s = rep.stats;
    println!(
        "{} random programs agree with the reference ({} kernels, {} instructions on the reference)\n\
         programs with an output computed from an input: {}\n\
         large programs: {} (the largest value: {} elements; {} kernels, {} split across threads, {} matrix products, {} transposes in tiles)\n\
         seconds (all threads) compiling, running, comparing: small programs {:.1}, {:.1}, {:.1}; large ones {:.1}, {:.1}, {:.1}\n\
         ops covered: {} of {}\n\
         elements compared: {} ({} bit for bit, {} with an infinite bound)\n\
         special values: {} special input elements; reference outputs held {} NaN, {} infinities, {} negative zeros, {} subnormals",
        rep.programs,
        rep.kernels,
        rep.by_reference,
        rep.nontrivial,
        rep.large,
        rep.largest,
        rep.large_kernels[0],
        rep.large_kernels[1],
        rep.large_kernels[2],
        rep.large_kernels[3],
        rep.seconds[0][0],
        rep.seconds[0][1],
        rep.seconds[0][2],
        rep.seconds[1][0],
        rep.seconds[1][1],
        rep.seconds[1][2],
        rep.ops.len(),
        kiln_ir::OpKind::ALL.len(),
        s.elements,
        s.exact,
        s.unbounded,
        rep.special_inputs,
        s.nan,
        s.inf,
        s.neg_zero,
        s.subnormal
    );
    let paths: Vec<String> = rep
        .paths
        .iter()
        .map(|(k, [all, small])| format!("{k} {all} ({small})"))
        .collect();
    println!(
        "kernels per code path (of them, in the {} programs compiled for small_target): {}",
        rep.small_target,
        paths.join(", ")
    );
    // The small target's programs reach streaming stores (about one program in 250 of them)
    // and transposing tiles (about one in 300: 8 in the default 10,000 programs; a run of 2,000
    // may have none).
    let on_small = |k: &str| rep.paths.get(k).map_or(0, |v| v[1]);
    assert!(
        programs < 1000 || on_small("streaming stores") > 0,
        "the small target's programs reached no streaming stores: {paths:?}"
    );
    assert!(
        programs < 5000 || on_small("transposing tiles") > 0,
        "the small target's programs reached no transposing tiles: {paths:?}"
    );
    // (A short range, `KILN_PROGRAMS=12754..12755`, need not generate every op.) Control flow
    // (`while`, `case`, `sort`) comes from the seeds whose profile allows it.
    // `real`, `imag` and `complex` come only with complex parameters (`Config::with_complex`):
    // those programs are `complex_programs.rs`'s.
    let generated = kiln_ir::OpKind::ALL.len() - 3;
    assert!(
        programs < 1000 || rep.ops.len() == generated,
        "ops never generated: {} of {generated}",
        rep.ops.len(),
    );
    assert!(
        rep.nontrivial * 100 >= rep.programs * 95,
        "only {} of {} programs compute something from their inputs",
        rep.nontrivial,
        rep.programs
    );
    assert!(
        programs < 1000 || (rep.large * 250 >= rep.programs && rep.largest >= 100_000),
        "too few large programs"
    );
}

#[test]
fn many_small_reductions_do_not_grow_the_stack() {
    // One accumulator per output element: 500,000 of them, split across threads.
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[500000,2]) -> f32[500000] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[500000]\n  return %2\n}\n",
    )
    .unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
    let x = Literal::f32(
        [500000, 2],
        (0..1_000_000).map(|i| (i % 7) as f32).collect(),
    )
    .unwrap();
    let got = exe.run(std::slice::from_ref(&x)).unwrap();
    common::check(&f, &[x], &got).unwrap();
}

#[test]
fn gemm_tiles_edges_and_blocks_agree_with_the_reference() {
    common::gemm_shapes();
}

#[test]
fn matrix_products_in_any_dimension_order_agree_with_the_reference() {
    common::dimension_orders();
}

#[test]
fn vectorized_transcendentals_are_accurate() {
    common::transcendentals();
}

#[test]
fn softmaxes_of_special_values_agree_with_the_reference() {
    common::softmax_special_values();
}

#[test]
fn softmaxes_of_products_run_as_gemm_epilogues_and_agree_with_the_reference() {
    common::row_epilogues();
}

#[test]
fn attention_products_chain_in_one_kernel_and_agree_with_the_reference() {
    common::chained_products();
}

/// An online softmax's rows with a NaN logit agree with the reference, as do the others: in
/// batch 0 one key (in a later block of keys than the rows' first) makes every row's logit
/// there NaN after finite blocks; in batch 1 one query row's logits are all NaN. The NaN rows
/// come out NaN and the others finite.
#[test]
fn online_softmaxes_of_nan_logits_agree_with_the_reference() {
    let (b, m, keys, k, n2) = (2, 3, 16385, 8, 8);
    let src = common::attention_text("f32", (b, m, keys, k, n2), false, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &common::env_options()).unwrap();
    assert!(fusion.contains("online:"), "{fusion}");
    let types = f.param_types();
    let mut rng = Rng::new(7);
    let mut args: Vec<Literal> = types.iter().map(|t| random_literal(&mut rng, t)).collect();
    let (mut q, mut kv) = (args[0].to_f64s(), args[1].to_f64s());
    q[(m + 1) * k] = f64::NAN;
    kv[9000 * k + 3] = f64::NAN;
    args[0] = Literal::from_f64s(types[0].clone(), &q).unwrap();
    args[1] = Literal::from_f64s(types[1].clone(), &kv).unwrap();
    agrees(&f, &args).unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
    let out = exe.run(&args).unwrap()[0].to_f64s();
    for (row, values) in out.chunks(n2).enumerate() {
        let nan = row < m || row == m + 1;
        assert!(
            values
                .iter()
                .all(|v| v.is_nan() == nan && (nan || v.is_finite())),
            "row {row}: {values:?}"
        );
    }
}

#[test]
fn guard_splits_agree_with_the_reference() {
    common::guard_splits();
}

#[test]
fn row_caches_agree_with_the_reference() {
    common::row_caches();
}

#[test]
fn streaming_stores_agree_with_the_reference() {
    common::streaming_stores();
}

#[test]
fn transposes_in_tiles_agree_with_the_reference() {
    common::tiled_transposes();
}

#[test]
fn convolutions_through_the_implicit_gemm_agree_with_the_reference() {
    common::convolutions();
}

#[test]
fn winograd_convolutions_agree_with_the_reference() {
    common::winograd_convolutions();
}

/// A 3 x 3 convolution's forward and backward passes (`vjp`): the forward convolution and the
/// input gradient (a 3 x 3 convolution of the output gradient with the flipped kernel, input
/// and output features swapped) run as Winograd's F(4x4, 3x3); the kernel gradient (a 10 x 10
/// window) stays direct. Every result agrees with the reference.
#[test]
fn winograd_convolution_gradients_agree_with_the_reference() {
    let src = "func @main(%0: f32[2,32,10,10], %1: f32[40,32,3,3]) -> f32[2,40,10,10] {\n  %2 = convolution %0, %1 {window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]} : f32[2,40,10,10]\n  return %2\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let b = kiln_autodiff::vjp(&f, &[0, 1]).unwrap();
    let fused = kiln_codegen_llvm::cpu::describe_fusion(&b, &common::env_options()).unwrap();
    let convs = fused
        .lines()
        .filter(|l| l.starts_with("kernel") && l.contains(": convolution ->"))
        .count();
    let products = fused
        .lines()
        .filter(|l| l.starts_with("kernel") && l.contains(": dot_general ->"))
        .count();
    assert_eq!((convs, products), (1, 72), "{fused}");
    common::agrees_on_random_inputs(&b.to_string(), 31);
}

#[test]
fn transposed_products_fold_and_agree_with_the_reference() {
    common::transposed_folds();
}

#[test]
fn empty_matrix_products_compile_and_run() {
    for (a, b, out) in [
        ("f32[0,4]", "f32[4,2]", "f32[0,2]"),
        ("f32[3,0]", "f32[0,2]", "f32[3,2]"),
        ("f32[2,3,4]", "f32[4,0]", "f32[2,3,0]"),
    ] {
        let ra = a.matches(',').count() as i64;
        let src = format!(
            "func @main(%0: {a}, %1: {b}) -> {out} {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [{ra}], rhs_contracting_dimensions = [0]}} : {out}\n  return %2\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut Rng::new(1), t))
            .collect();
        agrees(&f, &args).unwrap();
    }
}

#[test]
fn same_width_bitcasts_compile_and_keep_every_bit() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f64[4], %1: f32[4]) -> (f64[4], i64[4], f32[4]) {\n  %2 = bitcast_convert %0 : i64[4]\n  %3 = bitcast_convert %2 : f64[4]\n  %4 = bitcast_convert %1 : u32[4]\n  %5 = bitcast_convert %4 : f32[4]\n  return %3, %2, %5\n}\n",
    )
    .unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
    assert!(!exe.plan().contains(&Step::Reference), "{:?}", exe.plan());
    let a = Literal::f64(
        [4],
        vec![
            -0.0,
            f64::INFINITY,
            f64::from_bits(0x7ff8_0000_0000_0001),
            1.5,
        ],
    )
    .unwrap();
    let b = Literal::f32(
        [4],
        vec![-0.0, f32::NEG_INFINITY, f32::from_bits(0x7fc0_0001), -2.25],
    )
    .unwrap();
    let got = exe.run(&[a.clone(), b.clone()]).unwrap();
    let want = kiln_reference::eval(&f, &[a.clone(), b.clone()]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.to_le_bytes(), w.to_le_bytes());
    }
    assert_eq!(got[0].to_le_bytes(), a.to_le_bytes());
    assert_eq!(got[2].to_le_bytes(), b.to_le_bytes());
}

/// Every pattern of an 8-bit small float bitcast to another small float (and reversed, and
/// read as bytes) comes back with its bits: held in f32 between kernels, a NaN of the IEEE
/// formats keeps its payload (seed 55555: `f8e4m3fn`'s NaN `0x7f` read as `f8e5m2` came back
/// as `0x7e`, which is 448 as `f8e4m3fn`).
#[test]
fn small_float_bitcasts_keep_every_pattern() {
    let formats = ["f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4"];
    for (k, a) in formats.iter().enumerate() {
        let b = formats[(k + 1) % formats.len()];
        let src = format!(
            "func @main(%0: {a}[256]) -> ({b}[256], {b}[256], u8[256]) {{\n  %1 = bitcast_convert %0 : {b}[256]\n  %2 = reverse %1 {{dimensions = [0]}} : {b}[256]\n  %3 = bitcast_convert %2 : u8[256]\n  return %1, %2, %3\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
        assert!(!exe.plan().contains(&Step::Reference), "{:?}", exe.plan());
        let DType::Mini(m) = f.param_types()[0].dtype else {
            unreachable!("{a} is a small float")
        };
        let codes: Vec<u8> = (0..=255).collect();
        let x = Literal::new(
            TensorType::new(DType::Mini(m), [256]),
            kiln_ir::literal::Data::Mini(m, codes.clone()),
        )
        .unwrap();
        let got = exe.run(std::slice::from_ref(&x)).unwrap();
        let reversed: Vec<u8> = codes.iter().rev().copied().collect();
        assert_eq!(got[0].to_le_bytes(), codes, "{a} as {b}");
        assert_eq!(got[1].to_le_bytes(), reversed, "{a} as {b}, reversed");
        assert_eq!(
            got[2].to_le_bytes(),
            reversed,
            "{a} as {b}, reversed, as bytes"
        );
    }
}

#[test]
fn select_and_scatter_kernels_agree_with_the_reference() {
    // The gradient of 3x3/2 max pooling with padding, and a min-selecting variant with ties.
    for (dir, dtype, values) in [("GE", "f32", None), ("LE", "i32", Some(3))] {
        let src = format!(
            "func @main(%0: {dtype}[2,3,9,9], %1: {dtype}[2,3,5,5], %2: {dtype}[]) -> {dtype}[2,3,9,9] {{\n  %3 = select_and_scatter %0, %1, %2 {{window_dimensions = [1, 1, 3, 3], window_strides = [1, 1, 2, 2], padding = [[0, 0], [0, 0], [1, 1], [1, 1]], select = {dir}, kind = add}} : {dtype}[2,3,9,9]\n  return %3\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
        assert!(!exe.plan().contains(&Step::Reference), "{:?}", exe.plan());
        let mut rng = Rng::new(21);
        let mut args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect();
        if let Some(m) = values {
            // Few distinct values, so windows have ties.
            let v: Vec<i64> = args[0].to_i64s().iter().map(|x| x.rem_euclid(m)).collect();
            args[0] = Literal::from_i64s(args[0].ty().clone(), &v).unwrap();
        }
        let got = exe.run(&args).unwrap();
        common::check(&f, &args, &got).unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
}

/// Compiles `src`, checks that every instruction runs without the reference interpreter, and
/// compares all outputs bit for bit with the reference on `args`.
fn bit_exact_without_reference(src: &str, args: &[Literal]) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
    assert!(
        !exe.plan().contains(&Step::Reference),
        "{:?}\n{src}",
        exe.plan()
    );
    let want = kiln_reference::eval(&f, args).unwrap();
    // Again on the buffers the first call left behind.
    for _ in 0..2 {
        let got = exe.run(args).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.ty(), w.ty(), "output {i} of\n{src}");
            assert_eq!(g.to_le_bytes(), w.to_le_bytes(), "output {i} of\n{src}");
        }
    }
}

#[test]
fn random_bit_generators_run_as_kernels_and_match_the_reference() {
    // Odd and even sizes, empty, and ones large enough to split across threads; grids of blocks
    // split on the first, a middle and the last dimension (its first of even size, else its
    // first largest; `kiln_ir::rng_layout`); counters that carry from the low word into the
    // high one and wrap around 2^64.
    let states: [[u32; 4]; 4] = [
        [0, 0, 0, 0],
        [0x1234_5678, 0x9abc_def0, 7, 0xffff_fffe],
        [1, 2, 0xffff_ffff, 0xffff_ffff],
        [42, 4242, 0, 1 << 31],
    ];
    let shapes =
        "[5] [2,3] [3,2] [4,2,3] [3,3] [3,5] [1,2,3] [3,4,5] [0] [0,3] [2,0] [300,301] [301,301]";
    for shape in shapes.split(' ') {
        for s in states {
            let src = format!(
                "func @main(%0: u32[4]) -> (u32[4], u32{shape}) {{\n  %1, %2 = rng_bit_generator %0 {{algorithm = THREE_FRY}} : u32[4], u32{shape}\n  return %1, %2\n}}\n"
            );
            let state = Literal::new(
                kiln_ir::TensorType::new(DType::U32, [4]),
                kiln_ir::literal::Data::U32(s.to_vec()),
            )
            .unwrap();
            bit_exact_without_reference(&src, &[state]);
        }
    }
}

#[test]
fn bitcasts_between_widths_integer_powers_and_barriers_run_as_kernels() {
    let mut rng = Rng::new(11);
    let cases = [
        "func @main(%0: f32[3]) -> (i8[3,4], f32[3]) {\n  %1 = bitcast_convert %0 : i8[3,4]\n  %2 = bitcast_convert %1 : f32[3]\n  return %1, %2\n}\n",
        "func @main(%0: f64[2,2]) -> u32[2,2,2] {\n  %1 = bitcast_convert %0 : u32[2,2,2]\n  return %1\n}\n",
        "func @main(%0: f16[4,2]) -> (u32[4], bf16[4,2]) {\n  %1 = bitcast_convert %0 : u32[4]\n  %2 = bitcast_convert %0 : bf16[4,2]\n  return %1, %2\n}\n",
        "func @main(%0: i32[64], %1: i32[64]) -> i32[64] {\n  %2 = power %0, %1 : i32[64]\n  return %2\n}\n",
        "func @main(%0: i8[64], %1: i8[64]) -> i8[64] {\n  %2 = power %0, %1 : i8[64]\n  return %2\n}\n",
        "func @main(%0: i64[64], %1: i64[64]) -> i64[64] {\n  %2 = power %0, %1 : i64[64]\n  return %2\n}\n",
        "func @main(%0: u32[64], %1: u32[64]) -> u32[64] {\n  %2 = power %0, %1 : u32[64]\n  return %2\n}\n",
        "func @main(%0: f32[3], %1: i32[2]) -> (f32[3], i32[2]) {\n  %2, %3 = optimization_barrier %0, %1 : f32[3], i32[2]\n  %4 = add %2, %2 : f32[3]\n  return %4, %3\n}\n",
        // Kernel results through barriers: passed on by their last reader (moved), read again
        // later, returned, or passed twice at once.
        "func @main(%0: f32[1000]) -> f32[1000] {\n  %1 = negate %0 : f32[1000]\n  %2 = optimization_barrier %1 : f32[1000]\n  %3 = add %2, %2 : f32[1000]\n  return %3\n}\n",
        "func @main(%0: f32[1000]) -> f32[1000] {\n  %1 = negate %0 : f32[1000]\n  %2 = optimization_barrier %1 : f32[1000]\n  %3 = subtract %2, %1 : f32[1000]\n  return %3\n}\n",
        "func @main(%0: f32[1000]) -> (f32[1000], f32[1000]) {\n  %1 = negate %0 : f32[1000]\n  %2 = optimization_barrier %1 : f32[1000]\n  %3 = optimization_barrier %2 : f32[1000]\n  %4 = add %3, %3 : f32[1000]\n  return %4, %2\n}\n",
        "func @main(%0: f32[1000]) -> f32[1000] {\n  %1 = negate %0 : f32[1000]\n  %2, %3 = optimization_barrier %1, %1 : f32[1000], f32[1000]\n  %4 = subtract %2, %3 : f32[1000]\n  return %4\n}\n",
    ];
    for src in cases {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let mut args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect();
        if src.contains("power") {
            // Small bases and exponents (negative ones included) beside the random values.
            let d = args[0].ty().dtype;
            let lo = if d.is_signed() { -3 } else { 0 };
            let n = args[0].ty().numel();
            let small = |k: i64| (0..n as i64).map(|i| lo + (i * k) % 7).collect::<Vec<_>>();
            args[0] = Literal::from_i64s(args[0].ty().clone(), &small(1)).unwrap();
            let e: Vec<i64> = small(5)
                .into_iter()
                .enumerate()
                .map(|(i, v)| if i % 9 == 8 { 100 + i as i64 } else { v })
                .collect();
            args[1] = Literal::from_i64s(args[1].ty().clone(), &e).unwrap();
        }
        bit_exact_without_reference(src, &args);
    }
}

/// A matrix product's only elementwise user runs as the GEMM's epilogue (one kernel), over
/// rows split across threads, over column panels (a wide product with few rows), with a
/// batch, and with size-1 dimensions; every result agrees with the reference.
#[test]
fn gemm_epilogues_run_inside_the_gemm_and_agree_with_the_reference() {
    let dense = |m: usize, k: usize, n: usize| {
        format!(
            "func @main(%0: f32[{m},{k}], %1: f32[{k},{n}], %2: f32[{n}]) -> f32[{m},{n}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{m},{n}]
  %4 = broadcast_in_dim %2 {{broadcast_dimensions = [1]}} : f32[{m},{n}]
  %5 = add %3, %4 : f32[{m},{n}]
  %6 = constant {{value = 0.0}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : f32[{m},{n}]
  %8 = maximum %5, %7 : f32[{m},{n}]
  return %8
}}
"
        )
    };
    let update = "func @main(%0: f32[300,70], %1: f32[300,90], %2: f32[70,90]) -> f32[70,90] {
  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : f32[70,90]
  %4 = constant {value = 0.01} : f32[]
  %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : f32[70,90]
  %6 = multiply %3, %5 : f32[70,90]
  %7 = subtract %2, %6 : f32[70,90]
  return %7
}
";
    let batched = "func @main(%0: f32[3,5,1,7], %1: f32[3,7,6]) -> f32[3,5,1,6] {
  %2 = reshape %0 : f32[3,5,7]
  %3 = dot_general %2, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]} : f32[3,5,6]
  %4 = multiply %3, %3 : f32[3,5,6]
  %5 = reshape %4 : f32[3,5,1,6]
  return %5
}
";
    // A convolution in NHWC layouts (no transposes around it) with a bias and a ReLU.
    let conv = "func @main(%0: f32[2,9,9,8], %1: f32[3,3,8,16], %2: f32[16]) -> f32[2,7,7,16] {
  %3 = convolution %0, %1 {window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]} : f32[2,7,7,16]
  %4 = broadcast_in_dim %2 {broadcast_dimensions = [3]} : f32[2,7,7,16]
  %5 = add %3, %4 : f32[2,7,7,16]
  %6 = constant {value = 0.0} : f32[]
  %7 = broadcast_in_dim %6 {broadcast_dimensions = []} : f32[2,7,7,16]
  %8 = maximum %5, %7 : f32[2,7,7,16]
  return %8
}
";
    // NCHW convolutions, whose GEMM stores its output by planes: with a bias and a ReLU (rows
    // of 7 pixels, blocks and threads ending inside them), adding a residual of the output's
    // shape (images that end in a partial tile), and one image of 16 pixels and 200 features
    // (the threads split the columns).
    let planes = |x: &str, w: &str, y: &str, f: usize, stride: usize, pad: usize, extra: &str| {
        let fmt = format!(
            "window_strides = [{stride}, {stride}], padding = [[{pad}, {pad}], [{pad}, {pad}]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]"
        );
        format!(
            "func @main(%0: f32[{x}], %1: f32[{w}], %2: f32[{f}]{extra}) -> f32[{y}] {{
  %4 = convolution %0, %1 {{{fmt}}} : f32[{y}]
  %5 = broadcast_in_dim %2 {{broadcast_dimensions = [1]}} : f32[{y}]
  %6 = add %4, %5 : f32[{y}]
  %7 = constant {{value = 0.0}} : f32[]
  %8 = broadcast_in_dim %7 {{broadcast_dimensions = []}} : f32[{y}]
  %9 = maximum %6, %8 : f32[{y}]
  %10 = {}
  return %10
}}
",
            if extra.is_empty() {
                format!("negate %9 : f32[{y}]")
            } else {
                format!("add %9, %3 : f32[{y}]")
            }
        )
    };
    let mut programs = vec![
        planes("2,8,7,7", "16,8,3,3", "2,16,7,7", 16, 1, 1, ""),
        planes(
            "3,3,20,20",
            "64,3,7,7",
            "3,64,10,10",
            64,
            2,
            3,
            ", %3: f32[3,64,10,10]",
        ),
        planes("1,8,4,4", "200,8,3,3", "1,200,4,4", 200, 1, 1, ""),
        // No input features: the epilogue over an empty contraction's zeros.
        planes("2,0,5,5", "4,0,3,3", "2,4,3,3", 4, 1, 0, ""),
        dense(256, 128, 200),
        dense(7, 33, 500),
        dense(1, 9, 1000),
        dense(130, 600, 17),
    ];
    programs.push(update.to_string());
    programs.push(batched.to_string());
    programs.push(conv.to_string());
    for (i, src) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap();
        let fused = kiln_codegen_llvm::cpu::describe_fusion(&f, &common::env_options()).unwrap();
        // A single-row product is canonicalized into another shape; it only has to agree.
        if i != 6 {
            assert!(
                fused.contains("as its epilogue"),
                "program {i} has no GEMM epilogue:\n{fused}"
            );
        }
        common::agrees_on_random_inputs(src, 40 + i as u64);
    }
}

/// The fusion legality check (petgraph): every compiled program passes it (the random-program
/// test compiles thousands), and it rejects a kernel reading a value computed only inside other
/// kernels, and kernels that depend on each other in a cycle.
#[test]
fn fusion_legality_rejects_hidden_values_and_cycles() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[64,64]) -> f32[64,64] {
  %1 = exponential %0 : f32[64,64]
  %2 = transpose %1 {permutation = [1, 0]} : f32[64,64]
  %3 = dot_general %2, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]
  %4 = add %3, %1 : f32[64,64]
  return %4
}
",
    )
    .unwrap();
    let fused = kiln_codegen_llvm::cpu::fused_kernels(
        &f,
        &common::env_options(),
        &kiln_codegen_llvm::cpu::host_target_info(),
    );
    kiln_codegen_llvm::fuse::check_legal(&f, &fused).unwrap();
    // A kernel reading a value that has no buffer.
    let mut hidden = fused.clone();
    let producer_of = |v: &kiln_ir::ValueId| f.insts.iter().position(|i| i.results.contains(v));
    let p = (0..f.insts.len())
        .filter(|&u| !hidden.inlined[u])
        .find_map(|u| hidden.operands[u].iter().find_map(producer_of))
        .expect("a kernel reading another kernel's result");
    hidden.inlined[p] = true;
    let e = kiln_codegen_llvm::fuse::check_legal(&f, &hidden).unwrap_err();
    assert!(e.contains("only inside other kernels"), "{e}");
    // Two kernels reading each other's results.
    let mut cyclic = fused.clone();
    let ks: Vec<usize> = (0..f.insts.len()).filter(|&i| !cyclic.inlined[i]).collect();
    let (a, b) = (ks[0], ks[ks.len() - 1]);
    cyclic.operands[a].push(f.insts[b].results[0]);
    let e = kiln_codegen_llvm::fuse::check_legal(&f, &cyclic).unwrap_err();
    assert!(e.contains("cycle"), "{e}");
}

#[test]
fn multi_output_kernels_agree_and_merges_keep_program_order() {
    // Three same-shaped results of one input: one loop nest writes all three; the row sums
    // they share are computed once per row.
    let src =
        "func @main(%0: f32[300,70], %1: f32[70]) -> (f32[300,70], f32[300,70], f32[300,70]) {
  %2 = constant {value = 0.0} : f32[]
  %3 = reduce %0, %2 {dimensions = [1], kind = add} : f32[300]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f32[300,70]
  %5 = subtract %0, %4 : f32[300,70]
  %6 = exponential %5 : f32[300,70]
  %7 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[300,70]
  %8 = multiply %5, %7 : f32[300,70]
  %9 = tanh %4 : f32[300,70]
  return %6, %8, %9
}
";
    common::agrees_on_random_inputs(src, 5);
    let f = kiln_ir::parse_func_text(src).unwrap();
    let text = kiln_codegen_llvm::cpu::describe_fusion(&f, &common::env_options()).unwrap();
    assert!(text.contains("// 1 kernels"), "{text}");
    // exp(x) merges into log(x)'s kernel past the GEMM between them; a GEMM reading exp(x)
    // would run before that kernel writes it.
    let g = kiln_ir::parse_func_text(
        "func @main(%0: f32[64,64]) -> (f32[64,64], f32[64,64], f32[64,64]) {
  %1 = exponential %0 : f32[64,64]
  %2 = dot_general %0, %0 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]
  %3 = log %0 : f32[64,64]
  return %1, %2, %3
}
",
    )
    .unwrap();
    let fused = kiln_codegen_llvm::cpu::fused_kernels(
        &g,
        &common::env_options(),
        &kiln_codegen_llvm::cpu::host_target_info(),
    );
    kiln_codegen_llvm::fuse::check_legal(&g, &fused).unwrap();
    assert_eq!(fused.merged_into[0], Some(2), "{:?}", fused.decisions);
    let mut early = fused.clone();
    early.operands[1].push(g.insts[0].results[0]);
    let e = kiln_codegen_llvm::fuse::check_legal(&g, &early).unwrap_err();
    assert!(e.contains("before #2's kernel writes it"), "{e}");
}

#[test]
fn column_reductions_in_strips_agree() {
    // Sums, maxima and products down columns (the innermost output loop runs in wide strips,
    // then strips of 16, with one accumulator per column: over 600 rows, at least
    // `LoopLimits::wide_strip_rows`, 530 columns are 4 strips of 128 for one f32 sum on
    // AVX-512, one of 16 and 2 columns past it; over fewer rows, strips half as wide), with a
    // remainder past the last strip, split across threads, in several dtypes, and a reduction
    // over a middle dimension.
    for (ty, kind, init) in [
        ("f32", "add", "0.0"),
        ("f32", "max", "-inf"),
        ("f64", "add", "0.0"),
        ("bf16", "add", "0.0"),
        ("i32", "add", "0"),
        ("i32", "min", "2147483647"),
        ("f32", "mul", "1.0"),
    ] {
        for (rows, cols) in [(37, 50), (300, 530), (600, 530), (5, 16)] {
            if kind == "mul" && rows > 40 {
                // A product of hundreds of random values leaves f32's range partway (the
                // reference rounds its exact product once).
                continue;
            }
            let src = format!(
                "func @main(%0: {ty}[{rows},{cols}], %1: {ty}[{cols}]) -> {ty}[{cols}] {{
  %2 = constant {{value = {init}}} : {ty}[]
  %3 = reduce %0, %2 {{dimensions = [0], kind = {kind}}} : {ty}[{cols}]
  %4 = add %3, %1 : {ty}[{cols}]
  return %4
}}
"
            );
            common::agrees_on_random_inputs(&src, rows as u64);
        }
    }
    common::agrees_on_random_inputs(
        "func @main(%0: f32[4,33,40]) -> f32[4,40] {
  %1 = constant {value = 0.0} : f32[]
  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[4,40]
  %3 = exponential %2 : f32[4,40]
  return %3
}
",
        3,
    );
}

/// A reduction inside another, which stays fixed while some of the outer one's loops move: a
/// cross-entropy loss sums `y * (x - max - log(sum(exp(x - max))))` over rows and columns in
/// one kernel, and each row's maximum and sum of exponentials are computed once per row, where
/// the row loop opens, not at every column (nor the maximum again at every step of the sum).
/// Loops in the unoptimized IR: the rows, the maximum, the sum and the columns.
#[test]
fn reductions_inside_reductions_run_once_per_position() {
    let src = "func @main(%0: f32[64,10], %1: f32[64,10]) -> f32[] {
  %2 = constant {value = -inf} : f32[]
  %3 = reduce %0, %2 {dimensions = [1], kind = max} : f32[64]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f32[64,10]
  %5 = subtract %0, %4 : f32[64,10]
  %6 = exponential %5 : f32[64,10]
  %7 = constant {value = 0.0} : f32[]
  %8 = reduce %6, %7 {dimensions = [1], kind = add} : f32[64]
  %9 = log %8 : f32[64]
  %10 = broadcast_in_dim %9 {broadcast_dimensions = [0]} : f32[64,10]
  %11 = subtract %5, %10 : f32[64,10]
  %12 = multiply %11, %1 : f32[64,10]
  %13 = reduce %12, %7 {dimensions = [0, 1], kind = add} : f32[]
  return %13
}
";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &common::env_options()).unwrap();
    assert_eq!(ir.matches("define void @k").count(), 1, "one kernel\n{ir}");
    assert_eq!(ir.matches("\nhead").count(), 4, "four loops\n{ir}");
    // The loss's 640 values sum as a tree (`sum_tree`): leaves of 25 rows of 10 (at most 256
    // values), whose three sums add up in one more loop.
    assert_eq!(ir.matches("\ntree").count(), 1, "one tree level\n{ir}");
    common::agrees_cached_and_jit(src, 31);
    // Row statistics of a batched loss: the maximum depends on the outer two of three
    // reduced dimensions.
    common::agrees_on_random_inputs(
        "func @main(%0: f32[3,20,7]) -> f32[] {
  %1 = constant {value = -inf} : f32[]
  %2 = reduce %0, %1 {dimensions = [2], kind = max} : f32[3,20]
  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0, 1]} : f32[3,20,7]
  %4 = subtract %0, %3 : f32[3,20,7]
  %5 = exponential %4 : f32[3,20,7]
  %6 = constant {value = 0.0} : f32[]
  %7 = reduce %5, %6 {dimensions = [0, 1, 2], kind = add} : f32[]
  return %7
}
",
        32,
    );
}

/// Column sums run in wide strips (128 columns for one f32 sum on AVX-512 over 512 rows or
/// more, 64 over fewer), then strips of 16 columns, then one column at a time past the last
/// strip. Those last columns add down the column in the same order as the strips do (not
/// reassociated and vectorized along the strided column), so equal columns give bit-equal
/// sums wherever they fall; with 37 columns, 5 lie past the last strip; with 150 over 600
/// rows, 128 + 16 + 6, over 300, 2 x 64 + 16 + 6.
#[test]
fn column_sums_past_the_last_strip_add_in_the_strips_order() {
    for (ty, rows, cols) in [
        ("f32", 300, 37),
        ("f64", 300, 37),
        ("f32", 1000, 21),
        ("f32", 300, 150),
        ("f32", 600, 150),
        ("f64", 200, 150),
    ] {
        let src = format!(
            "func @main(%0: {ty}[{rows},{cols}]) -> {ty}[{cols}] {{
  %1 = constant {{value = 0.0}} : {ty}[]
  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : {ty}[{cols}]
  return %2
}}
"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let column = kiln_ir::random::random_literal(
            &mut kiln_ir::random::Rng::new(rows as u64),
            &kiln_ir::TensorType::new(f.param_types()[0].dtype, vec![rows]),
        )
        .to_f64s();
        let x: Vec<f64> = column
            .iter()
            .flat_map(|&v| std::iter::repeat_n(v, cols))
            .collect();
        let args = vec![kiln_ir::Literal::from_f64s(f.param_types()[0].clone(), &x).unwrap()];
        let dir = std::env::temp_dir().join("kiln-test-column-tails");
        for cache in [Some(dir.as_path()), None] {
            let got = CpuExecutable::compile_with_cache(&f, cache)
                .and_then(|e| e.run(&args))
                .unwrap();
            common::check(&f, &args, &got).unwrap();
            let sums = got[0].to_f64s();
            for (c, s) in sums.iter().enumerate() {
                assert_eq!(
                    s.to_bits(),
                    sums[0].to_bits(),
                    "{ty}[{rows},{cols}] column {c} (cache {cache:?}): {sums:?}"
                );
            }
        }
    }
}

/// Kernels equal to an earlier one (two products of the same shapes) run through one compiled
/// function, through the kernel cache and the JIT, and every result agrees with the reference.
/// Matrix products that differ only in their contraction length (30 and 600: one contraction
/// block, and two with 256-bit or 512-bit vectors) share one function taking it as a
/// parameter: with B stored as is and transposed, without an epilogue and with one, and
/// batched with A stored transposed; f32 and f64. Each kernel is a call of the shared
/// function. Through the kernel cache and the JIT, against the reference.
#[test]
fn products_differing_in_contraction_length_share_one_function() {
    let cases = [
        (
            "func @main(%0: f32[40,30], %1: f32[40,600], %2: f32[30,20], %3: f32[600,20], %4: f32[20,30], %5: f32[20,600]) -> (f32[40,20], f32[40,20], f32[40,20], f32[40,20]) {\n  %6 = dot_general %0, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,20]\n  %7 = dot_general %1, %3 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,20]\n  %8 = dot_general %0, %4 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : f32[40,20]\n  %9 = dot_general %1, %5 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : f32[40,20]\n  %10 = tanh %8 : f32[40,20]\n  %11 = tanh %9 : f32[40,20]\n  return %6, %7, %10, %11\n}\n",
            vec![("k0", 30), ("k0", 600), ("k3", 30), ("k3", 600)],
        ),
        (
            "func @main(%0: f32[2,30,40], %1: f32[2,600,40], %2: f32[2,30,20], %3: f32[2,600,20]) -> (f32[2,40,20], f32[2,40,20]) {\n  %4 = dot_general %0, %2 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : f32[2,40,20]\n  %5 = dot_general %1, %3 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : f32[2,40,20]\n  return %4, %5\n}\n",
            vec![("k0", 30), ("k0", 600)],
        ),
    ];
    for (src, calls) in cases {
        for dtype in ["f32", "f64"] {
            let src = src.replace("f32", dtype);
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &common::env_options())
                .unwrap();
            let shared = calls.len() / 2;
            assert_eq!(ir.matches("define private void @k").count(), shared, "{ir}");
            for (body, k) in &calls {
                let call =
                    format!("@{body}.shared(ptr %0, ptr %1, i64 %2, i64 %3, ptr %4, i64 {k})");
                assert!(ir.contains(&call), "{call}\n{ir}");
            }
            let args = common::random_args(&f, 23);
            let dir = std::env::temp_dir().join("kiln-test-contraction-groups");
            for cache in [Some(dir.as_path()), None] {
                let e = CpuExecutable::compile_with_cache(&f, cache).unwrap();
                // Several calls: a shared function run on row ranges split between threads
                // once computed every row on each thread (it took its rows from the shortest
                // product, which is not split), and the threads' sums raced.
                for _ in 0..4 {
                    let got = e.run(&args).unwrap();
                    common::check(&f, &args, &got)
                        .unwrap_or_else(|e| panic!("{src}\ncache {cache:?}: {e}"));
                }
            }
        }
    }
}

/// The packings that transpose blocks in registers (A stored by rows into slivers, B stored
/// transposed into panels), in f32 and f64, over whole panels, a tail panel, whole slivers and a
/// last short one: against the reference, through the kernel cache and the JIT. With 512-bit
/// vectors their transposes are two-source permutes (`vpermi2var`) whose indices no pass
/// folds; elsewhere shuffles.
#[test]
fn packings_that_transpose_in_registers_agree_with_the_reference() {
    let wide = kiln_codegen_llvm::cpu::host_target_info().vector_bytes >= 64;
    for (m, k, n) in [(70, 300, 600), (33, 37, 1000), (16, 16, 288)] {
        for dtype in ["f32", "f64"] {
            let src = format!(
                "func @main(%0: {dtype}[{m},{k}], %1: {dtype}[{n},{k}]) -> {dtype}[{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]}} : {dtype}[{m},{n}]\n  return %2\n}}\n"
            );
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let ir =
                kiln_codegen_llvm::cpu::function_llvm_ir(&f, true, &common::env_options()).unwrap();
            assert!(ir.contains("@kiln_gemm_packb_"), "{src}");
            assert_eq!(ir.contains("vpermi2var"), wide, "{src}");
            let args = common::random_args(&f, 5);
            let dir = std::env::temp_dir().join("kiln-test-transposing-packs");
            for cache in [Some(dir.as_path()), None] {
                let e = CpuExecutable::compile_with_cache(&f, cache).unwrap();
                let got = e.run(&args).unwrap();
                common::check(&f, &args, &got)
                    .unwrap_or_else(|e| panic!("{src}\ncache {cache:?}: {e}"));
            }
        }
    }
}

/// The GEMM routines keep no pointer past a call (`captures(none)` on their pointer
/// parameters), so a product's epilogue after the calls may read its other inputs knowing
/// they are not its output: its vectorized loop has no run-time overlap checks (and no second,
/// scalar path for when they fail), which took 2-3 ms of code generation per GEMM kernel of
/// the MLP step. Nor is it interleaved (an elementwise epilogue's light pipeline). Against
/// the reference too.
#[test]
fn a_products_epilogue_after_the_routines_needs_no_overlap_checks() {
    let src = "func @main(%0: f32[64,48], %1: f32[48,96], %2: f32[64,96], %3: f32[]) -> f32[64,96] {\n  %4 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,96]\n  %5 = broadcast_in_dim %3 {broadcast_dimensions = []} : f32[64,96]\n  %6 = multiply %4, %5 : f32[64,96]\n  %7 = subtract %2, %6 : f32[64,96]\n  return %7\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &common::env_options()).unwrap();
    let routine = ir
        .lines()
        .find(|l| l.starts_with("define hidden void @kiln_gemm_tile_"))
        .unwrap_or_else(|| panic!("a tile routine\n{ir}"));
    assert!(
        routine.contains("ptr noalias captures(none) %0"),
        "{routine}"
    );
    let optimized =
        kiln_codegen_llvm::cpu::function_llvm_ir(&f, true, &common::env_options()).unwrap();
    assert!(!optimized.contains("vector.memcheck"), "{optimized}");
    // Vectorized, one vector an iteration (`LIGHT_EPILOGUE_PIPELINE`: not interleaved).
    let body = optimized
        .split("\nvector.body:")
        .nth(1)
        .and_then(|b| b.split("\n\n").next())
        .unwrap_or_else(|| panic!("a vectorized loop\n{optimized}"));
    assert_eq!(body.matches("\n  store <").count(), 1, "{body}");
    common::agrees_cached_and_jit(src, 37);
}

#[test]
fn equal_kernels_share_one_function() {
    let src = "func @main(%0: f32[40,30], %1: f32[40,30], %2: f32[30,20], %3: f32[50,30]) -> (f32[40,20], f32[40,20], f32[50,20]) {\n  %4 = dot_general %0, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,20]\n  %5 = dot_general %1, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,20]\n  %6 = dot_general %3, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[50,20]\n  return %4, %5, %6\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    // The LLVM stage of the dump shows the compiled functions: two.
    let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &common::env_options()).unwrap();
    assert_eq!(ir.matches("define void @k").count(), 2, "{ir}");
    let args = common::random_args(&f, 21);
    let dir = std::env::temp_dir().join("kiln-test-equal-kernels");
    for cache in [Some(dir.as_path()), None] {
        let e = CpuExecutable::compile_with_cache(&f, cache).unwrap();
        let kernels = e.plan().iter().filter(|s| **s == Step::Kernel).count();
        assert_eq!((kernels, e.kernel_functions()), (3, 2), "cache {cache:?}");
        let got = e.run(&args).unwrap();
        common::check(&f, &args, &got).unwrap_or_else(|e| panic!("cache {cache:?}: {e}"));
    }
}

/// A bitcast between 16- or 8-bit types is a byte copy of its operand's buffer, so its operand
/// is stored, not inlined into it (it read a reversed f16 operand's bytes at element positions
/// and returned zeros), and it is not inlined into its users (its positions are bytes). Found
/// by the random programs with every op (seed 260).
#[test]
fn byte_copy_bitcasts_of_computed_values_agree_with_the_reference() {
    for src in [
        "func @main(%0: f16[1,4]) -> bf16[1,4] {
  %1 = reverse %0 {dimensions = [0, 1]} : f16[1,4]
  %2 = bitcast_convert %1 : bf16[1,4]
  return %2
}",
        "func @main(%0: f16[3,5], %1: f16[3,5]) -> bf16[3,5] {
  %2 = add %0, %1 : f16[3,5]
  %3 = bitcast_convert %2 : bf16[3,5]
  %4 = bitcast_convert %1 : bf16[3,5]
  %5 = multiply %3, %4 : bf16[3,5]
  return %5
}",
        "func @main(%0: i8[2,4]) -> f32[2] {
  %1 = reverse %0 {dimensions = [1]} : i8[2,4]
  %2 = bitcast_convert %1 : f32[2]
  %3 = abs %2 : f32[2]
  return %3
}",
    ] {
        common::agrees_on_random_inputs(src, 7);
    }
}

/// A convolution pads with zeros and then multiplies (StableHLO): a padded tap against an
/// infinite weight is NaN on every CPU path as in the reference (the direct loop nest, which
/// grouped and input-dilated convolutions take, gave 0 for it), and the interior is the finite
/// sum. Found by the random programs with special values.
#[test]
fn padded_taps_multiply_the_weight() {
    for (groups, lhs_dilation) in [(1, 1), (2, 1), (1, 2)] {
        let (inf, outf) = (2, 2);
        let per = inf / groups;
        let n = 3;
        let dn = (n - 1) * lhs_dilation + 1;
        let on = dn + 2 - 2 + 1;
        let src = format!(
            "func @main(%0: f32[1,{inf},{n},{n}], %1: f32[{outf},{per},2,2]) -> f32[1,{outf},{on},{on}] {{
  %2 = convolution %0, %1 {{window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [{lhs_dilation}, {lhs_dilation}], rhs_dilation = [1, 1], feature_group_count = {groups}, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]}} : f32[1,{outf},{on},{on}]
  return %2
}}"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let x = Literal::from_f64s(
            TensorType::new(DType::F32, [1, inf, n, n]),
            &vec![1.0; inf * n * n],
        )
        .unwrap();
        let mut wv = vec![1.0; outf * per * 4];
        wv[0] = f64::INFINITY;
        let w = Literal::from_f64s(TensorType::new(DType::F32, [outf, per, 2, 2]), &wv).unwrap();
        let args = [x, w];
        let got = CpuExecutable::compile_with_options(&f, &[], &common::env_options())
            .unwrap()
            .run(&args)
            .unwrap();
        let want = kiln_reference::eval(&f, &args).unwrap();
        let (g, e) = (got[0].to_f64s(), want[0].to_f64s());
        // Output (0, 0) puts the infinite weight on padding: NaN.
        assert!(e[0].is_nan(), "{e:?}");
        for (i, (a, b)) in g.iter().zip(&e).enumerate() {
            assert!(
                a.is_nan() == b.is_nan() && (a.is_nan() || a == b),
                "groups {groups}, lhs dilation {lhs_dilation}, element {i}: {a} vs {b}"
            );
        }
    }
}

/// A masked softmax's exponentials past the bottom of their range (masked logits, `-inf`)
/// are 0 by a select rather than by scaling the polynomial down to an underflow, which costs
/// a microcode assist on x86 cores: those lanes reduce 0 instead of the bottom, and the scaled
/// result is selected against 0. Exactly 0 there, and the reference's values on both sides of
/// the bottom (subnormal results included), in f32 and f64. A softmax that masks nothing keeps
/// the plain exponential (no select: it cost unmasked softmaxes about 3%).
#[test]
fn masked_softmax_exponentials_past_the_bottom_are_selected_zeros() {
    for (dt, bottom, xs) in [
        (
            "f32",
            -103.98,
            [
                f64::NEG_INFINITY,
                -1e30,
                -1000.0,
                -104.0,
                -103.99,
                -103.97,
                -103.9,
                -100.0,
                -95.0,
                -90.0,
                -87.4,
                -87.0,
                -50.0,
                -1.0,
                -0.5,
                0.0,
            ],
        ),
        (
            "f64",
            -745.14,
            [
                f64::NEG_INFINITY,
                -1e300,
                -5000.0,
                -746.0,
                -745.15,
                -745.13,
                -745.0,
                -740.0,
                -720.0,
                -708.5,
                -708.0,
                -300.0,
                -1.0,
                -0.5,
                -0.25,
                0.0,
            ],
        ),
    ] {
        let n = xs.len();
        let ty = if dt == "f32" { "float" } else { "double" };
        let selects = |src: &str| {
            let f = kiln_ir::parse_func_text(src).unwrap();
            let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &common::env_options())
                .unwrap();
            ir.lines().any(|l| {
                l.contains("= select i1 ") && l.contains(&format!(", {ty} 0.000000e+00, {ty} %y"))
            })
        };
        let plain = common::softmax_text(dt, &[2, n]);
        assert!(!selects(&plain), "{dt}: no select without a mask");
        // The same softmax of its logits masked where the mask is false.
        let s = format!("{dt}[2,{n}]");
        let masked = plain
            .replace(
                &format!("func @main(%0: {s}) -> {s} {{\n"),
                &format!(
                    "func @main(%10: {s}, %11: pred[2,{n}]) -> {s} {{\n  %12 = constant {{value = -inf}} : {dt}[]\n  %13 = broadcast_in_dim %12 {{broadcast_dimensions = []}} : {s}\n  %0 = select %11, %10, %13 : {s}\n"
                ),
            );
        assert!(
            selects(&masked),
            "{dt}: the scaled result selected against 0\n{masked}"
        );
        let f = kiln_ir::parse_func_text(&masked).unwrap();
        // The second row is the first shifted by 3 (the same differences from its maximum),
        // with its first and third logits masked out.
        let rows: Vec<f64> = xs
            .iter()
            .chain(xs.iter())
            .enumerate()
            .map(|(i, &x)| if i < n { x } else { x + 3.0 })
            .collect();
        let keep: Vec<f64> = (0..2 * n)
            .map(|i| if i == n || i == n + 2 { 0.0 } else { 1.0 })
            .collect();
        let x = Literal::from_f64s(f.values[f.params[0].index()].clone(), &rows).unwrap();
        let m = Literal::from_f64s(f.values[f.params[1].index()].clone(), &keep).unwrap();
        let args = [x, m];
        common::agrees(&f, &args).unwrap_or_else(|e| panic!("{dt}: {e}"));
        let exe = CpuExecutable::compile_with_options(&f, &[], &common::env_options()).unwrap();
        let got = exe.run(&args).unwrap()[0].to_f64s();
        for (i, y) in got.iter().enumerate() {
            if xs[i % n] < bottom || keep[i] == 0.0 {
                assert_eq!(y.to_bits(), 0, "{dt}: element {i} is +0, got {y}");
            }
        }
    }
}
