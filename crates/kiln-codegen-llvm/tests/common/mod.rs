//! Checks shared by the test binaries: result comparison and the matrix-product cases that run
//! on the GEMM (`differential.rs` with the host's vectors, `gemm_256bit.rs` with 256-bit ones).

#![allow(dead_code)]

use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::random::{Rng, random_literal};
use kiln_ir::{DType, Literal};
use kiln_reference::compare::{Tolerance, check_close};

/// The compile options of the test's environment (`KILN_CACHE_DIR`, `KILN_VECTOR_BITS`, ...,
/// see `kiln_kernel::options::SWITCHES`): tests read it as a program's boundary does.
pub fn env_options() -> kiln_kernel::Options {
    kiln_kernel::Options::from_vars(&|name| std::env::var(name).ok())
}

/// A loose comparison for results whose program is not at hand: a relative tolerance per dtype
/// and an absolute one scaled by the tensor's largest finite value (at least 1). Everything
/// with a program uses [`check`] (the bounds of `kiln_reference::accuracy`) instead.
pub fn close(a: &Literal, e: &Literal) -> Result<(), String> {
    let rtol = match e.dtype() {
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        DType::F32 => 1e-4,
        DType::F64 => 1e-9,
        _ => 0.0,
    };
    let scale = e
        .to_f64s()
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    let tol = Tolerance {
        atol: rtol * scale,
        rtol,
    };
    check_close(a, e, tol).map_err(|m| format!("{m} (the reference's)"))
}

/// Compiles `f` for the CPU, runs it on `args`, and compares every output with the reference
/// interpreter's under the bounds of `kiln_reference::accuracy` (per element, in ulps, from the
/// ops that produced it).
pub fn agrees(f: &kiln_ir::Func, args: &[Literal]) -> Result<(), String> {
    let exe =
        CpuExecutable::compile_with_options(f, &[], &env_options()).map_err(|e| e.to_string())?;
    compiled_whole(&exe)?;
    let got = exe.run(args).map_err(|e| e.to_string())?;
    check(f, args, &got).map(|_| ())
}

/// An error if any instruction of `exe` runs on the reference interpreter: every op has a
/// kernel, so a fallback would quietly turn a differential test into reference against
/// reference.
pub fn compiled_whole(exe: &CpuExecutable) -> Result<(), String> {
    match exe.plan().iter().position(|s| *s == Step::Reference) {
        None => Ok(()),
        Some(i) => Err(format!(
            "instruction {i} fell back to the reference interpreter: {:?}",
            exe.plan()
        )),
    }
}

/// Compares `got`, the outputs of `f` on `args`, with the reference interpreter's under the
/// bounds of `kiln_reference::accuracy`.
pub fn check(
    f: &kiln_ir::Func,
    args: &[Literal],
    got: &[Literal],
) -> Result<kiln_reference::accuracy::Stats, String> {
    kiln_reference::accuracy::check_outputs(f, args, got)
}

/// Random arguments for `f`'s parameters, from `seed`.
pub fn random_args(f: &kiln_ir::Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal(&mut rng, t))
        .collect()
}

/// Parses `src`, runs it on the CPU and on the reference with random arguments from `seed`,
/// and panics (naming the program) unless every output agrees.
pub fn agrees_on_random_inputs(src: &str, seed: u64) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let args = random_args(&f, seed);
    let exe = CpuExecutable::compile_with_options(&f, &[], &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    compiled_whole(&exe).unwrap_or_else(|e| panic!("{src}: {e}"));
    let got = exe.run(&args).unwrap_or_else(|e| panic!("{src}: {e}"));
    check(&f, &args, &got).unwrap_or_else(|e| panic!("{src}: {e}"));
}

/// Parses `src` (a function with a matrix product), compiles it through the kernel cache
/// (`$KILN_CACHE_DIR` or the default directory, else one under the temporary directory) and
/// again by the JIT (no cache: the GEMM routines defined in the function's own module instead
/// of linked in), and panics unless both agree with the reference on random arguments from
/// `seed`, and the first really ran from the cache's library: a GEMM routine missing from the
/// plan (`compile_cached`) would otherwise only fall back to the JIT, with a warning.
pub fn agrees_cached_and_jit(src: &str, seed: u64) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let args = random_args(&f, seed);
    let dir = env_options()
        .kernel_cache
        .unwrap_or_else(|| std::env::temp_dir().join("kiln-test-kernel-cache"));
    for cache in [Some(dir.as_path()), None] {
        let e =
            CpuExecutable::compile_with_cache(&f, cache).unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(e.in_kernel_cache(), cache.is_some(), "{src}");
        compiled_whole(&e).unwrap_or_else(|e| panic!("{src}: {e}"));
        let got = e.run(&args).unwrap_or_else(|e| panic!("{src}: {e}"));
        check(&f, &args, &got).unwrap_or_else(|e| panic!("{src} (cache {cache:?}): {e}"));
    }
}

/// Matrix products of many shapes on the GEMM, against the reference.
pub fn gemm_shapes() {
    // (batch, m, k, n) on AVX-512 blocking: rows that fill register tiles and rows that leave
    // a partial one; rows past one packed block of A (96 f32 rows); contractions crossing the
    // 512-step block (256 on AVX2); column tails narrower than a panel; more columns than one
    // packed block of B (2048 f32 or 1024 f64 columns); work large enough to split rows across
    // threads mid-batch, or columns when there are fewer rows than columns.
    let shapes = [
        (3, 8, 300, 37),
        (1, 1, 1, 1),
        (2, 13, 5, 32),
        (1, 200, 513, 70),
        (5, 37, 64, 33),
        (1, 3, 3, 4100),
        (4, 100, 40, 17),
        // Few rows and many columns: threads split the columns.
        (1, 50, 300, 1000),
        // Split columns on 6 x 4 tiles (AVX-512), which pad them less than 8 x 3: whole panels
        // across two contraction blocks, and a tail narrower than a panel.
        (1, 40, 600, 1024),
        (1, 30, 70, 250),
        // A few panels (256 columns of 6 x 4 tiles, 192 of 8 x 3): the tiles read A in place
        // (AVX-512), past a block of rows and across contraction blocks, threads splitting
        // the columns; then the rows, with a partial tile.
        (1, 100, 530, 256),
        (1, 300, 70, 192),
        // Past 256 columns on an Intel CPU with AVX-512: 14 x 2 tiles, rows past a packed
        // block of A (84 f32 rows), a partial tile, two contraction blocks, a column tail.
        (1, 100, 530, 300),
    ];
    for dtype in ["f32", "f64"] {
        for (bt, m, k, n) in shapes {
            let src = format!(
                "func @main(%0: {dtype}[{bt},{m},{k}], %1: {dtype}[{bt},{k},{n}]) -> {dtype}[{bt},{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {dtype}[{bt},{m},{n}]\n  return %2\n}}\n"
            );
            agrees_cached_and_jit(&src, 9);
        }
    }
}

