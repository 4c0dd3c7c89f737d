//! PTX validity: every GPU kernel the tests produce (each spec example of `ir-specs/ops`,
//! each target filetest, and random programs with the wide ops), mapped to the GPU as the emulator maps it,
//! rendered through LLVM's NVPTX target for sm_80 and sm_90 and assembled by ptxas. A kernel
//! ptxas rejects fails with its message; kernels that do not render are counted by reason,
//! printed, and fail. In CI (`CI` set), a missing ptxas is an error.

use kiln_codegen_llvm::Error;
use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
use kiln_ir::random::{Config, Rng, random_func};
use kiln_ir::{Func, parse_func_text};
use kiln_kernel::gpu::ir::{GpuProgram, MapKind, MmaOperand, Stmt};
use kiln_kernel::options::MatmulPrecision;
use kiln_kernel::target::TargetInfo;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod mapped;
mod ptxas;
mod split_stores;

use ptxas::ptxas;
use split_stores::split_stores;

/// A fresh directory for this test's files.
fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-ptx-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Assembles each `(name, ptx, sm)` with ptxas, on a few threads; the failures, with ptxas's
/// messages.
fn assemble_all(ptxas: &Path, dir: &Path, jobs: &[(String, String, String)]) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, text, sm)) = jobs.get(i) else {
                        break;
                    };
                    let (ok, msg) = ptxas::assemble(ptxas, dir, &i.to_string(), sm, &[], text);
                    if !ok {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{name} ({sm}): ptxas rejected it: {msg}\n{text}"));
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

/// What rendering a set of programs came to.
#[derive(Default)]
struct Tally {
    /// Kernel steps rendered (each for sm_80 and sm_90), and their launches.
    rendered: usize,
    launches: usize,
    /// Kernel steps that do not render, by reason.
    unsupported: BTreeMap<String, usize>,
    /// Kernel steps the mapping refused, by reason.
    unmapped: BTreeMap<String, usize>,
    /// Renderings that failed otherwise (LLVM errors): bugs.
    failures: Vec<String>,
    /// `(name, ptx, sm)` for ptxas.
    jobs: Vec<(String, String, String)>,
}

impl Tally {
    /// Maps and renders every kernel of `f` (lowered for `gpu`) for sm_80 and sm_90.
    fn add(&mut self, what: &str, f: &Func, gpu: &TargetInfo) {
        let opts = kiln_kernel::Options::default();
        let kernels = match mapped_kernels(f, &opts, gpu) {
            Ok(k) => k,
            Err(e) => {
                self.failures.push(format!("{what}: lowering failed: {e}"));
                return;
            }
        };
        for (name, p) in kernels {
            match p {
                Ok(p) => self.render(&format!("{what} {name}"), &p),
                Err(why) => {
                    // The reason without the kernel's name.
                    let why = why
                        .split_once(": ")
                        .map_or(why.clone(), |w| w.1.to_string());
                    *self.unmapped.entry(why).or_default() += 1;
                }
            }
        }
    }

    fn render(&mut self, name: &str, p: &GpuProgram) {
        for target in [PtxTarget::sm80(), PtxTarget::sm90()] {
            match program_ptx(p, &target) {
                Ok(text) => {
                    for l in split_stores(&text) {
                        self.failures
                            .push(format!("{name} ({}): a split 64-bit store: {l}", target.sm));
                    }
                    if target.sm == "sm_90" {
                        self.rendered += 1;
                        self.launches += p.launches.len();
                    }
                    self.jobs.push((name.to_string(), text, target.sm.clone()));
                }
                Err(Error::Unsupported(why)) => {
                    if target.sm == "sm_90" {
                        let why = why
                            .split_once(": ")
                            .map_or(why.clone(), |w| w.1.to_string());
                        *self.unsupported.entry(why).or_default() += 1;
                    }
                }
                Err(e) => self.failures.push(format!("{name} ({}): {e}", target.sm)),
            }
        }
    }

    /// Prints the table, assembles everything and fails on any failure.
    fn finish(mut self, what: &str) {
        println!(
            "{what}: {} kernel steps ({} launches) rendered for sm_80 and sm_90",
            self.rendered, self.launches
        );
        println!("  not rendered (kernel steps, by reason):");
        for (why, n) in &self.unsupported {
            println!("    {n:5}  {why}");
        }
        println!("  not mapped (kernel steps, by reason):");
        for (why, n) in &self.unmapped {
            println!("    {n:5}  {why}");
        }
        // Every element op renders on the GPU: no reason may keep a kernel from rendering.
        for why in self.unsupported.keys() {
            self.failures.push(format!("{what}: not rendered: {why}"));
        }
        match ptxas() {
            Some(ptxas) => {
                let dir = scratch(&what.replace(' ', "-"));
                let t = std::time::Instant::now();
                let rejected = assemble_all(&ptxas, &dir, &self.jobs);
                println!(
                    "  ptxas assembled {} of {} in {:.1} s",
                    self.jobs.len() - rejected.len(),
                    self.jobs.len(),
                    t.elapsed().as_secs_f64()
                );
                self.failures.extend(rejected);
                let _ = std::fs::remove_dir_all(&dir);
            }
            None => println!("  ptxas not found (cargo xtask test installs it): PTX text only"),
        }
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// The programs of `ir-specs/ops/*.md`'s examples (file:line, program).
fn spec_examples() -> Vec<(String, Func)> {
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
            let name = format!("{}:{line}", p.file_name().unwrap().to_string_lossy());
            let m = kiln_ir::parse_module(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push((name, m.entry().expect("a function").clone()));
        }
    }
    out
}

/// The target filetests (`// TARGET:` files under `tests/filetests`).
fn target_filetests() -> Vec<(String, Func)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("a directory")
            .map(|e| e.expect("readable").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "kir") {
                out.push(p);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/filetests");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable");
            if !text.lines().any(|l| l.starts_with("// TARGET:")) {
                return None;
            }
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            let m = kiln_ir::parse_module(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            Some((name, m.entry().expect("a function").clone()))
        })
        .collect()
}

/// An H200 that gives every reduction of 2 terms or more a warp and of 64 or more a block of
/// 128 threads (as the emulator's tests do), so random programs render the cooperative
/// reductions' shuffles, barriers and shared memory in every dtype and combiner, and small
/// products by block tiles.
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

#[test]
fn spec_examples_and_target_filetests_assemble() {
    let mut tally = Tally::default();
    let examples = spec_examples();
    for (name, f) in &examples {
        tally.add(name, f, &TargetInfo::h200());
    }
    let files = target_filetests();
    for (name, f) in &files {
        tally.add(name, f, &TargetInfo::h200());
        tally.add(&format!("{name} (cooperative)"), f, &cooperative_target());
    }
    tally.finish(&format!(
        "{} spec examples and {} target filetests",
        examples.len(),
        files.len()
    ));
}

#[test]
fn random_programs_assemble() {
    // Seeds 0 to 299, or those `KILN_PTX_PROGRAMS` names (a count `N` or a range `A..B`).
    let knob = std::env::var("KILN_PTX_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_PTX_PROGRAMS", knob.as_deref(), 0..300).unwrap();
    let n = seeds.end - seeds.start;
    let mut tally = Tally::default();
    for seed in seeds {
        // With the wide ops (scatters of hundreds of updates, long folds), as the CPU
        // differential test and the emulator draw them.
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        // Even seeds on an H200 as it is, odd ones with every reduction cooperative.
        let target = if seed % 2 == 0 {
            TargetInfo::h200()
        } else {
            cooperative_target()
        };
        tally.add(&format!("seed {seed}"), &f, &target);
    }
    tally.finish(&format!("{n} random programs"));
}

