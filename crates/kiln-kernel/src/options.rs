//! Every switch of the compiler and the runtime, in one value.
//!
//! An [`Options`] is built once, at the API boundary, from the process environment (the
//! facade reads it with [`Options::from_vars`] and `std::env::var`), or in code; everything
//! below takes it as an argument and reads no environment variable. [`SWITCHES`] lists the
//! environment variables, the field each sets, and what it does.

use std::path::PathBuf;

/// The switches of one compile (and of the program it makes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Run the e-graph optimizer before lowering (`KILN_NO_OPT=1`: off).
    pub optimize: bool,
    /// Let the optimizer apply rules that change rounding (`KILN_FAST_MATH=1`: on).
    pub fast_math: bool,
    /// Fuse kernels (`KILN_NO_FUSION=1`: one kernel per instruction).
    pub fusion: bool,
    /// Reorder steps to lower the memory plan's peak (`KILN_SCHEDULE=0`: program order).
    pub memory_schedule: bool,
    /// Rewrite eligible 3 x 3 convolutions to Winograd transforms (`KILN_WINOGRAD=0`: off).
    pub winograd: bool,
    /// Chain matrix products through their row blocks (`KILN_CHAIN=0`: off).
    pub chain_products: bool,
    /// Sum the columns of large float arrays in bands of rows, on the CPU
    /// (`KILN_BAND_SUMS=0`: off; see [`crate::band_sums`]).
    pub band_sums: bool,
    /// How f32 matrix products and convolutions may round their operands, as JAX's
    /// `jax_default_matmul_precision` and PyTorch's `torch.backends.cuda.matmul.allow_tf32`
    /// say it (`KILN_MATMUL_PRECISION=tf32`: on the GPU's tensor cores, operands rounded to
    /// TF32). Exact f32 products ([`MatmulPrecision::Highest`]) by default.
    pub matmul_precision: MatmulPrecision,
    /// Let the GPU mapping add float partial results into their result with atomic additions
    /// (`red.global.add`), in whatever order the hardware schedules them
    /// (`KILN_FLOAT_ATOMICS=1`): an f32 sum over whole tensors or columns in one launch instead
    /// of two, and an f32 or f16 scatter-add by atomics instead of sorting its updates. Results
    /// then differ from run to run in their last bits (float addition is not associative); off
    /// by default, so every GPU result is deterministic. The CPU backend is unchanged.
    pub float_atomics: bool,
    /// The CPU emitter's switches.
    pub cpu: CpuOptions,
    /// The on-disk kernel cache's directory (`KILN_CACHE_DIR`; by default
    /// `$XDG_CACHE_HOME/kiln/kernels` or `$HOME/.cache/kiln/kernels`; `KILN_NO_CACHE=1`: none).
    pub kernel_cache: Option<PathBuf>,
    /// The program that links kernel objects into a shared library (`CC`; by default `ld`,
    /// then `cc`).
    pub linker: Option<String>,
    /// Print what fusion and scheduling decided for each compile on stderr (`KILN_EXPLAIN=1`).
    pub explain: bool,
    /// Print how long each phase of a compile took on stderr (`KILN_COMPILE_TIMES=1`).
    pub compile_times: bool,
    /// Time each instruction of a compiled program and report it on stderr (`KILN_PROFILE=1`).
    pub profile: bool,
    /// Ask the C allocator to keep large freed blocks for reuse (`KILN_KEEP_FREED=0`: leave
    /// its settings alone).
    pub keep_freed: bool,
    /// The backend eager ops and compiled functions run on (`KILN_BACKEND`: `cpu`, the
    /// default, `reference`, `ptx-emulator`: the GPU mapping run on the GPU emulator, or
    /// `cuda`/`cuda:N`: NVIDIA GPU N through the CUDA driver).
    pub backend: Option<String>,
}