/// Matrix products with their dimensions in and out of the orders the GEMM reads in place.
pub fn dimension_orders() {
    // Several free and contracting dimensions, in and out of the orders the GEMM reads in place
    // (either operand may be stored transposed); the fourth case permutes an operand first.
    let cases = [
        (
            "f32[2,3,4,5]",
            "f32[2,4,5,6,7]",
            "[0]",
            "[0]",
            "[2,3]",
            "[1,2]",
            "f32[2,3,6,7]",
        ),
        ("f32[6,4]", "f32[4]", "[]", "[]", "[1]", "[0]", "f32[6]"),
        ("f32[4,6]", "f32[4,5]", "[]", "[]", "[0]", "[0]", "f32[6,5]"),
        (
            "f32[3,2,4,5]",
            "f32[5,2,4,7]",
            "[1]",
            "[1]",
            "[3,2]",
            "[0,2]",
            "f32[2,3,7]",
        ),
        ("f64[2,3]", "f64[5,3]", "[]", "[]", "[1]", "[1]", "f64[2,5]"),
        // Transposed operands read in place, across contraction blocks and threads.
        (
            "f32[2,300,37]",
            "f32[2,45,300]",
            "[0]",
            "[0]",
            "[1]",
            "[2]",
            "f32[2,37,45]",
        ),
        (
            "f32[700,200]",
            "f32[700,70]",
            "[]",
            "[]",
            "[0]",
            "[0]",
            "f32[200,70]",
        ),
        (
            "f64[130,260]",
            "f64[33,260]",
            "[]",
            "[]",
            "[1]",
            "[1]",
            "f64[130,33]",
        ),
        // A stored transposed and read in place (a single panel of columns), across
        // contraction blocks, with a row tail.
        (
            "f32[600,150]",
            "f32[600,10]",
            "[]",
            "[]",
            "[0]",
            "[0]",
            "f32[150,10]",
        ),
        // A stored transposed and packed in blocks of steps: a partial sliver after a whole
        // block of rows, a contraction block of 18 steps after one of 512.
        (
            "f32[530,100]",
            "f32[530,256]",
            "[]",
            "[]",
            "[0]",
            "[0]",
            "f32[100,256]",
        ),
        // 64 columns: the 6 x 4 tile (no padding), with row tails and contraction blocks.
        (
            "f32[203,700]",
            "f32[700,64]",
            "[]",
            "[]",
            "[1]",
            "[0]",
            "f32[203,64]",
        ),
        // B stored transposed across whole panels (packed by in-register transposes of
        // vector-square blocks), a contraction that is not a whole number of blocks, and a
        // tail panel; batched too.
        (
            "f32[64,300]",
            "f32[100,300]",
            "[]",
            "[]",
            "[1]",
            "[1]",
            "f32[64,100]",
        ),
        (
            "f32[2,20,70]",
            "f32[2,130,70]",
            "[0]",
            "[0]",
            "[2]",
            "[2]",
            "f32[2,20,130]",
        ),
    ];
    for (a, b, lb, rb, lc, rc, out) in cases {
        let src = format!(
            "func @main(%0: {a}, %1: {b}) -> {out} {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = {lb}, rhs_batching_dimensions = {rb}, lhs_contracting_dimensions = {lc}, rhs_contracting_dimensions = {rc}}} : {out}\n  return %2\n}}\n"
        );
        agrees_cached_and_jit(&src, 4);
    }
}

