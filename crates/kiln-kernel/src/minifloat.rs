//! The small floats (`f8e4m3fn`, ..., `f4e2m1fn`: [`kiln_ir::MiniFloat`]) in the compiled
//! backends: held as f32 between kernels' loads and stores, encoded and decoded with integer
//! ops, with no reference fallback.
//!
//! [`expand_minifloats`] runs before optimization: every small-float value of the program
//! becomes the f32 holding its value (exactly: every value of every format is an f32;
//! `f8e8m0fnu` is held in f64), and
//!
//! - a parameter of a small-float type is converted to f32 where it enters; a result is
//!   converted back to its type where it leaves;
//! - every op that computes a small-float result computes it in f32 (`f8e8m0fnu`, whose range
//!   products leave f32's, in f64) and rounds it once to the
//!   type (a `convert` to the type and back), as [`kiln_ir::minifloat`] states; data movement,
//!   `select`, `maximum`, `minimum`, `negate` and `abs` are exact and are not rounded;
//! - a `dot_general` or `convolution` of small floats into a wider type computes in that type,
//!   its operands converted to it (exactly);
//! - a `convert` to a small float rounds once from the source: from f64 on f64's bits, from the
//!   integers of up to 32 bits through f64 (exact), from the 64-bit integers through f64 (which
//!   rounds an integer past 2^53 first; only `f8e8m0fnu` reaches such magnitudes);
//! - a `bitcast_convert` to or from a small float moves its bit pattern: the f32 is converted to
//!   the type, and the bitcast's result back (a NaN of the IEEE formats keeps its pattern
//!   through the f32: its payload rides below the f32's quiet bit, [`kiln_ir::minifloat`]);
//! - constants become f32 constants; regions (loop bodies, comparators, reduction bodies) are
//!   rewritten the same way, with their parameters and results held in f32.
//!
//! What is left of the small floats is `convert` between them and f32 or f64, and the byte
//! copies of bitcasts. A kernel's `convert` from a small float is [`decode`], to one
//! [`encode`]: integer ops on the bits, with the value in the low bits of a byte, so the
//! emitters only load and store the byte (the CPU and the PTX emitter alike).

use kiln_ir::minifloat::Family;
use kiln_ir::{
    Builder, ComparisonDirection, DType, Func, Inst, Literal, MiniFloat, Op, OpKind, TensorType,
    ValueId, VerifyError,
};

use crate::ir::{Ew, Expr};

type R<T> = Result<T, VerifyError>;

/// Whether `f` or any of its regions has a small-float value.
fn uses_mini(f: &Func) -> bool {
    f.values.iter().any(|t| t.dtype.mini().is_some())
        || f.insts
            .iter()
            .any(|i| i.op.regions().into_iter().any(uses_mini))
}

/// The dtype a small float of format `m` is held in: f32, but f64 for `f8e8m0fnu`, whose
/// range (2^-127..2^127) products and quotients leave f32's.
fn holder(m: MiniFloat) -> DType {
    if m == MiniFloat::F8E8M0FNU {
        DType::F64
    } else {
        DType::F32
    }
}

/// The type a value of type `t` is held in (see [`holder`]).
fn held(t: &TensorType) -> TensorType {
    match t.dtype.mini() {
        Some(m) => t.with_dtype(holder(m)),
        None => t.clone(),
    }
}

/// `f` with its small-float values held in f32 (see the module docs); `f` itself when it has
/// none.
pub fn expand_minifloats(f: &Func) -> R<Func> {
    if !uses_mini(f) {
        return Ok(f.clone());
    }
    rewrite(f, true)
}

