//! Whether a producer is computed inside its users: the limits on its body, and how many
//! times each user would evaluate its elements (the measure a decision states).

use super::{CHEAP, Fused, MAX_NODES};
use crate::access::free_vars;
use crate::ir::{Cond, Expr, Idx, Kernel, Schedule, Visitor, visit};
use crate::lower::is_byte_copy;
use crate::pattern::hoistable_reduces;
use kiln_ir::{Func, strides};

/// Whether instruction `i` (its fused kernel already in `fused`) can be computed inside every
/// user's kernel: `Ok` with the measure that allowed it, or `Err` with the reason it may not.
pub(super) fn inlinable(
    f: &Func,
    i: usize,
    ks: &[Option<Kernel>],
    fused: &Fused,
    users: &[Vec<usize>],
) -> Result<String, String> {
    let inst = &f.insts[i];
    let Some(k) = &fused.kernels[i] else {
        return Err("no loop-nest kernel".into());
    };
    let v = inst.results[0];
    let numel = f.values[v.index()].numel();
    // A reduction is inlined only where the user computes each of its elements once: the
    // CPU backend computes a reduction that reads only enclosing loop variables ahead of the
    // inner loops (a row's sum before the loop over the row), and computes equal reductions
    // in one kernel once. Users in different kernels each compute it, so only a few may.
    let reduces = has_reduce(&k.body);
    let n_users = users[v.index()].len();
    // Users over the same index space usually end up in one multi-output kernel (see
    // `merge_siblings`), which computes the reduction once: count index spaces.
    let mut spaces: Vec<&[usize]> = users[v.index()]
        .iter()
        .map(|&u| f.values[f.insts[u].results[0].index()].shape.as_slice())
        .collect();
    spaces.sort_unstable();
    spaces.dedup();
    if reduces && spaces.len() > MAX_REDUCTION_USERS {
        return Err(format!(
            "computes a reduction and has {n_users} users over {} index spaces (at most {MAX_REDUCTION_USERS} may recompute it)",
            spaces.len()
        ));
    }
    if inst.results.len() != 1 || k.schedule != Schedule::Nest {
        return Err("not a single-result loop nest".into());
    }
    if numel == 0 {
        return Err("empty".into());
    }
    if is_byte_copy(f, inst) {
        // Its positions are bytes, and the GPU's device plan reads its input as bytes: inside
        // a user it would read its input's elements with the user's element type, even where
        // its bytes are its elements (random seed 27544's `u8` read as `i8` zero-extended on
        // the GPU emulator). It keeps its own kernel.
        return Err(format!(
            "a byte copy (writes the bytes of a {})",
            f.values[v.index()]
        ));
    }
    if f.outputs.contains(&v) {
        return Err("a function output (must be stored)".into());
    }
    if n_users == 0 {
        return Err("unused".into());
    }
    let size = nodes(&k.body);
    if size > MAX_NODES {
        return Err(format!("body of {size} nodes (limit {MAX_NODES})"));
    }
    // Users in several kernels each recompute the body, reading every buffer it reads: past a
    // few buffers the size of its result, storing it once costs less traffic. Without this
    // limit, sums that grow one buffer at a time (a residual stream read by a layer norm's
    // row sums and by the next step, and its gradient) are recomputed from their first term
    // by every user down the chain. Users are counted by index space, as above.
    let full = full_size_inputs(f, &fused.operands[i], numel);
    if spaces.len() > 1 && full > MAX_SHARED_INPUTS {
        return Err(format!(
            "reads {full} buffers of its size and has users over {} index spaces, each of which would read them all (at most {MAX_SHARED_INPUTS} when shared)",
            spaces.len()
        ));
    }
    let cost = cost(&k.body);
    let mut why = Vec::new();
    let mut seen = Vec::new();
    for &u in &users[v.index()] {
        if seen.contains(&u) {
            continue;
        }
        seen.push(u);
        let Some(uk) = &ks[u] else {
            return Err(format!("user #{u} has no kernel"));
        };
        if uk.schedule != Schedule::Nest || uk.out.numel() == 0 {
            return Err(format!("user #{u} is not a loop nest"));
        }
        let ext = var_extents(uk);
        let positions: Vec<usize> = f.insts[u]
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == v)
            .map(|(j, _)| j)
            .collect();
        // A user that reads the value's bytes as another type (a bitcast between 16- or 8-bit
        // types is a byte copy) indexes the stored buffer, so the value must be stored.
        let dtype = f.values[v.index()].dtype;
        let mut reinterprets = false;
        visit(&uk.body, &mut |e| {
            if let Expr::Load {
                input, dtype: d, ..
            }
            | Expr::Gather {
                input, dtype: d, ..
            } = e
                && positions.contains(input)
                && *d != dtype
            {
                reinterprets = true;
            }
        });
        if reinterprets {
            return Err(format!("user #{u} reads its bytes as another type"));
        }
        if is_byte_copy(f, &f.insts[u]) {
            // A byte copy reads its input as bytes on the GPU (its device plan step says so):
            // inside it, this value's own inputs would be read as bytes too (random seed
            // 26934's `i8` convert of an `i64` sum, copied to `u8`, read the sum's bytes).
            return Err(format!("user #{u} is a byte copy"));
        }
        if reduces {
            // Its reductions run ahead of the loops they do not depend on; read inside a
            // reduction of the user that moves along a dimension they depend on (a row's
            // variance inside a sum down a column), they would run again at every step.
            // That wastes work when the user also has an output loop those reductions do not
            // depend on: they are recomputed for each of its positions.
            let shape = &f.values[v.index()].shape;
            let (moved, by_output) = dims_moved(&uk.body, &positions, shape, uk.out.rank());
            let inner: std::collections::BTreeSet<usize> = hoistable_reduces(&k.body)
                .into_iter()
                .flat_map(free_vars)
                .filter(|&d| d < k.out.rank())
                .collect();
            let stepped = inner.iter().find(|d| moved.contains(d));
            let repeated = (0..uk.out.rank())
                .find(|&o| uk.out.shape[o] > 1 && !by_output[o].iter().any(|d| inner.contains(d)));
            if let (Some(d), Some(o)) = (stepped, repeated) {
                return Err(format!(
                    "user #{u} reads it inside a reduction along its dimension {d}, which its own reduction depends on, for each position of its output dimension {o} (the reduction would be recomputed {} times over)",
                    uk.out.shape[o]
                ));
            }
        }
        let reads: usize = if reduces {
            hoisted_reads(&uk.body, &positions, &ext, uk.out.rank(), uk.out.numel())
        } else {
            positions
                .iter()
                .map(|&j| reads_of(&uk.body, j, uk.out.numel(), &ext))
                .sum()
        };
        if reads <= numel {
            why.push(format!(
                "#{u} reads each of its {numel} elements at most once ({reads} reads)"
            ));
        } else if cost <= CHEAP && !reduces {
            why.push(format!("#{u} reads it {reads} times for {numel} elements, but it costs {cost} <= {CHEAP} per element"));
        } else {
            return Err(format!(
                "user #{u} would compute its {numel} elements {reads} times at cost {cost} each{}",
                if reduces {
                    " (it holds a reduction)"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(why.join("; "))
}

/// Users (kernels, counted by index space) a reduction may be inlined into; each computes it
/// once.
const MAX_REDUCTION_USERS: usize = 3;

/// Buffers at least the size of its result that a producer with users over several index spaces
/// may read and still be recomputed by each. Stored, it costs one pass over those buffers, a
/// write (about two reads' traffic) and a read per user; recomputed, each user reads all of
/// them: with two users and three buffers, 6 reads against 3 + 2 + 2.
const MAX_SHARED_INPUTS: usize = 2;

/// How many of the buffers `inputs` hold at least `numel` elements (a bias or a row's
/// statistic broadcast over the result is smaller and stays in cache).
fn full_size_inputs(f: &Func, inputs: &[kiln_ir::ValueId], numel: usize) -> usize {
    inputs
        .iter()
        .filter(|v| f.values[v.index()].numel() >= numel)
        .count()
}

/// How many times a kernel over `outer` positions evaluates input `j` of `e` when a reduction
/// inlined in its place is computed ahead of the loops it does not depend on (the CPU
/// backend's `emit_nest`): a load reached through elementwise ops and reductions only, whose
/// index uses output variables `0..=d` and no reduction variable, runs once per iteration of
/// loops `0..=d`. Other loads count as [`reads_of`] counts them.
fn hoisted_reads(e: &Expr, js: &[usize], ext: &[usize], rank: usize, outer: usize) -> usize {
    // Loads of any of `js` at the same position read the same value.
    let same = |a: &Expr, b: &Expr| match (a, b) {
        (
            Expr::Load {
                input: i,
                coef: c,
                off: o,
                ..
            },
            Expr::Load {
                input: i2,
                coef: c2,
                off: o2,
                ..
            },
        ) if js.contains(i) && js.contains(i2) => c == c2 && o == o2,
        _ => a == b,
    };
    match e {
        Expr::Load { input, coef, .. } if js.contains(input) => {
            let free: Vec<usize> = (0..coef.len()).filter(|&v| coef[v] != 0).collect();
            if free.iter().all(|&v| v < rank) {
                let last = free.last().map_or(0, |&v| v + 1);
                ext[..last].iter().product()
            } else {
                outer
            }
        }
        // An argument equal to an earlier one is the same value (`d * d`): counted once.
        Expr::Op { args, .. } => args
            .iter()
            .enumerate()
            .filter(|(i, a)| !args[..*i].iter().any(|b| same(a, b)))
            .map(|(_, a)| hoisted_reads(a, js, ext, rank, outer))
            .sum(),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            let n: usize = vars.iter().map(|v| v.1).product();
            hoisted_reads(init, js, ext, rank, outer)
                + hoisted_reads(body, js, ext, rank, outer.saturating_mul(n))
        }
        _ => js.iter().map(|&j| reads_of(e, j, outer, ext)).sum(),
    }
}

/// How many times a kernel over `outer` positions, its variables `v` ranging over
/// `0..ext[v]`, evaluates loads of input `j` in `e`. The branches of a guard on plain variables
/// (`lo <= var < hi`) run on their share of the positions only: each piece of a concatenation
/// is read on its own rows, once per element, not at every position of the result.
fn reads_of(e: &Expr, j: usize, outer: usize, ext: &[usize]) -> usize {
    let mut range: Vec<(i64, i64)> = ext.iter().map(|&n| (0, n as i64)).collect();
    reads_in(e, j, outer, &mut range)
}

/// [`reads_of`] with each variable's current range.
fn reads_in(e: &Expr, j: usize, outer: usize, range: &mut Vec<(i64, i64)>) -> usize {
    match e {
        Expr::Load { input, .. } | Expr::Gather { input, .. } => {
            let inner = match e {
                Expr::Gather { index, .. } => {
                    index.iter().map(|i| idx_reads(i, j, outer, range)).sum()
                }
                _ => 0,
            };
            if *input == j { outer + inner } else { inner }
        }
        Expr::Iota { .. } | Expr::Const { .. } | Expr::Index { .. } => 0,
        Expr::Op { args, .. } => args.iter().map(|a| reads_in(a, j, outer, range)).sum(),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            let n: usize = vars.iter().map(|v| v.1).product();
            reads_in(init, j, outer, range) + reads_in(body, j, outer.saturating_mul(n), range)
        }
        Expr::Fold { fold, .. } => {
            let n: usize = fold.vars.iter().map(|v| v.1).product();
            let inits: usize = fold
                .inits
                .iter()
                .map(|x| reads_in(x, j, outer, range))
                .sum();
            let elems: usize = (fold.elems.iter())
                .map(|x| reads_in(x, j, outer.saturating_mul(n), range))
                .sum();
            inits + elems
        }
        Expr::Arg { .. } => 0,
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            let in_conds: usize = conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, ..) | Cond::Divisible(i, _) => idx_reads(i, j, outer, range),
                })
                .sum();
            // The share of the positions each branch runs on: `outer` scaled by how much of
            // a guarded variable's range its condition keeps (or leaves, for `otherwise`).
            let plain: Option<Vec<(usize, i64, i64)>> = conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(Idx::Var(d), lo, hi) if *d < range.len() => Some((*d, *lo, *hi)),
                    _ => None,
                })
                .collect();
            let Some(plain) = plain else {
                return in_conds
                    + reads_in(then, j, outer, range)
                    + reads_in(otherwise, j, outer, range);
            };
            let scaled = |outer: usize, kept: i64, of: i64| {
                if of <= 0 {
                    outer
                } else {
                    (outer as u128 * kept.max(0) as u128 / of as u128) as usize
                }
            };
            let saved = range.clone();
            let mut then_outer = outer;
            for &(d, lo, hi) in &plain {
                let (a, b) = range[d];
                let kept = (a.max(lo), b.min(hi));
                then_outer = scaled(then_outer, kept.1 - kept.0, b - a);
                range[d] = (kept.0, kept.1.max(kept.0));
            }
            let then_reads = reads_in(then, j, then_outer, range);
            range.clone_from(&saved);
            // What a single condition leaves is one interval when it cuts the range at one
            // end (a concatenation's guard tree); otherwise count every position.
            let mut other_outer = outer;
            if let [(d, lo, hi)] = plain[..] {
                let (a, b) = range[d];
                let left = if lo <= a {
                    Some((a.max(hi), b))
                } else if hi >= b {
                    Some((a, b.min(lo)))
                } else {
                    None
                };
                if let Some(left) = left {
                    other_outer = scaled(outer, left.1 - left.0, b - a);
                    range[d] = (left.0, left.1.max(left.0));
                }
            }
            let other_reads = reads_in(otherwise, j, other_outer, range);
            *range = saved;
            in_conds + then_reads + other_reads
        }
    }
}

