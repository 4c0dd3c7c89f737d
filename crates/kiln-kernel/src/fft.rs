//! `fft` as matrix products, so that the compiled backends run it with their product kernels
//! (after [`crate::complex::split_complex`] has split the complex values into parts).
//!
//! A 1-D transform of length `n` along one dimension is a `dot_general` with the constant
//! `n x n` DFT matrix `w^(jk)` (`w = e^(-2πi/n)`; its conjugate divided by `n` for an inverse)
//! when `n` is at most the target's `fusion.fft_direct_max`; a longer `n` with no factor from
//! 2 to that limit (a prime above it) is Bluestein's chirp-z transform, a convolution done by
//! transforms of a power-of-two length at least `2n - 1`. A longer composite `n = n1 n2`
//! (`n1` and `n2` within the limit with the least sum where there are such, else `n1` the
//! largest factor within it) is Cooley and Tukey's four-step factorization: the dimension
//! reshaped to `[n1, n2]` (`j = n2 j1 + j2`), a direct transform of length `n1` over `j1`, a
//! multiply by the twiddles `w_n^(j2 k1)`, a transform of length `n2` over `j2` (recursively)
//! and a transpose to the output order `k = k1 + n1 k2`. Twiddles and matrices come from
//! [`kiln_ir::fft::twiddle`] in f64 and are rounded once to the element type.
//!
//! Each direct transform is one real product, whatever its operand: the operand laid out
//! once with the transformed dimension last (a complex one with its parts side by side),
//! times a real matrix whose columns give the result's parts side by side (`direct`). So a
//! complex stage is one GEMM and one layout kernel, not four products each with its own
//! copy of the operand. Where the target's GEMM reads operands through strides
//! (`fusion.strided_operands`), the last stage of a four-step transform along the last
//! dimension multiplies from the left (`last_stage_left`): the DFT matrix broadcast over the
//! lines, read in place, times the twiddled parts stacked, so that neither its operand nor
//! its result is transposed and its result lies in the output order.
//!
//! Several transformed dimensions are transformed one after another. A real transform of an
//! even length `n = 2m` from the target's `fusion.fft_half_min` on along the last dimension is done at
//! half length (`rfft_half`, `irfft_half`): the `n` reals taken as `m` complex numbers, one complex transform of
//! length `m` and an elementwise combination with the twiddles `w_n^k`; the other
//! dimensions of a multi-dimensional real transform are complex transforms. Another `n`
//! takes the full length: `RFFT` transforms its real operand (its first direct product takes
//! it with the matrix's real and imaginary parts side by side, so no zero imaginary part is
//! multiplied; a Bluestein length converts it to complex first) and slices the first
//! `n/2 + 1` elements of the last dimension; `IRFFT` completes the Hermitian spectrum of the
//! last dimension (the conjugates of the elements `1 .. n - n/2`, reversed, concatenated),
//! transforms it and keeps the real part.

use crate::canon::rebuild;
use crate::target::FusionLimits;
use kiln_ir::fft::twiddle;
use kiln_ir::{Builder, FftType, Func, Literal, Op, TensorType, ValueId, VerifyError};

type R<T> = Result<T, VerifyError>;

/// `f` with every `fft` rewritten into products, twiddle multiplies and layout ops, under the
/// target's limits: transforms up to
/// [`FusionLimits::fft_direct_max`] long are one product with their DFT matrix, real
/// transforms of even lengths from [`FusionLimits::fft_half_min`] on are done at half length.
pub fn expand_ffts(f: &Func, limits: &FusionLimits) -> R<Func> {
    if !f.insts.iter().any(|i| matches!(i.op, Op::Fft { .. })) {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let Op::Fft {
            fft_type,
            fft_length,
        } = &inst.op
        else {
            return Ok(None);
        };
        let ty = f.values[inst.results[0].index()].clone();
        Ok(Some(vec![expand(
            b, ops[0], *fft_type, fft_length, &ty, limits,
        )?]))
    })
}

fn ty_of(b: &Builder, v: ValueId) -> TensorType {
    b.ty(v).expect("a value of the builder").clone()
}

fn constant(b: &mut Builder, ty: TensorType, values: &[[f64; 2]]) -> R<ValueId> {
    let value = Literal::from_complex_f64s(ty, values).expect("the constant's element count");
    b.inst(Op::Constant { value }, &[])
}

