//! The scalar element operations both targets render the same way: a kernel-IR [`Ew`] op on
//! scalar LLVM values (arithmetic, integer ops with their out-of-range rules, comparisons,
//! select, clamp, conversions, bitcasts and f16/bf16 narrowing), constants, and the storage
//! form of each dtype. f16 and bf16 values are f32 in registers, `pred` an `i1`; the sub-byte
//! integers `i4`/`u4` (`i2`/`u2`) are LLVM `i4` (`i2`) in registers, so every operation wraps in
//! their width, and a byte in memory, sign- or zero-extended.

use super::fmod::Remainder;
use super::libm::Library;
use super::math::Math;
use super::trig::{Circular, Trig};
use super::{Base, llvm};
use crate::{Error, Result};
use inkwell::intrinsics::Intrinsic;
use inkwell::types::{BasicTypeEnum, FloatType, IntType};
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{Combiner, ComparisonDirection as Cmp, DType, OpKind};
use kiln_kernel::kernel::Ew;

/// The element operations, on any [`Base`].
pub(crate) trait Scalar<'c>: Base<'c> {
    fn ftype(&self, d: DType) -> FloatType<'c> {
        if d == DType::F64 {
            self.ctx().f64_type()
        } else {
            self.ctx().f32_type()
        }
    }

    fn itype(&self, d: DType) -> IntType<'c> {
        match d {
            DType::Pred => self.ctx().bool_type(),
            DType::I2 | DType::U2 | DType::I4 | DType::U4 => self
                .ctx()
                .custom_width_int_type(std::num::NonZeroU32::new(d.bits()).expect("nonzero"))
                .expect("a legal LLVM integer width"),
            // A small float's bit pattern, as it is stored.
            DType::I8 | DType::U8 | DType::Mini(_) => self.ctx().i8_type(),
            DType::I16 | DType::U16 => self.ctx().i16_type(),
            DType::I32 | DType::U32 => self.ctx().i32_type(),
            DType::I64
            | DType::U64
            | DType::F16
            | DType::BF16
            | DType::F32
            | DType::F64
            | DType::C64 => self.ctx().i64_type(),
            DType::C128 => self.ctx().i128_type(),
        }
    }

    /// The 64 bits of `hi:lo` (128 bits) starting `shift` (below 64) bits from the top:
    /// `hi << shift | lo >> (64 - shift)`, `hi` itself at 0 (LLVM's funnel shift).
    fn funnel_left(
        &self,
        hi: IntValue<'c>,
        lo: IntValue<'c>,
        shift: IntValue<'c>,
    ) -> Result<IntValue<'c>> {
        Ok(self
            .intrinsic(
                "llvm.fshl",
                hi.get_type().into(),
                &[hi.into(), lo.into(), shift.into()],
            )?
            .into_int_value())
    }

    fn intrinsic(
        &self,
        name: &str,
        ty: BasicTypeEnum<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let i = Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
        let decl = i
            .get_declaration(self.module(), &[ty])
            .ok_or_else(|| Error::Llvm(format!("cannot declare {name}")))?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        self.builder()
            .build_call(decl, &args, "r")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| Error::Llvm(format!("{name} returned nothing")))
    }

    fn load_value(&self, d: DType, raw: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        Ok(match d {
            DType::Pred => self
                .builder()
                .build_int_compare(
                    IntPredicate::NE,
                    raw.into_int_value(),
                    self.ctx().i8_type().const_zero(),
                    "p",
                )
                .map_err(llvm)?
                .into(),
            // The byte's low bits (the byte holds them sign- or zero-extended).
            d if d.is_sub_byte() => self
                .builder()
                .build_int_truncate(raw.into_int_value(), self.itype(d), "n")
                .map_err(llvm)?
                .into(),
            DType::F16 => {
                let h = self
                    .builder()
                    .build_bit_cast(raw, self.ctx().f16_type(), "h")
                    .map_err(llvm)?
                    .into_float_value();
                self.builder()
                    .build_float_ext(h, self.ctx().f32_type(), "f")
                    .map_err(llvm)?
                    .into()
            }
            DType::BF16 => {
                let w = self
                    .builder()
                    .build_int_z_extend(raw.into_int_value(), self.ctx().i32_type(), "w")
                    .map_err(llvm)?;
                let s = self
                    .builder()
                    .build_left_shift(w, self.ctx().i32_type().const_int(16, false), "s")
                    .map_err(llvm)?;
                self.builder()
                    .build_bit_cast(s, self.ctx().f32_type(), "f")
                    .map_err(llvm)?
            }
            _ => raw,
        })
    }

    fn store_value(&self, d: DType, v: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        let i32t = self.ctx().i32_type();
        Ok(match d {
            DType::Pred => self
                .builder()
                .build_int_z_extend(v.into_int_value(), self.ctx().i8_type(), "p")
                .map_err(llvm)?
                .into(),
            d if d.is_sub_byte() => self
                .builder()
                .build_int_cast_sign_flag(
                    v.into_int_value(),
                    self.ctx().i8_type(),
                    d.is_signed(),
                    "n",
                )
                .map_err(llvm)?
                .into(),
            DType::F16 => {
                let h = self
                    .builder()
                    .build_float_trunc(v.into_float_value(), self.ctx().f16_type(), "h")
                    .map_err(llvm)?;
                self.builder()
                    .build_bit_cast(h, self.ctx().i16_type(), "b")
                    .map_err(llvm)?
            }
            DType::BF16 => {
                // Round to nearest even on the top 16 bits.
                let bits = self
                    .builder()
                    .build_bit_cast(v, i32t, "bits")
                    .map_err(llvm)?
                    .into_int_value();
                let lsb = self
                    .builder()
                    .build_right_shift(bits, i32t.const_int(16, false), false, "l")
                    .map_err(llvm)?;
                let lsb = self
                    .builder()
                    .build_and(lsb, i32t.const_int(1, false), "l1")
                    .map_err(llvm)?;
                let bias = self
                    .builder()
                    .build_int_add(lsb, i32t.const_int(0x7FFF, false), "bias")
                    .map_err(llvm)?;
                let rounded = self
                    .builder()
                    .build_int_add(bits, bias, "r")
                    .map_err(llvm)?;
                let top = self
                    .builder()
                    .build_right_shift(rounded, i32t.const_int(16, false), false, "t")
                    .map_err(llvm)?;
                let isnan = self
                    .builder()
                    .build_float_compare(
                        FloatPredicate::UNO,
                        v.into_float_value(),
                        v.into_float_value(),
                        "nan",
                    )
                    .map_err(llvm)?;
                // A NaN keeps its sign and the top of its payload, quieted (as the reference's
                // conversion does), so its bits agree wherever they are read back.
                let high = self
                    .builder()
                    .build_right_shift(bits, i32t.const_int(16, false), false, "hi")
                    .map_err(llvm)?;
                let quiet = self
                    .builder()
                    .build_or(high, i32t.const_int(0x40, false), "qn")
                    .map_err(llvm)?;
                let q = self
                    .builder()
                    .build_select(isnan, quiet, top, "q")
                    .map_err(llvm)?
                    .into_int_value();
                self.builder()
                    .build_int_truncate(q, self.ctx().i16_type(), "h")
                    .map_err(llvm)?
                    .into()
            }
            _ => v,
        })
    }

    fn constant(&self, d: DType, x: f64) -> BasicValueEnum<'c> {
        if d.is_float() && d.mini().is_none() {
            self.ftype(d)
                .const_float(kiln_ir::literal::round_to(d, x))
                .into()
        } else if let Some(m) = d.mini() {
            // A small float is its bit pattern.
            self.itype(d).const_int(m.from_f64(x) as u64, false).into()
        } else if d == DType::Pred {
            self.ctx()
                .bool_type()
                .const_int((x != 0.0) as u64, false)
                .into()
        } else if d.is_sub_byte() {
            // The value's low bits, which is all an `i4` or `i2` holds.
            let mask = (1u64 << d.bits()) - 1;
            self.itype(d)
                .const_int(kiln_ir::literal::convert_f64(d, x) as u64 & mask, false)
                .into()
        } else {
            self.itype(d)
                .const_int(kiln_ir::literal::convert_f64(d, x) as u64, true)
                .into()
        }
    }

    /// `cond ? a : e` for floats.
    fn select_float(
        &self,
        cond: IntValue<'c>,
        a: FloatValue<'c>,
        e: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        Ok(self
            .builder()
            .build_select(cond, a, e, "s")
            .map_err(llvm)?
            .into_float_value())
    }

    fn combine(
        &self,
        kind: Combiner,
        d: DType,
        a: BasicValueEnum<'c>,
        x: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
        self.combine_with(kind, d, a, x, true)
    }

    /// [`Emitter::combine`], with float sums and products marked reassociable or not.
    fn combine_with(
        &self,
        kind: Combiner,
        d: DType,
        a: BasicValueEnum<'c>,
        x: BasicValueEnum<'c>,
        reassoc: bool,
    ) -> Result<BasicValueEnum<'c>> {
        // A replacing scatter keeps the update (the last one, in the kernel's order).
        if kind == Combiner::Replace {
            return Ok(x);
        }
        let k = match (kind, d) {
            (Combiner::Add, DType::Pred) | (Combiner::Max, DType::Pred) | (Combiner::Or, _) => {
                OpKind::Or
            }
            (Combiner::Mul, DType::Pred) | (Combiner::Min, DType::Pred) | (Combiner::And, _) => {
                OpKind::And
            }
            (Combiner::Add, _) | (Combiner::Replace, _) => OpKind::Add,
            (Combiner::Mul, _) => OpKind::Multiply,
            (Combiner::Max, _) => OpKind::Maximum,
            (Combiner::Min, _) => OpKind::Minimum,
        };
        let r = self.op(&Ew::Kind(k), d, d, &[a, x])?;
        // Float sums and products may be reassociated, so the loop vectorizer can keep several
        // partial accumulators (a scalar chain runs at one add per FMA latency). The order is
        // fixed at compile time, so results are the same on every run.
        if reassoc
            && d.is_float()
            && matches!(k, OpKind::Add | OpKind::Multiply)
            && let Some(inst) = r.as_instruction_value()
        {
            inst.set_fast_math_flags(inkwell::values::FastMathFlags::AllowReassoc)
                .map_err(llvm)?;
        }
        Ok(r)
    }

    fn op(
        &self,
        op: &Ew,
        d: DType,
        out: DType,
        v: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let b = self.builder();
        match op {
            Ew::Select => Ok(b
                .build_select(v[0].into_int_value(), v[1], v[2], "sel")
                .map_err(llvm)?),
            Ew::Clamp => {
                let m = self.op(&Ew::Kind(OpKind::Maximum), d, d, &[v[1], v[0]])?;
                self.op(&Ew::Kind(OpKind::Minimum), d, d, &[m, v[2]])
            }
            Ew::Convert => self.convert(d, out, v[0]),
            Ew::Narrow => self.load_value(out, self.store_value(out, v[0])?),
            // A small float's bit pattern and a u8 are the same byte.
            Ew::Bitcast if out.mini().is_some() || d.mini().is_some() => Ok(v[0]),
            Ew::Bitcast => {
                let to: BasicTypeEnum = if out.is_float() && out.mini().is_none() {
                    self.ftype(out).into()
                } else {
                    self.itype(out).into()
                };
                Ok(b.build_bit_cast(v[0], to, "bc").map_err(llvm)?)
            }
            Ew::Cmp(dir) => {
                if d.is_float() {
                    let p = match dir {
                        Cmp::Eq => FloatPredicate::OEQ,
                        Cmp::Ne => FloatPredicate::UNE,
                        Cmp::Lt => FloatPredicate::OLT,
                        Cmp::Le => FloatPredicate::OLE,
                        Cmp::Gt => FloatPredicate::OGT,
                        Cmp::Ge => FloatPredicate::OGE,
                    };
                    Ok(b.build_float_compare(
                        p,
                        v[0].into_float_value(),
                        v[1].into_float_value(),
                        "c",
                    )
                    .map_err(llvm)?
                    .into())
                } else {
                    let signed = d.is_signed();
                    let p = match (dir, signed) {
                        (Cmp::Eq, _) => IntPredicate::EQ,
                        (Cmp::Ne, _) => IntPredicate::NE,
                        (Cmp::Lt, true) => IntPredicate::SLT,
                        (Cmp::Le, true) => IntPredicate::SLE,
                        (Cmp::Gt, true) => IntPredicate::SGT,
                        (Cmp::Ge, true) => IntPredicate::SGE,
                        (Cmp::Lt, false) => IntPredicate::ULT,
                        (Cmp::Le, false) => IntPredicate::ULE,
                        (Cmp::Gt, false) => IntPredicate::UGT,
                        (Cmp::Ge, false) => IntPredicate::UGE,
                    };
                    Ok(
                        b.build_int_compare(p, v[0].into_int_value(), v[1].into_int_value(), "c")
                            .map_err(llvm)?
                            .into(),
                    )
                }
            }
            Ew::Kind(k) if d.is_float() => self.float_op(*k, d, v),
            Ew::Kind(k) => self.int_op(*k, d, v),
        }
    }

    fn float_op(
        &self,
        k: OpKind,
        d: DType,
        v: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let b = self.builder();
        let ft = self.ftype(d);
        let x = v[0].into_float_value();
        let y = v.get(1).map(|y| y.into_float_value());
        let one = ft.const_float(1.0);
        let intr = |name: &str| self.intrinsic(name, ft.into(), v);
        let r: BasicValueEnum = match k {
            OpKind::Add => b
                .build_float_add(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Subtract => b
                .build_float_sub(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Multiply => b
                .build_float_mul(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Divide => b
                .build_float_div(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Remainder if self.inline_library() => {
                self.fmod_exact(d, x, y.expect("binary"))?.into()
            }
            OpKind::Remainder => b
                .build_float_rem(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Maximum => intr("llvm.maximum")?,
            OpKind::Minimum => intr("llvm.minimum")?,
            OpKind::Power if self.inline_library() => {
                self.pow_narrow(d, x, y.expect("binary"))?.into()
            }
            OpKind::Power => intr("llvm.pow")?,
            OpKind::Atan2 if self.inline_library() => {
                self.atan2_narrow(d, x, y.expect("binary"))?.into()
            }
            OpKind::Atan2 => intr("llvm.atan2")?,
            OpKind::Negate => b.build_float_neg(x, "r").map_err(llvm)?.into(),
            OpKind::Abs => intr("llvm.fabs")?,
            OpKind::Sign => {
                let pos = b
                    .build_float_compare(FloatPredicate::OGT, x, ft.const_zero(), "pos")
                    .map_err(llvm)?;
                let neg = b
                    .build_float_compare(FloatPredicate::OLT, x, ft.const_zero(), "neg")
                    .map_err(llvm)?;
                let s = b
                    .build_select(neg, ft.const_float(-1.0), x, "s")
                    .map_err(llvm)?;
                b.build_select(pos, one.into(), s, "r").map_err(llvm)?
            }
            OpKind::Exponential => self.exp_known(self.take_exp_arg(), d, x)?.into(),
            OpKind::Log => self.log_fast(d, x)?.into(),
            OpKind::LogPlusOne => self.libm_call("log1p", d, x)?.into(),
            OpKind::ExponentialMinusOne => self.libm_call("expm1", d, x)?.into(),
            OpKind::Sqrt => intr("llvm.sqrt")?,
            OpKind::Rsqrt => {
                let s = intr("llvm.sqrt")?.into_float_value();
                b.build_float_div(one, s, "r").map_err(llvm)?.into()
            }
            OpKind::Tanh => self.tanh_fast(d, x)?.into(),
            OpKind::Logistic => self.logistic_fast(d, x)?.into(),
            OpKind::Sine if self.inline_library() => self.circular(Circular::Sin, d, x)?.into(),
            OpKind::Sine => intr("llvm.sin")?,
            OpKind::Cosine if self.inline_library() => self.circular(Circular::Cos, d, x)?.into(),
            OpKind::Cosine => intr("llvm.cos")?,
            OpKind::Tan if self.inline_library() => self.circular(Circular::Tan, d, x)?.into(),
            OpKind::Tan => intr("llvm.tan")?,
            OpKind::Cbrt => self.libm_call("cbrt", d, x)?.into(),
            OpKind::Erf => self.erf_fast(d, x)?.into(),
            OpKind::Floor => intr("llvm.floor")?,
            OpKind::Ceil => intr("llvm.ceil")?,
            OpKind::RoundNearestAfz => intr("llvm.round")?,
            OpKind::RoundNearestEven => intr("llvm.roundeven")?,
            OpKind::IsFinite => {
                let a = intr("llvm.fabs")?.into_float_value();
                b.build_float_compare(FloatPredicate::ONE, a, ft.const_float(f64::INFINITY), "r")
                    .map_err(llvm)?
                    .into()
            }
            other => return Err(Error::Unsupported(format!("`{other}` on {d}"))),
        };
        Ok(r)
    }

    /// `x` to the power `y` in wrapping integer arithmetic: square-and-multiply over every bit
    /// of `y` (straight-line code, so it vectorizes). A negative exponent gives 1 for a base of
    /// 1, +-1 for -1 (by the exponent's parity) and 0 otherwise.
    fn int_pow(
        &self,
        it: IntType<'c>,
        signed: bool,
        x: IntValue<'c>,
        y: IntValue<'c>,
    ) -> Result<IntValue<'c>> {
        let b = self.builder();
        let one = it.const_int(1, false);
        let sel = |c: IntValue<'c>, t: IntValue<'c>, e: IntValue<'c>| -> Result<IntValue<'c>> {
            Ok(b.build_select(c, t, e, "s").map_err(llvm)?.into_int_value())
        };
        let odd = |e: IntValue<'c>| -> Result<IntValue<'c>> {
            let bit = b.build_and(e, one, "bit").map_err(llvm)?;
            b.build_int_compare(IntPredicate::NE, bit, it.const_zero(), "odd")
                .map_err(llvm)
        };
        let (mut acc, mut base, mut e) = (one, x, y);
        for step in 0..it.get_bit_width() {
            let times = b.build_int_mul(acc, base, "t").map_err(llvm)?;
            acc = sel(odd(e)?, times, acc)?;
            if step + 1 < it.get_bit_width() {
                base = b.build_int_mul(base, base, "sq").map_err(llvm)?;
                e = b.build_right_shift(e, one, false, "e").map_err(llvm)?;
            }
        }
        if !signed {
            return Ok(acc);
        }
        let minus_one = it.const_all_ones();
        let is = |v: IntValue<'c>| {
            b.build_int_compare(IntPredicate::EQ, x, v, "is")
                .map_err(llvm)
        };
        let parity = sel(odd(y)?, minus_one, one)?;
        let neg = sel(is(one)?, one, sel(is(minus_one)?, parity, it.const_zero())?)?;
        let negative = b
            .build_int_compare(IntPredicate::SLT, y, it.const_zero(), "neg")
            .map_err(llvm)?;
        sel(negative, neg, acc)
    }

    fn int_op(&self, k: OpKind, d: DType, v: &[BasicValueEnum<'c>]) -> Result<BasicValueEnum<'c>> {
        let b = self.builder();
        let it = self.itype(d);
        let x = v[0].into_int_value();
        let y = v.get(1).map(|y| y.into_int_value());
        let signed = d.is_signed();
        let pred = d == DType::Pred;
        let bits = it.get_bit_width() as u64;
        let intr = |name: &str| self.intrinsic(name, it.into(), v);
        let r: BasicValueEnum = match k {
            OpKind::Add if pred => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Multiply if pred => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Maximum if pred => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Minimum if pred => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Add => b
                .build_int_add(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Subtract => b
                .build_int_sub(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Multiply => b
                .build_int_mul(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Power => self.int_pow(it, signed, x, y.expect("binary"))?.into(),
            OpKind::Divide | OpKind::Remainder => {
                let y = y.expect("binary");
                let zero = b
                    .build_int_compare(IntPredicate::EQ, y, it.const_zero(), "z")
                    .map_err(llvm)?;
                let min = it.const_int(1u64 << (bits - 1), false);
                let all = it.const_all_ones();
                let overflow = if signed {
                    let a = b
                        .build_int_compare(IntPredicate::EQ, x, min, "a")
                        .map_err(llvm)?;
                    let c = b
                        .build_int_compare(IntPredicate::EQ, y, all, "c")
                        .map_err(llvm)?;
                    b.build_and(a, c, "o").map_err(llvm)?
                } else {
                    self.ctx().bool_type().const_zero()
                };
                let bad = b.build_or(zero, overflow, "bad").map_err(llvm)?;
                let safe_y = b
                    .build_select(bad, it.const_int(1, false), y, "sy")
                    .map_err(llvm)?
                    .into_int_value();
                if k == OpKind::Divide {
                    let q = if signed {
                        b.build_int_signed_div(x, safe_y, "q")
                    } else {
                        b.build_int_unsigned_div(x, safe_y, "q")
                    }
                    .map_err(llvm)?;
                    // x / 0 = -1 (all bits); MIN / -1 = MIN.
                    let q = b.build_select(overflow, min, q, "q1").map_err(llvm)?;
                    b.build_select(zero, all.into(), q, "r").map_err(llvm)?
                } else {
                    let q = if signed {
                        b.build_int_signed_rem(x, safe_y, "q")
                    } else {
                        b.build_int_unsigned_rem(x, safe_y, "q")
                    }
                    .map_err(llvm)?;
                    // x % 0 = x; MIN % -1 = 0.
                    let q = b
                        .build_select(overflow, it.const_zero(), q, "q1")
                        .map_err(llvm)?;
                    b.build_select(zero, x.into(), q, "r").map_err(llvm)?
                }
            }
            OpKind::Maximum => intr(if signed { "llvm.smax" } else { "llvm.umax" })?,
            OpKind::Minimum => intr(if signed { "llvm.smin" } else { "llvm.umin" })?,
            OpKind::And => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Or => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Xor => b
                .build_xor(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Not => b.build_not(x, "r").map_err(llvm)?.into(),
            OpKind::ShiftLeft | OpKind::ShiftRightLogical => {
                let y = y.expect("binary");
                // Amounts outside [0, bits) give 0 (as unsigned, negatives are huge).
                let inside = b
                    .build_int_compare(IntPredicate::ULT, y, it.const_int(bits, false), "in")
                    .map_err(llvm)?;
                let safe = b
                    .build_select(inside, y, it.const_zero(), "s")
                    .map_err(llvm)?
                    .into_int_value();
                let sh = if k == OpKind::ShiftLeft {
                    b.build_left_shift(x, safe, "sh")
                } else {
                    b.build_right_shift(x, safe, false, "sh")
                }
                .map_err(llvm)?;
                b.build_select(inside, sh, it.const_zero(), "r")
                    .map_err(llvm)?
            }
            OpKind::ShiftRightArithmetic => {
                // Amounts outside [0, bits) shift by bits - 1: the top bit fills everything.
                let y = y.expect("binary");
                let inside = b
                    .build_int_compare(IntPredicate::ULT, y, it.const_int(bits, false), "in")
                    .map_err(llvm)?;
                let safe = b
                    .build_select(inside, y, it.const_int(bits - 1, false), "s")
                    .map_err(llvm)?
                    .into_int_value();
                b.build_right_shift(x, safe, true, "r")
                    .map_err(llvm)?
                    .into()
            }
            OpKind::Popcnt => intr("llvm.ctpop")?,
            OpKind::CountLeadingZeros => self.intrinsic(
                "llvm.ctlz",
                it.into(),
                &[x.into(), self.ctx().bool_type().const_zero().into()],
            )?,
            OpKind::Negate => b.build_int_neg(x, "r").map_err(llvm)?.into(),
            OpKind::Abs => {
                let neg = b
                    .build_int_compare(IntPredicate::SLT, x, it.const_zero(), "n")
                    .map_err(llvm)?;
                let nx = b.build_int_neg(x, "nx").map_err(llvm)?;
                b.build_select(neg, nx, x, "r").map_err(llvm)?
            }
            OpKind::Sign => {
                let pos = b
                    .build_int_compare(IntPredicate::SGT, x, it.const_zero(), "p")
                    .map_err(llvm)?;
                let neg = b
                    .build_int_compare(IntPredicate::SLT, x, it.const_zero(), "n")
                    .map_err(llvm)?;
                let s = b
                    .build_select(neg, it.const_all_ones(), it.const_zero(), "s")
                    .map_err(llvm)?
                    .into_int_value();
                b.build_select(pos, it.const_int(1, false), s, "r")
                    .map_err(llvm)?
            }
            other => return Err(Error::Unsupported(format!("`{other}` on {d}"))),
        };
        Ok(r)
    }

    fn convert(&self, from: DType, to: DType, v: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        let b = self.builder();
        if from.is_float() && to.is_float() {
            let (ff, tf) = (self.ftype(from), self.ftype(to));
            let x = v.into_float_value();
            // f16/bf16 values are f32 in registers; rounding happens on store.
            return Ok(if ff == tf {
                x.into()
            } else if tf == self.ctx().f64_type() {
                b.build_float_ext(x, tf, "c").map_err(llvm)?.into()
            } else {
                b.build_float_trunc(x, tf, "c").map_err(llvm)?.into()
            });
        }
        if from.is_float() {
            let x = v.into_float_value();
            if to == DType::Pred {
                return Ok(b
                    .build_float_compare(FloatPredicate::UNE, x, self.ftype(from).const_zero(), "c")
                    .map_err(llvm)?
                    .into());
            }
            let it = self.itype(to);
            let name = if to.is_signed() {
                "llvm.fptosi.sat"
            } else {
                "llvm.fptoui.sat"
            };
            let i =
                Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
            let decl = i
                .get_declaration(self.module(), &[it.into(), self.ftype(from).into()])
                .ok_or_else(|| Error::Llvm(format!("cannot declare {name}")))?;
            return b
                .build_call(decl, &[x.into()], "c")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| Error::Llvm("no result".into()));
        }
        let x = v.into_int_value();
        let unsigned_src = !from.is_signed();
        if to.is_float() {
            let ft = self.ftype(to);
            return Ok(if unsigned_src {
                b.build_unsigned_int_to_float(x, ft, "c")
            } else {
                b.build_signed_int_to_float(x, ft, "c")
            }
            .map_err(llvm)?
            .into());
        }
        if to == DType::Pred {
            return Ok(b
                .build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "c")
                .map_err(llvm)?
                .into());
        }
        let it = self.itype(to);
        let (fw, tw) = (x.get_type().get_bit_width(), it.get_bit_width());
        Ok(if fw == tw {
            x.into()
        } else if fw > tw {
            b.build_int_truncate(x, it, "c").map_err(llvm)?.into()
        } else if unsigned_src {
            b.build_int_z_extend(x, it, "c").map_err(llvm)?.into()
        } else {
            b.build_int_s_extend(x, it, "c").map_err(llvm)?.into()
        })
    }
}

impl<'c, T: Base<'c> + ?Sized> Scalar<'c> for T {}