/// The one GPU program `src`'s function maps its only kernel to.
fn program(src: &str, gpu: &TargetInfo) -> GpuProgram {
    let f = parse_func_text(src).unwrap();
    let ks = mapped_kernels(&f, &kiln_kernel::Options::default(), gpu).unwrap();
    assert_eq!(ks.len(), 1, "{src} has one kernel");
    ks.into_iter().next().unwrap().1.unwrap()
}

#[test]
fn entries_are_named_after_launches_and_target_the_sm() {
    let p = program(
        "func @main(%0: f32[10,100], %1: f32[10,100]) -> f32[10,100] {\n  %2 = add %0, %1 : f32[10,100]\n  return %2\n}\n",
        &TargetInfo::h200(),
    );
    for target in [PtxTarget::sm80(), PtxTarget::sm90()] {
        let text = program_ptx(&p, &target).unwrap();
        assert_eq!(
            text,
            program_ptx(&p, &target).unwrap(),
            "PTX must be deterministic"
        );
        assert!(text.contains(".visible .entry k0_add("), "{text}");
        assert!(text.contains(&format!(".target {}", target.sm)), "{text}");
        assert!(text.contains(".version 8.0"), "{text}");
    }
}

/// A replacing scatter stores the update: no arithmetic on the values (found on an H200, where
/// `Replace` rendered as a sum; the emulator runs the GPU IR, not the PTX).
#[test]
fn a_replacing_scatter_renders_no_sum() {
    let p = program(
        "func @main(%0: f32[3,2], %1: i32[3,1], %2: f32[3,2]) -> f32[3,2] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = replace} : f32[3,2]\n  return %3\n}\n",
        &TargetInfo::h200(),
    );
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert!(!text.contains(".f32"), "{text}");
}

/// A 64-bit value is stored whole: NVPTX's data layout is the module's before the kernel is
/// built (found on an H200, where an f64 bitcast to i64 was stored as two `st.b32` of one
/// 64-bit register and its low half came out zero).
#[test]
fn a_64_bit_store_is_not_split() {
    let p = program(
        "func @main(%0: f64[16], %1: f64[16]) -> i64[16] {\n  %2 = add %0, %1 : f64[16]\n  %3 = bitcast_convert %2 : i64[16]\n  return %3\n}\n",
        &TargetInfo::h200(),
    );
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert_eq!(split_stores(&text), Vec::<String>::new(), "{text}");
}

/// The f64 functions the CPU takes from its C library render on the GPU as kiln's own code:
/// no call, their tables in PTX's constant space; and ptxas assembles them.
#[test]
fn f64_library_functions_render_without_calls() {
    let mut tally = Tally::default();
    for op in ["sine", "cosine", "tan", "atan2", "power"] {
        let src = if matches!(op, "atan2" | "power") {
            format!(
                "func @main(%0: f64[2], %1: f64[2]) -> f64[2] {{\n  %2 = {op} %0, %1 : f64[2]\n  return %2\n}}\n"
            )
        } else {
            format!(
                "func @main(%0: f64[2]) -> f64[2] {{\n  %1 = {op} %0 : f64[2]\n  return %1\n}}\n"
            )
        };
        let p = program(&src, &TargetInfo::h200());
        let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
        assert!(!text.contains("call"), "f64 {op} calls a function:\n{text}");
        assert!(
            text.contains(".const .align 8 .b8 kiln_"),
            "f64 {op} has no constant table:\n{text}"
        );
        tally.render(&format!("f64 {op}"), &p);
    }
    tally.finish("f64 library functions");
}

/// Attention of `(batch, queries, keys, head, columns)` in `dt`, its scores scaled by 1/8 and
/// causally masked where `causal`.
fn attention(
    (b, m, keys, k, n2): (usize, usize, usize, usize, usize),
    dt: &str,
    causal: bool,
) -> String {
    let s = format!("{dt}[{b},{m},{keys}]");
    let i = format!("i64[{b},{m},{keys}]");
    let logits = if causal {
        format!(
            "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n  %23 = compare %21, %22 {{comparison_direction = LE}} : pred[{b},{m},{keys}]\n  %24 = constant {{value = -inf}} : {dt}[]\n  %25 = broadcast_in_dim %24 {{broadcast_dimensions = []}} : {s}\n  %6 = select %23, %20, %25 : {s}\n"
        )
    } else {
        format!("  %6 = multiply %3, %5 : {s}\n")
    };
    format!(
        "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{keys},{k}], %2: {dt}[{b},{keys},{n2}]) -> {dt}[{b},{m},{n2}] {{\n  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}\n  %4 = constant {{value = 0.125}} : {dt}[]\n  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}\n{logits}  %7 = constant {{value = -inf}} : {dt}[]\n  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : {dt}[{b},{m}]\n  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}\n  %10 = subtract %6, %9 : {s}\n  %11 = exponential %10 : {s}\n  %12 = constant {{value = 0.0}} : {dt}[]\n  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : {dt}[{b},{m}]\n  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}\n  %15 = divide %11, %14 : {s}\n  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {dt}[{b},{m},{n2}]\n  return %16\n}}\n"
    )
}

/// Every form of a product by block tiles assembles for sm_80 and sm_90: each tile size of an
/// Attention as one launch (the product, its online softmax and the chained product), by
/// register tiles and by a warp per row, plain and with a causal mask, f32 and f64, several
/// head dimensions and output widths: assembled by ptxas.
#[test]
fn attention_assembles() {
    use kiln_kernel::gpu::ir::MapKind;
    // By register tiles (the H200's three, chosen by queries and widths: 64, 32 and 16 rows,
    // heads of 8 to 128, swizzled where a row is a power of two of chunks), and a warp per
    // row (an output wider than every tile's columns).
    let programs = [
        (
            attention((2, 9, 40, 8, 12), "f32", false),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 64, 1024, 64, 64), "f32", true),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 64, 300, 40, 24), "f32", false),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 64, 256, 64, 128), "f32", true),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 64, 256, 128, 128), "f32", false),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 5, 70, 16, 100), "f64", false),
            MapKind::AttentionTiled,
        ),
        (
            attention((1, 40, 70, 16, 250), "f32", true),
            MapKind::Attention,
        ),
        (
            attention((1, 5, 70, 16, 150), "f64", false),
            MapKind::Attention,
        ),
    ];
    let mut tally = Tally::default();
    for (i, (src, kind)) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        assert!(p.contains(kind), "program {i}: {p:?}");
        tally.add(&format!("attention {i}"), &f, &TargetInfo::h200());
    }
    tally.finish("attention");
}

