//! Scheduling for memory: the order in which a fused program's steps run.
//!
//! Tracing, autodiff and extraction leave instructions in an order that is correct but not
//! chosen for memory: a forward pass's activations all come before the backward pass, two
//! independent branches may interleave so that both of their intermediates are live at once,
//! and a parameter's update may run before a later reader of the parameter (which then keeps
//! the update from writing into the donated buffer).
//!
//! The steps of a fused program (kernels, and the instructions that run without one) may run
//! in any order that writes each buffer before its readers. [`step_order`] picks one greedily,
//! like a list scheduler: of the steps whose inputs are ready, it runs the one that allocates
//! the fewest arena bytes net of the bytes it frees (the last reads of intermediates), the
//! earliest in program order on ties. A step that could update a donated parameter in place
//! (see [`crate::fuse::can_update`]) waits, while any other step is ready, until the
//! parameter's other readers have run, so that it is the last reader.
//!
//! [`reorder`] rebuilds the function in that order: each instruction computed inside other
//! kernels just before its first reader, each one merged into a multi-output kernel just
//! before that kernel. The caller fuses the result again and keeps it only when its memory
//! plan peaks lower (a greedy order is not always better than the program's own).

use crate::fuse::{Fused, can_update, step_reads};
use kiln_ir::{Func, Inst, ValueId};

/// Whether instruction `u` is a step of the fused program (it runs, rather than being computed
/// inside another instruction's kernel).
fn is_step(fused: &Fused, u: usize) -> bool {
    !fused.inlined[u] && fused.merged_into[u].is_none()
}

/// The values step `u` writes: its results, then what merged into its kernel.
fn step_writes(f: &Func, fused: &Fused, u: usize) -> Vec<ValueId> {
    f.insts[u]
        .results
        .iter()
        .chain(&fused.extra[u])
        .copied()
        .collect()
}

