//! f32 products on TF32 tensor cores (the options' `MatmulPrecision::Tf32`) on the GPU
//! emulator, against the reference interpreter.
//!
//! The bound (as `docs/gpu.md` states it): the products of TF32 values are exact in f32, so a
//! TF32 product must agree with the reference's product of the operands rounded to TF32
//! (`cvt.rna.tf32.f32`: to nearest, ties away from zero) within the f32 bound of
//! `kiln_reference::accuracy` for that program, `K(n, r) · 2⁻²⁴ · Σ|ã·b̃|` plus an ulp (and
//! the bounds of the epilogue's ops); against the exact f32 product it may differ by up to
//! `(2⁻¹⁰ + 2⁻²² + K(n, r) · 2⁻²⁴ · (1 + 2⁻¹¹)²) · Σ|a·b|`, so on operands with full
//! mantissas it must fail the exact f32 check: a TF32 product that skipped the rounding, or
//! ran off the tensor cores, fails these tests. With the default options f32 products stay on
//! the CUDA cores, exact as before (`gpu_emulator.rs` checks them against the exact bound).

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{DType, Func, Literal};
use kiln_kernel::gpu::ir::*;
use kiln_kernel::gpu::tf32;
use kiln_kernel::options::{MatmulPrecision, Options};
use kiln_kernel::target::TargetInfo;
use kiln_reference::accuracy::check_outputs;
use kiln_runtime::gpu_emu::{Buffer, V, compile_and_run, run_kernel};

mod products;

/// Options that allow TF32.
fn tf32_options() -> Options {
    Options {
        matmul_precision: MatmulPrecision::Tf32,
        ..Options::default()
    }
}

/// A batched f32 product `(batch, m, k, n)`, A stored with its contraction first when
/// `a_trans`, B with its contraction last when `b_trans`, with a bias-and-tanh epilogue when
/// `epilogue`; the bias is the third parameter.
fn product_text(
    shape: (usize, usize, usize, usize),
    a_trans: bool,
    b_trans: bool,
    epilogue: bool,
) -> String {
    products::product_text(shape, ("f32", "f32"), a_trans, b_trans, epilogue)
}

/// `l` with every element rounded to TF32.
fn rounded(l: &Literal) -> Literal {
    let v: Vec<f64> = l
        .to_f64s()
        .into_iter()
        .map(|x| f64::from(tf32::round(x as f32)))
        .collect();
    Literal::from_f64s(l.ty().clone(), &v).unwrap()
}

/// Random arguments of `f` (uniform in [-4, 4): full f32 mantissas), seeded by `seed`.
fn random_args(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect()
}

