//! Matrix product programs in kiln's text form, their operands as stored, and a check of
//! products of small integers, shared by the GPU emulator's tests (not every test that
//! includes this module uses all of it).

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_kernel::gpu::ir::{GpuProgram, Stmt};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, EmuReport, V, compile_and_run, run_program};

mod wgmma_target;

#[allow(unused_imports)]
pub use wgmma_target::wgmma_target;

/// A batched product `lhs x rhs` of `(batch, m, k, n)` in `dt` (operands in `inp`), A stored
/// with its contraction first when `a_trans`, B with its contraction last when `b_trans`,
/// with a bias-and-tanh epilogue when `epilogue`.
pub fn product_text(
    (batch, m, k, n): (usize, usize, usize, usize),
    (inp, dt): (&str, &str),
    a_trans: bool,
    b_trans: bool,
    epilogue: bool,
) -> String {
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
    let dot = format!(
        "dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [{ac}], rhs_contracting_dimensions = [{bc}]}} : {y}"
    );
    if epilogue {
        format!(
            "func @main(%0: {a}, %1: {b}, %2: {dt}[{n}]) -> {y} {{\n  %3 = {dot}\n  %4 = broadcast_in_dim %2 {{broadcast_dimensions = [2]}} : {y}\n  %5 = add %3, %4 : {y}\n  %6 = tanh %5 : {y}\n  return %6\n}}\n"
        )
    } else {
        format!("func @main(%0: {a}, %1: {b}) -> {y} {{\n  %2 = {dot}\n  return %2\n}}\n")
    }
}

/// The operands of the product `(batch, m, k, n)` as stored, flat: A (with its contraction
/// first when `at`) of elements `a(batch, row, contraction)`, B (with its contraction last
/// when `bt`) of elements `b(batch, contraction, column)`.
#[allow(dead_code)]
pub fn operands(
    (batch, m, k, n): (usize, usize, usize, usize),
    (at, bt): (bool, bool),
    a_val: impl Fn(usize, usize, usize) -> f64,
    b_val: impl Fn(usize, usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut a = vec![0.0; batch * m * k];
    let mut b = vec![0.0; batch * k * n];
    for bi in 0..batch {
        for i in 0..m {
            for kk in 0..k {
                let at_ = if at {
                    (bi * k + kk) * m + i
                } else {
                    (bi * m + i) * k + kk
                };
                a[at_] = a_val(bi, i, kk);
            }
        }
        for kk in 0..k {
            for j in 0..n {
                let bt_ = if bt {
                    (bi * n + j) * k + kk
                } else {
                    (bi * k + kk) * n + j
                };
                b[bt_] = b_val(bi, kk, j);
            }
        }
    }
    (a, b)
}

/// Runs `p`, the product `(batch, m, k, n)` (A with its contraction first when `at`, B with
/// its contraction last when `bt`) of operands of `dtype` and an f32 result, on small
/// integers, where every sum is exact in f32: an error unless it runs and gives the exact
/// product.
#[allow(dead_code)]
pub fn check_exact_product(
    p: &GpuProgram,
    (batch, m, k, n): (usize, usize, usize, usize),
    (at, bt): (bool, bool),
    dtype: DType,
) -> Result<(), String> {
    let av = |bi: usize, i: usize, kk: usize| ((bi + i * 3 + kk * 5) % 9) as f64 - 4.0;
    let bv = |bi: usize, kk: usize, j: usize| ((bi * 2 + kk * 7 + j) % 7) as f64 - 3.0;
    let (a, b) = operands((batch, m, k, n), (at, bt), av, bv);
    let buf = |name: &str, data: &[f64]| Buffer {
        name: name.into(),
        dtype,
        data: data.iter().map(|&x| V::F(x)).collect(),
    };
    let out_t = TensorType {
        dtype: DType::F32,
        shape: vec![batch, m, n],
    };
    let mut out = vec![Buffer::zeros("%d", &out_t)];
    run_program(p, &[&buf("%a", &a), &buf("%b", &b)], &mut out).map_err(|e| e.to_string())?;
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|kk| av(bi, i, kk) * bv(bi, kk, j)).sum();
                let got = out[0].data[(bi * m + i) * n + j];
                if got != V::F(want) {
                    return Err(format!("[{bi}][{i}][{j}] is {got:?}, not {want}"));
                }
            }
        }
    }
    Ok(())
}

