//! Products over windows and contractions: matrix products, 2-D convolution and pooling.

use crate::ops::{broadcast_shapes, ty_str};
use crate::promote::promote_types;
use crate::tensor::Tensor;
use crate::trace::{apply, lift_all};
use kiln_ir::{Combiner, DType, Loc, Op, TensorType};

impl Tensor {
    /// Matrix product with NumPy semantics: batch dimensions broadcast; a 1-D operand is a
    /// vector.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], [2, 2]).unwrap();
    /// assert_eq!(a.matmul(&b).to_vec::<f32>().unwrap(), [19.0, 22.0, 43.0, 50.0]);
    /// let v = Tensor::from_vec(vec![1.0f32, 1.0], [2]).unwrap();
    /// assert_eq!(a.matmul(&v).to_vec::<f32>().unwrap(), [3.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn matmul(&self, o: &Tensor) -> Tensor {
        self.matmul_as(o, None, "matmul")
    }

    /// [`Tensor::matmul`] with the products and sums computed in `dtype`, a wider type than the
    /// operands' that holds their values (JAX's `preferred_element_type`): `bf16 @ bf16` in
    /// `f32`, `i8 @ i8` in `i32`. The result has that type.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let a = Tensor::from_vec(vec![100i8, 100], [1, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![100i8, 100], [2, 1]).unwrap();
    /// let c = a.matmul_in(&b, DType::I32);
    /// assert_eq!((c.dtype(), c.to_vec::<i32>().unwrap()), (DType::I32, vec![20000]));
    /// ```
    #[track_caller]
    pub fn matmul_in(&self, o: &Tensor, dtype: DType) -> Tensor {
        self.matmul_as(o, Some(dtype), "matmul_in")
    }

    #[track_caller]
    fn matmul_as(&self, o: &Tensor, preferred: Option<DType>, name: &str) -> Tensor {
        if let Some(e) = self.error().or(o.error()) {
            return Tensor::failed(e.clone());
        }
        let d = promote_types(self.dtype(), o.dtype());
        let (x, o) = (&self.cast(d), &o.cast(d));
        let (ra, rb) = (x.rank(), o.rank());
        if ra == 0 || rb == 0 {
            return self.fail(
                name,
                format!(
                    "matmul needs at least 1-D operands, got {} @ {}",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        }
        let l = lift_all(&[x, o]);
        let a = if ra == 1 {
            l[0].unsqueeze(0)
        } else {
            l[0].clone()
        };
        let b = if rb == 1 {
            l[1].unsqueeze(1)
        } else {
            l[1].clone()
        };
        let (sa, sb) = (a.shape(), b.shape());
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if k != k2 {
            return self.fail(
                name,
                format!(
                    "{} @ {}: contracting dimensions {k} and {k2} differ",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        }
        if sb.len() == 2 && sa.len() > 2 {
            // A batch of rows times one matrix (`x @ w` of a layer): one product over all the
            // rows, no broadcast copy of the matrix, and a gradient of the matrix that sums
            // over the rows in the product itself.
            let op = Op::DotGeneral {
                lhs_batching_dimensions: vec![],
                rhs_batching_dimensions: vec![],
                lhs_contracting_dimensions: vec![sa.len() as i64 - 1],
                rhs_contracting_dimensions: vec![0],
            };
            let types = preferred.map(|d| {
                let mut shape = sa[..sa.len() - 1].to_vec();
                shape.push(n);
                vec![TensorType::new(d, shape)]
            });
            let r = apply(op, &[&a, &b], types, name, Loc::caller()).remove(0);
            return if rb == 1 { r.squeeze(-1) } else { r };
        }
        let Some(batch) = broadcast_shapes(&sa[..sa.len() - 2], &sb[..sb.len() - 2]) else {
            return self.fail(
                name,
                format!(
                    "{} @ {}: batch dimensions do not broadcast",
                    ty_str(self),
                    ty_str(o)
                ),
            );
        };
        let full = |x: &Tensor, r: usize, c: usize| {
            let mut s = batch.clone();
            s.extend([r, c]);
            x.broadcast_to(&s)
        };
        let (a, b) = (full(&a, m, k), full(&b, k, n));
        let nb = batch.len() as i64;
        let bd: Vec<i64> = (0..nb).collect();
        let op = Op::DotGeneral {
            lhs_batching_dimensions: bd.clone(),
            rhs_batching_dimensions: bd,
            lhs_contracting_dimensions: vec![nb + 1],
            rhs_contracting_dimensions: vec![nb],
        };
        let types = preferred.map(|d| {
            let mut shape = batch.clone();
            shape.extend([m, n]);
            vec![TensorType::new(d, shape)]
        });
        let r = apply(op, &[&a, &b], types, name, Loc::caller()).remove(0);
        let r = if rb == 1 { r.squeeze(-1) } else { r };
        if ra == 1 { r.squeeze(-2) } else { r }
    }

    /// 2-D convolution, NCHW input and OIHW weight (PyTorch layout).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(9, DType::F32).reshape(&[1, 1, 3, 3]);
    /// let w = Tensor::ones(DType::F32, [1, 1, 2, 2]);
    /// let y = x.conv2d(&w, (1, 1), (0, 0), (1, 1), 1);
    /// assert_eq!(y.shape(), [1, 1, 2, 2]);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [8.0, 12.0, 20.0, 24.0]);
    /// ```
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> Tensor {
        if self.rank() != 4 || weight.rank() != 4 {
            return self.fail(
                "conv2d",
                format!(
                    "conv2d needs NCHW input and OIHW weight, got {} and {}",
                    ty_str(self),
                    ty_str(weight)
                ),
            );
        }
        let ws = weight.shape();
        if let Some(t) = self.window_check("conv2d", (ws[2], ws[3]), padding, dilation) {
            return t;
        }
        let p = |x: usize| (x as i64, x as i64);
        let op = Op::Convolution {
            window_strides: vec![stride.0 as i64, stride.1 as i64],
            padding: vec![p(padding.0), p(padding.1)],
            lhs_dilation: vec![1, 1],
            rhs_dilation: vec![dilation.0 as i64, dilation.1 as i64],
            feature_group_count: groups as i64,
            input_dims: vec![0, 1, 2, 3],
            kernel_dims: vec![0, 1, 2, 3],
            output_dims: vec![0, 1, 2, 3],
            batch_group_count: 1,
        };
        apply(op, &[self, weight], None, "conv2d", Loc::caller()).remove(0)
    }

    /// An error unless a `window` (dilated by `dilation`) fits in this NCHW input's spatial
    /// dimensions padded by `padding` on each side (PyTorch refuses such windows; the IR would
    /// give an empty result).
    #[track_caller]
    fn window_check(
        &self,
        name: &str,
        window: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Option<Tensor> {
        let s = self.shape();
        let padded = (s[2] + 2 * padding.0, s[3] + 2 * padding.1);
        let span = |k: usize, d: usize| d * k.saturating_sub(1) + 1;
        let (wh, ww) = (span(window.0, dilation.0), span(window.1, dilation.1));
        if wh <= padded.0 && ww <= padded.1 {
            return None;
        }
        Some(self.fail(
            name,
            format!(
                "the {wh}x{ww} window (kernel {}x{}, dilation {}x{}) is larger than the {}x{} \
                 input padded to {}x{} ({})",
                window.0,
                window.1,
                dilation.0,
                dilation.1,
                s[2],
                s[3],
                padded.0,
                padded.1,
                ty_str(self)
            ),
        ))
    }

    #[track_caller]
    fn pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        kind: Combiner,
        name: &str,
    ) -> Tensor {
        if self.rank() != 4 {
            return self.fail(
                name,
                format!("{name} needs an NCHW input, got {}", ty_str(self)),
            );
        }
        if let Some(t) = self.window_check(name, kernel, padding, (1, 1)) {
            return t;
        }
        let init = if kind == Combiner::Max {
            f64::NEG_INFINITY
        } else {
            0.0
        };
        let op = Op::ReduceWindow {
            window_dimensions: vec![1, 1, kernel.0 as i64, kernel.1 as i64],
            window_strides: vec![1, 1, stride.0 as i64, stride.1 as i64],
            base_dilations: vec![1; 4],
            window_dilations: vec![1; 4],
            padding: vec![
                (0, 0),
                (0, 0),
                (padding.0 as i64, padding.0 as i64),
                (padding.1 as i64, padding.1 as i64),
            ],
            kind,
        };
        apply(
            op,
            &[self, &self.like_scalar(init)],
            None,
            name,
            Loc::caller(),
        )
        .remove(0)
    }

    /// 2-D max pooling over NCHW input.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(16, DType::F32).reshape(&[1, 1, 4, 4]);
    /// let y = x.max_pool2d((2, 2), (2, 2), (0, 0));
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [5.0, 7.0, 13.0, 15.0]);
    /// ```
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Tensor {
        self.pool2d(kernel, stride, padding, Combiner::Max, "max_pool2d")
    }

    /// 2-D average pooling over NCHW input (padding counts as zeros in the average).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::arange(16, DType::F32).reshape(&[1, 1, 4, 4]);
    /// let y = x.avg_pool2d((2, 2), (2, 2), (0, 0));
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [2.5, 4.5, 10.5, 12.5]);
    /// ```
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Tensor {
        let s = self.pool2d(kernel, stride, padding, Combiner::Add, "avg_pool2d");
        s.div(&self.like_scalar((kernel.0 * kernel.1) as f64))
    }
}