/// Convolutions on the implicit-im2col GEMM (and the direct kernel), against the reference.
pub fn convolutions() {
    // (input type, kernel type, output type, attributes) in NCHW/OIHW and NHWC/HWIO layouts.
    let cases = [
        (
            "f32[2,3,9,8]",
            "f32[4,3,3,2]",
            "f32[2,4,4,4]",
            "window_strides = [2, 2], padding = [[1, 0], [0, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 2], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        (
            "f32[2,7,7,3]",
            "f32[3,3,3,5]",
            "f32[2,7,7,5]",
            "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]",
        ),
        // Contraction (3*3*40) across blocks, rows (2*12*12) across packed row blocks and
        // threads, 37 output channels (a panel and a tail).
        (
            "f32[2,40,12,12]",
            "f32[37,40,3,3]",
            "f32[2,37,12,12]",
            "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // 64 output channels: the 6 x 4 tile.
        (
            "f32[2,16,10,10]",
            "f32[64,16,3,3]",
            "f32[2,64,10,10]",
            "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // 100 output channels: several panels, so the patches are packed (with one panel the
        // tile reads the input through the offset table).
        (
            "f32[2,8,7,6]",
            "f32[100,8,3,3]",
            "f32[2,100,5,4]",
            "window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // Already in the GEMM's layouts, stride and dilation both 2, no padding.
        (
            "f32[3,11,13,6]",
            "f32[2,3,6,9]",
            "f32[3,5,5,9]",
            "window_strides = [2, 2], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [2, 2], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]",
        ),
        (
            "f64[1,2,5,5]",
            "f64[3,2,5,5]",
            "f64[1,3,1,1]",
            "window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // NCHW outputs are written by the GEMM's columns, one plane per feature. 7 x 7 / 2 to
        // 64 features: 100 pixels per image, so each image ends in a partial tile.
        (
            "f32[3,3,20,20]",
            "f32[64,3,7,7]",
            "f32[3,64,10,10]",
            "window_strides = [2, 2], padding = [[3, 3], [3, 3]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // A contraction of two blocks (5 * 5 * 24), so the second reads the planes back.
        (
            "f32[2,24,9,9]",
            "f32[20,24,5,5]",
            "f32[2,20,9,9]",
            "window_strides = [1, 1], padding = [[2, 2], [2, 2]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // One image of 16 pixels and 200 features: the threads split the columns.
        (
            "f32[1,8,4,4]",
            "f32[200,8,3,3]",
            "f32[1,200,4,4]",
            "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        (
            "f64[2,60,6,7]",
            "f64[10,60,3,3]",
            "f64[2,10,6,7]",
            "window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // No input features: an empty contraction, zeros written by planes.
        (
            "f32[2,0,5,5]",
            "f32[4,0,3,3]",
            "f32[2,4,3,3]",
            "window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
    ];
    for (x, w, y, attrs) in cases {
        agrees_cached_and_jit(&convolution(x, w, y, attrs), 4);
    }
}

/// A function of one convolution of `x` by `w` into `y`, with attributes `attrs`.
pub fn convolution(x: &str, w: &str, y: &str, attrs: &str) -> String {
    format!(
        "func @main(%0: {x}, %1: {w}) -> {y} {{\n  %2 = convolution %0, %1 {{{attrs}}} : {y}\n  return %2\n}}\n"
    )
}

/// 3 x 3 convolutions that run as Winograd's F(4x4, 3x3) (32 or more input and output
/// features), against the reference: outputs that fill whole 4 x 4 tiles and outputs that
/// leave partial ones, symmetric, asymmetric and no padding, NCHW and NHWC layouts, f32 and f64.
pub fn winograd_convolutions() {
    let cases = [
        (
            "f32[2,64,13,11]",
            "f32[40,64,3,3]",
            "f32[2,40,13,11]",
            "padding = [[1, 1], [1, 1]], input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        (
            "f32[1,9,10,32]",
            "f32[3,3,32,48]",
            "f32[1,9,9,48]",
            "padding = [[0, 2], [1, 0]], input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]",
        ),
        (
            "f32[3,32,8,12]",
            "f32[64,32,3,3]",
            "f32[3,64,6,10]",
            "padding = [[0, 0], [0, 0]], input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
        // The kernel as IOHW (an input gradient's layout), the output as NHWC.
        (
            "f32[2,40,9,7]",
            "f32[40,33,3,3]",
            "f32[2,9,7,33]",
            "padding = [[1, 1], [1, 1]], input_dims = [0, 1, 2, 3], kernel_dims = [1, 0, 2, 3], output_dims = [0, 3, 1, 2]",
        ),
        (
            "f64[1,32,8,8]",
            "f64[32,32,3,3]",
            "f64[1,32,8,8]",
            "padding = [[1, 1], [1, 1]], input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
        ),
    ];
    for (x, w, y, attrs) in cases {
        let attrs = format!(
            "window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, {attrs}"
        );
        let src = convolution(x, w, y, &attrs);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let fused = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(
            !fused.contains("convolution") && fused.contains("dot_general"),
            "{src}: not rewritten into Winograd's transforms:\n{fused}"
        );
        agrees_cached_and_jit(&src, 5);
    }
}

/// Transposed products (folded into swapped ones, or not), against the reference.
pub fn transposed_folds() {
    // transpose(a b) swapping the free parts becomes b a; a transpose that does not swap them,
    // or a product with another user, stays.
    let cases = [
        "func @main(%0: f32[40,30], %1: f32[30,50]) -> f32[50,40] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,50]\n  %3 = transpose %2 {permutation = [1, 0]} : f32[50,40]\n  return %3\n}\n",
        "func @main(%0: f32[3,4,5,6], %1: f32[3,6,7]) -> f32[3,7,4,5] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [1]} : f32[3,4,5,7]\n  %3 = transpose %2 {permutation = [0, 3, 1, 2]} : f32[3,7,4,5]\n  return %3\n}\n",
        "func @main(%0: f32[3,4,5,6], %1: f32[3,6,7]) -> f32[3,5,4,7] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [1]} : f32[3,4,5,7]\n  %3 = transpose %2 {permutation = [0, 2, 1, 3]} : f32[3,5,4,7]\n  return %3\n}\n",
        "func @main(%0: f32[4,6], %1: f32[6,5]) -> (f32[5,4], f32[4,5]) {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[4,5]\n  %3 = transpose %2 {permutation = [1, 0]} : f32[5,4]\n  return %3, %2\n}\n",
    ];
    for src in cases {
        agrees_on_random_inputs(src, 8);
    }
}

/// A product followed by a softmax over its rows (`[b, m, k] x [b, k, n]`, scaled by `s`),
/// or over its columns when `rows` is false (not a row epilogue: the columns span blocks).
pub fn softmax_of_product(b: usize, m: usize, k: usize, n: usize, rows: bool) -> String {
    let (dim, keep, bshape) = if rows {
        (2, "[0, 1]", format!("[{b},{m}]"))
    } else {
        (1, "[0, 2]", format!("[{b},{n}]"))
    };
    format!(
        "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{k},{n}]) -> f32[{b},{m},{n}] {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{b},{m},{n}]
  %3 = constant {{value = 0.125}} : f32[]
  %4 = broadcast_in_dim %3 {{broadcast_dimensions = []}} : f32[{b},{m},{n}]
  %5 = multiply %2, %4 : f32[{b},{m},{n}]
  %6 = constant {{value = -inf}} : f32[]
  %7 = reduce %5, %6 {{dimensions = [{dim}], kind = max}} : f32{bshape}
  %8 = broadcast_in_dim %7 {{broadcast_dimensions = {keep}}} : f32[{b},{m},{n}]
  %9 = subtract %5, %8 : f32[{b},{m},{n}]
  %10 = exponential %9 : f32[{b},{m},{n}]
  %11 = constant {{value = 0.0}} : f32[]
  %12 = reduce %10, %11 {{dimensions = [{dim}], kind = add}} : f32{bshape}
  %13 = broadcast_in_dim %12 {{broadcast_dimensions = {keep}}} : f32[{b},{m},{n}]
  %14 = divide %10, %13 : f32[{b},{m},{n}]
  return %14
}}
"
    )
}

/// Softmaxes over the rows of products run as the GEMM's epilogue (one kernel), with a batch of
/// one (its variable always zero) or more, across row blocks and threads, column tails, several
/// contraction blocks and rows wider than a packed block of B, against the reference; the
/// product of a softmax over columns keeps a kernel of its own.
pub fn row_epilogues() {
    for (b, m, k, n) in [
        (2, 4, 8, 4),
        (3, 37, 20, 50),
        (1, 130, 40, 97),
        (2, 9, 600, 33),
        (2, 20, 16, 700),
        (4, 64, 64, 512),
    ] {
        let src = softmax_of_product(b, m, k, n, true);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(fusion.contains("// 1 kernels"), "{fusion}");
        agrees_on_random_inputs(&src, (b * m + k * n) as u64);
    }
    let src = softmax_of_product(2, 20, 8, 12, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
    assert!(fusion.contains("dot_general: own kernel"), "{fusion}");
    agrees_on_random_inputs(&src, 5);
}

/// Attention in `dt`, `softmax(q kᵀ / 8) v` with q `[b, m, k]`, k `[b, keys, k]` and v
/// `[b, keys, n2]` (`[b, n2, keys]` with `v_trans`); with `probs` the probabilities are
/// returned too.
pub fn attention_text(
    dt: &str,
    (b, m, keys, k, n2): (usize, usize, usize, usize, usize),
    v_trans: bool,
    probs: bool,
) -> String {
    let (vshape, vdim) = if v_trans {
        (format!("[{b},{n2},{keys}]"), 2)
    } else {
        (format!("[{b},{keys},{n2}]"), 1)
    };
    let (ret, rty) = if probs {
        (
            "%16, %15".to_string(),
            format!("{dt}[{b},{m},{n2}], {dt}[{b},{m},{keys}]"),
        )
    } else {
        ("%16".to_string(), format!("{dt}[{b},{m},{n2}]"))
    };
    let s = format!("{dt}[{b},{m},{keys}]");
    format!(
        "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{keys},{k}], %2: {dt}{vshape}) -> ({rty}) {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}
  %4 = constant {{value = 0.125}} : {dt}[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
  %6 = multiply %3, %5 : {s}
  %7 = constant {{value = -inf}} : {dt}[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : {dt}[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : {dt}[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : {dt}[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [{vdim}]}} : {dt}[{b},{m},{n2}]
  return {ret}
}}
"
    )
}

/// Attention's two products chained in one kernel (the second multiplying each block of the
/// first's softmax rows while it is in cache) agree with the reference, through the kernel cache
/// and the JIT: one batch and several; rows crossing blocks and threads; V's columns one
/// panel, several, and with a tail; V stored transposed; a second product of several
/// contraction blocks (600 scores per row); more keys than a plain row epilogue takes (3000,
/// and 5000 with one row per block); f32 and f64. A first product longer than one contraction
/// block, probabilities that are also returned, or more keys than a chain takes keep two or
/// three kernels, and so does a softmax of more than 2048 columns that no product reads.
pub fn chained_products() {
    for (dt, shape, v_trans) in [
        ("f32", (2, 4, 4, 8, 4), false),
        ("f32", (1, 130, 130, 40, 20), false),
        ("f32", (3, 100, 100, 64, 64), true),
        ("f32", (2, 600, 600, 16, 37), false),
        ("f32", (2, 97, 97, 256, 8), true),
        ("f32", (2, 9, 3000, 16, 24), false),
        // The benchmark's 512 keys and 64-wide heads (6 x 4 tiles for both products on AVX-512).
        ("f32", (1, 50, 512, 64, 64), false),
        ("f32", (1, 13, 5000, 8, 8), true),
        ("f64", (2, 70, 70, 24, 13), false),
        ("f64", (1, 300, 300, 8, 40), true),
        ("f64", (1, 7, 2500, 16, 9), false),
        // More keys than a block of rows holds whole: the softmax runs online, over blocks of
        // keys (the last one partial), V with one panel of columns, several, and transposed.
        ("f32", (1, 3, 16385, 8, 8), false),
        ("f32", (2, 45, 20000, 16, 70), false),
        ("f32", (1, 7, 16400, 64, 8), true),
        ("f64", (2, 9, 17000, 8, 20), false),
        // V one whole panel wide (64 columns on AVX-512), read in place by the tiles: each
        // block of keys from its own rows of V, in each batch.
        ("f32", (2, 9, 17000, 8, 64), false),
    ] {
        let src = attention_text(dt, shape, v_trans, false);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(fusion.contains("// 1 kernels"), "{fusion}");
        // The softmax runs online, over blocks of keys.
        assert!(fusion.contains("online:"), "{fusion}");
        let (b, m, keys, k, n2) = shape;
        agrees_cached_and_jit(&src, (b * m + keys + k * n2) as u64);
    }
    // A mask of iotas (query i keeps keys j >= i + shift; a causal one in reverse) lets the
    // online softmax skip the blocks it leaves nothing of: here the first blocks of keys,
    // whose rows must still start from zeros; with shift 0 past the diagonal's blocks.
    for (dt, shape, shift) in [
        ("f32", (2, 50, 3000, 16, 24), 600),
        ("f32", (1, 130, 1500, 8, 70), 0),
        ("f64", (2, 20, 2000, 8, 9), 1100),
    ] {
        let (b, m, keys, _, _) = shape;
        let s = format!("{dt}[{b},{m},{keys}]");
        let i = format!("i64[{b},{m},{keys}]");
        let src = attention_text(dt, shape, false, false)
            .replace(
                &format!("  %6 = multiply %3, %5 : {s}\n"),
                &format!(
                    "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n  %23 = constant {{value = {shift}}} : i64[]\n  %24 = broadcast_in_dim %23 {{broadcast_dimensions = []}} : {i}\n  %25 = add %22, %24 : {i}\n  %26 = compare %21, %25 {{comparison_direction = GE}} : pred[{b},{m},{keys}]\n  %27 = constant {{value = -inf}} : {dt}[]\n  %28 = broadcast_in_dim %27 {{broadcast_dimensions = []}} : {s}\n  %6 = select %26, %20, %28 : {s}\n"
                ),
            );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(
            fusion.contains("// 1 kernels")
                && fusion.contains(&format!(
                    "masked: blocks where column * -1 + row * 1 + {shift} > 0"
                )),
            "{fusion}"
        );
        agrees_cached_and_jit(&src, (b * m + keys + shift) as u64);
    }
    // A row epilogue that is not a softmax (a logistic where the exponential was) chains over
    // whole rows, up to 16384 columns.
    for (dt, shape, v_trans, kernels) in [
        ("f32", (2, 130, 3000, 16, 24), false, 1),
        ("f32", (1, 50, 512, 64, 64), true, 1),
        // V read in place (see above), over several contraction blocks, in each batch.
        ("f32", (2, 30, 3000, 16, 64), false, 1),
        ("f64", (1, 7, 2500, 16, 9), false, 1),
        ("f32", (1, 3, 16385, 8, 8), false, 3),
    ] {
        let src = attention_text(dt, shape, v_trans, false).replace("exponential", "logistic");
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(
            fusion.contains(&format!("// {kernels} kernels")) && !fusion.contains("online:"),
            "{fusion}"
        );
        let (b, m, keys, k, n2) = shape;
        agrees_cached_and_jit(&src, (b * m + keys + k * n2 + 1) as u64);
    }
    for (shape, probs, kernels) in [
        ((2, 20, 20, 257, 8), false, 2),
        ((2, 40, 40, 16, 8), true, 2),
        ((1, 3, 16385, 8, 8), true, 3),
    ] {
        let src = attention_text("f32", shape, false, probs);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(
            fusion.contains(&format!("// {kernels} kernels")),
            "{fusion}"
        );
        agrees_on_random_inputs(&src, 9);
    }
    // The product with V taking an epilogue of its own (a residual added to it) is not chained:
    // the softmax over 3000 keys, taken as a row epilogue in view of the chain, then runs
    // unchained over whole rows.
    let src = attention_text("f32", (1, 9, 3000, 16, 16), false, false).replace(
        "  return %16\n",
        "  %17 = add %16, %0 : f32[1,9,16]\n  return %17\n",
    );
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
    assert!(fusion.contains("// 2 kernels"), "{fusion}");
    agrees_cached_and_jit(&src, 11);
    // Without a chained product, a softmax over more than 2048 columns stays a kernel of its
    // own.
    let src = softmax_of_product(1, 5, 8, 3000, true);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
    assert!(fusion.contains("// 2 kernels"), "{fusion}");
}

/// A softmax over the last axis of `shape`, in `dt`, written in the IR.
pub fn softmax_text(dt: &str, shape: &[usize]) -> String {
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

/// Row caches: a softmax's sum keeps each exp(x - max) in a stack buffer and its outputs read
/// it back, for rows up to 16 KiB of computed values (4096 f32 or f16 values, 2048 f64), in
/// plain kernels, with streaming stores and as a GEMM's epilogue; longer rows compute the exp
/// twice. Against the reference, and with the IR checked for the buffer's reads.
pub fn row_caches() {
    let cases: [(&str, &[usize], bool); 11] = [
        ("f32", &[3, 2], true),
        ("f32", &[5, 17], true),
        ("f32", &[2, 3, 33], true),
        ("f64", &[4, 1000], true),
        ("f32", &[2, 4096], true),
        ("f32", &[2, 4097], false),
        ("f64", &[2, 2048], true),
        ("f64", &[2, 2049], false),
        ("f16", &[3, 40], true),
        ("bf16", &[2, 4096], true),
        // 32 MiB of output: streaming stores.
        ("f32", &[2049, 4096], true),
    ];
    for (dt, shape, cached) in cases {
        let src = softmax_text(dt, shape);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &env_options()).unwrap();
        assert_eq!(ir.contains("%cached"), cached, "{dt} {shape:?}");
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert_eq!(
            fusion.contains("row cache: the add reduction"),
            cached,
            "{fusion}"
        );
        agrees_on_random_inputs(&src, shape.iter().product::<usize>() as u64);
    }
    // A softmax of a product, as the GEMM's row epilogue.
    let src = softmax_of_product(2, 9, 16, 33, true);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &env_options()).unwrap();
    assert!(ir.contains("%cached"), "{src}");
    agrees_on_random_inputs(&src, 3);
    // The outputs read the exps at the mirrored position: no cache matches, and the kernel
    // still agrees.
    let src = "func @main(%0: f32[3,50]) -> f32[3,50] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[3]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[3,50]\n  %4 = subtract %0, %3 : f32[3,50]\n  %5 = exponential %4 : f32[3,50]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[3]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[3,50]\n  %9 = reverse %5 {dimensions = [1]} : f32[3,50]\n  %10 = divide %9, %8 : f32[3,50]\n  return %10\n}\n";
    agrees_on_random_inputs(src, 4);
}

/// Guards decided by the loops: pads (low, high, negative and interior padding, on inner and
/// outer dimensions, transposing ones in tiles, long rows with streaming stores) and
/// concatenations run their loops in segments where every guard holds or fails throughout.
/// Against the reference; the pads whose segments decide every guard have none left in the IR.
pub fn guard_splits() {
    let pad = |dt: &str, shape: &[usize], lo: &[i64], hi: &[i64], int: &[i64]| {
        let out: Vec<i64> = shape
            .iter()
            .zip(lo.iter().zip(hi.iter().zip(int)))
            .map(|(&n, (&l, (&h, &i)))| n as i64 + l + h + (n as i64 - 1).max(0) * i)
            .collect();
        let join = |v: &[i64], sep: &str| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(sep)
        };
        let list = |v: &[i64]| join(v, ", ");
        let dims = |v: &[i64]| join(v, ",");
        let ins: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
        format!(
            "func @main(%0: {dt}[{}]) -> {dt}[{}] {{\n  %1 = constant {{value = 0.5}} : {dt}[]\n  %2 = pad %0, %1 {{edge_padding_low = [{}], edge_padding_high = [{}], interior_padding = [{}]}} : {dt}[{}]\n  return %2\n}}\n",
            dims(&ins),
            dims(&out),
            list(lo),
            list(hi),
            list(int),
            dims(&out)
        )
    };
    let cases: Vec<(String, bool)> = vec![
        // NHWC padding of H and W: every guard decided.
        (
            pad(
                "f32",
                &[2, 9, 11, 16],
                &[0, 1, 2, 0],
                &[0, 1, 3, 0],
                &[0, 0, 0, 0],
            ),
            true,
        ),
        // NCHW padding of the innermost dimension, f64.
        (
            pad(
                "f64",
                &[2, 3, 7, 13],
                &[0, 0, 1, 2],
                &[0, 0, 2, 1],
                &[0, 0, 0, 0],
            ),
            true,
        ),
        // Cropping (negative padding) and padding.
        (
            pad("f32", &[3, 20, 17], &[0, -2, 3], &[0, 1, -4], &[0, 0, 0]),
            true,
        ),
        // Interior padding: divisibility stays checked.
        (
            pad("f32", &[2, 5, 6], &[0, 1, 0], &[0, 0, 1], &[0, 1, 2]),
            false,
        ),
        // Long rows: streaming stores, padded on the innermost dimension.
        (pad("f32", &[8200, 1030], &[1, 1], &[0, 3], &[0, 0]), true),
        // One dimension, split between threads, with streaming stores.
        (pad("f32", &[8388600], &[5], &[11], &[0]), true),
    ];
    for (src, decided) in &cases {
        let f = kiln_ir::parse_func_text(src).unwrap();
        let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &env_options()).unwrap();
        if *decided {
            assert!(!ir.contains("\nthen"), "a guard left in:\n{src}");
        }
        agrees_on_random_inputs(src, 12);
    }
    // A transposing pad in tiles (a convolution's input to NHWC, padded).
    let src = "func @main(%0: f32[2,24,18,18]) -> f32[2,20,20,24] {\n  %1 = transpose %0 {permutation = [0, 2, 3, 1]} : f32[2,18,18,24]\n  %2 = constant {value = 0.0} : f32[]\n  %3 = pad %1, %2 {edge_padding_low = [0, 1, 1, 0], edge_padding_high = [0, 1, 1, 0], interior_padding = [0, 0, 0, 0]} : f32[2,20,20,24]\n  return %3\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    assert!(
        !kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &env_options())
            .unwrap()
            .contains("\nthen")
    );
    agrees_on_random_inputs(src, 13);
    // Concatenations along an outer and the innermost dimension.
    for (d, out) in [(1, "f32[3,12,5]"), (2, "f32[3,7,10]")] {
        let (a, b) = if d == 1 {
            ("f32[3,7,5]", "f32[3,5,5]")
        } else {
            ("f32[3,7,5]", "f32[3,7,5]")
        };
        let src = format!(
            "func @main(%0: {a}, %1: {b}) -> {out} {{\n  %2 = concatenate %0, %1 {{dimension = {d}}} : {out}\n  return %2\n}}\n"
        );
        agrees_on_random_inputs(&src, 14);
    }
    // A concatenation of nine computed pieces along the rows (split between threads): each
    // piece runs on its own rows, inlined, with no guard left (cut at every seam).
    let rows = [1usize, 3, 7, 2, 40, 5, 1, 9, 64];
    let total: usize = rows.iter().sum();
    let params: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| format!("%{i}: f32[{r},300]"))
        .collect();
    let mut body = String::new();
    for (i, r) in rows.iter().enumerate() {
        let op = ["exponential", "tanh", "negate"][i % 3];
        body.push_str(&format!(
            "  %{} = {op} %{i} : f32[{r},300]\n",
            rows.len() + i
        ));
    }
    let pieces: Vec<String> = (0..rows.len())
        .map(|i| format!("%{}", rows.len() + i))
        .collect();
    let src = format!(
        "func @main({}) -> f32[{total},300] {{\n{body}  %{} = concatenate {} {{dimension = 0}} : f32[{total},300]\n  return %{}\n}}\n",
        params.join(", "),
        2 * rows.len(),
        pieces.join(", "),
        2 * rows.len()
    );
    let f = kiln_ir::parse_func_text(&src).unwrap();
    assert!(
        kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options())
            .unwrap()
            .contains("// 1 kernels"),
        "{src}"
    );
    assert!(
        !kiln_codegen_llvm::cpu::function_llvm_ir(&f, false, &env_options())
            .unwrap()
            .contains("\nthen"),
        "a guard left in:\n{src}"
    );
    agrees_on_random_inputs(&src, 15);
}

/// Transposes that run in tiles (the innermost output dimension strided in the input, another
/// contiguous), with partial tiles and thread splits on either dimension, a transposing pad
/// and a transpose feeding an elementwise op, against the reference.
pub fn tiled_transposes() {
    let cases = [
        "func @main(%0: f32[37,50]) -> f32[50,37] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[50,37]\n  return %1\n}\n",
        "func @main(%0: f32[2,19,23,35]) -> f32[2,35,19,23] {\n  %1 = transpose %0 {permutation = [0, 3, 1, 2]} : f32[2,35,19,23]\n  return %1\n}\n",
        "func @main(%0: f32[3,40,17,33]) -> f32[3,17,33,40] {\n  %1 = transpose %0 {permutation = [0, 2, 3, 1]} : f32[3,17,33,40]\n  return %1\n}\n",
        "func @main(%0: f64[33,16,20]) -> f64[16,20,33] {\n  %1 = transpose %0 {permutation = [1, 2, 0]} : f64[16,20,33]\n  %2 = exponential %1 : f64[16,20,33]\n  return %2\n}\n",
        "func @main(%0: f32[2,24,18,18]) -> f32[2,20,20,24] {\n  %1 = transpose %0 {permutation = [0, 2, 3, 1]} : f32[2,18,18,24]\n  %2 = constant {value = 0.0} : f32[]\n  %3 = pad %1, %2 {edge_padding_low = [0, 1, 1, 0], edge_padding_high = [0, 1, 1, 0], interior_padding = [0, 0, 0, 0]} : f32[2,20,20,24]\n  return %3\n}\n",
        "func @main(%0: i32[17,64]) -> i32[64,17] {\n  %1 = transpose %0 {permutation = [1, 0]} : i32[64,17]\n  return %1\n}\n",
    ];
    for src in cases {
        let f = kiln_ir::parse_func_text(src).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &env_options()).unwrap();
        assert!(fusion.contains("tiles of dimensions"), "{fusion}");
        agrees_on_random_inputs(src, 7);
    }
}

/// Elements of `bytes` bytes in an output just past the size from which this host's kernels
/// write with streaming stores (`LoopLimits::stream_bytes`: 32 MiB, more on a host with a
/// larger last-level cache), `past` of them: not a multiple of a cache line.
pub fn past_streaming(bytes: usize, past: usize) -> usize {
    kiln_codegen_llvm::cpu::host_target_info()
        .loops
        .stream_bytes
        / bytes
        + past
}

/// Kernels whose outputs are large enough for streaming stores on this host
/// ([`past_streaming`]): element counts and row lengths that are not multiples of a cache
/// line, so every row starts at another offset from a line boundary (the scalar head and
/// tail), with 8-, 4- and 2-byte elements, split between threads.
pub fn streaming_stores() {
    let (n32, n64, n16) = (
        past_streaming(4, 17),
        past_streaming(8, 7),
        past_streaming(2, 43),
    );
    let rows = past_streaming(4 * 4103, 1);
    let cases = [
        format!(
            "func @main(%0: f32[{n32}]) -> f32[{n32}] {{\n  %1 = constant {{value = 1.5}} : f32[]\n  %2 = broadcast_in_dim %1 {{broadcast_dimensions = []}} : f32[{n32}]\n  %3 = multiply %0, %2 : f32[{n32}]\n  %4 = tanh %3 : f32[{n32}]\n  return %4\n}}\n"
        ),
        format!(
            "func @main(%0: f32[{rows},4103]) -> f32[{rows},4103] {{\n  %1 = constant {{value = -inf}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = max}} : f32[{rows}]\n  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [0]}} : f32[{rows},4103]\n  %4 = subtract %0, %3 : f32[{rows},4103]\n  %5 = exponential %4 : f32[{rows},4103]\n  %6 = constant {{value = 0.0}} : f32[]\n  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : f32[{rows}]\n  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : f32[{rows},4103]\n  %9 = divide %5, %8 : f32[{rows},4103]\n  return %9\n}}\n"
        ),
        format!(
            "func @main(%0: f64[{n64}]) -> f64[{n64}] {{\n  %1 = exponential %0 : f64[{n64}]\n  return %1\n}}\n"
        ),
        format!(
            "func @main(%0: f16[{n16}], %1: f16[{n16}]) -> f16[{n16}] {{\n  %2 = add %0, %1 : f16[{n16}]\n  return %2\n}}\n"
        ),
    ];
    for src in &cases {
        let f = kiln_ir::parse_func_text(src).unwrap();
        let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, true, &env_options()).unwrap();
        assert!(ir.contains("!nontemporal"), "{src}");
        agrees_on_random_inputs(src, 11);
    }
}