/// H200 (and the one-thread-per-element product of a target without tiles, and rings of 4
/// stages), f32, f64, and f16 and bf16 operands with an f32 result (on the tensor cores), both
/// operands transposed or not, batches, an epilogue, a contraction long enough for two levels
/// of the sum tree, a convolution.
#[test]
fn products_by_block_tiles_assemble() {
    let product = |(batch, m, k, n): (usize, usize, usize, usize),
                   (inp, dt): (&str, &str),
                   a_trans: bool,
                   b_trans: bool| {
        let (a, ac) = if a_trans {
            (format!("{inp}[{batch},{k},{m}]"), 1)
        } else {
            (format!("{inp}[{batch},{m},{k}]"), 2)
        };
        let (b, bc) = if b_trans {
            (format!("{inp}[{batch},{n},{k}]"), 2)
        } else {
            (format!("{inp}[{batch},{k},{n}]"), 1)
        };
        let y = format!("{dt}[{batch},{m},{n}]");
        format!(
            "func @main(%0: {a}, %1: {b}, %2: {dt}[{n}]) -> {y} {{\n  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [{ac}], rhs_contracting_dimensions = [{bc}]}} : {y}\n  %4 = broadcast_in_dim %2 {{broadcast_dimensions = [2]}} : {y}\n  %5 = add %3, %4 : {y}\n  %6 = tanh %5 : {y}\n  return %6\n}}\n"
        )
    };
    let programs = [
        product((1, 130, 17, 129), ("f32", "f32"), false, false),
        product((2, 67, 9, 70), ("f64", "f64"), true, true),
        product((1, 20, 5000, 24), ("f32", "f32"), true, false),
        product((2, 19, 40, 17), ("f16", "f32"), false, true),
        product((1, 70, 33, 65), ("bf16", "f32"), true, true),
        "func @main(%0: f32[2,7,7,3], %1: f32[3,3,3,16]) -> f32[2,7,7,16] {\n  %2 = convolution %0, %1 {window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]} : f32[2,7,7,16]\n  return %2\n}\n".to_string(),
    ];
    let mut untiled = TargetInfo::h200();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    // Rings of 4 stages on both cores, within the 48 KiB the PTX declares statically.
    let mut deep = TargetInfo::h200();
    let gpu = deep.gpu.as_mut().expect("a GPU");
    (gpu.gemm_stages, gpu.mma_stages, gpu.shared_memory_per_block) = (4, 4, 48 << 10);
    let mut tally = Tally::default();
    for (i, src) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        // f16 and bf16 operands (programs 3 and 4) run on the tensor cores.
        let kind = if i == 3 || i == 4 {
            kiln_kernel::gpu::ir::MapKind::GemmMma
        } else {
            kiln_kernel::gpu::ir::MapKind::GemmTiled
        };
        assert!(p.contains(&kind), "program {i}: {p:?}");
        tally.add(&format!("product {i}"), &f, &TargetInfo::h200());
        tally.add(&format!("product {i} (untiled)"), &f, &untiled);
        tally.add(&format!("product {i} (4 stages)"), &f, &deep);
    }
    tally.finish("products by block tiles");
}

/// Full and column reductions split over blocks in two launches (`gpu/map/split.rs`): sums,
/// maxima and minima of f32, f16 and bf16, one and two levels of partials, a fused producer
/// and epilogue, two outputs, a column sum over two leading dimensions: assembled by ptxas.
#[test]
fn split_reductions_assemble() {
    use kiln_kernel::gpu::ir::MapKind::{ColumnPartials, SplitPartials};
    let reduce = |dt: &str, shape: &str, dims: &str, kept: &str, kind: &str| {
        let init = match kind {
            "add" => "0.0",
            "max" => "-inf",
            _ => "inf",
        };
        format!(
            "func @main(%0: {dt}[{shape}]) -> {dt}[{kept}] {{\n  %1 = constant {{value = {init}}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [{dims}], kind = {kind}}} : {dt}[{kept}]\n  return %2\n}}\n"
        )
    };
    let programs = [
        (reduce("f32", "100003", "0", "", "add"), SplitPartials),
        (reduce("f32", "300001", "0", "", "max"), SplitPartials),
        (reduce("bf16", "3,50000", "1", "3", "min"), SplitPartials),
        (reduce("f16", "70000", "0", "", "add"), SplitPartials),
        (reduce("f32", "4200,20", "0", "20", "add"), ColumnPartials),
        (reduce("f16", "1000,300", "0", "300", "max"), ColumnPartials),
        (reduce("bf16", "4,129,40", "0,1", "40", "add"), ColumnPartials),
        (
            "func @main(%0: f32[90000], %1: f32[90000]) -> (f32[], f32[]) {\n  %2 = multiply %0, %1 : f32[90000]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = add} : f32[]\n  %5 = sqrt %4 : f32[]\n  %6 = constant {value = -inf} : f32[]\n  %7 = reduce %0, %6 {dimensions = [0], kind = max} : f32[]\n  return %5, %7\n}\n".to_string(),
            SplitPartials,
        ),
    ];
    let mut tally = Tally::default();
    for (i, (src, kind)) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        assert!(p.contains(kind), "program {i}: {p:?}");
        tally.add(&format!("split reduction {i}"), &f, &TargetInfo::h200());
    }
    tally.finish("split reductions");
}

/// The argmax (or, with `LT`, argmin) of `dt[shape]` over `dims` with an iota index along
/// dimension `d`, NaN winning and ties to the lower index.
fn argmax_text(dt: &str, shape: &str, dims: &str, kept: &str, d: usize, dir: &str) -> String {
    format!(
        "func @main(%0: {dt}[{shape}], %1: {dt}[]) -> ({dt}[{kept}], i32[{kept}]) {{
  %2 = iota {{iota_dimension = {d}}} : i32[{shape}]
  %3 = constant {{value = 0}} : i32[]
  %4, %5 = reduce_region %0, %2, %1, %3 {{dimensions = [{dims}], body = func @arg(%0: {dt}[], %1: i32[], %2: {dt}[], %3: i32[]) -> ({dt}[], i32[]) {{
      %4 = compare %2, %0 {{comparison_direction = {dir}}} : pred[]
      %5 = compare %2, %2 {{comparison_direction = NE}} : pred[]
      %6 = or %4, %5 : pred[]
      %7 = compare %2, %0 {{comparison_direction = EQ}} : pred[]
      %8 = compare %3, %1 {{comparison_direction = LT}} : pred[]
      %9 = and %7, %8 : pred[]
      %10 = or %6, %9 : pred[]
      %11 = select %10, %2, %0 : {dt}[]
      %12 = select %10, %3, %1 : i32[]
      return %11, %12
    }}}} : {dt}[{kept}], i32[{kept}]
  return %4, %5
}}
"
    )
}

/// Whether some launch of `f`'s kernels evaluates a fold inside an expression.
fn folds_in_expressions(f: &Func) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::Eval { expr, .. } => {
                let mut found = false;
                kiln_kernel::kernel::visit(expr, &mut |e| {
                    found |= matches!(e, kiln_kernel::kernel::Expr::Fold { .. })
                });
                found
            }
            Stmt::For { body, .. } | Stmt::If { body, .. } => any(body),
            _ => false,
        })
    }
    let opts = kiln_kernel::Options::default();
    let ks = mapped_kernels(f, &opts, &TargetInfo::h200()).unwrap();
    ks.into_iter()
        .filter_map(|(_, p)| p.ok())
        .any(|p| p.launches.iter().any(|l| any(&l.body)))
}