/// The precision f32 matrix products (`dot_general`) and convolutions are computed in: the
/// user's policy, as JAX's `jax_default_matmul_precision` (`"highest"`, `"tensorfloat32"`) and
/// PyTorch's `torch.backends.cuda.matmul.allow_tf32` set it.
///
/// # Examples
///
/// ```
/// use kiln_kernel::options::{MatmulPrecision, Options};
/// // Exact f32 products unless the user allows TF32.
/// assert_eq!(Options::default().matmul_precision, MatmulPrecision::Highest);
/// let tf32 = Options::from_vars(&|name| (name == "KILN_MATMUL_PRECISION").then(|| "tf32".into()));
/// assert_eq!(tf32.matmul_precision, MatmulPrecision::Tf32);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Every f32 product exact as f32 arithmetic rounds it: the operands as they are, products
    /// and sums in f32 (the default).
    #[default]
    Highest,
    /// On a GPU whose tensor cores take TF32 operands (sm_80 and newer), f32 x f32 -> f32
    /// products and convolutions run there with their operands rounded to TF32 (f32's 8
    /// exponent bits and 10 of its 23 mantissa bits, to nearest, ties away from zero) and f32
    /// accumulation: about 2^-11 relative error per operand instead of 2^-24, for several
    /// times the speed. The CPU backend and the reference are unchanged (exact f32).
    Tf32,
}

impl MatmulPrecision {
    /// Its name in cache keys and reports (`highest`, `tf32`).
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::Highest => "highest",
            MatmulPrecision::Tf32 => "tf32",
        }
    }

    /// The precision a name gives (`highest`; `tf32` or JAX's `tensorfloat32`), if it is one.
    pub fn from_name(name: &str) -> Option<MatmulPrecision> {
        match name {
            "highest" => Some(MatmulPrecision::Highest),
            "tf32" | "tensorfloat32" => Some(MatmulPrecision::Tf32),
            _ => None,
        }
    }
}

/// How the CPU emitter renders the kernels it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuOptions {
    /// Non-temporal stores for large outputs written once (`KILN_STREAM=0`: off).
    pub streaming_stores: bool,
    /// Split loops at the points where guards change (`KILN_GUARD_SPLIT=0`: off).
    pub guard_splits: bool,
    /// Cache a row's costly values in scratch memory (`KILN_ROW_CACHE=0`: off).
    pub row_caches: bool,
    /// Unroll the GEMM micro-kernel's loops explicitly (`KILN_GEMM_UNROLL=1`: on).
    pub gemm_unroll: bool,
    /// Use at most 256-bit vectors even where the CPU has 512-bit ones
    /// (`KILN_VECTOR_BITS=256`): the CPU backend then describes its host with 32-byte vectors
    /// ([`crate::TargetInfo::vector_bytes`]), so the kernel layer decides the AVX2 blocking.
    pub narrow_vectors: bool,
    /// The CPU to compile for, where it is not this machine's: set by ahead-of-time
    /// compilation for another x86-64 CPU (`kiln::aot`), whose code never runs here.
    pub machine: Option<CpuMachine>,
}

/// An x86-64 CPU by LLVM's names: `name` (`x86-64-v3`, `sapphirerapids`) and `features`
/// (`+avx2,+fma,...`). The strings are interned, once per distinct CPU, so options stay `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuMachine {
    /// The CPU's name.
    pub name: &'static str,
    /// Its features.
    pub features: &'static str,
}

impl CpuMachine {
    /// The CPU `name` with `features`.
    pub fn new(name: &str, features: &str) -> CpuMachine {
        static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
        let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
        let mut intern = |s: &str| -> &'static str {
            if let Some(&k) = names.iter().find(|&&k| k == s) {
                return k;
            }
            let k: &'static str = Box::leak(s.to_string().into_boxed_str());
            names.push(k);
            k
        };
        CpuMachine {
            name: intern(name),
            features: intern(features),
        }
    }

    /// Whether its features include `feature` (`avx2`).
    pub fn has(&self, feature: &str) -> bool {
        self.features
            .split(',')
            .any(|f| f.trim().strip_prefix('+') == Some(feature))
    }

    /// Bytes of its widest vectors: 64 with AVX-512, 32 with AVX2, else SSE's 16.
    pub fn vector_bytes(&self) -> usize {
        if self.has("avx512f") {
            64
        } else if self.has("avx2") {
            32
        } else {
            16
        }
    }
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            streaming_stores: true,
            guard_splits: true,
            row_caches: true,
            gemm_unroll: false,
            narrow_vectors: false,
            machine: None,
        }
    }
}

/// The defaults: everything on that is on in a release, no kernel cache, no reports.
impl Default for Options {
    fn default() -> Options {
        Options {
            optimize: true,
            fast_math: false,
            fusion: true,
            memory_schedule: true,
            winograd: true,
            chain_products: true,
            band_sums: true,
            matmul_precision: MatmulPrecision::Highest,
            float_atomics: false,
            cpu: CpuOptions::default(),
            kernel_cache: None,
            linker: None,
            explain: false,
            compile_times: false,
            profile: false,
            keep_freed: true,
            backend: None,
        }
    }
}