/// One `fft` of `x` into `ty`.
fn expand(
    b: &mut Builder,
    x: ValueId,
    t: FftType,
    lengths: &[i64],
    ty: &TensorType,
    limits: &FusionLimits,
) -> R<ValueId> {
    let st = Stages {
        max: limits.fft_direct_max.max(2),
        left: limits.strided_operands,
    };
    if ty.numel() == 0 || ty_of(b, x).numel() == 0 {
        let value = Literal::zeros(ty.clone());
        return b.inst(Op::Constant { value }, &[]);
    }
    let r = ty.rank();
    let l = lengths.len();
    let cdt = if ty.dtype.is_complex() {
        ty.dtype
    } else {
        ty.dtype
            .complex_of()
            .expect("a real fft result is f32 or f64")
    };
    // A real operand (`RFFT`) stays real into its first transform, whose direct products
    // then run on it alone (no products of zero imaginary parts).
    let x = if ty_of(b, x).dtype.is_complex() || t == FftType::Rfft {
        x
    } else {
        b.convert(x, cdt)?
    };
    let n = lengths[l - 1] as usize;
    let half = n.is_multiple_of(2) && n >= limits.fft_half_min.max(2);
    match t {
        FftType::Fft | FftType::Ifft => transform(
            b,
            x,
            &(r - l..r).rev().collect::<Vec<_>>(),
            t == FftType::Ifft,
            st,
        ),
        FftType::Rfft if half => {
            let y = rfft_half(b, x, st)?;
            transform(b, y, &(r - l..r - 1).rev().collect::<Vec<_>>(), false, st)
        }
        FftType::Rfft => {
            let y = transform(b, x, &(r - l..r).rev().collect::<Vec<_>>(), false, st)?;
            slice_last(b, y, 0, ty.shape[r - 1])
        }
        FftType::Irfft => {
            let y = transform(b, x, &(r - l..r - 1).rev().collect::<Vec<_>>(), true, st)?;
            if half {
                return irfft_half(b, y, n, st);
            }
            let h = ty_of(b, y).shape[r - 1];
            let full = if n > h {
                // Y[j] = conj(X[n - j]) for j in h..n: X[1 .. n - h + 1] reversed, conjugated.
                let tail = slice_last(b, y, 1, n - h + 1)?;
                let tail = reverse_last(b, tail)?;
                let tail = conj(b, tail)?;
                concat_last(b, &[y, tail])?
            } else {
                slice_last(b, y, 0, n)?
            };
            let z = transform(b, full, &[r - 1], true, st)?;
            b.unary(Op::Real {}, z)
        }
    }
}

/// Elements `lo..hi` of the last dimension of `v`.
fn slice_last(b: &mut Builder, v: ValueId, lo: usize, hi: usize) -> R<ValueId> {
    let t = ty_of(b, v);
    let r = t.rank();
    let mut start = vec![0; r];
    let mut limit: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    start[r - 1] = lo as i64;
    limit[r - 1] = hi as i64;
    b.inst(
        Op::Slice {
            start_indices: start,
            limit_indices: limit,
            strides: vec![1; r],
        },
        &[v],
    )
}

/// Every second element of the last dimension of `v`, from element `first`.
fn every_second(b: &mut Builder, v: ValueId, first: usize) -> R<ValueId> {
    let t = ty_of(b, v);
    let r = t.rank();
    let mut start = vec![0; r];
    let mut strides = vec![1; r];
    start[r - 1] = first as i64;
    strides[r - 1] = 2;
    b.inst(
        Op::Slice {
            start_indices: start,
            limit_indices: t.shape.iter().map(|&d| d as i64).collect(),
            strides,
        },
        &[v],
    )
}

/// `v` reversed along its last dimension.
fn reverse_last(b: &mut Builder, v: ValueId) -> R<ValueId> {
    let r = ty_of(b, v).rank() as i64;
    b.inst(
        Op::Reverse {
            dimensions: vec![r - 1],
        },
        &[v],
    )
}

/// `vs` concatenated along their last dimension.
fn concat_last(b: &mut Builder, vs: &[ValueId]) -> R<ValueId> {
    let r = ty_of(b, vs[0]).rank() as i64;
    b.inst(Op::Concatenate { dimension: r - 1 }, vs)
}

/// The complex conjugate of `v`.
fn conj(b: &mut Builder, v: ValueId) -> R<ValueId> {
    let re = b.unary(Op::Real {}, v)?;
    let im = b.unary(Op::Imag {}, v)?;
    let im = b.unary(Op::Negate {}, im)?;
    b.binary(Op::Complex {}, re, im)
}

/// `p_k a_k + q_k c_k` along the last dimension of the complex `a` and `c` (of `p.len()`
/// elements), the weights constants.
fn weighted_sum(
    b: &mut Builder,
    a: ValueId,
    p: &[[f64; 2]],
    c: ValueId,
    q: &[[f64; 2]],
) -> R<ValueId> {
    let t = ty_of(b, a);
    let last = t.rank() as i64 - 1;
    let spread = |b: &mut Builder, w: &[[f64; 2]]| -> R<ValueId> {
        let w = constant(b, TensorType::new(t.dtype, [w.len()]), w)?;
        b.broadcast(w, &[last], &t.shape)
    };
    let (p, q) = (spread(b, p)?, spread(b, q)?);
    let a = b.binary(Op::Multiply {}, a, p)?;
    let c = b.binary(Op::Multiply {}, c, q)?;
    b.binary(Op::Add {}, a, c)
}

/// The weights of the half-length real transform of length `n = 2m`, for `k` in `0..=m`:
/// `p_k = (1 - i w^k) / 2` and `q_k = (1 + i w^k) / 2` with `w = e^(-2πi/n)`. With
/// `w^k = cos θ - i sin θ` (`θ = 2πk/n`), `i w^k = sin θ + i cos θ`.
fn half_length_weights(n: usize) -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
    (0..=n / 2)
        .map(|k| {
            let (c, s) = twiddle(k as u64, n as u64);
            ([0.5 - 0.5 * s, -0.5 * c], [0.5 + 0.5 * s, 0.5 * c])
        })
        .unzip()
}

