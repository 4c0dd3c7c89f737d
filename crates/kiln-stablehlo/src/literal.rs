//! Dense literals: the elements as written ([`crate::ast::Dense`]) and a tensor type make a
//! kiln [`Literal`]. Hex elements are bit patterns of the element type (`0x7F800000` is +inf
//! in f32); decimal elements are rounded to the type (floats, ties to even) or must fit it
//! (integers).

use crate::ast::{Dense, Elem};
use crate::error::{Error, Result};
use crate::types::element_name;
use half::{bf16, f16};
use kiln_ir::{DType, Literal, ShapeDisplay, TensorType};

/// The most elements a literal may have (a splat of a huge type is refused, not allocated).
pub const MAX_LITERAL_ELEMS: usize = 1 << 26;

/// The tensor type in StableHLO syntax, for messages.
pub fn type_name(t: &TensorType) -> String {
    let mut s = String::from("tensor<");
    for d in &t.shape {
        s += &format!("{d}x");
    }
    s += element_name(t.dtype);
    s + ">"
}

/// The literal of type `ty` that `d` writes.
pub fn to_literal(d: &Dense, ty: &TensorType) -> Result<Literal> {
    let n = ty
        .checked_numel()
        .filter(|&n| n <= MAX_LITERAL_ELEMS)
        .ok_or_else(|| {
            Error::invalid(
                d.pos,
                format!(
                    "a constant of type {} is too large (at most {MAX_LITERAL_ELEMS} elements)",
                    type_name(ty)
                ),
            )
        })?;
    let splat = match &d.shape {
        None => true,
        Some(s) => {
            let empty = d.elems.is_empty() && n == 0;
            if *s != ty.shape && !empty {
                return Err(Error::invalid(
                    d.pos,
                    format!(
                        "a dense literal of shape {} does not fit the type {}",
                        ShapeDisplay(s),
                        type_name(ty)
                    ),
                ));
            }
            false
        }
    };
    let width = ty.dtype.bytes();
    let mut bytes = Vec::with_capacity(n * width);
    if splat {
        let e = d.elems.first().copied().unwrap_or(Elem::Int(0));
        let one = elem_bytes(e, ty.dtype).map_err(|m| Error::invalid(d.pos, m))?;
        for _ in 0..n {
            bytes.extend_from_slice(&one);
        }
    } else {
        for &e in &d.elems {
            bytes.extend(elem_bytes(e, ty.dtype).map_err(|m| Error::invalid(d.pos, m))?);
        }
    }
    Literal::from_le_bytes(ty.clone(), &bytes).map_err(|e| Error::invalid(d.pos, e.to_string()))
}

/// The little-endian bytes of one element of `dtype`.
fn elem_bytes(e: Elem, dtype: DType) -> Result<Vec<u8>, String> {
    let name = element_name(dtype);
    let bits = dtype.bits();
    let hex_fits = |h: u64| bits >= 64 || h >> bits == 0;
    let range = |i: i128, lo: i128, hi: i128| {
        if i < lo || i > hi {
            Err(format!("{i} is out of range for {name}"))
        } else {
            Ok(i)
        }
    };
    let int = |i: i128| -> Result<Vec<u8>, String> {
        Ok(match dtype.int_bounds() {
            // In range, the value's two's-complement bytes, as many as the dtype has.
            Some((lo, hi)) => range(i, lo, hi)?.to_le_bytes()[..dtype.bytes()].to_vec(),
            None => float_bytes(i as f64, dtype),
        })
    };
    if dtype.is_complex() {
        // The real part's bytes, then the imaginary part's.
        let Elem::Complex(re, im) = e else {
            return Err(format!("{name} values are written `(re, im)`"));
        };
        let mut b = elem_bytes(re.into(), dtype.part())?;
        b.extend(elem_bytes(im.into(), dtype.part())?);
        return Ok(b);
    }
    match e {
        Elem::Complex(..) => Err(format!("a complex value is not a {name} value")),
        Elem::Hex(h) if !hex_fits(h) || dtype == DType::Pred && h > 1 => {
            Err(format!("the bit pattern {h:#x} does not fit {name}"))
        }
        Elem::Hex(h) => Ok(h.to_le_bytes()[..dtype.bytes()].to_vec()),
        Elem::Bool(b) if dtype == DType::Pred => Ok(vec![b as u8]),
        Elem::Bool(_) => Err(format!("`true`/`false` is not a {name} value")),
        Elem::Int(i) => int(i),
        Elem::Float(f) if dtype.is_float() => Ok(float_bytes(f, dtype)),
        Elem::Float(f) => Err(format!("{f} is not a {name} value")),
    }
}

/// The bytes of `x` rounded to the float dtype `dtype`.
fn float_bytes(x: f64, dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F16 => kiln_ir::half_round::f16_from_f64(x).to_le_bytes().to_vec(),
        DType::BF16 => kiln_ir::half_round::bf16_from_f64(x).to_le_bytes().to_vec(),
        DType::F32 => (x as f32).to_le_bytes().to_vec(),
        DType::Mini(m) => vec![m.from_f64(x)],
        _ => x.to_le_bytes().to_vec(),
    }
}
