//! Quantized types (`tensor<2x!quant.uniform<i8:f32, 0.1:-30>>`) and their ops, decomposed at
//! import: kiln's IR has no quantized types, so a quantized tensor is imported as a tensor of
//! its storage type, and every op on quantized tensors becomes kiln ops on that storage.
//!
//! The element type, as StableHLO's spec writes it:
//!
//! ```text
//! !quant.uniform<STORAGE[<MIN:MAX>]:EXPRESSED[:DIM], SCALE[:ZP] | {SCALE[:ZP], ...}>
//! ```
//!
//! (`i8`, `u8`, `ui8`, ... storage; `f16`, `bf16`, `f32`, `f64` expressed; a zero point left out
//! is 0; `MIN:MAX` default to the storage type's range; with `DIM`, one scale and zero point
//! per slice of that dimension.) The decompositions follow the spec's "Quantization
//! computations":
//!
//! | StableHLO | kiln ops |
//! |---|---|
//! | `dequantize(x)` | `convert` to `i64`, `subtract` the zero points, `convert` to the expressed type, `multiply` by the scales |
//! | `quantize(x)` | `divide` by the scales, `add` the zero points, `clamp` to `[MIN, MAX]`, `round_nearest_even`, `convert` to the storage type |
//! | `uniform_quantize` | `quantize`, of a float or of a dequantized operand (requantization) |
//! | `uniform_dequantize` | `dequantize` |
//! | `bitcast_convert` | the `bitcast_convert` of the storage |
//! | `constant` | the constant of the storage (its elements are the stored integers) |
//! | any other op | `dequantize` each quantized operand, the op in the expressed type, `quantize` each quantized result (`dequantize_op_quantize`) |
//!
//! Per-axis scales and zero points are constants of the dimension's size broadcast along it
//! (`broadcast_in_dim`). The zero point is subtracted in `i64`, not the storage type, so a
//! difference beyond the storage range (`127 - -128`) does not wrap.
//!
//! A quantized function parameter or result, or block argument, is its storage tensor, and
//! so is a quantized operand or result of an op that only moves values ([`passes_storage`]:
//! `func.call`, `while`, `if`, `case`): the ops that compute on them inside decompose as
//! their own signatures say. Any other op with regions (`reduce`, `sort`, ...) or a check on
//! quantized types, or a quantized type outside a signature, is a located `unsupported`
//! error.

use crate::ast::{OpAst, Sig};
use crate::error::{Error, Pos, Result, quote};
use crate::import::{Body, push, result_types, value_type};
use crate::lexer::Tok;
use crate::parser::Cursor;
use kiln_ir::{DType, Literal, Op, TensorType, ValueId};

/// A uniform quantized element type.
#[derive(Clone, Debug, PartialEq)]
pub struct Quant {
    /// Where the type is written.
    pub pos: Pos,
    /// The integer type the values are stored in.
    pub storage: DType,
    /// The smallest stored value.
    pub storage_min: i64,
    /// The largest stored value.
    pub storage_max: i64,
    /// The float type the values stand for.
    pub expressed: DType,
    /// The quantization dimension, when per-axis.
    pub axis: Option<usize>,
    /// The scales: one per-tensor, else one per slice of `axis`.
    pub scales: Vec<f64>,
    /// The zero points, one per scale.
    pub zero_points: Vec<i64>,
}

impl Quant {
    /// The storage tensor of shape `shape`.
    pub fn storage_type(&self, shape: &[usize]) -> TensorType {
        TensorType::new(self.storage, shape.to_vec())
    }

    /// The expressed tensor of shape `shape`.
    pub fn expressed_type(&self, shape: &[usize]) -> TensorType {
        TensorType::new(self.expressed, shape.to_vec())
    }

