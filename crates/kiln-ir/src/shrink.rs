//! Shrinking a failing program to a minimal one, for differential tests: a random program on
//! which a backend disagrees with the reference becomes the smallest program that still
//! disagrees, saved as a filetest.
//!
//! [`shrink`] repeatedly tries smaller variants of the program ([`candidates`]) and keeps the
//! first on which the failure oracle still holds, until none does (or a budget of oracle calls
//! runs out). Every variant verifies, and is smaller than the program it came from in
//! [`Size`], so shrinking ends. The variants, in the order tried:
//!
//! - return a single computed value (the first whose cone still fails is the smallest);
//! - drop one output;
//! - replace an instruction's result by a new parameter (cutting off its cone);
//! - bypass an instruction (its users read one of its operands of the same type);
//! - replace one operand by a new parameter;
//! - shrink a dimension size `s` to 1, `s / 2` or `s - 1` everywhere in the program's types
//!   (and, in a second variant, in its integer attributes equal to `s`), when that verifies.
//!
//! Dead instructions and unused parameters are dropped after each change, and values are
//! numbered densely, as the text form numbers them.
//!
//! Failures often depend on the arguments' values, so a variant keeps them ([`Source`]): a
//! parameter that stays keeps its argument, one whose shape shrank keeps the elements at the
//! same indices, and one that replaces a value (a cut instruction, an operand) holds the value
//! the reference computed there, given by the caller.

use crate::attr::{Attr, AttrCtx};
use crate::{Func, Inst, Literal, Op, OpKind, TensorType, ValueId, verify};

/// How large a program is, compared lexicographically: instructions, outputs, operands read
/// from instructions (not parameters), and elements over all values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    /// Instructions.
    pub insts: usize,
    /// Outputs.
    pub outputs: usize,
    /// Operands that are results of instructions.
    pub edges: usize,
    /// Elements of every value, parameters included.
    pub elements: usize,
}

impl Size {
    /// The size of `f`.
    pub fn of(f: &Func) -> Size {
        let is_param = params_mask(f);
        Size {
            insts: f.insts.len(),
            outputs: f.outputs.len(),
            edges: f
                .insts
                .iter()
                .flat_map(|i| &i.operands)
                .filter(|o| !is_param[o.index()])
                .count(),
            elements: f.values.iter().map(TensorType::numel).sum(),
        }
    }
}

fn params_mask(f: &Func) -> Vec<bool> {
    let mut m = vec![false; f.values.len()];
    for p in &f.params {
        m[p.index()] = true;
    }
    m
}

/// Where a variant's parameter gets its argument, from the program it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// That program's argument `k`.
    Arg(usize),
    /// That program's argument `k`, cut to the parameter's smaller shape: the elements at the
    /// same indices.
    Block(usize),
    /// The value of that program's value there (a cut instruction's result, an operand).
    Value(ValueId),
}

/// A smaller variant of a program, and where its parameters' arguments come from.
#[derive(Clone, Debug)]
pub struct Variant {
    /// The program.
    pub func: Func,
    /// One per parameter.
    pub sources: Vec<Source>,
}

/// Value `v` of a program on its arguments (the reference's): `value(f, args, v)`.
pub type ValueOf<'a> = dyn FnMut(&Func, &[Literal], ValueId) -> Option<Literal> + 'a;

/// What [`shrink`] did.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The smallest failing program found.
    pub func: Func,
    /// Its arguments.
    pub args: Vec<Literal>,
    /// Variants accepted (each smaller and still failing).
    pub steps: usize,
    /// Oracle calls made.
    pub tries: usize,
    /// Whether the budget ran out before no variant failed (the result may not be minimal).
    pub out_of_budget: bool,
}

