//! kiln's developer commands, run as `cargo xtask <command>`.
//!
//! - `test`: install missing toolchain packages and Graphviz (and, in `~/.cache/kiln`, `ptxas`
//!   and a venv with `jax` for the StableHLO export's XLA check), then fmt, clippy, doc, and
//!   every test.
//! - `demo`: install missing toolchain packages, then train a character-level transformer on
//!   Shakespeare end to end (`--steps N`, `--out DIR` go to the example).
//! - `dump FILE --stage parse|verify|eval|egraph|opt|kernels|gpu|ptx|fused|dot|plan|llvm [--arg VALUE]...
//!   [--fast-math] [--donate 0,1,...]`: print a stage of a `.kir` file (`egraph`: the saturated
//!   e-graph with costs;
//!   `opt`: the optimized program and what the optimizer did; `kernels`: the fused kernels in
//!   the kernel IR's text form, each kernel's schedule, loop nest, index maps, guards and
//!   reductions, checked by the kernel verifier; `gpu`: each kernel mapped to the GPU IR for an
//!   H200 (grid, blocks, warps, shared memory, barriers, shuffles); `ptx`: those kernels as
//!   PTX for sm_90 (`--sm sm_80` for another SM), a module per kernel; `fused`: the CPU backend's kernels,
//!   their member ops and the reason for every fusion decision; `dot`: the fused graph for
//!   Graphviz, drawn with `--render OUT.svg|OUT.png` by Graphviz's `dot` (or the program named
//!   by `--dot-program`), its text kept as `OUT.dot`; `plan`: the memory plan, each intermediate's arena offset, size and live steps,
//!   and with `--donate` the results written in place into donated parameters);
//!   `dump --example NAME --stage trace|grad|egraph|opt|kernels|fused|dot|plan|llvm`: the traced
//!   or differentiated IR of an example; later stages dump its gradient function.
//! - `bench [--json FILE] [--only a,b]`: the benchmark workloads of `shared/bench/README.md`.
//! - `codegen [--check]`: regenerate (or check) generated files such as `ir-specs/status.md`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, String>;

/// The Debian packages LLVM/MLIR 22 needs (see `shared/design/TOOLCHAIN.md`).
const PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libmlir-22-dev",
    "libpolly-22-dev",
    "libclang1-22",
    "libclang-common-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];
/// The PyPI package that brings `ptxas`, for validating PTX without a GPU.
const PTXAS_PACKAGE: &str = "nvidia-cuda-nvcc-cu12==12.9.86";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result {
    eprintln!("[xtask] {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn is_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn apt(args: &[&str]) -> Command {
    let mut c = if is_root() {
        Command::new("apt-get")
    } else {
        let mut s = Command::new("sudo");
        s.arg("apt-get");
        s
    };
    c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    c
}

/// Installs the LLVM/MLIR packages that are missing, saying so.
fn ensure_toolchain() -> Result {
    if Path::new("/usr/bin/dpkg-query").exists() {
        let missing: Vec<&str> = PACKAGES
            .iter()
            .copied()
            .filter(|p| !is_installed(p))
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "[xtask] installing missing toolchain packages: {}",
                missing.join(" ")
            );
            run(&mut apt(&["update"]))?;
            let mut args = vec!["install", "-y", "--no-install-recommends"];
            args.extend(&missing);
            run(&mut apt(&args))?;
        }
    }
    if !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists() {
        return Err(
            "LLVM 22 is not at /usr/lib/llvm-22 (on Debian 12 the packages above provide it)"
                .into(),
        );
    }
    Ok(())
}

fn ptxas_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    Path::new(&home).join(".cache/kiln/ptxas")
}

/// Installs `ptxas` from PyPI into a cache outside the checkout; returns its path if it works.
fn ensure_ptxas() -> Option<PathBuf> {
    let ptxas = ptxas_dir().join("nvidia/cuda_nvcc/bin/ptxas");
    let works = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if works(&ptxas) {
        return Some(ptxas);
    }
    eprintln!(
        "[xtask] installing ptxas ({PTXAS_PACKAGE}) into {}",
        ptxas_dir().display()
    );
    let pip = |c: &mut Command| {
        c.args(["-m", "pip", "install", "-q", "--target"])
            .arg(ptxas_dir())
            .arg(PTXAS_PACKAGE)
            .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !pip(&mut Command::new("python3")) {
        eprintln!("[xtask] pip is missing; installing python3-pip");
        let _ = run(&mut apt(&[
            "install",
            "-y",
            "--no-install-recommends",
            "python3-pip",
        ]));
        pip(&mut Command::new("python3"));
    }
    if works(&ptxas) {
        Some(ptxas)
    } else {
        eprintln!("[xtask] ptxas is unavailable");
        None
    }
}

fn jax_venv() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    Path::new(&home).join(".cache/kiln/jax-venv")
}