fn rewrite(f: &Func, top: bool) -> R<Func> {
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for &p in &f.params {
        let ty = &f.values[p.index()];
        map[p.index()] = Some(if top && ty.dtype.mini().is_some() {
            let raw = b.param(ty.clone());
            b.convert(raw, held(ty).dtype)?
        } else {
            b.param(held(ty))
        });
    }
    // What is built for one instruction has its location (or none); the conversions of the
    // parameters and results belong to no instruction and have none.
    b.locate_from(0, None);
    for inst in &f.insts {
        let ops: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("verified SSA"))
            .collect();
        let first = b.inst_count();
        let results = instruction(&mut b, f, inst, &ops)?;
        for (&r, v) in inst.results.iter().zip(results) {
            map[r.index()] = Some(v);
        }
        b.locate_from(first, inst.loc);
    }
    let first = b.inst_count();
    let mut outs = Vec::new();
    for &o in &f.outputs {
        let v = map[o.index()].expect("verified SSA");
        let d = f.values[o.index()].dtype;
        outs.push(if top && d.mini().is_some() {
            b.convert(v, d)?
        } else {
            v
        });
    }
    b.locate_from(first, None);
    b.finish(&outs)
}

/// `v` (f32 or f64) rounded to the small float `d`, held as [`holder`] says.
fn round(b: &mut Builder, v: ValueId, d: DType) -> R<ValueId> {
    let m = b.convert(v, d)?;
    b.convert(m, holder(d.mini().expect("a small float")))
}

/// Ops whose small-float results are values of their operands: no rounding needed.
fn exact(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::BroadcastInDim { .. }
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Reverse { .. }
            | Op::Pad { .. }
            | Op::Gather { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice { .. }
            | Op::Select {}
            | Op::Maximum {}
            | Op::Minimum {}
            | Op::Negate {}
            | Op::Abs {}
            | Op::Sort { .. }
    )
}

fn instruction(b: &mut Builder, f: &Func, inst: &Inst, ops: &[ValueId]) -> R<Vec<ValueId>> {
    let ty = |v: ValueId| &f.values[v.index()];
    let tys: Vec<TensorType> = inst.results.iter().map(|&r| ty(r).clone()).collect();
    let loc = inst.loc;
    let touches = tys.iter().any(|t| t.dtype.mini().is_some())
        || inst.operands.iter().any(|&o| ty(o).dtype.mini().is_some())
        || inst.op.regions().into_iter().any(uses_mini);
    if !touches {
        return b.push_at(inst.op.clone(), ops, Some(&tys), loc);
    }
    match &inst.op {
        Op::Constant { value } => {
            let lit = Literal::from_f64s(held(&tys[0]), &value.to_f64s())
                .expect("an f32 literal of the constant's shape");
            b.push_at(
                Op::Constant { value: lit },
                &[],
                Some(&[held(&tys[0])]),
                loc,
            )
        }
        Op::Convert {} => {
            let (from, to) = (ty(inst.operands[0]).dtype, tys[0].dtype);
            let x = ops[0];
            Ok(vec![match (from.mini(), to.mini()) {
                // Held in `to` already: the conversion from there is the one from the format.
                (Some(m), None) if to == holder(m) => x,
                (Some(_), None) => b.convert(x, to)?,
                (_, Some(_)) => {
                    let src = match from {
                        DType::F64 | DType::Mini(_) => x,
                        DType::F16 | DType::BF16 | DType::F32 | DType::Pred => {
                            b.convert(x, DType::F32)?
                        }
                        // Integers: exact in f64 up to 32 bits.
                        _ => b.convert(x, DType::F64)?,
                    };
                    round(b, src, to)?
                }
                (None, None) => unreachable!("a convert touching a small float"),
            }])
        }
        Op::BitcastConvert {} => {
            let from = ty(inst.operands[0]).dtype;
            let to = tys[0].dtype;
            // A small float's pattern as a signed 2- or 4-bit integer goes through the unsigned
            // integer of its width (the pattern itself), then wraps into the signed range: `i2`
            // and `i4` are held sign-extended. The other way, the signed value wraps into the
            // unsigned one first.
            let unsigned = |d: DType| match d {
                DType::I2 => Some(DType::U2),
                DType::I4 => Some(DType::U4),
                _ => None,
            };
            let x = if from.mini().is_some() {
                b.convert(ops[0], from)?
            } else if let (Some(u), Some(_)) = (unsigned(from), to.mini()) {
                b.convert(ops[0], u)?
            } else {
                ops[0]
            };
            let y = if let (Some(_), Some(u)) = (from.mini(), unsigned(to)) {
                let bits = b.push_at(
                    Op::BitcastConvert {},
                    &[x],
                    Some(&[tys[0].with_dtype(u)]),
                    loc,
                )?[0];
                b.convert(bits, to)?
            } else {
                b.push_at(Op::BitcastConvert {}, &[x], Some(&tys), loc)?[0]
            };
            Ok(vec![if let Some(m) = to.mini() {
                b.convert(y, holder(m))?
            } else {
                y
            }])
        }
        op @ (Op::DotGeneral { .. } | Op::Convolution { .. }) if tys[0].dtype.mini().is_none() => {
            // A product of small floats into a wider type (`f8e4m3fn x f8e4m3fn -> f32`)
            // computes in that type: its operands convert to it exactly, though `f8e8m0fnu`'s
            // holder (f64) is wider than an f32 result.
            let mut wide = Vec::with_capacity(ops.len());
            for (&o, &v) in inst.operands.iter().zip(ops) {
                let d = ty(o).dtype;
                wide.push(match d.mini() {
                    Some(m) if holder(m) != tys[0].dtype => b.convert(v, tys[0].dtype)?,
                    _ => v,
                });
            }
            b.push_at(op.clone(), &wide, Some(&tys), loc)
        }
        op => {
            let mut op = op.clone();
            for r in op.regions_mut() {
                *r = rewrite(r, false)?;
            }
            let htys: Vec<TensorType> = tys.iter().map(held).collect();
            let rounds = !exact(&op);
            let rs = b.push_at(op, ops, Some(&htys), loc)?;
            rs.into_iter()
                .zip(&tys)
                .map(|(r, t)| {
                    if rounds && t.dtype.mini().is_some() {
                        round(b, r, t.dtype)
                    } else {
                        Ok(r)
                    }
                })
                .collect()
        }
    }
}

