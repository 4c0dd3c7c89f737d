//! Layouts read in place by matrix products: where a GEMM's operand is a transpose, reshape or
//! slice (or a chain of them) of another value, and the elements it picks lie in that value's
//! buffer as the GEMM's strides can say ([`Strides`]: consecutive elements along the stored
//! rows, rows a fixed distance apart, each batch dimension a stride of its own), the product
//! reads that buffer in place and the layout takes no kernel: attention's heads split out of
//! `[batch, seq, heads * width]`, keys transposed, read where the projection wrote them. A
//! broadcast that only adds batch dimensions is read in place too, each of them a stride of
//! 0: one matrix multiplying every batch (`fft`'s DFT matrices applied from the left).

use crate::ir::{Kernel, Schedule, Strides};
use crate::lower::matmul_layout;
use kiln_ir::{Func, Op, ValueId};

/// A value read in place from another's buffer: element `i` of the value (row-major over
/// `shape`) lies at `offset + Σ i[d] * strides[d]` in `base`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct View {
    pub base: ValueId,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// What [`read_in_place`] decided.
#[derive(Clone, Debug, Default)]
pub(super) struct InPlace {
    /// Per GEMM instruction, per operand (A, B): the value its buffer is read from, with A's
    /// and B's strides, and whether each is then stored transposed.
    pub products: Vec<Option<Operands>>,
    /// Per instruction: a layout whose every reader reads it in place (it has no kernel).
    pub layouts: Vec<bool>,
}

/// A GEMM's operands as read in place.
#[derive(Clone, Debug)]
pub(super) struct Operands {
    /// The values read (the operands themselves where nothing is read in place).
    pub values: [ValueId; 2],
    /// A's and B's strides (`None`: as the operand is stored).
    pub strides: [Option<Strides>; 2],
    /// A and B stored transposed.
    pub trans: (bool, bool),
}

/// Whether `op` only lays its operand out again (each result element one operand element,
/// a broadcast's repeated).
fn is_layout(op: &Op) -> bool {
    matches!(
        op,
        Op::Transpose { .. } | Op::Reshape {} | Op::Slice { .. } | Op::BroadcastInDim { .. }
    )
}

/// `v` as stored: its own buffer, row-major.
pub(super) fn own(f: &Func, v: ValueId) -> View {
    let shape = f.values[v.index()].shape.clone();
    View {
        base: v,
        offset: 0,
        strides: kiln_ir::strides(&shape),
        shape,
    }
}

/// The strides of `shape` reshaped to `new`, its elements where they are, if each run of
/// dimensions that `new` regroups is one stride apart throughout.
pub(super) fn reshaped(shape: &[usize], strides: &[usize], new: &[usize]) -> Option<Vec<usize>> {
    let old: Vec<(usize, usize)> = (shape.iter().copied().zip(strides.iter().copied()))
        .filter(|&(e, _)| e != 1)
        .collect();
    let mut out = vec![0; new.len()];
    let (mut i, mut j) = (0, 0);
    while j < new.len() {
        if new[j] == 1 {
            j += 1;
            continue;
        }
        let (gj, mut pn) = (j, new[j]);
        j += 1;
        let &(mut po, _) = old.get(i)?;
        i += 1;
        while po != pn {
            if po < pn {
                let (e, s) = *old.get(i)?;
                // The next dimension must continue the previous one.
                if old[i - 1].1 != s * e {
                    return None;
                }
                po *= e;
                i += 1;
            } else {
                pn *= *new.get(j)?;
                j += 1;
            }
        }
        let mut s = old[i - 1].1;
        for d in (gj..j).rev() {
            out[d] = s;
            s *= new[d];
        }
    }
    (i == old.len()).then_some(out)
}

/// The view of `v` through the layout `inst` (whose operand has view `x`).
fn through(inst: &kiln_ir::Inst, x: &View, out: &[usize]) -> Option<View> {
    let mut v = View {
        shape: out.to_vec(),
        ..x.clone()
    };
    match &inst.op {
        Op::Transpose { permutation } => {
            v.strides = permutation.iter().map(|&p| x.strides[p as usize]).collect();
        }
        Op::Reshape {} => v.strides = reshaped(&x.shape, &x.strides, out)?,
        Op::Slice {
            start_indices,
            strides,
            ..
        } => {
            for d in 0..x.shape.len() {
                v.offset += start_indices[d] as usize * x.strides[d];
                v.strides[d] = x.strides[d] * strides[d] as usize;
            }
        }
        Op::BroadcastInDim {
            broadcast_dimensions,
        } => {
            // A dimension the broadcast adds or widens from 1 repeats: a stride of 0.
            v.strides = vec![0; out.len()];
            for (i, &d) in broadcast_dimensions.iter().enumerate() {
                if x.shape[i] == out[d as usize] {
                    v.strides[d as usize] = x.strides[i];
                }
            }
        }
        _ => return None,
    }
    Some(v)
}

