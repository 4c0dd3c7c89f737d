//! Multi-output fusion of sibling kernels (see [`merge_siblings`]).

use super::{Fused, MAX_MERGED_NODES, map_inputs, nodes, step_reads};
use crate::kernel::{Kernel, Schedule};
use kiln_ir::{Func, ValueId};

/// Multi-output fusion: loop-nest kernels over the same index space (output shape) run as one
/// loop nest writing several outputs. Kernel `i` merges into a later kernel `j` when nothing
/// reads `i`'s result before `j` has run (so `j`'s place in the program is late enough for
/// both): the siblings of one producer read their shared inputs in one pass, and reductions
/// they both inline (a row's mean and variance) are computed once per row (the emitter's
/// hoisting shares equal reductions). The merged kernel's extra outputs follow its inputs in
/// the pointer table.
pub(super) fn merge_siblings(f: &Func, out: &mut Fused) {
    let n = f.insts.len();
    let size = |k: &Kernel| nodes(&k.body) + k.extra.iter().map(|e| nodes(&e.body)).sum::<usize>();
    // Each kernel's size, kept up to date as kernels merge (walking the bodies for every pair
    // made this quadratic in the bodies' size on long programs).
    let mut sizes: Vec<usize> = out
        .kernels
        .iter()
        .map(|k| k.as_ref().map_or(0, size))
        .collect();
    for j in 0..n {
        match &out.kernels[j] {
            Some(k) if k.schedule == Schedule::Nest => {}
            _ => continue,
        }
        for i in (0..j).rev() {
            let Some(ki) = &out.kernels[i] else { continue };
            let kj = out.kernels[j].as_ref().expect("checked above");
            if ki.schedule != Schedule::Nest
                || ki.out.shape != kj.out.shape
                || sizes[i] + sizes[j] > MAX_MERGED_NODES
            {
                continue;
            }
            // Everything kernel i writes (its result and what merged into it) moves to j.
            let moved: Vec<ValueId> = std::iter::once(f.insts[i].results[0])
                .chain(out.extra[i].iter().copied())
                .collect();
            if (i + 1..=j).any(|u| step_reads(f, out, u).iter().any(|v| moved.contains(v))) {
                continue;
            }
            let ki = out.kernels[i].take().expect("checked above");
            let mut inputs = out.operands[j].clone();
            let shared = out.operands[i]
                .iter()
                .filter(|v| inputs.contains(v))
                .count();
            let map: Vec<usize> = out.operands[i]
                .iter()
                .map(|v| match inputs.iter().position(|w| w == v) {
                    Some(k) => k,
                    None => {
                        inputs.push(*v);
                        inputs.len() - 1
                    }
                })
                .collect();
            let kj = out.kernels[j].as_mut().expect("checked above");
            for (ty, body) in std::iter::once((&ki.out, &ki.body))
                .chain(ki.extra.iter().map(|x| (&x.out, &x.body)))
            {
                kj.extra.push(crate::kernel::Extra {
                    out: ty.clone(),
                    body: map_inputs(body, &|x| map[x]),
                    slot: 0,
                });
            }
            kj.vars = kj.vars.max(ki.vars);
            out.operands[j] = inputs;
            out.operands[i].clear();
            out.extra[i].clear();
            out.extra[j].extend(&moved);
            for m in out.merged_into.iter_mut() {
                if *m == Some(i) {
                    *m = Some(j);
                }
            }
            out.merged_into[i] = Some(j);
            sizes[j] = out.kernels[j].as_ref().map_or(0, size);
            let absorbed = std::mem::take(&mut out.members[i]);
            out.members[j].extend(absorbed);
            out.members[j].sort_unstable();
            out.members[j].dedup();
            let by_i = format!("written by #{i}'s");
            for (u, d) in out.decisions.iter_mut().enumerate() {
                if u == i || out.merged_into[u] == Some(j) && d.starts_with(&by_i) {
                    *d = format!(
                        "written by #{j}'s kernel: multi-output fusion over the same index space \
                         {:?} ({shared} input buffer(s) shared), nothing reads it before #{j}",
                        ki.out.shape
                    );
                }
            }
        }
        // The extra outputs' pointers follow the inputs.
        let ninputs = out.operands[j].len();
        if let Some(k) = out.kernels[j].as_mut() {
            for (e, x) in k.extra.iter_mut().enumerate() {
                x.slot = ninputs + e;
            }
        }
    }
}
