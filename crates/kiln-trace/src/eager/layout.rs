//! Data movement: `broadcast_in_dim`, `transpose`, `slice` and `reverse` are one strided
//! gather each ([`View`]), `concatenate` copies blocks. Values are copied, never converted.

use super::{Elem, par_collect, with_elem};
use kiln_ir::{Data, Literal, Op, TensorType};
use std::mem::MaybeUninit;

/// The elements of an output of shape `shape` read from a source with `out[o] = src[base +
/// Σ o[d] * strides[d]]` (a stride may be 0, a broadcast, or negative, a reversal).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct View {
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub base: isize,
}

impl View {
    /// The same view with dimensions of size 1 dropped and neighbours that walk the source
    /// as one dimension merged (so the innermost loop is as long as it can be).
    fn simplified(&self) -> View {
        let mut shape: Vec<usize> = Vec::new();
        let mut strides: Vec<isize> = Vec::new();
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            if n == 1 {
                continue;
            }
            match (shape.last_mut(), strides.last_mut()) {
                (Some(pn), Some(ps)) if *ps == s * n as isize => {
                    *pn *= n;
                    *ps = s;
                }
                _ => {
                    shape.push(n);
                    strides.push(s);
                }
            }
        }
        View {
            shape,
            strides,
            base: self.base,
        }
    }

    /// A row-major view of a whole operand of shape `shape`, with its dimensions permuted:
    /// output dimension `i` is operand dimension `perm[i]`.
    pub fn permuted(shape: &[usize], perm: &[usize]) -> View {
        let st = kiln_ir::strides(shape);
        View {
            shape: perm.iter().map(|&p| shape[p]).collect(),
            strides: perm.iter().map(|&p| st[p] as isize).collect(),
            base: 0,
        }
    }

    /// The row-major view of a whole operand of shape `shape`.
    pub fn whole(shape: &[usize]) -> View {
        View {
            shape: shape.to_vec(),
            strides: kiln_ir::strides(shape)
                .iter()
                .map(|&s| s as isize)
                .collect(),
            base: 0,
        }
    }

    /// Whether the view reads consecutive elements in row-major order (from any offset):
    /// every dimension of more than one element steps by the product of the later ones.
    pub fn is_row_major(&self) -> bool {
        let mut want = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n > 1 && s != want {
                return false;
            }
            want *= n as isize;
        }
        true
    }
}

/// The source offsets of consecutive rows (the last dimension's runs) of a view.
struct Rows<'a> {
    shape: &'a [usize],
    strides: &'a [isize],
    idx: Vec<usize>,
    off: isize,
}