/// `reduce_region`s with elementwise bodies as one launch (`gpu/map/fold.rs`): argmax and
/// argmin of f32, bf16 and i32 by a warp per row, a block per row, a thread per short row,
/// a thread per column and split over blocks (a whole tensor, two long rows), an exclusive
/// or, a `reduce_window_region` of 1024-element windows (a thread per output, in order), a
/// fold a concatenation guards and one next to a row sum (both computed in the expressions,
/// a thread each): assembled by ptxas.
#[test]
fn folds_assemble() {
    use kiln_kernel::gpu::ir::MapKind::{BlockRows, Elementwise, SplitPartials, WarpRows};
    let xor = "func @main(%0: i32[8,1000], %1: i32[]) -> i32[8] {\n  %2 = reduce_region %0, %1 {dimensions = [1], body = func @b(%0: i32[], %1: i32[]) -> i32[] {\n      %2 = xor %0, %1 : i32[]\n      return %2\n    }} : i32[8]\n  return %2\n}\n";
    let padded = "func @main(%0: i32[8,1000], %1: i32[], %5: i32[4]) -> i32[12] {\n  %2 = reduce_region %0, %1 {dimensions = [1], body = func @b(%0: i32[], %1: i32[]) -> i32[] {\n      %2 = xor %0, %1 : i32[]\n      return %2\n    }} : i32[8]\n  %4 = concatenate %5, %2 {dimension = 0} : i32[12]\n  return %4\n}\n";
    let beside = "func @main(%0: f32[8,1000], %1: f32[]) -> (f32[8], f32[8]) {\n  %2 = reduce_region %0, %1 {dimensions = [1], body = func @b(%0: f32[], %1: f32[]) -> f32[] {\n      %2 = maximum %0, %1 : f32[]\n      %3 = abs %2 : f32[]\n      return %3\n    }} : f32[8]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %0, %3 {dimensions = [1], kind = add} : f32[8]\n  return %2, %4\n}\n";
    let window = "func @main(%0: f32[3,2000], %1: f32[]) -> f32[3,11] {\n  %2 = reduce_window_region %0, %1 {window_dimensions = [1, 1024], window_strides = [1, 97], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 0], [3, 5]], body = func @b(%0: f32[], %1: f32[]) -> f32[] {\n      %2 = constant {value = 0.5} : f32[]\n      %3 = multiply %0, %2 : f32[]\n      %4 = add %3, %1 : f32[]\n      return %4\n    }} : f32[3,11]\n  return %2\n}\n";
    let programs = [
        (window.to_string(), Some(Elementwise)),
        (beside.to_string(), None),
        (padded.to_string(), None),
        (
            argmax_text("f32", "64,1000", "1", "64", 1, "GT"),
            Some(WarpRows),
        ),
        (
            argmax_text("bf16", "140,8192", "1", "140", 1, "LT"),
            Some(BlockRows),
        ),
        (
            argmax_text("f32", "70001", "0", "", 0, "GT"),
            Some(SplitPartials),
        ),
        (
            argmax_text("bf16", "2,9000", "1", "2", 1, "LT"),
            Some(SplitPartials),
        ),
        (
            argmax_text("i32", "100,33", "1", "100", 1, "GT"),
            Some(Elementwise),
        ),
        (
            argmax_text("f32", "1000,300", "0", "300", 0, "GT"),
            Some(Elementwise),
        ),
        (
            argmax_text("f32", "3,20,700", "0,2", "20", 2, "LT"),
            Some(WarpRows),
        ),
        (xor.to_string(), Some(WarpRows)),
        (padded.to_string(), None),
        (beside.to_string(), None),
    ];
    let mut tally = Tally::default();
    for (i, (src, kind)) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        match kind {
            Some(SplitPartials) => {
                let p = program_kinds(&f, &TargetInfo::h200());
                assert_eq!(p, [SplitPartials, Elementwise], "program {i}");
            }
            Some(kind) => {
                let p = program_kinds(&f, &TargetInfo::h200());
                assert_eq!(p, [*kind], "program {i}");
            }
            None => assert!(
                folds_in_expressions(&f),
                "program {i}: {:?}",
                program_kinds(&f, &TargetInfo::h200())
            ),
        }
        tally.add(&format!("fold {i}"), &f, &TargetInfo::h200());
    }
    tally.finish("folds");
}

/// Transposes through shared-memory tiles (`gpu/map/transpose.rs`): 2-D with ragged edges,
/// 3-D and 4-D permutations, f32, bf16, f16, f64 and i32, one fused with a producer:
/// assembled by ptxas.
#[test]
fn tiled_transposes_assemble() {
    use kiln_kernel::gpu::ir::MapKind::TransposeTiles;
    let transpose = |dt: &str, from: &str, perm: &str, to: &str| {
        format!(
            "func @main(%0: {dt}[{from}]) -> {dt}[{to}] {{\n  %1 = transpose %0 {{permutation = [{perm}]}} : {dt}[{to}]\n  return %1\n}}\n"
        )
    };
    let programs = [
        transpose("f32", "64,96", "1, 0", "96,64"),
        transpose("f32", "70,45", "1, 0", "45,70"),
        transpose("bf16", "100,64", "1, 0", "64,100"),
        transpose("f16", "3,40,33", "0, 2, 1", "3,33,40"),
        transpose("f64", "33,3,50", "2, 1, 0", "50,3,33"),
        transpose("i32", "2,33,5,40", "0, 2, 3, 1", "2,5,40,33"),
        "func @main(%0: f32[45,70]) -> f32[70,45] {\n  %1 = multiply %0, %0 : f32[45,70]\n  %2 = transpose %1 {permutation = [1, 0]} : f32[70,45]\n  return %2\n}\n".to_string(),
    ];
    let mut tally = Tally::default();
    for (i, src) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        assert_eq!(p, [TransposeTiles], "program {i}");
        tally.add(&format!("tiled transpose {i}"), &f, &TargetInfo::h200());
    }
    tally.finish("tiled transposes");
}

/// The mappings of every launch of `f`'s kernels on `target`.
fn program_kinds(f: &Func, target: &TargetInfo) -> Vec<kiln_kernel::gpu::ir::MapKind> {
    let ks = mapped_kernels(f, &kiln_kernel::Options::default(), target).unwrap();
    ks.into_iter()
        .flat_map(|(_, p)| p.map(|p| p.launches).unwrap_or_default())
        .map(|l| l.kind)
        .collect()
}

/// One warp's tensor-core tile (`cp.async`, `ldmatrix`, `mma.m16n8k16`, packed shared arrays) assembles
/// for sm_80 and sm_90, with bf16 and with f16 operands.
#[test]
fn a_warp_tile_on_tensor_cores_assembles() {
    let mut tally = Tally::default();
    for dtype in [kiln_ir::DType::BF16, kiln_ir::DType::F16] {
        let k = kiln_kernel::gpu::mma::warp_tile(dtype, TargetInfo::h200().sums);
        let p = GpuProgram {
            scratch: Vec::new(),
            zeroed: Vec::new(),
            launches: vec![k],
        };
        let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
        for needle in [
            "ldmatrix.sync.aligned.m8n8.x4",
            "mma.sync.aligned.m16n8k16.row.col",
        ] {
            assert!(text.contains(needle), "{dtype}: no {needle} in\n{text}");
        }
        tally.render(&format!("warp tile {dtype}"), &p);
    }
    tally.finish("tensor-core warp tiles");
}

/// The product `src` mapped with operands of `dtype` for `target`
/// ([`mapped::product_with_operands`]), its launch named `product`.
fn product_with_operands(src: &str, dtype: kiln_ir::DType, target: &TargetInfo) -> GpuProgram {
    mapped::product_with_operands(src, dtype, target, "product")
}

/// A batched product of f32 `a x b` into `y` (shapes as lists), contracting A's dimension
/// `ac` with B's `bc`.
fn batched_dot(a: &str, b: &str, ac: usize, bc: usize, y: &str) -> String {
    format!(
        "func @main(%0: f32[{a}], %1: f32[{b}]) -> f32[{y}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [{ac}], rhs_contracting_dimensions = [{bc}]}} : f32[{y}]\n  return %2\n}}\n"
    )
}

/// Products on the tensor cores assemble for sm_80 and sm_90: every tile size, bf16 and f16,
/// transposed operands, a contraction past one chunk of the sum tree; bf16 under pipelines of
/// 2 stages of 16, the H200's 3 of 32, and 4 of 64 (as many as fit).
#[test]
fn products_on_tensor_cores_assemble() {
    let programs = [
        batched_dot("1,64,32", "1,32,64", 2, 1, "1,64,64"),
        batched_dot("2,40,70", "2,65,40", 1, 2, "2,70,65"),
        batched_dot("1,9,300", "1,300,8", 2, 1, "1,9,8"),
        batched_dot("1,128,520", "1,520,128", 2, 1, "1,128,128"),
    ];
    // The 48 KiB of shared memory the PTX declares statically: the deeper rings are cut back
    // to fit (4 stages of 64 at 128 x 128 run as 2 of 48).
    let pipeline = |stages: usize, k: usize| {
        let mut t = TargetInfo::h200();
        let gpu = t.gpu.as_mut().expect("a GPU");
        gpu.shared_memory_per_block = 48 << 10;
        gpu.mma_stages = stages;
        for tile in &mut gpu.mma_tiles {
            tile.k = k;
        }
        t
    };
    let runs = [
        (kiln_ir::DType::BF16, (3, 32)),
        (kiln_ir::DType::F16, (3, 32)),
        (kiln_ir::DType::BF16, (2, 16)),
        (kiln_ir::DType::BF16, (4, 64)),
    ];
    let mut tally = Tally::default();
    for (i, src) in programs.iter().enumerate() {
        for (dtype, (stages, k)) in runs {
            let p = product_with_operands(src, dtype, &pipeline(stages, k));
            assert_eq!(
                p.launches[0].kind,
                kiln_kernel::gpu::ir::MapKind::GemmMma,
                "{i}"
            );
            tally.render(&format!("product {i} {dtype} {stages}x{k}"), &p);
        }
    }
    tally.finish("products on tensor cores");
}