// ---- Kernel expressions: decoding and encoding the bits ----

fn c(dtype: DType, value: f64) -> Expr {
    Expr::Const { dtype, value }
}

fn op(k: OpKind, dtype: DType, args: Vec<Expr>) -> Expr {
    Expr::Op {
        op: Ew::Kind(k),
        dtype,
        args,
    }
}

fn cmp(dir: ComparisonDirection, a: Expr, b: Expr) -> Expr {
    Expr::Op {
        op: Ew::Cmp(dir),
        dtype: DType::Pred,
        args: vec![a, b],
    }
}

fn select(p: Expr, a: Expr, b: Expr) -> Expr {
    let dtype = a.dtype();
    Expr::Op {
        op: Ew::Select,
        dtype,
        args: vec![p, a, b],
    }
}

fn cast(ew: Ew, dtype: DType, a: Expr) -> Expr {
    Expr::Op {
        op: ew,
        dtype,
        args: vec![a],
    }
}

fn or_p(a: Expr, b: Expr) -> Expr {
    op(OpKind::Or, DType::Pred, vec![a, b])
}

/// The f32 value of `e`, a small float of format `m` (its bit pattern), exactly.
pub fn decode(e: Expr, m: MiniFloat) -> Expr {
    use ComparisonDirection::*;
    let i = DType::I32;
    let k = |v: i64| c(i, v as f64);
    let code = cast(Ew::Convert, i, cast(Ew::Bitcast, DType::U8, e));
    let (e_bits, m_bits, bias) = m.layout();
    let nan = k(0x7fc0_0000);
    let bits = if m.family() == Family::Fnu {
        // 2^(code - 127): code 0 is f32's subnormal 2^-127, 0xff NaN.
        let normal = op(OpKind::ShiftLeft, i, vec![code.clone(), k(23)]);
        select(
            cmp(Eq, code.clone(), k(0)),
            k(0x0040_0000),
            select(cmp(Eq, code, k(0xff)), nan, normal),
        )
    } else {
        let sign_mask = m.sign_mask() as i64;
        let mag = op(OpKind::And, i, vec![code.clone(), k(sign_mask - 1)]);
        let ef = op(
            OpKind::ShiftRightLogical,
            i,
            vec![mag.clone(), k(m_bits as i64)],
        );
        let mant = op(OpKind::And, i, vec![mag.clone(), k((1 << m_bits) - 1)]);
        // Normal: the magnitude's bits moved into f32's fields, the exponent rebiased.
        let normal = op(
            OpKind::Add,
            i,
            vec![
                op(
                    OpKind::ShiftLeft,
                    i,
                    vec![mag.clone(), k(23 - m_bits as i64)],
                ),
                k(((127 - bias) as i64) << 23),
            ],
        );
        // Subnormal: mantissa * 2^(1 - bias - m), exact in f32.
        let sub = cast(
            Ew::Bitcast,
            i,
            op(
                OpKind::Multiply,
                DType::F32,
                vec![
                    cast(Ew::Convert, DType::F32, mant.clone()),
                    c(DType::F32, 2f64.powi(1 - bias - m_bits as i32)),
                ],
            ),
        );
        let finite = select(cmp(Eq, ef.clone(), k(0)), sub, normal);
        let all_ones = (1i64 << e_bits) - 1;
        let value = match m.family() {
            // A NaN keeps its payload below the quiet bit, so that encoding gives its pattern
            // back ([`kiln_ir::minifloat`]).
            Family::Ieee => select(
                cmp(Eq, ef, k(all_ones)),
                select(
                    cmp(Eq, mant.clone(), k(0)),
                    k(0x7f80_0000),
                    op(
                        OpKind::Or,
                        i,
                        vec![
                            nan.clone(),
                            op(OpKind::ShiftLeft, i, vec![mant, k(22 - m_bits as i64)]),
                        ],
                    ),
                ),
                finite,
            ),
            Family::Fn => select(cmp(Eq, mag, k(0x7f)), nan.clone(), finite),
            _ => finite,
        };
        let sign = op(
            OpKind::ShiftLeft,
            i,
            vec![
                op(OpKind::And, i, vec![code.clone(), k(sign_mask)]),
                k(32 - m.bits() as i64),
            ],
        );
        let signed = op(OpKind::Or, i, vec![value, sign]);
        if m.family() == Family::Fnuz {
            select(cmp(Eq, code, k(0x80)), nan, signed)
        } else {
            signed
        }
    };
    cast(Ew::Bitcast, DType::F32, bits)
}

