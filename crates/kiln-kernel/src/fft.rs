//! `fft` as matrix products, so that the compiled backends run it with their product kernels
//! (after [`crate::complex::split_complex`] has split the complex values into parts).
//!
//! A 1-D transform of length `n` along one dimension is a `dot_general` with the constant
//! `n x n` DFT matrix `w^(jk)` (`w = e^(-2πi/n)`; its conjugate divided by `n` for an inverse)
//! when `n <= DIRECT_MAX`; a longer `n` with no factor from 2 to `DIRECT_MAX` (a prime above
//! it) is Bluestein's chirp-z transform, a convolution done by transforms of a power-of-two
//! length at least `2n - 1`. A longer composite `n = n1 n2`, `n1` its largest
//! factor at most `DIRECT_MAX`, is Cooley and Tukey's four-step factorization: the dimension
//! reshaped to `[n1, n2]` (`j = n2 j1 + j2`), a direct transform of length `n1` over `j1`, a
//! multiply by the twiddles `w_n^(j2 k1)`, a transform of length `n2` over `j2` (recursively)
//! and a transpose to the output order `k = k1 + n1 k2`. Twiddles and matrices come from
//! [`kiln_ir::fft::twiddle`] in f64 and are rounded once to the element type.
//!
//! Several transformed dimensions are transformed one after another. `RFFT` transforms its
//! real operand (its first direct products are real products with the matrix's real and
//! imaginary parts, so no zero imaginary part is multiplied; a Bluestein length converts it to
//! complex first) and slices the first `n/2 + 1` elements of the last dimension; `IRFFT` completes the Hermitian spectrum of the last dimension (the conjugates
//! of the elements `1 .. n - n/2`, reversed, concatenated), transforms it and keeps the real
//! part.

use crate::canon::rebuild;
use kiln_ir::fft::twiddle;
use kiln_ir::{Builder, FftType, Func, Literal, Op, TensorType, ValueId, VerifyError};

type R<T> = Result<T, VerifyError>;

/// The longest transform done as one product with its DFT matrix.
pub const DIRECT_MAX: usize = 64;

