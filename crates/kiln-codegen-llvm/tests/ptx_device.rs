//! The PTX of GPU kernels run on a real GPU against the GPU emulator (`kiln-runtime`'s
//! `gpu_emu`, which defines what each statement means): every kernel of every spec example and
//! of random programs (200 by default, `KILN_PTX_DEVICE_PROGRAMS=N`), on random inputs. Integers
//! and exact float operations must agree bit for bit; kernels with transcendentals (kiln's
//! polynomials on the GPU, the reference's functions on the emulator) within a few ulps.
//! Without a CUDA driver or device it says so and passes: CI machines have none.

use kiln_codegen_llvm::Error;
use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
use kiln_ir::random::{Config, Rng, random_func, random_literal_with_specials};
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_kernel::gpu::ir::{Buf, GpuProgram};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::cuda::{DeviceBuffer, Gpu, device_count, driver_present};
use kiln_runtime::gpu_emu::{Buffer, run_program};
use std::collections::BTreeMap;

/// The types of the program's inputs and outputs (its `Buf::Input`s and `Buf::Output`s).
fn buffers(p: &GpuProgram) -> (Vec<TensorType>, Vec<TensorType>) {
    let mut ins = BTreeMap::new();
    let mut outs = BTreeMap::new();
    for l in &p.launches {
        for (b, t) in l.inputs.iter().chain(&l.outputs) {
            match *b {
                Buf::Input(i) => {
                    ins.insert(i, t.clone());
                }
                Buf::Output(o) => {
                    outs.insert(o, t.clone());
                }
                Buf::Scratch(_) => {}
            }
        }
    }
    // By index; an index no launch names gets a placeholder.
    let dense = |m: BTreeMap<usize, TensorType>| -> Vec<TensorType> {
        let n = m.keys().next_back().map_or(0, |k| k + 1);
        (0..n)
            .map(|i| {
                m.get(&i)
                    .cloned()
                    .unwrap_or_else(|| TensorType::scalar(DType::F32))
            })
            .collect()
    };
    (dense(ins), dense(outs))
}

/// Whether `p` computes a function kiln evaluates by its own polynomials on the GPU (and the
/// emulator by the reference's functions). Sine, cosine, tan, atan2 and power are kiln's
/// double-double code on f64, within 2 ulps of the reference's functions but not equal.
fn transcendental(p: &GpuProgram) -> bool {
    let text = format!("{p:?}");
    [
        "Kind(Exponential)",
        "Kind(Log)",
        "Kind(Tanh)",
        "Kind(Logistic)",
        "Kind(Erf)",
        "Kind(Rsqrt)",
        "Kind(Sine)",
        "Kind(Cosine)",
        "Kind(Tan)",
        "Kind(Atan2)",
        "Kind(Power)",
    ]
    .iter()
    .any(|op| text.contains(op))
}

/// Whether two values of `d` agree: bit for bit, both NaN, or (floats) within `rel`.
fn agree(d: DType, a: f64, b: f64, rel: f64) -> bool {
    a.to_bits() == b.to_bits()
        || (a.is_nan() && b.is_nan())
        || (d.is_float() && (a - b).abs() <= rel * a.abs().max(b.abs()))
}