/// The environment variables [`Options::from_vars`] reads: name, the value that changes the
/// default, and what it does.
pub const SWITCHES: &[(&str, &str, &str)] = &[
    ("KILN_NO_OPT", "1", "skip the e-graph optimizer"),
    ("KILN_FAST_MATH", "1", "allow rewrites that change rounding"),
    ("KILN_NO_FUSION", "1", "one kernel per instruction"),
    (
        "KILN_SCHEDULE",
        "0",
        "keep program order (no memory-aware schedule)",
    ),
    ("KILN_WINOGRAD", "0", "no Winograd 3 x 3 convolutions"),
    ("KILN_CHAIN", "0", "no chained matrix products"),
    (
        "KILN_BAND_SUMS",
        "0",
        "large column sums down their whole columns (no bands of rows)",
    ),
    (
        "KILN_MATMUL_PRECISION",
        "tf32",
        "f32 products on the GPU's tensor cores with operands rounded to TF32",
    ),
    (
        "KILN_FLOAT_ATOMICS",
        "1",
        "GPU float sums and scatter-adds by atomic additions (not bit-reproducible)",
    ),
    ("KILN_STREAM", "0", "no streaming (non-temporal) stores"),
    ("KILN_GUARD_SPLIT", "0", "no loop splits at guard changes"),
    ("KILN_ROW_CACHE", "0", "no row caches"),
    (
        "KILN_GEMM_UNROLL",
        "1",
        "explicitly unrolled GEMM micro-kernels",
    ),
    ("KILN_VECTOR_BITS", "256", "at most 256-bit vectors"),
    (
        "KILN_CACHE_DIR",
        "a directory",
        "the kernel cache's directory",
    ),
    ("KILN_NO_CACHE", "1", "no kernel cache"),
    (
        "XDG_CACHE_HOME, HOME",
        "directories",
        "where the default kernel cache lives",
    ),
    ("CC", "a program", "the linker of kernel libraries"),
    ("KILN_EXPLAIN", "1", "print fusion and scheduling decisions"),
    ("KILN_COMPILE_TIMES", "1", "print compile phase times"),
    ("KILN_PROFILE", "1", "print per-instruction run times"),
    (
        "KILN_KEEP_FREED",
        "0",
        "leave the C allocator's settings alone",
    ),
    (
        "KILN_BACKEND",
        "reference",
        "run everything on the reference interpreter",
    ),
    (
        "KILN_BACKEND",
        "ptx-emulator",
        "run compiled functions through the GPU mapping (an H200) on the GPU emulator",
    ),
    (
        "KILN_BACKEND",
        "cuda, cuda:N",
        "run compiled functions on NVIDIA GPU N (0 by default) through the CUDA driver",
    ),
];

