//! `docs/how-kiln-compiles.md`: one program followed through every stage of the compiler,
//! with the real output of each, written by this test (`KILN_BLESS=1`, or `cargo xtask
//! codegen`) and checked by it, so the document cannot drift from the compiler.

use kiln::Tensor;
use kiln_ir::Func;

/// The program: a dense layer with a tanh, and the mean of its squared outputs.
fn loss((w, b): &(Tensor, Tensor), x: &Tensor) -> Tensor {
    let h = x.matmul(w).add(b).tanh();
    h.mul(&h).mean_all()
}

/// The example's arguments: w `[32, 16]`, b `[16]`, x `[64, 32]`.
fn inputs() -> (Tensor, Tensor, Tensor) {
    let f32 = kiln::DType::F32;
    (
        Tensor::zeros(f32, [32, 16]),
        Tensor::zeros(f32, [16]),
        Tensor::zeros(f32, [64, 32]),
    )
}

/// The text of the function or kernel entry in `text` whose first line starts with `head`,
/// through its closing brace.
fn function<'a>(text: &'a str, head: &str) -> &'a str {
    let start = text
        .find(head)
        .unwrap_or_else(|| panic!("no `{head}` in the output"));
    let rest = &text[start..];
    let end = rest.find("\n}\n").map_or(rest.len(), |e| e + 2);
    &rest[..end]
}

/// What follows the printed function in a stage's text (its kernels, its plan).
fn after_function(text: &str) -> &str {
    let end = text.find("\n}\n").map_or(0, |e| e + 3);
    text[end..].trim_start()
}

/// A fenced block.
fn block(lang: &str, text: &str) -> String {
    format!("```{lang}\n{}\n```\n", text.trim_end())
}

/// Every stage's text: (name, text).
pub fn stages() -> Vec<(&'static str, String)> {
    let traced: Func = kiln::lower::trace_ir(
        |(w, b, x): &(Tensor, Tensor, Tensor)| loss(&(w.clone(), b.clone()), x),
        &inputs(),
    )
    .expect("traces");
    // The gradient with respect to w and b (parameters 0 and 1), as `grad` inside `jit` makes it.
    let grad: Func =
        kiln_autodiff::value_and_grad(&traced, &[0, 1], false).expect("differentiates");
    let opt = kiln_opt::explain(
        &grad,
        &kiln_opt::Options {
            machine: kiln_opt::cost::Machine::REFERENCE,
            ..kiln_opt::Options::default()
        },
    )
    .expect("optimizes");
    let kopts = kiln_kernel::Options::default();
    let kernels = kiln_kernel::print::describe_kernels(&grad, &kopts).expect("lowers");
    let fused = kiln_codegen_llvm::cpu::describe_fusion(&grad, &kopts).expect("fuses");
    let plan = kiln_codegen_llvm::cpu::describe_memory_donating(&grad, &[], &kopts).expect("plans");
    let llvm = kiln_codegen_llvm::cpu::function_llvm_ir(&grad, false, &kopts).expect("emits");
    let ptx = kiln_codegen_llvm::ptx::function_ptx(
        &grad,
        &kopts,
        &kiln_codegen_llvm::ptx::PtxTarget {
            sm: "sm_80".into(),
            features: "+ptx80".into(),
        },
    )
    .expect("renders PTX");
    vec![
        ("trace", traced.to_string()),
        ("grad", grad.to_string()),
        ("opt", opt),
        ("kernels", kernels),
        ("fused", fused),
        ("plan", plan),
        ("llvm", llvm),
        ("ptx", ptx),
    ]
}