    /// Checks the per-axis constraints against the tensor's shape (the spec's C12 and C13).
    pub fn check_shape(&self, shape: &[usize], pos: Pos) -> Result<()> {
        let Some(d) = self.axis else {
            return Ok(());
        };
        if d >= shape.len() {
            return Err(Error::invalid(
                pos,
                format!(
                    "quantization dimension {d} of a tensor of rank {} (C12)",
                    shape.len()
                ),
            ));
        }
        if shape[d] != self.scales.len() {
            return Err(Error::invalid(
                pos,
                format!(
                    "quantization dimension {d} has size {}, but there are {} scales (C13)",
                    shape[d],
                    self.scales.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The storage dtype of a quantized type's storage name (`i8`, `u8`, `ui8`, ...).
fn storage_dtype(name: &str, pos: Pos) -> Result<DType> {
    let kiln = match name.strip_prefix('u') {
        Some(w) if !w.starts_with('i') => format!("ui{w}"),
        _ => name.to_string(),
    };
    let d = crate::types::dtype(&kiln, pos)?;
    if !d.is_int() {
        return Err(Error::invalid(
            pos,
            format!(
                "the storage type of a quantized type is an integer type, not {}",
                quote(name)
            ),
        ));
    }
    Ok(d)
}

impl Cursor<'_> {
    /// Parses a quantized element type, its `!quant.uniform` the current token.
    pub fn quant_element(&mut self) -> Result<Quant> {
        let pos = self.pos();
        match *self.peek() {
            Tok::Bang("quant.uniform") => {}
            Tok::Bang(w) => {
                return Err(Error::unsupported(
                    pos,
                    format!(
                        "element type {} (kiln reads `!quant.uniform`)",
                        quote(&format!("!{w}"))
                    ),
                ));
            }
            _ => return self.expected("`!quant.uniform`"),
        }
        self.bump();
        self.expect("<")?;
        let spos = self.pos();
        let storage = storage_dtype(self.ident("a storage type such as `i8`")?, spos)?;
        let Some((lo, hi)) = storage.int_bounds() else {
            return Err(Error::invalid(spos, "a storage type without a range"));
        };
        let (lo, hi) = (lo as i64, hi as i64);
        let (mut storage_min, mut storage_max) = (lo, hi);
        if self.eat("<") {
            let mpos = self.pos();
            storage_min = self.int_literal("the storage minimum")?;
            self.expect(":")?;
            storage_max = self.int_literal("the storage maximum")?;
            self.expect(">")?;
            if !(lo <= storage_min && storage_min < storage_max && storage_max <= hi) {
                return Err(Error::invalid(
                    mpos,
                    format!(
                        "storage range {storage_min}:{storage_max} is not within {lo}:{hi} with min < max (C3)"
                    ),
                ));
            }
        }
        self.expect(":")?;
        let epos = self.pos();
        let expressed = crate::types::dtype(self.ident("an expressed type such as `f32`")?, epos)?;
        if !matches!(
            expressed,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64
        ) {
            return Err(Error::unsupported(
                epos,
                format!(
                    "quantized types expressed in {} (kiln reads f16, bf16, f32 and f64)",
                    crate::types::element_name(expressed)
                ),
            ));
        }
        let mut axis = None;
        if self.eat(":") {
            let apos = self.pos();
            let d = self.int_literal("the quantization dimension")?;
            axis = Some(usize::try_from(d).map_err(|_| {
                Error::invalid(
                    apos,
                    format!("quantization dimension {d} is negative (C11)"),
                )
            })?);
        }
        self.expect(",")?;
        let ppos = self.pos();
        let mut params = Vec::new();
        if self.eat("{") {
            loop {
                params.push(self.quant_param(storage_min, storage_max)?);
                if self.eat("}") {
                    break;
                }
                self.expect(",")?;
            }
        } else {
            params.push(self.quant_param(storage_min, storage_max)?);
        }
        self.expect(">")?;
        if axis.is_none() && params.len() != 1 {
            return Err(Error::invalid(
                ppos,
                format!(
                    "{} scales without a quantization dimension (C10)",
                    params.len()
                ),
            ));
        }
        let (scales, zero_points) = params.into_iter().unzip();
        Ok(Quant {
            pos,
            storage,
            storage_min,
            storage_max,
            expressed,
            axis,
            scales,
            zero_points,
        })
    }

    /// `SCALE[:ZERO_POINT]`, checked (C5, C6, C7).
    fn quant_param(&mut self, min: i64, max: i64) -> Result<(f64, i64)> {
        let pos = self.pos();
        let scale = match *self.peek() {
            Tok::Number(s) => match crate::attrs::parse_elem(s, pos)? {
                crate::ast::Elem::Int(i) => i as f64,
                crate::ast::Elem::Float(f) => f,
                _ => return self.expected("a scale"),
            },
            _ => return self.expected("a scale such as `0.1`"),
        };
        self.bump();
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(
                pos,
                format!("scale {scale} is not positive and finite (C5, C6)"),
            ));
        }
        let mut zp = 0;
        if self.eat(":") {
            let zpos = self.pos();
            zp = self.int_literal("a zero point")?;
            if !(min..=max).contains(&zp) {
                return Err(Error::invalid(
                    zpos,
                    format!("zero point {zp} is outside the storage range {min}:{max} (C7)"),
                ));
            }
        }
        Ok((scale, zp))
    }

    /// An integer literal that fits in 64 bits.
    fn int_literal(&mut self, what: &str) -> Result<i64> {
        let Tok::Number(s) = *self.peek() else {
            return self.expected(what);
        };
        let Ok(v) = s.parse::<i64>() else {
            return self.expected(what);
        };
        self.bump();
        Ok(v)
    }
}

/// The quantized types of an op's operands and results, from its signature.
type Sides = (Vec<Option<Quant>>, Vec<Option<Quant>>);

/// Splits the quantized types of `op`'s signature into its operands' and its results'.
fn sides(op: &OpAst) -> Result<Sides> {
    let (nin, nout) = (op.operands.len(), op.results.len());
    let q = &op.quant;
    match &op.sig {
        Sig::Func(ins, outs) if q.len() == ins.len() + outs.len() => {
            Ok((q[..ins.len()].to_vec(), q[ins.len()..].to_vec()))
        }
        Sig::List(ts) if q.len() == ts.len() && ts.len() == 1 => {
            Ok((vec![q[0].clone(); nin], vec![q[0].clone(); nout]))
        }
        Sig::List(ts) if q.len() == ts.len() && ts.len() == nin + nout => {
            Ok((q[..nin].to_vec(), q[nin..].to_vec()))
        }
        _ => Err(Error::unsupported(
            op.pos,
            format!(
                "quantized types in this signature of `{}` (write it as `(operand types) -> result types`)",
                op.name
            ),
        )),
    }
}

/// `op`'s signature with every quantized type replaced by its expressed type.
fn expressed_sig(op: &OpAst) -> Sig {
    let swap = |t: &TensorType, q: Option<&Option<Quant>>| match q {
        Some(Some(q)) => q.expressed_type(&t.shape),
        _ => t.clone(),
    };
    match &op.sig {
        Sig::Func(ins, outs) => Sig::Func(
            ins.iter()
                .enumerate()
                .map(|(i, t)| swap(t, op.quant.get(i)))
                .collect(),
            outs.iter()
                .enumerate()
                .map(|(i, t)| swap(t, op.quant.get(ins.len() + i)))
                .collect(),
        ),
        Sig::List(ts) => Sig::List(
            ts.iter()
                .enumerate()
                .map(|(i, t)| swap(t, op.quant.get(i)))
                .collect(),
        ),
        Sig::None => Sig::None,
    }
}

/// Whether `name` moves quantized values without computing on them, so that it takes and
/// gives their storage tensors as they are: a call, and the control flow ops `while`, `if`
/// and `case` (the ops of their regions and callees decompose as their own signatures say).
pub fn passes_storage(name: &str) -> bool {
    matches!(
        name,
        "func.call" | "stablehlo.while" | "stablehlo.if" | "stablehlo.case"
    )
}

/// Imports an op whose signature has quantized types (see the module's table).
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let name = op.name.as_str();
    if !op.regions.is_empty()
        || !name.starts_with("stablehlo.")
        || crate::collective::handles(name)
        || crate::collective::has_region(name)
        || matches!(name, "stablehlo.composite" | "stablehlo.custom_call")
    {
        return Err(Error::unsupported(
            op.pos,
            format!("quantized types in `{name}` (kiln decomposes them in ops without regions)"),
        ));
    }
    let (ins, outs) = sides(op)?;
    for (&a, q) in args.iter().zip(&ins) {
        if let Some(q) = q {
            q.check_shape(&value_type(body, a)?.shape, op.pos)?;
        }
    }
    match name {
        // The elements of a quantized constant are its stored values.
        "stablehlo.bitcast_convert" | "stablehlo.constant" => crate::ops::map_op(body, op, args),
        "stablehlo.uniform_quantize" => {
            let ([x], [Some(rq)]) = (args, &outs[..]) else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.uniform_quantize` takes one operand and has one quantized result",
                ));
            };
            let x = match &ins[0] {
                Some(q) => dequantize(body, op, *x, q)?,
                None => *x,
            };
            Ok(vec![quantize(body, op, x, rq)?])
        }
        "stablehlo.uniform_dequantize" => {
            let ([x], [Some(q)], [None]) = (args, &ins[..], &outs[..]) else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.uniform_dequantize` takes one quantized operand and has one float result",
                ));
            };
            let r = dequantize(body, op, *x, q)?;
            if let Some([t]) = result_types(op).as_deref() {
                let got = value_type(body, r)?;
                if got != *t {
                    return Err(Error::invalid(
                        op.pos,
                        format!(
                            "`{name}` of {} is {}, the signature says {}",
                            crate::types::element_name(q.expressed),
                            crate::literal::type_name(&got),
                            crate::literal::type_name(t)
                        ),
                    ));
                }
            }
            Ok(vec![r])
        }
        _ => {
            let mut float_args = Vec::with_capacity(args.len());
            for (&a, q) in args.iter().zip(&ins) {
                float_args.push(match q {
                    Some(q) => dequantize(body, op, a, q)?,
                    None => a,
                });
            }
            let float_op = OpAst {
                sig: expressed_sig(op),
                quant: Vec::new(),
                ..op.clone()
            };
            let rs = crate::ops::map_op(body, &float_op, &float_args)?;
            let mut out = Vec::with_capacity(rs.len());
            for (i, r) in rs.into_iter().enumerate() {
                out.push(match outs.get(i) {
                    Some(Some(q)) => quantize(body, op, r, q)?,
                    _ => r,
                });
            }
            Ok(out)
        }
    }
}