/// [`reads_in`] for the run-time indices inside index expression `i`.
fn idx_reads(i: &Idx, j: usize, outer: usize, range: &mut Vec<(i64, i64)>) -> usize {
    /// The expressions of the run-time indices, not looking inside them.
    struct Values<'e>(Vec<&'e Expr>);
    impl<'e> Visitor<'e> for Values<'e> {
        fn expr(&mut self, e: &'e Expr) {
            self.0.push(e);
        }
    }
    let mut values = Values(Vec::new());
    values.idx(i);
    values.0.iter().map(|e| reads_in(e, j, outer, range)).sum()
}

/// Where `e` reads a producer of shape `shape` (as inputs `js`): the producer dimensions that
/// the variables of enclosing reductions move, and per output variable `0..rank` the
/// dimensions it moves. A load's coefficient for a variable names the dimension with that
/// stride; a read that cannot be attributed moves every dimension.
fn dims_moved(
    e: &Expr,
    js: &[usize],
    shape: &[usize],
    rank: usize,
) -> (Vec<usize>, Vec<Vec<usize>>) {
    struct Walk<'a> {
        js: &'a [usize],
        st: Vec<usize>,
        shape: &'a [usize],
        bound: Vec<usize>,
        in_reduce: Vec<usize>,
        by_output: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn dims(&self, c: i64) -> Vec<usize> {
            match (0..self.shape.len()).find(|&d| self.shape[d] > 1 && self.st[d] as i64 == c.abs())
            {
                Some(d) => vec![d],
                None => (0..self.shape.len()).collect(),
            }
        }
    }
    impl Visitor<'_> for Walk<'_> {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { input, coef, .. } if self.js.contains(input) => {
                    for (v, &c) in coef.iter().enumerate() {
                        if c == 0 {
                            continue;
                        }
                        let ds = self.dims(c);
                        if self.bound.contains(&v) {
                            self.in_reduce.extend(&ds);
                        } else if let Some(o) = self.by_output.get_mut(v) {
                            o.extend(ds);
                        }
                    }
                }
                Expr::Gather { input, .. } if self.js.contains(input) => {
                    let all: Vec<usize> = (0..self.shape.len()).collect();
                    if !self.bound.is_empty() {
                        self.in_reduce.extend(&all);
                    }
                    for o in &mut self.by_output {
                        o.extend(&all);
                    }
                }
                Expr::Reduce {
                    init, vars, body, ..
                } => {
                    self.expr(init);
                    let mark = self.bound.len();
                    self.bound.extend(vars.iter().map(|v| v.0));
                    self.expr(body);
                    self.bound.truncate(mark);
                }
                Expr::Fold { fold, .. } => {
                    fold.inits.iter().for_each(|x| self.expr(x));
                    let mark = self.bound.len();
                    self.bound.extend(fold.vars.iter().map(|v| v.0));
                    fold.elems.iter().for_each(|x| self.expr(x));
                    self.bound.truncate(mark);
                }
                Expr::Op { .. } => e.for_each_child(self),
                Expr::Guard {
                    then, otherwise, ..
                } => {
                    self.expr(then);
                    self.expr(otherwise);
                }
                _ => {}
            }
        }
    }
    let mut w = Walk {
        js,
        st: strides(shape),
        shape,
        bound: Vec::new(),
        in_reduce: Vec::new(),
        by_output: vec![Vec::new(); rank],
    };
    w.expr(e);
    w.in_reduce.sort_unstable();
    w.in_reduce.dedup();
    (w.in_reduce, w.by_output)
}

