//! `chlo` elementwise functions kiln has no op for, written with kiln's elementwise ops by
//! the usual formulas (the ones StableHLO's own legalization uses where it has one):
//!
//! | op | formula |
//! |---|---|
//! | `tan` | kiln's `tan` |
//! | `square(x)` | `x * x` |
//! | `atan(x)` | `atan2(x, 1)` |
//! | `asin(x)` | `2 atan2(x, 1 + sqrt(1 - x²))` |
//! | `acos(x)` | `2 atan2(sqrt(1 - x²), 1 + x)`, `π` at -1 |
//! | `sinh(x)` | `|x| < 1`: `(t + t / (t + 1)) / 2` with `t = expm1(x)`; else `e^(x + ln ½) - e^(-x + ln ½)` |
//! | `cosh(x)` | `e^(x + ln ½) + e^(-x + ln ½)` |
//! | `asinh(x)` | `sign(x) log1p(a + a² / (1 + sqrt(1 + a²)))`, `a = |x|`; `sign(x) (ln a + ln 2)` past `1/sqrt(ε)` |
//! | `acosh(x)` | `ln(x + sqrt((x + 1)(x - 1)))`; `ln x + ln 2` past `1/sqrt(ε)` |
//! | `atanh(x)` | `log1p(2x / (1 - x)) / 2` |
//! | `is_inf`, `is_pos_inf`, `is_neg_inf` | comparisons with ±inf |
//! | `erf_inv(x)` | Giles' single-precision polynomials in `w = -ln((1 - x)(1 + x))`, `±inf` at `±1`; in f64 refined by four steps (`special::refine_erf_inv`) |

use crate::ast::OpAst;
use crate::error::{Error, Result};
use crate::import::{Body, loc, value_type};
use kiln_ir::{ComparisonDirection as Dir, DType, Literal, Op, TensorType, ValueId};

/// Instructions at one tensor type, for writing formulas.
pub(crate) struct Expr<'b, 'o> {
    pub(crate) body: &'b mut Body,
    pub(crate) op: &'o OpAst,
    pub(crate) ty: TensorType,
}

impl Expr<'_, '_> {
    fn err(&self, e: kiln_ir::VerifyError) -> Error {
        Error::invalid(
            self.op.pos,
            format!("`{}`: {}", self.op.name, e.diag.message),
        )
    }

    pub(crate) fn push(
        &mut self,
        kop: Op,
        xs: &[ValueId],
        ty: Option<&TensorType>,
    ) -> Result<ValueId> {
        let l = loc(self.op.pos);
        match self
            .body
            .b
            .push_at(kop, xs, ty.map(std::slice::from_ref), l)
        {
            Ok(v) => Ok(v[0]),
            Err(e) => Err(self.err(e)),
        }
    }

    /// A constant of the expression's type.
    pub(crate) fn k(&mut self, x: f64) -> Result<ValueId> {
        let s = TensorType::scalar(self.ty.dtype);
        let lit = Literal::from_f64s(s.clone(), &[x])
            .map_err(|e| Error::invalid(self.op.pos, e.to_string()))?;
        let c = self.push(Op::Constant { value: lit }, &[], Some(&s))?;
        let ty = self.ty.clone();
        self.push(
            Op::BroadcastInDim {
                broadcast_dimensions: vec![],
            },
            &[c],
            Some(&ty),
        )
    }

    pub(crate) fn un(&mut self, kop: Op, x: ValueId) -> Result<ValueId> {
        self.push(kop, &[x], None)
    }

    pub(crate) fn bin(&mut self, kop: Op, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.push(kop, &[x, y], None)
    }

    pub(crate) fn cmp(&mut self, d: Dir, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.push(
            Op::Compare {
                comparison_direction: d,
            },
            &[x, y],
            None,
        )
    }

    pub(crate) fn select(&mut self, p: ValueId, t: ValueId, f: ValueId) -> Result<ValueId> {
        self.push(Op::Select {}, &[p, t, f], None)
    }

    /// `c[0] + w (c[1] + w (c[2] + ...))`, Horner's rule from the highest coefficient.
    pub(crate) fn poly(&mut self, w: ValueId, highest_first: &[f64]) -> Result<ValueId> {
        let mut p = self.k(highest_first[0])?;
        for &c in &highest_first[1..] {
            let m = self.bin(Op::Multiply {}, p, w)?;
            let cc = self.k(c)?;
            p = self.bin(Op::Add {}, cc, m)?;
        }
        Ok(p)
    }
}

