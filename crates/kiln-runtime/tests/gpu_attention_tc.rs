//! bf16 and f16 attention on the tensor cores (`gpu/map/attention_mma.rs`) on the emulator,
//! against the reference interpreter under `kiln_reference::accuracy`'s bound and a bf16
//! tolerance of its own; its fallback (separate launches) where the target has no such
//! mapping; and planted bugs in the mapped kernel, which the comparison or the emulator
//! catches.

use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::{GpuProgram, MapKind, Shuffle, Stmt};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, compile_and_run, run_program};

mod attention;

use attention::{Case, Logits, inputs, run_checked, within};

fn case(shape: (usize, usize, usize, usize, usize), logits: Logits) -> Case {
    attention::case(shape, "bf16", logits)
}

fn parse(c: &Case) -> Func {
    let src = c.text();
    kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// The reference's result of `c` computed in f32 from the same (bf16 or f16) arguments: the
/// attention the tensor cores approximate (they round only the probabilities, and the
/// result; the traced program rounds every op of its softmax to its dtype, which the
/// accuracy module's bound covers).
fn f32_reference(c: &Case, args: &[Literal]) -> Literal {
    let f = parse(&Case { dtype: "f32", ..*c });
    let wide: Vec<Literal> = args
        .iter()
        .map(|a| {
            let ty = kiln_ir::TensorType::new(kiln_ir::DType::F32, a.ty().shape.clone());
            Literal::from_f64s(ty, &a.to_f64s()).expect("f32 holds bf16 and f16")
        })
        .collect();
    kiln_reference::eval(&f, &wide)
        .expect("the reference")
        .remove(0)
}

/// Whether `got` is within the tolerance of `want`, the f32 reference ([`f32_reference`]):
/// `2⁻⁶` (bf16; `2⁻⁹` f16) of the largest magnitude of V, a few roundings of the
/// probabilities (a relative `2⁻⁹`, `2⁻¹²` for f16) and of the result; NaN exactly where the
/// reference has NaN.
fn close(dtype: &str, args: &[Literal], got: &Literal, want: &Literal) -> Result<(), String> {
    let tol = if dtype == "f16" {
        2f64.powi(-9)
    } else {
        2f64.powi(-6)
    };
    within(args, got, want, tol)
}

/// Runs `c` on the emulator for `target`: the launches it mapped to, or why it failed
/// (compared with the f32 reference on the tensor cores, [`f32_reference`]).
fn run(c: &Case, target: &TargetInfo, seed: u64) -> Result<Vec<MapKind>, String> {
    run_against(c, target, seed, false)
}

/// [`run`], compared with the reference of the traced program itself where `traced` (a
/// softmax computed as traced, each op rounded to bf16).
fn run_against(
    c: &Case,
    target: &TargetInfo,
    seed: u64,
    traced: bool,
) -> Result<Vec<MapKind>, String> {
    let f = parse(c);
    let args = inputs(&f, seed);
    let (got, mut kinds) = run_checked(&f, &c.text(), target, &args)?;
    let want = if traced {
        kiln_reference::eval(&f, &args)
            .map_err(|e| e.to_string())?
            .remove(0)
    } else {
        f32_reference(c, &args)
    };
    close(c.dtype, &args, &got[0], &want)?;
    kinds.sort();
    Ok(kinds)
}

/// Heads of 64 and 128, and of 40 and 8 (not multiples of 16: padded with zeros); keys that
/// are not a multiple of the step (and one key); query rows that are not a multiple of the
/// block's; several batches; causal masks, masks that leave queries nothing in their first
/// steps or nothing at all (NaN rows); a bias read from memory; V given transposed (staged
/// through registers); output columns that are not a multiple of 16; f16 too: each one
/// launch on the tensor cores, within the tolerance of the reference.
#[test]
fn tensor_core_attention_agrees_with_the_reference() {
    let f16 = |shape, logits| Case {
        dtype: "f16",
        ..case(shape, logits)
    };
    let cases = [
        case((2, 40, 70, 64, 64), Logits::Scaled),
        case((1, 65, 130, 64, 64), Logits::Causal),
        case((2, 17, 100, 128, 128), Logits::Scaled),
        case((1, 70, 150, 128, 64), Logits::Causal),
        case((1, 20, 45, 40, 24), Logits::Scaled),
        case((3, 9, 1, 8, 8), Logits::Scaled),
        case((1, 20, 100, 16, 12), Logits::Shifted(40)),
        case((1, 20, 100, 16, 12), Logits::Shifted(90)),
        case((2, 17, 45, 32, 16), Logits::Bias),
        case((2, 21, 77, 24, 40), Logits::VTransposed),
        f16((2, 33, 90, 64, 64), Logits::Causal),
        f16((1, 20, 50, 48, 20), Logits::Scaled),
    ];
    let target = TargetInfo::h200();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        match run(c, &target, 400 + i as u64) {
            Ok(kinds) if kinds == [MapKind::AttentionMma] => {}
            Ok(kinds) => failures.push(format!("{c:?}: launches {kinds:?}")),
            Err(e) => failures.push(format!("{c:?}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Deeper rings and shorter steps (dynamic shared memory allowed): the same results.
#[test]
fn rings_and_steps_of_other_sizes_agree_too() {
    for (i, (keys, stages)) in [(16, 2), (32, 3), (64, 4), (128, 2)]
        .into_iter()
        .enumerate()
    {
        let mut t = TargetInfo::h200();
        let gpu = t.gpu.as_mut().expect("a GPU");
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        (gpu.mma_attention_keys, gpu.mma_attention_stages) = (keys, stages);
        for (j, c) in [
            case((2, 40, 200, 64, 64), Logits::Causal),
            case((1, 20, 77, 32, 48), Logits::Bias),
        ]
        .iter()
        .enumerate()
        {
            let kinds = run(c, &t, 500 + (2 * i + j) as u64)
                .unwrap_or_else(|e| panic!("{keys} keys, {stages} stages, {c:?}: {e}"));
            assert_eq!(kinds, [MapKind::AttentionMma], "{c:?}");
        }
    }
}

/// Without the tensor-core mapping (turned off, or a head wider than it holds), bf16
/// attention runs as separate launches: the scores on the tensor cores, the softmax in
/// bf16, the chained product on the tensor cores; and agrees with the reference too.
#[test]
fn without_the_mapping_attention_runs_as_separate_launches() {
    let mut off = TargetInfo::h200();
    off.gpu.as_mut().expect("a GPU").mma_attention_keys = 0;
    let want = |kinds: &[MapKind]| {
        kinds.iter().filter(|&&k| k == MapKind::GemmMma).count() == 2
            && !kinds.contains(&MapKind::AttentionMma)
    };
    let kinds = run_against(&case((2, 40, 70, 64, 64), Logits::Causal), &off, 600, true).unwrap();
    assert!(want(&kinds), "{kinds:?}");
    let wide = case((1, 20, 50, 160, 24), Logits::Scaled);
    let kinds = run_against(&wide, &TargetInfo::h200(), 601, true).unwrap();
    assert!(want(&kinds), "{kinds:?}");
}

/// `c` lowered for the H200: its attention launch's program, and the inputs of its step
/// (the arguments, and the constants the kernel reads as buffers).
fn attention_program(c: &Case, args: &[Literal]) -> (GpuProgram, Vec<Buffer>) {
    let f = parse(c);
    let target = TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    let l =
        kiln_kernel::pipeline::lower_program(&f, &[], &opts, &target, None, &mut |_| {}).unwrap();
    let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
    let step = plan
        .kernel_steps()
        .find(|s| s.program.launches[0].kind == MapKind::AttentionMma)
        .expect("a tensor-core attention");
    let bufs = step
        .inputs
        .iter()
        .map(|(v, _)| {
            let lit = match l.func.params.iter().position(|p| p == v) {
                Some(i) => args[i].clone(),
                None => l
                    .func
                    .insts
                    .iter()
                    .find_map(|inst| match &inst.op {
                        kiln_ir::Op::Constant { value } if inst.results.contains(v) => {
                            Some(value.clone())
                        }
                        _ => None,
                    })
                    .expect("an argument or a constant"),
            };
            Buffer::from_literal(&format!("{v:?}"), &lit)
        })
        .collect();
    (step.program.clone(), bufs)
}

/// `body` with `f` applied to every statement, nested ones too (`f` returns the statements
/// that replace one).
fn rewrite(body: &[Stmt], f: &mut dyn FnMut(&Stmt) -> Option<Vec<Stmt>>) -> Vec<Stmt> {
    let mut out = Vec::new();
    for s in body {
        if let Some(new) = f(s) {
            out.extend(new);
            continue;
        }
        out.push(match s {
            Stmt::For {
                reg,
                start,
                end,
                step,
                body,
            } => Stmt::For {
                reg: *reg,
                start: start.clone(),
                end: end.clone(),
                step: step.clone(),
                body: rewrite(body, f),
            },
            Stmt::If { cond, body } => Stmt::If {
                cond: cond.clone(),
                body: rewrite(body, f),
            },
            s => s.clone(),
        });
    }
    out
}

/// Bugs planted in the mapped kernel: a quad's second shuffle dropped (each lane's row
/// maximum and sum of half the quad), the P fragment's halves swapped (keys 8-15 multiplied
/// by V's rows 0-7), the output's rescale dropped, the ring's wait dropped (a step's copies
/// read while in flight): each is caught, by the comparison or by the emulator.
#[test]
fn planted_bugs_are_caught() {
    // Unmasked, so that later steps raise the rows' maxima (and the output is rescaled).
    let c = case((1, 64, 200, 64, 64), Logits::Scaled);
    let f = parse(&c);
    let args = inputs(&f, 700);
    let want = [f32_reference(&c, &args)];
    let (program, bufs) = attention_program(&c, &args);
    let try_run = |p: &GpuProgram| -> Result<(), String> {
        let ins: Vec<&Buffer> = bufs.iter().collect();
        let ty = &p.launches[0].outputs[0].1;
        let mut outs = vec![Buffer::zeros("out", ty)];
        run_program(p, &ins, &mut outs).map_err(|e| e.to_string())?;
        let got = outs[0].to_literal(ty).map_err(|e| e.to_string())?;
        close(c.dtype, &args, &got, &want[0])
    };
    try_run(&program).expect("the kernel as mapped");
    let plant = |f: &mut dyn FnMut(&Stmt) -> Option<Vec<Stmt>>| {
        let mut p = program.clone();
        p.launches[0].body = rewrite(&p.launches[0].body, f);
        assert_ne!(p, program, "nothing planted");
        p
    };
    let mut planted = Vec::new();
    // The xor-2 shuffles and the combines that follow them.
    let mut skip = false;
    planted.push((
        "no second quad shuffle",
        plant(&mut |s| {
            if std::mem::take(&mut skip) {
                return Some(Vec::new());
            }
            matches!(
                s,
                Stmt::Shuffle {
                    mode: Shuffle::Xor(2),
                    ..
                }
            )
            .then(|| {
                skip = true;
                Vec::new()
            })
        }),
    ));
    // The second product's A fragments (made of the first product's accumulators): the
    // score tiles' halves swapped.
    let mut scores = Vec::new();
    rewrite(&program.launches[0].body, &mut |s| {
        if let Stmt::Mma { d, .. } = s {
            scores.push(d[0]);
        }
        None
    });
    planted.push((
        "P's halves swapped",
        plant(&mut |s| match s {
            Stmt::Mma { a, .. } if scores.contains(&a[0]) => {
                let mut s = s.clone();
                if let Stmt::Mma { a, .. } = &mut s {
                    a.rotate_left(4);
                }
                Some(vec![s])
            }
            _ => None,
        }),
    ));
    planted.push((
        "no rescale of the output",
        plant(&mut |s| match s {
            Stmt::Eval { expr, scalars, .. }
                if scalars.len() == 2
                    && format!("{expr:?}").starts_with("Op { op: Kind(Multiply)") =>
            {
                Some(Vec::new())
            }
            _ => None,
        }),
    ));
    let mut first = true;
    planted.push((
        "no wait for the ring's copies",
        plant(&mut |s| match s {
            // Q's, the first, stays.
            Stmt::CopyWait { .. } if std::mem::replace(&mut first, false) => None,
            Stmt::CopyWait { .. } => Some(Vec::new()),
            _ => None,
        }),
    ));
    for (what, p) in &planted {
        assert!(try_run(p).is_err(), "{what}: not caught");
    }
}

/// Attention over batches and heads (`[batch, heads, rows, head]`, two batch dimensions, as
/// `nn::scaled_dot_product_attention` traces it), plain and causal: one launch on the tensor
/// cores, the logits' variables set per batch and head, within the tolerance.
#[test]
fn batches_of_heads_run_as_one_launch() {
    let text = |causal: bool| {
        let (b, h, m, keys, k) = (2, 3, 20, 70, 64);
        let s = format!("bf16[{b},{h},{m},{keys}]");
        let dots = "lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1]";
        let logits = if causal {
            format!(
                "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 3}} : i64[{b},{h},{m},{keys}]\n  %22 = iota {{iota_dimension = 2}} : i64[{b},{h},{m},{keys}]\n  %23 = compare %21, %22 {{comparison_direction = LE}} : pred[{b},{h},{m},{keys}]\n  %24 = constant {{value = -inf}} : bf16[]\n  %25 = broadcast_in_dim %24 {{broadcast_dimensions = []}} : {s}\n  %6 = select %23, %20, %25 : {s}\n"
            )
        } else {
            format!("  %6 = multiply %3, %5 : {s}\n")
        };
        format!(
            "func @main(%0: bf16[{b},{h},{m},{k}], %1: bf16[{b},{h},{keys},{k}], %2: bf16[{b},{h},{keys},{k}]) -> bf16[{b},{h},{m},{k}] {{
  %3 = dot_general %0, %1 {{{dots}, lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]}} : {s}
  %4 = constant {{value = 0.125}} : bf16[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
{logits}  %7 = constant {{value = -inf}} : bf16[]
  %8 = reduce %6, %7 {{dimensions = [3], kind = max}} : bf16[{b},{h},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1, 2]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : bf16[]
  %13 = reduce %11, %12 {{dimensions = [3], kind = add}} : bf16[{b},{h},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1, 2]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{{dots}, lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : bf16[{b},{h},{m},{k}]
  return %16
}}
"
        )
    };
    let target = TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    for (i, causal) in [false, true].into_iter().enumerate() {
        let src = text(causal);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let args = inputs(&f, 800 + i as u64);
        let (got, rep) = compile_and_run(&f, &[], &opts, &target, &args).unwrap();
        let kinds: Vec<MapKind> = rep.launches.keys().copied().collect();
        assert_eq!(kinds, [MapKind::AttentionMma], "causal {causal}");
        kiln_reference::accuracy::check_outputs(&f, &args, &got).unwrap();
        // The f32 reference of the same program on the same arguments.
        let wide_src = src.replace("bf16", "f32");
        let wide = kiln_ir::parse_func_text(&wide_src).unwrap();
        let wide_args: Vec<Literal> = args
            .iter()
            .map(|a| {
                let ty = kiln_ir::TensorType::new(kiln_ir::DType::F32, a.ty().shape.clone());
                Literal::from_f64s(ty, &a.to_f64s()).unwrap()
            })
            .collect();
        let want = kiln_reference::eval(&wide, &wide_args).unwrap().remove(0);
        close("bf16", &args, &got[0], &want).unwrap_or_else(|e| panic!("causal {causal}: {e}"));
    }
}

/// bf16 attention whose result is added to a residual: the chained product's epilogue is
/// more than the conversion back to bf16, so fusion leaves the product unchained, and the
/// softmax (an epilogue of the scores in bf16) runs as a launch of its own over the f32
/// scores; the result agrees with the reference.
#[test]
fn attention_with_a_residual_runs_unchained() {
    let c = case((2, 20, 70, 32, 32), Logits::Scaled);
    let src = c.text().replace(
        "  return %16\n",
        "  %17 = add %16, %0 : bf16[2,20,32]\n  return %17\n",
    );
    let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let args = inputs(&f, 900);
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, &TargetInfo::h200(), &args)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(rep.fallbacks.is_empty(), "{:?}", rep.fallbacks);
    assert!(
        !rep.launches.contains_key(&MapKind::AttentionMma),
        "{:?}",
        rep.launches
    );
    kiln_reference::accuracy::check_outputs(&f, &args, &got).unwrap();
}
