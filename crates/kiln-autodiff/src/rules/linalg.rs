//! The VJPs of `cholesky` and `triangular_solve` (see their specs), built from matrix products
//! (`dot_general` batched over the leading dimensions), triangular solves and triangle masks.

use crate::Result;
use kiln_ir::{Builder, ComparisonDirection as Cmp, DType, Op, TensorType, TransposeA, ValueId};

fn ty(b: &Builder, v: ValueId) -> TensorType {
    b.ty(v).expect("rules only see defined values").clone()
}

/// The batched matrix product `op(x) op(y)`, `op` transposing the last two dimensions where
/// `tx` (`ty`) says; the leading dimensions are a batch.
fn matmul(b: &mut Builder, x: ValueId, tx: bool, y: ValueId, ty_: bool) -> Result<ValueId> {
    let r = ty(b, x).rank() as i64;
    let batch: Vec<i64> = (0..r - 2).collect();
    Ok(b.inst(
        Op::DotGeneral {
            lhs_batching_dimensions: batch.clone(),
            rhs_batching_dimensions: batch,
            lhs_contracting_dimensions: vec![if tx { r - 2 } else { r - 1 }],
            rhs_contracting_dimensions: vec![if ty_ { r - 1 } else { r - 2 }],
        },
        &[x, y],
    )?)
}

/// `x` with its last two dimensions swapped.
fn transpose(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let r = ty(b, x).rank() as i64;
    let mut perm: Vec<i64> = (0..r - 2).collect();
    perm.extend([r - 1, r - 2]);
    Ok(b.transpose(x, &perm)?)
}

/// Whether each element of `x`'s matrices has its row `dir` its column (`GE`: in the lower
/// triangle, `GT`: strictly below the diagonal, `EQ`: on it, ...), as a `pred` of `x`'s shape.
fn triangle(b: &mut Builder, x: ValueId, dir: Cmp) -> Result<ValueId> {
    let t = ty(b, x);
    let r = t.rank() as i64;
    let it = TensorType::new(DType::I32, t.shape.clone());
    let row = b.inst_typed(
        Op::Iota {
            iota_dimension: r - 2,
        },
        &[],
        it.clone(),
    )?;
    let col = b.inst_typed(
        Op::Iota {
            iota_dimension: r - 1,
        },
        &[],
        it,
    )?;
    Ok(b.compare(row, col, dir)?)
}

/// `x` where `keep`, zero elsewhere.
fn masked(b: &mut Builder, keep: ValueId, x: ValueId) -> Result<ValueId> {
    let t = ty(b, x);
    let z = b.full(&t, 0.0)?;
    Ok(b.select(keep, x, z)?)
}

/// `Φ(x)`: the lower triangle of `x`'s matrices with half their diagonal.
fn phi(b: &mut Builder, x: ValueId) -> Result<ValueId> {
    let below = triangle(b, x, Cmp::Gt)?;
    let diag = triangle(b, x, Cmp::Eq)?;
    let t = ty(b, x);
    let half = b.full(&t, 0.5)?;
    let hx = b.binary(Op::Multiply {}, x, half)?;
    let on_diag = masked(b, diag, hx)?;
    Ok(b.select(below, x, on_diag)?)
}

fn solve(
    b: &mut Builder,
    a: ValueId,
    x: ValueId,
    left_side: bool,
    lower: bool,
    unit_diagonal: bool,
    transpose_a: TransposeA,
) -> Result<ValueId> {
    Ok(b.inst(
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        },
        &[a, x],
    )?)
}

/// The VJP of `cholesky`: with `l` the lower factor and `ḡ` its cotangent (lower triangle;
/// the zeros above the diagonal are constants), `s = l⁻ᵀ Φ(lᵀ ḡ) l⁻¹` is the cotangent of the
/// symmetric matrix factored, and the operand's is `Φ(s + sᵀ)`: the lower triangle, the only
/// one read, each element below the diagonal standing for itself and its mirror. The upper
/// factor is the transpose of the lower one of the transposed operand.
pub(crate) fn cholesky_vjp(
    b: &mut Builder,
    lower: bool,
    r: ValueId,
    g: ValueId,
) -> Result<ValueId> {
    let (l, g) = if lower {
        (r, g)
    } else {
        (transpose(b, r)?, transpose(b, g)?)
    };
    let keep = triangle(b, g, Cmp::Ge)?;
    let g = masked(b, keep, g)?;
    let ltg = matmul(b, l, true, g, false)?;
    let p = phi(b, ltg)?;
    let y = solve(b, l, p, true, true, false, TransposeA::Transpose)?;
    let s = solve(b, l, y, false, true, false, TransposeA::NoTranspose)?;
    let st = transpose(b, s)?;
    let sym = b.binary(Op::Add {}, s, st)?;
    let ga = phi(b, sym)?;
    if lower { Ok(ga) } else { transpose(b, ga) }
}