/// `RFFT` along the last dimension of the real `x`, of even length `n = 2m`, by one complex
/// transform of length `m`.
///
/// With `z_j = x_(2j) + i x_(2j+1)` for `j` in `0..m`, `Z = E + i O`, where `E` and `O` are
/// the length-`m` transforms of the even and the odd elements. Both are transforms of reals,
/// so `E_(m-k) = conj(E_k)` and `O_(m-k) = conj(O_k)` (indices mod `m`), and
/// `conj(Z_(m-k)) = E_k - i O_k`: `E_k = (Z_k + conj(Z_(m-k))) / 2` and
/// `O_k = -i (Z_k - conj(Z_(m-k))) / 2`. Splitting the sum over `j` into even and odd `j`,
/// `X_k = E_k + w^k O_k` (`w = e^(-2πi/n)`, `E` and `O` of period `m`), so for `k` in `0..=m`
///
/// `X_k = (Z_k + conj(Z_(m-k))) / 2 - (i/2) w^k (Z_k - conj(Z_(m-k)))
///      = p_k Z_k + q_k conj(Z_(m-k))`, `p_k = (1 - i w^k) / 2`, `q_k = (1 + i w^k) / 2`,
///
/// with `Z_m = Z_0` (at `k = 0` and `k = m` both terms read `Z_0`: `X_0 = Re Z_0 + Im Z_0`,
/// `X_m = Re Z_0 - Im Z_0`).
fn rfft_half(b: &mut Builder, x: ValueId, st: Stages) -> R<ValueId> {
    let t = ty_of(b, x);
    let (r, n) = (t.rank(), t.shape[t.rank() - 1]);
    let even = every_second(b, x, 0)?;
    let odd = every_second(b, x, 1)?;
    let z = b.binary(Op::Complex {}, even, odd)?;
    let z = if n > 2 {
        along(b, z, r - 1, false, st)?
    } else {
        z
    };
    // [Z_0 .. Z_(m-1), Z_0] and its reverse [Z_0, Z_(m-1) .. Z_0]: Z_k and Z_(m-k), k in 0..=m.
    let z0 = slice_last(b, z, 0, 1)?;
    let ahead = concat_last(b, &[z, z0])?;
    let back = reverse_last(b, z)?;
    let back = concat_last(b, &[z0, back])?;
    let back = conj(b, back)?;
    let (p, q) = half_length_weights(n);
    weighted_sum(b, ahead, &p, back, &q)
}

/// `IRFFT` of the half spectrum `y` (`m + 1` elements along its last dimension) into `n = 2m`
/// reals, by one inverse complex transform of length `m`.
///
/// `IRFFT` is the real part of the inverse transform of the Hermitian completion
/// (`X_(n-k) = conj(X_k)` for `k` in `1..m`), which is the inverse transform of that
/// completion with the imaginary parts of `X_0` and `X_m` dropped; they are dropped first.
/// Then, as in [`rfft_half`] read backwards (`X_k = E_k + w^k O_k` and
/// `X_(k+m) = conj(X_(m-k)) = E_k - w^k O_k`), for `k` in `0..m`
///
/// `Z_k = E_k + i O_k = (X_k + conj(X_(m-k))) / 2 + (i/2) w^(-k) (X_k - conj(X_(m-k)))
///      = conj(p_k) X_k + conj(q_k) conj(X_(m-k))`,
///
/// and the inverse transform `z` of `Z` (divided by `m`) holds `x_(2j) = Re z_j` and
/// `x_(2j+1) = Im z_j`.
fn irfft_half(b: &mut Builder, y: ValueId, n: usize, st: Stages) -> R<ValueId> {
    let t = ty_of(b, y);
    let r = t.rank();
    let m = n / 2;
    let part = t.dtype.part();
    let keep: Vec<f64> = (0..=m).map(|k| f64::from(k != 0 && k != m)).collect();
    let keep = Literal::from_f64s(TensorType::new(part, [m + 1]), &keep)
        .expect("the constant's element count");
    let keep = b.inst(Op::Constant { value: keep }, &[])?;
    let keep = b.broadcast(keep, &[r as i64 - 1], &t.shape)?;
    let re = b.unary(Op::Real {}, y)?;
    let im = b.unary(Op::Imag {}, y)?;
    let im = b.binary(Op::Multiply {}, im, keep)?;
    let y = b.binary(Op::Complex {}, re, im)?;
    let ahead = slice_last(b, y, 0, m)?;
    let back = slice_last(b, y, 1, m + 1)?;
    let back = reverse_last(b, back)?;
    let back = conj(b, back)?;
    let (p, q) = half_length_weights(n);
    let bar =
        |w: Vec<[f64; 2]>| -> Vec<[f64; 2]> { w[..m].iter().map(|&[a, c]| [a, -c]).collect() };
    let z = weighted_sum(b, ahead, &bar(p), back, &bar(q))?;
    let z = if m > 1 {
        along(b, z, r - 1, true, st)?
    } else {
        z
    };
    // Interleaved: [.., m, 2] from the parts, then [.., n].
    let mut pairs = ty_of(b, z).shape;
    pairs.push(1);
    let re = b.unary(Op::Real {}, z)?;
    let im = b.unary(Op::Imag {}, z)?;
    let re = b.reshape(re, &pairs)?;
    let im = b.reshape(im, &pairs)?;
    let x = concat_last(b, &[re, im])?;
    let mut out = t.shape.clone();
    out[r - 1] = n;
    b.reshape(x, &out)
}