/// One kiln instruction for `op` with the result type `ty`.
fn emit(
    body: &mut Body,
    op: &OpAst,
    kop: Op,
    operands: &[ValueId],
    ty: TensorType,
) -> Result<ValueId> {
    Ok(push(body, op, kop, operands, Some(&[ty]))?[0])
}

/// A tensor of shape `shape` holding `values` (one per-tensor, or one per slice of `axis`),
/// as a constant broadcast along `axis`.
fn params(
    body: &mut Body,
    op: &OpAst,
    values: Literal,
    shape: &[usize],
    axis: Option<usize>,
) -> Result<ValueId> {
    let dtype = values.dtype();
    let c = emit(
        body,
        op,
        Op::Constant {
            value: values.clone(),
        },
        &[],
        values.ty().clone(),
    )?;
    body.consts.insert(c, values);
    let broadcast_dimensions = axis.map(|d| vec![d as i64]).unwrap_or_default();
    emit(
        body,
        op,
        Op::BroadcastInDim {
            broadcast_dimensions,
        },
        &[c],
        TensorType::new(dtype, shape.to_vec()),
    )
}

/// The literal of `values` in `dtype`: a scalar per-tensor, a vector per-axis.
fn param_literal(q: &Quant, dtype: DType, values: &[f64], pos: Pos) -> Result<Literal> {
    let shape = if q.axis.is_some() {
        vec![values.len()]
    } else {
        vec![]
    };
    Literal::from_f64s(TensorType::new(dtype, shape), values)
        .map_err(|e| Error::invalid(pos, format!("a quantization parameter: {e}")))
}