impl Options {
    /// The options the variables `var` gives (see [`SWITCHES`]): `var(name)` is the value of
    /// the variable `name`, if set. The facade calls it with the process environment.
    pub fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Options {
        let is = |name: &str, value: &str| var(name).is_some_and(|v| v == value);
        let kernel_cache = if is("KILN_NO_CACHE", "1") {
            None
        } else if let Some(d) = var("KILN_CACHE_DIR") {
            Some(PathBuf::from(d))
        } else {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|base| base.join("kiln").join("kernels"))
        };
        Options {
            optimize: !is("KILN_NO_OPT", "1"),
            fast_math: is("KILN_FAST_MATH", "1"),
            fusion: !is("KILN_NO_FUSION", "1"),
            memory_schedule: !is("KILN_SCHEDULE", "0"),
            winograd: !is("KILN_WINOGRAD", "0"),
            chain_products: !is("KILN_CHAIN", "0"),
            band_sums: !is("KILN_BAND_SUMS", "0"),
            matmul_precision: var("KILN_MATMUL_PRECISION")
                .and_then(|v| MatmulPrecision::from_name(&v))
                .unwrap_or_default(),
            float_atomics: is("KILN_FLOAT_ATOMICS", "1"),
            cpu: CpuOptions {
                streaming_stores: !is("KILN_STREAM", "0"),
                guard_splits: !is("KILN_GUARD_SPLIT", "0"),
                row_caches: !is("KILN_ROW_CACHE", "0"),
                gemm_unroll: is("KILN_GEMM_UNROLL", "1"),
                narrow_vectors: is("KILN_VECTOR_BITS", "256"),
                machine: None,
            },
            kernel_cache,
            linker: var("CC"),
            explain: is("KILN_EXPLAIN", "1"),
            compile_times: is("KILN_COMPILE_TIMES", "1"),
            profile: is("KILN_PROFILE", "1"),
            keep_freed: !is("KILN_KEEP_FREED", "0"),
            backend: var("KILN_BACKEND"),
        }
    }

    /// These options without a kernel cache.
    pub fn without_cache(mut self) -> Options {
        self.kernel_cache = None;
        self
    }

    /// The optimizer's options under these switches, with the cost model of `machine`.
    pub fn optimizer(&self, machine: kiln_opt::cost::Machine) -> kiln_opt::Options {
        kiln_opt::Options {
            fast_math: self.fast_math,
            machine,
            ..kiln_opt::Options::default()
        }
    }

    /// The switches that change what the pipeline decides, as text (part of cache keys; the
    /// GPU mapping's float atomics named only when on and the column sums' bands only when
    /// off, so the keys of the default compiles stay as they were).
    pub fn pipeline_key(&self) -> String {
        let mut key = format!(
            "opt={} fast-math={} fusion={} schedule={} winograd={} chain={} matmul={}",
            self.optimize,
            self.fast_math,
            self.fusion,
            self.memory_schedule,
            self.winograd,
            self.chain_products,
            self.matmul_precision.name()
        );
        if self.float_atomics {
            key += " float-atomics";
        }
        if !self.band_sums {
            key += " no-band-sums";
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_variables_give_the_defaults_without_a_cache() {
        assert_eq!(Options::from_vars(&|_| None), Options::default());
    }

    #[test]
    fn every_switch_changes_its_field() {
        // (`KILN_NO_CACHE` is checked below: alone it turns off a cache there is not.)
        for (name, value, _) in SWITCHES.iter().filter(|s| s.0 != "KILN_NO_CACHE") {
            let (name, value) = match *name {
                "XDG_CACHE_HOME, HOME" => ("HOME", "/h"),
                "KILN_CACHE_DIR" | "CC" | "KILN_BACKEND" => (*name, "x"),
                _ => (*name, *value),
            };
            let o = Options::from_vars(&|n| (n == name).then(|| value.to_string()));
            assert_ne!(o, Options::default(), "{name}={value} changed nothing");
        }
        let o = Options::from_vars(&|n| match n {
            "HOME" => Some("/h".into()),
            "KILN_NO_CACHE" => Some("1".into()),
            _ => None,
        });
        assert_eq!(o.kernel_cache, None);
    }

    #[test]
    fn the_matmul_precision_is_part_of_the_pipeline_key() {
        let exact = Options::default();
        let tf32 = Options {
            matmul_precision: MatmulPrecision::Tf32,
            ..Options::default()
        };
        assert_ne!(exact.pipeline_key(), tf32.pipeline_key());
        assert!(
            tf32.pipeline_key().contains("matmul=tf32"),
            "{}",
            tf32.pipeline_key()
        );
        // JAX's name for it too; an unknown value leaves the default.
        for (value, want) in [
            ("tensorfloat32", MatmulPrecision::Tf32),
            ("highest", MatmulPrecision::Highest),
            ("bf16x3", MatmulPrecision::Highest),
        ] {
            let o = Options::from_vars(&|n| (n == "KILN_MATMUL_PRECISION").then(|| value.into()));
            assert_eq!(o.matmul_precision, want, "{value}");
        }
    }

    #[test]
    fn float_atomics_are_off_by_default_and_named_in_the_key_only_when_on() {
        let on = Options::from_vars(&|n| (n == "KILN_FLOAT_ATOMICS").then(|| "1".into()));
        assert!(on.float_atomics && !Options::default().float_atomics);
        assert!(
            on.pipeline_key().ends_with(" float-atomics"),
            "{}",
            on.pipeline_key()
        );
        assert!(!Options::default().pipeline_key().contains("atomics"));
        let zero = Options::from_vars(&|n| (n == "KILN_FLOAT_ATOMICS").then(|| "0".into()));
        assert!(!zero.float_atomics);
    }
}
