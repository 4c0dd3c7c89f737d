//! Products of a causal mask's zeros (attention's probabilities kept for the backward pass, and
//! their gradient), shared by the GPU emulator's test of the steps left out
//! (`gpu_zero_steps.rs`) and the PTX test of them (`kiln-codegen-llvm`'s `ptx_zero_steps.rs`,
//! by path).

/// Causal attention's probabilities `P` from queries and keys `[b, h, s, d]`, kept and read by
/// three products: `P V`, `Pᵀ dO` (P as A, transposed) and `dOᵀ P` (P as B).
#[allow(dead_code)]
pub fn probabilities(b: usize, h: usize, s: usize, d: usize) -> String {
    let t = |dims: &str| format!("f32[{b},{h},{dims}]");
    let (sd, ss, ds) = (
        t(&format!("{s},{d}")),
        t(&format!("{s},{s}")),
        t(&format!("{d},{s}")),
    );
    let dot = |i: usize, x: usize, y: usize, cx: usize, cy: usize, ty: &str| {
        format!(
            "  %{i} = dot_general %{x}, %{y} {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [{cx}], rhs_contracting_dimensions = [{cy}]}} : {ty}\n"
        )
    };
    let mut p =
        format!("func @main(%0: {sd}, %1: {sd}, %2: {sd}, %3: {sd}) -> ({sd}, {sd}, {ds}) {{\n");
    p += &dot(4, 0, 1, 3, 3, &ss);
    p += &format!("  %5 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]\n");
    p += &format!("  %6 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]\n");
    p += &format!("  %7 = compare %5, %6 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]\n");
    p += "  %8 = constant {value = 0.125} : f32[]\n";
    p += &format!("  %9 = broadcast_in_dim %8 {{broadcast_dimensions = []}} : {ss}\n");
    p += &format!("  %10 = multiply %4, %9 : {ss}\n");
    p += "  %11 = constant {value = -inf} : f32[]\n";
    p += &format!("  %12 = broadcast_in_dim %11 {{broadcast_dimensions = []}} : {ss}\n");
    p += &format!("  %13 = select %7, %10, %12 : {ss}\n");
    p += &format!("  %14 = reduce %13, %11 {{dimensions = [3], kind = max}} : f32[{b},{h},{s}]\n");
    p += &format!("  %15 = broadcast_in_dim %14 {{broadcast_dimensions = [0, 1, 2]}} : {ss}\n");
    p += &format!("  %16 = subtract %13, %15 : {ss}\n");
    p += &format!("  %17 = exponential %16 : {ss}\n");
    p += "  %18 = constant {value = 0.0} : f32[]\n";
    p += &format!("  %19 = reduce %17, %18 {{dimensions = [3], kind = add}} : f32[{b},{h},{s}]\n");
    p += &format!("  %20 = broadcast_in_dim %19 {{broadcast_dimensions = [0, 1, 2]}} : {ss}\n");
    p += &format!("  %21 = divide %17, %20 : {ss}\n");
    p += &dot(22, 21, 2, 3, 2, &sd);
    p += &dot(23, 21, 3, 2, 2, &sd);
    p += &dot(24, 3, 21, 2, 2, &ds);
    p += "  return %22, %23, %24\n}\n";
    p
}

/// The scores' gradient `dS = select(col <= row, G, 0) * 0.125` of `G` `[b, h, s, s]` (f32,
/// converted to `inp` when it is not), times the keys (`dS K`) and, transposed, the queries
/// (`dSᵀ Q`), both of dtype `inp`, the products f32.
#[allow(dead_code)]
pub fn score_gradient(b: usize, h: usize, s: usize, d: usize, inp: &str) -> String {
    let sd = format!("{inp}[{b},{h},{s},{d}]");
    let ss = format!("f32[{b},{h},{s},{s}]");
    let out = format!("f32[{b},{h},{s},{d}]");
    let ds = if inp == "f32" {
        "  %14 = add %11, %7 : {ss}\n".replace("{ss}", &ss)
    } else {
        format!("  %14 = convert %11 : {inp}[{b},{h},{s},{s}]\n")
    };
    format!(
        "func @main(%0: {ss}, %1: {sd}, %2: {sd}) -> ({out}, {out}) {{
  %3 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]
  %4 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]
  %5 = compare %3, %4 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]
  %6 = constant {{value = 0.0}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : {ss}
  %8 = select %5, %0, %7 : {ss}
  %9 = constant {{value = 0.125}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : {ss}
  %11 = multiply %8, %10 : {ss}
{ds}  %12 = dot_general %14, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : {out}
  %13 = dot_general %14, %2 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {out}
  return %12, %13
}}
"
    )
}