/// `v` transformed along each of `axes` (dimensions of `v`, in the order given) and the
/// dimensions put back in their order, split as `st` says.
fn transform(b: &mut Builder, v: ValueId, axes: &[usize], inverse: bool, st: Stages) -> R<ValueId> {
    let r = ty_of(b, v).rank();
    // The original dimension at each position of the current value.
    let mut order: Vec<usize> = (0..r).collect();
    let mut v = v;
    for &a in axes {
        let p = order
            .iter()
            .position(|&d| d == a)
            .expect("a dimension of v");
        v = along(b, v, p, inverse, st)?;
        order.remove(p);
        order.push(a);
    }
    if order.iter().enumerate().all(|(i, &d)| i == d) {
        return Ok(v);
    }
    let perm: Vec<i64> = (0..r)
        .map(|d| order.iter().position(|&o| o == d).expect("a permutation") as i64)
        .collect();
    b.transpose(v, &perm)
}

/// The transform of `v` along dimension `axis`, the transformed dimension moved last, split
/// as `st` says.
fn along(b: &mut Builder, v: ValueId, axis: usize, inverse: bool, st: Stages) -> R<ValueId> {
    let t = ty_of(b, v);
    let n = t.shape[axis];
    match first_factor(n, st.max) {
        _ if n <= st.max => direct(b, v, axis, inverse),
        Some(n1) => four_step(b, v, axis, n1, inverse, st),
        None => {
            let v = to_complex(b, v)?;
            bluestein(b, v, axis, inverse, st)
        }
    }
}

/// How `along` splits a transform: direct products at most `max` long; a last stage along
/// the last dimension done as a product from the left (`left`, see [`last_stage_left`]) where
/// the target's GEMM reads a broadcast matrix in place (`FusionLimits::strided_operands`).
#[derive(Clone, Copy, Debug)]
struct Stages {
    max: usize,
    left: bool,
}

/// The first factor `n1` of a four-step transform of length `n`, a factor from 2 to `max`
/// (`None`: `n` has none). A direct stage of length `d` costs `d` multiply-adds per point, so
/// where `n = n1 n2` with both factors at most `max`, the pair with the least `n1 + n2`
/// (the larger factor first on a tie: `1000 = 40 x 25`, `4096 = 64 x 64`); otherwise the
/// largest factor, leaving the fewest stages for `n2`.
fn first_factor(n: usize, max: usize) -> Option<usize> {
    let factors = (2..=max.min(n / 2)).filter(|&d| n.is_multiple_of(d));
    let both = factors.clone().filter(|&d| n / d <= max);
    both.min_by_key(|&d| (d + n / d, usize::MAX - d))
        .or_else(|| factors.max())
}

/// `v` as a complex value (imaginary parts 0) when it is real.
fn to_complex(b: &mut Builder, v: ValueId) -> R<ValueId> {
    let d = ty_of(b, v).dtype;
    match d.complex_of() {
        Some(c) if !d.is_complex() => b.convert(v, c),
        _ => Ok(v),
    }
}

/// `c_m = e^(∓πi m²/n)` (the sign of the transform), times `scale`, for `m` in `0..n`.
fn chirp(n: usize, inverse: bool, scale: f64) -> Vec<[f64; 2]> {
    (0..n)
        .map(|m| {
            let sq = (m as u128 * m as u128 % (2 * n as u128)) as u64;
            let (c, s) = twiddle(sq, 2 * n as u64);
            [c * scale, if inverse { s } else { -s } * scale]
        })
        .collect()
}

/// The forward transform of a power-of-two number of points, in f64 (radix 2).
fn radix2(x: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let m = x.len();
    if m == 1 {
        return x.to_vec();
    }
    let even: Vec<[f64; 2]> = x.iter().step_by(2).copied().collect();
    let odd: Vec<[f64; 2]> = x.iter().skip(1).step_by(2).copied().collect();
    let (e, o) = (radix2(&even), radix2(&odd));
    let mut out = vec![[0.0; 2]; m];
    for k in 0..m / 2 {
        let (c, s) = twiddle(k as u64, m as u64);
        let t = [o[k][0] * c + o[k][1] * s, o[k][1] * c - o[k][0] * s];
        out[k] = [e[k][0] + t[0], e[k][1] + t[1]];
        out[k + m / 2] = [e[k][0] - t[0], e[k][1] - t[1]];
    }
    out
}

