//! Multi-output fusion of sibling kernels (see [`merge_siblings`]).

use super::inlinable::nodes;
use super::{Fused, FusionDecision, MAX_MERGED_NODES, producers, step_reads};
use crate::ir::{Kernel, Schedule};
use crate::lower::is_byte_copy;
use crate::rewrite::map_inputs;
use kiln_ir::{Func, ValueId};
use std::collections::HashMap;

/// Whether kernel `k` of instruction `i` may merge with siblings: a loop nest, and not a byte
/// copy ([`is_byte_copy`]: its kernel reads its input as bytes, as the device plan marks its
/// step, so a merged kernel's other reads, or the copy's read inside another kernel, would
/// take the wrong element type; random seed 17423's `bf16[1]` to `f16[1]` read its input past
/// its one element on the GPU emulator, and a `u8` to `i8` copy's read of a `u8` would be
/// taken as its elements, not its bytes).
fn mergeable(f: &Func, i: usize, k: &Kernel) -> bool {
    k.schedule == Schedule::Nest && !is_byte_copy(f, &f.insts[i])
}

/// Multi-output fusion: loop-nest kernels over the same index space (output shape) run as one
/// loop nest writing several outputs. Kernel `i` merges into a later kernel `j` when they are
/// related ([`related`]: they read an input in common, or one reads only what the other's
/// producers or theirs wrote) and nothing reads `i`'s result before `j` has run (so `j`'s
/// place in the program is late enough for both): the siblings of one producer read their
/// shared inputs in one pass, and reductions they both inline (a row's mean and variance) are
/// computed once per row (the emitter's hoisting shares equal reductions). The merged
/// kernel's extra outputs follow its inputs in the pointer table.
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
    // The steps reading each value, in order, kept up to date as kernels merge: what kernel
    // `i` writes is read before kernel `j` runs when its first reader after `i` is at most `j`
    // (scanning the steps between every pair made this quadratic on long programs).
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); f.values.len()];
    for u in 0..n {
        for v in step_reads(f, out, u) {
            let r = &mut readers[v.index()];
            if r.last() != Some(&u) {
                r.push(u);
            }
        }
    }
    let read_by = |readers: &[Vec<usize>], v: ValueId, i: usize, j: usize| {
        let r = &readers[v.index()];
        r.get(r.partition_point(|&u| u <= i))
            .is_some_and(|&u| u <= j)
    };
    // Per output shape: the earlier loop-nest kernels a later one may still take in, by index.
    // A kernel leaves when it merges, or when a step after it reads what it writes: that step
    // keeps reading it, or merges into a later kernel, which then reads it, so no later kernel
    // could take it in either.
    let mut open: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
    let def = producers(f);
    // Per kernel: the instructions whose results it writes as extra outputs.
    let mut merged: Vec<Vec<usize>> = vec![Vec::new(); n];
    for j in 0..n {
        let shape = match &out.kernels[j] {
            Some(k) if mergeable(f, j, k) => k.out.shape.clone(),
            _ => continue,
        };
        let mut candidates = open.remove(&shape).unwrap_or_default();
        let mut left = Vec::with_capacity(candidates.len() + 1);
        while let Some(i) = candidates.pop() {
            if sizes[i] + sizes[j] > MAX_MERGED_NODES {
                left.push(i);
                continue;
            }
            // Everything kernel i writes (its result and what merged into it) moves to j.
            let result = f.insts[i].results[0];
            if std::iter::once(&result)
                .chain(&out.extra[i])
                .any(|&v| read_by(&readers, v, i, j))
            {
                continue;
            }
            if !related(f, out, &def, i, j) {
                left.push(i);
                continue;
            }
            let moved: Vec<ValueId> = std::iter::once(result)
                .chain(out.extra[i].iter().copied())
                .collect();
            let ki = out.kernels[i].take().expect("a candidate has its kernel");
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
            // Kernel i's reads become kernel j's.
            for v in &out.operands[i] {
                let r = &mut readers[v.index()];
                if let Ok(k) = r.binary_search(&i) {
                    r.remove(k);
                }
                if let Err(k) = r.binary_search(&j) {
                    r.insert(k, j);
                }
            }
            let kj = out.kernels[j].as_mut().expect("checked above");
            for (ty, body) in std::iter::once((&ki.out, &ki.body))
                .chain(ki.extra.iter().map(|x| (&x.out, &x.body)))
            {
                kj.extra.push(crate::ir::Extra {
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
            let absorbed = std::mem::take(&mut merged[i]);
            for &m in &absorbed {
                out.merged_into[m] = Some(j);
            }
            out.merged_into[i] = Some(j);
            sizes[j] = out.kernels[j].as_ref().map_or(0, size);
            let members = std::mem::take(&mut out.members[i]);
            out.members[j].extend(members);
            out.members[j].sort_unstable();
            out.members[j].dedup();
            for &u in std::iter::once(&i).chain(&absorbed) {
                let d = &mut out.decisions[u];
                if u == i || matches!(d, FusionDecision::Merged { kernel, .. } if *kernel == i) {
                    *d = FusionDecision::Merged {
                        kernel: j,
                        shape: ki.out.shape.clone(),
                        shared,
                    };
                }
            }
            merged[j].push(i);
            merged[j].extend(absorbed);
        }
        left.reverse();
        left.push(j);
        open.insert(shape, left);
        // The extra outputs' pointers follow the inputs.
        let ninputs = out.operands[j].len();
        if let Some(k) = out.kernels[j].as_mut() {
            for (e, x) in k.extra.iter_mut().enumerate() {
                x.slot = ninputs + e;
            }
        }
    }
}

/// The steps writing what step `u` reads: a value's defining instruction, or the kernel it
/// merged into (none for parameters, and none for values that read nothing, such as
/// constants and iotas, which are there from the start).
fn writers(f: &Func, out: &Fused, def: &[Option<usize>], u: usize) -> Vec<usize> {
    let mut w: Vec<usize> = step_reads(f, out, u)
        .iter()
        .filter_map(|v| {
            let mut s = def[v.index()].filter(|&s| !f.insts[s].operands.is_empty())?;
            while let Some(j) = out.merged_into[s] {
                s = j;
            }
            Some(s)
        })
        .collect();
    w.sort_unstable();
    w.dedup();
    w
}

/// Whether kernels `i` and `j` are related enough to run as one: they read an input in common
/// that is not a scalar (what the merged kernel reads once for both), or the steps writing
/// what one reads all wrote what the other reads or what its writers read (a layer norm's
/// gradients: the beta gradient sums the incoming gradient, the gamma gradient its product
/// with the normalized input, which the row kernel wrote from the same incoming gradient).
/// Merged, each kernel waits for the other's inputs: unrelated kernels stay apart. An
/// optimizer's update of one parameter (reading the moments its own kernel wrote) merged with
/// the moments of the next (reading its gradient) made every parameter's update wait for the
/// last gradient: the transformer step's updates of biases and norms all ran after the
/// backward pass, their column sums reading gradients the caches no longer held.
fn related(f: &Func, out: &Fused, def: &[Option<usize>], i: usize, j: usize) -> bool {
    let shares_data = out.operands[i]
        .iter()
        .any(|v| f.values[v.index()].rank() > 0 && out.operands[j].contains(v));
    if shares_data {
        return true;
    }
    // The steps writing what `u` reads, and the steps writing what those read.
    let reach = |u: usize| {
        let direct = writers(f, out, def, u);
        let mut all = direct.clone();
        for &t in &direct {
            all.extend(writers(f, out, def, t));
        }
        (direct, all)
    };
    let ((wi, ri), (wj, rj)) = (reach(i), reach(j));
    wi.iter().all(|s| rj.contains(s)) || wj.iter().all(|s| ri.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::random::{Config, Rng, random_func};

    /// The pairwise form [`merge_siblings`] replaced: every earlier kernel tried for each
    /// kernel, scanning the steps between them for a reader.
    fn merge_pairwise(f: &Func, out: &mut Fused) {
        let n = f.insts.len();
        let size =
            |k: &Kernel| nodes(&k.body) + k.extra.iter().map(|e| nodes(&e.body)).sum::<usize>();
        // Each kernel's size, kept up to date as kernels merge (walking the bodies for every pair
        // made this quadratic in the bodies' size on long programs).
        let mut sizes: Vec<usize> = out
            .kernels
            .iter()
            .map(|k| k.as_ref().map_or(0, size))
            .collect();
        let def = producers(f);
        for j in 0..n {
            match &out.kernels[j] {
                Some(k) if mergeable(f, j, k) => {}
                _ => continue,
            }
            for i in (0..j).rev() {
                let Some(ki) = &out.kernels[i] else { continue };
                let kj = out.kernels[j].as_ref().expect("checked above");
                if !mergeable(f, i, ki)
                    || ki.out.shape != kj.out.shape
                    || sizes[i] + sizes[j] > MAX_MERGED_NODES
                    || !related(f, out, &def, i, j)
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
                    kj.extra.push(crate::ir::Extra {
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
                for (u, d) in out.decisions.iter_mut().enumerate() {
                    if u == i
                        || out.merged_into[u] == Some(j)
                            && matches!(d, FusionDecision::Merged { kernel, .. } if *kernel == i)
                    {
                        *d = FusionDecision::Merged {
                            kernel: j,
                            shape: ki.out.shape.clone(),
                            shared,
                        };
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

    /// `f` fused with the reference limits, its siblings merged.
    fn merged(f: &Func) -> Fused {
        let mut fused = super::super::fuse_unmerged(
            f,
            crate::pipeline::kernels(f),
            true,
            &crate::target::FusionLimits::default(),
        );
        merge_siblings(f, &mut fused);
        fused
    }

    /// A byte copy (here `bf16[1]` to `f16[1]`, two bytes, and `u8[2]` to `i8[2]`) keeps its
    /// own kernel beside a sibling over as many elements, while a 32-bit bitcast (an
    /// elementwise op) merges.
    #[test]
    fn byte_copies_keep_their_own_kernel() {
        let merges = |text: &str| {
            let f = kiln_ir::parse_func_text(text).unwrap();
            merged(&f).merged_into.iter().flatten().count()
        };
        let bytes = "func @main(%0: bf16[2], %1: bf16[1]) -> (f16[1], bf16[2]) {
  %2 = exponential %0 : bf16[2]
  %3 = bitcast_convert %1 : f16[1]
  return %3, %2
}
";
        assert_eq!(merges(bytes), 0);
        // A byte copy whose bytes are its elements (`u8` to `i8`: its kernel's type is its
        // value's) keeps its own kernel too.
        let same_width = "func @main(%0: u8[2], %1: u8[2]) -> (i8[2], u8[2]) {
  %2 = add %0, %0 : u8[2]
  %3 = bitcast_convert %1 : i8[2]
  return %3, %2
}
";
        assert_eq!(merges(same_width), 0);
        let words = "func @main(%0: f32[2], %1: f32[2]) -> (i32[2], f32[2]) {
  %2 = exponential %0 : f32[2]
  %3 = bitcast_convert %1 : i32[2]
  return %3, %2
}
";
        assert_eq!(merges(words), 1);
    }

    /// An optimizer's steps for two parameters whose gradients are column sums of products: the
    /// first parameter's update (reading the moment its own kernel wrote) and the second's
    /// moment (reading the second product) are siblings over one index space, but merged, the
    /// second would wait for the first gradient, so they stay apart (trying every sibling,
    /// the first update merged into the second moment's kernel).
    #[test]
    fn unrelated_updates_stay_apart() {
        let product = |a: usize, b: usize| {
            format!(
                "dot_general %{a}, %{b} {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[16,8]"
            )
        };
        let text = format!(
            "func @main(%0: f32[16,4], %1: f32[4,8], %2: f32[16,4], %3: f32[4,8], %4: f32[8], %5: f32[8], %6: f32[8], %7: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {{
  %8 = constant {{value = 0.0}} : f32[]
  %9 = constant {{value = 0.9}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : f32[8]
  %11 = {}
  %12 = reduce %11, %8 {{dimensions = [0], kind = add}} : f32[8]
  %13 = multiply %5, %10 : f32[8]
  %14 = add %13, %12 : f32[8]
  %15 = multiply %14, %10 : f32[8]
  %16 = subtract %4, %15 : f32[8]
  %17 = {}
  %18 = reduce %17, %8 {{dimensions = [0], kind = add}} : f32[8]
  %19 = multiply %7, %10 : f32[8]
  %20 = add %19, %18 : f32[8]
  %21 = multiply %20, %10 : f32[8]
  %22 = subtract %6, %21 : f32[8]
  return %16, %14, %22, %20
}}
",
            product(0, 1),
            product(2, 3)
        );
        let f = kiln_ir::parse_func_text(&text).unwrap();
        let fused = merged(&f);
        // Instructions 3 to 8 are the first parameter's, 9 to 14 the second's.
        let param = |i: usize| usize::from(i >= 9);
        let merges: Vec<(usize, usize)> = fused
            .merged_into
            .iter()
            .enumerate()
            .filter_map(|(i, j)| Some((i, (*j)?)))
            .collect();
        assert!(
            merges.iter().all(|&(i, j)| param(i) == param(j)),
            "{merges:?}\n{f}"
        );
    }

    /// The same multi-output kernels, decisions and all, as trying every pair, on random
    /// programs and the fusion filetests.
    #[test]
    fn merges_as_trying_every_pair_does() {
        let mut funcs: Vec<Func> = (0..400u64)
            .map(|seed| {
                let cfg = Config {
                    ops: 5 + (seed as usize % 50),
                    max_rank: 2,
                    max_dim: 3,
                    ..Config::default()
                };
                random_func(&mut Rng::new(seed), &cfg)
            })
            .collect();
        for dir in ["fused", "plan"] {
            let dir = format!("{}/../../tests/filetests/{dir}", env!("CARGO_MANIFEST_DIR"));
            for e in std::fs::read_dir(dir).unwrap() {
                let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
                funcs.push(kiln_ir::parse_func_text(&text).unwrap());
            }
        }
        let mut merges = 0;
        for f in &funcs {
            let before = super::super::fuse_unmerged(
                f,
                crate::pipeline::kernels(f),
                true,
                &crate::target::FusionLimits::default(),
            );
            let (mut ours, mut theirs) = (before.clone(), before);
            merge_siblings(f, &mut ours);
            merge_pairwise(f, &mut theirs);
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{f}");
            merges += ours.merged_into.iter().flatten().count();
        }
        assert!(merges > 100, "only {merges} merges");
    }
}