/// Products of bf16 and f16 operands on sm_90a's warpgroups (`Gpu::wgmma_tiles`): 64 x 64 in
/// 3 stages of 64 (48 KiB, static), 128 x 128 in 4 (128 KiB) and 128 x 256 in 4 (192 KiB) in
/// dynamic shared memory aligned to 1024 bytes; rendered for sm_90a only (sm_90 refuses them)
/// and assembled by ptxas.
#[test]
fn products_on_warpgroups_assemble_for_sm_90a() {
    let programs = [
        batched_dot("1,64,32", "1,64,32", 2, 2, "1,64,64"),
        batched_dot("2,40,70", "2,65,40", 1, 2, "2,70,65"),
        batched_dot("1,256,520", "1,520,256", 2, 1, "1,256,256"),
    ];
    let target = |(m, n): (usize, usize), stages: usize| {
        let mut t = TargetInfo::h200();
        let gpu = t.gpu.as_mut().expect("a GPU");
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        gpu.mma_stages = stages;
        gpu.wgmma_tiles = vec![kiln_kernel::target::GemmTile {
            m,
            n,
            k: 64,
            thread_m: 64,
            thread_n: n,
        }];
        t
    };
    let mut jobs = Vec::new();
    for (tile, stages, dtype, dynamic) in [
        ((64, 64), 3, kiln_ir::DType::BF16, false),
        ((64, 64), 3, kiln_ir::DType::F16, false),
        ((128, 128), 4, kiln_ir::DType::BF16, true),
        ((128, 256), 4, kiln_ir::DType::BF16, true),
    ] {
        for (i, src) in programs.iter().enumerate() {
            let what = format!("product {i} {dtype} on {tile:?} x {stages}");
            let p = product_with_operands(src, dtype, &target(tile, stages));
            let l = &p.launches[0];
            // Products smaller than half the tile stay on `mma.sync`.
            if !l.uses_wgmma() {
                assert!(i < 2 && tile.0 > 64, "{what}: not on warpgroups");
                continue;
            }
            if i == 2 {
                assert_eq!(l.dynamic_shared > 0, dynamic, "{what}");
            }
            assert!(matches!(
                program_ptx(&p, &PtxTarget::sm90()),
                Err(Error::Unsupported(_))
            ));
            let text = program_ptx(&p, &PtxTarget::sm90a()).unwrap();
            let needle = format!("wgmma.mma_async.sync.aligned.m64n{}k16", tile.1);
            assert!(text.contains(&needle), "{what}: no {needle}");
            if l.dynamic_shared > 0 {
                assert!(text.contains(".extern .shared .align 1024 .b8"), "{what}");
            }
            jobs.push((what, text, "sm_90a".to_string()));
        }
    }
    match ptxas() {
        Some(ptxas) => {
            let dir = scratch("warpgroup-products");
            let rejected = assemble_all(&ptxas, &dir, &jobs);
            let _ = std::fs::remove_dir_all(&dir);
            assert!(rejected.is_empty(), "{}", rejected.join("\n"));
        }
        None => println!("ptxas not found (cargo xtask test installs it): PTX text only"),
    }
}

/// Kernels whose shared arrays take more than the 48 KiB PTX declares statically, mapped
/// where the target lets rings and attention tiles opt into dynamic shared memory: one
/// `.extern .shared` array each, no static arrays; assembled by ptxas for sm_80 and sm_90.
/// Tensor-core products of 128 x 64 in 4 stages of 64 (96 KiB), 128 x 128 in 3 of 64 and
/// 128 x 256 in 3 of 64 (144 KiB), and attention with heads of 128 on 64 query rows.
#[test]
fn kernels_in_dynamic_shared_memory_assemble() {
    let dynamic = |tile: Option<kiln_kernel::target::GemmTile>, stages: usize| {
        let mut t = TargetInfo::h200();
        let gpu = t.gpu.as_mut().expect("a GPU");
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        gpu.mma_stages = stages;
        if let Some(tile) = tile {
            gpu.mma_tiles.insert(0, tile);
        }
        t
    };
    let tile = |m, n, thread_m, thread_n| kiln_kernel::target::GemmTile {
        m,
        n,
        k: 64,
        thread_m,
        thread_n,
    };
    let product = "func @main(%0: f32[1,256,512], %1: f32[1,512,256]) -> f32[1,256,256] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]} : f32[1,256,256]\n  return %2\n}\n";
    let mut tally = Tally::default();
    for (what, target, bytes) in [
        ("128x64 4x64", dynamic(None, 4), 96 << 10),
        (
            "128x128 3x64",
            dynamic(Some(tile(128, 128, 64, 32)), 3),
            96 << 10,
        ),
        (
            "128x256 3x64",
            dynamic(Some(tile(128, 256, 64, 64)), 3),
            144 << 10,
        ),
    ] {
        let p = product_with_operands(product, kiln_ir::DType::BF16, &target);
        let l = &p.launches[0];
        assert_eq!(
            (l.kind, l.dynamic_shared),
            (MapKind::GemmMma, bytes),
            "{what}"
        );
        let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
        assert!(
            text.contains(".extern .shared .align 16 .b8"),
            "{what}: {text}"
        );
        assert!(!text.contains("_shared0"), "{what}: {text}");
        tally.render(&format!("product {what}"), &p);
    }
    let attention = "func @main(%0: f32[1,64,128], %1: f32[1,200,128], %2: f32[1,200,64]) -> f32[1,64,64] {
  %3 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]} : f32[1,64,200]
  %7 = constant {value = -inf} : f32[]
  %8 = reduce %3, %7 {dimensions = [2], kind = max} : f32[1,64]
  %9 = broadcast_in_dim %8 {broadcast_dimensions = [0, 1]} : f32[1,64,200]
  %10 = subtract %3, %9 : f32[1,64,200]
  %11 = exponential %10 : f32[1,64,200]
  %12 = constant {value = 0.0} : f32[]
  %13 = reduce %11, %12 {dimensions = [2], kind = add} : f32[1,64]
  %14 = broadcast_in_dim %13 {broadcast_dimensions = [0, 1]} : f32[1,64,200]
  %15 = divide %11, %14 : f32[1,64,200]
  %16 = dot_general %15, %2 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]} : f32[1,64,64]
  return %16
}
";
    let p = program(attention, &dynamic(None, 4));
    assert_eq!(p.launches[0].kind, MapKind::AttentionTiled);
    assert!(p.launches[0].dynamic_shared > 48 << 10);
    tally.render("attention 64 rows, heads of 128", &p);
    tally.finish("kernels in dynamic shared memory");
}

/// One warp's TF32 tile (`cp.async` into f32 shared arrays, `ldmatrix` of f32 words,
/// `cvt.rna.tf32.f32`, `mma.m16n8k8...tf32`) assembles for sm_80 and sm_90.
#[test]
fn a_tf32_warp_tile_assembles() {
    let mut tally = Tally::default();
    let k = kiln_kernel::gpu::mma::warp_tile_tf32(TargetInfo::h200().sums);
    let p = GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![k],
    };
    let text = program_ptx(&p, &PtxTarget::sm80()).unwrap();
    for needle in [
        "ldmatrix.sync.aligned.m8n8.x4",
        "cvt.rna.tf32.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    ] {
        assert!(text.contains(needle), "no {needle} in\n{text}");
    }
    tally.render("warp tile tf32", &p);
    tally.finish("TF32 warp tile");
}