/// Installs `jax` (CPU) from PyPI into a cache venv outside the checkout, for the StableHLO
/// export's XLA check; returns its Python if `import jax` works there.
fn ensure_jax() -> Option<PathBuf> {
    let python = jax_venv().join("bin/python");
    let works = |p: &Path| {
        Command::new(p)
            .args(["-c", "import jax, ml_dtypes"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if works(&python) {
        return Some(python);
    }
    eprintln!("[xtask] installing jax into {}", jax_venv().display());
    let venv = |c: &mut Command| {
        c.args(["-m", "venv"])
            .arg(jax_venv())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !venv(&mut Command::new("python3")) {
        eprintln!("[xtask] python3-venv is missing; installing it");
        let _ = run(&mut apt(&[
            "install",
            "-y",
            "--no-install-recommends",
            "python3-venv",
        ]));
        venv(&mut Command::new("python3"));
    }
    let _ = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "jax"])
        .status();
    if works(&python) {
        Some(python)
    } else {
        eprintln!("[xtask] jax is unavailable");
        None
    }
}

/// Installs Graphviz (`dot`, which draws `--stage dot`'s graphs) when it is missing and the
/// machine has apt; returns whether `dot` runs.
fn ensure_graphviz() -> bool {
    let works = || {
        Command::new("dot")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works() {
        return true;
    }
    if Path::new("/usr/bin/dpkg-query").exists() {
        eprintln!("[xtask] installing graphviz (dot draws the fused graphs)");
        let install = || {
            run(&mut apt(&[
                "install",
                "-y",
                "--no-install-recommends",
                "graphviz",
            ]))
        };
        // The package lists may be missing on a fresh machine: update them and try again.
        if install().is_err() && run(&mut apt(&["update"])).is_ok() {
            let _ = install();
        }
    }
    works()
}

fn test() -> Result {
    ensure_toolchain()?;
    // The fused graph's test draws with the real `dot`; in CI its absence fails that test.
    if !ensure_graphviz() {
        eprintln!("[xtask] graphviz could not be installed: the fused graphs are not drawn");
    }
    // The PTX tests assemble what kiln emits; without ptxas they could only check text, so the
    // test command refuses to run without it rather than pass on less.
    let ptxas = ensure_ptxas().ok_or(
        "ptxas could not be installed (see above); the PTX tests need it to assemble kiln's PTX",
    )?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo()
        .args(["doc", "--workspace", "--no-deps", "--quiet"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    let mut t = cargo();
    // Tests keep their compiled kernels under target/, not in the user's cache.
    let cache = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join("target")
        .join("kiln-kernel-cache");
    t.args(["test", "--workspace"])
        .env("INSTA_UPDATE", "no")
        .env("KILN_CACHE_DIR", &cache);
    t.env("KILN_PTXAS", ptxas);
    // The StableHLO export's XLA check runs the exported programs through XLA with JAX.
    let jax = ensure_jax().ok_or(
        "jax could not be installed (see above); the StableHLO export's XLA check needs it",
    )?;
    t.env("KILN_JAX_PYTHON", jax);
    run(&mut t)?;
    // StableHLO import through MLIR itself (melior, feature `mlir`, off in the workspace
    // build): the peer suite and the JAX programs, in MLIR's generic form, must import as the
    // hand-written importer imports them. Building melior and linking MLIR into two test
    // binaries takes about 3.5 minutes from an empty target directory at one job (seconds
    // once built); the tests themselves run in under a second.
    run(cargo()
        .args(["test", "-p", "kiln-mlir", "--features", "mlir"])
        .env("INSTA_UPDATE", "no"))?;
    // The workspace's clippy leaves feature `mlir` out; lint that code too.
    run(cargo().args([
        "clippy",
        "-p",
        "kiln-mlir",
        "--features",
        "mlir",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The suites that run programs once more, through the GPU mapping on the GPU emulator:
    // every spec example, 300 random programs and every target filetest's runs (the
    // differential filetests among them), as `KILN_BACKEND=ptx-emulator cargo test -p
    // kiln-tests` runs them. The test is picked out of the whole workspace (kiln-tests alone
    // has it) so that features resolve as for the workspace's run above and its binary is
    // reused: `-p kiln-tests` resolves them otherwise and rebuilds kiln and every crate
    // under it (two minutes of CI).
    let mut e = cargo();
    e.args([
        "test",
        "--workspace",
        "--test",
        "integration",
        "--",
        "on_the_selected_backend",
        "filetests_match_snapshots",
    ])
    .env("KILN_BACKEND", "ptx-emulator")
    .env("INSTA_UPDATE", "no")
    .env("KILN_CACHE_DIR", cache);
    run(&mut e)
}

/// The example `cargo xtask demo` runs: a character-level transformer trained on the shipped
/// Shakespeare, with its loss curve, checkpoint, generated text and step times.
const DEMO_EXAMPLE: &str = "char_transformer";

/// Runs the demo example in release; `args` (`--steps N`, `--out DIR`) go to the example.
fn demo(args: &[String]) -> Result {
    ensure_toolchain()?;
    let mut c = release_run(&["-p", "kiln", "--example", DEMO_EXAMPLE, "--"]);
    c.args(args);
    run(&mut c)
}

fn bench(args: &[String]) -> Result {
    ensure_toolchain()?;
    let mut c = release_run(&["-p", "kiln-bench", "--"]);
    c.args(args);
    run(&mut c)
}

/// `ir-specs/coverage/cpu.txt` (the CPU backend's results on the spec examples) first, then
/// `ir-specs/status.md`, which reads it, `docs/how-kiln-compiles.md` and `docs/ops.md`.
fn codegen(check: bool) -> Result {
    for test in [
        "cpu_coverage_is_fresh",
        "status_md_is_fresh",
        "how_kiln_compiles_is_fresh",
        "ops_md_is_fresh",
    ] {
        let mut c = cargo();
        c.args([
            "test",
            "-p",
            "kiln-tests",
            "--test",
            "integration",
            test,
            "--",
            "--exact",
        ]);
        if !check {
            c.env("KILN_BLESS", "1");
        }
        run(&mut c)?;
    }
    Ok(())
}

/// `cargo run --release --quiet` with `args` (package, target, `--`, the program's arguments).
fn release_run(args: &[&str]) -> Command {
    let mut c = cargo();
    c.args(["run", "--release", "--quiet"]).args(args);
    c
}

fn dump(args: &[String]) -> Result {
    let usage = "usage: cargo xtask dump FILE --stage parse|verify|eval|egraph|opt|kernels|gpu|ptx|fused|dot|plan|llvm [--arg VALUE]... [--target cpu|ptx] [--fast-math] [--donate 0,1,...] [--sm sm_80] [--render OUT.svg|OUT.png] [--dot-program dot] | dump --example NAME --stage trace|grad|egraph|opt|kernels|fused|dot|plan|llvm";
    if let Some(i) = args.iter().position(|a| a == "--example") {
        let name = args.get(i + 1).ok_or(usage)?;
        let stage = args
            .iter()
            .position(|a| a == "--stage")
            .and_then(|j| args.get(j + 1))
            .map(String::as_str)
            .unwrap_or("trace");
        let example =
            |stage: &str| release_run(&["-p", "kiln", "--example", name, "--", "--dump", stage]);
        if matches!(stage, "trace" | "grad") {
            return run(&mut example(stage));
        }
        // Later stages: the example's training-step (gradient) function, written to a file
        // under target/, then dumped like any file.
        eprintln!("[xtask] tracing example `{name}` for --stage {stage}");
        let out = example("grad")
            .output()
            .map_err(|e| format!("running example `{name}`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "example `{name}` failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let dir = std::env::current_dir()
            .map_err(|e| e.to_string())?
            .join("target")
            .join("dumps");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{name}.grad.kir"));
        std::fs::write(&path, &out.stdout).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut rest: Vec<String> = vec![path.to_string_lossy().into_owned()];
        rest.extend(
            args.iter()
                .filter(|a| *a != "--example" && *a != name)
                .cloned(),
        );
        return dump(&rest);
    }
    let mut file = None;
    let mut stage = "parse".to_string();
    let mut values = Vec::new();
    let mut fast_math = false;
    let mut donate: Option<String> = None;
    let mut sm: Option<String> = None;
    let mut target = "cpu".to_string();
    let mut render: Option<String> = None;
    let mut dot_program = kiln_kernel::render::DEFAULT_DOT_PROGRAM.to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--stage" => stage = it.next().ok_or(usage)?.clone(),
            "--arg" => values.push(it.next().ok_or(usage)?.clone()),
            "--fast-math" => fast_math = true,
            "--donate" => donate = Some(it.next().ok_or(usage)?.clone()),
            "--sm" => sm = Some(it.next().ok_or(usage)?.clone()),
            "--target" => target = it.next().ok_or(usage)?.clone(),
            "--render" => render = Some(it.next().ok_or(usage)?.clone()),
            "--dot-program" => dot_program = it.next().ok_or(usage)?.clone(),
            _ if file.is_none() => file = Some(a.clone()),
            _ => return Err(usage.into()),
        }
    }
    let file = file.ok_or(usage)?;
    match target.as_str() {
        "cpu" => {}
        "ptx" => {
            print!("{}", ptx_target_stage(&file, &stage, fast_math)?);
            return Ok(());
        }
        other => return Err(format!("unknown target `{other}` (cpu or ptx); {usage}")),
    }
    if let Some(out) = &render {
        if stage != "dot" {
            return Err(format!(
                "--render draws the `dot` stage, not `{stage}` (use --stage dot)"
            ));
        }
        // Checked before compiling anything.
        kiln_kernel::render::format_of(Path::new(out))?;
    }
    // Stages that need LLVM run in the backend's dump tool.
    let llvm_dump_command = |flag: Option<&str>| {
        let mut c = release_run(&[
            "-p",
            "kiln-codegen-llvm",
            "--bin",
            "kiln-llvm-dump",
            "--",
            &file,
        ]);
        c.args(flag);
        if let Some(d) = &donate {
            c.arg(format!("--donate={d}"));
        }
        c
    };
    let llvm_dump = |flag: Option<&str>| run(&mut llvm_dump_command(flag));
    if let Some(out) = &render {
        ensure_toolchain()?;
        let text = llvm_dump_command(Some("--dot"))
            .output()
            .map_err(|e| format!("running kiln-llvm-dump: {e}"))?;
        if !text.status.success() {
            return Err(format!(
                "kiln-llvm-dump --dot failed:\n{}",
                String::from_utf8_lossy(&text.stderr)
            ));
        }
        let dot = String::from_utf8(text.stdout).map_err(|e| e.to_string())?;
        let r = kiln_kernel::render::render_dot(&dot, Path::new(out), &dot_program)?;
        println!(
            "wrote {} (Graphviz text: {})",
            r.picture.display(),
            r.dot.display()
        );
        return Ok(());
    }
    if stage == "fused" || stage == "dot" || stage == "plan" {
        ensure_toolchain()?;
        return llvm_dump(Some(&format!("--{stage}")));
    }
    if stage == "ptx" {
        ensure_toolchain()?;
        return llvm_dump(Some(&format!("--ptx={}", sm.as_deref().unwrap_or("sm_90"))));
    }
    if stage == "llvm" {
        ensure_toolchain()?;
        println!("; LLVM IR before optimization");
        llvm_dump(None)?;
        println!("; LLVM IR after O2 for this CPU");
        return llvm_dump(Some("--optimized"));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
    let m = kiln_ir::parse_module(&text).map_err(|e| format!("{file}:{e}"))?;
    match stage.as_str() {
        "parse" => print!("{}", kiln_ir::print_module(&m)),
        "verify" => {
            kiln_ir::verify_module(&m).map_err(|e| format!("{file}: {e}"))?;
            print!("{}", kiln_ir::print_module(&m));
            println!("// verified: {} function(s)", m.funcs.len());
        }
        "egraph" | "opt" => {
            let f = m.entry().ok_or("no function")?;
            let opts = kiln_opt::Options {
                fast_math,
                ..kiln_opt::Options::default()
            };
            let text = if stage == "opt" {
                kiln_opt::explain(f, &opts)
            } else {
                kiln_opt::dump_egraph(f, &opts)
            };
            println!("{}", text.map_err(|e| format!("{file}: {e}"))?);
        }
        "kernels" => {
            let f = m.entry().ok_or("no function")?;
            // xtask is a program's boundary: the environment's switches, and `--fast-math`.
            let mut opts = kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok());
            opts.fast_math |= fast_math;
            let text = kiln_kernel::print::describe_kernels(f, &opts)
                .map_err(|e| format!("{file}: {e}"))?;
            print!("{text}");
        }
        "gpu" => {
            let f = m.entry().ok_or("no function")?;
            let mut opts = kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok());
            opts.fast_math |= fast_math;
            let text = kiln_kernel::gpu::print::describe_gpu(f, &opts)
                .map_err(|e| format!("{file}: {e}"))?;
            print!("{text}");
        }
        "eval" => {
            let f = m.entry().ok_or("no function")?;
            if values.is_empty() {
                values = text
                    .lines()
                    .filter_map(|l| {
                        l.strip_prefix("// %")
                            .and_then(|r| r.split_once(" = "))
                            .map(|(_, v)| v.to_string())
                    })
                    .collect();
            }
            let tys = f.param_types();
            if values.len() != tys.len() {
                return Err(format!(
                    "@{} takes {} argument(s), {} given (use --arg VALUE or `// %N = VALUE` lines)",
                    f.name,
                    tys.len(),
                    values.len()
                ));
            }
            let args = values
                .iter()
                .zip(&tys)
                .map(|(v, t)| {
                    kiln_ir::parse_literal(v, t).map_err(|e| format!("argument `{v}`: {e}"))
                })
                .collect::<Result<Vec<_>>>()?;
            for r in kiln_reference::eval_module(&m, &args).map_err(|e| e.to_string())? {
                println!("{r}");
            }
        }
        other => return Err(format!("unknown stage `{other}`; {usage}")),
    }
    Ok(())
}

/// The `kernels` or `fused` stage of the `.kir` file `file` as the PTX target sees it: lowered
/// and fused for an H200, and for `fused` each kernel's GPU launches (`cargo xtask dump FILE
/// --stage kernels|fused --target ptx`). The GPU's own stages are `--stage gpu` and `--stage
/// ptx`; the others do not depend on the target.
fn ptx_target_stage(file: &str, stage: &str, fast_math: bool) -> Result<String> {
    let describe = match stage {
        "kernels" => kiln_kernel::gpu::print::describe_kernels_gpu,
        "fused" => kiln_kernel::gpu::print::describe_fusion_gpu,
        other => {
            return Err(format!(
                "--target ptx prints the `kernels` and `fused` stages, not `{other}` \
                 (the GPU's own stages: --stage gpu, --stage ptx)"
            ));
        }
    };
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    let m = kiln_ir::parse_module(&text).map_err(|e| format!("{file}:{e}"))?;
    let f = m.entry().ok_or("no function")?;
    // xtask is a program's boundary: the environment's switches, and `--fast-math`.
    let mut opts = kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok());
    opts.fast_math |= fast_math;
    describe(f, &opts).map_err(|e| format!("{file}: {e}"))
}

/// The libraries a shipped binary may need at run time: glibc's and the GCC unwinder's, which
/// every glibc system has (`kiln-run` opens the CUDA driver itself, with `dlopen`).
const SYSTEM_LIBRARIES: &[&str] = &[
    "linux-vdso.so",
    "libc.so",
    "libm.so",
    "libdl.so",
    "libpthread.so",
    "librt.so",
    "libgcc_s.so",
    "ld-linux-x86-64.so",
];

/// Checks that `bin` needs only [`SYSTEM_LIBRARIES`] (by `ldd`) and prints the newest glibc
/// symbol version it uses (by `objdump -T`), which the machine that runs it must have.
fn check_dynamic_libraries(bin: &Path) -> Result {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map_err(|e| format!("cannot run ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let foreign: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !SYSTEM_LIBRARIES.iter().any(|s| l.contains(s)))
        .collect();
    if !foreign.is_empty() {
        return Err(format!(
            "{} needs libraries beyond glibc's: {}",
            bin.display(),
            foreign.join("; ")
        ));
    }
    if let Ok(o) = Command::new("objdump").arg("-T").arg(bin).output() {
        let symbols = String::from_utf8_lossy(&o.stdout);
        let newest = symbols
            .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
            .filter_map(|w| w.strip_prefix("GLIBC_"))
            .filter_map(|v| {
                let mut it = v.split('.').map(|n| n.parse::<u32>().ok());
                Some((it.next()??, it.next().flatten().unwrap_or(0)))
            })
            .max();
        if let Some((major, minor)) = newest {
            eprintln!(
                "[xtask] {} needs glibc {major}.{minor} or newer and no other library",
                bin.display()
            );
        }
    }
    Ok(())
}

/// `cargo xtask gpu-pack DIR [--quick]`: `kiln-run` built in release mode, its libraries
/// checked, then the pack written by `kiln-pack` (see `tests/pack/mod.rs` and `docs/gpu.md`).
fn gpu_pack(args: &[String]) -> Result {
    let usage = "usage: cargo xtask gpu-pack DIR [--quick]";
    if let Some(bad) = args.iter().find(|a| a.starts_with("--") && *a != "--quick") {
        return Err(format!("unknown option {bad}; {usage}"));
    }
    let dirs: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [dir] = dirs.as_slice() else {
        return Err(usage.into());
    };
    let dir = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(dir);
    // `kiln-pack` renders PTX through LLVM, so a fresh machine needs the packages first.
    ensure_toolchain()?;
    run(cargo().args(["build", "--release", "-p", "kiln-run", "--bin", "kiln-run"]))?;
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
    let mut bin = target.join("release").join("kiln-run");
    check_dynamic_libraries(&bin)?;
    // The pack ships the binary without its debug information (about 4 MiB instead of 37)
    // when `strip` is there.
    let stripped = target.join("release").join("kiln-run.stripped");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&bin)
        .status();
    match status {
        Ok(s) if s.success() => bin = stripped,
        _ => eprintln!(
            "[xtask] `strip` failed or is missing: kiln-run ships with its debug information"
        ),
    }
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "-p",
        "kiln-tests",
        "--bin",
        "kiln-pack",
        "--",
    ])
    .arg(&dir)
    .arg("--kiln-run")
    .arg(&bin);
    if args.iter().any(|a| a == "--quick") {
        c.arg("--quick");
    }
    run(&mut c)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("demo") => demo(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("codegen") => codegen(args.get(1).is_some_and(|a| a == "--check")),
        Some("dump") => dump(&args[1..]),
        Some("gpu-pack") => gpu_pack(&args[1..]),
        _ => Err("usage: cargo xtask test | demo [--steps N] [--out DIR] | bench [--json FILE] [--only a,b] | dump FILE --stage parse|verify|eval|egraph|opt|kernels|gpu|ptx|fused|dot|plan|llvm [--target cpu|ptx] [--render OUT.svg] | dump --example NAME --stage trace|grad|kernels|fused|plan|... | codegen [--check] | gpu-pack DIR [--quick]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// `dump --target ptx` prints the kernels and fused stages as the GPU target lowers them:
    /// the kernels verified, and for `fused` each kernel's launches (which the CPU's `fused`
    /// stage has none of); other stages and other targets are refused with a message.
    #[test]
    fn dump_target_ptx_prints_the_gpu_stages() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let file = root.join("tests/filetests/fused/softmax.kir");
        let file = file.to_str().unwrap();
        let kernels = super::ptx_target_stage(file, "kernels", false).unwrap();
        assert!(kernels.starts_with("// target: ptx"), "{kernels}");
        assert!(
            kernels.contains("kernel") && kernels.ends_with("// verified\n"),
            "{kernels}"
        );
        let fused = super::ptx_target_stage(file, "fused", false).unwrap();
        let kernel_lines = fused.lines().filter(|l| l.starts_with("kernel k")).count();
        let launches = fused
            .lines()
            .filter(|l| l.starts_with("  launch k"))
            .count();
        assert!(kernel_lines >= 1 && launches >= kernel_lines, "{fused}");
        assert!(fused.contains(" x block "), "{fused}");
        assert!(!fused.contains("not mapped"), "{fused}");
        let e = super::ptx_target_stage(file, "llvm", false).unwrap_err();
        assert!(e.contains("--stage gpu"), "{e}");
        let args: Vec<String> = [file, "--stage", "kernels", "--target", "tpu"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let e = super::dump(&args).unwrap_err();
        assert!(e.contains("unknown target `tpu`"), "{e}");
    }

    /// The README's first command runs this example, so it must exist and be a program; the
    /// README shows its output and its loss plot, which must be in the repository.
    #[test]
    fn demo_example_exists() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let file = root
            .join("crates/kiln/examples")
            .join(format!("{}.rs", super::DEMO_EXAMPLE));
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{} is missing: {e}", file.display()));
        assert!(
            source.contains("fn main()"),
            "{} has no main",
            file.display()
        );
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let plot = "docs/images/demo-loss.png";
        assert!(readme.contains(plot), "the README does not show {plot}");
        assert!(root.join(plot).is_file(), "{plot} is missing");
    }
}
