//! The `check` dialect of StableHLO's interpreter tests: each `check.*` op becomes extra
//! outputs of its function (the values it checks) and a [`Check`] that compares them on the
//! host after the function ran.
//!
//! | op | passes when |
//! |---|---|
//! | `expect_eq_const %x, dense<..>` | every element equals the literal (`==`) |
//! | `expect_almost_eq_const %x, dense<..> {tolerance = t}` | per element: equal, both NaN, or both finite within `t` (default 1e-4, absolute) |
//! | `expect_eq %x, %y` | as `expect_eq_const`, two computed tensors |
//! | `expect_almost_eq %x, %y, tolerance = t` | as `expect_almost_eq_const`, two computed tensors |
//! | `expect_close %a, %e, max_ulp_difference = N, min_ulp_difference = M` | finite: ULP distance in [M, N]; else bitwise equal or both NaN |
//! | `expect_serialized_eq %x, probe_id = "id", iter = n` | `%x` has the bytes of the `n`-th value probed under `id` ([`crate::probe`]) |

use crate::ast::{AttrVal, OpAst, Sig};
use crate::error::{Error, Pos, Result};
use crate::import::Body;
use crate::literal::to_literal;
use kiln_ir::{DType, Literal, ValueId};
use std::ops::Range;

/// The default absolute tolerance of `expect_almost_eq(_const)`.
pub const DEFAULT_TOLERANCE: f64 = 1e-4;

/// What a check compares.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckKind {
    /// Exactly equal to a literal.
    EqConst(Literal),
    /// Within an absolute tolerance of a literal.
    AlmostEqConst(Literal, f64),
    /// Two computed values exactly equal.
    Eq,
    /// Two computed values within an absolute tolerance.
    AlmostEq(f64),
    /// Two computed values within a range of ULP distances (min, max).
    Close(u64, u64),
    /// Two computed values with the same bytes (`expect_serialized_eq`, see
    /// [`crate::probe`]).
    SameBytes,
}

/// One `check.*` op.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The op's name.
    pub op: String,
    /// Where it is.
    pub pos: Pos,
    /// What it compares.
    pub kind: CheckKind,
    /// The outputs of the function it reads (one, or two for the two-value checks).
    pub outputs: Range<usize>,
}

/// The checks of one function.
#[derive(Clone, Debug, PartialEq)]
pub struct FuncChecks {
    /// The function's name.
    pub func: String,
    /// How many outputs the function returns itself (the checked values come after).
    pub outputs: usize,
    /// The checks, in text order.
    pub checks: Vec<Check>,
    /// The `interpreter.run_parallel` ops of the function, in text order.
    pub parallel: Vec<crate::parallel::Parallel>,
    /// The `interpreter.print` ops of the function, in text order (their values are outputs
    /// after the checked ones and the grids' operands).
    pub prints: Vec<crate::probe::Print>,
    /// The parameters that receive what the function's `stablehlo.infeed` ops read, in order
    /// (a runner feeds them from a `run_parallel`'s infeed queue).
    pub infeed: Vec<usize>,
    /// The outputs that hold what its `stablehlo.outfeed` ops write, in order (after the
    /// printed values).
    pub outfeed: Range<usize>,
    /// The function's `stablehlo.send` ops, in order, each with the outputs that hold what it
    /// sends (after the outfeed ones; see [`crate::channel`]).
    pub sends: Vec<crate::channel::Transfer>,
    /// The function's `stablehlo.recv` ops, in order, each with the parameters that receive
    /// what it reads.
    pub recvs: Vec<crate::channel::Transfer>,
}

impl Check {
    /// The same check reading `outputs`.
    pub fn at_outputs(self, outputs: Range<usize>) -> Check {
        Check { outputs, ..self }
    }