impl<'a> Rows<'a> {
    /// The rows of `v` (its dimensions but the last) from row `row` on.
    fn new(v: &'a View, row: usize) -> Rows<'a> {
        let shape = &v.shape[..v.shape.len() - 1];
        let mut idx = vec![0; shape.len()];
        let mut rest = row;
        for d in (0..shape.len()).rev() {
            idx[d] = rest % shape[d];
            rest /= shape[d];
        }
        let off = v.base
            + idx
                .iter()
                .zip(&v.strides)
                .map(|(&i, &s)| i as isize * s)
                .sum::<isize>();
        Rows {
            shape,
            strides: &v.strides,
            idx,
            off,
        }
    }

    /// The current row's offset; moves to the next row (the multi-index as an odometer).
    fn next(&mut self) -> isize {
        let off = self.off;
        for d in (0..self.shape.len()).rev() {
            self.idx[d] += 1;
            self.off += self.strides[d];
            if self.idx[d] < self.shape[d] {
                break;
            }
            self.off -= self.strides[d] * self.shape[d] as isize;
            self.idx[d] = 0;
        }
        off
    }
}

/// Rows and columns of a block of a strided gather.
const TILE: usize = 8;

/// `f` of each element of `src` that `view` reads, in the view's row-major order.
pub(super) fn gather<T: Copy + Sync, U: Copy + Default + Send>(
    src: &[T],
    view: &View,
    f: impl Fn(T) -> U + Sync,
) -> Option<Vec<U>> {
    let n: usize = view.shape.iter().product();
    if n == 0 {
        return Some(Vec::new());
    }
    let v = view.simplified();
    let Some(&len) = v.shape.last() else {
        return Some(vec![f(src[v.base as usize])]);
    };
    par_collect(n, len, n, |start, chunk| {
        gather_rows(src, &v, &f, start, chunk)
    })
}

/// The rows of a gather (see [`gather`]) from row `start / len` on into `chunk`.
fn gather_rows<T: Copy, U: Copy + Default>(
    src: &[T],
    v: &View,
    f: &impl Fn(T) -> U,
    start: usize,
    chunk: &mut [MaybeUninit<U>],
) {
    let len = v.shape[v.shape.len() - 1];
    let step = v.strides[v.shape.len() - 1];
    let mut rows = Rows::new(v, start / len);
    if step == 1 {
        for dst in chunk.chunks_exact_mut(len) {
            let off = rows.next() as usize;
            for (o, &x) in dst.iter_mut().zip(&src[off..off + len]) {
                o.write(f(x));
            }
        }
        return;
    }
    let nrows_all = chunk.len() / len;
    if step == 0 || nrows_all == 1 {
        // Rows of one element repeated (a broadcast), or a single row: plain loops.
        for dst in chunk.chunks_exact_mut(len) {
            let off = rows.next();
            if step == 0 {
                let x = f(src[off as usize]);
                dst.iter_mut().for_each(|o| {
                    o.write(x);
                });
            } else {
                for (j, o) in dst.iter_mut().enumerate() {
                    o.write(f(src[(off + j as isize * step) as usize]));
                }
            }
        }
        return;
    }
    // Strided rows, in blocks of TILE rows.
    for r0 in (0..nrows_all).step_by(TILE) {
        let nrows = TILE.min(nrows_all - r0);
        let mut offs = [0isize; TILE];
        for o in offs.iter_mut().take(nrows) {
            *o = rows.next();
        }
        let out = &mut chunk[r0 * len..(r0 + nrows) * len];
        if (1..nrows).all(|r| offs[r] == offs[0] + r as isize) {
            let at = |j: usize| (offs[0] + j as isize * step) as usize;
            strided_block(out, len, nrows, |j, col| {
                for (t, &x) in col.iter_mut().zip(&src[at(j)..at(j) + nrows]) {
                    *t = f(x);
                }
            });
        } else {
            strided_block(out, len, nrows, |j, col| {
                for (t, &off) in col.iter_mut().zip(&offs[..nrows]) {
                    *t = f(src[(off + j as isize * step) as usize]);
                }
            });
        }
    }
}

/// Writes `nrows` rows of `len` into `out`, TILE columns at a time: `column(j, col)` fills
/// `col` with column `j`'s `nrows` elements, into a small buffer whose rows are then written
/// out whole. (Writing the columns straight out instead stores at a stride of a row, and
/// runs several times slower; so does this loop inlined into its caller.)
#[inline(never)]
fn strided_block<U: Copy + Default>(
    out: &mut [MaybeUninit<U>],
    len: usize,
    nrows: usize,
    column: impl Fn(usize, &mut [U; TILE]),
) {
    let mut tmp = [[U::default(); TILE]; TILE];
    for j0 in (0..len).step_by(TILE) {
        let nj = TILE.min(len - j0);
        for (jj, col) in tmp.iter_mut().enumerate().take(nj) {
            column(j0 + jj, col);
        }
        for (r, at) in (j0..).step_by(len).take(nrows).enumerate() {
            for (o, t) in out[at..at + nj].iter_mut().zip(&tmp) {
                o.write(t[r]);
            }
        }
    }
}

/// The view `op` reads its operand `a` through, for a result of type `ty`.
fn view_of(op: &Op, a: &Literal, ty: &TensorType) -> Option<View> {
    view_through(op, &View::whole(a.shape()), ty)
}

/// The view `op` (a broadcast, transpose, slice or reverse) reads through when its operand is
/// itself the view `src` of some storage, for a result of type `ty`: the result's view of the
/// same storage. A reshape is a view only of a row-major view (any offset).
pub(crate) fn view_through(op: &Op, src: &View, ty: &TensorType) -> Option<View> {
    let st = &src.strides;
    let rank = src.shape.len();
    let dim = |d: i64| usize::try_from(d).ok().filter(|&d| d < rank);
    let mut v = match op {
        Op::BroadcastInDim {
            broadcast_dimensions,
        } => {
            if broadcast_dimensions.len() != rank {
                return None;
            }
            let mut strides = vec![0isize; ty.rank()];
            for (i, &d) in broadcast_dimensions.iter().enumerate() {
                if src.shape[i] != 1 {
                    *strides.get_mut(usize::try_from(d).ok()?)? = st[i];
                }
            }
            View {
                shape: ty.shape.clone(),
                strides,
                base: src.base,
            }
        }
        Op::Transpose { permutation } => {
            let perm: Vec<usize> = permutation.iter().map(|&p| dim(p)).collect::<Option<_>>()?;
            View {
                shape: perm.iter().map(|&p| src.shape[p]).collect(),
                strides: perm.iter().map(|&p| st[p]).collect(),
                base: src.base,
            }
        }
        Op::Slice {
            start_indices,
            strides: step,
            ..
        } => View {
            shape: ty.shape.clone(),
            strides: st.iter().zip(step).map(|(&s, &k)| s * k as isize).collect(),
            base: src.base
                + st.iter()
                    .zip(start_indices)
                    .map(|(&s, &i)| s * i as isize)
                    .sum::<isize>(),
        },
        Op::Reverse { dimensions } => {
            let mut v = src.clone();
            for &d in dimensions {
                let d = dim(d)?;
                v.base += v.strides[d] * (v.shape[d] as isize - 1).max(0);
                v.strides[d] = -v.strides[d];
            }
            v
        }
        Op::Reshape {} if src.is_row_major() => View {
            shape: ty.shape.clone(),
            strides: kiln_ir::strides(&ty.shape)
                .iter()
                .map(|&s| s as isize)
                .collect(),
            base: src.base,
        },
        _ => return None,
    };
    // A dimension of one element is never stepped: its stride is any (0 keeps views equal).
    for (s, &n) in v.strides.iter_mut().zip(&v.shape) {
        if n <= 1 {
            *s = 0;
        }
    }
    (v.shape == ty.shape).then_some(v)
}

/// The elements of `src` that `view` reads, as a row-major literal of type `ty` (`src`'s
/// dtype).
pub(crate) fn materialize(src: &Literal, view: &View, ty: &TensorType) -> Option<Literal> {
    if src.dtype() != ty.dtype || view.shape != ty.shape {
        return None;
    }
    // Sub-byte integers and small floats move as their storage bytes (a copy retagged: views
    // of them are rare).
    let bytes;
    let from = if ty.dtype.storage() != ty.dtype {
        bytes = src.data().clone().retag(ty.dtype.storage());
        &bytes
    } else {
        src.data()
    };
    let data =
        with_elem!(ty.dtype.storage(), T => T::data(gather(T::slice(from)?, view, |x: T| x)?));
    Literal::new(ty.clone(), data.retag(ty.dtype)).ok()
}

/// `op` (a data movement) on `lits`, with result type `ty`.
pub(super) fn run(op: &Op, lits: &[&Literal], ty: &TensorType) -> Option<Data> {
    if let Op::Concatenate { dimension } = op {
        return concatenate(lits, usize::try_from(*dimension).ok()?, ty);
    }
    let [a] = lits else { return None };
    if a.dtype() != ty.dtype {
        return None;
    }
    let view = view_of(op, a, ty)?;
    if view.shape != ty.shape {
        return None;
    }
    Some(with_elem!(ty.dtype, T => T::data(gather(T::slice(a.data())?, &view, |x: T| x)?)))
}

/// The operands one after another along `dim`: each output row (the dimensions before `dim`
/// fixed) is the operands' rows in turn.
fn concatenate(lits: &[&Literal], dim: usize, ty: &TensorType) -> Option<Data> {
    if lits
        .iter()
        .any(|l| l.dtype() != ty.dtype || l.ty().rank() != ty.rank())
        || dim >= ty.rank()
    {
        return None;
    }
    let outer: usize = ty.shape[..dim].iter().product();
    let inner: usize = ty.shape[dim + 1..].iter().product();
    let rows: Vec<usize> = lits.iter().map(|l| l.shape()[dim] * inner).collect();
    let row: usize = rows.iter().sum();
    if row * outer != ty.numel() {
        return None;
    }
    Some(with_elem!(ty.dtype, T => {
        let srcs: Vec<&[T]> = lits.iter().map(|l| T::slice(l.data())).collect::<Option<_>>()?;
        if row == 0 {
            return Some(T::data(Vec::new()));
        }
        T::data(par_collect(ty.numel(), row, ty.numel(), |start, chunk| {
            for (r, dst) in chunk.chunks_exact_mut(row).enumerate() {
                let o = start / row + r;
                let mut at = 0;
                for (s, &len) in srcs.iter().zip(&rows) {
                    for (d, &x) in dst[at..at + len].iter_mut().zip(&s[o * len..(o + 1) * len]) {
                        d.write(x);
                    }
                    at += len;
                }
            }
        })?)
    }))
}