/// The VJP of `triangular_solve` with result `x` and cotangent `ḡ`: `b̄` solves the transposed
/// system (`op(a)ᵀ b̄ = ḡ`, or `b̄ op(a)ᵀ = ḡ`), and `op(a)`'s cotangent is `-b̄ xᵀ` (`-xᵀ b̄`
/// on the right), transposed back when `op` transposes, restricted to the triangle `a` is
/// read in (without the diagonal when it is a unit one).
pub(crate) fn triangular_solve_vjp(
    b: &mut Builder,
    attrs: (bool, bool, bool, TransposeA),
    a: ValueId,
    x: ValueId,
    g: ValueId,
) -> Result<(ValueId, ValueId)> {
    let (left_side, lower, unit_diagonal, transpose_a) = attrs;
    let flipped = match transpose_a {
        TransposeA::NoTranspose => TransposeA::Transpose,
        TransposeA::Transpose | TransposeA::Adjoint => TransposeA::NoTranspose,
    };
    let gb = solve(b, a, g, left_side, lower, unit_diagonal, flipped)?;
    let transposed = transpose_a != TransposeA::NoTranspose;
    // The product for op(a)'s cotangent, or its transpose for a's when op transposes.
    let prod = match (left_side, transposed) {
        (true, false) => matmul(b, gb, false, x, true)?,
        (true, true) => matmul(b, x, false, gb, true)?,
        (false, false) => matmul(b, x, true, gb, false)?,
        (false, true) => matmul(b, gb, true, x, false)?,
    };
    let neg = b.unary(Op::Negate {}, prod)?;
    let dir = match (lower, unit_diagonal) {
        (true, false) => Cmp::Ge,
        (true, true) => Cmp::Gt,
        (false, false) => Cmp::Le,
        (false, true) => Cmp::Lt,
    };
    let keep = triangle(b, neg, dir)?;
    let ga = masked(b, keep, neg)?;
    Ok((ga, gb))
}

/// The VJP of `lu` (`a = pᵀ l u`, `p` the permutation's matrix, held fixed): with `l̄` the
/// strict lower triangle of the factors' cotangent and `ū` the rest, `g = tril₋₁(lᵀ l̄) +
/// triu(ū uᵀ)` and `ā = pᵀ l⁻ᵀ g u⁻ᵀ` (from `l⁻¹ p ȧ u⁻¹ = l⁻¹ l̇ + u̇ u⁻¹`, strictly lower
/// plus upper). The pivots and the permutation are integers; without a cotangent of the
/// factors, `a` gets none.
pub(crate) fn lu_vjp(
    b: &mut Builder,
    r: &[ValueId],
    g: Option<ValueId>,
) -> Result<Option<ValueId>> {
    let Some(g) = g else {
        return Ok(None);
    };
    let (packed, perm) = (r[0], r[2]);
    let t = ty(b, packed);
    let below = triangle(b, packed, Cmp::Gt)?;
    let diag = triangle(b, packed, Cmp::Eq)?;
    let upper = triangle(b, packed, Cmp::Le)?;
    let one = b.full(&t, 1.0)?;
    let strict = masked(b, below, packed)?;
    let l = b.select(diag, one, strict)?;
    let u = masked(b, upper, packed)?;
    let gl = masked(b, below, g)?;
    let gu = masked(b, upper, g)?;
    let ltg = matmul(b, l, true, gl, false)?;
    let lower_part = masked(b, below, ltg)?;
    let gut = matmul(b, gu, false, u, true)?;
    let upper_part = masked(b, upper, gut)?;
    let gsum = b.binary(Op::Add {}, lower_part, upper_part)?;
    let y = solve(b, packed, gsum, true, true, true, TransposeA::Transpose)?;
    let z = solve(b, packed, y, false, false, false, TransposeA::Transpose)?;
    // pᵀ z with p[i][j] = (perm[i] == j).
    let rank = t.rank() as i64;
    let it = TensorType::new(DType::I32, t.shape.clone());
    let rows = b.inst_typed(
        Op::BroadcastInDim {
            broadcast_dimensions: (0..rank - 1).collect(),
        },
        &[perm],
        it.clone(),
    )?;
    let cols = b.inst_typed(
        Op::Iota {
            iota_dimension: rank - 1,
        },
        &[],
        it,
    )?;
    let hit = b.compare(rows, cols, Cmp::Eq)?;
    let zero = b.full(&t, 0.0)?;
    let p = b.select(hit, one, zero)?;
    Ok(Some(matmul(b, p, true, z, false)?))
}