/// The document: each stage's output with what it shows.
pub fn document() -> String {
    let st: std::collections::BTreeMap<&str, String> = stages().into_iter().collect();
    let mut d = String::new();
    d.push_str(
        "# How kiln compiles a program

One program followed through every stage of the compiler, with the real output of each.
This file is written by a test (`how_kiln_compiles_is_fresh` in `tests/`; `cargo xtask
codegen` rewrites it), so every dump below is what the compiler makes of the program today.
The same stages print for any program with `cargo xtask dump FILE --stage STAGE` (a `.kir`
file) or `cargo xtask dump --example NAME --stage STAGE`.

The program is a dense layer with a tanh and the mean of its squared outputs, differentiated
with respect to the layer's weights and bias, as a training step would:

```rust
fn loss((w, b): &(Tensor, Tensor), x: &Tensor) -> Tensor {
    let h = x.matmul(w).add(b).tanh();
    h.mul(&h).mean_all()
}
// w: f32[32, 16], b: f32[16], x: f32[64, 32]
let step = jit(|(w, b, x): &(Tensor, Tensor, Tensor)| {
    value_and_grad(|p: &(Tensor, Tensor)| loss(p, x), &(w.clone(), b.clone()))
});
```

## 1. Tracing: Rust to kiln IR (`--stage trace`)

`jit` calls the closure once with symbolic tensors; each operation appends an instruction to
a typed SSA function. The ops are StableHLO's, with its names and semantics (`ir-specs/ops/`
has one page per op); `matmul` becomes a `dot_general`, NumPy broadcasting an explicit
`broadcast_in_dim`, `mean_all` a `reduce` and a `divide`.

",
    );
    d.push_str(&block("kiln", &st["trace"]));
    d.push_str(
        "
## 2. Differentiation (`--stage grad`)

Reverse mode is a transform of the function: the forward instructions, then for each one in
reverse order the instructions of its VJP rule (`crates/kiln-autodiff/src/rules.rs`, the VJP
section of each op's spec). The result is an ordinary function, which prints, verifies and
runs like any other, and can be differentiated again. It returns the loss and the gradients of
`w` and `b`.

",
    );
    d.push_str(&block("kiln", &st["grad"]));
    d.push_str(
        "
## 3. Optimization (`--stage opt`)

The function goes into an e-graph (egg), the rewrite rules of `crates/kiln-opt/rules/` are
applied until nothing changes (or a budget runs out), constants fold, and the cheapest equal
program under the cost model is extracted. The comments say why it stopped, the estimated
cost before and after, which rules fired, and for each value the alternatives it rejected and
their costs. Here the two copies of `multiply %14, %7` merge into one, as do the two squares
of the tanh, and the division by a power of two becomes a multiplication.

",
    );
    d.push_str(&block("kiln", &st["opt"]));
    d.push_str(
        "
## 4. Kernels (`--stage kernels`)

`kiln-kernel` lowers the optimized function for a target described by data (`TargetInfo`):
it decides which instructions become one kernel (fusion), how each kernel loops (its
schedule, threads and vector width), and prints each kernel as kernel IR: its members, its
inputs, its loop nest or GEMM schedule, and the expression tree its body computes. The
product, its bias and its tanh are one GEMM with an epilogue; the loss's reduction and the
backward elementwise chain are loop nests; the weight gradient is a GEMM that reads A
transposed and writes the transposed product directly (the `transpose` after it folds into
it); the bias gradient is a column sum.

",
    );
    d.push_str(&block("text", after_function(&st["kernels"])));
    d.push_str(
        "
## 5. Fusion, explained (`--stage fused`)

For every instruction, why it was fused into its users or given a kernel of its own: kiln
inlines a value into its users when they read each element at most once, or when recomputing
it costs little (the rule and the numbers are printed), and keeps it when it is an output, a
GEMM, or read by something that is not a loop nest. Under each kernel, its loops (a product's
register tile and cache blocks, a loop nest's strategy) and how the threads share it, on the
machine-independent reference CPU, so the text is the same everywhere; `KILN_EXPLAIN=1`
prints the same for what a compile decided on the machine it runs on.

",
    );
    d.push_str(&block("text", after_function(&st["fused"])));
    d.push_str(
        "
## 6. The memory plan (`--stage plan`)

The schedule picks an order of the kernels (the program's, unless another order lowers the
peak), and the planner gives every intermediate an offset in one arena, reusing memory whose
value is dead: each row says where a value lives and for which steps. Outputs and parameters
live outside the arena.

",
    );
    d.push_str(&block("text", after_function(&st["plan"])));
    let llvm = &st["llvm"];
    let defines = llvm.lines().filter(|l| l.starts_with("define")).count();
    d.push_str(&format!(
        "
## 7. LLVM IR for the CPU (`--stage llvm`)

The CPU emitter (`crates/kiln-codegen-llvm/src/cpu/`) renders each kernel as an LLVM function
with inkwell: {defines} functions here, {} lines, the kernels and the GEMM routines they
call (packing and register tiles, generated for the target's vector width). Below is the
backward elementwise kernel `k15` before LLVM's optimizations, printed for a fixed 256-bit
target so the text is the same on every machine: it receives a table of its buffers and the
range of rows its thread computes, and walks the elements of those rows. `cargo xtask dump
FILE --stage llvm` also prints the code after LLVM's O2 pipeline for the machine it runs on,
which is what runs.

",
        llvm.lines().count()
    ));
    d.push_str(&block("llvm", function(llvm, "define void @k15(")));
    let ptx = &st["ptx"];
    let entries = ptx
        .lines()
        .filter(|l| l.starts_with(".visible .entry"))
        .count();
    d.push_str(&format!(
        "
## 8. PTX for NVIDIA GPUs (`--stage ptx`)

The same kernels, mapped onto a GPU (`kiln_kernel::gpu`: blocks, threads, shared-memory
tiles, the GEMM on tensor cores where the types allow) and rendered through LLVM's NVPTX
backend, give {entries} kernel entries for `sm_80` here. `ptxas` assembles them in the tests,
a GPU-semantics emulator runs the mapping against the reference interpreter, and the GPU pack
has run them on an H200 (`docs/gpu.md`). Below is the same elementwise kernel, a grid-stride
loop over its 1024 elements four at a time (each thread loads and stores 16 bytes at once:
`ld.global.nc.v4`, `st.global.v4`):

"
    ));
    d.push_str(&block(
        "ptx",
        function(ptx, ".visible .entry k15_multiply("),
    ));
    d.push_str(
        "
## 9. Running

At run time the executable takes the arena's memory from its buffer pool and runs the steps
in order, each kernel called with its buffers and split over threads by rows (rayon) where its
schedule says so. The same program runs on the reference interpreter (`KILN_BACKEND=reference`), which every
backend is tested against.
",
    );
    d
}
