//! The CPU backend: a function becomes one LLVM module with a kernel per instruction,
//! optimized at O2 for the host CPU and JIT-compiled, and run by a `kiln_runtime::Program`.
//! Every op has a kernel (constants are held, `optimization_barrier` passes values through);
//! the runtime would run an instruction without one on the reference interpreter, and
//! [`CpuExecutable::plan`] shows which way each instruction runs.

use crate::common::math::Math;
use crate::common::scalar::Scalar;
use crate::common::{Base, ExpArg};
use crate::kernel::{
    Cond, Ew, Expr, Idx, Kernel, Schedule, free_vars, hoistable_reduces, speculatable, value_key,
    var_plus_const, visit,
};
use crate::{Error, Result, storage};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, FunctionValue, InstructionValue, IntValue,
    MetadataValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate, OptimizationLevel};
use kiln_ir::{Combiner, ComparisonDirection as Cmp, DType, Func, Literal, OpKind, strides};

mod aot;
mod compile_times;
mod emitter;
mod executable;
mod fold;
mod gemm;
mod kernels;
mod loops;
mod lowering;
mod module;
mod paths;
mod row_cache;
mod sum_tree;

pub use aot::{AotProgram, aot_programs, cpu_target_info};
use kernels::*;
use loops::*;
use module::*;
pub use module::{
    describe_fusion, describe_host_fusion, describe_host_kernels, describe_lowered,
    describe_memory, describe_memory_donating, function_llvm_ir, planned_peak,
};
pub use paths::{GemmBlocking, KernelPath};
use row_cache::*;

use compile_times::PhaseClock;
use kiln_kernel::pipeline::{
    Lowered, loop_schedules, lowered_for_printing, lowered_for_printing_donating, steps_of,
};
pub use kiln_kernel::pipeline::{fused_kernels, kernels};

use kiln_kernel::gemm_schedule::{GemmSchedule, gemm_schedule};
use kiln_kernel::loop_schedule::{KernelSchedule, Tile};
use kiln_kernel::options::{CpuOptions, Options};
use kiln_kernel::target::{CpuVendor, GemmLimits, HostCpu, SumTree, TargetInfo};
pub use kiln_runtime::Step;
use kiln_runtime::{KernelFn, Launch, Program};

/// A function compiled for this CPU: the runtime program and the JIT engine that owns its
/// kernels' code.
pub struct CpuExecutable {
    program: Program,
    // Declared before the context so it is dropped first (the program only holds pointers
    // into the engine's or the library's code).
    _engine: Option<ExecutionEngine<'static>>,
    _library: Option<crate::cache::Library>,
    from_cache: bool,
    lowered_from_cache: bool,
    /// Kernel functions compiled (kernels equal to an earlier one share its function).
    functions: usize,
    /// The code paths of each kernel (see [`KernelPath`]).
    paths: Vec<KernelPath>,
    _context: Box<Context>,
}

// SAFETY: after construction the engine and context are only kept alive, never touched; the
// kernels are pure functions of their arguments, safe to call from several threads at once.
unsafe impl Send for CpuExecutable {}
unsafe impl Sync for CpuExecutable {}

fn llvm<E: std::fmt::Display>(e: E) -> Error {
    Error::Llvm(e.to_string())
}