fn has_reduce(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| {
        found |= matches!(x, Expr::Reduce { .. } | Expr::Fold { .. })
    });
    found
}

pub(super) fn nodes(e: &Expr) -> usize {
    let mut n = 0;
    visit(e, &mut |_| n += 1);
    n
}

/// Arithmetic cost of evaluating `e` once: elementwise ops count 1, transcendental ones 8.
fn cost(e: &Expr) -> usize {
    use kiln_ir::OpKind::*;
    let mut c = 0;
    visit(e, &mut |x| {
        if let Expr::Op { op, .. } = x {
            c += match op {
                crate::ir::Ew::Kind(
                    Exponential | Log | LogPlusOne | ExponentialMinusOne | Tanh | Logistic | Sine
                    | Cosine | Erf | Power | Divide | Remainder | Sqrt | Rsqrt,
                ) => 8,
                _ => 1,
            }
        }
    });
    c
}
/// The extent of each loop variable of `k`: the output dimensions, then reduction variables.
pub(super) fn var_extents(k: &Kernel) -> Vec<usize> {
    let mut ext: Vec<usize> = k.out.shape.clone();
    let bodies = std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body));
    bodies.for_each(|b| {
        visit(b, &mut |e| {
            let vars = match e {
                Expr::Reduce { vars, .. } => vars,
                Expr::Fold { fold, .. } => &fold.vars,
                _ => return,
            };
            for &(v, n) in vars {
                if ext.len() <= v {
                    ext.resize(v + 1, 1);
                }
                ext[v] = n;
            }
        })
    });
    ext
}