/// One warpgroup's tile (`cp.async` into descriptor-laid arrays aligned to 1024 bytes,
/// `fence.proxy.async`, `wgmma.fence`, `wgmma.mma_async` through matrix descriptors,
/// `commit_group`, `wait_group`) renders for sm_90a only and assembles there, for every
/// swizzle mode and the widths 8, 64 and 256, bf16 and f16.
#[test]
fn a_warpgroup_tile_assembles_for_sm_90a() {
    use kiln_kernel::gpu::desc::WgSwizzle;
    let mut jobs = Vec::new();
    for swizzle in WgSwizzle::ALL {
        for (n, dtype) in [
            (8, kiln_ir::DType::BF16),
            (64, kiln_ir::DType::F16),
            (256, kiln_ir::DType::BF16),
        ] {
            let k = kiln_kernel::gpu::wgmma::warpgroup_tile(
                dtype,
                (n, 64),
                swizzle,
                n >= 64,
                TargetInfo::h200().sums,
            )
            .unwrap();
            let name = k.name.clone();
            let p = GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![k],
            };
            for target in [PtxTarget::sm90(), PtxTarget::sm80()] {
                match program_ptx(&p, &target) {
                    Err(Error::Unsupported(why)) => assert!(why.contains("sm_90a"), "{why}"),
                    other => panic!("{name} for {}: {other:?}", target.sm),
                }
            }
            let text = program_ptx(&p, &PtxTarget::sm90a()).unwrap();
            let op = if dtype == kiln_ir::DType::BF16 {
                "bf16"
            } else {
                "f16"
            };
            for needle in [
                ".target sm_90a".to_string(),
                "fence.proxy.async.shared::cta".into(),
                "wgmma.fence.sync.aligned".into(),
                format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{op}.{op}"),
                "wgmma.commit_group.sync.aligned".into(),
                "wgmma.wait_group.sync.aligned".into(),
                ".align 1024".into(),
            ] {
                assert!(text.contains(&needle), "{name}: no {needle} in\n{text}");
            }
            jobs.push((name, text, "sm_90a".to_string()));
        }
    }
    match ptxas() {
        Some(ptxas) => {
            let dir = scratch("warpgroup-tiles");
            let rejected = assemble_all(&ptxas, &dir, &jobs);
            let _ = std::fs::remove_dir_all(&dir);
            assert!(rejected.is_empty(), "{}", rejected.join("\n"));
        }
        None => println!("ptxas not found (cargo xtask test installs it): PTX text only"),
    }
}

/// Whether any statement of `body` (nested ones too) is a TF32 `mma`.
fn has_tf32_mma(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Mma { operand, .. } => *operand == MmaOperand::Tf32,
        Stmt::For { body, .. } | Stmt::If { body, .. } => has_tf32_mma(body),
        _ => false,
    })
}

/// f32 products on the TF32 tensor cores, as the options allow them, assemble for sm_80 and
/// sm_90: every tile size, B stored by rows (fragments by shared loads) and by columns
/// (`ldmatrix`), A transposed (staged through registers), batches, an epilogue in the launch,
/// a contraction past one chunk of the sum tree, a convolution, and pipelines of 2 stages of
/// 16, the H200's, and 4 of 64 (as many as fit 48 KiB); swizzled and not.
#[test]
fn tf32_products_assemble() {
    let dot = |a: &str, b: &str, ac: usize, bc: usize, y: &str| {
        format!(
            "func @main(%0: f32[{a}], %1: f32[{b}], %2: f32[{y}]) -> f32[{y}] {{\n  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [{ac}], rhs_contracting_dimensions = [{bc}]}} : f32[{y}]\n  %4 = add %3, %2 : f32[{y}]\n  return %4\n}}\n"
        )
    };
    let programs = [
        dot("1,64,32", "1,32,64", 2, 1, "1,64,64"),
        dot("2,40,70", "2,65,40", 1, 2, "2,70,65"),
        dot("1,9,300", "1,300,8", 2, 1, "1,9,8"),
        dot("1,128,520", "1,520,128", 2, 1, "1,128,128"),
        "func @main(%0: f32[2,7,7,3], %1: f32[3,3,3,16]) -> f32[2,7,7,16] {\n  %2 = convolution %0, %1 {window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]} : f32[2,7,7,16]\n  return %2\n}\n".to_string(),
    ];
    let pipeline = |stages: usize, k: usize, swizzle: bool| {
        let mut t = TargetInfo::h200();
        let gpu = t.gpu.as_mut().expect("a GPU");
        gpu.shared_memory_per_block = 48 << 10;
        gpu.mma_stages = stages;
        gpu.mma_swizzle = swizzle;
        for tile in &mut gpu.mma_tiles {
            tile.k = tile.k.min(k);
        }
        t
    };
    let opts = kiln_kernel::Options {
        matmul_precision: MatmulPrecision::Tf32,
        ..kiln_kernel::Options::default()
    };
    let mut tally = Tally::default();
    for (i, src) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        for (stages, k, swizzle) in [(2, 16, true), (4, 64, true), (3, 64, false)] {
            let target = pipeline(stages, k, swizzle);
            let mut tf32 = false;
            for (name, p) in mapped_kernels(&f, &opts, &target).unwrap() {
                let p = p.unwrap_or_else(|e| panic!("program {i} {name}: {e}"));
                tf32 |= p
                    .launches
                    .iter()
                    .any(|l| l.kind == MapKind::GemmMma && has_tf32_mma(&l.body));
                tally.render(&format!("tf32 product {i} {stages}x{k} {name}"), &p);
            }
            assert!(tf32, "program {i}: no TF32 mma on {stages} stages of {k}");
        }
    }
    tally.finish("products on TF32 tensor cores");
}

