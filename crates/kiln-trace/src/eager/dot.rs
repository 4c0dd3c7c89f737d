//! `dot_general` as a blocked loop. The operands are gathered into `[batch, m, k]` and
//! `[batch, k, n]` matrices of f64 (i64 for integer results), the contracting dimensions
//! flattened in the order the op lists them, as the reference walks them. Each output is the
//! sum of its products in increasing `k`, starting from the value Rust's f64 `sum` starts
//! from, exactly as the reference adds them (f32 products are exact in f64), and rounded once;
//! blocking over `k` keeps that order (a block's partial sums are carried to the next block).
//! Threads split the output rows; a register tile lives in AVX-512 or AVX2 vectors where the
//! CPU has them (looked up at run time).

use super::layout::{View, gather};
use super::{Elem, filled, par_chunks, with_elem};
use kiln_ir::{Data, Literal, TensorType};

/// Columns of a register tile (and of a packed panel of the right-hand matrix).
const NR: usize = 8;
/// Rows of a register tile.
const MR: usize = 4;
/// The `k` extent of a block: a panel's block (16 KiB) stays in the L1 cache.
const KC: usize = 256;

/// `dot_general` of `a` and `b` with batching dimensions `batch` and contracting dimensions
/// `contract` (each: lhs, rhs), with result type `ty`.
pub(super) fn run(
    [a, b]: [&Literal; 2],
    [lb, rb]: [&Vec<i64>; 2],
    [lc, rc]: [&Vec<i64>; 2],
    ty: &TensorType,
) -> Option<Data> {
    let dims = |v: &[i64], rank: usize| -> Option<Vec<usize>> {
        v.iter()
            .map(|&d| usize::try_from(d).ok().filter(|&d| d < rank))
            .collect()
    };
    let (ra, rbk) = (a.ty().rank(), b.ty().rank());
    let (lb, rb, lc, rc) = (dims(lb, ra)?, dims(rb, rbk)?, dims(lc, ra)?, dims(rc, rbk)?);
    let free = |rank: usize, used: [&Vec<usize>; 2]| -> Vec<usize> {
        (0..rank)
            .filter(|d| !used[0].contains(d) && !used[1].contains(d))
            .collect()
    };
    let (lf, rf) = (free(ra, [&lb, &lc]), free(rbk, [&rb, &rc]));
    let size = |shape: &[usize], ds: &[usize]| -> usize { ds.iter().map(|&d| shape[d]).product() };
    let (bsz, m, k, n) = (
        size(a.shape(), &lb),
        size(a.shape(), &lf),
        size(a.shape(), &lc),
        size(b.shape(), &rf),
    );
    if size(b.shape(), &rb) != bsz || size(b.shape(), &rc) != k || ty.numel() != bsz * m * n {
        return None;
    }
    let va = View::permuted(a.shape(), &[&lb[..], &lf, &lc].concat());
    let vb = View::permuted(b.shape(), &[&rb[..], &rc, &rf].concat());
    let shape = Shape { bsz, m, k, n };
    Some(with_elem!(ty.dtype, R => {
        if ty.dtype.is_float() {
            let x = with_elem!(a.dtype(), T => gather(T::slice(a.data())?, &va, |v: T| v.f64())?);
            let y = with_elem!(b.dtype(), T => gather(T::slice(b.data())?, &vb, |v: T| v.f64())?);
            R::data(gemm_f64(shape, &x, &y, tile_kernel())?.into_iter().map(R::from_f64).collect())
        } else {
            let x = with_elem!(a.dtype(), T => gather(T::slice(a.data())?, &va, |v: T| v.i64())?);
            let y = with_elem!(b.dtype(), T => gather(T::slice(b.data())?, &vb, |v: T| v.i64())?);
            R::data(gemm_i64(shape, &x, &y)?.into_iter().map(R::from_i64).collect())
        }
    }))
}

/// The extents of a batched product `[bsz, m, k] x [bsz, k, n]`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    bsz: usize,
    m: usize,
    k: usize,
    n: usize,
}

/// Wrapping integer products, summed in i64 (order does not matter).
fn gemm_i64(s: Shape, a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let Shape { m, k, n, .. } = s;
    let mut c = filled(s.bsz * m * n, 0i64)?;
    if n == 0 {
        return Some(c);
    }
    par_chunks(&mut c, n, s.bsz * m * n * k, |start, rows| {
        for (r, row) in rows.chunks_exact_mut(n).enumerate() {
            let i = start / n + r;
            let (batch, a_row) = (i / m.max(1), &a[i * k..(i + 1) * k]);
            let bm = &b[batch * k * n..(batch + 1) * k * n];
            for (kk, &x) in a_row.iter().enumerate() {
                for (o, &y) in row.iter_mut().zip(&bm[kk * n..(kk + 1) * n]) {
                    *o = o.wrapping_add(x.wrapping_mul(y));
                }
            }
        }
    });
    Some(c)
}