#[cfg(test)]
mod tests {
    /// Which instructions of `text` are computed inside their users.
    fn inlined(text: &str) -> Vec<bool> {
        let f = kiln_ir::parse_func_text(text).unwrap();
        super::super::fuse_unmerged(
            &f,
            crate::pipeline::kernels(&f),
            true,
            &crate::target::FusionLimits::default(),
        )
        .inlined
    }

    /// A byte copy whose bytes are its elements (`u8` to `i8`) keeps its own kernel, and
    /// what a byte copy reads is stored (random seeds 27544 and 26934 on the GPU emulator),
    /// while a 32-bit bitcast (an elementwise op) is still computed inside its user.
    #[test]
    fn byte_copies_and_their_inputs_are_stored() {
        let copy_in_user = "func @main(%0: u8[3]) -> u16[3] {
  %1 = bitcast_convert %0 : i8[3]
  %2 = convert %1 : u16[3]
  return %2
}
";
        assert_eq!(inlined(copy_in_user), [false, false]);
        let producer_in_copy = "func @main(%0: i64[2]) -> u8[2] {
  %1 = convert %0 : i8[2]
  %2 = bitcast_convert %1 : u8[2]
  return %2
}
";
        assert_eq!(inlined(producer_in_copy), [false, false]);
        let words = "func @main(%0: f32[3]) -> f64[3] {
  %1 = bitcast_convert %0 : i32[3]
  %2 = convert %1 : f64[3]
  return %2
}
";
        assert_eq!(inlined(words), [true, false]);
    }
}