struct Emitter<'c> {
    ctx: &'c Context,
    m: &'c Module<'c>,
    b: Builder<'c>,
    f: FunctionValue<'c>,
    inputs: std::cell::Cell<PointerValue<'c>>,
    vars: Vec<PointerValue<'c>>,
    /// Values already computed ahead of the code that uses them, by [`value_key`]: reductions
    /// ahead of their loops, and row caches and their parts (see [`Self::hoist_caching`]);
    /// each entry dominates the code emitted while it is present.
    hoisted: std::cell::RefCell<Vec<(crate::kernel::ValueKey, Hoisted<'c>)>>,
    /// In a multi-output kernel: alias scopes saying that reads of the inputs (and of the
    /// pointer table) never touch the extra outputs, as `(inputs, extra outputs)` scope lists.
    /// Without them LLVM must assume every store to an extra output may change any input, and
    /// neither vectorizes the loops nor hoists the row constants out of them.
    scopes: std::cell::Cell<Option<(MetadataValue<'c>, MetadataValue<'c>)>>,
    /// Whether the target scales by powers of two in one instruction (AVX-512's `vscalef`,
    /// which `llvm.ldexp` lowers to; taken with 512-bit vectors, so `KILN_VECTOR_BITS=256`
    /// tests the other path); elsewhere a vector `ldexp` would become library calls.
    scalef: bool,
    /// Whether `hoisted` may hold values of elementwise expressions (row caches), which
    /// [`Self::expr`] then looks up.
    memo: std::cell::Cell<bool>,
    /// Whether float sums and products combine in order (not reassociable): in the positions
    /// past the last strip of a column sum (see [`strips`]), which then add in the strips'
    /// order, and are not vectorized along their strided columns.
    in_order: std::cell::Cell<bool>,
    /// What the enclosing loops know: variable `v` lies in `lo..hi` for each `(v, lo, hi)`
    /// (see [`KernelSchedule::segments`]); guards whose conditions these decide take one side
    /// unchecked.
    facts: std::cell::RefCell<Vec<(usize, i64, i64)>>,
    /// Whether the code is for this machine (see [`host_attributes`]).
    target: Target,
    /// Where the GEMM routines are compiled.
    routines: Routines,
    /// What is known of the arguments of the kernel's exponentials whose argument is never
    /// positive, by key ([`value_key`]; see [`nonpositive_exps`]).
    nonpositive: std::collections::HashMap<crate::kernel::ValueKey, ExpArg>,
    /// Set just before an exponential of `nonpositive` is emitted, taken by [`Self::op`].
    exp_arg: std::cell::Cell<ExpArg>,
    /// An input whose buffer holds its elements from `offset` on (`(input, offset)`): a
    /// chained GEMM's block of rows, which its epilogue reads as the product.
    shifted: std::cell::Cell<Option<(usize, IntValue<'c>)>>,
    /// The loop schedule of the loop-nest kernel being emitted, as the kernel layer decided it
    /// (see [`kiln_kernel::loop_schedule`]).
    schedule: Option<KernelSchedule>,
    /// The arguments of the fold body being emitted ([`Expr::Arg`]; see `fold.rs`).
    args: std::cell::RefCell<Vec<BasicValueEnum<'c>>>,
}

/// What code is emitted for: this machine (its CPU and features on every function) or any
/// x86-64 machine (machine-independent dumps), and the emitter's switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Whether the code is for this machine (see [`host_attributes`]).
    pub host: bool,
    /// The CPU emitter's switches.
    pub cpu: CpuOptions,
    /// The shape of float sums' trees, from [`Self::info`] (see [`SumTree`]).
    pub sums: SumTree,
    /// Bytes of the widest vector kernels use, from [`Self::info`].
    pub vector_bytes: usize,
    /// Bytes of a cache line, from [`Self::info`]: the width of one streaming store, and the
    /// alignment of the line and tile buffers.
    pub cache_line: usize,
}

impl Target {
    /// Code for this machine under `opts`.
    fn host(opts: &Options) -> Target {
        Target::new(true, opts)
    }

    /// Machine-independent code under `opts`.
    fn any(opts: &Options) -> Target {
        Target::new(false, opts)
    }

    /// Code for this machine (`host`) or any under `opts`, with the properties the emitter
    /// reads from [`Self::info`].
    fn new(host: bool, opts: &Options) -> Target {
        let mut t = Target {
            host,
            cpu: opts.cpu,
            sums: SumTree::default(),
            vector_bytes: 0,
            cache_line: 0,
        };
        let info = t.info();
        t.sums = info.sums;
        t.vector_bytes = info.vector_bytes;
        t.cache_line = info.cache_line;
        t
    }

    /// What the kernel layer decides with for this code: this machine
    /// ([`host_target_info`]), or the reference CPU for machine-independent code.
    ///
    /// Code for another CPU ([`CpuOptions::machine`], ahead of time) has that CPU's vectors.
    /// [`CpuOptions::narrow_vectors`] (`KILN_VECTOR_BITS=256`) gives an AVX-512 host 256-bit
    /// vectors (the blocking of AVX2 machines), so that path can be tested and measured here
    /// too.
    fn info(&self) -> TargetInfo {
        if self.host {
            let mut info = host_target_info();
            if let Some(m) = self.cpu.machine {
                // Another CPU's blocks and cache: the reference ones, as for a CPU of unknown
                // make.
                let reference = TargetInfo::reference();
                info.vector_bytes = m.vector_bytes();
                info.gemm = GemmLimits::default();
                info.llc_bytes = reference.llc_bytes;
                info.loops = reference.loops;
            }
            if self.cpu.narrow_vectors {
                info.vector_bytes = info.vector_bytes.min(32);
            }
            info
        } else {
            TargetInfo {
                nontemporal_stores: cfg!(target_arch = "x86_64"),
                ..TargetInfo::reference()
            }
        }
    }
}

