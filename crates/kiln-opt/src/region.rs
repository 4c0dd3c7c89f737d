//! Regions: a long program is optimized in pieces of bounded size, so that the optimizer's work
//! grows linearly with the program.
//!
//! Saturating a whole program costs more than linear time: every round searches every class for
//! every rule, egg's scheduler bans a rule for some rounds once it matches more than a fixed
//! number of times (so a large e-graph needs more rounds to saturate), and each improvement try
//! of the DAG extraction walks the whole program. And with one node limit for every program, a
//! long one stopped at the limit after its first round, hardly optimized at all.
//!
//! [`split`] cuts a program of more than `Options::region_insts` instructions into that many or
//! fewer consecutive instructions at a time (program order: a traced program's steps and their
//! gradients each stay together), and makes each run a function of its own: its parameters are
//! the values it uses from earlier runs, its results the values later runs or the program's
//! return use. Constants the e-graph would fold (at most [`FOLD_LIMIT`] elements, and layout ops
//! of them such as broadcast splats) are not passed in but copied into each region that uses
//! them, so constant folding and the rules' splat conditions see them as before. Each region is
//! then saturated and extracted alone, under limits in proportion to its size, and [`stitch`]
//! joins the optimized regions into one program, merging instructions that compute the same
//! thing twice (what one e-graph's hash-consing did across the borders) and dropping values no
//! longer used. Every step is linear in the program (hash maps, no per-region pass over the
//! whole program).

use crate::analysis::FOLD_LIMIT;
use crate::cost::{Machine, NODE, op_cost};
use crate::lang::{is_tuple, meta_key};
use kiln_ir::{Func, Inst, Op, OpKind, Props, TensorType, ValueId};
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Range;

/// The most instructions a constant's copied computation may have.
const COPY_MAX: usize = 16;

/// A run of the input program's instructions as a function of its own.
#[derive(Clone, Debug)]
pub struct Region {
    /// The run as a function (its copied constants first).
    pub func: Func,
    /// The input program's value each parameter of `func` stands for.
    pub inputs: Vec<ValueId>,
    /// The input program's value each result of `func` is.
    pub exports: Vec<ValueId>,
    /// The input program's instructions the run holds.
    pub range: Range<usize>,
}

/// The instruction ranges of the regions of a program of `n` instructions cut into runs of at
/// most `max` (as even as they can be; one run when `n <= max`).
pub fn bounds(n: usize, max: usize) -> Vec<Range<usize>> {
    let count = n.div_ceil(max.max(1)).max(1);
    (0..count)
        .map(|k| k * n / count..(k + 1) * n / count)
        .collect()
}

/// Which values of `f` are constants a region copies instead of taking as a parameter: what
/// the e-graph's analysis knows the value of (constants of at most [`FOLD_LIMIT`] elements,
/// ops on them with results that small, and layout ops of them of any size), computed by at
/// most [`COPY_MAX`] instructions.
fn copyable(f: &Func) -> Vec<bool> {
    let mut size: Vec<Option<usize>> = vec![None; f.values.len()];
    for inst in &f.insts {
        let [r] = inst.results[..] else {
            continue;
        };
        let kind = inst.op.kind();
        if kind.props().contains(Props::BARRIER) {
            continue;
        }
        let small = f.values[r.index()].numel() <= FOLD_LIMIT;
        let s = match &inst.op {
            Op::Constant { value } => (value.ty().numel() <= FOLD_LIMIT).then_some(1),
            _ if small || kind.props().contains(Props::LAYOUT) && inst.operands.len() == 1 => inst
                .operands
                .iter()
                .try_fold(1usize, |acc, o| size[o.index()].map(|s| acc + s)),
            _ => None,
        };
        size[r.index()] = s.filter(|&s| s <= COPY_MAX);
    }
    size.iter().map(Option::is_some).collect()
}

/// `f` cut into regions of at most `max` instructions (see the module documentation).
pub fn split(f: &Func, max: usize) -> Vec<Region> {
    let ranges = bounds(f.insts.len(), max);
    // The region and instruction defining each value (parameters: none).
    let mut def: Vec<Option<(usize, usize)>> = vec![None; f.values.len()];
    for (k, range) in ranges.iter().enumerate() {
        for i in range.clone() {
            for r in &f.insts[i].results {
                def[r.index()] = Some((k, i));
            }
        }
    }
    let copy = copyable(f);
    // The values a region must return: used by a later region (and not copied there), or
    // returned by the program.
    let mut export = vec![false; f.values.len()];
    for (k, range) in ranges.iter().enumerate() {
        for inst in &f.insts[range.clone()] {
            for o in &inst.operands {
                if def[o.index()].is_some_and(|(d, _)| d != k) && !copy[o.index()] {
                    export[o.index()] = true;
                }
            }
        }
    }
    for o in &f.outputs {
        export[o.index()] = true;
    }
    // One map from the program's values to a region's, written anew by each region for the
    // values it reads.
    let mut map: Vec<ValueId> = vec![ValueId(u32::MAX); f.values.len()];
    ranges
        .into_iter()
        .enumerate()
        .map(|(k, range)| region(f, &def, &copy, &export, &mut map, k, range))
        .collect()
}

