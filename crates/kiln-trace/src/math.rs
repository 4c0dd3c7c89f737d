//! Elementwise math of tensors: exponentials, logarithms, roots, trigonometry, rounding,
//! bitwise operations and shifts, activation functions.

use crate::promote::{inexact, promote_types};
use crate::tensor::Tensor;
use kiln_ir::Op;

impl Tensor {
    /// Elementwise negation.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, -2], [2]).unwrap();
    /// assert_eq!(x.neg().to_vec::<i32>().unwrap(), [-1, 2]);
    /// ```
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        self.op1(Op::Negate {}, "neg")
    }
    /// Elementwise e^x.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap().exp().to_vec::<f32>().unwrap();
    /// assert_eq!(x[0], 1.0);
    /// assert!((x[1] - std::f32::consts::E).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn exp(&self) -> Tensor {
        self.float_op1(Op::Exponential {}, "exp")
    }
    /// Elementwise natural logarithm.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, std::f32::consts::E], [2]).unwrap();
    /// let y = x.log().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1.0).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn log(&self) -> Tensor {
        self.float_op1(Op::Log {}, "log")
    }
    /// Elementwise ln(1 + x).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1e-10], [2]).unwrap().log1p().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1e-10).abs() < 1e-16); // ln(1 + x) would round to 0
    /// ```
    #[track_caller]
    pub fn log1p(&self) -> Tensor {
        self.float_op1(Op::LogPlusOne {}, "log1p")
    }
    /// Elementwise e^x - 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1e-10], [2]).unwrap().expm1().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1e-10).abs() < 1e-16); // e^x - 1 would round to 0
    /// ```
    #[track_caller]
    pub fn expm1(&self) -> Tensor {
        self.float_op1(Op::ExponentialMinusOne {}, "expm1")
    }
    /// Elementwise hyperbolic tangent.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0, 20.0], [3]).unwrap().tanh().to_vec::<f32>().unwrap();
    /// assert_eq!((y[0], y[2]), (0.0, 1.0));
    /// assert!((y[1] - 1.0f32.tanh()).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        self.float_op1(Op::Tanh {}, "tanh")
    }
    /// Elementwise square root.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![4.0f32, 9.0, 0.25], [3]).unwrap();
    /// assert_eq!(x.sqrt().to_vec::<f32>().unwrap(), [2.0, 3.0, 0.5]);
    /// ```
    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        self.float_op1(Op::Sqrt {}, "sqrt")
    }
    /// Elementwise 1 / sqrt(x).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![4.0f32, 0.25], [2]).unwrap();
    /// assert_eq!(x.rsqrt().to_vec::<f32>().unwrap(), [0.5, 2.0]);
    /// ```
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        self.float_op1(Op::Rsqrt {}, "rsqrt")
    }
    /// Elementwise absolute value.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-3i32, 0, 2], [3]).unwrap();
    /// assert_eq!(x.abs().to_vec::<i32>().unwrap(), [3, 0, 2]);
    /// ```
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        self.op1(Op::Abs {}, "abs")
    }
    /// Elementwise sine.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap().sin().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1.0f32.sin()).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn sin(&self) -> Tensor {
        self.float_op1(Op::Sine {}, "sin")
    }
    /// Elementwise cosine.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap().cos().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 1.0);
    /// assert!((y[1] - 1.0f32.cos()).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn cos(&self) -> Tensor {
        self.float_op1(Op::Cosine {}, "cos")
    }
    /// Elementwise error function.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap().erf().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 0.842_700_8).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn erf(&self) -> Tensor {
        self.float_op1(Op::Erf {}, "erf")
    }
    /// Elementwise floor.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.5f32, -1.5, 2.0], [3]).unwrap();
    /// assert_eq!(x.floor().to_vec::<f32>().unwrap(), [1.0, -2.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn floor(&self) -> Tensor {
        self.float_op1(Op::Floor {}, "floor")
    }
    /// Elementwise rounding to nearest, ties to even (as `jnp.round` and `torch.round`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 1.5, 2.5, -0.5, 1.2], [5]).unwrap();
    /// assert_eq!(x.round().to_vec::<f32>().unwrap(), [0.0, 2.0, 2.0, -0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn round(&self) -> Tensor {
        self.float_op1(Op::RoundNearestEven {}, "round")
    }
    /// Elementwise rounding to nearest, ties away from zero (C's `round`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 1.5, 2.5, -0.5], [4]).unwrap();
    /// assert_eq!(x.round_half_away().to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, -1.0]);
    /// ```
    #[track_caller]
    pub fn round_half_away(&self) -> Tensor {
        self.float_op1(Op::RoundNearestAfz {}, "round_half_away")
    }
    /// Elementwise tangent.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap().tan().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1.0f32.tan()).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn tan(&self) -> Tensor {
        self.float_op1(Op::Tan {}, "tan")
    }
    /// Elementwise cube root (negative for negative values).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![8.0f32, -27.0], [2]).unwrap();
    /// assert_eq!(x.cbrt().to_vec::<f32>().unwrap(), [2.0, -3.0]);
    /// ```
    #[track_caller]
    pub fn cbrt(&self) -> Tensor {
        self.float_op1(Op::Cbrt {}, "cbrt")
    }
    /// Elementwise arc tangent of `self / o` in the quadrant of the point `(o, self)`, in
    /// `[-π, π]`, with broadcasting; integer operands compute in `f32`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use std::f32::consts::PI;
    /// let y = Tensor::from_vec(vec![1.0f32, 1.0, -1.0], [3]).unwrap();
    /// let x = Tensor::from_vec(vec![1.0f32, -1.0, 0.0], [3]).unwrap();
    /// let a = y.atan2(&x).to_vec::<f32>().unwrap();
    /// assert_eq!(a, [PI / 4.0, 3.0 * PI / 4.0, -PI / 2.0]);
    /// ```
    #[track_caller]
    pub fn atan2(&self, o: &Tensor) -> Tensor {
        let d = inexact(promote_types(self.dtype(), o.dtype()));
        self.binary_in(o, d, Op::Atan2 {}, "atan2")
    }
    /// Each element rounded to a float format with `exponent_bits` and `mantissa_bits`
    /// (`reduce_precision(x, 8, 7)` rounds f32 values as bf16 would hold them), kept in this
    /// tensor's dtype: values past the format's range become infinite, those below its normal
    /// range zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// // bf16 keeps 7 mantissa bits: 1 + 2^-8 rounds to 1, 1 + 2^-7 is kept.
    /// let x = Tensor::from_vec(vec![1.0f32 + 1.0 / 256.0, 1.0 + 1.0 / 128.0], [2]).unwrap();
    /// assert_eq!(x.reduce_precision(8, 7).to_vec::<f32>().unwrap(), [1.0, 1.0 + 1.0 / 128.0]);
    /// ```
    #[track_caller]
    pub fn reduce_precision(&self, exponent_bits: u32, mantissa_bits: u32) -> Tensor {
        self.float_op1(
            Op::ReducePrecision {
                exponent_bits: exponent_bits as i64,
                mantissa_bits: mantissa_bits as i64,
            },
            "reduce_precision",
        )
    }
    /// Elementwise count of set bits of an integer tensor.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0u32, 7, u32::MAX], [3]).unwrap();
    /// assert_eq!(x.popcount().to_vec::<u32>().unwrap(), [0, 3, 32]);
    /// ```
    #[track_caller]
    pub fn popcount(&self) -> Tensor {
        self.op1(Op::Popcnt {}, "popcount")
    }
    /// Elementwise count of zero bits above the highest set bit of an integer tensor (the
    /// width for 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0u32, 1, 0x8000_0000], [3]).unwrap();
    /// assert_eq!(x.count_leading_zeros().to_vec::<u32>().unwrap(), [32, 31, 0]);
    /// ```
    #[track_caller]
    pub fn count_leading_zeros(&self) -> Tensor {
        self.op1(Op::CountLeadingZeros {}, "count_leading_zeros")
    }
    /// Elementwise bitwise and of integer (or logical and of `pred`) tensors, with
    /// broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![0b1100i32, 0b1010], [2]).unwrap();
    /// assert_eq!(a.bitwise_and(&Tensor::scalar(0b1000i32)).to_vec::<i32>().unwrap(), [8, 8]);
    /// let p = Tensor::from_vec(vec![true, false], [2]).unwrap();
    /// assert_eq!(p.bitwise_and(&Tensor::scalar(true)).to_vec::<bool>().unwrap(), [true, false]);
    /// ```
    #[track_caller]
    pub fn bitwise_and(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::And {}, "bitwise_and")
    }
    /// Elementwise bitwise or, with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![0b1100i32, 0b0001], [2]).unwrap();
    /// assert_eq!(a.bitwise_or(&Tensor::scalar(0b0010i32)).to_vec::<i32>().unwrap(), [0b1110, 0b0011]);
    /// ```
    #[track_caller]
    pub fn bitwise_or(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Or {}, "bitwise_or")
    }
    /// Elementwise bitwise exclusive or, with broadcasting.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![0b1100i32, 0b1010], [2]).unwrap();
    /// assert_eq!(a.bitwise_xor(&Tensor::scalar(0b0110i32)).to_vec::<i32>().unwrap(), [0b1010, 0b1100]);
    /// ```
    #[track_caller]
    pub fn bitwise_xor(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::Xor {}, "bitwise_xor")
    }
    /// Elementwise bitwise (or logical) not.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![0i32, 5], [2]).unwrap();
    /// assert_eq!(a.bitwise_not().to_vec::<i32>().unwrap(), [-1, -6]);
    /// let p = Tensor::from_vec(vec![true, false], [2]).unwrap();
    /// assert_eq!(p.bitwise_not().to_vec::<bool>().unwrap(), [false, true]);
    /// ```
    #[track_caller]
    pub fn bitwise_not(&self) -> Tensor {
        self.op1(Op::Not {}, "bitwise_not")
    }
    /// Elementwise left shift of an integer tensor by `o` bits, with broadcasting; shifts
    /// outside `[0, width)` give 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![1u32, 3, 1], [3]).unwrap();
    /// let s = Tensor::from_vec(vec![4u32, 1, 32], [3]).unwrap();
    /// assert_eq!(a.shift_left(&s).to_vec::<u32>().unwrap(), [16, 6, 0]);
    /// ```
    #[track_caller]
    pub fn shift_left(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftLeft {}, "shift_left")
    }
    /// Elementwise logical right shift (zeros fill in); shifts outside `[0, width)` give 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![-16i32, 16], [2]).unwrap();
    /// let y = a.shift_right_logical(&Tensor::scalar(2i32)).to_vec::<i32>().unwrap();
    /// assert_eq!(y, [(-16i32 as u32 >> 2) as i32, 4]);
    /// ```
    #[track_caller]
    pub fn shift_right_logical(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftRightLogical {}, "shift_right_logical")
    }
    /// Elementwise arithmetic right shift (the top bit fills in, for unsigned types too);
    /// shifts outside `[0, width)` fill every bit with the top one.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let a = Tensor::from_vec(vec![-16i32, 16], [2]).unwrap();
    /// assert_eq!(a.shift_right_arithmetic(&Tensor::scalar(2i32)).to_vec::<i32>().unwrap(), [-4, 4]);
    /// ```
    #[track_caller]
    pub fn shift_right_arithmetic(&self, o: &Tensor) -> Tensor {
        self.binary(o, Op::ShiftRightArithmetic {}, "shift_right_arithmetic")
    }
    /// Elementwise ceiling.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.5f32, -1.5, 2.0], [3]).unwrap();
    /// assert_eq!(x.ceil().to_vec::<f32>().unwrap(), [2.0, -1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn ceil(&self) -> Tensor {
        self.float_op1(Op::Ceil {}, "ceil")
    }
    /// Elementwise sign.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-2.5f32, 0.0, 3.0], [3]).unwrap();
    /// assert_eq!(x.sign().to_vec::<f32>().unwrap(), [-1.0, 0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn sign(&self) -> Tensor {
        self.op1(Op::Sign {}, "sign")
    }
    /// Elementwise logistic sigmoid.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 2.0], [2]).unwrap().sigmoid().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.5);
    /// assert!((y[1] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        self.float_op1(Op::Logistic {}, "sigmoid")
    }
    /// Elementwise max(x, 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3]).unwrap();
    /// assert_eq!(x.relu().to_vec::<f32>().unwrap(), [0.0, 0.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        self.maximum(&self.like_scalar(0.0))
    }
    /// GELU: with `approximate`, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
    /// computed as x sigmoid(x (a + b x^2)), a = 2 sqrt(2/pi), b = 0.044715 a (the same
    /// function: 0.5 (1 + tanh(u)) = sigmoid(2u), with one exp and one division instead of
    /// tanh's two branches); otherwise 0.5 x (1 + erf(x / sqrt(2))).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], [2]).unwrap();
    /// let exact = x.gelu(false).to_vec::<f32>().unwrap();
    /// let tanh = x.gelu(true).to_vec::<f32>().unwrap();
    /// assert_eq!(exact[0], 0.0);
    /// assert!((exact[1] - 0.841_344_7).abs() < 1e-6); // 1 * Φ(1)
    /// assert!((tanh[1] - 0.841_192).abs() < 1e-5);
    /// ```
    #[track_caller]
    pub fn gelu(&self, approximate: bool) -> Tensor {
        if approximate {
            let a = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
            let inner = self
                .mul(self)
                .mul(&self.like_scalar(a * 0.044715))
                .add(&self.like_scalar(a));
            return self.mul(&self.mul(&inner).sigmoid());
        }
        let half = self.like_scalar(0.5);
        let one = self.like_scalar(1.0);
        let inner = self
            .mul(&self.like_scalar(std::f64::consts::FRAC_1_SQRT_2))
            .erf();
        self.mul(&half).mul(&one.add(&inner))
    }
}