/// Sorts by keys (a bitonic network in shared memory, one block per slice) assemble for sm_80
/// and sm_90: float keys with NaN greatest, ascending and descending, integer keys, several
/// operands of other dtypes, slices along an inner and an outer dimension, the longest slice
/// that fits the shared memory a kernel declares, and longer ones (the network over two tiles
/// in three launches; the radix sort's counts, scans and scatters over scratch buffers), and
/// a long sort read only through its leading elements (the top-k's two launches).
#[test]
fn sorts_by_keys_assemble() {
    let nan_lt = |d: &str, co: &str| {
        format!(
            "func @main(%0: {d}[3,37], %1: {co}[3,37]) -> ({d}[3,37], {co}[3,37]) {{\n  %2, %3 = sort %0, %1 {{dimension = 1, is_stable = true, comparator = func @cmp(%0: {d}[], %1: {d}[], %2: {co}[], %3: {co}[]) -> pred[] {{\n      %4 = compare %0, %1 {{comparison_direction = LT}} : pred[]\n      %5 = compare %1, %1 {{comparison_direction = NE}} : pred[]\n      %6 = compare %0, %0 {{comparison_direction = EQ}} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8\n    }}}} : {d}[3,37], {co}[3,37]\n  return %2, %3\n}}\n"
        )
    };
    let int_gt = |d: &str| {
        format!(
            "func @main(%0: {d}[300,4]) -> {d}[300,4] {{\n  %1 = sort %0 {{dimension = 0, is_stable = true, comparator = func @cmp(%0: {d}[], %1: {d}[]) -> pred[] {{\n      %2 = compare %0, %1 {{comparison_direction = GT}} : pred[]\n      return %2\n    }}}} : {d}[300,4]\n  return %1\n}}\n"
        )
    };
    let programs = [
        nan_lt("f32", "i32"),
        nan_lt("f64", "f16"),
        nan_lt("bf16", "u8"),
        int_gt("i32"),
        int_gt("u64"),
        int_gt("i8"),
        // The longest f32 slice one block sorts: 4,096 keys and positions, 48 KiB.
        nan_lt("f32", "f32").replace("3,37", "2,4096"),
        // Longer slices: f32 just past a block (the network over two tiles); radix sorts of
        // f64 keys with an f16 payload along an inner dimension, descending i8 keys, f32 keys
        // of many tiles, bf16 keys, descending u16 and i64 keys.
        nan_lt("f32", "i32").replace("3,37", "1,4097"),
        nan_lt("f64", "f16").replace("3,37", "3,5000"),
        int_gt("i8").replace("300,4", "9000,2"),
        nan_lt("f32", "i32").replace("3,37", "1,20000"),
        nan_lt("bf16", "i64").replace("3,37", "2,9000"),
        int_gt("u16").replace("300,4", "20000,1"),
        int_gt("i64").replace("300,4", "9000,1"),
        // Only the first 5 of long slices read: the top-k's two launches (each tile's leading
        // keys, then the candidates' network and the operands' leading elements).
        nan_lt("f32", "i32").replace("3,37", "2,20000").replace(
            "  return %2, %3\n",
            "  %9 = slice %2 {start_indices = [0, 0], limit_indices = [2, 5], strides = [1, 1]} : f32[2,5]\n  %10 = slice %3 {start_indices = [0, 0], limit_indices = [2, 5], strides = [1, 1]} : i32[2,5]\n  return %9, %10\n",
        ).replace("-> (f32[2,20000], i32[2,20000]) {", "-> (f32[2,5], i32[2,5]) {"),
    ];
    let mut tally = Tally::default();
    for (i, src) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        assert!(
            p.contains(&kiln_kernel::gpu::ir::MapKind::Sort),
            "program {i}: {p:?}"
        );
        tally.add(&format!("sort {i}"), &f, &TargetInfo::h200());
    }
    let top_k = parse_func_text(programs.last().expect("programs")).unwrap();
    let names: Vec<String> = mapped_kernels(
        &top_k,
        &kiln_kernel::Options::default(),
        &TargetInfo::h200(),
    )
    .unwrap()
    .into_iter()
    .flat_map(|(_, p)| p.map(|p| p.launches).unwrap_or_default())
    .map(|l| l.name)
    .collect();
    assert!(
        names.iter().any(|n| n.ends_with("sort.tiles"))
            && names.iter().any(|n| n.ends_with("sort.select")),
        "{names:?}"
    );
    tally.finish("sort");
}

/// Scatters and select-and-scatters (`gpu/map/scatter.rs`, `select_scatter.rs`): a scatter
/// by a thread per own position (an embedding's gradient), by a thread per output element
/// scanning the updates (single elements into a vector and into a matrix at index pairs, f32,
/// bf16, f16, i32, f64, each combiner), by updates sorted by target (a block's network, tiles,
/// the radix sort), one on a single thread (a target too small for the scan to pay and
/// without shared memory for the sort); max pooling's gradients by a thread per output element (2x2
/// stride 2, 3x3 stride 2 padded, overlapping 3x3 stride 1; f32, bf16, f16, i32, GE and GT):
/// assembled by ptxas for sm_80 and sm_90.
#[test]
fn scatters_assemble() {
    use kiln_kernel::gpu::ir::MapKind::{Scatter, SelectScatter, Sort};
    let vector = |dt: &str, kind: &str| {
        format!(
            "func @main(%0: {dt}[37], %1: i32[50,1], %2: {dt}[50]) -> {dt}[37] {{\n  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = {kind}}} : {dt}[37]\n  return %3\n}}\n"
        )
    };
    let pairs = |dt: &str, kind: &str| {
        format!(
            "func @main(%0: {dt}[6,5], %1: i32[20,2], %2: {dt}[20]) -> {dt}[6,5] {{\n  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1, kind = {kind}}} : {dt}[6,5]\n  return %3\n}}\n"
        )
    };
    let rows = "func @main(%0: f32[30,64], %1: i32[100,1], %2: f32[100,64]) -> f32[30,64] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add} : f32[30,64]\n  return %3\n}\n".to_string();
    let pool = |dt: &str, dims: &str, grid: &str, w: &str, s: &str, pad: &str, select: &str| {
        format!(
            "func @main(%0: {dt}[{dims}], %1: {dt}[{grid}], %2: {dt}[]) -> {dt}[{dims}] {{\n  %3 = select_and_scatter %0, %1, %2 {{window_dimensions = [{w}], window_strides = [{s}], padding = [{pad}], select = {select}, kind = add}} : {dt}[{dims}]\n  return %3\n}}\n"
        )
    };
    let mut programs = vec![(rows, Scatter)];
    for (dt, kind) in [
        ("f32", "add"),
        ("bf16", "add"),
        ("f16", "mul"),
        ("i32", "max"),
        ("f64", "min"),
        ("f32", "replace"),
    ] {
        programs.push((vector(dt, kind), Scatter));
        programs.push((pairs(dt, kind), Scatter));
    }
    // Many updates: sorted by target (a block's network, tiles, the radix sort).
    for (dt, kind, n) in [
        ("f32", "add", "2000"),
        ("bf16", "add", "6000"),
        ("i32", "max", "20000"),
        ("f64", "replace", "3000"),
    ] {
        programs.push((vector(dt, kind).replace("50", n), Sort));
    }
    let same = "[0, 0], [0, 0], [0, 0], [0, 0]";
    let padded = "[0, 0], [0, 0], [1, 1], [1, 1]";
    for (dt, select) in [("f32", "GE"), ("bf16", "GE"), ("f16", "GT"), ("i32", "GE")] {
        programs.push((
            pool(
                dt,
                "2,3,8,8",
                "2,3,4,4",
                "1, 1, 2, 2",
                "1, 1, 2, 2",
                same,
                select,
            ),
            SelectScatter,
        ));
        programs.push((
            pool(
                dt,
                "1,2,9,9",
                "1,2,5,5",
                "1, 1, 3, 3",
                "1, 1, 2, 2",
                padded,
                select,
            ),
            SelectScatter,
        ));
        programs.push((
            pool(
                dt,
                "1,2,7,6",
                "1,2,7,6",
                "1, 1, 3, 3",
                "1, 1, 1, 1",
                padded,
                select,
            ),
            SelectScatter,
        ));
    }
    let mut tally = Tally::default();
    for (i, (src, kind)) in programs.iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}\n{src}"));
        let p = program_kinds(&f, &TargetInfo::h200());
        assert!(p.contains(kind), "program {i}: {p:?}");
        tally.add(&format!("scatter {i}"), &f, &TargetInfo::h200());
    }
    // The single thread, where the scan does not pay on a grid of one warp and the sort
    // has no shared memory.
    let mut small = TargetInfo::h200();
    let gpu = small.gpu.as_mut().expect("a GPU");
    (gpu.sms, gpu.blocks_per_sm, gpu.elementwise_block) = (1, 1, 32);
    gpu.static_shared_bytes = 16;
    let f = parse_func_text(
        &vector("f32", "add")
            .replace("[37]", "[4096]")
            .replace("50", "4096"),
    )
    .unwrap();
    assert_eq!(program_kinds(&f, &small), [Scatter]);
    tally.add("scatter on one thread", &f, &small);
    tally.finish("scatters");
}

