//! Products' operands read, and products stored, through strides ([`Strides`]): attention's
//! heads split out of `[batch, seq, heads * width]` and merged back into it, read and written
//! where they lie instead of copied out and back by kernels of their own.
//!
//! An operand is an expression over the product's kernel variables (0: batch, 1: row, 2:
//! column, 3: contraction; see [`super::gemm::operand_exprs`]). Through strides its element
//! is `offset + batch_offset(var 0) + row * ld + contraction` (or with row and contraction
//! swapped, stored transposed). With one batch dimension (after dropping extents of 1 and
//! merging dimensions that continue one another) that is a plain [`Expr::Load`], which every
//! mapping already reads as it reads an operand without strides. With several (attention's
//! batches and heads) the batch's digits, `(b / inner_d) mod e_d`, are written as quotients
//! alone: `Σ_d s_d · digit_d = Σ_d (b / inner_d) · (s_d - s_{d+1} · e_{d+1})` (the remainders
//! telescope), an [`Expr::Gather`] of terms `b / n` with constant coefficients. [`affine`]
//! reads both forms back, so the staging loops (`staging.rs`) copy a strided tile with
//! `cp.async` exactly when the strides keep every copy aligned, and load it element by
//! element through registers where they do not.

use super::*;
use crate::ir::Strides;

/// An operand's element as an affine function of the kernel variables and quotients of the
/// batch: element `off + Σ coef[v] · var v + Σ (var 0 / n) · s` over `divs`' `(n, s)`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Affine {
    pub input: usize,
    pub dtype: DType,
    pub coef: [i64; 4],
    pub divs: Vec<(i64, i64)>,
    pub off: i64,
}

impl Affine {
    /// The element's offset due to the batch, for the batch held in `batch`.
    pub fn batch_offset(&self, batch: Sc) -> Sc {
        self.divs.iter().fold(
            Sc::times(batch.clone(), Sc::Const(self.coef[0])),
            |s, &(n, k)| {
                Sc::plus(
                    s,
                    Sc::times(Sc::quot(batch.clone(), Sc::Const(n)), Sc::Const(k)),
                )
            },
        )
    }

    /// Whether every term but variable `fast`'s is a multiple of `e` elements (so that, `fast`
    /// stepping by `e` from a multiple of it, every run of `e` elements starts aligned to
    /// `e`).
    pub fn aligned(&self, fast: usize, e: i64) -> bool {
        (0..4).all(|v| v == fast || self.coef[v] % e == 0)
            && self.divs.iter().all(|&(_, k)| k % e == 0)
            && self.off % e == 0
    }
}

/// The batch's offset through `batch`'s `(extent, stride)`s, outermost first, as a coefficient
/// of the batch index and `(divisor, coefficient)` terms of its quotients (see the module's
/// documentation).
pub(super) fn batch_terms(batch: &[(usize, usize)]) -> (i64, Vec<(i64, i64)>) {
    // Extents of 1 dropped, dimensions continuing one another merged.
    let mut dims: Vec<(i64, i64)> = Vec::new();
    for &(e, s) in batch.iter().filter(|b| b.0 != 1) {
        let (e, s) = (e as i64, s as i64);
        match dims.last_mut() {
            Some(last) if last.1 == s * e => *last = (last.0 * e, s),
            _ => dims.push((e, s)),
        }
    }
    let Some(&(_, innermost)) = dims.last() else {
        return (0, Vec::new());
    };
    let mut divs = Vec::new();
    let mut inner = 1;
    for d in (0..dims.len()).rev() {
        if d + 1 < dims.len() {
            let (e1, s1) = dims[d + 1];
            inner *= e1;
            divs.push((inner, dims[d].1 - s1 * e1));
        }
    }
    divs.reverse();
    (innermost, divs)
}

/// Input `input`'s element through `s` at kernel variables `row_var` (the rows the product
/// orders first: A's `m`, B's `n`) and 3 (the contraction), its stored rows along the
/// contraction (`along_k`) or along `row_var`.
pub(super) fn strided_operand(
    input: usize,
    dtype: DType,
    s: &Strides,
    row_var: usize,
    along_k: bool,
) -> Expr {
    let (coef0, divs) = batch_terms(&s.batch);
    let mut coef = vec![0i64; 4];
    coef[0] = coef0;
    let ld = s.ld as i64;
    if along_k {
        coef[row_var] = ld;
        coef[3] = 1;
    } else {
        coef[row_var] = 1;
        coef[3] = ld;
    }
    let off = s.offset as i64;
    if divs.is_empty() {
        return Expr::Load {
            input,
            dtype,
            coef,
            off,
        };
    }
    let mut index: Vec<Idx> = (0..4).map(Idx::Var).collect();
    let mut strides = coef;
    for &(n, k) in &divs {
        index.push(Idx::Div(Box::new(Idx::Var(0)), n));
        strides.push(k);
    }
    index.push(Idx::Const(1));
    strides.push(off);
    Expr::Gather {
        input,
        dtype,
        index,
        strides,
    }
}