/// Shrinks `f`, on which `fails` holds with arguments `args`, to a program on which it still
/// holds (with arguments derived from `args`, see [`Source`]) and no variant of [`candidates`]
/// does; at most `budget` calls of `fails`. `value(g, args, v)` is value `v` of program `g` on
/// `args` (the reference's), for the parameter that replaces it; when it gives `None`, the
/// parameter gets random values. If `fails` does not hold on `f` itself (a flaky failure), `f`
/// is returned as it is.
pub fn shrink(
    f: &Func,
    args: &[Literal],
    budget: usize,
    fails: &mut dyn FnMut(&Func, &[Literal]) -> bool,
    value: &mut ValueOf<'_>,
) -> Shrunk {
    let (mut cur, kept) = compact_keeping(f);
    let mut cur_args: Vec<Literal> = kept.iter().map(|&k| args[k].clone()).collect();
    let mut tries = 1;
    if !fails(&cur, &cur_args) {
        return Shrunk {
            func: f.clone(),
            args: args.to_vec(),
            steps: 0,
            tries,
            out_of_budget: false,
        };
    }
    let mut steps = 0;
    loop {
        let size = Size::of(&cur);
        let mut values: Vec<(ValueId, Option<Literal>)> = Vec::new();
        let mut next = None;
        let mut out_of_budget = false;
        for c in candidates(&cur) {
            if Size::of(&c.func) >= size {
                continue;
            }
            if tries >= budget {
                out_of_budget = true;
                break;
            }
            tries += 1;
            let a = arguments(&c, &cur, &cur_args, &mut values, value);
            if fails(&c.func, &a) {
                next = Some((c.func, a));
                break;
            }
        }
        match next {
            Some((g, a)) => {
                cur = g;
                cur_args = a;
                steps += 1;
            }
            None => {
                return Shrunk {
                    func: cur,
                    args: cur_args,
                    steps,
                    tries,
                    out_of_budget,
                };
            }
        }
    }
}

/// The arguments of variant `c` of `f` (whose arguments are `args`): see [`Source`]. `values`
/// caches the values of `f` asked of `value`.
fn arguments(
    c: &Variant,
    f: &Func,
    args: &[Literal],
    values: &mut Vec<(ValueId, Option<Literal>)>,
    value: &mut ValueOf<'_>,
) -> Vec<Literal> {
    c.sources
        .iter()
        .zip(&c.func.params)
        .map(|(s, p)| {
            let ty = &c.func.values[p.index()];
            let got = match *s {
                Source::Arg(k) => Some(args[k].clone()),
                Source::Block(k) => block(&args[k], ty),
                Source::Value(v) => {
                    if let Some((_, l)) = values.iter().find(|(w, _)| *w == v) {
                        l.clone()
                    } else {
                        let l = value(f, args, v);
                        values.push((v, l.clone()));
                        l
                    }
                }
            };
            got.filter(|l| l.ty() == ty).unwrap_or_else(|| {
                crate::random::random_literal(&mut crate::random::Rng::new(p.0 as u64), ty)
            })
        })
        .collect()
}