    /// Compares the function's outputs; the error says which element differs.
    pub fn verify(&self, outs: &[Literal]) -> Result<(), String> {
        let got = outs
            .get(self.outputs.clone())
            .ok_or_else(|| format!("{} {}: missing outputs", self.pos, self.op))?;
        let fail = |m: String| Err(format!("{} {}: {m}", self.pos, self.op));
        let (a, b) = match (&self.kind, got) {
            (CheckKind::EqConst(l) | CheckKind::AlmostEqConst(l, _), [x]) => (x, l),
            (_, [x, y]) => (x, y),
            _ => return fail("wrong number of outputs".into()),
        };
        if a.ty() != b.ty() {
            return fail(format!("type {} against {}", a.ty(), b.ty()));
        }
        if self.kind == CheckKind::SameBytes {
            return same_bytes(a, b).or_else(fail);
        }
        if a.dtype().is_complex() {
            // Complex numbers: each part checked as a float of the part type.
            let (ar, ai) = parts(a);
            let (br, bi) = parts(b);
            return self
                .values(&ar, &br)
                .map_err(|m| format!("real part: {m}"))
                .and_then(|()| {
                    self.values(&ai, &bi)
                        .map_err(|m| format!("imaginary part: {m}"))
                })
                .or_else(fail);
        }
        self.values(a, b).or_else(fail)
    }

    /// This check on two real literals of one type.
    fn values(&self, a: &Literal, b: &Literal) -> Result<(), String> {
        match &self.kind {
            CheckKind::EqConst(_) | CheckKind::Eq => compare(a, b, |x, y| x == y, |x, y| x == y),
            CheckKind::AlmostEqConst(_, t) | CheckKind::AlmostEq(t) => {
                let t = *t;
                compare(a, b, |x, y| almost_eq(x, y, t), |x, y| x == y)
            }
            CheckKind::Close(min, max) => close(a, b, *min, *max),
            CheckKind::SameBytes => same_bytes(a, b),
        }
    }
}

/// Whether two literals of one type have the same bytes; else the first element that differs.
fn same_bytes(a: &Literal, b: &Literal) -> Result<(), String> {
    let (x, y) = (a.to_le_bytes(), b.to_le_bytes());
    if x == y {
        return Ok(());
    }
    let w = a.dtype().bytes().max(1);
    let k = (0..x.len()).find(|&i| x.get(i) != y.get(i)).unwrap_or(0) / w;
    Err(format!(
        "element {k}: got {}, expected {} (bytes differ)",
        a.format_elem(k),
        b.format_elem(k)
    ))
}

/// The real and imaginary parts of a complex literal, as literals of its part type.
fn parts(l: &Literal) -> (Literal, Literal) {
    let z = l.to_complex_f64s();
    let ty = l.ty().with_dtype(l.dtype().part());
    let part = |k: usize| {
        let v: Vec<f64> = z.iter().map(|c| c[k]).collect();
        Literal::from_f64s(ty.clone(), &v).expect("the parts have the part type")
    };
    (part(0), part(1))
}

/// `x` and `y` equal, both NaN, or both finite within `t`.
fn almost_eq(x: f64, y: f64, t: f64) -> bool {
    x == y || x.is_nan() && y.is_nan() || x.is_finite() && y.is_finite() && (x - y).abs() <= t
}

/// Compares element by element: floats with `f`, integers and `pred` with `i`.
fn compare(
    a: &Literal,
    b: &Literal,
    f: impl Fn(f64, f64) -> bool,
    i: impl Fn(i64, i64) -> bool,
) -> Result<(), String> {
    if a.dtype().is_float() {
        let (x, y) = (a.to_f64s(), b.to_f64s());
        if let Some(k) = (0..x.len()).find(|&k| !f(x[k], y[k])) {
            return Err(format!("element {k}: got {} , expected {}", x[k], y[k]));
        }
    } else {
        let (x, y) = (a.to_i64s(), b.to_i64s());
        if let Some(k) = (0..x.len()).find(|&k| !i(x[k], y[k])) {
            return Err(format!("element {k}: got {}, expected {}", x[k], y[k]));
        }
    }
    Ok(())
}