/// `f` with every `fft` rewritten into products, twiddle multiplies and layout ops.
pub fn expand_ffts(f: &Func) -> R<Func> {
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
        Ok(Some(vec![expand(b, ops[0], *fft_type, fft_length, &ty)?]))
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
fn expand(b: &mut Builder, x: ValueId, t: FftType, lengths: &[i64], ty: &TensorType) -> R<ValueId> {
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
    match t {
        FftType::Fft | FftType::Ifft => transform(
            b,
            x,
            &(r - l..r).rev().collect::<Vec<_>>(),
            t == FftType::Ifft,
        ),
        FftType::Rfft => {
            let y = transform(b, x, &(r - l..r).rev().collect::<Vec<_>>(), false)?;
            slice_last(b, y, 0, ty.shape[r - 1])
        }
        FftType::Irfft => {
            let y = transform(b, x, &(r - l..r - 1).rev().collect::<Vec<_>>(), true)?;
            let n = ty.shape[r - 1];
            let h = ty_of(b, y).shape[r - 1];
            let full = if n > h {
                // Y[j] = conj(X[n - j]) for j in h..n: X[1 .. n - h + 1] reversed, conjugated.
                let tail = slice_last(b, y, 1, n - h + 1)?;
                let tail = b.inst(
                    Op::Reverse {
                        dimensions: vec![r as i64 - 1],
                    },
                    &[tail],
                )?;
                let re = b.unary(Op::Real {}, tail)?;
                let im = b.unary(Op::Imag {}, tail)?;
                let im = b.unary(Op::Negate {}, im)?;
                let conj = b.binary(Op::Complex {}, re, im)?;
                b.inst(
                    Op::Concatenate {
                        dimension: r as i64 - 1,
                    },
                    &[y, conj],
                )?
            } else {
                slice_last(b, y, 0, n)?
            };
            let z = transform(b, full, &[r - 1], true)?;
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

/// `v` transformed along each of `axes` (dimensions of `v`, in the order given) and the
/// dimensions put back in their order.
fn transform(b: &mut Builder, v: ValueId, axes: &[usize], inverse: bool) -> R<ValueId> {
    let r = ty_of(b, v).rank();
    // The original dimension at each position of the current value.
    let mut order: Vec<usize> = (0..r).collect();
    let mut v = v;
    for &a in axes {
        let p = order
            .iter()
            .position(|&d| d == a)
            .expect("a dimension of v");
        v = along(b, v, p, inverse)?;
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

/// The transform of `v` along dimension `axis`, the transformed dimension moved last.
fn along(b: &mut Builder, v: ValueId, axis: usize, inverse: bool) -> R<ValueId> {
    let t = ty_of(b, v);
    let n = t.shape[axis];
    let n1 = (2..=DIRECT_MAX.min(n / 2))
        .rev()
        .find(|&d| n.is_multiple_of(d));
    match n1 {
        _ if n <= DIRECT_MAX => direct(b, v, axis, inverse),
        Some(n1) => four_step(b, v, axis, n1, inverse),
        None => {
            let v = to_complex(b, v)?;
            bluestein(b, v, axis, inverse)
        }
    }
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
/// [`DIRECT_MAX`]): with `jk = (j² + k² - (k - j)²) / 2`, `X_k = c_k Σ_j (x_j c_j)
/// conj(c_(k-j))`, a circular convolution of a power-of-two length `M >= 2n - 1` done by
/// transforms of length `M` (the chirp's own transform a constant computed in f64).
fn bluestein(b: &mut Builder, v: ValueId, axis: usize, inverse: bool) -> R<ValueId> {
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
    let fa = along(b, a, r - 1, false)?;
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
    let conv = along(b, p, r - 1, true)?;
    let conv = slice_last(b, conv, 0, n)?;
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    let dv = spread(b, &chirp(n, inverse, scale), &shape)?;
    b.binary(Op::Multiply {}, conv, dv)
}

/// A product with the DFT matrix of the length of dimension `axis`.
fn direct(b: &mut Builder, v: ValueId, axis: usize, inverse: bool) -> R<ValueId> {
    let t = ty_of(b, v);
    let n = t.shape[axis];
    let scale = if inverse { 1.0 / n as f64 } else { 1.0 };
    let mut m = Vec::with_capacity(n * n);
    for j in 0..n {
        for k in 0..n {
            let (c, s) = twiddle((j * k % n) as u64, n as u64);
            let s = if inverse { s } else { -s };
            m.push([c * scale, s * scale]);
        }
    }
    let dot = Op::DotGeneral {
        lhs_batching_dimensions: vec![],
        rhs_batching_dimensions: vec![],
        lhs_contracting_dimensions: vec![axis as i64],
        rhs_contracting_dimensions: vec![0],
    };
    if !t.dtype.is_complex() {
        // A real operand: one real product with each part of the matrix.
        let mt = TensorType::new(t.dtype, [n, n]);
        let part = |k: usize| {
            let v: Vec<f64> = m.iter().map(|z| z[k]).collect();
            Literal::from_f64s(mt.clone(), &v).expect("the constant's element count")
        };
        let wr = b.inst(Op::Constant { value: part(0) }, &[])?;
        let wi = b.inst(Op::Constant { value: part(1) }, &[])?;
        let re = b.inst(dot.clone(), &[v, wr])?;
        let im = b.inst(dot, &[v, wi])?;
        return b.binary(Op::Complex {}, re, im);
    }
    let w = constant(b, TensorType::new(t.dtype, [n, n]), &m)?;
    b.inst(dot, &[v, w])
}

/// The four-step transform along dimension `axis` of length `n = n1 n2`.
fn four_step(b: &mut Builder, v: ValueId, axis: usize, n1: usize, inverse: bool) -> R<ValueId> {
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
    // Over j2: [.., k1, k2].
    let z = along(b, y, axis, inverse)?;
    let mut perm: Vec<i64> = (0..r as i64 + 1).collect();
    perm.swap(r - 1, r);
    let z = b.transpose(z, &perm)?;
    let mut out = ty_of(b, z).shape;
    out.truncate(r - 1);
    out.push(n);
    b.reshape(z, &out)
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
        let g = expand_ffts(&f).expect("expands");
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
        ];
        for (k, (x, t, n, r)) in cases.iter().enumerate() {
            let src = format!(
                "func @main(%0: {x}) -> {r} {{\n  %1 = fft %0 {{fft_type = {t}, fft_length = {n}}} : {r}\n  return %1\n}}\n"
            );
            agrees(&src, k as u64);
        }
    }

    #[test]
    fn long_composite_transforms_are_factored() {
        let src = "func @main(%0: c64[4096]) -> c64[4096] {\n  %1 = fft %0 {fft_type = FFT, fft_length = [4096]} : c64[4096]\n  return %1\n}\n";
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        // The largest constant (DFT matrix or twiddles) of `f` expanded.
        let biggest = |f: &Func| {
            let g = expand_ffts(f).expect("expands");
            let most = g
                .insts
                .iter()
                .filter_map(|i| match &i.op {
                    Op::Constant { value } => Some(value.numel()),
                    _ => None,
                })
                .max();
            (most, g)
        };
        // 4096 = 64 x 64: two products with 64 x 64 matrices, no 4096 x 4096 one.
        let (most, g) = biggest(&f);
        assert_eq!(most, Some(64 * 64), "{g}");
        // A prime above the direct limit is a convolution of 512 = 64 x 8 points (Bluestein).
        let src = src.replace("4096", "139");
        let (most, g) = biggest(&kiln_ir::parse_func_text(&src).expect("valid IR"));
        assert_eq!(most, Some(64 * 64), "{g}");
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
