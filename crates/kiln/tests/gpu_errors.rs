//! Bad input on the GPU path, each a clear error and never a panic: no driver, a device
//! index past the devices, a backend name that names no GPU, a device too old, a program
//! whose kernels or arena do not fit the device (checked against a made-up
//! [`DeviceInfo`], so no GPU is needed), PTX that does not match its plan or that the driver
//! rejects, a plan whose regions lie outside its arena, and arguments that do not fit.
//! Every case asserts its message. The test has a binary of its own: one case sets the
//! process's backend to `cuda`.

use kiln::backend::Backend;
use kiln::ir::{Literal, parse_func_text};
use kiln_kernel::TargetInfo;
use kiln_kernel::gpu::plan::{DevicePlan, device_plan};
use kiln_runtime::cuda::{DeviceInfo, Gpu, GpuError, device_count, driver_present};
use kiln_runtime::cuda_exec::{check_fits, check_ptx};
use std::panic::{AssertUnwindSafe, catch_unwind};

const ADD: &str = "func @main(%0: f32[1000], %1: f32[1000]) -> f32[1000] {
  %2 = add %0, %1 : f32[1000]
  return %2
}
";

/// A sum of 20000 terms: a block per row, its warps' partial sums through shared memory.
const BLOCK_SUM: &str = "func @main(%0: f32[20000]) -> f32[] {
  %1 = constant {value = 0.0} : f32[]
  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]
  return %2
}
";

/// The plan of `text` for `target`, or the compile error.
fn plan_for(text: &str, target: &TargetInfo) -> Result<DevicePlan, String> {
    let f = parse_func_text(text).map_err(|e| e.to_string())?;
    let l = kiln_kernel::pipeline::lower_program(
        &f,
        &[],
        &kiln::Options::default(),
        target,
        None,
        &mut |_| {},
    )
    .map_err(|e| e.to_string())?;
    device_plan(&l, target)
}

/// An H100-like device, as a driver would describe it.
fn device() -> DeviceInfo {
    DeviceInfo {
        index: 0,
        name: "NVIDIA H100".into(),
        compute_capability: (9, 0),
        multiprocessors: 132,
        warp_size: 32,
        max_threads_per_block: 1024,
        shared_memory_per_block: 48 << 10,
        shared_memory_per_block_optin: 227 << 10,
        l2_cache_bytes: 50 << 20,
        total_memory: 80 << 30,
    }
}

/// Runs `f`, which must return an error, and returns its message; a panic fails the test.
fn error_of<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => panic!("{what}: accepted, but should be rejected"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: panicked instead of returning an error"),
    }
}

fn expect(what: &str, got: String, want: &str) -> usize {
    assert!(
        got.contains(want),
        "{what}: the message does not say `{want}`:\n{got}"
    );
    1
}

