//! `reduce_region` with an elementwise body as one loop-nest kernel: an [`Expr::Fold`] whose
//! `k` accumulators run together over the reduced dimensions, the body applied as kernel
//! expressions, each result written as one of the kernel's outputs (the first as its body, the
//! others as [`Kernel::extra`] outputs) from one computation of the fold.
//!
//! Which targets take these kernels is [`TargetInfo::folds`] (the CPU's loop nests and the
//! GPU's mapping, `gpu/map/fold.rs`, both do); for a body this module cannot express (see
//! [`fold_body`]) the op is expanded into a tree of elementwise ops ([`crate::reduce_tree`]).

use crate::ir::{Ew, Expr, Extra, Fold, Idx, Kernel, Schedule};
use crate::key::{ValueKey, value_key};
use crate::lower::{NoKernel, elementwise_supported};
use crate::target::TargetInfo;
use crate::window::window_terms;
use kiln_ir::{DType, Func, Op, TensorType, strides};

/// `body` (a `reduce_region`'s, of `2k` scalar parameters and `k` results) as `k` kernel
/// expressions over [`Expr::Arg`]s `0..2k`, or why it cannot be: an op that is not
/// elementwise, one the kernels lack for its dtype, a small float or complex value, or a
/// constant that is not a scalar exactly held in an `f64`.
pub fn fold_body(body: &Func) -> Result<Vec<Expr>, NoKernel> {
    let mut vals: Vec<Option<Expr>> = vec![None; body.values.len()];
    for (slot, &p) in body.params.iter().enumerate() {
        let dtype = body.values[p.index()].dtype;
        vals[p.index()] = Some(Expr::Arg { slot, dtype });
    }
    let plain = |d: DType| !d.is_complex() && d.mini().is_none();
    for inst in &body.insts {
        let [r] = inst.results[..] else {
            return Err(NoKernel("a body op of more than one result"));
        };
        let dtype = body.values[r.index()].dtype;
        if !plain(dtype) {
            return Err(NoKernel("a body computing small floats or complex numbers"));
        }
        let e = match &inst.op {
            Op::Constant { value } => {
                if value.ty().rank() != 0 {
                    return Err(NoKernel("a body constant that is not a scalar"));
                }
                Expr::Const {
                    dtype,
                    value: exact_f64(value)
                        .ok_or(NoKernel("a body constant an f64 does not hold exactly"))?,
                }
            }
            op if op.props().contains(kiln_ir::Props::ELEMENTWISE) => {
                let args: Vec<Expr> = inst
                    .operands
                    .iter()
                    .map(|o| vals[o.index()].clone().expect("verified SSA"))
                    .collect();
                let ew = Ew::of(op);
                let operand_dtype = args[ew.typed_operand()].dtype();
                if !plain(operand_dtype) || !elementwise_supported(op.kind(), operand_dtype) {
                    return Err(NoKernel("a body op the kernels lack for its dtype"));
                }
                Expr::Op {
                    op: ew,
                    dtype,
                    args,
                }
            }
            _ => return Err(NoKernel("a body op that is not elementwise")),
        };
        vals[r.index()] = Some(e);
    }
    Ok(body
        .outputs
        .iter()
        .map(|o| vals[o.index()].clone().expect("verified SSA"))
        .collect())
}

/// The scalar `value` as an `f64`, when that holds it exactly.
fn exact_f64(value: &kiln_ir::Literal) -> Option<f64> {
    let d = value.dtype();
    if d.is_float() {
        return value.to_f64s().first().copied();
    }
    let i = *value.to_i64s().first()?;
    let x = i as f64;
    (x as i64 == i && x.abs() < (1u64 << 53) as f64).then_some(x)
}