/// The views of `v` through the layouts producing it, nearest first: `v` itself, then (while
/// its producer is a layout of one value) that value's view, and so on.
fn views(f: &Func, producer: &[Option<usize>], v: ValueId) -> Vec<View> {
    let mut chain = vec![v];
    while let Some(p) = producer[chain[chain.len() - 1].index()] {
        let inst = &f.insts[p];
        if !is_layout(&inst.op) || inst.operands.len() != 1 {
            break;
        }
        chain.push(inst.operands[0]);
    }
    // From the farthest value back to `v`: each view through the next layout.
    let mut out = Vec::new();
    for (n, &base) in chain.iter().enumerate() {
        let mut x = own(f, base);
        let ok = chain[..n].iter().rev().all(|&w| {
            let p = producer[w.index()].expect("a layout's result");
            match through(&f.insts[p], &x, &f.values[w.index()].shape) {
                Some(y) => {
                    x = y;
                    true
                }
                None => false,
            }
        });
        if ok {
            out.push(x);
        }
    }
    out
}

/// One run of dimensions `dims` of `view` as a single `(extent, stride)`, if its steps are one
/// stride apart (size-1 dimensions aside).
fn merged(view: &View, dims: std::ops::Range<usize>) -> Option<(usize, usize)> {
    let ds: Vec<usize> = dims.filter(|&d| view.shape[d] != 1).collect();
    let extent = ds.iter().map(|&d| view.shape[d]).product();
    for w in ds.windows(2) {
        if view.strides[w[0]] != view.strides[w[1]] * view.shape[w[1]] {
            return None;
        }
    }
    Some((extent, ds.last().map_or(0, |&d| view.strides[d])))
}

/// The strides a GEMM operand reads `view` through, and whether it is then stored transposed:
/// dimensions `0..nb` its batch, then the runs `first` and `second` (rows then columns of the
/// matrix as the product orders it, `[m, k]` for A and `[k, n]` for B, swapped when
/// `swapped`, as the operand's dimensions are ordered). One run must have consecutive
/// elements: its stored rows run along the other.
pub(super) fn operand_strides(
    view: &View,
    nb: usize,
    runs: (std::ops::Range<usize>, std::ops::Range<usize>),
    swapped: bool,
) -> Option<(Strides, bool)> {
    let (r0, r1) = (merged(view, runs.0)?, merged(view, runs.1)?);
    // Rows or columns that repeat (a broadcast's stride 0) are not a matrix the GEMM reads;
    // only batches may repeat.
    if [r0, r1].iter().any(|&(e, s)| e > 1 && s == 0) {
        return None;
    }
    // (rows, columns) of the product's matrix.
    let (rows, cols) = if swapped { (r1, r0) } else { (r0, r1) };
    let (ld, trans) = if cols.1 == 1 || cols.0 == 1 {
        (if rows.0 == 1 { cols.0 } else { rows.1 }, false)
    } else if rows.1 == 1 || rows.0 == 1 {
        (cols.1, true)
    } else {
        return None;
    };
    let batch: Vec<(usize, usize)> = (0..nb)
        .filter(|&d| view.shape[d] != 1)
        .map(|d| (view.shape[d], view.strides[d]))
        .collect();
    let batch = if batch.is_empty() {
        vec![(1, 0)]
    } else {
        batch
    };
    (ld >= 1).then_some((
        Strides {
            offset: view.offset,
            batch,
            ld,
        },
        trans,
    ))
}

/// Whether `s` reads matrices of `rows` rows of `len` elements stored one after another from
/// the start of the buffer, rows whole: as an operand without strides is read.
fn plain(s: &Strides, rows: usize, len: usize) -> bool {
    let mut next = rows * len;
    let batch_ok = s.batch.iter().rev().filter(|b| b.0 != 1).all(|&(e, st)| {
        let ok = st == next;
        next *= e;
        ok
    });
    s.offset == 0 && (s.ld == len || rows == 1) && batch_ok
}