/// Bluestein's chirp-z transform along dimension `axis` (a length with no factor up to
/// `max`, the longest direct product): with `jk = (j² + k² - (k - j)²) / 2`, `X_k = c_k Σ_j (x_j c_j)
/// conj(c_(k-j))`, a circular convolution of a power-of-two length `M >= 2n - 1` done by
/// transforms of length `M` (the chirp's own transform a constant computed in f64).
fn bluestein(b: &mut Builder, v: ValueId, axis: usize, inverse: bool, st: Stages) -> R<ValueId> {
    let t = ty_of(b, v);
    let (n, r) = (t.shape[axis], t.rank());
    let m = (2 * n - 1).next_power_of_two();
    let mut perm: Vec<i64> = (0..r as i64).filter(|&d| d != axis as i64).collect();
    perm.push(axis as i64);
    let v = b.transpose(v, &perm)?;
    let shape = ty_of(b, v).shape;
    let last = r as i64 - 1;
    let spread = |b: &mut Builder, values: &[[f64; 2]], shape: &[usize]| -> R<ValueId> {
        let c = constant(b, TensorType::new(t.dtype, [values.len()]), values)?;
        b.broadcast(c, &[last], shape)
    };
    let c = chirp(n, inverse, 1.0);
    let cv = spread(b, &c, &shape)?;
    let a = b.binary(Op::Multiply {}, v, cv)?;
    let zero = constant(b, TensorType::scalar(t.dtype), &[[0.0, 0.0]])?;
    let mut high = vec![0; r];
    high[r - 1] = (m - n) as i64;
    let a = b.inst(
        Op::Pad {
            edge_padding_low: vec![0; r],
            edge_padding_high: high,
            interior_padding: vec![0; r],
        },
        &[a, zero],
    )?;
    let fa = along(b, a, r - 1, false, st)?;
    // h[j] = conj(c_j) for |j| < n, placed circularly.
    let mut h = vec![[0.0; 2]; m];
    for (j, cj) in c.iter().enumerate() {
        h[j] = [cj[0], -cj[1]];
        if j > 0 {
            h[m - j] = h[j];
        }
    }
    let mut padded = shape.clone();
    padded[r - 1] = m;
    let hv = spread(b, &radix2(&h), &padded)?;
    let p = b.binary(Op::Multiply {}, fa, hv)?;
    let conv = along(b, p, r - 1, true, st)?;
    let conv = slice_last(b, conv, 0, n)?;
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    let dv = spread(b, &chirp(n, inverse, scale), &shape)?;
    b.binary(Op::Multiply {}, conv, dv)
}

/// A product with the DFT matrix of the length `n` of dimension `axis`, the dimension moved
/// last: one real product whatever the operand. The operand is laid out once with `axis` last
/// (no layout when it is last already), a complex one with its parts side by side
/// (`[.., re | im]`, `2n` elements), and multiplied by a real matrix whose `2n` columns are
/// the result's parts side by side: `[Wr | Wi]` for a real operand and, for a complex one,
/// `[[Wr, Wi], [-Wi, Wr]]` (`(a + ib)(Wr + i Wi) = (a Wr - b Wi) + i (a Wi + b Wr)`). The four
/// real products of a complex product are then one GEMM reading one copy of the operand.
fn direct(b: &mut Builder, v: ValueId, axis: usize, inverse: bool) -> R<ValueId> {
    let t = ty_of(b, v);
    let (n, r) = (t.shape[axis], t.rank());
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    let moved = if axis + 1 == r {
        v
    } else {
        let mut perm: Vec<i64> = (0..r as i64).filter(|&d| d != axis as i64).collect();
        perm.push(axis as i64);
        b.transpose(v, &perm)?
    };
    let complex = t.dtype.is_complex();
    let x = if complex {
        let re = b.unary(Op::Real {}, moved)?;
        let im = b.unary(Op::Imag {}, moved)?;
        concat_last(b, &[re, im])?
    } else {
        moved
    };
    let rows = if complex { 2 * n } else { n };
    let mut m = vec![0.0; rows * 2 * n];
    for j in 0..n {
        for k in 0..n {
            let (c, s) = twiddle((j * k % n) as u64, n as u64);
            let (c, s) = (c * scale, if inverse { s } else { -s } * scale);
            m[j * 2 * n + k] = c;
            m[j * 2 * n + n + k] = s;
            if complex {
                m[(n + j) * 2 * n + k] = -s;
                m[(n + j) * 2 * n + n + k] = c;
            }
        }
    }
    let w = Literal::from_f64s(TensorType::new(t.dtype.part(), [rows, 2 * n]), &m)
        .expect("the constant's element count");
    let w = b.inst(Op::Constant { value: w }, &[])?;
    let dot = Op::DotGeneral {
        lhs_batching_dimensions: vec![],
        rhs_batching_dimensions: vec![],
        lhs_contracting_dimensions: vec![r as i64 - 1],
        rhs_contracting_dimensions: vec![0],
    };
    let y = b.inst(dot, &[x, w])?;
    let re = slice_last(b, y, 0, n)?;
    let im = slice_last(b, y, n, 2 * n)?;
    b.binary(Op::Complex {}, re, im)
}

/// The four-step transform along dimension `axis` of length `n = n1 n2`.
fn four_step(
    b: &mut Builder,
    v: ValueId,
    axis: usize,
    n1: usize,
    inverse: bool,
    st: Stages,
) -> R<ValueId> {
    let t = ty_of(b, v);
    let n = t.shape[axis];
    let n2 = n / n1;
    let r = t.rank();
    let mut split = t.shape.clone();
    split.splice(axis..=axis, [n1, n2]);
    let v = b.reshape(v, &split)?;
    // Over j1: [.., j2 (at axis), .., k1].
    let y = direct(b, v, axis, inverse)?;
    let mut tw = Vec::with_capacity(n1 * n2);
    for j2 in 0..n2 {
        for k1 in 0..n1 {
            let (c, s) = twiddle((j2 * k1 % n) as u64, n as u64);
            tw.push([c, if inverse { s } else { -s }]);
        }
    }
    // (`y` is complex even where `v` was real.)
    let tw = constant(b, TensorType::new(ty_of(b, y).dtype, [n2, n1]), &tw)?;
    let ys = ty_of(b, y).shape;
    let tw = b.broadcast(tw, &[axis as i64, r as i64], &ys)?;
    let y = b.binary(Op::Multiply {}, y, tw)?;
    if st.left && axis + 1 == r && n2 <= st.max {
        return last_stage_left(b, y, inverse);
    }
    // Over j2: [.., k1, k2].
    let z = along(b, y, axis, inverse, st)?;
    let mut perm: Vec<i64> = (0..r as i64 + 1).collect();
    perm.swap(r - 1, r);
    let z = b.transpose(z, &perm)?;
    let mut out = ty_of(b, z).shape;
    out.truncate(r - 1);
    out.push(n);
    b.reshape(z, &out)
}