/// The elements of `l` at the indices of the (elementwise no larger) shape of `t`.
fn block(l: &Literal, t: &TensorType) -> Option<Literal> {
    let (old, new) = (l.ty().shape.clone(), &t.shape);
    if old.len() != new.len() || new.iter().zip(&old).any(|(n, o)| n > o) {
        return None;
    }
    let width = l.dtype().bytes();
    let bytes = l.to_le_bytes();
    let strides = crate::strides(&old);
    let mut out = Vec::with_capacity(t.numel() * width);
    let mut index = vec![0usize; new.len()];
    for _ in 0..t.numel() {
        let at: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&bytes[at * width..(at + 1) * width]);
        for d in (0..new.len()).rev() {
            index[d] += 1;
            if index[d] < new[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Literal::from_le_bytes(t.clone(), &out).ok()
}

/// The variants of `f` that [`shrink`] tries, in order (see the module documentation); each
/// verifies and is compacted. They are built lazily, so a shrink that accepts an early one
/// does not build the rest.
pub fn candidates(f: &Func) -> impl Iterator<Item = Variant> + '_ {
    let same = |f: &Func| -> Vec<Source> { (0..f.params.len()).map(Source::Arg).collect() };
    let results: Vec<ValueId> = f
        .insts
        .iter()
        .flat_map(|i| i.results.iter().copied())
        .collect();
    let n = f.insts.len();
    let single_outputs = results
        .into_iter()
        .filter(move |&v| f.outputs.len() > 1 || f.outputs[0] != v)
        .map(move |v| {
            let mut g = f.clone();
            g.outputs = vec![v];
            (g, same(f))
        });
    let several = f.outputs.len() > 1;
    let drop_output = (0..f.outputs.len()).filter(move |_| several).map(move |i| {
        let mut g = f.clone();
        g.outputs.remove(i);
        (g, same(f))
    });
    let cut = (0..n).rev().map(move |i| cut_inst(f, i));
    let bypass = (0..n).rev().flat_map(move |i| {
        let inst = &f.insts[i];
        let operands: Vec<ValueId> = if inst.results.len() == 1 {
            inst.operands
                .iter()
                .copied()
                .filter(|o| f.values[o.index()] == f.values[inst.results[0].index()])
                .collect()
        } else {
            Vec::new()
        };
        operands.into_iter().map(move |o| {
            let mut g = f.clone();
            let r = inst.results[0];
            g.insts.remove(i);
            replace_uses(&mut g, r, o);
            (g, same(f))
        })
    });
    let is_param = params_mask(f);
    let operand_to_param = (0..n).rev().flat_map(move |i| {
        let slots: Vec<usize> = (0..f.insts[i].operands.len())
            .filter(|&j| !is_param[f.insts[i].operands[j].index()])
            .collect();
        slots.into_iter().map(move |j| {
            let mut g = f.clone();
            let o = g.insts[i].operands[j];
            let t = g.values[o.index()].clone();
            let p = new_param(&mut g, t);
            g.insts[i].operands[j] = p;
            let mut sources = same(f);
            sources.push(Source::Value(o));
            (g, sources)
        })
    });
    let mut sizes: Vec<usize> = f
        .values
        .iter()
        .flat_map(|t| t.shape.iter().copied())
        .filter(|&s| s >= 2)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let shapes = sizes.into_iter().flat_map(move |s| {
        let mut to = vec![1, s / 2, s - 1];
        to.dedup();
        to.into_iter()
            .filter(move |&t| t < s)
            .flat_map(move |t| [false, true].map(|attrs| resize(f, s, t, attrs)))
            .flatten()
            .map(move |g| {
                let sources = (0..f.params.len())
                    .map(|k| {
                        if g.values[g.params[k].index()] == f.values[f.params[k].index()] {
                            Source::Arg(k)
                        } else {
                            Source::Block(k)
                        }
                    })
                    .collect();
                (g, sources)
            })
    });
    single_outputs
        .chain(drop_output)
        .chain(cut)
        .chain(bypass)
        .chain(operand_to_param)
        .chain(shapes)
        .map(|(g, sources): (Func, Vec<Source>)| {
            let (func, kept) = compact_keeping(&g);
            Variant {
                func,
                sources: kept.iter().map(|&k| sources[k]).collect(),
            }
        })
        .filter(|v| verify(&v.func).is_ok())
}

/// A new parameter of type `t` (numbered past the others until [`compact`]).
fn new_param(f: &mut Func, t: TensorType) -> ValueId {
    let p = ValueId(f.values.len() as u32);
    f.values.push(t);
    f.params.push(p);
    p
}

/// `f` with instruction `i`'s results replaced by new parameters (holding their values).
fn cut_inst(f: &Func, i: usize) -> (Func, Vec<Source>) {
    let mut g = f.clone();
    let mut sources: Vec<Source> = (0..f.params.len()).map(Source::Arg).collect();
    let inst = g.insts.remove(i);
    for r in inst.results {
        let t = g.values[r.index()].clone();
        let p = new_param(&mut g, t);
        replace_uses(&mut g, r, p);
        sources.push(Source::Value(r));
    }
    (g, sources)
}

/// Every use of `from` (operands and outputs) reads `to` instead.
fn replace_uses(f: &mut Func, from: ValueId, to: ValueId) {
    for inst in &mut f.insts {
        for o in &mut inst.operands {
            if *o == from {
                *o = to;
            }
        }
    }
    for o in &mut f.outputs {
        if *o == from {
            *o = to;
        }
    }
}

/// `f` with dimension size `from` replaced by `to` in every type (and in every integer
/// attribute equal to `from`, when `attrs`); constants of a changed type repeat their first
/// elements. `None` when an attribute does not take the new value.
fn resize(f: &Func, from: usize, to: usize, attrs: bool) -> Option<Func> {
    let swap = |t: &TensorType| {
        TensorType::new(
            t.dtype,
            t.shape
                .iter()
                .map(|&d| if d == from { to } else { d })
                .collect::<Vec<_>>(),
        )
    };
    let mut g = f.clone();
    g.values = g.values.iter().map(swap).collect();
    g.output_types = g.output_types.iter().map(swap).collect();
    for inst in &mut g.insts {
        let types: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| g.values[r.index()].clone())
            .collect();
        if let Op::Constant { value } = &inst.op {
            if value.ty() != &types[0] {
                inst.op = Op::Constant {
                    value: resized_literal(value, &types[0])?,
                };
            }
        } else if attrs {
            let named: Vec<(String, Attr)> = inst
                .op
                .attrs()
                .into_iter()
                .map(|(n, a)| (n.to_string(), swap_tokens(&a, from, to)))
                .collect();
            let ctx = AttrCtx {
                result_types: &types,
            };
            inst.op = Op::from_attrs(inst.op.kind(), &named, &ctx).ok()?;
        }
    }
    Some(g)
}

