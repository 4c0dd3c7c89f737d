//! Programs whose matrix products read their operands and store their results through
//! strides (`kiln_kernel::ir::Strides`, `kiln_kernel::ir::Store`), shared by the emulator's
//! test (`gpu_strided.rs`) and the PTX test of the same kernels (`kiln-codegen-llvm`'s
//! `ptx_strided.rs`, by path).

/// Attention's heads split out of one projection `[b, s, 3 h d]` of dtype `dt` (queries, keys,
/// values side by side): the scores `q kᵀ` in `acc` (`[b, h, s, s]`, keys transposed by the
/// layout), softmaxed when `softmax`, times the values (in `acc`), merged back to
/// `[b, s, h d]`. Without the softmax both products are plain: the first reads Q and K
/// through strides (two batch dimensions), the second V, and stores its result into the
/// merged layout. With `acc` wider than `dt` (bf16 operands, f32 products) the scores are
/// converted back to `dt` before the second product.
pub fn heads(b: usize, s: usize, h: usize, d: usize, dt: &str, acc: &str, softmax: bool) -> String {
    let w = h * d;
    let mut t = format!(
        "func @main(%0: {dt}[{b},{s},{}]) -> {acc}[{b},{s},{w}] {{\n",
        3 * w
    );
    let mut next = 0;
    // Appends `%n = {inst} : {ty}` and returns `n`.
    let mut inst = |t: &mut String, text: String, ty: String| {
        next += 1;
        *t += &format!("  %{next} = {text} : {ty}\n");
        next
    };
    let heads = format!("{dt}[{b},{s},{h},{d}]");
    // Columns `start..start + w` of the projection, split into heads.
    let mut split = |t: &mut String, start: usize| {
        let x = inst(
            t,
            format!(
                "slice %0 {{start_indices = [0, 0, {start}], limit_indices = [{b}, {s}, {}], strides = [1, 1, 1]}}",
                start + w
            ),
            format!("{dt}[{b},{s},{w}]"),
        );
        inst(t, format!("reshape %{x}"), heads.clone())
    };
    let dims = "lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]";
    let q = split(&mut t, 0);
    let k = split(&mut t, w);
    let v = split(&mut t, 2 * w);
    let q = inst(
        &mut t,
        format!("transpose %{q} {{permutation = [0, 2, 1, 3]}}"),
        format!("{dt}[{b},{h},{s},{d}]"),
    );
    let k = inst(
        &mut t,
        format!("transpose %{k} {{permutation = [0, 2, 3, 1]}}"),
        format!("{dt}[{b},{h},{d},{s}]"),
    );
    let v = inst(
        &mut t,
        format!("transpose %{v} {{permutation = [0, 2, 1, 3]}}"),
        format!("{dt}[{b},{h},{s},{d}]"),
    );
    let scores = format!("{acc}[{b},{h},{s},{s}]");
    let rows = format!("{acc}[{b},{h},{s}]");
    let mut p = inst(
        &mut t,
        format!("dot_general %{q}, %{k} {{{dims}}}"),
        scores.clone(),
    );
    if softmax {
        let lo = inst(&mut t, "constant {value = -inf}".into(), format!("{acc}[]"));
        let mx = inst(
            &mut t,
            format!("reduce %{p}, %{lo} {{dimensions = [3], kind = max}}"),
            rows.clone(),
        );
        let mxb = inst(
            &mut t,
            format!("broadcast_in_dim %{mx} {{broadcast_dimensions = [0, 1, 2]}}"),
            scores.clone(),
        );
        let z = inst(&mut t, format!("subtract %{p}, %{mxb}"), scores.clone());
        let e = inst(&mut t, format!("exponential %{z}"), scores.clone());
        let zero = inst(&mut t, "constant {value = 0.0}".into(), format!("{acc}[]"));
        let sum = inst(
            &mut t,
            format!("reduce %{e}, %{zero} {{dimensions = [3], kind = add}}"),
            rows.clone(),
        );
        let sb = inst(
            &mut t,
            format!("broadcast_in_dim %{sum} {{broadcast_dimensions = [0, 1, 2]}}"),
            scores.clone(),
        );
        p = inst(&mut t, format!("divide %{e}, %{sb}"), scores.clone());
    }
    if acc != dt {
        p = inst(
            &mut t,
            format!("convert %{p}"),
            format!("{dt}[{b},{h},{s},{s}]"),
        );
    }
    let o = inst(
        &mut t,
        format!("dot_general %{p}, %{v} {{{dims}}}"),
        format!("{acc}[{b},{h},{s},{d}]"),
    );
    let o = inst(
        &mut t,
        format!("transpose %{o} {{permutation = [0, 2, 1, 3]}}"),
        format!("{acc}[{b},{s},{h},{d}]"),
    );
    let o = inst(
        &mut t,
        format!("reshape %{o}"),
        format!("{acc}[{b},{s},{w}]"),
    );
    t += &format!("  return %{o}\n}}\n");
    t
}

/// A product of slices: A the columns `a_from..a_from + k` of `[m, k + a_extra]`, B the
/// columns `b_from..b_from + n` of `[k, n + b_extra]` (`a_from <= a_extra`, `b_from <=
/// b_extra`), both of dtype `dt`, the product in
/// `acc`. Offsets and row distances that are not multiples of 16 bytes keep `cp.async` from
/// the operand: it is staged through registers.
pub fn sliced(
    (m, k, n): (usize, usize, usize),
    (a_from, a_extra): (usize, usize),
    (b_from, b_extra): (usize, usize),
    (dt, acc): (&str, &str),
) -> String {
    format!(
        "func @main(%0: {dt}[{m},{}], %1: {dt}[{k},{}]) -> {acc}[{m},{n}] {{
  %2 = slice %0 {{start_indices = [0, {a_from}], limit_indices = [{m}, {}], strides = [1, 1]}} : {dt}[{m},{k}]
  %3 = slice %1 {{start_indices = [0, {b_from}], limit_indices = [{k}, {}], strides = [1, 1]}} : {dt}[{k},{n}]
  %4 = dot_general %2, %3 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : {acc}[{m},{n}]
  return %4
}}
",
        k + a_extra,
        n + b_extra,
        a_from + k,
        b_from + n,
    )
}
