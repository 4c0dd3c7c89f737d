//! Testing helpers for users: gradient checking against finite differences.

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{DType, Literal};

/// Checks `grad(f)` at `x` against central finite differences, element by element. `x`'s
/// leaves should be f64 for a meaningful check; `eps` is the step and `tol` the allowed
/// |analytic - numeric| / (1 + |numeric|). Returns the number of entries checked.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, custom_vjp, testing::check_grads};
/// let x = Tensor::from_vec(vec![0.5f64, -1.0, 2.0], [3]).unwrap();
/// let n = check_grads(|x: &Tensor| (x.sin() * x).sum_all(), &x, 1e-6, 1e-6).unwrap();
/// assert_eq!(n, 3);
/// // A wrong rule (twice d(x²)/dx) is caught.
/// let square = custom_vjp(|x: &Tensor| x * x, |x: &Tensor, _y: &Tensor, g: &Tensor| g * x * 4.0);
/// let err = check_grads(|x: &Tensor| square(x).sum_all(), &x, 1e-6, 1e-6).unwrap_err();
/// assert!(err.message.contains("finite difference"), "{err}");
/// ```
#[track_caller]
pub fn check_grads<I: Tree>(f: impl Fn(&I) -> Tensor, x: &I, eps: f64, tol: f64) -> Result<usize> {
    let loc = kiln_ir::Loc::caller();
    let g = crate::grad(&f)(x);
    let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
    let grads: Vec<Tensor> = g.leaf_vec().into_iter().cloned().collect();
    let value = |ls: &[Tensor]| -> Result<f64> { f(&x.with_leaves(ls)).item() };
    let mut n = 0;
    for (k, leaf) in leaves.iter().enumerate() {
        let lit = leaf.to_literal()?;
        let gk = grads[k].to_literal()?.to_f64s();
        let base = lit.to_f64s();
        for j in 0..base.len() {
            let shifted = |d: f64| -> Result<Vec<Tensor>> {
                let mut v = base.clone();
                v[j] += d;
                let mut ls = leaves.clone();
                ls[k] = Tensor::new(
                    Literal::from_f64s(lit.ty().clone(), &v)
                        .map_err(|e| Error::at("check_grads", e.0, loc))?,
                );
                Ok(ls)
            };
            let numeric = (value(&shifted(eps)?)? - value(&shifted(-eps)?)?) / (2.0 * eps);
            if (gk[j] - numeric).abs() > tol * (1.0 + numeric.abs()) {
                return Err(Error::new(
                    "check_grads",
                    format!(
                        "leaf {k} element {j}: gradient {} but finite difference {numeric}",
                        gk[j]
                    ),
                ));
            }
            n += 1;
        }
        if lit.dtype() != DType::F64 && n == 0 {
            return Err(Error::new("check_grads", "nothing to check"));
        }
    }
    Ok(n)
}