/// The statements of `body` (nested ones too) that `keep` picks, counted.
#[allow(dead_code)]
pub fn count(body: &[Stmt], keep: &dyn Fn(&Stmt) -> bool) -> usize {
    body.iter()
        .map(|s| {
            let inner = match s {
                Stmt::For { body, .. } | Stmt::If { body, .. } => count(body, keep),
                _ => 0,
            };
            inner + usize::from(keep(s))
        })
        .sum()
}

/// The kernels of `f` lowered and mapped for `target` (inputs of `dtype` where given).
#[allow(dead_code)]
pub fn mapped(f: &Func, target: &TargetInfo, dtype: Option<DType>) -> Vec<GpuProgram> {
    let opts = kiln_kernel::Options::default();
    let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, target, None, &mut |_| {})
        .expect("lowers");
    (0..l.func.insts.len())
        .filter_map(|i| {
            let k = l.fused.kernels[i].as_ref()?;
            let ins: Vec<TensorType> = l.fused.operands[i]
                .iter()
                .map(|v| {
                    let mut t = l.func.values[v.index()].clone();
                    if let Some(d) = dtype {
                        t.dtype = d;
                    }
                    t
                })
                .collect();
            Some(
                kiln_kernel::gpu::map(k, &ins, target, &kiln_kernel::Options::default(), "product")
                    .expect("maps"),
            )
        })
        .collect()
}

/// The statements of the launches of `p` (nested ones too) that `keep` picks, counted.
#[allow(dead_code)]
pub fn in_launches(p: &GpuProgram, keep: &dyn Fn(&Stmt) -> bool) -> usize {
    p.launches.iter().map(|l| count(&l.body, keep)).sum()
}

/// The product `shape` `(batch, m, k, n)` of small integers (A with its contraction first
/// when `at`, B with its contraction last when `bt`) with operands of `dtype`, mapped for
/// `target`, its launches verified and its result checked exact ([`check_exact_product`]):
/// the program, or the first error.
#[allow(dead_code)]
pub fn exact_program(
    target: &TargetInfo,
    shape: (usize, usize, usize, usize),
    (at, bt): (bool, bool),
    dtype: DType,
) -> Result<GpuProgram, String> {
    let src = product_text(shape, ("f32", "f32"), at, bt, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let p = mapped(&f, target, Some(dtype)).remove(0);
    for l in &p.launches {
        kiln_kernel::gpu::print::verify(l, target.gpu.as_ref().unwrap())?;
    }
    check_exact_product(&p, shape, (at, bt), dtype)?;
    Ok(p)
}

/// `f` on the emulator of `target` with random operands from `seed`, against the reference
/// (`kiln_reference::accuracy`'s bound): the emulator's report, or the error.
#[allow(dead_code)]
pub fn against_reference(f: &Func, target: &TargetInfo, seed: u64) -> Result<EmuReport, String> {
    let mut rng = Rng::new(seed);
    let args: Vec<Literal> = f
        .param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect();
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(f, &[], &opts, target, &args).map_err(|e| e.to_string())?;
    kiln_reference::accuracy::check_outputs(f, &args, &got)?;
    Ok(rep)
}

/// The statements of `body` (nested ones too) changed by `f`.
#[allow(dead_code)]
pub fn edit(body: &mut [Stmt], f: &mut impl FnMut(&mut Stmt)) {
    for s in body {
        f(s);
        if let Stmt::For { body, .. } | Stmt::If { body, .. } = s {
            edit(body, f);
        }
    }
}