/// `a` with every integer token equal to `from` replaced by `to`.
fn swap_tokens(a: &Attr, from: usize, to: usize) -> Attr {
    match a {
        Attr::Token(t) if t.parse::<usize>() == Ok(from) => Attr::Token(to.to_string()),
        Attr::Token(t) => Attr::Token(t.clone()),
        Attr::List(items) => Attr::List(items.iter().map(|x| swap_tokens(x, from, to)).collect()),
        Attr::Region(f) => Attr::Region(f.clone()),
    }
}

/// The elements of `l`, repeated or cut to fill type `t` (of the same dtype).
fn resized_literal(l: &Literal, t: &TensorType) -> Option<Literal> {
    let n = t.numel();
    if l.dtype().is_float() {
        let v = l.to_f64s();
        let w: Vec<f64> = (0..n)
            .map(|i| v.get(i % v.len().max(1)).copied().unwrap_or(0.0))
            .collect();
        Literal::from_f64s(t.clone(), &w).ok()
    } else {
        let v = l.to_i64s();
        let w: Vec<i64> = (0..n)
            .map(|i| v.get(i % v.len().max(1)).copied().unwrap_or(0))
            .collect();
        Literal::from_i64s(t.clone(), &w).ok()
    }
}

/// `f` without dead instructions (none of whose results reaches an output) and unused
/// parameters, with values numbered densely in definition order: parameters, then each
/// instruction's results.
pub fn compact(f: &Func) -> Func {
    compact_keeping(f).0
}

/// [`compact`], and the positions in `f.params` of the parameters kept.
fn compact_keeping(f: &Func) -> (Func, Vec<usize>) {
    renumber(f, false)
}