/// `x` (f32 or f64) rounded to the small float `m`, as its bit pattern (a value of dtype
/// `Mini(m)`): ties to even (to the larger in `f8e8m0fnu`), then the format's rules for
/// overflow, NaN and zero ([`kiln_ir::minifloat`]).
pub fn encode(x: Expr, m: MiniFloat) -> Expr {
    use ComparisonDirection::*;
    // f8e8m0fnu reaches below f32's normal range: it rounds from f64's bits.
    let x = if m.family() == Family::Fnu && x.dtype() != DType::F64 {
        cast(Ew::Convert, DType::F64, x)
    } else {
        x
    };
    let fd = x.dtype();
    let (it, src_m, src_bias): (DType, i64, i64) = if fd == DType::F64 {
        (DType::I64, 52, 1023)
    } else {
        (DType::I32, 23, 127)
    };
    let k = |v: i64| c(it, v as f64);
    let (_, m_bits, bias) = m.layout();
    let (m_bits, bias) = (m_bits as i64, bias as i64);
    let bits = cast(Ew::Bitcast, it, x.clone());
    let abs_mask = if it == DType::I64 {
        i64::MAX
    } else {
        i32::MAX as i64
    };
    let inf_bits = (2 * src_bias + 1) << src_m;
    let mag = op(OpKind::And, it, vec![bits.clone(), k(abs_mask)]);
    let neg = cmp(Lt, bits, k(0));
    let nan = cmp(Gt, mag.clone(), k(inf_bits));
    // Normal results: rebias the exponent in place, round the mantissa at m bits.
    let d = src_m - m_bits;
    let n = op(
        OpKind::Subtract,
        it,
        vec![mag.clone(), k((src_bias - bias) << src_m)],
    );
    let code = if m.family() == Family::Fnu {
        let up = op(
            OpKind::ShiftRightArithmetic,
            it,
            vec![op(OpKind::Add, it, vec![n, k(1 << (d - 1))]), k(d)],
        );
        // Below 2^-127: the smallest value.
        op(OpKind::Maximum, it, vec![up, k(0)])
    } else {
        let lsb = op(
            OpKind::And,
            it,
            vec![
                op(OpKind::ShiftRightArithmetic, it, vec![n.clone(), k(d)]),
                k(1),
            ],
        );
        let half = op(OpKind::Add, it, vec![k((1 << (d - 1)) - 1), lsb]);
        let normal = op(
            OpKind::ShiftRightArithmetic,
            it,
            vec![op(OpKind::Add, it, vec![n, half]), k(d)],
        );
        // Subnormal results (below 2^emin): adding 2^(emin - m + src_m) rounds |x| to the
        // subnormal spacing (ties to even, by the float addition); the bits above that
        // constant's count the steps.
        let emin = 1 - bias;
        let magic = 2f64.powi((emin - m_bits + src_m) as i32);
        let magic_bits = if fd == DType::F64 {
            magic.to_bits() as i64
        } else {
            (magic as f32).to_bits() as i64
        };
        let sum = op(
            OpKind::Add,
            fd,
            vec![op(OpKind::Abs, fd, vec![x]), c(fd, magic)],
        );
        let sub = op(
            OpKind::Subtract,
            it,
            vec![cast(Ew::Bitcast, it, sum), k(magic_bits)],
        );
        let is_sub = cmp(Lt, mag.clone(), k((emin + src_bias) << src_m));
        select(is_sub, sub, normal)
    };
    let over = cmp(Gt, code.clone(), k(m.max_code() as i64));
    let sign = select(neg.clone(), k(m.sign_mask() as i64), k(0));
    let pattern = match m.family() {
        Family::Fnuz => select(
            or_p(nan, over),
            k(0x80),
            select(
                cmp(Eq, code.clone(), k(0)),
                k(0),
                op(OpKind::Or, it, vec![code, sign]),
            ),
        ),
        Family::Fnu => select(
            or_p(or_p(nan, over), or_p(neg, cmp(Eq, mag, k(0)))),
            k(0xff),
            code,
        ),
        _ => {
            let s = m.sign_mask();
            let nan_code = if m.family() == Family::Ieee {
                // The payload from the bits below the quiet bit, the quiet NaN when they are
                // zero ([`kiln_ir::minifloat`]).
                let q = op(
                    OpKind::And,
                    it,
                    vec![
                        op(
                            OpKind::ShiftRightLogical,
                            it,
                            vec![mag.clone(), k(src_m - 1 - m_bits)],
                        ),
                        k((1 << m_bits) - 1),
                    ],
                );
                let quiet = (m.nan_code(false) & !s) as i64;
                let ones = quiet & !((1 << m_bits) - 1);
                select(
                    cmp(Eq, q.clone(), k(0)),
                    k(quiet),
                    op(OpKind::Or, it, vec![q, k(ones)]),
                )
            } else {
                k((m.nan_code(false) & !s) as i64)
            };
            let magnitude = select(
                nan,
                nan_code,
                select(over, k((m.overflow_code(false) & !s) as i64), code),
            );
            op(OpKind::Or, it, vec![magnitude, sign])
        }
    };
    cast(
        Ew::Bitcast,
        DType::Mini(m),
        cast(Ew::Convert, DType::U8, pattern),
    )
}

/// The kernel expression of a `convert` of `arg` to `to` when either side is a small float:
/// through f32 (or f64) with [`decode`] and [`encode`].
pub fn convert(arg: Expr, to: DType) -> Expr {
    let from = arg.dtype();
    let x = match from.mini() {
        Some(m) => decode(arg, m),
        None => arg,
    };
    match to.mini() {
        Some(m) => {
            let x = match x.dtype() {
                DType::F64 | DType::F32 => x,
                DType::F16 | DType::BF16 | DType::Pred => cast(Ew::Convert, DType::F32, x),
                _ => cast(Ew::Convert, DType::F64, x),
            };
            encode(x, m)
        }
        None if to == DType::F32 => x,
        None => cast(Ew::Convert, to, x),
    }
}

#[cfg(test)]
mod tests;