/// Distance in units in the last place between two floats of one format, given as their
/// bits mapped to a monotonic integer line (NaN equals NaN).
fn ulps_of(a: i64, b: i64, a_nan: bool, b_nan: bool) -> u64 {
    match (a_nan, b_nan) {
        (true, true) => 0,
        (false, false) => a.abs_diff(b),
        _ => u64::MAX,
    }
}

/// f32 bits on a monotonic integer line.
fn line32(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN - b } else { b })
}

/// f64 bits on a monotonic integer line.
fn line64(x: f64) -> i64 {
    let b = x.to_bits() as i64;
    if b < 0 { i64::MIN - b } else { b }
}

/// The largest error of `op` over `xs` in `dtype` (f32 or f64) against the reference, in ulps,
/// with the input where it occurs.
fn worst_ulps(op: &str, dtype: DType, xs: &[f64]) -> (u64, f64) {
    let n = xs.len();
    let src = format!(
        "func @main(%0: {dtype}[{n}]) -> {dtype}[{n}] {{\n  %1 = {op} %0 : {dtype}[{n}]\n  return %1\n}}\n"
    );
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let x = Literal::from_f64s(kiln_ir::TensorType::new(dtype, [n]), xs).unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &env_options()).unwrap();
    assert!(!exe.plan().contains(&Step::Reference));
    let got = exe.run(std::slice::from_ref(&x)).unwrap();
    let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).unwrap();
    let (g, w, x) = (got[0].to_f64s(), want[0].to_f64s(), x.to_f64s());
    (0..n)
        .map(|i| {
            let u = if dtype == DType::F32 {
                let (a, b) = (g[i] as f32, w[i] as f32);
                ulps_of(line32(a), line32(b), a.is_nan(), b.is_nan())
            } else {
                ulps_of(line64(g[i]), line64(w[i]), g[i].is_nan(), w[i].is_nan())
            };
            (u, x[i])
        })
        .fold((0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Softmax rows with infinities, NaN and differences from the maximum reaching the subnormal
/// range and beyond, f32 and f64, with the exponentials as a second output: the kernel's
/// exponentials take the nonpositive form (their argument is `x - max(x)`, see
/// `cpu::nonpositive_exps`), and every element agrees with the reference within 4 ulps, NaN
/// where it has NaN.
pub fn softmax_special_values() {
    let cols = 37;
    let rows: Vec<Vec<f64>> = vec![
        vec![f64::NEG_INFINITY; cols],
        (0..cols)
            .map(|j| {
                if j % 3 == 0 {
                    f64::NEG_INFINITY
                } else {
                    j as f64 * 0.5
                }
            })
            .collect(),
        (0..cols)
            .map(|j| if j == 5 { f64::INFINITY } else { j as f64 })
            .collect(),
        (0..cols)
            .map(|j| if j == 7 { f64::NAN } else { -(j as f64) })
            .collect(),
        // x - max from 0 down to -810: exp's normal, subnormal and zero ranges in both types.
        (0..cols).map(|j| -(j as f64) * 22.5).collect(),
        (0..cols)
            .map(|j| ((j * 37 % 11) as f64 - 5.0) * 0.7)
            .collect(),
    ];
    let n = rows.len();
    let xs: Vec<f64> = rows.concat();
    for dtype in ["f32", "f64"] {
        let src = format!(
            "func @main(%0: {dtype}[{n},{cols}]) -> ({dtype}[{n},{cols}], {dtype}[{n},{cols}]) {{\n  %1 = constant {{value = -inf}} : {dtype}[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = max}} : {dtype}[{n}]\n  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [0]}} : {dtype}[{n},{cols}]\n  %4 = subtract %0, %3 : {dtype}[{n},{cols}]\n  %5 = exponential %4 : {dtype}[{n},{cols}]\n  %6 = constant {{value = 0.0}} : {dtype}[]\n  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : {dtype}[{n}]\n  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : {dtype}[{n},{cols}]\n  %9 = divide %5, %8 : {dtype}[{n},{cols}]\n  return %9, %5\n}}\n"
        );
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let x = Literal::from_f64s(f.values[f.params[0].index()].clone(), &xs).unwrap();
        let exe = CpuExecutable::compile_with_options(&f, &[], &env_options()).unwrap();
        assert!(!exe.plan().contains(&Step::Reference));
        // The probabilities, then the exponentials themselves (a softmax hides a common
        // factor in them).
        let got: Vec<f64> = exe
            .run(std::slice::from_ref(&x))
            .unwrap()
            .iter()
            .flat_map(|l| l.to_f64s())
            .collect();
        let want: Vec<f64> = kiln_reference::eval(&f, std::slice::from_ref(&x))
            .unwrap()
            .iter()
            .flat_map(|l| l.to_f64s())
            .collect();
        assert_eq!(got.len(), 2 * n * cols);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let i = i % (n * cols);
            let u = if dtype == "f32" {
                let (a, b) = (*g as f32, *w as f32);
                ulps_of(line32(a), line32(b), a.is_nan(), b.is_nan())
            } else {
                ulps_of(line64(*g), line64(*w), g.is_nan(), w.is_nan())
            };
            assert!(
                u <= 4,
                "{dtype} softmax row {}, column {}: {g} against {w}",
                i / cols,
                i % cols
            );
        }
    }
}

/// exp, log, tanh, logistic and erf within their error bounds over every range (see
/// `common/math.rs`).
pub fn transcendentals() {
    // exp, log, tanh, logistic and erf are computed by polynomials (no library calls) in f32
    // and f64; bound their error against the reference, which rounds a more precise result
    // once.
    for dtype in [DType::F32, DType::F64] {
        let (top, bottom) = if dtype == DType::F32 {
            (88.8, -104.5)
        } else {
            (709.9, -745.5)
        };
        let mut xs: Vec<f64> = (-120_000..=120_000).map(|i| i as f64 * 1e-3).collect();
        xs.extend((-2000..=2000).map(|i| i as f64 * 0.37));
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            1e-300,
            1e-8,
            top - 0.1,
            top,
            bottom + 0.6,
            bottom,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MAX,
            f64::MIN,
        ]);
        // Around the points where e^x overflows and where it falls below half the smallest
        // subnormal (the ends of exp's clamp), at the format's spacing there.
        let (over, under) = if dtype == DType::F32 {
            (88.72283935546875, -103.97208)
        } else {
            (709.782712893384, -745.1332191019412)
        };
        for edge in [over, under, -over, -under] {
            let step = if dtype == DType::F32 { 8e-6 } else { 2e-13 };
            xs.extend((-2000..=2000).map(|i| edge + i as f64 * step));
        }
        for (op, bound) in [("exponential", 2), ("tanh", 4), ("logistic", 4), ("erf", 4)] {
            let (worst, at) = worst_ulps(op, dtype, &xs);
            println!("{op} {dtype}: at most {worst} ulp (at x = {at})");
            assert!(worst <= bound, "{op} {dtype} at {at}: {worst} ulp");
        }
        // log over positive values of every magnitude, subnormals included, and its special
        // cases.
        let mut ps: Vec<f64> = if dtype == DType::F32 {
            (0..200_000)
                .map(|i| f64::from(f32::from_bits(1 + i * (0x7f7f_ffff / 200_000))))
                .collect()
        } else {
            (0..200_000u64)
                .map(|i| f64::from_bits(1 + i * (0x7fef_ffff_ffff_ffff / 200_000)))
                .collect()
        };
        ps.extend([
            0.0,
            -0.0,
            -1.0,
            1.0,
            f64::INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
            std::f64::consts::E,
        ]);
        let (worst, at) = worst_ulps("log", dtype, &ps);
        println!("log {dtype}: at most {worst} ulp (at x = {at:e})");
        assert!(worst <= 2, "log {dtype} at {at:e}: {worst} ulp");
    }
}