/// `f` without dead instructions (and without unused parameters unless `all_params`), values
/// numbered densely; and the positions in `f.params` of the parameters kept.
fn renumber(f: &Func, all_params: bool) -> (Func, Vec<usize>) {
    let mut live = vec![false; f.values.len()];
    for o in &f.outputs {
        live[o.index()] = true;
    }
    let mut keep = vec![false; f.insts.len()];
    for (i, inst) in f.insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| live[r.index()]) {
            keep[i] = true;
            for o in &inst.operands {
                live[o.index()] = true;
            }
        }
    }
    let mut map = vec![ValueId(u32::MAX); f.values.len()];
    let mut values = Vec::new();
    let number = |v: ValueId, map: &mut Vec<ValueId>, values: &mut Vec<TensorType>| {
        map[v.index()] = ValueId(values.len() as u32);
        values.push(f.values[v.index()].clone());
        map[v.index()]
    };
    let kept: Vec<usize> = (0..f.params.len())
        .filter(|&k| all_params || live[f.params[k].index()])
        .collect();
    let params: Vec<ValueId> = kept
        .iter()
        .map(|&k| number(f.params[k], &mut map, &mut values))
        .collect();
    let mut insts = Vec::new();
    for (inst, _) in f.insts.iter().zip(&keep).filter(|(_, k)| **k) {
        let results = inst
            .results
            .iter()
            .map(|&r| number(r, &mut map, &mut values))
            .collect();
        insts.push(Inst {
            op: inst.op.clone(),
            operands: inst.operands.iter().map(|o| map[o.index()]).collect(),
            results,
            loc: inst.loc,
        });
    }
    let outputs: Vec<ValueId> = f.outputs.iter().map(|o| map[o.index()]).collect();
    let output_types = outputs.iter().map(|o| values[o.index()].clone()).collect();
    let g = Func {
        name: f.name.clone(),
        params,
        insts,
        outputs,
        output_types,
        values,
    };
    (g, kept)
}

/// `f` and `args` with each float argument that does not round-trip through the text form bit
/// for bit passed as its bits (`i64`, `i32`, or `i8` pairs for 16-bit floats), converted back
/// by a `bitcast_convert` at the start of the program.
fn bits_for_floats(f: &Func, args: &[Literal]) -> (Func, Vec<Literal>) {
    let mut g = f.clone();
    let mut out = args.to_vec();
    let mut casts = Vec::new();
    for (k, a) in args.iter().enumerate() {
        let mut text = String::new();
        a.write_nested(&mut text);
        let same =
            crate::parse_literal(&text, a.ty()).is_ok_and(|b| b.to_le_bytes() == a.to_le_bytes());
        if same || !a.dtype().is_float() {
            continue;
        }
        let mut shape = a.ty().shape.clone();
        let dtype = match a.dtype() {
            crate::DType::F64 => crate::DType::I64,
            crate::DType::F32 => crate::DType::I32,
            _ => {
                shape.push(a.dtype().bytes());
                crate::DType::I8
            }
        };
        let t = TensorType::new(dtype, shape);
        let Ok(bits) = Literal::from_le_bytes(t.clone(), &a.to_le_bytes()) else {
            continue;
        };
        let q = ValueId(g.values.len() as u32);
        g.values.push(t);
        casts.push(Inst {
            op: Op::BitcastConvert {},
            operands: vec![q],
            results: vec![g.params[k]],
            loc: None,
        });
        g.params[k] = q;
        out[k] = bits;
    }
    casts.append(&mut g.insts);
    g.insts = casts;
    (renumber(&g, true).0, out)
}

/// Whether `f` holds an instruction of `kind` with a result of more than `elements` elements
/// (a planted failure for testing the shrinker).
pub fn has_large(f: &Func, kind: OpKind, elements: usize) -> bool {
    f.insts.iter().any(|i| {
        i.op.kind() == kind
            && i.results
                .iter()
                .any(|r| f.values[r.index()].numel() > elements)
    })
}