/// For `f` (instruction `i`'s kernel in `ks`, its values' producers in `producer`): the
/// operands each GEMM reads in place through layouts, and the layouts left with no reader of
/// their own (see the module's documentation). Only on targets whose GEMM reads strides
/// (`strided`).
pub(super) fn read_in_place(
    f: &Func,
    ks: &[Option<Kernel>],
    producer: &[Option<usize>],
    strided: bool,
) -> InPlace {
    let n = f.insts.len();
    let mut out = InPlace {
        products: vec![None; n],
        layouts: vec![false; n],
    };
    if !strided {
        return out;
    }
    for (g, inst) in f.insts.iter().enumerate() {
        let Some(Kernel {
            schedule:
                Schedule::Gemm {
                    conv: None,
                    chain: None,
                    epilogue: None,
                    a_trans,
                    b_trans,
                    batch,
                    m,
                    n: cols,
                    k,
                    ..
                },
            ..
        }) = &ks[g]
        else {
            continue;
        };
        let Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } = &inst.op
        else {
            continue;
        };
        let (a, b) = (inst.operands[0], inst.operands[1]);
        let (ta, tb) = (&f.values[a.index()], &f.values[b.index()]);
        // A product with an empty operand reads nothing: its operands stay as they are
        // (strides describe the elements read, and there are none).
        if matmul_layout(lb, rb, lc, rc, ta, tb).is_none() || a == b {
            continue;
        }
        if ta.numel() == 0 || tb.numel() == 0 {
            continue;
        }
        let nb = lb.len();
        let (ca, cb) = (lc.len(), rc.len());
        // Each operand's runs as it is ordered: A `[m, k]` (`[k, m]` when transposed), B
        // `[k, n]` (`[n, k]`).
        let runs = |rank: usize, trans: bool, nc: usize, contracting_last: bool| {
            let split = if contracting_last == trans {
                nb + nc
            } else {
                rank - nc
            };
            (nb..split, split..rank)
        };
        let ra = runs(ta.rank(), *a_trans, ca, true);
        let rb_ = runs(tb.rank(), *b_trans, cb, false);
        let mut values = [a, b];
        let mut strides = [None, None];
        let mut trans = (*a_trans, *b_trans);
        for (j, (v, r, t)) in [(a, ra, *a_trans), (b, rb_, *b_trans)]
            .into_iter()
            .enumerate()
        {
            // The farthest view the GEMM can read.
            let found = views(f, producer, v)
                .into_iter()
                .skip(1)
                .rev()
                .find_map(|x| Some((operand_strides(&x, nb, r.clone(), t)?, x)));
            let Some(((s, tr), x)) = found else { continue };
            // The matrix as stored: `rows` rows of `len` elements.
            let (rows, len) = match (j, tr) {
                (0, false) => (*m, *k),
                (0, true) => (*k, *m),
                (_, false) => (*k, *cols),
                (_, true) => (*cols, *k),
            };
            let whole = f.values[x.base.index()].numel() == batch * rows * len;
            values[j] = x.base;
            strides[j] = (!(whole && plain(&s, rows, len))).then_some(s);
            if j == 0 {
                trans.0 = tr;
            } else {
                trans.1 = tr;
            }
        }
        if strides.iter().any(Option::is_some) {
            out.products[g] = Some(Operands {
                values,
                strides,
                trans,
            });
        }
    }
    // A layout has no kernel when no product reads its buffer and every reader reads it in
    // place: a product reading through it, or a layout that has no kernel (later
    // instructions first). Layouts a product reads through that keep a kernel for other
    // readers are stored anyway; the product still reads the farther buffer.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            readers[o.index()].push(i);
        }
    }
    let stored: std::collections::HashSet<ValueId> = (out.products.iter().flatten())
        .flat_map(|p| p.values)
        .collect();
    for i in (0..n).rev() {
        let inst = &f.insts[i];
        if !is_layout(&inst.op) || inst.results.len() != 1 {
            continue;
        }
        let r = inst.results[0];
        out.layouts[i] = !f.outputs.contains(&r)
            && !stored.contains(&r)
            && !readers[r.index()].is_empty()
            && (readers[r.index()].iter()).all(|&u| out.layouts[u] || out.products[u].is_some());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splitting and merging runs of a row-major layout, and a transposed one.
    #[test]
    fn reshapes_keep_elements_where_they_are() {
        // [16, 128, 256] rows of a [16, 128, 768] buffer, split into 4 heads of 64.
        let s = reshaped(&[16, 128, 256], &[98304, 768, 1], &[16, 128, 4, 64]);
        assert_eq!(s, Some(vec![98304, 768, 64, 1]));
        // Merged back: the heads' runs are 64 apart, the rows 768: only 4 x 64 merges.
        let s = reshaped(&[16, 128, 4, 64], &[98304, 768, 64, 1], &[16, 128, 256]);
        assert_eq!(s, Some(vec![98304, 768, 1]));
        // Rows of a slice (768 apart, 256 long) merge across the batch, 128 x 768 apart...
        let s = reshaped(&[16, 128, 256], &[98304, 768, 1], &[2048, 256]);
        assert_eq!(s, Some(vec![768, 1]));
        // ... but not when the batches lie farther apart, nor into one run with the columns.
        assert_eq!(
            reshaped(&[16, 128, 256], &[99000, 768, 1], &[2048, 256]),
            None
        );
        assert_eq!(
            reshaped(&[16, 128, 256], &[98304, 768, 1], &[16, 32768]),
            None
        );
        // Size-1 dimensions come and go.
        let s = reshaped(&[4, 1, 8], &[8, 8, 1], &[1, 32]);
        assert_eq!(s, Some(vec![0, 1]));
        // Transposed [8, 4] (strides 1, 8) merged: not strided.
        assert_eq!(reshaped(&[8, 4], &[1, 8], &[32]), None);
    }

    /// Attention's heads: the queries `[16, 4, 128, 64]` read from `[16, 128, 768]`, batch
    /// strides per head, rows 768 apart; the keys transposed read as B stored transposed.
    #[test]
    fn heads_read_in_place() {
        let q = View {
            base: ValueId(0),
            offset: 0,
            shape: vec![16, 4, 128, 64],
            strides: vec![98304, 64, 768, 1],
        };
        let (s, trans) = operand_strides(&q, 2, (2..3, 3..4), false).expect("strided");
        assert!(!trans);
        assert_eq!(
            s,
            Strides {
                offset: 0,
                batch: vec![(16, 98304), (4, 64)],
                ld: 768
            }
        );
        assert_eq!(s.end(128, 64), 16 * 128 * 768 - 768 + 64 + 64 * 3);
        // K transposed, `[16, 4, 64, 128]` from columns 256.. of the same buffer, as B
        // `[k, n]`: its `n` elements 768 apart, its `k` consecutive: B stored transposed.
        let k = View {
            offset: 256,
            shape: vec![16, 4, 64, 128],
            strides: vec![98304, 64, 1, 768],
            ..q
        };
        let (s, trans) = operand_strides(&k, 2, (2..3, 3..4), false).expect("strided");
        assert!(trans);
        assert_eq!(s.ld, 768);
        assert_eq!(s.offset, 256);
        // Neither run consecutive: not readable.
        let bad = View {
            strides: vec![98304, 64, 2, 768],
            ..k
        };
        assert!(operand_strides(&bad, 2, (2..3, 3..4), false).is_none());
    }

    /// A matrix broadcast over a batch is read in place with a batch stride of 0; one whose
    /// rows or columns repeat is not.
    #[test]
    fn a_broadcast_batch_repeats_one_matrix() {
        let f = kiln_ir::parse_func_text(
            "func @main(%0: f32[8,6]) -> f32[4,8,6] {\n  %1 = broadcast_in_dim %0 {broadcast_dimensions = [1, 2]} : f32[4,8,6]\n  return %1\n}\n",
        )
        .expect("valid IR");
        let x = own(&f, ValueId(0));
        let v = through(&f.insts[0], &x, &[4, 8, 6]).expect("a view");
        assert_eq!(v.strides, vec![0, 6, 1]);
        let (s, trans) = operand_strides(&v, 1, (1..2, 2..3), false).expect("strided");
        assert!(!trans);
        assert_eq!(
            s,
            Strides {
                offset: 0,
                batch: vec![(4, 0)],
                ld: 6
            }
        );
        // Rows repeated (a column broadcast along them): no matrix to read.
        let rows = View {
            strides: vec![0, 0, 1],
            ..v
        };
        assert!(operand_strides(&rows, 1, (1..2, 2..3), false).is_none());
    }
}