/// The ULP check of `expect_close`.
fn close(a: &Literal, b: &Literal, min: u64, max: u64) -> Result<(), String> {
    let d = a.dtype();
    if !d.is_float() {
        return compare(a, b, |x, y| x == y, |x, y| x == y);
    }
    let w = d.bytes();
    let (ab, bb) = (a.to_le_bytes(), b.to_le_bytes());
    let (x, y) = (a.to_f64s(), b.to_f64s());
    for k in 0..x.len() {
        let bits = |v: &[u8]| {
            let mut buf = [0u8; 8];
            buf[..w].copy_from_slice(&v[k * w..(k + 1) * w]);
            u64::from_le_bytes(buf)
        };
        let (p, q) = (bits(&ab), bits(&bb));
        if !x[k].is_finite() || !y[k].is_finite() {
            if p == q || x[k].is_nan() && y[k].is_nan() {
                continue;
            }
            return Err(format!("element {k}: got {} , expected {}", x[k], y[k]));
        }
        let ulps = ordered(p, d).abs_diff(ordered(q, d));
        if ulps < min || ulps > max {
            return Err(format!(
                "element {k}: {} and {} are {ulps} ULPs apart, not in [{min}, {max}]",
                x[k], y[k]
            ));
        }
    }
    Ok(())
}

/// The bits of a float as an integer ordered like the floats.
fn ordered(bits: u64, d: DType) -> i64 {
    let sign = 1u64 << (d.bits() - 1);
    let mag = (bits & (sign - 1)) as i64;
    if bits & sign != 0 { -mag } else { mag }
}

/// A float or integer attribute.
fn number(op: &OpAst, name: &str) -> Result<Option<f64>> {
    match op.attr(name) {
        None => Ok(None),
        Some((AttrVal::Float(f), _)) => Ok(Some(*f)),
        Some((AttrVal::Int(i), _)) => Ok(Some(*i as f64)),
        Some((_, p)) => Err(Error::invalid(
            p,
            format!("`{name}` of `{}` must be a number", op.name),
        )),
    }
}

/// Records a `check.*` op; it defines no values.
pub fn record(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    if !body.allow_checks {
        return Err(Error::unsupported(
            op.pos,
            format!(
                "the test op `{}` here (checks are read by `parse_with_checks`, in functions only)",
                op.name
            ),
        ));
    }
    let short = op.name.trim_start_matches("check.");
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(Error::invalid(
                op.pos,
                format!("`{}` takes {n} operands", op.name),
            ))
        }
    };
    let expected = |op: &OpAst| -> Result<Literal> {
        let Some((AttrVal::Dense(d, dty), _)) = op.attr("value") else {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` needs a `dense<...>` value", op.name),
            ));
        };
        let ty = match (&op.sig, dty) {
            (Sig::List(ts), _) if ts.len() == 1 => ts[0].clone(),
            (_, Some(t)) => t.clone(),
            _ => {
                return Err(Error::invalid(
                    op.pos,
                    format!("`{}` needs the literal's type", op.name),
                ));
            }
        };
        to_literal(d, &ty)
    };
    let kind = match short {
        "expect_eq_const" => {
            arity(1)?;
            CheckKind::EqConst(expected(op)?)
        }
        "expect_almost_eq_const" => {
            arity(1)?;
            CheckKind::AlmostEqConst(
                expected(op)?,
                number(op, "tolerance")?.unwrap_or(DEFAULT_TOLERANCE),
            )
        }
        "expect_eq" => {
            arity(2)?;
            CheckKind::Eq
        }
        "expect_almost_eq" => {
            arity(2)?;
            CheckKind::AlmostEq(number(op, "tolerance")?.unwrap_or(DEFAULT_TOLERANCE))
        }
        "expect_close" => {
            arity(2)?;
            let max = number(op, "max_ulp_difference")?.ok_or_else(|| {
                Error::invalid(op.pos, "`check.expect_close` needs `max_ulp_difference`")
            })?;
            let min = number(op, "min_ulp_difference")?.unwrap_or(0.0);
            CheckKind::Close(min as u64, max as u64)
        }
        _ => {
            return Err(Error::unsupported(
                op.pos,
                format!("the test op `{}`", op.name),
            ));
        }
    };
    body.checks.push((
        Check {
            op: op.name.clone(),
            pos: op.pos,
            kind,
            outputs: 0..0,
        },
        args.to_vec(),
    ));
    Ok(Vec::new())
}
