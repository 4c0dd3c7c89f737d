//! `.npy` files of one tensor, read and written here (no NumPy needed on either side).
//!
//! Written: format version 1.0, little-endian, C order, the NumPy dtype of each kiln dtype
//! (`pred` `|b1`, `i8` `|i1`, `i32` `<i4`, `i64` `<i8`, `u32` `<u4`, `u8` `|u1`, `f16` `<f2`,
//! `f32` `<f4`, `f64` `<f8`) and, for `bf16`, which NumPy lacks, `<V2` (two raw bytes, the
//! descriptor `ml_dtypes.bfloat16` arrays are saved with). NumPy has no 4- or 2-bit integers:
//! `i4` and `i2` are written as `|i1`, `u4` and `u2` as `|u1`, one element per byte as kiln
//! holds them, so they read back as `i8` and `u8`; [`as_dtype`] makes them the narrow type
//! again where an artifact's argument or result has it. The small floats (`f8e4m3fn`, ...,
//! `f4e2m1fn`) are written as `|V1`, one raw byte each holding the bit pattern, as ml_dtypes
//! saves them; `|V1` reads back as `u8` bytes, which [`as_dtype`] makes the small float an
//! artifact's argument or result has.
//! Read: versions 1 to 3, those dtypes
//! (`<` or `|`, or `=` on this little-endian host); big-endian data and Fortran order are
//! refused with a message saying so.

use kiln_ir::{DType, Literal, TensorType};

/// The NumPy descriptor of `d`.
pub fn descr(d: DType) -> &'static str {
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
        DType::BF16 => "<V2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
        DType::Mini(_) => "|V1",
    }
}

fn dtype_of(descr: &str) -> Option<DType> {
    let d = descr
        .strip_prefix(['<', '|', '='])
        .map(|rest| format!("<{rest}"))?;
    // A small float's raw byte: its type is the artifact's (`as_dtype`).
    if d == "<V1" {
        return Some(DType::U8);
    }
    // `|i1` and `|u1` are `i8` and `u8`, never the sub-byte types written with them.
    DType::ALL
        .into_iter()
        .find(|&k| !k.is_sub_byte() && k.mini().is_none() && descr_key(k) == d)
}

fn descr_key(d: DType) -> String {
    format!("<{}", &descr(d)[1..])
}

/// The `.npy` bytes of `l`.
pub fn to_bytes(l: &Literal) -> Vec<u8> {
    let shape = match l.shape() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(l.dtype())
    );
    // Magic (6), version (2), length (2), header and newline: a multiple of 64 bytes.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    while 10 + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(total + l.numel() * l.dtype().bytes());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&l.to_le_bytes());
    out
}

/// The value of the Python literal for `key` in a `.npy` header dictionary.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else if let Some(r) = rest.strip_prefix('\'') {
        r.find('\'')? + 2
    } else {
        rest.find([',', '}'])?
    };
    Some(rest[..end].trim())
}

