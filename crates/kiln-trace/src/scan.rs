//! Running sums and products along an axis ([`Tensor::cumsum`], [`Tensor::cumprod`]), as a
//! parallel prefix: ⌈log2 n⌉ steps, step k adding (or multiplying) each element's value from
//! 2^k places before it (a shifted copy: `pad` in front, cropped behind), so the work is
//! `n log n` elementwise operations that fuse into one loop per step, and every output is a
//! sum of at most ⌈log2 n⌉ levels of partial sums (an error growing with log n, as a tree's).
//! Differentiable through the ops it is made of.

use crate::composite::composite;
use crate::tensor::Tensor;
use kiln_ir::Loc;

impl Tensor {
    /// The running sum along `axis`: element i is the sum of elements 0..=i (`reverse`: of
    /// i..n). Integer tensors sum in their own dtype (wrapping), as NumPy's do.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [4]).unwrap();
    /// assert_eq!(x.cumsum(0, false).to_vec::<i32>().unwrap(), [1, 3, 6, 10]);
    /// assert_eq!(x.cumsum(0, true).to_vec::<i32>().unwrap(), [10, 9, 7, 4]);
    /// ```
    #[track_caller]
    pub fn cumsum(&self, axis: isize, reverse: bool) -> Tensor {
        let loc = Loc::caller();
        composite("cumsum", loc, || self.prefix(axis, reverse, "cumsum", 0.0))
    }

    /// The running product along `axis`: element i is the product of elements 0..=i
    /// (`reverse`: of i..n).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    /// assert_eq!(x.cumprod(1, false).to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 12.0]);
    /// ```
    #[track_caller]
    pub fn cumprod(&self, axis: isize, reverse: bool) -> Tensor {
        let loc = Loc::caller();
        composite("cumprod", loc, || {
            self.prefix(axis, reverse, "cumprod", 1.0)
        })
    }

    /// The prefix combination by `+` (`identity` 0) or `*` (1).
    fn prefix(&self, axis: isize, reverse: bool, name: &str, identity: f64) -> Tensor {
        let d = match self.axis(axis, name) {
            Ok(d) => d,
            Err(t) => return t,
        };
        let n = self.shape()[d] as i64;
        let mut x = self.clone();
        let mut k = 1i64;
        while k < n {
            let mut pads = vec![(0i64, 0i64); self.rank()];
            pads[d] = if reverse { (-k, k) } else { (k, -k) };
            let shifted = x.pad(&pads, identity);
            x = if identity == 0.0 {
                x.add(&shifted)
            } else {
                x.mul(&shifted)
            };
            k *= 2;
        }
        x
    }
}
