//! Matrix product programs in kiln's text form, shared by the GPU emulator's tests.

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