/// Region `k`, the instructions `range` of `f`, as a function.
fn region(
    f: &Func,
    def: &[Option<(usize, usize)>],
    copy: &[bool],
    export: &[bool],
    map: &mut [ValueId],
    k: usize,
    range: Range<usize>,
) -> Region {
    // Parameters in the order of first use, and the instructions of copied constants.
    let mut inputs: Vec<ValueId> = Vec::new();
    let mut is_input: HashSet<ValueId> = HashSet::new();
    let mut copied: BTreeSet<usize> = BTreeSet::new();
    for inst in &f.insts[range.clone()] {
        for &o in &inst.operands {
            match def[o.index()] {
                Some((d, _)) if d == k => {}
                Some((_, j)) if copy[o.index()] => {
                    let mut stack = vec![j];
                    while let Some(j) = stack.pop() {
                        if copied.insert(j) {
                            stack.extend(
                                f.insts[j]
                                    .operands
                                    .iter()
                                    .map(|x| def[x.index()].expect("a constant's operand").1),
                            );
                        }
                    }
                }
                _ => {
                    if is_input.insert(o) {
                        inputs.push(o);
                    }
                }
            }
        }
    }
    let mut values: Vec<TensorType> = Vec::new();
    let new_value = |v: ValueId, values: &mut Vec<TensorType>| {
        let id = ValueId(values.len() as u32);
        values.push(f.values[v.index()].clone());
        id
    };
    let mut params = Vec::with_capacity(inputs.len());
    for &v in &inputs {
        let p = new_value(v, &mut values);
        map[v.index()] = p;
        params.push(p);
    }
    let mut insts = Vec::with_capacity(copied.len() + range.len());
    for i in copied.into_iter().chain(range.clone()) {
        let inst = &f.insts[i];
        let operands = inst.operands.iter().map(|o| map[o.index()]).collect();
        let results = inst
            .results
            .iter()
            .map(|&r| {
                let id = new_value(r, &mut values);
                map[r.index()] = id;
                id
            })
            .collect();
        insts.push(Inst {
            op: inst.op.clone(),
            operands,
            results,
            loc: inst.loc,
        });
    }
    let exports: Vec<ValueId> = f.insts[range.clone()]
        .iter()
        .flat_map(|i| i.results.iter().copied())
        .filter(|r| export[r.index()])
        .collect();
    let outputs: Vec<ValueId> = exports.iter().map(|v| map[v.index()]).collect();
    let output_types = exports
        .iter()
        .map(|v| f.values[v.index()].clone())
        .collect();
    Region {
        func: Func {
            name: f.name.clone(),
            params,
            insts,
            outputs,
            output_types,
            values,
        },
        inputs,
        exports,
        range,
    }
}

/// The program `f` computes, from its regions and their optimized functions (`optimized[k]`
/// takes and returns what `regions[k].func` does): instructions that compute the same thing
/// from the same operands merged, values nothing uses dropped, values numbered in order.
pub fn stitch(f: &Func, regions: &[Region], optimized: &[Func]) -> Func {
    join(
        f,
        regions
            .iter()
            .zip(optimized)
            .map(|(r, g)| (&r.inputs[..], &r.exports[..], g)),
    )
}

/// `f` with instructions that compute the same thing from the same operands merged (the same
/// op, attributes and result types; a constant's bytes), and values nothing uses dropped: the
/// program an e-graph of `f` holds before any rule runs.
pub fn dedup(f: &Func) -> Func {
    join(f, std::iter::once((&f.params[..], &f.outputs[..], f)))
}

/// The estimated cost of running `f` (nanoseconds, [`crate::cost`]): each instruction of
/// [`dedup`]`(f)` once, as the e-graph counts a program without alternatives.
pub fn program_cost(f: &Func, machine: Machine) -> f64 {
    deduped_cost(&dedup(f), machine)
}

