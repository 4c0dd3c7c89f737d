//! Dense literals out: a kiln [`Literal`] as the `dense<...> : tensor<...>` text MLIR reads
//! back to the same bits. Finite floats other than -0 are written in decimal (the shortest
//! text that reads back to the same value); NaN (with its payload), infinities and -0 are
//! written as hex bit patterns of the element type. A literal whose elements are all the same
//! bits is written as a splat.

use crate::literal::type_name;
use kiln_ir::{Data, Literal};
use std::fmt::Write;

/// `dense<...> : tensor<...>` for `lit`.
pub fn dense_text(lit: &Literal) -> String {
    let elems = elements(lit);
    let mut s = String::from("dense<");
    let splat = elems.first().filter(|e| elems.iter().all(|x| x == *e));
    match splat {
        Some(e) => s.push_str(e),
        None if elems.is_empty() => {}
        None => nested(&mut s, &elems, lit.shape()),
    }
    let _ = write!(s, "> : {}", type_name(lit.ty()));
    s
}

/// The elements of `shape` (row-major `elems`) as nested `[...]` lists.
fn nested(out: &mut String, elems: &[String], shape: &[usize]) {
    let Some((&d, rest)) = shape.split_first() else {
        out.push_str(&elems[0]);
        return;
    };
    let inner: usize = rest.iter().product();
    out.push('[');
    for i in 0..d {
        if i > 0 {
            out.push_str(", ");
        }
        nested(out, &elems[i * inner..(i + 1) * inner], rest);
    }
    out.push(']');
}

/// Each element's text, row-major.
fn elements(lit: &Literal) -> Vec<String> {
    match lit.data() {
        Data::Pred(v) => v.iter().map(|b| b.to_string()).collect(),
        Data::I8(v) | Data::I4(v) | Data::I2(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::U4(v) | Data::U2(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::I32(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::I64(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::U32(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::U8(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::I16(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::U16(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::U64(v) => v.iter().map(|x| x.to_string()).collect(),
        Data::F16(v) => v
            .iter()
            .map(|x| float(x.to_f64(), u64::from(x.to_bits()), 4))
            .collect(),
        Data::BF16(v) => v
            .iter()
            .map(|x| float(x.to_f64(), u64::from(x.to_bits()), 4))
            .collect(),
        Data::F32(v) => v
            .iter()
            .map(|x| float(f64::from(*x), u64::from(x.to_bits()), 8))
            .collect(),
        Data::F64(v) => v.iter().map(|x| float(*x, x.to_bits(), 16)).collect(),
        Data::Mini(m, v) => v
            .iter()
            .map(|&c| float(m.to_f64(c), u64::from(c), 2))
            .collect(),
        Data::C64(v) => v
            .iter()
            .map(|z| {
                let p = |x: f32| float(f64::from(x), u64::from(x.to_bits()), 8);
                format!("({}, {})", p(z[0]), p(z[1]))
            })
            .collect(),
        Data::C128(v) => v
            .iter()
            .map(|z| {
                let p = |x: f64| float(x, x.to_bits(), 16);
                format!("({}, {})", p(z[0]), p(z[1]))
            })
            .collect(),
    }
}

/// One float element: decimal when it reads back exactly, else `0x...` of `digits` hex digits.
pub fn float(x: f64, bits: u64, digits: usize) -> String {
    if !x.is_finite() || (x == 0.0 && x.is_sign_negative()) {
        return format!("0x{bits:0digits$X}");
    }
    let s = format!("{x:e}");
    // MLIR's float literals need a `.` in the mantissa: `1e0` would read as an integer.
    match s.split_once('e') {
        Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
        _ => s,
    }
}