/// A tensor from `.npy` bytes.
pub fn from_bytes(bytes: &[u8]) -> Result<Literal, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!(".npy format version {v} is not known")),
    };
    let header = bytes
        .get(start..start + len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or("the .npy header is cut short or not text")?;
    let descr = field(header, "descr")
        .map(|d| d.trim_matches('\''))
        .ok_or("the .npy header has no 'descr'")?;
    if descr.starts_with('>') {
        return Err(format!(
            "big-endian data ({descr}) is not read; save it little-endian"
        ));
    }
    let dtype =
        dtype_of(descr).ok_or_else(|| format!("the NumPy dtype {descr} has no kiln dtype"))?;
    if field(header, "fortran_order") != Some("False") {
        return Err("Fortran-order data is not read; save it in C order".into());
    }
    let shape_text = field(header, "shape").ok_or("the .npy header has no 'shape'")?;
    let shape = shape_text
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("the shape {shape_text} is not a tuple of sizes"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ty = TensorType::new(dtype, shape);
    let want = ty
        .byte_size()
        .ok_or_else(|| format!("{ty} is too large to hold"))?;
    let data = &bytes[start + len..];
    if data.len() != want {
        return Err(format!(
            "{ty} needs {want} bytes of data, the file holds {}",
            data.len()
        ));
    }
    Literal::from_le_bytes(ty, data).map_err(|e| e.to_string())
}

/// `l`, read from a `.npy` file for an argument or result of dtype `want`: a sub-byte integer
/// type (`i4`, `u4`, `i2`, `u2`) is written as `int8` or `uint8` (see the module docs), so such
/// bytes become `want` when every value fits it (an error names the first that does not); a
/// small float's bytes (`|V1`, read as `u8`) become `want` when each is a bit pattern of it;
/// any other literal comes back as it is.
pub fn as_dtype(l: Literal, want: DType) -> Result<Literal, String> {
    if want.mini().is_some() && l.dtype() == DType::U8 {
        let ty = l.ty().with_dtype(want);
        return Literal::new(ty, l.data().clone().retag(want)).map_err(|e| e.to_string());
    }
    if !want.is_sub_byte() || l.dtype() != want.storage() {
        return Ok(l);
    }
    let ty = l.ty().with_dtype(want);
    Literal::new(ty, l.data().clone().retag(want)).map_err(|e| e.to_string())
}

/// Reads `path`.
pub fn read(path: &std::path::Path) -> Result<Literal, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `l` to `path`.
pub fn write(path: &std::path::Path, l: &Literal) -> Result<(), String> {
    std::fs::write(path, to_bytes(l)).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for (d, shape) in [
            (DType::F32, vec![2, 3]),
            (DType::BF16, vec![4]),
            (DType::Pred, vec![]),
            (DType::I64, vec![1, 1, 2]),
            (DType::U8, vec![0]),
            (DType::I16, vec![3]),
            (DType::U16, vec![2, 2]),
            (DType::U64, vec![5]),
        ] {
            let ty = TensorType::new(d, shape);
            let l = kiln_ir::random::random_literal(&mut kiln_ir::random::Rng::new(3), &ty);
            let b = to_bytes(&l);
            assert_eq!((10 + u16::from_le_bytes([b[8], b[9]]) as usize) % 64, 0);
            assert_eq!(from_bytes(&b).unwrap(), l);
        }
    }

    #[test]
    fn sub_byte_integers_are_written_as_bytes_and_read_back_as_i8_and_u8() {
        for (d, wide, values) in [
            (DType::I4, DType::I8, vec![-8, -1, 0, 7]),
            (DType::U4, DType::U8, vec![0, 1, 9, 15]),
            (DType::I2, DType::I8, vec![-2, -1, 0, 1]),
            (DType::U2, DType::U8, vec![0, 1, 2, 3]),
        ] {
            let l = Literal::from_i64s(TensorType::new(d, [4]), &values).unwrap();
            let back = from_bytes(&to_bytes(&l)).unwrap();
            assert_eq!(back.dtype(), wide, "{d}");
            assert_eq!(back.to_i64s(), values, "{d}");
        }
    }

    #[test]
    fn small_floats_are_written_as_raw_bytes_and_become_the_artifacts_type() {
        let l = Literal::from_f64s(
            TensorType::new(DType::F8E4M3FN, [4]),
            &[0.5, -448.0, f64::NAN, 3.0],
        )
        .unwrap();
        let b = to_bytes(&l);
        assert!(String::from_utf8_lossy(&b).contains("'descr': '|V1'"));
        let back = from_bytes(&b).unwrap();
        assert_eq!(back.dtype(), DType::U8);
        assert_eq!(as_dtype(back, DType::F8E4M3FN).unwrap(), l);
        // A byte that is no 4-bit pattern is refused for f4e2m1fn.
        let wide = Literal::from_i64s(TensorType::new(DType::U8, [2]), &[3, 0x30]).unwrap();
        let e = as_dtype(wide, DType::F4E2M1FN).unwrap_err();
        assert!(e.contains("0x30 is not a bit pattern of f4e2m1fn"), "{e}");
    }

    #[test]
    fn bytes_read_for_a_sub_byte_type_become_it_when_they_fit() {
        let bytes = Literal::from_i64s(TensorType::new(DType::I8, [3]), &[-8, 7, -1]).unwrap();
        let l = as_dtype(bytes.clone(), DType::I4).unwrap();
        assert_eq!((l.dtype(), l.to_i64s()), (DType::I4, vec![-8, 7, -1]));
        assert_eq!(as_dtype(bytes.clone(), DType::I8).unwrap(), bytes);
        let e = as_dtype(bytes, DType::I2).unwrap_err();
        assert!(e.contains("-8 is out of range for i2"), "{e}");
        let u = Literal::from_i64s(TensorType::new(DType::U8, [2]), &[15, 16]).unwrap();
        let e = as_dtype(u, DType::U4).unwrap_err();
        assert!(e.contains("16 is out of range for u4"), "{e}");
    }

    #[test]
    fn numpy_headers_are_read_and_bad_files_named() {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }          \n";
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&1.5f32.to_le_bytes());
        b.extend_from_slice(&2.5f32.to_le_bytes());
        assert_eq!(from_bytes(&b).unwrap().to_f64s(), [1.5, 2.5]);
        let e = from_bytes(&b[..b.len() - 1]).unwrap_err();
        assert!(e.contains("needs 8 bytes"), "{e}");
        assert!(from_bytes(b"hello world").unwrap_err().contains("magic"));
        let big = String::from_utf8_lossy(&b).replace("<f4", ">f4");
        assert!(from_bytes(big.as_bytes()).is_err());
    }
}