/// [`program_cost`] of a program already deduplicated (as [`stitch`] returns them).
pub fn deduped_cost(g: &Func, machine: Machine) -> f64 {
    let used = g.used_values();
    let mut total = 0.0;
    for inst in &g.insts {
        let kind = inst.op.kind();
        let types: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| g.values[r.index()].clone())
            .collect();
        let operand = |i: usize| inst.operands.get(i).map(|o| g.values[o.index()].clone());
        total += NODE + op_cost(&machine, &inst.op, kind, &types, operand);
        if is_tuple(kind) {
            // The e-graph's `get` nodes of the results in use.
            total += NODE * inst.results.iter().filter(|r| used[r.index()]).count() as f64;
        }
    }
    total
}

/// Instructions seen, by a hash of their op kind and operands (and meta key, for ops without
/// operands): the one instruction or several with that hash.
enum Seen {
    One(usize),
    Many(Vec<usize>),
}

/// The hash [`Seen`] files an instruction under.
fn seen_hash(kind: OpKind, operands: &[ValueId], key: Option<&[u8]>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kind.hash(&mut h);
    operands.hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

/// Joins functions into one program with `f`'s parameters and results: each part reads the
/// program's values `inputs` as its parameters and defines the values `exports` as its results
/// (parts in order; every input a parameter of `f` or an earlier part's export).
fn join<'a>(
    f: &Func,
    parts: impl Iterator<Item = (&'a [ValueId], &'a [ValueId], &'a Func)>,
) -> Func {
    // The joined program before dropping what is unused: values numbered as made.
    let mut values: Vec<TensorType> = f.param_types();
    let mut insts: Vec<Inst> = Vec::new();
    // Per instruction: its meta key, once computed.
    let mut keys: Vec<Option<Vec<u8>>> = Vec::new();
    let mut global: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for (i, &p) in f.params.iter().enumerate() {
        global[p.index()] = Some(ValueId(i as u32));
    }
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let meta_of = |inst: &Inst, values: &[TensorType]| {
        let types: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| values[r.index()].clone())
            .collect();
        meta_key(&inst.op, &types)
    };
    for (inputs, exports, g) in parts {
        let mut local: Vec<ValueId> = vec![ValueId(u32::MAX); g.values.len()];
        for (&p, v) in g.params.iter().zip(inputs) {
            local[p.index()] = global[v.index()].expect("an input is defined earlier");
        }
        for inst in &g.insts {
            let operands: Vec<ValueId> = inst.operands.iter().map(|o| local[o.index()]).collect();
            let kind = inst.op.kind();
            // Large constants are not compared (their keys are their bytes).
            let compare =
                !matches!(&inst.op, Op::Constant { value } if value.ty().numel() > FOLD_LIMIT);
            let mut key: Option<Vec<u8>> = None;
            let mut found = None;
            let mut hash = 0;
            if compare {
                if operands.is_empty() {
                    key = Some(meta_of(inst, &g.values));
                }
                hash = seen_hash(kind, &operands, key.as_deref());
                let candidates: &[usize] = match seen.get(&hash) {
                    None => &[],
                    Some(Seen::One(j)) => std::slice::from_ref(j),
                    Some(Seen::Many(js)) => js,
                };
                for &j in candidates {
                    if insts[j].op.kind() != kind || insts[j].operands != operands {
                        continue;
                    }
                    let mine = key.get_or_insert_with(|| meta_of(inst, &g.values));
                    let theirs = keys[j].get_or_insert_with(|| meta_of(&insts[j], &values));
                    if mine == theirs {
                        found = Some(j);
                        break;
                    }
                }
            }
            let j = match found {
                Some(j) => j,
                None => {
                    let n = insts.len();
                    if compare {
                        match seen.entry(hash) {
                            Entry::Vacant(e) => {
                                e.insert(Seen::One(n));
                            }
                            Entry::Occupied(mut e) => {
                                let slot = e.get_mut();
                                match slot {
                                    Seen::One(j) => *slot = Seen::Many(vec![*j, n]),
                                    Seen::Many(js) => js.push(n),
                                }
                            }
                        }
                    }
                    let results = inst
                        .results
                        .iter()
                        .map(|r| {
                            values.push(g.values[r.index()].clone());
                            ValueId(values.len() as u32 - 1)
                        })
                        .collect();
                    insts.push(Inst {
                        op: inst.op.clone(),
                        operands,
                        results,
                        loc: inst.loc,
                    });
                    keys.push(key);
                    n
                }
            };
            for (a, &b) in inst.results.iter().zip(&insts[j].results) {
                local[a.index()] = b;
            }
        }
        for (o, v) in g.outputs.iter().zip(exports) {
            global[v.index()] = Some(local[o.index()]);
        }
    }
    let outputs: Vec<ValueId> = f
        .outputs
        .iter()
        .map(|o| global[o.index()].expect("an output is defined"))
        .collect();
    // Drop what the outputs do not use; number the rest in order.
    let mut live = vec![false; values.len()];
    for o in &outputs {
        live[o.index()] = true;
    }
    let mut keep = vec![false; insts.len()];
    for (i, inst) in insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| live[r.index()]) {
            keep[i] = true;
            for o in &inst.operands {
                live[o.index()] = true;
            }
        }
    }
    let mut num: Vec<Option<ValueId>> = vec![None; values.len()];
    let mut types: Vec<TensorType> = Vec::new();
    let number = |v: ValueId, types: &mut Vec<TensorType>, num: &mut Vec<Option<ValueId>>| {
        let id = ValueId(types.len() as u32);
        types.push(values[v.index()].clone());
        num[v.index()] = Some(id);
        id
    };
    let params: Vec<ValueId> = (0..f.params.len())
        .map(|i| number(ValueId(i as u32), &mut types, &mut num))
        .collect();
    let mut kept = Vec::new();
    for (inst, keep) in insts.into_iter().zip(keep) {
        if !keep {
            continue;
        }
        let operands = inst
            .operands
            .iter()
            .map(|o| num[o.index()].expect("defined before use"))
            .collect();
        let results = inst
            .results
            .iter()
            .map(|&r| number(r, &mut types, &mut num))
            .collect();
        kept.push(Inst {
            op: inst.op,
            operands,
            results,
            loc: inst.loc,
        });
    }
    let outputs = outputs
        .iter()
        .map(|o| num[o.index()].expect("an output is defined"))
        .collect();
    Func {
        name: f.name.clone(),
        params,
        insts: kept,
        outputs,
        output_types: f.output_types.clone(),
        values: types,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Options, optimize};
    use kiln_ir::parse_func_text;
    use std::fmt::Write as _;

    /// A chain of `n` steps on `f32[64]`, ten instructions each:
    /// `x = (1 - tanh(sin(x) * 0.9)^2) * x`.
    fn chain(n: usize) -> Func {
        let mut s = String::from("func @chain(%0: f32[64]) -> f32[64] {\n");
        let mut x = 0;
        for i in 0..n {
            let v = |k: usize| 10 * i + k;
            let _ = write!(
                s,
                "  %{} = sine %{x} : f32[64]\n  %{} = constant {{value = 0.9}} : f32[]\n  %{} = broadcast_in_dim %{} {{broadcast_dimensions = []}} : f32[64]\n  %{} = multiply %{}, %{} : f32[64]\n  %{} = tanh %{} : f32[64]\n  %{} = multiply %{}, %{} : f32[64]\n  %{} = constant {{value = 1.0}} : f32[]\n  %{} = broadcast_in_dim %{} {{broadcast_dimensions = []}} : f32[64]\n  %{} = subtract %{}, %{} : f32[64]\n  %{} = multiply %{}, %{x} : f32[64]\n",
                v(1),
                v(2),
                v(3),
                v(2),
                v(4),
                v(1),
                v(3),
                v(5),
                v(4),
                v(6),
                v(5),
                v(5),
                v(7),
                v(8),
                v(7),
                v(9),
                v(8),
                v(6),
                v(10),
                v(9),
            );
            x = v(10);
        }
        let _ = writeln!(s, "  return %{x}\n}}");
        parse_func_text(&s).unwrap()
    }

    fn options(region_insts: usize) -> Options {
        Options {
            machine: crate::cost::Machine::REFERENCE,
            region_insts,
            ..Options::default()
        }
    }

    /// A program four times as long costs the optimizer at most about four times the work
    /// (e-graph nodes, rounds times nodes, extraction's visits: counts, not times), and in
    /// regions it optimizes as well as in one piece.
    #[test]
    fn work_grows_linearly_with_the_program() {
        let opts = options(250);
        let (short, a) = optimize(&chain(100), &opts).unwrap();
        let (long, b) = optimize(&chain(400), &opts).unwrap();
        assert_eq!((a.regions, b.regions), (4, 16));
        for (what, x, y) in [("work", a.work, b.work), ("nodes", a.nodes, b.nodes)] {
            let ratio = y as f64 / x as f64;
            assert!(ratio <= 4.5, "{what}: {y} / {x} = {ratio:.2}\n{a}\n{b}");
        }
        // Not bounded by giving up: every region saturated, every rule application made.
        assert_eq!(b.stop, "saturated x16", "{b}");
        let times4: Vec<(String, usize)> =
            a.applied.iter().map(|(r, n)| (r.clone(), 4 * n)).collect();
        assert_eq!(b.applied, times4);
        assert!(b.iterations <= a.iterations + 1, "{a}\n{b}");
        // Six instructions a step and the four constants, shared by all regions.
        assert_eq!(short.insts.len(), 6 * 100 + 4);
        assert_eq!(long.insts.len(), 6 * 400 + 4);
        // As good as optimized whole (the same instructions, up to the operand order of
        // products), the constants shared.
        let (whole, w) = optimize(&chain(100), &options(1000)).unwrap();
        assert_eq!(w.regions, 1);
        assert_eq!(short.insts.len(), whole.insts.len());
        // Forms of equal cost keep the program's own: every step multiplies by the constant
        // on the right, as written, so equal steps stay equal.
        for g in [&short, &long, &whole] {
            let splat = g
                .insts
                .iter()
                .find(|i| {
                    matches!(i.op, Op::BroadcastInDim { .. })
                        && g.insts.iter().any(|c| {
                            c.results[0] == i.operands[0]
                                && matches!(&c.op, Op::Constant { value } if value.to_f64s() == [0.9f32 as f64])
                        })
                })
                .unwrap()
                .results[0];
            for i in &g.insts {
                if i.operands.contains(&splat) {
                    assert_eq!(i.operands[1], splat, "{}", kiln_ir::print::inst_head(i));
                }
            }
        }
        assert!((a.cost_after - w.cost_after).abs() <= 1e-9 * w.cost_after);
        assert!((a.cost_before - w.cost_before).abs() <= 1e-9 * w.cost_before);
        assert_eq!(a.applied, w.applied);
    }

    /// Each region's node limit is in proportion to its size: the whole limit for a full
    /// region, at least a quarter of it.
    #[test]
    fn limits_scale_with_the_region() {
        let o = Options::default();
        assert_eq!(o.node_limit_for(o.region_insts), o.node_limit);
        assert_eq!(o.node_limit_for(o.region_insts / 2), o.node_limit / 2);
        assert_eq!(o.node_limit_for(1), o.node_limit / 4);
        assert_eq!(o.node_limit_for(10 * o.region_insts), o.node_limit);
    }

    #[test]
    fn bounds_are_even_and_cover_the_program() {
        assert_eq!(bounds(10, 20), vec![0..10]);
        assert_eq!(bounds(0, 20), vec![0..0]);
        assert_eq!(bounds(10, 4), vec![0..3, 3..6, 6..10]);
        assert_eq!(bounds(8, 4), vec![0..4, 4..8]);
    }

    /// Regions take what earlier ones compute as parameters, copy constants, and stitched back
    /// unchanged they give the program (its duplicate constants merged, in order).
    #[test]
    fn split_and_stitch_round_trip() {
        let f = parse_func_text(
            "func @main(%0: f32[4]) -> f32[4] {\n  %1 = constant {value = 2.0} : f32[]\n  %2 = broadcast_in_dim %1 {broadcast_dimensions = []} : f32[4]\n  %3 = multiply %0, %2 : f32[4]\n  %4 = sine %3 : f32[4]\n  %5 = multiply %4, %2 : f32[4]\n  %6 = add %5, %3 : f32[4]\n  return %6\n}\n",
        )
        .unwrap();
        let regions = split(&f, 2);
        assert_eq!(regions.len(), 3);
        // The second region copies the splat, takes the parameter, and returns %3 (used by the
        // third) and %4.
        let r = &regions[1];
        assert_eq!(r.range, 2..4);
        assert_eq!(r.inputs, vec![ValueId(0)]);
        assert_eq!(r.exports, vec![ValueId(3), ValueId(4)]);
        assert_eq!(
            r.func.to_string(),
            "func @main(%0: f32[4]) -> (f32[4], f32[4]) {\n  %1 = constant {value = 2.0} : f32[]\n  %2 = broadcast_in_dim %1 {broadcast_dimensions = []} : f32[4]\n  %3 = multiply %0, %2 : f32[4]\n  %4 = sine %3 : f32[4]\n  return %3, %4\n}\n"
        );
        assert_eq!(regions[2].inputs, vec![ValueId(4), ValueId(3)]);
        for r in &regions {
            kiln_ir::verify(&r.func).unwrap();
        }
        let funcs: Vec<Func> = regions.iter().map(|r| r.func.clone()).collect();
        let g = stitch(&f, &regions, &funcs);
        kiln_ir::verify(&g).unwrap();
        assert_eq!(g.to_string(), f.to_string());
    }
}