/// Runs `p` on the GPU and on the emulator with `args`; an error saying where they differ.
fn compare(gpu: &Gpu, target: &PtxTarget, p: &GpuProgram, args: &[Literal]) -> Result<(), String> {
    let text = program_ptx(p, target).map_err(|e| e.to_string())?;
    let (_, out_types) = buffers(p);
    let ins: Vec<Buffer> = args
        .iter()
        .enumerate()
        .map(|(i, l)| Buffer::from_literal(&format!("in{i}"), l))
        .collect();
    let in_refs: Vec<&Buffer> = ins.iter().collect();
    let mut want: Vec<Buffer> = out_types
        .iter()
        .enumerate()
        .map(|(i, t)| Buffer::zeros(&format!("out{i}"), t))
        .collect();
    run_program(p, &in_refs, &mut want).map_err(|e| format!("emulator: {e}"))?;
    let e = |e: kiln_runtime::cuda::GpuError| e.to_string();
    let dev_in: Vec<DeviceBuffer> = args
        .iter()
        .map(|l| {
            let mut bytes = l.to_le_bytes();
            bytes.resize(bytes.len().max(1), 0);
            gpu.upload(&bytes)
        })
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let zeros = |t: &TensorType| gpu.upload(&vec![0u8; (t.numel() * t.dtype.bytes()).max(1)]);
    let dev_out: Vec<DeviceBuffer> = out_types
        .iter()
        .map(zeros)
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let scratch: Vec<DeviceBuffer> = p
        .scratch
        .iter()
        .map(zeros)
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let module = gpu.load_ptx(&text).map_err(e)?;
    for l in &p.launches {
        let kernel = module
            .kernel(&kiln_codegen_llvm::ptx::entry_name(l))
            .map_err(e)?;
        let addr = |b: &Buf| match *b {
            Buf::Input(i) => dev_in[i].address(0),
            Buf::Output(o) => dev_out[o].address(0),
            Buf::Scratch(s) => scratch[s].address(0),
        };
        let args: Vec<u64> = l
            .inputs
            .iter()
            .chain(&l.outputs)
            .map(|(b, _)| addr(b))
            .collect();
        // SAFETY: one 64-bit address per parameter, of live buffers of the sizes the launch
        // indexes (the emulator checked every access on the same inputs); no tensor maps.
        unsafe {
            gpu.launch(
                &kernel,
                (l.grid as u32, 1, 1),
                (l.block as u32, 1, 1),
                0,
                &args,
                &[],
            )
        }
        .map_err(e)?;
    }
    gpu.synchronize().map_err(e)?;
    let transcendental = transcendental(p);
    for (k, (t, w)) in out_types.iter().zip(&want).enumerate() {
        let mut bytes = vec![0u8; t.numel() * t.dtype.bytes()];
        gpu.download(&dev_out[k], &mut bytes).map_err(e)?;
        let got = Literal::from_le_bytes(t.clone(), &bytes).map_err(|e| e.to_string())?;
        let want = w.to_literal(t).map_err(|e| e.to_string())?;
        let (g, w): (Vec<f64>, Vec<f64>) = if t.dtype.is_float() {
            (got.to_f64s(), want.to_f64s())
        } else {
            let f = |l: &Literal| l.to_i64s().into_iter().map(|x| x as f64).collect();
            (f(&got), f(&want))
        };
        // Sums follow the same order on both; only kiln's polynomials differ from the
        // reference's functions, by a few ulps of the storage type.
        let rel = match (transcendental, t.dtype) {
            (false, _) => 0.0,
            (true, DType::F64) => 1e-13,
            (true, DType::F32) => 1e-5,
            (true, _) => 1e-2,
        };
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            if !agree(t.dtype, *a, *b, rel) {
                return Err(format!(
                    "output {k} element {i}: the GPU gives {a:e}, the emulator {b:e}"
                ));
            }
        }
    }
    Ok(())
}

/// The spec examples' functions and `n` random programs', with their names.
fn functions(n: u64) -> Vec<(String, Func)> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ir-specs/ops");
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("ir-specs/ops")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("readable");
        for (i, block) in text.split("```kiln\n").skip(1).enumerate() {
            let src = block.split("```").next().unwrap_or("");
            if let Ok(m) = kiln_ir::parse_module(src)
                && let Some(f) = m.entry()
            {
                let name = p.file_name().unwrap().to_string_lossy();
                out.push((format!("{name} #{i}"), f.clone()));
            }
        }
    }
    for seed in 0..n {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        out.push((format!("seed {seed}"), f));
    }
    out
}

#[test]
fn kernels_agree_with_the_emulator_on_a_gpu() {
    if !driver_present() || device_count().unwrap_or(0) == 0 {
        println!("no CUDA driver or device: nothing run (the PTX is checked by ptxas in ptx.rs)");
        return;
    }
    let gpu = Gpu::open(0).expect("device 0 opens");
    let target = PtxTarget {
        sm: gpu.info().sm(),
        ..PtxTarget::sm90()
    };
    let n: u64 = std::env::var("KILN_PTX_DEVICE_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let opts = kiln_kernel::Options::default();
    let (mut ran, mut skipped) = (0, BTreeMap::<String, usize>::new());
    let mut failures = Vec::new();
    for (name, f) in functions(n) {
        let Ok(kernels) = mapped_kernels(&f, &opts, &TargetInfo::h200()) else {
            continue;
        };
        for (k, p) in kernels {
            let Ok(p) = p else { continue };
            match program_ptx(&p, &target) {
                Err(Error::Unsupported(_)) => {
                    *skipped.entry("not rendered".into()).or_default() += 1;
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{name} {k}: {e}"));
                    continue;
                }
                Ok(_) => {}
            }
            let (in_types, _) = buffers(&p);
            let mut rng = Rng::new(ran as u64 ^ 0x5eed);
            let args: Vec<Literal> = in_types
                .iter()
                .map(|t| random_literal_with_specials(&mut rng, t, 1.0 / 64.0))
                .collect();
            match compare(&gpu, &target, &p, &args) {
                Ok(()) => ran += 1,
                Err(why) if why.starts_with("emulator: ") => {
                    // Inputs the kernel cannot take (indices out of bounds): not run.
                    *skipped
                        .entry("emulator refused the inputs".into())
                        .or_default() += 1;
                }
                Err(why) => failures.push(format!("{name} {k}: {why}")),
            }
        }
    }
    println!(
        "{ran} kernels agreed with the emulator on {} ({}); skipped: {skipped:?}",
        gpu.info().name,
        target.sm
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
