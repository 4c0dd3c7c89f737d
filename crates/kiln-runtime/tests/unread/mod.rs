//! The causal mask's scores read by two masked kernels, shared by the GPU emulator's test of
//! the tiles left unread (`gpu_unread.rs`) and the PTX test of them (`kiln-codegen-llvm`'s
//! `ptx_unread.rs`, by path).

/// Scores `S = Q Kᵀ` of queries and keys `[b, h, s, d]` of dtype `inp` read by two kernels,
/// each through the causal mask `col <= row`, so that `S` (f32) is stored and no reader uses
/// it above the diagonal.
pub fn two_readers(b: usize, h: usize, s: usize, d: usize, inp: &str) -> String {
    let sd = format!("{inp}[{b},{h},{s},{d}]");
    let ss = format!("f32[{b},{h},{s},{s}]");
    let rows = format!("f32[{b},{h},{s}]");
    format!(
        "func @main(%0: {sd}, %1: {sd}) -> ({ss}, {rows}) {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]}} : {ss}
  %3 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]
  %4 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]
  %5 = compare %3, %4 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]
  %6 = constant {{value = 0.5}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : {ss}
  %8 = multiply %2, %7 : {ss}
  %9 = constant {{value = 0.0}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : {ss}
  %12 = select %5, %2, %10 : {ss}
  %13 = select %5, %8, %10 : {ss}
  %14 = reduce %12, %9 {{dimensions = [3], kind = add}} : {rows}
  return %13, %14
}}
"
    )
}