/// This machine, as the kernel layer's target: the widest vectors its CPU has (AVX-512, AVX2,
/// else SSE's), the threads it runs and its last-level cache, with the reference CPU's other
/// properties; streaming stores on x86-64 only. Detected once per process.
pub fn host_target_info() -> TargetInfo {
    static HOST: std::sync::OnceLock<TargetInfo> = std::sync::OnceLock::new();
    HOST.get_or_init(detect_host).clone()
}

/// [`host_target_info`], detected.
fn detect_host() -> TargetInfo {
    #[cfg(target_arch = "x86_64")]
    let vector_bytes = if std::arch::is_x86_feature_detected!("avx512f") {
        64
    } else if std::arch::is_x86_feature_detected!("avx2") {
        32
    } else {
        16
    };
    #[cfg(not(target_arch = "x86_64"))]
    let vector_bytes = 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let vendor = host_vendor();
    TargetInfo {
        nontemporal_stores: cfg!(target_arch = "x86_64"),
        ..TargetInfo::cpu_host(HostCpu {
            vector_bytes,
            threads,
            vendor,
            llc_bytes: host_llc_bytes(vendor),
        })
    }
}

/// The largest cache this machine's CPU (made by `vendor`) describes in `cpuid`'s cache leaves
/// (leaf 4 on Intel, `0x8000001d` on AMD: the size of one instance, as a core sees it), or
/// `None` where it describes none.
fn host_llc_bytes(vendor: CpuVendor) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        let leaf = match vendor {
            CpuVendor::Intel if __cpuid(0).eax >= 4 => 4,
            CpuVendor::Amd if __cpuid(0x8000_0000).eax >= 0x8000_001d => 0x8000_001d,
            _ => return None,
        };
        let mut largest = None;
        // A CPU lists a handful of caches; 16 bounds the walk whatever a hypervisor reports.
        for sub in 0..16 {
            let r = __cpuid_count(leaf, sub);
            if r.eax & 0x1f == 0 {
                break;
            }
            largest = largest.max(Some(cache_bytes(r.ebx, r.ecx)));
        }
        largest.filter(|&b| b > 0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = vendor;
        None
    }
}

/// Bytes of a cache a `cpuid` cache leaf describes (`ebx`: ways, partitions and line size,
/// `ecx`: sets, each stored less one).
fn cache_bytes(ebx: u32, ecx: u32) -> usize {
    let ways = (ebx >> 22) as usize + 1;
    let partitions = ((ebx >> 12) & 0x3ff) as usize + 1;
    let line = (ebx & 0xfff) as usize + 1;
    let sets = ecx as usize + 1;
    ways * partitions * line * sets
}

/// The maker of this machine's CPU, from the vendor string of `cpuid` leaf 0.
fn host_vendor() -> CpuVendor {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let mut id = [0u8; 12];
        for (i, w) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
            id[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        vendor_of(&id)
    }
    #[cfg(not(target_arch = "x86_64"))]
    CpuVendor::Other
}

/// The maker a `cpuid` vendor string names.
fn vendor_of(id: &[u8]) -> CpuVendor {
    match id {
        b"GenuineIntel" => CpuVendor::Intel,
        b"AuthenticAMD" => CpuVendor::Amd,
        _ => CpuVendor::Other,
    }
}

/// Where the GEMM routines a module's kernels call (`gemm::Routine`) are compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Routines {
    /// In the module itself, once per variant (the JIT and the `--stage llvm` dump).
    Here,
    /// Elsewhere: the module only declares them. The kernel cache compiles each variant once,
    /// in a module of its own, and keeps its object for every function that needs it.
    Apart,
}