/// The kernel of `reduce_region(inputs..., inits...)` (operand types `x`) over `dimensions`
/// with body `body`: loop variables over the kept dimensions (in order), then one per reduced
/// dimension; result `j` is [`Expr::Fold`] result `j`, the first as the body, the others as
/// extra outputs (their pointer slots after the operands').
pub fn lower_reduce_region(
    dimensions: &[i64],
    body: &Func,
    x: &[TensorType],
) -> Result<Kernel, NoKernel> {
    let k = x.len() / 2;
    let body = fold_body(body)?;
    let t0 = &x[0];
    let reduced = |d: usize| dimensions.contains(&(d as i64));
    let kept: Vec<usize> = (0..t0.rank()).filter(|&d| !reduced(d)).collect();
    let r = kept.len();
    let shape: Vec<usize> = kept.iter().map(|&d| t0.shape[d]).collect();
    // The variable of each input dimension.
    let mut var_of = vec![0; t0.rank()];
    let mut vars = Vec::new();
    let (mut o, mut red) = (0, r);
    for (d, v) in var_of.iter_mut().enumerate() {
        if reduced(d) {
            *v = red;
            vars.push((red, t0.shape[d]));
            red += 1;
        } else {
            *v = o;
            o += 1;
        }
    }
    let st = strides(&t0.shape);
    let mut coef = vec![0i64; red];
    for (d, &v) in var_of.iter().enumerate() {
        coef[v] += st[d] as i64;
    }
    let elems = (0..k)
        .map(|j| Expr::Load {
            input: j,
            dtype: x[j].dtype,
            coef: coef.clone(),
            off: 0,
        })
        .collect();
    let inits = (0..k)
        .map(|j| Expr::Load {
            input: k + j,
            dtype: x[k + j].dtype,
            coef: vec![0; red],
            off: 0,
        })
        .collect();
    let fold = Box::new(Fold {
        inits,
        vars,
        elems,
        body,
        in_order: false,
    });
    let result = |j: usize| Expr::Fold {
        fold: fold.clone(),
        result: j,
    };
    Ok(Kernel {
        schedule: Schedule::Nest,
        out: TensorType::new(x[k].dtype, shape.clone()),
        vars: red,
        body: result(0),
        extra: (1..k)
            .map(|j| Extra {
                out: TensorType::new(x[k + j].dtype, shape.clone()),
                body: result(j),
                slot: x.len() + j - 1,
            })
            .collect(),
    })
}

/// The kernel of `reduce_window_region` `op` (operand types `x`, result 0 of type `out`): a
/// fold in order ([`Fold::in_order`]) per output position over the window's positions,
/// row-major, from the inits, as the reference folds a window, so that any body gives its
/// results bit for bit. A window position in the padding or a dilation hole reads the init
/// values as its elements (StableHLO pads with them). Loop variables: the output's
/// dimensions, then one per window dimension.
pub fn lower_reduce_window_region(
    op: &Op,
    x: &[TensorType],
    out: &TensorType,
) -> Result<Kernel, NoKernel> {
    let Op::ReduceWindowRegion {
        window_dimensions: wd,
        window_strides: ws,
        base_dilations: bd,
        window_dilations: wdl,
        padding,
        body,
    } = op
    else {
        return Err(NoKernel("not a reduce_window_region"));
    };
    let body = fold_body(body)?;
    let k = x.len() / 2;
    let r = out.rank();
    let vars = r + r;
    let (conds, index) = window_terms(r, &x[0].shape, ws, bd, wdl, padding);
    let init = |j: usize| Expr::Load {
        input: k + j,
        dtype: x[k + j].dtype,
        coef: vec![0; vars],
        off: 0,
    };
    // Each index clamped into the operand (a no-op where the conditions hold), so that the
    // element may be read where they do not and the init selected
    // ([`crate::kernel::speculatable`]): the loop over positions folding side by side then
    // has no branch. (Not for an empty operand, which has no element to read.)
    let index: Vec<Idx> = if x[0].numel() > 0 {
        (index.into_iter().zip(&x[0].shape))
            .map(|(i, &n)| Idx::Clamp(Box::new(i), 0, n as i64 - 1))
            .collect()
    } else {
        index
    };
    let elems = (0..k)
        .map(|j| {
            let at = Expr::Gather {
                input: j,
                dtype: x[j].dtype,
                index: index.clone(),
                strides: strides(&x[j].shape).iter().map(|&s| s as i64).collect(),
            };
            if conds.is_empty() {
                at
            } else {
                Expr::Guard {
                    conds: conds.clone(),
                    then: Box::new(at),
                    otherwise: Box::new(init(j)),
                }
            }
        })
        .collect();
    let fold = Box::new(Fold {
        inits: (0..k).map(init).collect(),
        vars: (0..r).map(|d| (r + d, wd[d] as usize)).collect(),
        elems,
        body,
        in_order: true,
    });
    let result = |j: usize| Expr::Fold {
        fold: fold.clone(),
        result: j,
    };
    Ok(Kernel {
        schedule: Schedule::Nest,
        out: TensorType::new(x[k].dtype, out.shape.clone()),
        vars,
        body: result(0),
        extra: (1..k)
            .map(|j| Extra {
                out: TensorType::new(x[k + j].dtype, out.shape.clone()),
                body: result(j),
                slot: x.len() + j - 1,
            })
            .collect(),
    })
}

