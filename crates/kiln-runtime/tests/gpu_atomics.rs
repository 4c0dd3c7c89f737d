//! Float atomics (`Options::float_atomics`, off by default) on the emulator: f32 sums over
//! whole tensors and columns in one launch adding each block's or thread's partial into the
//! zeroed result, and f32 and f16 scatter-adds by atomics instead of sorting their updates,
//! against the reference within a float tolerance (the order of the additions is not the
//! reference's); the mapping checked to have changed (one launch instead of two, no sort);
//! the emulator's atomic addition itself (per element, in its order of blocks and threads);
//! the zeroed results never touching another value's memory, donated or not.

use kiln_ir::random::Rng;
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_kernel::Options;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep, device_plan};
use kiln_kernel::target::TargetInfo;
use kiln_reference::accuracy::{magnitudes, unit_roundoff};
use kiln_runtime::gpu_emu::{
    Buffer, EmuDevice, EmuReport, V, compile_and_run, run_plan, run_program,
};
use kiln_runtime::plan_exec;
use std::collections::BTreeMap;

mod planned;
use planned::indexed_args;

/// The options with float atomics allowed.
fn atomics() -> Options {
    Options {
        float_atomics: true,
        ..Options::default()
    }
}

/// `src` parsed, lowered under `opts` and planned for the H200.
fn plan_of(src: &str, opts: &Options) -> (Func, DevicePlan) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let target = TargetInfo::h200();
    let l = kiln_kernel::pipeline::lower_program(&f, &[], opts, &target, None, &mut |_| {})
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    let plan = device_plan(&l, &target).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (f, plan)
}

/// Whether each output of `got` lies within `units(output, element)` units of roundoff of
/// its dtype, times the element's magnitude (the sum of the absolute values it is computed
/// from), of the reference's; the first element that does not, else `None`.
fn within(
    f: &Func,
    args: &[Literal],
    got: &[Literal],
    units: impl Fn(usize, usize) -> f64,
) -> Option<String> {
    let want = kiln_reference::eval(f, args).expect("the reference runs");
    let mags = magnitudes(f, args).expect("magnitudes");
    for (o, ((g, w), m)) in got.iter().zip(&want).zip(&mags).enumerate() {
        if g.ty() != w.ty() {
            return Some(format!("output {o}: {} for {}", g.ty(), w.ty()));
        }
        let u = unit_roundoff(w.dtype());
        let (g, w, m) = (g.to_f64s(), w.to_f64s(), m.to_f64s());
        for i in 0..w.len() {
            let allowed = units(o, i) * u * m[i];
            let ok = if w[i].is_nan() {
                g[i].is_nan()
            } else {
                (g[i] - w[i]).abs() <= allowed || g[i] == w[i]
            };
            if !ok {
                return Some(format!(
                    "output {o} element {i}: {} against the reference's {} (allowed {allowed:e})",
                    g[i], w[i]
                ));
            }
        }
    }
    None
}

/// The launches of `plan` by mapping.
fn launches(plan: &DevicePlan) -> BTreeMap<MapKind, usize> {
    EmuReport::of(plan).launches
}

/// A sum (with start value `init`) of `f32[shape]` over `dims` to `f32[kept]`.
fn sum(shape: &str, dims: &str, kept: &str, init: &str) -> String {
    format!(
        "func @main(%0: f32[{shape}]) -> f32[{kept}] {{\n  %1 = constant {{value = {init}}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [{dims}], kind = add}} : f32[{kept}]\n  return %2\n}}\n"
    )
}

/// Units of roundoff a sum's element may be off by: each partial's chunk chain, tree and
/// shuffles, then up to 256 partials added one after the other, for the result and for the
/// reference's own order.
const SUM_UNITS: f64 = 600.0;

