//! Products stored through strides: where a matrix product's only reader is a transpose or a
//! reshape (or a chain of them, each the only reader of the one before), and the product's
//! matrices lie in the last layout's buffer as strides can say (rows of consecutive elements a
//! fixed distance apart, a stride per batch dimension: [`Strides`]), the product's GEMM writes
//! that buffer itself and the layouts take no kernel: attention's heads `[batch, heads, seq,
//! width]` merged back into `[batch, seq, heads * width]` where the output projection reads
//! them.

use super::views::{View, operand_strides, own, reshaped};
use super::{Fused, FusionDecision};
use crate::ir::{Kernel, Schedule, Store, Strides};
use kiln_ir::{Func, Op, ValueId};

/// The view of `u` in the buffer where `x`, the result of layout `op` of `u`, lies as `x` says
/// (the inverse of [`super::views`]' step through a layout).
fn before(op: &Op, x: &View, shape: &[usize]) -> Option<View> {
    let strides = match op {
        Op::Reshape {} => reshaped(&x.shape, &x.strides, shape)?,
        Op::Transpose { permutation } => {
            // Result dimension d is the operand's dimension permutation[d].
            let mut s = vec![0; shape.len()];
            for (d, &p) in permutation.iter().enumerate() {
                s[p as usize] = x.strides[d];
            }
            s
        }
        _ => return None,
    };
    Some(View {
        shape: shape.to_vec(),
        strides,
        ..x.clone()
    })
}

/// The GEMM kernels of plain products (no epilogue, chain or convolution) whose result only
/// layouts read, given the buffer of the farthest layout they can store into (see the module's
/// documentation): that layout's kernel becomes the product's GEMM, storing through strides,
/// and the product and the layouts before it have no kernel. Only on targets whose GEMM takes
/// strides (`strided`).
pub(super) fn store_through_layouts(f: &Func, out: &mut Fused, strided: bool) {
    if !strided {
        return;
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            readers[o.index()].push(i);
        }
    }
    for p in 0..f.insts.len() {
        let Some(pk) = &out.kernels[p] else { continue };
        let Schedule::Gemm {
            epilogue: None,
            chain: None,
            conv: None,
            store: None,
            batch,
            m,
            n,
            ..
        } = pk.schedule
        else {
            continue;
        };
        let Op::DotGeneral {
            lhs_batching_dimensions: lb,
            lhs_contracting_dimensions: lc,
            ..
        } = &f.insts[p].op
        else {
            continue;
        };
        if out.inlined[p]
            || !out.extra[p].is_empty()
            || f.insts[p].results.len() != 1
            || batch * m * n == 0
        {
            continue;
        }
        let v = f.insts[p].results[0];
        // The layouts after the product, each the only reader of the value before it.
        let mut layouts: Vec<usize> = Vec::new();
        let mut cur = v;
        while !f.outputs.contains(&cur) {
            let [l] = readers[cur.index()][..] else { break };
            let inst = &f.insts[l];
            if !matches!(inst.op, Op::Transpose { .. } | Op::Reshape {})
                || inst.operands.len() != 1
                || inst.results.len() != 1
            {
                break;
            }
            layouts.push(l);
            cur = inst.results[0];
        }
        // The farthest layout whose kernel is only the layouts up to it, reading the product,
        // and whose buffer holds the product's matrices as strides say.
        let nb = lb.len();
        let ma = f.values[f.insts[p].operands[0].index()].rank() - nb - lc.len();
        let found = (1..=layouts.len()).rev().find_map(|t| {
            let l = layouts[t - 1];
            let lk = out.kernels[l].as_ref()?;
            let mut members = layouts[..t].to_vec();
            members.sort_unstable();
            let only_layouts = lk.schedule == Schedule::Nest
                && lk.extra.is_empty()
                && !out.inlined[l]
                && out.merged_into[l].is_none()
                && out.operands[l] == [v]
                && out.members[l] == members;
            // No other kernel reads the product or the layouts before `l` (those inlined
            // are computed in kernels whose operands say what they read).
            let inner: Vec<ValueId> = std::iter::once(v)
                .chain(layouts[..t - 1].iter().map(|&i| f.insts[i].results[0]))
                .collect();
            let unread = (0..f.insts.len()).all(|i| {
                i == l
                    || out.inlined[i]
                    || out.kernels[i].is_none()
                    || !out.operands[i].iter().any(|o| inner.contains(o))
            });
            if !only_layouts || !unread {
                return None;
            }
            let w = f.insts[l].results[0];
            let mut x = own(f, w);
            for &i in layouts[..t].iter().rev() {
                let operand = f.insts[i].operands[0];
                x = before(&f.insts[i].op, &x, &f.values[operand.index()].shape)?;
            }
            let rank = x.shape.len();
            let (s, trans) = operand_strides(&x, nb, (nb..nb + ma, nb + ma..rank), false)?;
            (!trans && s.disjoint(m, n) && s.end(m, n) <= f.values[w.index()].numel())
                .then_some((l, w, s))
        });
        let Some((l, w, strides)) = found else {
            continue;
        };
        if batch * m * n != f.values[w.index()].numel() {
            continue;
        }
        store_into(f, out, p, l, w, strides);
    }
}

/// Gives layout `l`'s kernel to product `p`'s GEMM, storing through `strides` into `w`'s
/// buffer (`l`'s result).
fn store_into(f: &Func, out: &mut Fused, p: usize, l: usize, w: ValueId, strides: Strides) {
    let mut k: Kernel = out.kernels[p].take().expect("a GEMM kernel");
    if let Schedule::Gemm { store, .. } = &mut k.schedule {
        *store = Some(Box::new(Store {
            buffer: f.values[w.index()].clone(),
            strides,
        }));
    }
    out.kernels[l] = Some(k);
    out.operands[l] = out.operands[p].clone();
    let absorbed = std::mem::take(&mut out.members[p]);
    out.members[l].extend(absorbed);
    out.members[l].sort_unstable();
    out.inlined[p] = true;
    out.decisions[p] = FusionDecision::StoredBy(l);
    out.decisions[l] = FusionDecision::Stores(p);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention's heads merged back: `[16, 4, 128, 64]` transposed to `[16, 128, 4, 64]` and
    /// reshaped to `[16, 128, 256]`: each head's rows 256 apart, heads 64 apart, batches
    /// 32768.
    #[test]
    fn heads_merged_back_are_strides() {
        let w = View {
            base: ValueId(0),
            offset: 0,
            shape: vec![16, 128, 256],
            strides: vec![32768, 256, 1],
        };
        let t = before(&Op::Reshape {}, &w, &[16, 128, 4, 64]).expect("a reshape");
        assert_eq!(t.strides, vec![32768, 256, 64, 1]);
        let perm = Op::Transpose {
            permutation: vec![0, 2, 1, 3],
        };
        let v = before(&perm, &t, &[16, 4, 128, 64]).expect("a transpose");
        assert_eq!(v.strides, vec![32768, 64, 256, 1]);
        let (s, trans) = operand_strides(&v, 2, (2..3, 3..4), false).expect("strided");
        assert!(!trans);
        assert_eq!(
            s,
            Strides {
                offset: 0,
                batch: vec![(16, 32768), (4, 64)],
                ld: 256
            }
        );
        assert!(s.disjoint(128, 64));
        assert_eq!(s.end(128, 64), 16 * 128 * 256);
        // Heads 32 apart would overlap the previous head's rows.
        let overlapping = Strides {
            batch: vec![(16, 32768), (4, 32)],
            ..s
        };
        assert!(!overlapping.disjoint(128, 64));
    }
}