/// Whether `name` is a `chlo` op this file writes.
pub fn handles(name: &str) -> bool {
    matches!(
        name,
        "chlo.tan"
            | "chlo.atan"
            | "chlo.asin"
            | "chlo.acos"
            | "chlo.sinh"
            | "chlo.cosh"
            | "chlo.asinh"
            | "chlo.acosh"
            | "chlo.atanh"
            | "chlo.is_inf"
            | "chlo.is_pos_inf"
            | "chlo.is_neg_inf"
            | "chlo.erf_inv"
            | "chlo.square"
    )
}

/// Writes the `chlo` op `op` (one of [`handles`]) on its one operand.
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let [x] = args else {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` takes one operand", op.name),
        ));
    };
    let x = *x;
    let ty = value_type(body, x)?;
    if !ty.dtype.is_float() {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` takes floats", op.name),
        ));
    }
    let eps = match ty.dtype {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        DType::F16 => 9.765625e-4,
        _ => 7.8125e-3,
    };
    let mut e = Expr { body, op, ty };
    let ln2 = std::f64::consts::LN_2;
    let v = match op.name.as_str() {
        "chlo.tan" => e.un(Op::Tan {}, x)?,
        "chlo.square" => e.bin(Op::Multiply {}, x, x)?,
        "chlo.atan" => {
            let one = e.k(1.0)?;
            e.bin(Op::Atan2 {}, x, one)?
        }
        "chlo.asin" | "chlo.acos" => {
            let one = e.k(1.0)?;
            let two = e.k(2.0)?;
            let xx = e.bin(Op::Multiply {}, x, x)?;
            let d = e.bin(Op::Subtract {}, one, xx)?;
            let s = e.un(Op::Sqrt {}, d)?;
            if op.name == "chlo.asin" {
                let den = e.bin(Op::Add {}, one, s)?;
                let a = e.bin(Op::Atan2 {}, x, den)?;
                e.bin(Op::Multiply {}, two, a)?
            } else {
                let den = e.bin(Op::Add {}, one, x)?;
                let a = e.bin(Op::Atan2 {}, s, den)?;
                let r = e.bin(Op::Multiply {}, two, a)?;
                let m1 = e.k(-1.0)?;
                let at = e.cmp(Dir::Eq, x, m1)?;
                let pi = e.k(std::f64::consts::PI)?;
                e.select(at, pi, r)?
            }
        }
        "chlo.sinh" | "chlo.cosh" => {
            let half = e.k(-ln2)?;
            let a = e.bin(Op::Add {}, x, half)?;
            let ea = e.un(Op::Exponential {}, a)?;
            let nx = e.un(Op::Negate {}, x)?;
            let b = e.bin(Op::Add {}, nx, half)?;
            let eb = e.un(Op::Exponential {}, b)?;
            if op.name == "chlo.cosh" {
                e.bin(Op::Add {}, ea, eb)?
            } else {
                let large = e.bin(Op::Subtract {}, ea, eb)?;
                let t = e.un(Op::ExponentialMinusOne {}, x)?;
                let one = e.k(1.0)?;
                let t1 = e.bin(Op::Add {}, t, one)?;
                let q = e.bin(Op::Divide {}, t, t1)?;
                let s = e.bin(Op::Add {}, t, q)?;
                let two = e.k(2.0)?;
                let small = e.bin(Op::Divide {}, s, two)?;
                let ax = e.un(Op::Abs {}, x)?;
                let is_small = e.cmp(Dir::Lt, ax, one)?;
                e.select(is_small, small, large)?
            }
        }
        "chlo.asinh" => {
            let a = e.un(Op::Abs {}, x)?;
            let one = e.k(1.0)?;
            let aa = e.bin(Op::Multiply {}, a, a)?;
            let r = e.bin(Op::Add {}, one, aa)?;
            let s = e.un(Op::Sqrt {}, r)?;
            let den = e.bin(Op::Add {}, one, s)?;
            let q = e.bin(Op::Divide {}, aa, den)?;
            let arg = e.bin(Op::Add {}, a, q)?;
            let mid = e.un(Op::LogPlusOne {}, arg)?;
            let la = e.un(Op::Log {}, a)?;
            let l2 = e.k(ln2)?;
            let big = e.bin(Op::Add {}, la, l2)?;
            let limit = e.k(1.0 / eps.sqrt())?;
            let is_big = e.cmp(Dir::Gt, a, limit)?;
            let m = e.select(is_big, big, mid)?;
            let sign = e.un(Op::Sign {}, x)?;
            e.bin(Op::Multiply {}, sign, m)?
        }
        "chlo.acosh" => {
            let one = e.k(1.0)?;
            let p = e.bin(Op::Add {}, x, one)?;
            let m = e.bin(Op::Subtract {}, x, one)?;
            let pm = e.bin(Op::Multiply {}, p, m)?;
            let s = e.un(Op::Sqrt {}, pm)?;
            let arg = e.bin(Op::Add {}, x, s)?;
            let mid = e.un(Op::Log {}, arg)?;
            let lx = e.un(Op::Log {}, x)?;
            let l2 = e.k(ln2)?;
            let big = e.bin(Op::Add {}, lx, l2)?;
            let limit = e.k(1.0 / eps.sqrt())?;
            let is_big = e.cmp(Dir::Gt, x, limit)?;
            e.select(is_big, big, mid)?
        }
        "chlo.atanh" => {
            let one = e.k(1.0)?;
            let two = e.k(2.0)?;
            let num = e.bin(Op::Multiply {}, two, x)?;
            let den = e.bin(Op::Subtract {}, one, x)?;
            let q = e.bin(Op::Divide {}, num, den)?;
            let l = e.un(Op::LogPlusOne {}, q)?;
            let half = e.k(0.5)?;
            e.bin(Op::Multiply {}, half, l)?
        }
        "chlo.is_inf" | "chlo.is_pos_inf" | "chlo.is_neg_inf" => {
            let (v, inf) = match op.name.as_str() {
                "chlo.is_inf" => (e.un(Op::Abs {}, x)?, f64::INFINITY),
                "chlo.is_pos_inf" => (x, f64::INFINITY),
                _ => (x, f64::NEG_INFINITY),
            };
            let k = e.k(inf)?;
            e.cmp(Dir::Eq, v, k)?
        }
        "chlo.erf_inv" => {
            let one = e.k(1.0)?;
            let lo = e.bin(Op::Subtract {}, one, x)?;
            let hi = e.bin(Op::Add {}, one, x)?;
            let d = e.bin(Op::Multiply {}, lo, hi)?;
            let ld = e.un(Op::Log {}, d)?;
            let w = e.un(Op::Negate {}, ld)?;
            let c25 = e.k(2.5)?;
            let w1 = e.bin(Op::Subtract {}, w, c25)?;
            let small = e.poly(
                w1,
                &[
                    2.81022636e-08,
                    3.43273939e-07,
                    -3.5233877e-06,
                    -4.39150654e-06,
                    2.1858087e-04,
                    -1.25372503e-03,
                    -4.17768164e-03,
                    2.46640727e-01,
                    1.50140941,
                ],
            )?;
            let sw = e.un(Op::Sqrt {}, w)?;
            let c3 = e.k(3.0)?;
            let w2 = e.bin(Op::Subtract {}, sw, c3)?;
            let large = e.poly(
                w2,
                &[
                    -2.00214257e-04,
                    1.00950558e-04,
                    1.34934322e-03,
                    -3.67342844e-03,
                    5.73950773e-03,
                    -7.6224613e-03,
                    9.43887047e-03,
                    1.00167406,
                    2.83297682,
                ],
            )?;
            let c5 = e.k(5.0)?;
            let is_small = e.cmp(Dir::Lt, w, c5)?;
            let p = e.select(is_small, small, large)?;
            let mut r = e.bin(Op::Multiply {}, p, x)?;
            if e.ty.dtype == DType::F64 {
                r = crate::special::refine_erf_inv(&mut e, x, r)?;
            }
            let ax = e.un(Op::Abs {}, x)?;
            let at_one = e.cmp(Dir::Eq, ax, one)?;
            let inf = e.k(f64::INFINITY)?;
            let sinf = e.bin(Op::Multiply {}, x, inf)?;
            e.select(at_one, sinf, r)?
        }
        _ => return Err(Error::unsupported(op.pos, format!("the op `{}`", op.name))),
    };
    Ok(vec![v])
}