#[test]
fn sums_take_one_launch_and_agree_with_the_reference() {
    use MapKind::{ColumnAtomic, ColumnPartials, Elementwise, SplitAtomic, SplitPartials};
    let two = "func @main(%0: f32[90000], %1: f32[90000]) -> (f32[], f32[]) {\n  %2 = multiply %0, %1 : f32[90000]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = add} : f32[]\n  %5 = constant {value = 1.5} : f32[]\n  %6 = reduce %0, %5 {dimensions = [0], kind = add} : f32[]\n  return %4, %6\n}\n";
    let cases = [
        (sum("100003", "0", "", "0.0"), SplitAtomic, SplitPartials),
        (sum("3,70001", "1", "3", "0.0"), SplitAtomic, SplitPartials),
        (sum("70001", "0", "", "2.5"), SplitAtomic, SplitPartials),
        (
            sum("1000,300", "0", "300", "0.0"),
            ColumnAtomic,
            ColumnPartials,
        ),
        (
            sum("4,129,40", "0,1", "40", "-1.25"),
            ColumnAtomic,
            ColumnPartials,
        ),
        (
            sum("4200,20", "0", "20", "0.0"),
            ColumnAtomic,
            ColumnPartials,
        ),
        (two.to_string(), SplitAtomic, SplitPartials),
    ];
    let mut failures = Vec::new();
    for (i, (src, atomic, partials)) in cases.iter().enumerate() {
        let (f, plan) = plan_of(src, &atomics());
        // One launch where the deterministic split takes two, nothing else.
        let want = BTreeMap::from([(*atomic, 1)]);
        if launches(&plan) != want {
            failures.push(format!("case {i}: launches {:?}", launches(&plan)));
            continue;
        }
        let (_, det) = plan_of(src, &Options::default());
        let det_want = BTreeMap::from([(*partials, 1), (Elementwise, 1)]);
        if launches(&det) != det_want {
            failures.push(format!("case {i}: by default {:?}", launches(&det)));
        }
        let a = indexed_args(&f, 40 + i as u64, 1, true);
        let refs: Vec<&Literal> = a.iter().collect();
        match run_plan(&plan, &refs) {
            Ok(got) => {
                if let Some(e) = within(&f, &a, &got, |_, _| SUM_UNITS) {
                    failures.push(format!("case {i}: {e}"));
                }
            }
            Err(e) => failures.push(format!("case {i}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Positive terms: a block that never adds its partial, or a result not zeroed first (the
/// emulated arena starts as NaN), shows.
#[test]
fn a_dropped_partial_or_a_missing_zeroing_is_caught() {
    for src in [
        sum("100003", "0", "", "0.0"),
        sum("1000,300", "0", "300", "0.0"),
    ] {
        let (f, mut plan) = plan_of(&src, &atomics());
        let ones: Vec<Literal> = (f.param_types().iter())
            .map(|t| Literal::try_full(t.clone(), 1.0).unwrap())
            .collect();
        let refs: Vec<&Literal> = ones.iter().collect();
        let good = run_plan(&plan, &refs).expect("runs");
        assert_eq!(within(&f, &ones, &good, |_, _| SUM_UNITS), None);
        let DeviceStep::Kernel(k) = (plan.steps.iter_mut())
            .find(|s| matches!(s, DeviceStep::Kernel(_)))
            .unwrap()
        else {
            unreachable!()
        };
        let saved = k.program.clone();
        // The launch stops one block short.
        let Some(Stmt::For { end, .. }) = k.program.launches[0].body.first_mut() else {
            panic!("a loop over the blocks")
        };
        let Sc::Const(n) = *end else {
            panic!("a constant grid")
        };
        *end = Sc::Const(n - 1);
        let bad = run_plan(&plan, &refs).expect("runs");
        assert!(within(&f, &ones, &bad, |_, _| SUM_UNITS).is_some(), "{src}");
        // Nothing zeroed: NaN from the arena.
        let DeviceStep::Kernel(k) = (plan.steps.iter_mut())
            .find(|s| matches!(s, DeviceStep::Kernel(_)))
            .unwrap()
        else {
            unreachable!()
        };
        k.program = saved;
        k.program.zeroed.clear();
        let bad = run_plan(&plan, &refs).expect("runs");
        assert!(bad[0].to_f64s().iter().all(|x| x.is_nan()), "{src}");
    }
}

/// The results the atomics add into are zeroed by a fill on the device: a call copies its
/// parameters to the device and nothing else (before, each zeroing copied a buffer of
/// negative zeros the size of the result from the host), one fill per zeroed buffer.
#[test]
fn zeroing_is_a_fill_on_the_device_not_a_copy_from_the_host() {
    for src in [
        sum("100003", "0", "", "0.0"),
        sum("1000,300", "0", "300", "0.0"),
    ] {
        let (f, plan) = plan_of(&src, &atomics());
        let zeroed: usize = plan.kernel_steps().map(|k| k.program.zeroed.len()).sum();
        assert!(zeroed >= 1, "{src}");
        let a = indexed_args(&f, 11, 1, true);
        let refs: Vec<&Literal> = a.iter().collect();
        let mut dev = EmuDevice::new(&plan);
        plan_exec::load(&plan, &mut dev).expect("loads");
        let loaded = dev.traffic();
        plan_exec::write_params(&plan, &mut dev, &refs).expect("writes its parameters");
        let written = dev.traffic();
        assert_eq!(
            written.to_device - loaded.to_device,
            f.params.len(),
            "{src}"
        );
        plan_exec::run_steps(&plan, &mut dev).expect("runs");
        let ran = dev.traffic();
        assert_eq!(
            (ran.to_device, ran.to_device_bytes),
            (written.to_device, written.to_device_bytes),
            "{src}: the run copied from the host"
        );
        assert_eq!(ran.fills - written.fills, zeroed, "{src}");
        let got = plan_exec::read_outputs(&plan, &mut dev).expect("reads its results");
        assert_eq!(within(&f, &a, &got, |_, _| SUM_UNITS), None, "{src}");
    }
}

/// A scatter-add of `n` single elements of `dt` into `dt[len]`.
fn scatter(dt: &str, len: usize, n: usize) -> String {
    format!(
        "func @main(%0: {dt}[{len}], %1: i32[{n},1], %2: {dt}[{n}]) -> {dt}[{len}] {{\n  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add}} : {dt}[{len}]\n  return %3\n}}\n"
    )
}

#[test]
fn scatter_adds_run_without_a_sort_and_agree_with_the_reference() {
    let cases = [
        ("f32", 37, 2000),
        ("f32", 1000, 20000),
        ("f32", 300, 6000),
        ("f16", 300, 3000),
        ("f16", 50, 1000),
    ];
    let mut failures = Vec::new();
    for (i, &(dt, len, n)) in cases.iter().enumerate() {
        let what = format!("{dt}[{len}] <- {n} updates");
        let src = scatter(dt, len, n);
        let (f, plan) = plan_of(&src, &atomics());
        if launches(&plan) != BTreeMap::from([(MapKind::ScatterAtomic, 2)]) {
            failures.push(format!("{what}: launches {:?}", launches(&plan)));
            continue;
        }
        let (_, det) = plan_of(&src, &Options::default());
        if !launches(&det).contains_key(&MapKind::Sort) {
            failures.push(format!(
                "{what}: not sorted by default: {:?}",
                launches(&det)
            ));
        }
        let a = indexed_args(&f, 70 + i as u64, len, true);
        // Each element's updates, in bounds: its additions in some order, against the
        // reference's, each rounded to the dtype.
        let mut count = vec![0usize; len];
        for t in a[1].to_i64s() {
            if let Some(c) = usize::try_from(t).ok().and_then(|t| count.get_mut(t)) {
                *c += 1;
            }
        }
        let refs: Vec<&Literal> = a.iter().collect();
        match run_plan(&plan, &refs) {
            Ok(got) => {
                let units = |_, e: usize| 2.0 * (count[e] as f64 + 1.0);
                if let Some(e) = within(&f, &a, &got, units) {
                    failures.push(format!("{what}: {e}"));
                }
            }
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A bf16 scatter-add and one by maximum keep the sorted form: PTX's bf16 atomic addition
/// needs sm_90 (the kernels also assemble for sm_80), and only additions are atomic.
#[test]
fn bf16_and_other_combiners_keep_the_deterministic_forms() {
    let max = scatter("f32", 300, 6000).replace("kind = add", "kind = max");
    for src in [scatter("bf16", 300, 3000), max] {
        let (f, plan) = plan_of(&src, &atomics());
        let l = launches(&plan);
        assert!(l.contains_key(&MapKind::Sort), "{l:?}");
        assert!(!l.contains_key(&MapKind::ScatterAtomic), "{l:?}");
        let a = indexed_args(&f, 5, 300, true);
        let refs: Vec<&Literal> = a.iter().collect();
        let got = run_plan(&plan, &refs).expect("runs");
        // Still the sequential result, bit for bit.
        assert_eq!(got, kiln_reference::eval(&f, &a).unwrap(), "{src}");
    }
}

/// A launch of `grid` blocks of 64 threads, thread `t` adding `value(t)` (an f32 or f16
/// constant per thread, from input 0) into output element `t % 3`, the output zeroed first.
fn adding(grid: usize, dtype: DType) -> GpuProgram {
    let out = TensorType::new(dtype, [3]);
    let launch = GpuKernel {
        tensor_maps: Vec::new(),
        dynamic_shared: 0,
        name: "adds".into(),
        kind: MapKind::SplitAtomic,
        grid,
        block: 64,
        warp: 32,
        inputs: vec![(Buf::Input(0), TensorType::new(dtype, [64]))],
        outputs: vec![(Buf::Output(0), out.clone())],
        shared: Vec::new(),
        regs: 1,
        vars: 0,
        sums: TargetInfo::h200().sums,
        body: vec![
            Stmt::Load {
                reg: 0,
                buf: Buf::Input(0),
                index: Sc::Special(Special::Thread),
            },
            Stmt::AtomicAdd {
                buf: Buf::Output(0),
                index: Sc::modulo(Sc::Special(Special::Thread), Sc::Const(3)),
                value: 0,
            },
        ],
    };
    GpuProgram {
        scratch: Vec::new(),
        zeroed: vec![(Buf::Output(0), out)],
        launches: vec![launch],
    }
}

#[test]
fn the_emulator_adds_atomically_per_element_in_block_and_thread_order() {
    // Every addition counted, across four blocks run side by side (their logs applied in
    // block order), into an output that held NaN before it was zeroed.
    let ones = Buffer {
        name: "%ones".into(),
        dtype: DType::F32,
        data: vec![V::F(1.0); 64],
    };
    let mut out = vec![Buffer {
        name: "%out".into(),
        dtype: DType::F32,
        data: vec![V::F(f64::NAN); 3],
    }];
    run_program(&adding(4, DType::F32), &[&ones], &mut out).unwrap();
    let got: Vec<f64> = out[0].data.iter().map(|v| v.f()).collect();
    assert_eq!(got, [88.0, 84.0, 84.0]);
    // In f16 each addition rounds: thread 0 adds 2048 first, then every 1 added to it rounds
    // back to 2048 (2049 is a tie, to even). Threads 3, 6, ... add into element 0 after it.
    let mut values = vec![V::F(1.0); 64];
    values[0] = V::F(2048.0);
    let halves = Buffer {
        name: "%halves".into(),
        dtype: DType::F16,
        data: values,
    };
    let mut out = vec![Buffer::zeros("%out", &TensorType::new(DType::F16, [3]))];
    run_program(&adding(1, DType::F16), &[&halves], &mut out).unwrap();
    let got: Vec<f64> = out[0].data.iter().map(|v| v.f()).collect();
    assert_eq!(got, [2048.0, 21.0, 21.0]);
    // An element no thread adds to stays negative zero, the sum's identity.
    let mut out = vec![Buffer::zeros("%out", &TensorType::new(DType::F32, [3]))];
    let mut p = adding(1, DType::F32);
    p.launches[0].body[1] = Stmt::AtomicAdd {
        buf: Buf::Output(0),
        index: Sc::Const(1),
        value: 0,
    };
    run_program(&p, &[&ones], &mut out).unwrap();
    let got: Vec<f64> = out[0].data.iter().map(|v| v.f()).collect();
    assert_eq!(got[1], 64.0);
    assert!(got[0] == 0.0 && got[0].is_sign_negative());
    // An atomic addition into an integer output is refused.
    let mut p = adding(1, DType::F32);
    p.launches[0].outputs[0].1.dtype = DType::I32;
    let mut out = vec![Buffer::zeros("%out", &TensorType::new(DType::I32, [3]))];
    let e = run_program(&p, &[&ones], &mut out).unwrap_err();
    assert!(e.0.contains("atomic addition"), "{e}");
}

/// A column sum both returned and read again by a later kernel (`x` scaled by it), its
/// parameter donated: the zeroed result is the sum's own region, never `x`'s or another live
/// value's, so both results agree with the reference.
#[test]
fn zeroed_results_never_overlap_live_values_donated_or_not() {
    let src = "func @main(%0: f32[1000,300]) -> (f32[300], f32[1000,300]) {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[300]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[1000,300]\n  %4 = multiply %0, %3 : f32[1000,300]\n  return %2, %4\n}\n";
    let (f, plan) = plan_of(src, &atomics());
    let mut zeroed = 0;
    for k in plan.kernel_steps() {
        for (b, _) in &k.program.zeroed {
            let z = k.region(*b).expect("a region");
            zeroed += 1;
            for (_, r) in &k.inputs {
                assert!(
                    z.end() <= r.offset || r.end() <= z.offset,
                    "k{}: zeroes {b} at {z:?}, over an operand at {r:?}",
                    k.inst
                );
            }
        }
    }
    assert!(zeroed >= 1, "{:?}", launches(&plan));
    let a = indexed_args(&f, 9, 1, true);
    for donated in [false, true] {
        let (got, rep) =
            compile_and_run(&f, &[donated], &atomics(), &TargetInfo::h200(), &a).expect("runs");
        assert!(rep.launches.contains_key(&MapKind::ColumnAtomic), "{rep:?}");
        assert_eq!(
            within(&f, &a, &got, |_, _| SUM_UNITS),
            None,
            "donated: {donated}"
        );
    }
}

/// An H200 whose reductions take a warp from 2 terms and a block from 4 (blocks of 128
/// threads), so random programs' small sums split over blocks, and with float atomics run by
/// them.
fn small_blocks() -> TargetInfo {
    let mut t = TargetInfo::h200();
    let gpu = t.gpu.as_mut().expect("a GPU");
    gpu.warp_reduce_min = 2;
    gpu.block_reduce_min = 4;
    gpu.max_threads_per_block = 128;
    gpu.elementwise_block = 128;
    t
}

/// Random programs of f32, f16 and i32 values (seeds 0 to 299, or those `KILN_GPU_EMU_PROGRAMS`
/// names: a count `N` or a range `A..B` of fresh seeds) with float atomics allowed, on an H200
/// with small blocks, against the reference within its accuracy bounds; some of their kernels
/// run by atomics.
#[test]
fn random_programs_with_float_atomics_agree_with_the_reference() {
    use kiln_ir::random::{Config, random_func, random_literal_with_specials, seeds::seed_range};
    let knob = std::env::var("KILN_GPU_EMU_PROGRAMS").ok();
    let seeds = seed_range("KILN_GPU_EMU_PROGRAMS", knob.as_deref(), 0..300).unwrap();
    let n = seeds.end - seeds.start;
    let mut atomic = BTreeMap::new();
    let mut failures = Vec::new();
    for seed in seeds {
        // In f32 and f16 only (with i32 indices), so that sums and scatter-adds meet atomics.
        let cfg = Config {
            dtypes: vec![DType::F32, DType::F16, DType::I32],
            ..Config::profile(seed)
        };
        let f = random_func(&mut Rng::new(seed), &cfg.with_wide());
        let mut rng = Rng::new(seed ^ 77);
        let args: Vec<Literal> = (f.param_types().iter())
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect();
        let target = small_blocks();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compile_and_run(&f, &[], &atomics(), &target, &args)
        }));
        match run {
            Ok(Ok((got, rep))) => {
                for (k, c) in rep.launches {
                    if matches!(
                        k,
                        MapKind::SplitAtomic | MapKind::ColumnAtomic | MapKind::ScatterAtomic
                    ) {
                        *atomic.entry(k).or_insert(0) += c;
                    }
                }
                if let Err(e) = kiln_reference::accuracy::check_outputs(&f, &args, &got) {
                    failures.push(format!("seed {seed}: {e}"));
                }
            }
            Ok(Err(e)) => failures.push(format!("seed {seed}: {e}")),
            Err(_) => failures.push(format!("seed {seed}: panicked")),
        }
    }
    println!("{n} random programs with float atomics: atomic launches {atomic:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(n < 100 || !atomic.is_empty(), "no kernel ran by atomics");
}