/// Whether `f`'s `reduce_region` or `reduce_window_region` instruction `op` becomes a fold
/// kernel on `target`: the target takes fold kernels ([`TargetInfo::folds`]) and the body is
/// one [`fold_body`] expresses.
///
/// A window of any size folds rather than expanding into slices ([`crate::reduce_tree`]):
/// on the Zen 4 the expansion of argmax pooling ran 14-29 ns a window element (1 x 4 to
/// 1 x 256 windows, 3 x 3 ones) and compiled in 0.08-6.3 s, where the fold kernel, even
/// one window after another in scalar code, ran 2.7-5.5 ns an element and compiled in 20-40
/// ms (docs/performance.md, "thirty-fourth session").
pub fn folds(op: &Op, target: &TargetInfo) -> bool {
    match op {
        Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => {
            target.folds() && fold_body(body).is_ok()
        }
        _ => false,
    }
}

/// The key a fold goes by in schedules and the emitter's computed values: that of its result
/// 0, so that the nodes of its results (in the kernel's several outputs) name one fold. Any
/// other expression's own [`value_key`].
pub fn fold_key(e: &Expr) -> ValueKey {
    match e {
        Expr::Fold { fold, result } if *result != 0 => value_key(&Expr::Fold {
            fold: fold.clone(),
            result: 0,
        }),
        _ => value_key(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;
    use crate::pipeline::prepare;

    /// An argmax of `dtype` values over the rows of a `[4, 64]` input.
    fn argmax(dtype: &str) -> Func {
        let src = format!(
            "func @main(%0: {dtype}[4,64], %1: {dtype}[]) -> ({dtype}[4], i32[4]) {{
  %2 = iota {{iota_dimension = 1}} : i32[4,64]
  %3 = constant {{value = 0}} : i32[]
  %4, %5 = reduce_region %0, %2, %1, %3 {{dimensions = [1], body = func @arg(%0: {dtype}[], %1: i32[], %2: {dtype}[], %3: i32[]) -> ({dtype}[], i32[]) {{
      %4 = compare %2, %0 {{comparison_direction = GT}} : pred[]
      %5 = compare %2, %0 {{comparison_direction = EQ}} : pred[]
      %6 = compare %3, %1 {{comparison_direction = LT}} : pred[]
      %7 = and %5, %6 : pred[]
      %8 = or %4, %7 : pred[]
      %9 = select %8, %2, %0 : {dtype}[]
      %10 = select %8, %3, %1 : i32[]
      return %9, %10
    }}}} : {dtype}[4], i32[4]
  return %4, %5
}}
"
        );
        kiln_ir::parse_func_text(&src).expect("valid IR")
    }

    fn reduce_regions(f: &Func) -> usize {
        f.insts
            .iter()
            .filter(|i| matches!(i.op, Op::ReduceRegion { .. }))
            .count()
    }

    #[test]
    fn cpu_and_gpu_targets_both_fold() {
        let f = argmax("f32");
        let opts = Options::default();
        let cpu = prepare(&f, &opts, &TargetInfo::reference()).expect("prepared");
        assert_eq!(reduce_regions(&cpu), 1, "{cpu}");
        let gpu = prepare(&f, &opts, &TargetInfo::h200()).expect("prepared");
        assert_eq!(reduce_regions(&gpu), 1, "{gpu}");
    }

    #[test]
    fn a_fold_kernel_writes_every_result_from_one_fold() {
        let f = argmax("f32");
        let inst = f
            .insts
            .iter()
            .find(|i| matches!(i.op, Op::ReduceRegion { .. }))
            .expect("a reduce_region");
        let x: Vec<TensorType> = (inst.operands.iter())
            .map(|o| f.values[o.index()].clone())
            .collect();
        let Op::ReduceRegion { dimensions, body } = &inst.op else {
            panic!("found above")
        };
        let k = lower_reduce_region(dimensions, body, &x).expect("a kernel");
        assert_eq!(k.out, TensorType::new(DType::F32, [4]));
        assert_eq!(k.extra.len(), 1);
        assert_eq!(k.extra[0].out, TensorType::new(DType::I32, [4]));
        assert_eq!(k.extra[0].slot, 4);
        assert_eq!(fold_key(&k.body), fold_key(&k.extra[0].body));
        assert_ne!(value_key(&k.body), value_key(&k.extra[0].body));
    }

    #[test]
    fn complex_numbers_keep_the_tree() {
        let src = "func @main(%0: c64[4,8], %1: c64[]) -> c64[4] {
  %2 = reduce_region %0, %1 {dimensions = [1], body = func @b(%0: c64[], %1: c64[]) -> c64[] {
      %2 = add %0, %1 : c64[]
      return %2
    }} : c64[4]
  return %2
}
";
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let Op::ReduceRegion { body, .. } = &f.insts[0].op else {
            panic!("not the reduce_region")
        };
        assert!(fold_body(body).is_err());
        let opts = Options::default();
        let cpu = prepare(&f, &opts, &TargetInfo::reference()).expect("prepared");
        assert_eq!(reduce_regions(&cpu), 0, "{cpu}");
    }
}
