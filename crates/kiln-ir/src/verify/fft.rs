//! The type rule of `fft`: the element types each transform takes and gives, and the
//! trailing dimensions `fft_length` fixes.

use super::{Inferred, Labels, R, one};
use crate::attr::FftType;
use crate::fft::half_spectrum;
use crate::{DType, TensorType};

/// The result type of `fft` on `x`, or the label of the first constraint it breaks.
pub(super) fn fft_rule(
    l: &Labels,
    fft_type: FftType,
    fft_length: &[i64],
    x: &TensorType,
) -> R<Inferred> {
    let k = fft_length.len();
    l.ensure(1, (1..=3).contains(&k) && k <= x.rank(), || {
        format!(
            "fft_length must name 1 to 3 trailing dimensions of the operand, got {} for {x}",
            k
        )
    })?;
    let complex_in = matches!(fft_type, FftType::Fft | FftType::Ifft | FftType::Irfft);
    l.ensure(
        2,
        if complex_in {
            matches!(x.dtype, DType::C64 | DType::C128)
        } else {
            matches!(x.dtype, DType::F32 | DType::F64)
        },
        || {
            let want = if complex_in {
                "c64 or c128"
            } else {
                "f32 or f64"
            };
            format!("a {fft_type} transform takes {want} elements, got {x}")
        },
    )?;
    l.ensure(3, fft_length.iter().all(|&n| n >= 0), || {
        format!("fft_length must be nonnegative, got {fft_length:?}")
    })?;
    let lengths: Vec<usize> = fft_length.iter().map(|&n| n as usize).collect();
    let mut want = lengths.clone();
    if fft_type == FftType::Irfft {
        let last = want.len() - 1;
        want[last] = half_spectrum(want[last]);
    }
    let trailing = &x.shape[x.rank() - k..];
    l.ensure(4, trailing == want.as_slice(), || {
        format!(
            "the operand's trailing dimensions must be {want:?} for a {fft_type} transform of \
             fft_length {fft_length:?}, got {x}"
        )
    })?;
    let mut shape = x.shape.clone();
    let last = shape.len() - 1;
    let dtype = match fft_type {
        FftType::Fft | FftType::Ifft => x.dtype,
        FftType::Rfft => {
            shape[last] = half_spectrum(lengths[k - 1]);
            x.dtype.complex_of().unwrap_or(x.dtype)
        }
        FftType::Irfft => {
            shape[last] = lengths[k - 1];
            x.dtype.part()
        }
    };
    one(TensorType::new(dtype, shape), 5)
}