/// The steps of `fused` (instruction indices) in the order that keeps the fewest arena bytes
/// live, with the parameters `p` with `donated[p]` updated by their last readers where a
/// kernel can (see the module documentation). Deterministic.
pub fn step_order(f: &Func, fused: &Fused, donated: &[bool]) -> Vec<usize> {
    let n = f.insts.len();
    let nv = f.values.len();
    let steps: Vec<usize> = (0..n).filter(|&u| is_step(fused, u)).collect();
    // The step writing each value.
    let mut writer: Vec<Option<usize>> = vec![None; nv];
    for &u in &steps {
        for v in step_writes(f, fused, u) {
            writer[v.index()] = Some(u);
        }
    }
    let reads: Vec<Vec<ValueId>> = (0..n)
        .map(|u| {
            let mut r = if is_step(fused, u) {
                step_reads(f, fused, u).to_vec()
            } else {
                Vec::new()
            };
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    // Readers not yet run, per value; and whether every reader is a kernel.
    let mut readers_left = vec![0usize; nv];
    let mut kernel_only = vec![true; nv];
    for &u in &steps {
        for v in &reads[u] {
            readers_left[v.index()] += 1;
            if fused.kernels[u].is_none() {
                kernel_only[v.index()] = false;
            }
        }
    }
    // Arena bytes of each value: intermediates that kernels write and only kernels read.
    let outputs: Vec<bool> = (0..nv)
        .map(|v| f.outputs.contains(&ValueId(v as u32)))
        .collect();
    let bytes: Vec<i64> = (0..nv)
        .map(|v| {
            let in_arena = !outputs[v]
                && kernel_only[v]
                && writer[v].is_some_and(|w| fused.kernels[w].is_some());
            let t = &f.values[v];
            if in_arena {
                (t.numel() * t.dtype.bytes()) as i64
            } else {
                0
            }
        })
        .collect();
    // Steps that could update a donated parameter in place, with the parameter.
    let updates: Vec<Vec<ValueId>> = (0..n)
        .map(|u| {
            f.params
                .iter()
                .zip(donated)
                .filter(|&(&p, &d)| {
                    d && !outputs[p.index()]
                        && is_step(fused, u)
                        && reads[u].contains(&p)
                        && can_update(f, fused, u, p).is_some()
                })
                .map(|(&p, _)| p)
                .collect()
        })
        .collect();
    // Unfinished dependencies per step.
    let mut deps_left = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &u in &steps {
        let mut ws: Vec<usize> = reads[u]
            .iter()
            .filter_map(|v| writer[v.index()])
            .filter(|&w| w != u)
            .collect();
        ws.sort_unstable();
        ws.dedup();
        deps_left[u] = ws.len();
        for w in ws {
            dependents[w].push(u);
        }
    }
    let mut ready: Vec<usize> = steps
        .iter()
        .copied()
        .filter(|&u| deps_left[u] == 0)
        .collect();
    let mut order = Vec::with_capacity(steps.len());
    while !ready.is_empty() {
        let waits = |u: usize| updates[u].iter().any(|p| readers_left[p.index()] > 1);
        let net = |u: usize| {
            let allocated: i64 = step_writes(f, fused, u)
                .iter()
                .map(|v| bytes[v.index()])
                .sum();
            let freed: i64 = reads[u]
                .iter()
                .filter(|v| readers_left[v.index()] == 1)
                .map(|v| bytes[v.index()])
                .sum();
            allocated - freed
        };
        let (k, &u) = ready
            .iter()
            .enumerate()
            .min_by_key(|&(_, &u)| (waits(u), net(u), u))
            .expect("not empty");
        ready.swap_remove(k);
        order.push(u);
        for v in &reads[u] {
            readers_left[v.index()] -= 1;
        }
        for &d in &dependents[u] {
            deps_left[d] -= 1;
            if deps_left[d] == 0 {
                ready.push(d);
            }
        }
    }
    debug_assert_eq!(order.len(), steps.len(), "the fused steps form a DAG");
    order
}

/// `f` with its instructions in the order of the steps `order` (from [`step_order`]): each
/// instruction that is not a step placed, after its own operands, just before the first
/// instruction needing it, and each one merged into a kernel just before that kernel. Values
/// are renumbered in the new definition order.
pub fn reorder(f: &Func, fused: &Fused, order: &[usize]) -> Func {
    permute(f, &placement(f, fused, order))
}

/// The instructions of `f` (their indices) in the order [`reorder`] puts them for `order`.
pub fn placement(f: &Func, fused: &Fused, order: &[usize]) -> Vec<usize> {
    let n = f.insts.len();
    let mut producer: Vec<Option<usize>> = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    let mut merged: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, m) in fused.merged_into.iter().enumerate() {
        if let Some(j) = m {
            merged[*j].push(i);
        }
    }
    let mut placed = vec![false; n];
    let mut insts: Vec<usize> = Vec::with_capacity(n);
    // Places `root` after everything it needs (an explicit stack: chains can be long).
    let place = |root: usize, placed: &mut Vec<bool>, insts: &mut Vec<usize>| {
        let mut stack = vec![(root, false)];
        while let Some((i, operands_done)) = stack.pop() {
            if placed[i] {
                continue;
            }
            if operands_done {
                placed[i] = true;
                insts.push(i);
                continue;
            }
            stack.push((i, true));
            for o in f.insts[i].operands.iter().rev() {
                if let Some(p) = producer[o.index()].filter(|&p| !placed[p]) {
                    stack.push((p, false));
                }
            }
        }
    };
    for &u in order {
        for &i in &merged[u] {
            place(i, &mut placed, &mut insts);
        }
        place(u, &mut placed, &mut insts);
    }
    for i in 0..n {
        place(i, &mut placed, &mut insts);
    }
    insts
}

/// `f` with the instructions `placement` (indices into `f`, each once, operands first), values
/// renumbered in definition order.
pub fn permute(f: &Func, placement: &[usize]) -> Func {
    let value = renumbering(f, placement);
    let map = |vs: &[ValueId]| vs.iter().map(|v| value[v.index()]).collect::<Vec<_>>();
    let mut values = f.values.clone();
    for (old, new) in value.iter().enumerate() {
        values[new.index()] = f.values[old].clone();
    }
    let g = Func {
        name: f.name.clone(),
        params: map(&f.params),
        insts: placement
            .iter()
            .map(|&i| {
                let inst = &f.insts[i];
                Inst {
                    op: inst.op.clone(),
                    operands: map(&inst.operands),
                    results: map(&inst.results),
                    loc: inst.loc,
                }
            })
            .collect(),
        outputs: map(&f.outputs),
        output_types: f.output_types.clone(),
        values,
    };
    debug_assert!(kiln_ir::verify(&g).is_ok(), "{g}");
    g
}

/// Each value's number in `f` with the instructions `placement`: parameters first, then each
/// instruction's results in the new order.
fn renumbering(f: &Func, placement: &[usize]) -> Vec<ValueId> {
    let mut value = vec![ValueId(0); f.values.len()];
    for (k, p) in f.params.iter().enumerate() {
        value[p.index()] = ValueId(k as u32);
    }
    let mut next = f.params.len() as u32;
    for &i in placement {
        for r in &f.insts[i].results {
            value[r.index()] = ValueId(next);
            next += 1;
        }
    }
    value
}

/// `fused` carried over to [`reorder`]'s function, whose instructions are `placement` (from
/// [`placement`]): the same kernels reading and writing the same values under their new numbers
/// (what fusing the reordered function gives, when fusion makes the same choices there).
pub fn carried(f: &Func, fused: &Fused, placement: &[usize]) -> Fused {
    let mut at = vec![0; placement.len()];
    for (k, &i) in placement.iter().enumerate() {
        at[i] = k;
    }
    let value = renumbering(f, placement);
    let values = |vs: &Vec<ValueId>| vs.iter().map(|v| value[v.index()]).collect::<Vec<_>>();
    Fused {
        kernels: placement
            .iter()
            .map(|&i| fused.kernels[i].clone())
            .collect(),
        operands: placement
            .iter()
            .map(|&i| values(&fused.operands[i]))
            .collect(),
        inlined: placement.iter().map(|&i| fused.inlined[i]).collect(),
        members: placement
            .iter()
            .map(|&i| {
                let mut m: Vec<usize> = fused.members[i].iter().map(|&u| at[u]).collect();
                m.sort_unstable();
                m
            })
            .collect(),
        decisions: placement
            .iter()
            .map(|&i| fused.decisions[i].clone())
            .collect(),
        merged_into: placement
            .iter()
            .map(|&i| fused.merged_into[i].map(|j| at[j]))
            .collect(),
        extra: placement.iter().map(|&i| values(&fused.extra[i])).collect(),
        no_kernel: placement.iter().map(|&i| fused.no_kernel[i]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::fused_kernels;

    fn parse(src: &str) -> Func {
        kiln_ir::parse_func_text(src).unwrap()
    }

    const BRANCHES: &str = "func @b(%0: f32[64,32], %1: f32[32,64], %2: f32[32,48], %3: f32[32,80]) -> (f32[64], f32[48], f32[80]) {
  %4 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]
  %5 = dot_general %0, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,48]
  %6 = dot_general %0, %3 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,80]
  %7 = constant {value = 0.0} : f32[]
  %8 = reduce %4, %7 {dimensions = [0], kind = add} : f32[64]
  %9 = reduce %5, %7 {dimensions = [0], kind = add} : f32[48]
  %10 = reduce %6, %7 {dimensions = [0], kind = add} : f32[80]
  return %8, %9, %10
}
";

    #[test]
    fn each_reduction_runs_right_after_its_product() {
        let f = parse(BRANCHES);
        let fused = fused_kernels(
            &f,
            &crate::Options::default(),
            &crate::TargetInfo::reference(),
        );
        let order = step_order(&f, &fused, &[]);
        // Products are instructions 0-2, the constant 3, the reductions 4-6; the constant and
        // the smallest branch (48 columns) come first.
        assert_eq!(order, [3, 1, 5, 0, 4, 2, 6]);
        let g = reorder(&f, &fused, &order);
        kiln_ir::verify(&g).unwrap();
        let ops: Vec<&str> = g.insts.iter().map(|i| i.op.mnemonic()).collect();
        assert_eq!(
            ops,
            [
                "constant",
                "dot_general",
                "reduce",
                "dot_general",
                "reduce",
                "dot_general",
                "reduce"
            ]
        );
        // Outputs keep their order and types.
        assert_eq!(g.output_types, f.output_types);
        assert_eq!(g.param_types(), f.param_types());
    }

    /// The kernels carried over to the reordered program are those fusing it again gives (the
    /// kernels, what they read and write, what is inlined and merged), on programs whose steps
    /// move.
    #[test]
    fn carried_kernels_are_those_of_fusing_again() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/filetests/plan");
        let mut moved = 0;
        let mut srcs = vec![BRANCHES.to_string()];
        for e in std::fs::read_dir(dir).unwrap() {
            srcs.push(std::fs::read_to_string(e.unwrap().path()).unwrap());
        }
        for src in &srcs {
            let f = parse(src);
            let fused = fused_kernels(
                &f,
                &crate::Options::default(),
                &crate::TargetInfo::reference(),
            );
            let order = step_order(&f, &fused, &[]);
            let placed = placement(&f, &fused, &order);
            if placed.windows(2).all(|w| w[0] < w[1]) {
                continue;
            }
            moved += 1;
            let g = permute(&f, &placed);
            let (a, b) = (
                carried(&f, &fused, &placed),
                fused_kernels(
                    &g,
                    &crate::Options::default(),
                    &crate::TargetInfo::reference(),
                ),
            );
            assert_eq!(
                format!("{:?}", a.kernels),
                format!("{:?}", b.kernels),
                "{f}"
            );
            assert_eq!(a.operands, b.operands, "{f}");
            assert_eq!(a.inlined, b.inlined, "{f}");
            assert_eq!(a.merged_into, b.merged_into, "{f}");
            assert_eq!(a.extra, b.extra, "{f}");
            assert_eq!(a.members, b.members, "{f}");
        }
        assert!(moved >= 3, "{moved} programs reordered");
    }

    #[test]
    fn an_in_place_update_waits_for_the_parameters_other_readers() {
        let f = parse(
            "func @u(%0: f32[64], %1: f32[64]) -> (f32[64], f32[]) {
  %2 = subtract %0, %1 : f32[64]
  %3 = constant {value = 0.0} : f32[]
  %4 = reduce %0, %3 {dimensions = [0], kind = add} : f32[]
  return %2, %4
}
",
        );
        let fused = fused_kernels(
            &f,
            &crate::Options::default(),
            &crate::TargetInfo::reference(),
        );
        assert_eq!(step_order(&f, &fused, &[false, false]), [0, 1, 2]);
        assert_eq!(step_order(&f, &fused, &[false, true]), [0, 1, 2]);
        assert_eq!(step_order(&f, &fused, &[true, false]), [1, 2, 0]);
    }

    #[test]
    fn instructions_computed_inside_kernels_stay_before_their_readers() {
        // %6 (a negation) is inlined into both reductions' kernels; the first reduction moves up
        // between the products, and the negation with it.
        let f = parse(
            "func @i(%0: f32[32,32], %1: f32[32,32], %2: f32[32,16], %3: f32[32]) -> (f32[32], f32[16]) {
  %4 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[32,32]
  %5 = dot_general %0, %2 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[32,16]
  %6 = negate %3 : f32[32]
  %7 = broadcast_in_dim %6 {broadcast_dimensions = [0]} : f32[32,32]
  %8 = multiply %4, %7 : f32[32,32]
  %9 = constant {value = 0.0} : f32[]
  %10 = reduce %8, %9 {dimensions = [1], kind = add} : f32[32]
  %11 = broadcast_in_dim %6 {broadcast_dimensions = [0]} : f32[32,16]
  %12 = multiply %5, %11 : f32[32,16]
  %13 = reduce %12, %9 {dimensions = [0], kind = add} : f32[16]
  return %10, %13
}
",
        );
        let fused = fused_kernels(
            &f,
            &crate::Options::default(),
            &crate::TargetInfo::reference(),
        );
        assert!(
            fused.inlined[2],
            "the negation is computed inside its users"
        );
        let order = step_order(&f, &fused, &[]);
        let g = reorder(&f, &fused, &order);
        kiln_ir::verify(&g).unwrap();
        let ops: Vec<&str> = g.insts.iter().map(|i| i.op.mnemonic()).collect();
        let first_reduce = ops.iter().position(|&o| o == "reduce").unwrap();
        let second_dot = ops.iter().rposition(|&o| o == "dot_general").unwrap();
        assert!(first_reduce < second_dot, "{g}");
        let neg = ops.iter().position(|&o| o == "negate").unwrap();
        assert!(neg < first_reduce, "{g}");
    }
}