/// The zero points as an `i64` literal.
fn zero_point_literal(q: &Quant, pos: Pos) -> Result<Literal> {
    let shape = if q.axis.is_some() {
        vec![q.zero_points.len()]
    } else {
        vec![]
    };
    Literal::from_i64s(TensorType::new(DType::I64, shape), &q.zero_points)
        .map_err(|e| Error::invalid(pos, format!("a zero point: {e}")))
}

/// `dequantize(x)`: `(convert(x, i64) - zero_points)` converted to the expressed type, times
/// the scales.
pub fn dequantize(body: &mut Body, op: &OpAst, x: ValueId, q: &Quant) -> Result<ValueId> {
    let ty = value_type(body, x)?;
    if ty.dtype != q.storage {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}`: a quantized operand stored as {} is {}",
                op.name,
                crate::types::element_name(q.storage),
                crate::literal::type_name(&ty)
            ),
        ));
    }
    q.check_shape(&ty.shape, op.pos)?;
    let shape = &ty.shape;
    let wide = emit(
        body,
        op,
        Op::Convert {},
        &[x],
        TensorType::new(DType::I64, shape.clone()),
    )?;
    let zps = zero_point_literal(q, op.pos)?;
    let zp = params(body, op, zps, shape, q.axis)?;
    let sub = emit(
        body,
        op,
        Op::Subtract {},
        &[wide, zp],
        TensorType::new(DType::I64, shape.clone()),
    )?;
    let float = emit(body, op, Op::Convert {}, &[sub], q.expressed_type(shape))?;
    let scales = param_literal(q, q.expressed, &q.scales, op.pos)?;
    let s = params(body, op, scales, shape, q.axis)?;
    emit(
        body,
        op,
        Op::Multiply {},
        &[float, s],
        q.expressed_type(shape),
    )
}

/// `quantize(x)`: `x` (converted to the expressed type) over the scales, plus the zero
/// points, clamped to the storage range, rounded to nearest even and converted to the storage
/// type.
pub fn quantize(body: &mut Body, op: &OpAst, x: ValueId, q: &Quant) -> Result<ValueId> {
    let ty = value_type(body, x)?;
    if !ty.dtype.is_float() {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}`: quantizes {}, which is not a float tensor",
                op.name,
                crate::literal::type_name(&ty)
            ),
        ));
    }
    q.check_shape(&ty.shape, op.pos)?;
    let shape = &ty.shape;
    let fty = q.expressed_type(shape);
    let x = if ty.dtype == q.expressed {
        x
    } else {
        emit(body, op, Op::Convert {}, &[x], fty.clone())?
    };
    let scales = param_literal(q, q.expressed, &q.scales, op.pos)?;
    let s = params(body, op, scales, shape, q.axis)?;
    let scaled = emit(body, op, Op::Divide {}, &[x, s], fty.clone())?;
    let zpf: Vec<f64> = q.zero_points.iter().map(|&z| z as f64).collect();
    let zps = param_literal(q, q.expressed, &zpf, op.pos)?;
    let zp = params(body, op, zps, shape, q.axis)?;
    let shifted = emit(body, op, Op::Add {}, &[scaled, zp], fty.clone())?;
    let bound = |v: i64| -> Result<Literal> {
        Literal::from_f64s(TensorType::scalar(q.expressed), &[v as f64])
            .map_err(|e| Error::invalid(op.pos, format!("a storage bound: {e}")))
    };
    let lo = params(body, op, bound(q.storage_min)?, shape, None)?;
    let hi = params(body, op, bound(q.storage_max)?, shape, None)?;
    let clamped = emit(body, op, Op::Clamp {}, &[lo, shifted, hi], fty.clone())?;
    let rounded = emit(body, op, Op::RoundNearestEven {}, &[clamped], fty)?;
    emit(body, op, Op::Convert {}, &[rounded], q.storage_type(shape))
}