/// f64 products summed in increasing `k` from +0 (as the reference's dot products do).
fn gemm_f64(s: Shape, a: &[f64], b: &[f64], tile: TileKernel) -> Option<Vec<f64>> {
    let Shape { bsz, m, k, n } = s;
    let zero = 0.0f64;
    let mut c = filled(bsz * m * n, zero)?;
    if k == 0 || n == 0 || m == 0 {
        return Some(c);
    }
    // The right-hand matrices in panels of NR columns, each panel k rows of NR (zero-padded).
    let panels = n.div_ceil(NR);
    let mut bp = filled(bsz * panels * k * NR, 0.0f64)?;
    for (batch, dst) in bp.chunks_exact_mut(panels * k * NR).enumerate() {
        let src = &b[batch * k * n..(batch + 1) * k * n];
        for (p, panel) in dst.chunks_exact_mut(k * NR).enumerate() {
            let cols = NR.min(n - p * NR);
            for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
                row[..cols].copy_from_slice(&src[kk * n + p * NR..kk * n + p * NR + cols]);
            }
        }
    }
    let g = Gemm {
        a,
        bp: &bp,
        s,
        zero,
        tile,
    };
    par_chunks(&mut c, n, bsz * m * n * k / 4, |start, rows| {
        g.rows(start / n, rows)
    });
    Some(c)
}

/// A product's operands: the left-hand matrices and the packed right-hand panels.
struct Gemm<'a> {
    a: &'a [f64],
    bp: &'a [f64],
    s: Shape,
    zero: f64,
    tile: TileKernel,
}

impl Gemm<'_> {
    /// The output rows from `first` (counted over all batches) into `c`: blocks over `k`,
    /// then panels, then tiles of up to MR rows of one batch.
    fn rows(&self, first: usize, c: &mut [f64]) {
        let Shape { m, k, n, .. } = self.s;
        let panels = n.div_ceil(NR);
        let rows = c.len() / n;
        for k0 in (0..k).step_by(KC) {
            let k1 = (k0 + KC).min(k);
            for p in 0..panels {
                let cols = NR.min(n - p * NR);
                let mut r = 0;
                while r < rows {
                    let row = first + r;
                    let batch = row / m;
                    let mr = MR.min(rows - r).min(m - row % m);
                    let t = Tile {
                        a: &self.a[row * k..(row + mr) * k],
                        panel: &self.bp[(batch * panels + p) * k * NR..][k0 * NR..k1 * NR],
                        k,
                        k0,
                        k1,
                        n,
                        cols,
                        start: (k0 == 0).then_some(self.zero),
                    };
                    (self.tile)(&t, &mut c[r * n + p * NR..]);
                    r += mr;
                }
            }
        }
    }
}

/// One register tile: the output's rows of `a` (up to MR) by the panel's NR columns (the
/// first `cols` of them real), over `k0..k1`.
struct Tile<'a> {
    /// The tile's rows of the left-hand matrix (each `k` long).
    a: &'a [f64],
    /// The panel's rows `k0..k1` (NR each).
    panel: &'a [f64],
    k: usize,
    k0: usize,
    k1: usize,
    /// The output's row length.
    n: usize,
    cols: usize,
    /// The sums' start value on the first block; later blocks continue the output's sums.
    start: Option<f64>,
}

impl Tile<'_> {
    /// The tile's rows.
    fn rows(&self) -> usize {
        self.a.len() / self.k
    }

    /// Row `r` of the left-hand matrix over `k0..k1`.
    fn a_row(&self, r: usize) -> &[f64] {
        &self.a[r * self.k + self.k0..r * self.k + self.k1]
    }

    /// The accumulators' start: the start value, or the sums so far (padding columns: 0).
    fn start_row(&self, c: &[f64], r: usize) -> [f64; NR] {
        let mut v = [0.0; NR];
        for (j, x) in v.iter_mut().enumerate().take(self.cols) {
            *x = self.start.unwrap_or(c[r * self.n + j]);
        }
        v
    }

    /// Stores the real columns of row `r`.
    fn store_row(&self, c: &mut [f64], r: usize, v: &[f64; NR]) {
        c[r * self.n..r * self.n + self.cols].copy_from_slice(&v[..self.cols]);
    }
}

/// A function computing one tile.
type TileKernel = fn(&Tile, &mut [f64]);

/// The tile kernel for this CPU: AVX-512 or AVX2 registers when it has them.
fn tile_kernel() -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return x86::tile_avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return x86::tile_avx2;
        }
    }
    tile_plain
}

/// A tile in plain Rust, whatever the CPU.
fn tile_plain(t: &Tile, c: &mut [f64]) {
    for r in 0..t.rows() {
        let mut acc = t.start_row(c, r);
        let a = t.a_row(r);
        for (&x, b) in a.iter().zip(t.panel.chunks_exact(NR)) {
            for (s, &y) in acc.iter_mut().zip(b) {
                *s += x * y;
            }
        }
        t.store_row(c, r, &acc);
    }
}