/// The text of a differential filetest (`// RUN: differential`) of `f` on `args`: the
/// arguments as `// %N = VALUE` lines (every element, so the values round-trip), `notes` as
/// comment lines, then the program. It fails until the backend agrees with the reference on it.
/// A float argument whose text would not give its bits back (a NaN's sign and payload) is
/// passed as integers, through a `bitcast_convert` added to the program.
pub fn differential_filetest(f: &Func, args: &[Literal], notes: &str) -> String {
    let (f, args) = &bits_for_floats(f, args);
    let mut s = String::from("// RUN: differential\n// TARGET: cpu\n");
    for line in notes.lines() {
        s.push_str("// ");
        s.push_str(line);
        s.push('\n');
    }
    for (p, a) in f.params.iter().zip(args) {
        let mut v = String::new();
        a.write_nested(&mut v);
        s.push_str(&format!("// {p} = {v}\n"));
    }
    s.push_str(&f.to_string());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::{Config, Rng, random_func, random_literal};

    fn random_args(f: &Func) -> Vec<Literal> {
        let mut rng = Rng::new(5);
        f.param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect()
    }

    /// No values given for cut instructions: their parameters get random ones.
    fn no_value(_: &Func, _: &[Literal], _: ValueId) -> Option<Literal> {
        None
    }

    /// A large random program (40 ops, every result returned) holding an instruction of
    /// `kind` with more than `elements` elements.
    fn planted(kind: OpKind, elements: usize) -> (u64, Func) {
        (0..10_000u64)
            .map(|seed| {
                let cfg = Config {
                    ops: 40,
                    max_dim: 6,
                    ..Config::default()
                };
                let mut f = random_func(&mut Rng::new(seed), &cfg);
                f.outputs = f.insts.iter().map(|i| i.results[0]).collect();
                f.output_types = f
                    .outputs
                    .iter()
                    .map(|o| f.values[o.index()].clone())
                    .collect();
                (seed, f)
            })
            .find(|(_, f)| f.insts.len() >= 40 && has_large(f, kind, elements))
            .expect("a seed with the op")
    }

    /// The planted failure "an instruction of `kind` with more than `elements` elements"
    /// shrinks a large program holding one to that instruction alone, and no variant of the
    /// result still fails.
    fn shrinks_to_one_instruction(kind: OpKind, elements: usize) {
        let (seed, f) = planted(kind, elements);
        let mut fails = |g: &Func, _: &[Literal]| has_large(g, kind, elements);
        let s = shrink(&f, &random_args(&f), 100_000, &mut fails, &mut no_value);
        let g = &s.func;
        println!(
            "seed {seed}: {:?} -> {:?} in {} steps, {} tries:\n{g}",
            Size::of(&f),
            Size::of(g),
            s.steps,
            s.tries
        );
        assert!(!s.out_of_budget);
        verify(g).unwrap();
        assert!(has_large(g, kind, elements), "{g}");
        // Only the planted op is left, between parameters, and returned.
        assert_eq!(g.insts.len(), 1, "{g}");
        assert_eq!(g.insts[0].op.kind(), kind, "{g}");
        assert_eq!(g.outputs, g.insts[0].results[..1], "{g}");
        assert!(
            g.insts[0].operands.iter().all(|o| g.params.contains(o)),
            "{g}"
        );
        // Minimal: no variant still fails.
        for c in candidates(g) {
            assert!(!fails(&c.func, &[]), "not minimal: {}", c.func);
        }
        assert_eq!(s.args.len(), g.params.len());
        for (a, p) in s.args.iter().zip(&g.params) {
            assert_eq!(a.ty(), &g.values[p.index()]);
        }
    }

    #[test]
    fn a_planted_product_shrinks_to_one_instruction() {
        shrinks_to_one_instruction(OpKind::DotGeneral, 20);
    }

    #[test]
    fn a_planted_exponential_shrinks_to_one_instruction() {
        shrinks_to_one_instruction(OpKind::Exponential, 6);
    }

    /// Shrinking keeps what the failure needs: an `exponential` of a sum of 6 elements or more
    /// keeps the `add`, shrinks the shape to 6 elements, and drops the rest.
    #[test]
    fn shrinking_keeps_a_needed_chain() {
        let chain = |g: &Func| {
            g.insts.iter().any(|i| {
                i.op.kind() == OpKind::Exponential
                    && g.values[i.results[0].index()].numel() >= 6
                    && g.insts
                        .iter()
                        .any(|j| j.op.kind() == OpKind::Add && j.results[0] == i.operands[0])
            })
        };
        let src = "func @main(%0: f32[4,5], %1: f32[4,5], %2: f32[5]) -> (f32[4,5], f32[5]) {\n  %3 = multiply %0, %1 : f32[4,5]\n  %4 = add %3, %0 : f32[4,5]\n  %5 = exponential %4 : f32[4,5]\n  %6 = tanh %5 : f32[4,5]\n  %7 = negate %2 : f32[5]\n  return %6, %7\n}\n";
        let f = crate::parse_func_text(src).unwrap();
        let s = shrink(
            &f,
            &random_args(&f),
            10_000,
            &mut |g, _| chain(g),
            &mut no_value,
        );
        let g = &s.func;
        let kinds: Vec<OpKind> = g.insts.iter().map(|i| i.op.kind()).collect();
        assert_eq!(kinds, [OpKind::Add, OpKind::Exponential], "{g}");
        assert_eq!(g.outputs, g.insts[1].results, "{g}");
        assert_eq!(g.values[g.outputs[0].index()].numel(), 6, "{g}");
        assert_eq!(g.params.len(), 2, "{g}");
    }

    /// A failure that depends on the arguments' values: the program computes `exp(x * y + x)`
    /// and fails while an argument holds 7 at index 0 and an `exponential` is left. Variants
    /// keep the arguments of the parameters that stay (cut to smaller shapes at the same
    /// indices), and a cut `add` becomes a parameter holding the value it computed (here given
    /// as all sevens), so the shrink ends at the `exponential` of that parameter, one element.
    #[test]
    fn variants_keep_the_arguments_a_failure_needs() {
        let src = "func @main(%0: f32[4,5], %1: f32[4,5], %2: f32[5]) -> (f32[4,5], f32[5]) {\n  %3 = multiply %0, %1 : f32[4,5]\n  %4 = add %3, %0 : f32[4,5]\n  %5 = exponential %4 : f32[4,5]\n  %6 = negate %2 : f32[5]\n  return %5, %6\n}\n";
        let f = crate::parse_func_text(src).unwrap();
        let mut args = random_args(&f);
        let mut x = args[0].to_f64s();
        x[0] = 7.0;
        args[0] = Literal::from_f64s(args[0].ty().clone(), &x).unwrap();
        let mut fails = |g: &Func, a: &[Literal]| {
            g.insts.iter().any(|i| i.op.kind() == OpKind::Exponential)
                && a.iter()
                    .any(|l| l.dtype().is_float() && l.numel() > 0 && l.to_f64s()[0] == 7.0)
        };
        let mut asked = Vec::new();
        let mut value = |g: &Func, _: &[Literal], v: ValueId| {
            asked.push(g.insts.iter().find(|i| i.results.contains(&v))?.op.kind());
            let t = g.values[v.index()].clone();
            Literal::from_f64s(t.clone(), &vec![7.0; t.numel()]).ok()
        };
        let s = shrink(&f, &args, 10_000, &mut fails, &mut value);
        assert_eq!(
            s.func.to_string(),
            "func @main(%0: f32[1,1]) -> f32[1,1] {\n  %1 = exponential %0 : f32[1,1]\n  return %1\n}\n"
        );
        assert_eq!(s.args[0].to_f64s(), [7.0]);
        assert!(asked.contains(&OpKind::Add), "{asked:?}");
    }

    #[test]
    fn blocks_keep_the_elements_at_their_indices() {
        let l = Literal::from_i64s(
            TensorType::new(crate::DType::I32, [2, 3]),
            &[1, 2, 3, 4, 5, 6],
        )
        .unwrap();
        let b = block(&l, &TensorType::new(crate::DType::I32, [2, 2])).unwrap();
        assert_eq!(b.to_i64s(), [1, 2, 4, 5]);
        assert!(block(&l, &TensorType::new(crate::DType::I32, [3, 1])).is_none());
    }

    #[test]
    fn compact_drops_dead_code_and_renumbers() {
        let src = "func @main(%0: f32[2], %1: f32[3]) -> f32[2] {\n  %2 = negate %1 : f32[3]\n  %3 = abs %0 : f32[2]\n  return %3\n}\n";
        let f = crate::parse_func_text(src).unwrap();
        assert_eq!(
            compact(&f).to_string(),
            "func @main(%0: f32[2]) -> f32[2] {\n  %1 = abs %0 : f32[2]\n  return %1\n}\n"
        );
    }

    #[test]
    fn filetests_round_trip_their_arguments() {
        let src = "func @main(%0: f32[3], %1: bf16[2]) -> f32[3] {\n  %2 = negate %0 : f32[3]\n  return %2\n}\n";
        let f = crate::parse_func_text(src).unwrap();
        let a = Literal::from_f64s(
            TensorType::new(crate::DType::F32, [3]),
            &[-0.0, f64::NAN, 5e-40],
        )
        .unwrap();
        let b = Literal::from_f64s(
            TensorType::new(crate::DType::BF16, [2]),
            &[f64::NEG_INFINITY, 1.1],
        )
        .unwrap();
        let text = differential_filetest(&f, &[a.clone(), b.clone()], "seed 3");
        assert!(
            text.starts_with("// RUN: differential\n// TARGET: cpu\n// seed 3\n// %0 = ["),
            "{text}"
        );
        let m = crate::parse_module(&text).unwrap();
        assert_eq!(m.entry().unwrap(), &f);
        let lines: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("// %").and_then(|r| r.split_once(" = ")))
            .map(|(_, v)| v)
            .collect();
        for (v, want) in lines.iter().zip([a, b]) {
            let got = crate::parse_literal(v, want.ty()).unwrap();
            assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{v}");
        }
    }

    /// A NaN with a payload or a sign (which the text form writes as `nan`) is passed as its
    /// bits, through a `bitcast_convert`.
    #[test]
    fn nan_payloads_are_passed_as_bits() {
        let src = "func @main(%0: f64[2], %1: f16[1]) -> (f64[2], f16[1]) {\n  %2 = maximum %0, %0 : f64[2]\n  %3 = negate %1 : f16[1]\n  return %2, %3\n}\n";
        let f = crate::parse_func_text(src).unwrap();
        let a = Literal::new(
            TensorType::new(crate::DType::F64, [2]),
            crate::Data::F64(vec![f64::from_bits(0xffff_ffff_ffff_fffa), 1.5]),
        )
        .unwrap();
        let h =
            Literal::from_le_bytes(TensorType::new(crate::DType::F16, [1]), &[0x01, 0x7e]).unwrap();
        let text = differential_filetest(&f, &[a, h], "");
        assert_eq!(
            text,
            "// RUN: differential\n// TARGET: cpu\n// %0 = [-6, 4609434218613702656]\n// %1 = [[1, 126]]\nfunc @main(%0: i64[2], %1: i8[1,2]) -> (f64[2], f16[1]) {\n  %2 = bitcast_convert %0 : f64[2]\n  %3 = bitcast_convert %1 : f16[1]\n  %4 = maximum %2, %2 : f64[2]\n  %5 = negate %3 : f16[1]\n  return %4, %5\n}\n"
        );
    }
}
