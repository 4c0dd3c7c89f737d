//! `fft`: the discrete Fourier transform computed directly from its definition, one
//! transformed dimension at a time, every value in f64. Each output element of a 1-D
//! transform is the sum of its `n` products with the twiddle factors of
//! [`kiln_ir::fft::twiddle`], accumulated with Neumaier's compensated summation, so each
//! stage is within a few f64 ulps of the exact transform of its input; the result is rounded
//! once to the result's element type.

use kiln_ir::fft::{half_spectrum, twiddle};
use kiln_ir::{FftType, Literal, TensorType};

/// A compensated sum (Neumaier): the running sum and the rounding errors it dropped.
#[derive(Default, Clone, Copy)]
struct Sum {
    s: f64,
    c: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.s + x;
        if self.s.abs() >= x.abs() {
            self.c += (self.s - t) + x;
        } else {
            self.c += (x - t) + self.s;
        }
        self.s = t;
    }
    fn value(self) -> f64 {
        self.s + self.c
    }
}

/// The 1-D transform of `line` (length `n`) into `out`: `out[k] = Σ_j line[j] w^(jk)` with
/// `w = e^(-2πi/n)` (forward) or `e^(2πi/n) / n` (inverse, the `1/n` applied after the sum).
fn dft(line: &[[f64; 2]], inverse: bool, out: &mut [[f64; 2]]) {
    let n = line.len();
    let table: Vec<(f64, f64)> = (0..n as u64).map(|m| twiddle(m, n as u64)).collect();
    for (k, o) in out.iter_mut().enumerate() {
        let (mut re, mut im) = (Sum::default(), Sum::default());
        for (j, x) in line.iter().enumerate() {
            let (c, s) = table[(j * k) % n];
            // e^(∓iθ) = cos θ ∓ i sin θ.
            let s = if inverse { s } else { -s };
            re.add(x[0] * c);
            re.add(-(x[1] * s));
            im.add(x[0] * s);
            im.add(x[1] * c);
        }
        let (mut a, mut b) = (re.value(), im.value());
        if inverse {
            a /= n as f64;
            b /= n as f64;
        }
        *o = [a, b];
    }
}

/// Applies [`dft`] along dimension `axis` of the row-major `data` of `shape`.
fn along(data: &mut [[f64; 2]], shape: &[usize], axis: usize, inverse: bool) {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut line = vec![[0.0; 2]; n];
    let mut out = vec![[0.0; 2]; n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * n * inner + j * inner + i;
            for (j, x) in line.iter_mut().enumerate() {
                *x = data[at(j)];
            }
            dft(&line, inverse, &mut out);
            for (j, x) in out.iter().enumerate() {
                data[at(j)] = *x;
            }
        }
    }
}

/// `fft` of `x` (verified) into result type `ty`.
pub fn fft(x: &Literal, fft_type: FftType, fft_length: &[i64], ty: &TensorType) -> Literal {
    if ty.numel() == 0 || x.numel() == 0 {
        return Literal::zeros(ty.clone());
    }
    let r = x.shape().len();
    let dims = r - fft_length.len()..r;
    let last = r - 1;
    let mut data: Vec<[f64; 2]> = if x.dtype().is_complex() {
        x.to_complex_f64s()
    } else {
        x.to_f64s().into_iter().map(|v| [v, 0.0]).collect()
    };
    let mut shape = x.shape().to_vec();
    match fft_type {
        FftType::Fft | FftType::Ifft => {
            for d in dims {
                along(&mut data, &shape, d, fft_type == FftType::Ifft);
            }
        }
        FftType::Rfft => {
            for d in dims {
                along(&mut data, &shape, d, false);
            }
            // Keep the first n/2 + 1 elements of each line of the last dimension.
            let n = shape[last];
            let h = half_spectrum(n);
            data = data
                .chunks(n)
                .flat_map(|line| line[..h].iter().copied())
                .collect();
            shape[last] = h;
        }
        FftType::Irfft => {
            for d in dims.start..last {
                along(&mut data, &shape, d, true);
            }
            // The full Hermitian spectrum of each line: X[j] for j < h, conj(X[n - j]) above.
            let n = fft_length[fft_length.len() - 1] as usize;
            let h = shape[last];
            data = data
                .chunks(h)
                .flat_map(|line| {
                    (0..n).map(move |j| {
                        if j < h {
                            line[j]
                        } else {
                            [line[n - j][0], -line[n - j][1]]
                        }
                    })
                })
                .collect();
            shape[last] = n;
            along(&mut data, &shape, last, true);
            let real: Vec<f64> = data.iter().map(|v| v[0]).collect();
            return Literal::from_f64s(ty.clone(), &real).expect("the verified result type");
        }
    }
    Literal::from_complex_f64s(ty.clone(), &data).expect("the verified result type")
}

/// The magnitude of each element of `fft`'s result (`crate::accuracy`): the sum of the
/// operand's magnitudes over the transformed dimensions of its line (`|w| = 1`), divided by
/// the transform's size for the inverses; the same for every element of a line.
pub fn fft_magnitude(
    m: &Literal,
    fft_type: FftType,
    fft_length: &[i64],
    ty: &TensorType,
) -> Vec<f64> {
    let out_n = ty.numel();
    if out_n == 0 || m.numel() == 0 {
        return vec![0.0; out_n];
    }
    let r = m.shape().len();
    let block_in: usize = m.shape()[r - fft_length.len()..].iter().product();
    let block_out: usize = ty.shape[r - fft_length.len()..].iter().product();
    let v: Vec<f64> = if m.dtype().is_complex() {
        m.to_complex_f64s()
            .iter()
            .map(|c| c[0].abs() + c[1].abs())
            .collect()
    } else {
        m.to_f64s().iter().map(|x| x.abs()).collect()
    };
    let size: f64 = fft_length.iter().map(|&n| n as f64).product();
    let scale = match fft_type {
        FftType::Fft | FftType::Rfft => 1.0,
        // The Hermitian extension counts most elements twice.
        FftType::Ifft => 1.0 / size,
        FftType::Irfft => 2.0 / size,
    };
    v.chunks(block_in)
        .flat_map(|b| {
            let s: f64 = b.iter().sum::<f64>() * scale;
            std::iter::repeat_n(s, block_out)
        })
        .collect()
}
