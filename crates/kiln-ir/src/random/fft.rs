//! Random `fft` instructions.

use super::Gen;
use crate::fft::half_spectrum;
use crate::{DType, FftType, Op, TensorType, ValueId};

impl Gen<'_> {
    /// An `fft` over 1 to 3 trailing dimensions of `a`: for a complex `a`, a forward or
    /// inverse complex transform or an `IRFFT` (its last dimension read as a half spectrum of
    /// one of the two lengths it fits); for a real one (or anything else, replaced by a new
    /// f32 or f64 value) an `RFFT` followed by the `IRFFT` back, so that the program's values
    /// stay real.
    pub(super) fn random_fft(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        // One time in three a collective instead (`random/collective.rs`); always for
        // differentiable programs, whose values stay real.
        if self.rng.chance(1.0 / 3.0) || self.cfg.differentiable {
            return self.random_collective(a, t);
        }
        self.fft_or_collective(a, t)
    }

    /// [`Gen::random_fft`] without its first draw: an `fft` on `a` (or on a new real value), or
    /// for a scalar the collectives.
    pub(super) fn fft_or_collective(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (a, t) = if t.rank() >= 1 && !matches!(t.dtype, DType::C64 | DType::C128) {
            if matches!(t.dtype, DType::F32 | DType::F64) {
                (a, t.clone())
            } else {
                let d = self.linalg_dtype();
                let t = TensorType::new(d, [self.size(self.cfg.max_dim)]);
                (self.value_of(&t), t)
            }
        } else if t.rank() >= 1 {
            (a, t.clone())
        } else {
            // A scalar has no transform: a collective on it instead (`random/collective.rs`).
            return self.random_collective(a, t);
        };
        let r = t.rank();
        let l = 1 + self.rng.below(r.min(3));
        let mut lengths: Vec<i64> = t.shape[r - l..].iter().map(|&d| d as i64).collect();
        let fft = |fft_type, fft_length| Op::Fft {
            fft_type,
            fft_length,
        };
        if t.dtype.is_complex() {
            let h = t.shape[r - 1];
            if self.rng.chance(0.3) {
                // A last dimension of h is the half spectrum of 2h - 2 or 2h - 1 points.
                let n = match h {
                    0 => 0,
                    1 => 1,
                    _ => 2 * h - 2 + self.rng.below(2),
                };
                debug_assert_eq!(half_spectrum(n), h);
                lengths[l - 1] = n as i64;
                return self.b.inst(fft(FftType::Irfft, lengths), &[a]).ok();
            }
            let kind = *self.rng.pick(&[FftType::Fft, FftType::Ifft]);
            return self.b.inst(fft(kind, lengths), &[a]).ok();
        }
        let spectrum = self
            .b
            .inst(fft(FftType::Rfft, lengths.clone()), &[a])
            .ok()?;
        self.b.inst(fft(FftType::Irfft, lengths), &[spectrum]).ok()
    }
}