/// Tiles in vector registers: a product and a sum per step (never fused, as the reference
/// computes them), each output's sum in increasing `k`.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{NR, Tile};
    use std::arch::x86_64::*;

    pub(super) fn tile_avx512(t: &Tile, c: &mut [f64]) {
        // SAFETY: chosen by `tile_kernel` only when the CPU has AVX-512F.
        unsafe {
            match t.rows() {
                4 => avx512::<4>(t, c),
                3 => avx512::<3>(t, c),
                2 => avx512::<2>(t, c),
                _ => avx512::<1>(t, c),
            }
        }
    }

    pub(super) fn tile_avx2(t: &Tile, c: &mut [f64]) {
        // SAFETY: chosen by `tile_kernel` only when the CPU has AVX2.
        unsafe {
            match t.rows() {
                4 => avx2::<4>(t, c),
                3 => avx2::<3>(t, c),
                2 => avx2::<2>(t, c),
                _ => avx2::<1>(t, c),
            }
        }
    }

    /// R rows of NR = 8 columns, one 512-bit register each.
    #[target_feature(enable = "avx512f")]
    fn avx512<const R: usize>(t: &Tile, c: &mut [f64]) {
        let mut acc = [_mm512_setzero_pd(); R];
        for (r, a) in acc.iter_mut().enumerate() {
            let v = t.start_row(c, r);
            // SAFETY: `v` holds 8 f64.
            *a = unsafe { _mm512_loadu_pd(v.as_ptr()) };
        }
        let rows: [&[f64]; R] = std::array::from_fn(|r| t.a_row(r));
        for (kk, b) in t.panel.chunks_exact(NR).enumerate() {
            // SAFETY: `b` holds NR = 8 f64.
            let b = unsafe { _mm512_loadu_pd(b.as_ptr()) };
            for r in 0..R {
                let x = _mm512_set1_pd(rows[r][kk]);
                acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(x, b));
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let mut v = [0.0; NR];
            // SAFETY: `v` holds 8 f64.
            unsafe { _mm512_storeu_pd(v.as_mut_ptr(), *a) };
            t.store_row(c, r, &v);
        }
    }

    /// R rows of NR = 8 columns, two 256-bit registers each.
    #[target_feature(enable = "avx2")]
    fn avx2<const R: usize>(t: &Tile, c: &mut [f64]) {
        let mut acc = [[_mm256_setzero_pd(); 2]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            let v = t.start_row(c, r);
            // SAFETY: `v` holds 8 f64.
            *a = unsafe {
                [
                    _mm256_loadu_pd(v.as_ptr()),
                    _mm256_loadu_pd(v.as_ptr().add(4)),
                ]
            };
        }
        let rows: [&[f64]; R] = std::array::from_fn(|r| t.a_row(r));
        for (kk, b) in t.panel.chunks_exact(NR).enumerate() {
            // SAFETY: `b` holds NR = 8 f64.
            let (b0, b1) = unsafe {
                (
                    _mm256_loadu_pd(b.as_ptr()),
                    _mm256_loadu_pd(b.as_ptr().add(4)),
                )
            };
            for r in 0..R {
                let x = _mm256_set1_pd(rows[r][kk]);
                acc[r][0] = _mm256_add_pd(acc[r][0], _mm256_mul_pd(x, b0));
                acc[r][1] = _mm256_add_pd(acc[r][1], _mm256_mul_pd(x, b1));
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let mut v = [0.0; NR];
            // SAFETY: `v` holds 8 f64.
            unsafe {
                _mm256_storeu_pd(v.as_mut_ptr(), a[0]);
                _mm256_storeu_pd(v.as_mut_ptr().add(4), a[1]);
            }
            t.store_row(c, r, &v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile kernel this CPU can run gives the plain kernel's bits, on tiles of every
    /// height and width, over several `k` blocks, with infinities, NaN and signed zeros.
    #[test]
    fn every_tile_kernel_gives_the_same_bits() {
        let mut kernels: Vec<(&str, TileKernel)> = vec![("plain", tile_plain)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(("avx512", x86::tile_avx512));
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                kernels.push(("avx2", x86::tile_avx2));
            }
        }
        let special = [
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-310,
        ];
        let value = |i: usize| {
            if i.is_multiple_of(11) {
                special[i / 11 % special.len()]
            } else {
                ((i * 7919) % 1000) as f64 / 250.0 - 2.0
            }
        };
        let s = Shape {
            bsz: 2,
            m: 7,
            k: 600,
            n: 21,
        };
        let a: Vec<f64> = (0..s.bsz * s.m * s.k).map(value).collect();
        let b: Vec<f64> = (0..s.bsz * s.k * s.n).map(|i| value(i + 5)).collect();
        let bits = |v: Vec<f64>| -> Vec<u64> {
            v.iter()
                .map(|x| if x.is_nan() { 1 } else { x.to_bits() })
                .collect()
        };
        let want = bits(gemm_f64(s, &a, &b, tile_plain).unwrap());
        for (name, k) in kernels {
            assert_eq!(bits(gemm_f64(s, &a, &b, k).unwrap()), want, "{name}");
        }
    }
}