/// A value the emitter computed ahead of the code that uses it (see `Emitter::hoisted`).
#[derive(Clone, Copy)]
enum Hoisted<'c> {
    /// The value itself.
    Value(BasicValueEnum<'c>),
    /// A row cache: the value at each position of loop variable `var`, in `buf`.
    Row { buf: PointerValue<'c>, var: usize },
}

/// The vector of `lanes` elements of the storage type `st` (a float or an integer).
fn vector_of(st: BasicTypeEnum<'_>, lanes: usize) -> Result<BasicTypeEnum<'_>> {
    Ok(match st {
        BasicTypeEnum::FloatType(f) => f.vec_type(lanes as u32).into(),
        BasicTypeEnum::IntType(i) => i.vec_type(lanes as u32).into(),
        _ => return Err(Error::Llvm(format!("no vector of {st}"))),
    })
}

/// The attributes every emitted function needs to run on this machine: the JIT generates code
/// per function attributes, so name this machine's CPU and features, or it falls back to
/// baseline x86-64 (no AVX, no FMA).
fn host_attributes<'c>(ctx: &'c Context, f: FunctionValue<'c>, target: Target) {
    if target.host {
        crate::name_cpu(ctx, f, target.cpu.machine);
        if wide_vectors(target) {
            // Use the 512-bit registers: the GEMM tile was sized for them, and loop nests run
            // twice the lanes per instruction (gelu 17 -> 9.5 ms, softmax 18 -> 14 ms). The
            // host's tuning may prefer 256-bit vectors and would split them.
            for (key, value) in [
                ("prefer-vector-width", "512"),
                ("min-legal-vector-width", "512"),
            ] {
                f.add_attribute(
                    AttributeLoc::Function,
                    ctx.create_string_attribute(key, value),
                );
            }
        }
    }
}

/// The GEMM schedule of kernel `k` as the kernel layer decided it for `target`
/// ([`kiln_kernel::gemm_schedule`]): `schedule`'s where the caller has the kernel's schedule,
/// else decided now from [`Target::info`] (`None` if `k` is not a GEMM).
fn gemm_of(k: &Kernel, schedule: Option<&KernelSchedule>, target: Target) -> Option<GemmSchedule> {
    match schedule {
        Some(s) => s.gemm,
        None => gemm_schedule(k, &target.info()),
    }
}

/// How the runtime calls `k` ([`kiln_kernel::threads::launch`]): `schedule`'s where the caller
/// has the kernel's schedule, else decided now from [`Target::info`].
fn launch_of(k: &Kernel, schedule: Option<&KernelSchedule>, target: Target) -> Launch {
    match schedule {
        Some(s) => s.launch,
        None => kiln_kernel::threads::launch(k, None, &target.info()),
    }
}

/// Whether kernels use 512-bit vectors: when the target's vectors are ([`Target::info`]: a
/// host with AVX-512 not switched to [`CpuOptions::narrow_vectors`]; machine-independent dumps
/// assume 256-bit ones).
fn wide_vectors(target: Target) -> bool {
    target.vector_bytes >= 64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `narrow_vectors` acts where the target is described: the host's `TargetInfo` has at most
    /// 32-byte vectors, so the kernel layer decides the AVX2 blocking; machine-independent
    /// code is always for 32-byte vectors.
    #[test]
    fn narrow_vectors_describe_the_host_with_256_bit_vectors() {
        let mut opts = Options::default();
        opts.cpu.narrow_vectors = true;
        let narrow = Target::host(&opts);
        assert!(narrow.info().vector_bytes <= 32 && !wide_vectors(narrow));
        assert_eq!(narrow.vector_bytes, narrow.info().vector_bytes);
        let host = Target::host(&Options::default());
        assert_eq!(host.vector_bytes, host_target_info().vector_bytes);
        assert_eq!(Target::any(&Options::default()).vector_bytes, 32);
    }

    /// `cpuid`'s vendor strings name the makers whose GEMM blocks differ; code for a named CPU
    /// takes the reference blocks whatever the host's make.
    #[test]
    fn vendors_are_read_from_cpuid_strings() {
        assert_eq!(vendor_of(b"GenuineIntel"), CpuVendor::Intel);
        assert_eq!(vendor_of(b"AuthenticAMD"), CpuVendor::Amd);
        assert_eq!(vendor_of(b"HygonGenuine"), CpuVendor::Other);
        let mut opts = Options::default();
        opts.cpu.machine = Some(kiln_kernel::options::CpuMachine::new(
            "znver4",
            "+avx512f,+avx2",
        ));
        let info = Target::host(&opts).info();
        assert_eq!((info.vector_bytes, info.gemm), (64, GemmLimits::default()));
        let reference = TargetInfo::reference();
        assert_eq!(
            (info.llc_bytes, info.loops),
            (reference.llc_bytes, reference.loops)
        );
    }

    /// A `cpuid` cache leaf's fields are each stored less one: 16 ways of one partition of
    /// 64-byte lines in 2048 sets are 2 MiB, 16 ways of 491,520 sets 480 MiB; the host's
    /// largest cache, where `cpuid` lists one, is at least its level 2 one.
    #[test]
    fn caches_are_sized_from_cpuid_leaves() {
        let ebx = |ways: u32, line: u32| ((ways - 1) << 22) | (line - 1);
        assert_eq!(cache_bytes(ebx(16, 64), 2047), 2 << 20);
        assert_eq!(cache_bytes(ebx(16, 64), 491_519), 480 << 20);
        assert_eq!(cache_bytes(ebx(12, 64) | (1 << 12), 31), 12 * 2 * 64 * 32);
        if let Some(llc) = host_llc_bytes(host_vendor()) {
            assert!(llc >= 256 << 10, "{llc}");
            assert_eq!(host_target_info().llc_bytes, llc);
        }
    }

    /// The exponentials of `src`'s kernels proven to take no positive argument, and all of
    /// them.
    fn nonpositive_count(src: &str) -> (usize, usize) {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let fused = fused_kernels(&f, &Options::default(), &TargetInfo::reference());
        let (mut proven, mut all) = (0, 0);
        for k in fused.kernels.iter().flatten() {
            let mut keys = std::collections::HashMap::new();
            let mut extents: Vec<Option<usize>> = k.out.shape.iter().map(|&e| Some(e)).collect();
            nonpositive_exps(&k.body, &mut extents, &mut keys);
            proven += keys.len();
            crate::kernel::visit(&k.body, &mut |e| {
                if let Expr::Op {
                    op: Ew::Kind(OpKind::Exponential),
                    ..
                } = e
                {
                    all += 1;
                }
            });
        }
        (proven, all)
    }

    fn softmax_like(prefix: &str, max_of: &str, arg: &str) -> String {
        format!(
            "func @main(%0: f32[4,16], %1: f32[4,16]) -> f32[4,16] {{\n{prefix}  %m = constant {{value = -inf}} : f32[]\n  %r = reduce {max_of}, %m {{dimensions = [1], kind = max}} : f32[4]\n  %b = broadcast_in_dim %r {{broadcast_dimensions = [0]}} : f32[4,16]\n  %d = subtract {arg} : f32[4,16]\n  %e = exponential %d : f32[4,16]\n  return %e\n}}\n"
        )
    }

    #[test]
    fn exponentials_of_a_difference_from_the_maximum_are_proven_nonpositive() {
        // exp(x - max(x)) over the row holding x: proven.
        assert_eq!(nonpositive_count(&softmax_like("", "%0", "%0, %b")), (1, 1));
        // The softmax of a scaled product, with a stop-gradient's bit-cast round trip around
        // the maximum (attention's form): both exponentials, in the sum and in the outputs.
        let attention = "func @main(%0: f32[2,16,8], %1: f32[2,16,8]) -> f32[2,16,16] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]} : f32[2,16,16]\n  %3 = constant {value = -inf} : f32[]\n  %4 = reduce %2, %3 {dimensions = [2], kind = max} : f32[2,16]\n  %5 = bitcast_convert %4 : u32[2,16]\n  %6 = bitcast_convert %5 : f32[2,16]\n  %7 = broadcast_in_dim %6 {broadcast_dimensions = [0, 1]} : f32[2,16,16]\n  %8 = subtract %2, %7 : f32[2,16,16]\n  %9 = exponential %8 : f32[2,16,16]\n  %10 = constant {value = 0.0} : f32[]\n  %11 = reduce %9, %10 {dimensions = [2], kind = add} : f32[2,16]\n  %12 = broadcast_in_dim %11 {broadcast_dimensions = [0, 1]} : f32[2,16,16]\n  %13 = divide %9, %12 : f32[2,16,16]\n  return %13\n}\n";
        assert_eq!(nonpositive_count(attention), (2, 2));
    }

    #[test]
    fn other_exponentials_are_not_proven_nonpositive() {
        // The maximum of another tensor.
        assert_eq!(nonpositive_count(&softmax_like("", "%1", "%0, %b")).0, 0);
        // The difference the other way round.
        assert_eq!(nonpositive_count(&softmax_like("", "%0", "%b, %0")).0, 0);
        // The maximum over half the row: x's position may lie outside it.
        let half = "  %h = slice %0 {start_indices = [0, 0], limit_indices = [4, 8], strides = [1, 1]} : f32[4,8]\n";
        assert_eq!(nonpositive_count(&softmax_like(half, "%h", "%0, %b")).0, 0);
        // A minimum, not a maximum.
        let min = softmax_like("", "%0", "%0, %b").replace("kind = max", "kind = min");
        assert_eq!(nonpositive_count(&min).0, 0);
    }
}