/// The driver is looked for first: without it every entry point says so, naming the
/// libraries tried; with it, an index past the devices is named with the count.
#[test]
fn the_driver_and_the_device_index() {
    if driver_present() {
        let count = device_count().unwrap();
        let e = error_of("cuda:count", || Gpu::open(count).map_err(|e| e.to_string()));
        expect("wrong index", e, &format!("no GPU cuda:{count}"));
        return;
    }
    let mut n = 0;
    let none = "no NVIDIA GPU: the CUDA driver library was not found (looked for libcuda.so";
    let e = error_of("device_count", || device_count().map_err(|e| e.to_string()));
    n += expect("device count", e, none);
    for index in [0, 7] {
        let e = error_of("open", || Gpu::open(index).map_err(|e| e.to_string()));
        n += expect("open", e, none);
    }
    let e = error_of("backend", || {
        kiln::backend::Cuda::new(0)
            .compile(&parse_func_text(ADD).unwrap())
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    n += expect("the cuda backend", e, &format!("compile: {none}"));
    let e = error_of("cuda:1", || {
        kiln::backend::Cuda::named("cuda:1")
            .compile(&parse_func_text(ADD).unwrap())
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    n += expect("cuda:1", e, none);
    assert_eq!(n, 5);
}

/// `KILN_BACKEND=cuda` selects the GPU; without a driver, compiled functions fail saying so.
#[test]
fn the_cuda_backend_is_selected_by_name_and_says_what_is_missing() {
    kiln::set_options(kiln::Options {
        backend: Some("cuda".into()),
        ..kiln::Options::default()
    });
    assert_eq!(kiln::backend::backend().unwrap().name(), "cuda");
    if driver_present() {
        return;
    }
    let f = parse_func_text(ADD).unwrap();
    let e = error_of("compile_cached", || {
        kiln::backend::compile_cached(&f)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    expect("KILN_BACKEND=cuda", e, "no NVIDIA GPU");
    // Moving a tensor to the GPU: the same error, naming `to` and this line.
    let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let (moved, line) = (x.to(kiln::Device::Cuda(0)), line!());
    let e = moved.error().cloned().unwrap();
    assert_eq!((e.op.as_str(), e.loc.map(|l| l.line)), ("to", Some(line)));
    expect(
        "to",
        e.to_string(),
        "to: no NVIDIA GPU: the CUDA driver library was not found",
    );
}

/// A backend name after `cuda` that is not `:N` is an error at compile time.
#[test]
fn malformed_gpu_names() {
    let f = parse_func_text(ADD).unwrap();
    for name in ["cuda:x", "cuda:", "cuda0", "cuda:-1"] {
        let e = error_of(name, || {
            kiln::backend::Cuda::named(name)
                .compile(&f)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        expect(
            name,
            e,
            &format!("KILN_BACKEND={name}: a GPU is named `cuda` or `cuda:N`, N its index"),
        );
    }
}

/// What does not fit the device is found before anything runs: the arena against its
/// memory, each launch's block, grid, warp and shared memory against its limits.
#[test]
fn plans_that_do_not_fit_the_device() {
    let plan = plan_for(ADD, &device().target_info()).unwrap();
    check_fits(&plan, &device()).unwrap();
    let small = DeviceInfo {
        total_memory: plan.arena_bytes - 1,
        ..device()
    };
    let e = check_fits(&plan, &small).unwrap_err().to_string();
    expect(
        "arena",
        e,
        &format!(
            "the program's device arena needs {} bytes, more than cuda:0 has ({} bytes)",
            plan.arena_bytes,
            plan.arena_bytes - 1
        ),
    );
    let exact = DeviceInfo {
        total_memory: plan.arena_bytes,
        ..device()
    };
    check_fits(&plan, &exact).unwrap();
    let narrow = DeviceInfo {
        max_threads_per_block: 128,
        ..device()
    };
    let e = check_fits(&plan, &narrow).unwrap_err().to_string();
    expect(
        "block",
        e,
        "kernel `k0_add` does not fit cuda:0: a block of 256 threads, more than the device's 128",
    );
    let wide = DeviceInfo {
        warp_size: 64,
        ..device()
    };
    let e = check_fits(&plan, &wide).unwrap_err().to_string();
    expect(
        "warp",
        e,
        "mapped for warps of 32 threads, the device's have 64",
    );
    let mut huge = plan.clone();
    if let Some(kiln_kernel::gpu::plan::DeviceStep::Kernel(k)) = huge.steps.first_mut() {
        k.program.launches[0].grid = 1 << 31;
    }
    let e = check_fits(&huge, &device()).unwrap_err().to_string();
    expect(
        "grid",
        e,
        "a grid of 2147483648 blocks, more than the 2147483647 a launch may have",
    );
    let block = plan_for(BLOCK_SUM, &device().target_info()).unwrap();
    let tiny = DeviceInfo {
        shared_memory_per_block: 16,
        ..device()
    };
    let e = check_fits(&block, &tiny).unwrap_err().to_string();
    expect(
        "shared memory",
        e,
        "bytes of shared memory per block, more than the device's 16",
    );
}

/// The kernel layer refuses at compile time what the target cannot run: no GPU, shared
/// memory beyond a block's, blocks beyond the target's threads.
#[test]
fn kernels_that_do_not_fit_the_target_are_compile_errors() {
    let e = error_of("cpu", || plan_for(ADD, &TargetInfo::reference()));
    expect("no gpu", e, "@main: the target has no GPU");
    let mut t = device().target_info();
    t.gpu.as_mut().unwrap().shared_memory_per_block = 16;
    let e = error_of("shared", || plan_for(BLOCK_SUM, &t));
    expect(
        "shared",
        e,
        "bytes of shared memory per block, more than the target's 16",
    );
    let mut t = device().target_info();
    t.gpu.as_mut().unwrap().max_threads_per_block = 128;
    let e = error_of("threads", || plan_for(ADD, &t));
    expect(
        "threads",
        e,
        "a block of 256 threads (warp 32, at most 128)",
    );
    // Made for the device, the target keeps its blocks within its threads.
    let narrow = DeviceInfo {
        max_threads_per_block: 128,
        ..device()
    };
    let plan = plan_for(ADD, &narrow.target_info()).unwrap();
    check_fits(&plan, &narrow).unwrap();
}

/// kiln renders PTX for sm_80 and sm_90: older devices are refused by name.
#[test]
fn devices_older_than_sm_80_are_refused() {
    for (cc, sm) in [
        ((8, 0), "sm_80"),
        ((8, 9), "sm_80"),
        ((9, 0), "sm_90"),
        ((12, 0), "sm_90"),
    ] {
        let d = DeviceInfo {
            compute_capability: cc,
            ..device()
        };
        assert_eq!(d.ptx_sm().unwrap(), sm);
    }
    let old = DeviceInfo {
        compute_capability: (7, 5),
        name: "Tesla T4".into(),
        index: 2,
        ..device()
    };
    let e = old.ptx_sm().unwrap_err().to_string();
    expect(
        "old",
        e,
        "cuda:2 (Tesla T4) has compute capability 7.5; kiln's PTX needs sm_80 (8.0) or newer",
    );
}

/// PTX handed to an executable must match its plan: a module per kernel step, an `.entry`
/// per launch; the driver's rejection of a module is named.
#[test]
fn ptx_that_does_not_match_its_plan() {
    let plan = plan_for(ADD, &device().target_info()).unwrap();
    let e = check_ptx(&plan, &[]).unwrap_err().to_string();
    expect(
        "count",
        e,
        "no PTX for the device plan: 0 modules given for 1 kernel steps",
    );
    let e = check_ptx(
        &plan,
        &[".version 8.0\n.target sm_90\n.visible .entry k9_other(\n)\n{ ret; }".into()],
    )
    .unwrap_err()
    .to_string();
    expect(
        "entry",
        e,
        "the module of `k0_add` declares no `.entry k0_add`",
    );
    let rendered: Vec<String> = plan
        .kernel_steps()
        .map(|k| {
            kiln_codegen_llvm::ptx::program_ptx(
                &k.program,
                &kiln_codegen_llvm::ptx::PtxTarget::sm90(),
            )
            .unwrap()
        })
        .collect();
    check_ptx(&plan, &rendered).unwrap();
    let e = GpuError::PtxLoad {
        module: "k0_add".into(),
        message: "CUDA_ERROR_INVALID_PTX".into(),
    }
    .to_string();
    expect(
        "load",
        e,
        "the driver rejected PTX module `k0_add`: CUDA_ERROR_INVALID_PTX",
    );
    if driver_present() && device_count().unwrap_or(0) > 0 {
        let g = Gpu::open(0).unwrap();
        let e = g.load_ptx("not ptx").unwrap_err().to_string();
        expect("driver load", e, "the driver rejected PTX module `?`");
    }
}

/// What the PTX emitter cannot render is an error naming the kernel; f64 sine, which it once
/// refused, renders without a library call.
#[test]
fn kernels_the_ptx_emitter_refuses() {
    let plan = plan_for(BLOCK_SUM, &TargetInfo::h200()).unwrap();
    let step = plan.kernel_steps().next().unwrap().clone();
    let mut program = step.program.clone();
    program.launches[0].shared[0].len = 20000;
    let e =
        kiln_codegen_llvm::ptx::program_ptx(&program, &kiln_codegen_llvm::ptx::PtxTarget::sm90())
            .unwrap_err()
            .to_string();
    expect(
        "static shared",
        e,
        "bytes of shared memory per block (static shared memory holds 49152)",
    );
    let sine = "func @main(%0: f64[4]) -> f64[4] {
  %1 = sine %0 : f64[4]
  return %1
}
";
    // f64 sine, once refused, renders (kiln's own double-double code, no library call).
    let plan = plan_for(sine, &TargetInfo::h200()).unwrap();
    let k = plan.kernel_steps().next().unwrap();
    let ptx =
        kiln_codegen_llvm::ptx::program_ptx(&k.program, &kiln_codegen_llvm::ptx::PtxTarget::sm90())
            .unwrap();
    assert!(
        !ptx.contains("call.uni"),
        "f64 sine calls a function:\n{ptx}"
    );
}

/// Arguments that do not fit the program, and a plan whose regions lie outside its arena,
/// are errors of the executor the GPU and the emulator share.
#[test]
fn bad_arguments_and_broken_plans() {
    let plan = plan_for(ADD, &TargetInfo::h200()).unwrap();
    let a = Literal::f32([1000], vec![1.0; 1000]).unwrap();
    let short = Literal::f32([3], vec![1.0; 3]).unwrap();
    let ints = Literal::i32([1000], vec![1; 1000]).unwrap();
    let run = |args: Vec<&Literal>| {
        kiln_runtime::gpu_emu::run_plan(&plan, &args).map_err(|e| e.to_string())
    };
    let cases: [(&str, Vec<&Literal>, &str); 4] = [
        ("none", vec![], "@main takes 2 argument(s), 0 given"),
        (
            "three",
            vec![&a, &a, &a],
            "@main takes 2 argument(s), 3 given",
        ),
        (
            "shape",
            vec![&a, &short],
            "argument 1 of @main must be f32[1000], got f32[3]",
        ),
        (
            "dtype",
            vec![&ints, &a],
            "argument 0 of @main must be f32[1000], got i32[1000]",
        ),
    ];
    for (what, args, want) in cases {
        let e = error_of(what, || run(args));
        expect(what, e, want);
    }
    let got = run(vec![&a, &a]).unwrap();
    assert_eq!(got[0], Literal::f32([1000], vec![2.0; 1000]).unwrap());
    // Device-resident arguments (their bytes), as device tensors give them.
    let (bytes, few) = (a.to_le_bytes(), short.to_le_bytes());
    let run_bytes = |args: Vec<&[u8]>| {
        kiln_runtime::gpu_emu::run_plan_bytes(&plan, &args).map_err(|e| e.to_string())
    };
    let cases: [(&str, Vec<&[u8]>, &str); 3] = [
        ("no bytes", vec![], "0 arguments for 2 parameters"),
        (
            "three buffers",
            vec![&bytes, &bytes, &bytes],
            "3 arguments for 2 parameters",
        ),
        (
            "a short buffer",
            vec![&bytes, &few],
            "argument 1: 12 bytes for a parameter of type f32[1000] (4000 bytes)",
        ),
    ];
    for (what, args, want) in cases {
        let e = error_of(what, || run_bytes(args));
        expect(what, e, want);
    }
    let got = run_bytes(vec![&bytes, &bytes]).unwrap();
    assert_eq!(
        got[0],
        Literal::f32([1000], vec![2.0; 1000]).unwrap().to_le_bytes()
    );
    let mut cut = plan.clone();
    cut.arena_bytes = 64;
    let e = error_of("cut", || {
        kiln_runtime::gpu_emu::run_plan(&cut, &[&a, &a]).map_err(|e| e.to_string())
    });
    expect("arena", e, "lie outside the arena of 64");
    let mut wrong = plan.clone();
    let p = wrong.func.params[0].index();
    wrong.places[p].as_mut().unwrap().bytes = 8;
    let e = error_of("region", || {
        kiln_runtime::gpu_emu::run_plan(&wrong, &[&a, &a]).map_err(|e| e.to_string())
    });
    expect("region", e, "%0: 4000 bytes for a region of 8");
}

/// The errors a GPU gives name the device and the sizes.
#[test]
fn gpu_errors_name_the_device_and_the_sizes() {
    let cases = [
        (
            GpuError::NoDevice { index: 3, count: 1 },
            "no GPU cuda:3: the driver reports 1 device",
        ),
        (
            GpuError::NoDevice { index: 1, count: 0 },
            "no GPU cuda:1: the driver reports 0 devices",
        ),
        (
            GpuError::OutOfMemory {
                index: 0,
                bytes: 10,
                free: 4,
                total: 8,
            },
            "cuda:0 is out of memory: 10 bytes asked for, 4 of 8 free",
        ),
        (
            GpuError::Run {
                message: "k0_add: launch failed".into(),
            },
            "running on the GPU: k0_add: launch failed",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e.to_string(), want);
    }
    // The CPU backend keeps tensors in host memory: moving one to a GPU names the backends
    // that have device memory.
    let x = kiln::ir::Literal::f32([1], vec![1.0]).unwrap();
    let e = error_of("cpu upload", || {
        kiln::backend::Cpu
            .upload(kiln::Device::Cuda(0), &x)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    expect(
        "cpu upload",
        e,
        "the installed backend `cpu` keeps tensors in host memory",
    );
}

/// The CUDA backend's device memory: without a driver, uploading says what was looked for;
/// a device index other than the backend's, or past the devices, is named.
#[test]
fn device_memory_without_a_driver_or_with_a_wrong_index() {
    let x = kiln::ir::Literal::f32([2], vec![1.0, 2.0]).unwrap();
    let upload = |b: kiln::backend::Cuda, d: usize| {
        let what = format!("upload to cuda:{d}");
        error_of(&what, || {
            b.upload(kiln::Device::Cuda(d), &x)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    };
    if driver_present() {
        let n = device_count().unwrap();
        expect(
            "past the devices",
            upload(kiln::backend::Cuda::new(n), n),
            "the driver reports",
        );
        if n > 1 {
            let e = upload(kiln::backend::Cuda::new(0), 1);
            expect("another index", e, "the installed backend runs on cuda:0");
        }
        return;
    }
    let none = "no NVIDIA GPU: the CUDA driver library was not found (looked for libcuda.so";
    expect("cuda:0", upload(kiln::backend::Cuda::new(0), 0), none);
    expect("cuda:3", upload(kiln::backend::Cuda::new(0), 3), none);
    let e = upload(kiln::backend::Cuda::named("cuda:x"), 0);
    expect("cuda:x", e, "a GPU is named `cuda` or `cuda:N`");
}