/// The last stage of a four-step transform along the last dimension, `y` `[.., n2, n1]`
/// (over `j2`, then `k1`) to `[.., n]` in the output order `k = k1 + n1 k2`, as one product
/// from the left: with the lines flattened to `p`, `Z[p] = M Y[p]` where `Y[p]` is
/// `[2 n2, n1]` (`y`'s real parts over its imaginary parts) and `M` the real `[2 n2, 2 n2]`
/// matrix `[[Wr, -Wi], [Wi, Wr]]` (the DFT matrix of length `n2`, `W` symmetric). `Z[p]`
/// holds the result's real parts (rows `k2`, columns `k1`: the output order) over its
/// imaginary parts, so the stage neither transposes `y` nor its result: its layout kernel
/// only stacks the twiddled parts, and what reads the result reads it in order. The product
/// reads `M` broadcast over `p` in place (a batch stride of 0, `fuse/views.rs`).
fn last_stage_left(b: &mut Builder, y: ValueId, inverse: bool) -> R<ValueId> {
    let t = ty_of(b, y);
    let r = t.rank();
    let (n2, n1) = (t.shape[r - 2], t.shape[r - 1]);
    let p: usize = t.shape[..r - 2].iter().product();
    let y = b.reshape(y, &[p, n2, n1])?;
    let re = b.unary(Op::Real {}, y)?;
    let im = b.unary(Op::Imag {}, y)?;
    let x = b.inst(Op::Concatenate { dimension: 1 }, &[re, im])?;
    let scale = if inverse { 1.0 / n2 as f64 } else { 1.0 };
    let w = 2 * n2;
    let mut m = vec![0.0; w * w];
    for k in 0..n2 {
        for j in 0..n2 {
            let (c, s) = twiddle((j * k % n2) as u64, n2 as u64);
            let (c, s) = (c * scale, if inverse { s } else { -s } * scale);
            // Re Z_k = Σ_j c a_j - s b_j, Im Z_k = Σ_j s a_j + c b_j.
            m[k * w + j] = c;
            m[k * w + n2 + j] = -s;
            m[(n2 + k) * w + j] = s;
            m[(n2 + k) * w + n2 + j] = c;
        }
    }
    let m = Literal::from_f64s(TensorType::new(t.dtype.part(), [w, w]), &m)
        .expect("the constant's element count");
    let m = b.inst(Op::Constant { value: m }, &[])?;
    let m = b.broadcast(m, &[1, 2], &[p, w, w])?;
    let dot = Op::DotGeneral {
        lhs_batching_dimensions: vec![0],
        rhs_batching_dimensions: vec![0],
        lhs_contracting_dimensions: vec![2],
        rhs_contracting_dimensions: vec![1],
    };
    let z = b.inst(dot, &[m, x])?;
    let z = b.reshape(z, &[p, 2, n2 * n1])?;
    let mut out = t.shape[..r - 2].to_vec();
    out.push(n2 * n1);
    let mut part = |q: i64| -> R<ValueId> {
        let v = b.inst(
            Op::Slice {
                start_indices: vec![0, q, 0],
                limit_indices: vec![p as i64, q + 1, (n2 * n1) as i64],
                strides: vec![1; 3],
            },
            &[z],
        )?;
        b.reshape(v, &out)
    };
    let (zr, zi) = (part(0)?, part(1)?);
    b.binary(Op::Complex {}, zr, zi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::random::{Rng, random_literal};

    /// The expansion of one `fft`, run on the reference interpreter, against the reference's
    /// own transform: within `64 ε Σ|x|` of each line (the products' and sums' rounding in
    /// the element type, through every factorization stage).
    fn agrees(src: &str, seed: u64) {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let g = expand_ffts(&f, &FusionLimits::default()).expect("expands");
        assert!(
            !g.insts.iter().any(|i| matches!(i.op, Op::Fft { .. })),
            "{g}"
        );
        let mut rng = Rng::new(seed);
        let ty = f.values[f.params[0].index()].clone();
        let x = random_literal(&mut rng, &ty);
        let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).expect("runs")[0].clone();
        let got = kiln_reference::eval(&g, std::slice::from_ref(&x)).expect("runs")[0].clone();
        assert_eq!(want.ty(), got.ty());
        let parts = |l: &Literal| -> Vec<f64> {
            if l.dtype().is_complex() {
                l.to_complex_f64s().into_iter().flatten().collect()
            } else {
                l.to_f64s()
            }
        };
        let xs = parts(&x);
        let eps = if want.dtype().part() == kiln_ir::DType::F64 {
            f64::EPSILON
        } else {
            f32::EPSILON as f64
        };
        let bound = 64.0 * eps * xs.iter().map(|v| v.abs()).sum::<f64>().max(1.0);
        for (i, (a, e)) in parts(&got).iter().zip(parts(&want)).enumerate() {
            assert!(
                (a - e).abs() <= bound,
                "{src}: element {i}: {a} against {e} (bound {bound})"
            );
        }
    }

    #[test]
    fn expansions_agree_with_the_reference() {
        let cases = [
            ("c64[3,8]", "FFT", "[8]", "c64[3,8]"),
            ("c128[5]", "IFFT", "[5]", "c128[5]"),
            ("c64[2,96]", "FFT", "[96]", "c64[2,96]"),
            ("c64[134]", "IFFT", "[134]", "c64[134]"),
            ("c128[67]", "FFT", "[67]", "c128[67]"),
            ("c64[2,67]", "IFFT", "[67]", "c64[2,67]"),
            ("c128[3,139]", "FFT", "[3, 139]", "c128[3,139]"),
            ("f32[2,71]", "RFFT", "[71]", "c64[2,36]"),
            ("c128[36]", "IRFFT", "[71]", "f64[71]"),
            ("c64[2,3,4]", "FFT", "[2, 3, 4]", "c64[2,3,4]"),
            ("c128[2,130,3]", "IFFT", "[130, 3]", "c128[2,130,3]"),
            ("f32[2,6]", "RFFT", "[6]", "c64[2,4]"),
            ("f64[3,5,7]", "RFFT", "[5, 7]", "c128[3,5,4]"),
            ("f32[200]", "RFFT", "[200]", "c64[101]"),
            ("c64[2,4]", "IRFFT", "[6]", "f32[2,6]"),
            ("c128[4,3]", "IRFFT", "[4, 5]", "f64[4,5]"),
            ("c64[66]", "IRFFT", "[130]", "f32[130]"),
            ("c64[1]", "IRFFT", "[1]", "f32[1]"),
            ("c64[2]", "IRFFT", "[2]", "f32[2]"),
            ("c64[0,4]", "FFT", "[4]", "c64[0,4]"),
            ("f32[3,0]", "RFFT", "[0]", "c64[3,0]"),
            ("f32[2,2048]", "RFFT", "[2048]", "c64[2,1025]"),
            ("c64[2,1025]", "IRFFT", "[2048]", "f32[2,2048]"),
            ("f64[3,2048]", "RFFT", "[3, 2048]", "c128[3,1025]"),
            ("c128[3,1025]", "IRFFT", "[3, 2048]", "f64[3,2048]"),
        ];
        for (k, (x, t, n, r)) in cases.iter().enumerate() {
            let src = format!(
                "func @main(%0: {x}) -> {r} {{\n  %1 = fft %0 {{fft_type = {t}, fft_length = {n}}} : {r}\n  return %1\n}}\n"
            );
            agrees(&src, k as u64);
        }
    }

    /// Real transforms of even lengths (the half-length path) against DFTs summed in f64 from
    /// their definitions, spectra drawn with nonzero imaginary parts at `k = 0` and `k = n/2`
    /// (which `IRFFT` ignores): a wrong twiddle sign, a wrong `k = 0` or `k = n/2` term or a
    /// wrong order of the interleaved parts is off by about the size of the values. Short
    /// direct products (`max`) take the long lengths through several four-step stages
    /// (`1000`: `500 = 5 x 5 x 5 x 4`) and Bluestein's convolution (`130`: `65 = 5 x 13`).
    #[test]
    fn half_length_real_transforms_agree_with_f64_dfts() {
        let mut rng = Rng::new(7);
        let cases = [2usize, 4, 6, 8, 10, 130, 1000]
            .map(|n| (n, 64))
            .into_iter()
            .chain([(1000, 8), (130, 4)]);
        for (n, max) in cases {
            let limits = FusionLimits {
                fft_half_min: 2,
                fft_direct_max: max,
                ..FusionLimits::default()
            };
            let h = n / 2 + 1;
            let run = |src: String, x: &Literal| {
                let f = kiln_ir::parse_func_text(&src).expect("valid IR");
                let g = expand_ffts(&f, &limits).expect("expands");
                kiln_reference::eval(&g, std::slice::from_ref(x)).expect("runs")[0].clone()
            };
            let w = |e: usize| twiddle((e % n) as u64, n as u64);
            // RFFT: X_k = Σ_j x_j e^(-2πi jk/n).
            let x = random_literal(&mut rng, &TensorType::new(kiln_ir::DType::F64, [2, n]));
            let got = run(
                format!(
                    "func @main(%0: f64[2,{n}]) -> c128[2,{h}] {{\n  %1 = fft %0 {{fft_type = RFFT, fft_length = [{n}]}} : c128[2,{h}]\n  return %1\n}}\n"
                ),
                &x,
            )
            .to_complex_f64s();
            let xs = x.to_f64s();
            let scale: f64 = xs.iter().map(|v| v.abs()).sum();
            for row in 0..2 {
                for k in 0..h {
                    let mut want = [0.0; 2];
                    for j in 0..n {
                        let (c, s) = w(j * k);
                        want[0] += xs[row * n + j] * c;
                        want[1] -= xs[row * n + j] * s;
                    }
                    let g = got[row * h + k];
                    assert!(
                        (g[0] - want[0]).abs().max((g[1] - want[1]).abs()) <= 1e-13 * scale,
                        "RFFT n = {n}, row {row}, k = {k}: {g:?} against {want:?}"
                    );
                }
            }
            // IRFFT: x_j = Re Σ_k Y_k e^(2πi jk/n) / n, Y the Hermitian completion of X.
            let ys: Vec<[f64; 2]> = (0..2 * h)
                .map(|_| [rng.uniform(-4.0, 4.0), rng.uniform(-4.0, 4.0)])
                .collect();
            let y = Literal::from_complex_f64s(TensorType::new(kiln_ir::DType::C128, [2, h]), &ys)
                .expect("the literal's element count");
            let got = run(
                format!(
                    "func @main(%0: c128[2,{h}]) -> f64[2,{n}] {{\n  %1 = fft %0 {{fft_type = IRFFT, fft_length = [{n}]}} : f64[2,{n}]\n  return %1\n}}\n"
                ),
                &y,
            )
            .to_f64s();
            let scale: f64 = ys.iter().map(|v| v[0].abs() + v[1].abs()).sum();
            for row in 0..2 {
                for j in 0..n {
                    let mut want = 0.0;
                    for k in 0..n {
                        let [a, c] = if k < h {
                            ys[row * h + k]
                        } else {
                            let [a, c] = ys[row * h + n - k];
                            [a, -c]
                        };
                        let (cs, s) = w(j * k);
                        // Re((a + ic)(cos + i sin)).
                        want += a * cs - c * s;
                    }
                    want /= n as f64;
                    let g = got[row * n + j];
                    assert!(
                        (g - want).abs() <= 1e-13 * scale,
                        "IRFFT n = {n}, row {row}, j = {j}: {g} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn long_composite_transforms_are_factored() {
        let src = "func @main(%0: c64[4096]) -> c64[4096] {\n  %1 = fft %0 {fft_type = FFT, fft_length = [4096]} : c64[4096]\n  return %1\n}\n";
        // The shapes of the real matrices `f` expanded multiplies by, sorted.
        let matrices = |src: &str| {
            let f = kiln_ir::parse_func_text(src).expect("valid IR");
            let g = expand_ffts(&f, &FusionLimits::default()).expect("expands");
            // (The twiddles are complex constants, the DFT matrices real ones.)
            let mut shapes: Vec<Vec<usize>> = (g.insts.iter())
                .filter_map(|i| match &i.op {
                    Op::Constant { value } if !value.dtype().is_complex() => {
                        Some(value.ty().shape.clone())
                    }
                    _ => None,
                })
                .collect();
            shapes.sort();
            (shapes, g)
        };
        // 4096 = 64 x 64: two complex products of length 64 (each one real product with a
        // `[128, 128]` matrix), no 4096 x 4096 one.
        let (shapes, g) = matrices(src);
        assert_eq!(shapes, vec![vec![128, 128]; 2], "{g}");
        // A prime above the direct limit is a convolution by transforms of 512 = 32 x 16
        // points (Bluestein), the factors balanced.
        let (shapes, g) = matrices(&src.replace("4096", "139"));
        let want = [[32, 32], [32, 32], [64, 64], [64, 64]].map(|s| s.to_vec());
        assert_eq!(shapes, want, "{g}");
        // Factors: balanced where both are direct, else the largest; none for a prime.
        assert_eq!(first_factor(1000, 64), Some(40));
        assert_eq!(first_factor(500, 64), Some(25));
        assert_eq!(first_factor(8192, 64), Some(64));
        assert_eq!(first_factor(139, 64), None);
    }

    /// `RFFT f32[64, 1000]` (`benches/kir/rfft_64x1000.kir`) in kernels on the CPU, at full
    /// and at half length: per stage one layout kernel (the operand with the transformed
    /// dimension last, parts side by side) and one product, then one kernel for the result's
    /// interleaved parts (the half length's combination) and its byte copy into the complex
    /// result. Four real products per complex stage, each with its own copy of its operand,
    /// took 13 kernels at full length and 18 at half length.
    #[test]
    fn the_small_real_transform_takes_six_kernels() {
        let src = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../benches/kir/rfft_64x1000.kir"
        ))
        .expect("the benchmark's program");
        let f = kiln_ir::parse_func_text(&src).expect("valid IR");
        for half_min in [2, usize::MAX] {
            let mut target = crate::target::TargetInfo::reference();
            target.fusion.fft_half_min = half_min;
            let lowered = crate::pipeline::lower_program(
                &f,
                &[false],
                &crate::options::Options::default(),
                &target,
                None,
                &mut |_| {},
            )
            .expect("lowers");
            let kernels = (lowered.steps.iter())
                .filter(|s| **s == crate::Step::Kernel)
                .count();
            assert_eq!(kernels, 6, "half length from {half_min}:\n{}", lowered.func);
        }
    }

    /// A real program through a real transform and its inverse compiles to kernels alone:
    /// nothing of it is left to the reference interpreter.
    #[test]
    fn real_transforms_compile_to_kernels() {
        let src = "func @main(%0: f32[3,96]) -> f32[3,96] {\n  %1 = fft %0 {fft_type = RFFT, fft_length = [3, 96]} : c64[3,49]\n  %2 = fft %1 {fft_type = IRFFT, fft_length = [3, 96]} : f32[3,96]\n  return %2\n}\n";
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let target = crate::target::TargetInfo::reference();
        for opts in [
            crate::options::Options::default(),
            crate::options::Options {
                optimize: false,
                ..Default::default()
            },
        ] {
            let lowered =
                crate::pipeline::lower_program(&f, &[false], &opts, &target, None, &mut |_| {})
                    .expect("lowers");
            for (inst, step) in lowered.func.insts.iter().zip(&lowered.steps) {
                assert_ne!(
                    *step,
                    crate::Step::Reference,
                    "{} runs on the reference\n{}",
                    inst.op.mnemonic(),
                    lowered.func
                );
            }
        }
    }
}