/// `expr` as an [`Affine`] function of the kernel variables, if it is a load with four
/// coefficients or a gather of variables, quotients of the batch and constants (the forms
/// [`strided_operand`] and [`super::gemm::operand_exprs`] build).
pub(super) fn affine(expr: &Expr) -> Option<Affine> {
    match expr {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } if coef.len() == 4 => Some(Affine {
            input: *input,
            dtype: *dtype,
            coef: [coef[0], coef[1], coef[2], coef[3]],
            divs: Vec::new(),
            off: *off,
        }),
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } if index.len() == strides.len() => {
            let mut a = Affine {
                input: *input,
                dtype: *dtype,
                coef: [0; 4],
                divs: Vec::new(),
                off: 0,
            };
            for (x, &k) in index.iter().zip(strides) {
                match x {
                    Idx::Var(v) if *v < 4 => a.coef[*v] += k,
                    Idx::Const(n) => a.off += n * k,
                    Idx::Div(q, n) if **q == Idx::Var(0) && *n > 0 => a.divs.push((*n, k)),
                    _ => return None,
                }
            }
            Some(a)
        }
        _ => None,
    }
}

/// The element of a product's result stored through `s` at batch `batch`, row `row` and
/// column `col` (rows of consecutive columns, `s.ld` apart).
pub(super) fn stored_at(s: &Strides, batch: Sc, row: Sc, col: Sc) -> Sc {
    let (coef0, divs) = batch_terms(&s.batch);
    let at = Affine {
        input: 0,
        dtype: DType::F32,
        coef: [coef0, 0, 0, 0],
        divs,
        off: s.offset as i64,
    };
    Sc::plus(
        Sc::plus(at.batch_offset(batch), Sc::Const(at.off)),
        Sc::plus(Sc::times(row, Sc::Const(s.ld as i64)), col),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch's offset through `terms`, as [`Affine::batch_offset`] computes it.
    fn offset((coef0, divs): &(i64, Vec<(i64, i64)>), b: i64) -> i64 {
        divs.iter().fold(b * coef0, |s, &(n, k)| s + (b / n) * k)
    }

    /// The quotient form is each batch's offset through its digits, for attention's heads
    /// and for dimensions that merge, repeat (stride 0) or have extent 1.
    #[test]
    fn batch_quotients_sum_to_the_digits_offsets() {
        let cases: Vec<Vec<(usize, usize)>> = vec![
            vec![(16, 98304), (4, 64)],
            vec![(2, 24), (3, 8), (4, 2)],
            vec![(4, 0), (3, 5)],
            vec![(1, 7), (5, 11), (1, 3)],
            vec![(2, 12), (6, 2)],
            vec![(1, 0)],
        ];
        for batch in cases {
            let terms = batch_terms(&batch);
            let total: usize = batch.iter().map(|b| b.0).product();
            for b in 0..total {
                let mut rest = b;
                let mut want = 0;
                for &(e, s) in batch.iter().rev() {
                    want += (rest % e) * s;
                    rest /= e;
                }
                assert_eq!(offset(&terms, b as i64), want as i64, "{batch:?} at {b}");
            }
        }
        // Merged: [2, 6] with strides 12, 2 is one dimension of stride 2.
        assert_eq!(batch_terms(&[(2, 12), (6, 2)]), (2, Vec::new()));
        // Heads: two quotient-free terms cannot say it; one quotient term does.
        assert_eq!(
            batch_terms(&[(16, 98304), (4, 64)]),
            (64, vec![(4, 98304 - 256)])
        );
    }

    /// A strided operand reads back as the affine function it was built from.
    #[test]
    fn strided_operands_read_back() {
        let s = Strides {
            offset: 256,
            batch: vec![(16, 98304), (4, 64)],
            ld: 768,
        };
        let e = strided_operand(1, DType::F32, &s, 2, true);
        let a = affine(&e).expect("affine");
        assert_eq!(a.coef, [64, 0, 768, 1]);
        assert_eq!(a.divs, vec![(4, 98304 - 256)]);
        assert_eq!(a.off, 256);
        assert!(a.aligned(3, 4));
        assert!(!a.aligned(3, 128));
        // One batch dimension: a plain load.
        let one = Strides {
            batch: vec![(8, 1000)],
            ..s
        };
        let e = strided_operand(0, DType::BF16, &one, 1, false);
        assert!(matches!(e, Expr::Load { .. }));
        assert_eq!(affine(&e).expect("affine").coef, [1000, 1, 0, 768]);
    }
}