/// f32 products under the TF32 policy on the emulator against the reference on TF32-rounded
/// operands (the bound in the module documentation): rows, columns and contractions that are
/// not multiples of the tiles (every tile size of an H200), a contraction of one, one past a
/// chunk of the sum tree (256) and one past sixteen chunks (two levels), batches, A and B
/// transposed or not (B by rows: fragments by shared loads; by columns: `ldmatrix`; A
/// transposed: staged through registers), a bias-and-tanh epilogue in the product's launch.
/// Each runs on the tensor cores in one launch, and fails the exact f32 check, except the
/// contraction of 4100: the operands' rounding errors (random in sign) grow as the square
/// root of the contraction, the exact bound (a worst case) as the contraction itself, and
/// past a few hundred terms the first stays within the second.
#[test]
fn tf32_products_agree_with_the_reference_on_rounded_operands() {
    let cases = [
        ((1, 130, 17, 129), false, false, false),
        ((2, 67, 9, 70), true, true, true),
        ((3, 33, 1, 40), false, true, false),
        ((1, 20, 600, 24), true, false, false),
        ((2, 64, 40, 96), false, true, true),
        ((1, 9, 4100, 8), false, false, false),
        ((1, 72, 48, 40), true, true, false),
        ((2, 18, 300, 21), false, false, true),
    ];
    let long = |k: usize| k > 1000;
    let target = TargetInfo::h200();
    let mut failures = Vec::new();
    for (i, &(shape, at, bt, ep)) in cases.iter().enumerate() {
        let src = product_text(shape, at, bt, ep);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("case {i}: {e}"));
        let args = random_args(&f, 500 + i as u64);
        let (got, rep) = match compile_and_run(&f, &[], &tf32_options(), &target, &args) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("case {i}: {e}\n{src}"));
                continue;
            }
        };
        if rep.launches.get(&MapKind::GemmMma) != Some(&1) || rep.launches.len() != 1 {
            failures.push(format!(
                "case {i}: one tensor-core launch expected: {:?}\n{src}",
                rep.launches
            ));
        }
        // The product's operands rounded; the bias (the epilogue's) as it is.
        let mut want_args = args.clone();
        for a in &mut want_args[..2] {
            *a = rounded(a);
        }
        if let Err(e) = check_outputs(&f, &want_args, &got) {
            failures.push(format!(
                "case {i}: against the rounded operands: {e}\n{src}"
            ));
        }
        if !long(shape.2) && check_outputs(&f, &args, &got).is_ok() {
            failures.push(format!(
                "case {i}: within the exact f32 bound: were the operands rounded?\n{src}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Without the TF32 policy, or on a GPU without TF32 tensor cores, an f32 product stays on
/// the CUDA cores and exact: within the exact f32 bound.
#[test]
fn without_the_policy_or_tf32_tensor_cores_f32_products_stay_exact() {
    let src = product_text((2, 67, 9, 70), true, false, true);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let args = random_args(&f, 7);
    let mut no_tf32 = TargetInfo::h200();
    no_tf32.gpu.as_mut().expect("a GPU").tf32 = false;
    for (what, opts, target) in [
        ("default options", Options::default(), TargetInfo::h200()),
        ("no TF32 tensor cores", tf32_options(), no_tf32),
    ] {
        let (got, rep) = compile_and_run(&f, &[], &opts, &target, &args).unwrap();
        assert_eq!(
            rep.launches.get(&MapKind::GemmTiled),
            Some(&1),
            "{what}: {rep:?}"
        );
        assert_eq!(rep.launches.get(&MapKind::GemmMma), None, "{what}: {rep:?}");
        check_outputs(&f, &args, &got).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The rounding itself, end to end: operands `±2^e (1 + 2^-11)`, halfway between two TF32
/// values, times `±2^f`, so every product and sum is exact in f32 and the result tells the
/// roundings apart: to nearest with ties away from zero gives `±2^(e+f) (1 + 2^-10)` per
/// term (the result must be exactly that sum), ties to even or truncation `±2^(e+f)`, no
/// rounding the exact `±2^(e+f) (1 + 2^-11)`. Every layout of the operands (B's fragments by
/// `ldmatrix` or by shared loads, A staged by `cp.async` or through registers), contractions
/// within one stage and over several.
#[test]
fn tf32_products_round_operands_to_nearest_with_ties_away() {
    let target = TargetInfo::h200();
    let tie = 1.0 + 2f64.powi(-11);
    let sign = |x: usize| if x % 3 == 1 { -1.0 } else { 1.0 };
    let a_val = |bi: usize, i: usize, kk: usize| sign(i + 2 * kk + bi) * 2f64.powi((kk % 3) as i32);
    let b_val = |bi: usize, kk: usize, j: usize| sign(kk + j + bi) * 2f64.powi((j % 2) as i32 - 1);
    for (c, &((batch, m, k, n), at, bt)) in [
        ((1, 16, 24, 16), false, false),
        ((2, 20, 8, 18), true, false),
        ((1, 33, 70, 17), false, true),
        ((1, 16, 100, 40), true, true),
    ]
    .iter()
    .enumerate()
    {
        let src = product_text((batch, m, k, n), at, bt, false);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let (a, b) = products::operands(
            (batch, m, k, n),
            (at, bt),
            |bi, i, kk| a_val(bi, i, kk) * tie,
            b_val,
        );
        let ty = |p: usize| f.param_types()[p].clone();
        let args = [
            Literal::from_f64s(ty(0), &a).unwrap(),
            Literal::from_f64s(ty(1), &b).unwrap(),
        ];
        let (got, rep) = compile_and_run(&f, &[], &tf32_options(), &target, &args).unwrap();
        assert_eq!(rep.launches.get(&MapKind::GemmMma), Some(&1), "case {c}");
        let got = got[0].to_f64s();
        // Where the terms do not cancel, the roundings give different results.
        let mut distinct = 0;
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let term = |kk: usize| a_val(bi, i, kk) * b_val(bi, kk, j);
                    let away: f64 = (0..k).map(|kk| term(kk) * (1.0 + 2f64.powi(-10))).sum();
                    let exact: f64 = (0..k).map(|kk| term(kk) * tie).sum();
                    let truncated: f64 = (0..k).map(term).sum();
                    let g = got[(bi * m + i) * n + j];
                    assert_eq!(g, away, "case {c} [{bi}][{i}][{j}]: exact f32 is {exact}");
                    distinct += usize::from(away != exact && away != truncated);
                }
            }
        }
        assert!(
            distinct * 2 > batch * m * n,
            "case {c}: {distinct} distinct"
        );
    }
}

/// Products of small integers (exact in TF32, so every order and rounding gives the exact
/// product) on the TF32 tensor cores under pipelines of 2 to 4 stages of 8 to 64, swizzled
/// and not: the staging ring, the f32 tiles' swizzle and the fragment layouts of both B
/// layouts, with contractions ending inside a stage and inside the ring.
#[test]
fn tf32_products_are_exact_on_integers_under_every_pipeline() {
    let cases = [
        ((1, 64, 32, 64), false, false),
        ((2, 70, 40, 65), true, true),
        ((1, 20, 17, 24), false, true),
        ((3, 33, 1, 17), false, false),
        ((2, 24, 200, 40), false, false),
        ((1, 70, 96, 66), true, false),
    ];
    let mut failures = Vec::new();
    for (stages, kt, swizzle) in [(2, 8, true), (3, 32, true), (4, 64, true), (2, 64, false)] {
        let mut target = TargetInfo::h200();
        let gpu = target.gpu.as_mut().expect("a GPU");
        // As if kernels could declare all of a block's shared memory, so that every ring fits.
        gpu.static_shared_bytes = gpu.shared_memory_per_block;
        gpu.mma_stages = stages;
        gpu.mma_swizzle = swizzle;
        for tile in &mut gpu.mma_tiles {
            tile.k = kt;
        }
        for (c, &((batch, m, k, n), at, bt)) in cases.iter().enumerate() {
            let what = format!("case {c}, {stages} stages of {kt}, swizzled {swizzle}");
            let src = product_text((batch, m, k, n), at, bt, false);
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let args: Vec<Literal> = f
                .param_types()
                .iter()
                .enumerate()
                .map(|(p, t)| {
                    let v: Vec<f64> = (0..t.numel())
                        .map(|e| ((e * (3 + 2 * p) + p) % 9) as f64 - 4.0)
                        .collect();
                    Literal::from_f64s(t.clone(), &v).unwrap()
                })
                .collect();
            match compile_and_run(&f, &[], &tf32_options(), &target, &args) {
                Ok((got, rep)) => {
                    if rep.launches.get(&MapKind::GemmMma) != Some(&1) {
                        failures.push(format!("{what}: {:?}", rep.launches));
                    }
                    // Exact: the reference's exact sum, bit for bit.
                    let want = kiln_reference::eval(&f, &args).unwrap();
                    if want[0].to_f64s() != got[0].to_f64s() {
                        failures.push(format!("{what}: not the exact product"));
                    }
                }
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A convolution (a product of patches) under the TF32 policy runs on the tensor cores and
/// agrees with the reference on rounded operands.
#[test]
fn tf32_convolutions_agree_with_the_reference_on_rounded_operands() {
    let src = "func @main(%0: f32[2,7,7,3], %1: f32[3,3,3,16]) -> f32[2,7,7,16] {\n  %2 = convolution %0, %1 {window_strides = [1, 1], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 3, 1, 2], kernel_dims = [3, 2, 0, 1], output_dims = [0, 3, 1, 2]} : f32[2,7,7,16]\n  return %2\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let args = random_args(&f, 11);
    let (got, rep) = compile_and_run(&f, &[], &tf32_options(), &TargetInfo::h200(), &args).unwrap();
    assert!(rep.launches.contains_key(&MapKind::GemmMma), "{rep:?}");
    let want_args: Vec<Literal> = args.iter().map(rounded).collect();
    check_outputs(&f, &want_args, &got).unwrap();
    assert!(check_outputs(&f, &args, &got).is_err());
}

/// One warp's TF32 tile (`ldmatrix` of f32 words, `cvt.rna.tf32.f32`, `mma.m16n8k8`) on known
/// matrices whose elements lie off TF32 (three quarters of an ulp and half of one past small
/// integers): D is `round(A) x round(B) + C` as the emulator's `mma` sums (the exact products
/// in order, C, one rounding to f32), so a wrong fragment layout of A, B, C or D fails;
/// without its roundings the tile computes the truncated operands' product instead (what the
/// tensor cores make of unrounded registers), and fails too.
#[test]
fn a_tf32_warp_tile_computes_the_rounded_product() {
    let k = kiln_kernel::gpu::mma::warp_tile_tf32(TargetInfo::h200().sums);
    kiln_kernel::gpu::print::verify(&k, TargetInfo::h200().gpu.as_ref().unwrap()).unwrap();
    // Small integers plus three quarters of a TF32 ulp (rounds up, truncates down), or plus
    // half of one (a tie: away from zero).
    let frac = |x: usize| match x % 3 {
        0 => 0.0,
        1 => 0.75,
        _ => 0.5,
    };
    let a = |r: usize, c: usize| {
        let base = ((r * 3 + c * 5) % 7) as f64 + 1.0;
        let ulp = 2f64.powi(base.log2().floor() as i32 - 10);
        base + frac(r + c) * ulp
    };
    let b = |kk: usize, n: usize| {
        let base = ((kk * 7 + n * 2) % 5) as f64 - 2.0;
        let ulp = 2f64.powi(base.abs().max(1.0).log2().floor() as i32 - 10);
        base + if base == 0.0 {
            0.0
        } else {
            frac(kk + n) * ulp * base.signum()
        }
    };
    let cm = |r: usize, n: usize| (r * 8 + n) as f64 * 0.5;
    let buf = |name: &str, data: Vec<f64>| Buffer {
        name: name.into(),
        dtype: DType::F32,
        data: data.into_iter().map(|x| V::F(x as f32 as f64)).collect(),
    };
    let a_buf = buf("%a", (0..128).map(|i| a(i / 8, i % 8)).collect());
    // B by columns: element `n * 8 + k` is B's (k, n).
    let b_buf = buf("%b", (0..64).map(|i| b(i % 8, i / 8)).collect());
    let c_buf = buf("%c", (0..128).map(|i| cm(i / 8, i % 8)).collect());
    let run = |k: &GpuKernel| {
        let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
        run_kernel(k, &[&a_buf, &b_buf, &c_buf], &mut out).unwrap();
        out.remove(0).data
    };
    let product = |op: &dyn Fn(f64) -> f64| {
        let mut d = Vec::new();
        for r in 0..16 {
            for n in 0..8 {
                let s: f64 = (0..8).map(|kk| op(a(r, kk)) * op(b(kk, n))).sum();
                d.push(V::F(((s + cm(r, n)) as f32).into()));
            }
        }
        d
    };
    let round = |x: f64| f64::from(tf32::round(x as f32));
    let truncate = |x: f64| f64::from(tf32::truncate(x as f32));
    assert_eq!(run(&k), product(&round));
    assert_ne!(product(&round), product(&truncate));
    let mut skipped = k.clone();
    skipped
        .body
        .retain(|s| !matches!(s, Stmt::RoundTf32 { .. }));
    assert_eq!(run(&skipped), product(&truncate));
}

/// The emulator refuses a TF32 `mma` whose registers do not match its shape, and an
/// `ldmatrix` of f32 words transposed; the verifier says so before it runs.
#[test]
fn malformed_tf32_statements_are_errors() {
    let gpu = TargetInfo::h200().gpu.unwrap();
    let mut k = kiln_kernel::gpu::mma::warp_tile_tf32(TargetInfo::h200().sums);
    for s in &mut k.body {
        if let Stmt::Mma { b, .. } = s {
            b.push(b[0]);
        }
    }
    let e = kiln_kernel::gpu::print::verify(&k, &gpu).unwrap_err();
    assert!(e.contains("an mma") && e.contains("tf32"), "{e}");
    let zeros = |n: usize| Buffer {
        name: "%x".into(),
        dtype: DType::F32,
        data: vec![V::F(0.0); n],
    };
    let (a, b, c) = (zeros(128), zeros(64), zeros(128));
    let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("an mma"), "{e}");
    let mut k = kiln_kernel::gpu::mma::warp_tile_tf32(TargetInfo::h200().sums);
    for s in &mut k.body {
        if let Stmt::LdMatrix { trans, .. } = s {
            *trans = true;
        }
    }
    let e = kiln_kernel::gpu::print::verify(&k, &gpu).unwrap_err();
    assert!(e.contains("ldmatrix.trans"), "{e}");
    let e = run_kernel(&k, &[&a, &b, &c], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("an ldmatrix.trans"), "{e}");
}

/// The mapped TF32 product, printed: f32 shared arrays, `ldmatrix` of 4 registers,
/// `cvt.rna.tf32`, `mma.m16n8k8.tf32`.
#[test]
fn a_tf32_product_prints_its_statements() {
    let src = product_text((1, 64, 64, 64), false, false, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let text = kiln_kernel::gpu::print::describe_gpu(&f, &tf32_options()).unwrap();
    for needle in [
        "(gemm-mma)",
        "shared0: f32[",
        "= ldmatrix.x4 shared0",
        "= cvt.rna.tf32 r",
        "= mma.m16n8k8.tf32 {",
    ] {
        assert!(text.contains(needle), "no {needle:?} in\n{text}");
    }
    let exact = kiln_kernel::gpu::print::describe_gpu(&f, &Options::default()).unwrap();
    assert!(
        exact.contains("(gemm-tiled)") && !exact.contains("mma."),
        "{exact}"
    );
}
