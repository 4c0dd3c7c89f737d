//! `.npy` files for the XLA check: kiln literals out and in (bf16 as its uint16 bits, which
//! NumPy has no type for; the sub-byte integers as int8 or uint8, one per byte; the small
//! floats as their bit patterns in uint8).

use kiln_ir::{DType, Literal, TensorType};

/// NumPy's name of a kiln dtype.
fn descr(d: DType) -> &'static str {
    match d {
        DType::Pred => "|b1",
        DType::I8 | DType::I4 | DType::I2 => "|i1",
        DType::U4 | DType::U2 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U32 => "<u4",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::U64 => "<u8",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
        DType::Mini(_) => "|u1",
    }
}

/// The `(2, 3)` shape text of NumPy's header.
fn shape_text(shape: &[usize]) -> String {
    match shape {
        [d] => format!("({d},)"),
        s => format!(
            "({})",
            s.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The bytes of an `.npy` file holding `lit`.
pub fn write(lit: &Literal) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        descr(lit.dtype()),
        shape_text(lit.shape())
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(lit.to_le_bytes());
    out
}

/// The literal of type `ty` an `.npy` file holds; an error when its dtype or shape differ.
pub fn read(bytes: &[u8], ty: &TensorType) -> Result<Literal, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not an .npy file".into());
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err("a truncated .npy header".into()),
    };
    let header = bytes
        .get(start..start + len)
        .map(String::from_utf8_lossy)
        .ok_or("a truncated .npy header")?;
    let want_descr = format!("'descr': '{}'", descr(ty.dtype));
    let want_shape = format!("'shape': {}", shape_text(&ty.shape));
    // NumPy writes bool as `|b1`, other one-byte types with `|`; accept `<`/`=` spellings too.
    let same_descr = header.contains(&want_descr)
        || header.contains(&want_descr.replace("'<", "'=").replace("'|", "'<"));
    if !same_descr || !header.contains(&want_shape) || header.contains("'fortran_order': True") {
        return Err(format!("expected {ty}, the file holds {}", header.trim()));
    }
    Literal::from_le_bytes(ty.clone(), &bytes[start + len..]).map_err(|e| e.to_string())
}