/// Row caches of warp- and block-per-row kernels (softmax and a layer norm with scale and
/// shift, in f32, f16, bf16 and f64): in registers (no local memory: the unrolled slots stay
/// registers), in shared memory, and none, assembled by ptxas for sm_80 and sm_90.
#[test]
fn row_caches_assemble() {
    let softmax = |dt: &str, rows: usize, n: usize| {
        let m = format!("{dt}[{rows},{n}]");
        let r = format!("{dt}[{rows}]");
        format!(
            "func @main(%0: {m}) -> {m} {{\n  %1 = constant {{value = -inf}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = max}} : {r}\n  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [0]}} : {m}\n  %4 = subtract %0, %3 : {m}\n  %5 = exponential %4 : {m}\n  %6 = constant {{value = 0.0}} : {dt}[]\n  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : {r}\n  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : {m}\n  %9 = divide %5, %8 : {m}\n  return %9\n}}\n"
        )
    };
    let layer_norm = |dt: &str, rows: usize, n: usize| {
        let m = format!("{dt}[{rows},{n}]");
        let r = format!("{dt}[{rows}]");
        let v = format!("{dt}[{n}]");
        format!(
            "func @main(%0: {m}, %20: {v}, %21: {v}) -> {m} {{\n  %1 = constant {{value = 0.0}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : {r}\n  %3 = constant {{value = 0.001}} : {dt}[]\n  %4 = broadcast_in_dim %3 {{broadcast_dimensions = []}} : {r}\n  %5 = multiply %2, %4 : {r}\n  %6 = broadcast_in_dim %5 {{broadcast_dimensions = [0]}} : {m}\n  %7 = subtract %0, %6 : {m}\n  %8 = multiply %7, %7 : {m}\n  %9 = reduce %8, %1 {{dimensions = [1], kind = add}} : {r}\n  %10 = multiply %9, %4 : {r}\n  %11 = rsqrt %10 : {r}\n  %12 = broadcast_in_dim %11 {{broadcast_dimensions = [0]}} : {m}\n  %13 = multiply %7, %12 : {m}\n  %14 = broadcast_in_dim %20 {{broadcast_dimensions = [1]}} : {m}\n  %15 = multiply %13, %14 : {m}\n  %16 = broadcast_in_dim %21 {{broadcast_dimensions = [1]}} : {m}\n  %17 = add %15, %16 : {m}\n  return %17\n}}\n"
        )
    };
    let programs = [
        (
            "softmax f32 registers",
            softmax("f32", 64, 1000),
            "registers",
        ),
        ("softmax f16 registers", softmax("f16", 8, 300), "registers"),
        ("softmax bf16 block", softmax("bf16", 2, 8192), "registers"),
        ("softmax f64 registers", softmax("f64", 4, 500), "registers"),
        ("softmax f64 block", softmax("f64", 2, 16384), "registers"),
        (
            "softmax f32 shared",
            softmax("f32", 16, 1100),
            "shared memory",
        ),
        ("softmax f32 none", softmax("f32", 16, 2000), "none"),
        ("layer norm f32", layer_norm("f32", 16, 1000), "registers"),
        (
            "layer norm f16 shared",
            layer_norm("f16", 16, 1300),
            "shared memory",
        ),
        (
            "layer norm f32 block",
            layer_norm("f32", 2, 32768),
            "registers",
        ),
    ];
    let mut tally = Tally::default();
    for (what, src, place) in &programs {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("{what}: {e}"));
        let target = TargetInfo::h200();
        let p = program(src, &target);
        let text = kiln_kernel::gpu::print::program_text(&p);
        assert!(
            text.contains("// row cache: ") && text.contains(place),
            "{what}: not cached in {place}:\n{text}"
        );
        let ptx = program_ptx(&p, &PtxTarget::sm90()).unwrap();
        if *place == "registers" {
            assert!(!ptx.contains(".local"), "{what}: local memory:\n{ptx}");
            // Nor does ptxas spill the slots, fitting registers to the launch's block.
            if let Some(ptxas) = ptxas() {
                let dir = scratch("row-cache-spills");
                let (ok, info) = ptxas::assemble(&ptxas, &dir, "k", "sm_90", &["-v"], &ptx);
                let _ = std::fs::remove_dir_all(&dir);
                println!(
                    "{what}: {}",
                    info.lines()
                        .filter(|l| l.contains("Used"))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                assert!(
                    ok && info.contains("0 bytes spill stores")
                        && !info.lines().any(|l| l.contains("spill")
                            && !l.contains("0 bytes spill stores, 0 bytes spill loads")),
                    "{what}: ptxas spills:\n{info}"
                );
            }
        }
        tally.add(what, &f, &target);
    }
    tally.finish("row caches");
}

/// ptxas's report (`-v`) of `ptx` for `sm`, if ptxas is here: whether it assembled, and what
/// it said.
fn ptxas_report(ptx: &str, sm: &str) -> Option<(bool, String)> {
    let ptxas = ptxas()?;
    let dir = scratch(&format!("report-{sm}"));
    let report = ptxas::assemble(&ptxas, &dir, "k", sm, &["-v"], ptx);
    let _ = std::fs::remove_dir_all(&dir);
    Some(report)
}

/// bf16 and f16 attention on the tensor cores (`cp.async` rings, `ldmatrix` and its `.trans`,
/// `mma.m16n8k16`, the quads' shuffles) assembles for sm_80 and sm_90 without spills: heads
/// of 64 and 128 (steps of 64 and 32 keys), of 40 (padded to 48), causal and not, V given
/// transposed (staged by columns), and a ring of 3 stages of 64 keys in dynamic shared
/// memory.
#[test]
fn tensor_core_attention_assembles_without_spills() {
    let transposed_v = attention((2, 40, 128, 64, 64), "bf16", false)
        .replace("%2: bf16[2,128,64]", "%2: bf16[2,64,128]")
        .replace(
            "rhs_contracting_dimensions = [1]",
            "rhs_contracting_dimensions = [2]",
        );
    let mut ring = TargetInfo::h200();
    let g = ring.gpu.as_mut().expect("a GPU");
    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
    g.mma_attention_stages = 3;
    let h200 = TargetInfo::h200();
    let programs = [
        (
            "bf16 64 causal",
            attention((16, 1024, 1024, 64, 64), "bf16", true),
            &h200,
        ),
        (
            "bf16 64",
            attention((16, 1024, 1024, 64, 64), "bf16", false),
            &h200,
        ),
        (
            "bf16 128",
            attention((2, 256, 256, 128, 128), "bf16", true),
            &h200,
        ),
        (
            "f16 40x24",
            attention((1, 64, 300, 40, 24), "f16", false),
            &h200,
        ),
        ("bf16 V transposed", transposed_v, &h200),
        (
            "bf16 ring of 3",
            attention((2, 256, 256, 128, 128), "bf16", true),
            &ring,
        ),
    ];
    let mut tally = Tally::default();
    for (what, src, target) in &programs {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(program_kinds(&f, target), [MapKind::AttentionMma], "{what}");
        let p = program(src, target);
        for sm in [PtxTarget::sm80(), PtxTarget::sm90()] {
            let ptx = program_ptx(&p, &sm).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                ptx.contains("ldmatrix.sync.aligned.m8n8.x4")
                    && (what.contains("transposed")
                        || ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans"))
                    && ptx.contains("mma.sync.aligned.m16n8k16")
                    && ptx.contains("cp.async"),
                "{what}: not on the tensor cores:\n{ptx}"
            );
            if let Some((ok, info)) = ptxas_report(&ptx, &sm.sm) {
                println!(
                    "{what} ({}): {}",
                    sm.sm,
                    info.lines()
                        .filter(|l| l.contains("Used") || l.contains("spill"))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                assert!(
                    ok && !info.lines().any(|l| l.contains("spill")
                        && !l.contains("0 bytes spill stores, 0 bytes spill loads")),
                    "{what} ({}): ptxas:\n{info}",
                    sm.sm
                );
            }
        }
        tally.add(what, &f, target);
    }
    tally.finish("tensor-core attention");
}
