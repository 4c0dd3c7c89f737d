//! Attention programs in kiln's text form, shared by the emulator's attention tests (register
//! tiles and a warp per row in `gpu_attention.rs`, the tensor cores in `gpu_attention_tc.rs`).

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

/// One attention: sizes `(batch, queries, keys, head, columns)`, the dtype, and how the
/// logits are made from the scores.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub shape: (usize, usize, usize, usize, usize),
    pub dtype: &'static str,
    pub logits: Logits,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Logits {
    /// `s / 8`.
    Scaled,
    /// `s / 8`, query `i` keeping keys `j <= i`.
    Causal,
    /// `s / 8`, query `i` keeping keys `j >= i + shift`.
    Shifted(i64),
    /// `s · 0.3 + bias[b, i, j]`, the bias a fourth input.
    Bias,
    /// `s / 8`, V given transposed (`[batch, columns, keys]`).
    VTransposed,
}

impl Case {
    pub fn text(&self) -> String {
        let (b, m, keys, k, n2) = self.shape;
        let dt = self.dtype;
        let s = format!("{dt}[{b},{m},{keys}]");
        let i = format!("i64[{b},{m},{keys}]");
        let p = format!("pred[{b},{m},{keys}]");
        let mask = |cond: String| {
            format!(
                "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n{cond}  %27 = constant {{value = -inf}} : {dt}[]\n  %28 = broadcast_in_dim %27 {{broadcast_dimensions = []}} : {s}\n  %6 = select %26, %20, %28 : {s}\n"
            )
        };
        let (scale, logits, bias) = match self.logits {
            Logits::Scaled | Logits::VTransposed => {
                ("0.125", format!("  %6 = multiply %3, %5 : {s}\n"), "")
            }
            Logits::Causal => (
                "0.125",
                mask(format!(
                    "  %26 = compare %21, %22 {{comparison_direction = LE}} : {p}\n"
                )),
                "",
            ),
            Logits::Shifted(shift) => (
                "0.125",
                mask(format!(
                    "  %23 = constant {{value = {shift}}} : i64[]\n  %24 = broadcast_in_dim %23 {{broadcast_dimensions = []}} : {i}\n  %25 = add %22, %24 : {i}\n  %26 = compare %21, %25 {{comparison_direction = GE}} : {p}\n"
                )),
                "",
            ),
            Logits::Bias => (
                "0.3",
                format!("  %20 = multiply %3, %5 : {s}\n  %6 = add %20, %30 : {s}\n"),
                ", %30: BIAS",
            ),
        };
        let bias = bias.replace("BIAS", &s);
        let (v, v_keys) = if self.logits == Logits::VTransposed {
            (format!("{dt}[{b},{n2},{keys}]"), 2)
        } else {
            (format!("{dt}[{b},{keys},{n2}]"), 1)
        };
        format!(
            "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{keys},{k}], %2: {v}{bias}) -> {dt}[{b},{m},{n2}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}
  %4 = constant {{value = {scale}}} : {dt}[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
{logits}  %7 = constant {{value = -inf}} : {dt}[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : {dt}[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : {dt}[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : {dt}[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [{v_keys}]}} : {dt}[{b},{m},{n2}]
  return %16
}}
"
        )
    }
}

/// The attention of `shape` in `dtype` with `logits`.
pub fn case(
    shape: (usize, usize, usize, usize, usize),
    dtype: &'static str,
    logits: Logits,
) -> Case {
    Case {
        shape,
        dtype,
        logits,
    }
}

/// Random arguments for `f` from `seed`, without special values.
pub fn inputs(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect()
}

/// `f` (of text `src`) run on the emulator for `target` on `args`: its results and the
/// launches it mapped to, or why it failed (an emulator error, a kernel that fell back to the
/// reference, or results outside the accuracy module's bound).
pub fn run_checked(
    f: &Func,
    src: &str,
    target: &TargetInfo,
    args: &[Literal],
) -> Result<(Vec<Literal>, Vec<MapKind>), String> {
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(f, &[], &opts, target, args).map_err(|e| e.to_string())?;
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    kiln_reference::accuracy::check_outputs(f, args, &got).map_err(|e| format!("{e}\n{src}"))?;
    let kinds = rep
        .launches
        .iter()
        .flat_map(|(&k, &n)| std::iter::repeat_n(k, n))
        .collect();
    Ok((got, kinds))
}

/// Whether `got` is within `tol` times the largest magnitude of V (`args[2]`, at least 1) of
/// `want`, element by element, NaN exactly where `want` has NaN.
pub fn within(args: &[Literal], got: &Literal, want: &Literal, tol: f64) -> Result<(), String> {
    let (g, w) = (got.to_f64s(), want.to_f64s());
    let v_max = args[2].to_f64s().iter().fold(0.0f64, |a, x| a.max(x.abs()));
    let tol = tol * v_max.max(1.0);
    for (e, (x, y)) in g.iter().zip(&w).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else {
            (x - y).abs() <= tol
        };
        if !ok {
            return Err(format!(
                "element {e}: {x}, the reference {y} (tolerance {tol})"
            ));
        }
    }
    Ok(())
}
