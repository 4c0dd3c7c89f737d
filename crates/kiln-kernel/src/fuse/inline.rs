//! Inlining: a producer's body moved into a consumer's at the consumer's index, its loop
//! variables and inputs renumbered.

use super::Fused;
use crate::ir::{Expr, Idx, Rewriter};
use kiln_ir::{DType, Func, ValueId, strides};

/// Rewrites one consumer body, inlining producers and renumbering inputs.
pub(super) struct Inline<'a> {
    pub(super) f: &'a Func,
    pub(super) fused: &'a Fused,
    pub(super) producer: &'a [Option<usize>],
    /// The consumer's operands (its unfused kernel's inputs).
    pub(super) old_inputs: &'a [ValueId],
    /// The fused kernel's inputs, built up.
    pub(super) inputs: &'a mut Vec<ValueId>,
    pub(super) members: &'a mut Vec<usize>,
    pub(super) extents: &'a [usize],
    /// The first loop variable not yet used by the fused kernel (inlined reductions bring
    /// loop variables of their own).
    pub(super) next_var: usize,
}

impl Inline<'_> {
    /// The fused input index of value `v`.
    fn input(&mut self, v: ValueId) -> usize {
        match self.inputs.iter().position(|&x| x == v) {
            Some(p) => p,
            None => {
                self.inputs.push(v);
                self.inputs.len() - 1
            }
        }
    }

    /// The producer of the consumer's input `j`, when it is inlined.
    fn inlined(&self, j: usize) -> Option<usize> {
        let p = self.producer[self.old_inputs[j].index()]?;
        self.fused.inlined[p].then_some(p)
    }
}

/// Inlined producers replace the loads and gathers of their results; everything else is
/// rebuilt around them.
impl Rewriter for Inline<'_> {
    fn expr(&mut self, e: &Expr) -> Expr {
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => match self.inlined(*input) {
                Some(p) => {
                    let shape = &self.f.values[self.old_inputs[*input].index()].shape;
                    let terms: Vec<(usize, i64)> = coef
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| **c != 0)
                        .map(|(v, c)| (v, *c))
                        .collect();
                    let index = split_flat(&terms, *off, shape, self.extents);
                    self.producer_at(p, &index)
                }
                None => Expr::Load {
                    input: self.input(self.old_inputs[*input]),
                    dtype: *dtype,
                    coef: coef.clone(),
                    off: *off,
                },
            },
            Expr::Gather {
                input,
                dtype,
                index,
                strides: st,
            } => {
                let index: Vec<Idx> = index.iter().map(|i| self.idx(i)).collect();
                match self.inlined(*input) {
                    Some(p) => {
                        let shape = &self.f.values[self.old_inputs[*input].index()].shape;
                        let own: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
                        let at = if *st == own {
                            index
                        } else {
                            let flat = Idx::Add(
                                index
                                    .into_iter()
                                    .zip(st)
                                    .map(|(i, &s)| Idx::Mul(Box::new(i), s))
                                    .collect(),
                            );
                            unflatten(flat, shape)
                        };
                        self.producer_at(p, &at)
                    }
                    None => Expr::Gather {
                        input: self.input(self.old_inputs[*input]),
                        dtype: *dtype,
                        index,
                        strides: st.clone(),
                    },
                }
            }
            _ => e.map_children(self),
        }
    }
}

impl Inline<'_> {
    /// Producer `p`'s fused body at output position `at` (one index per dimension), its
    /// inputs renumbered into the consumer's.
    fn producer_at(&mut self, p: usize, at: &[Idx]) -> Expr {
        let pk = self.fused.kernels[p]
            .as_ref()
            .expect("an inlined producer has a kernel");
        let map: Vec<usize> = self.fused.operands[p]
            .iter()
            .map(|&v| self.input(v))
            .collect();
        self.members.extend(self.fused.members[p].iter().copied());
        self.members.push(p);
        let base = self.next_var;
        self.next_var += pk.vars - pk.out.rank();
        let body = Subst {
            at,
            map: &map,
            base,
        }
        .expr(&pk.body);
        match pk.out.dtype {
            // The producer's kernel would have rounded its f32 result on store.
            DType::F16 | DType::BF16 => Expr::Op {
                op: crate::ir::Ew::Narrow,
                dtype: pk.out.dtype,
                args: vec![body],
            },
            _ => body,
        }
    }
}

/// How a producer body moves into a consumer: its output variable `d` becomes `at[d]`, its
/// other (reduction) variables `at.len() + i` become `base + i`, and its input `j` becomes
/// input `map[j]`.
struct Subst<'a> {
    at: &'a [Idx],
    map: &'a [usize],
    base: usize,
}

impl Subst<'_> {
    /// The consumer variable standing for producer reduction variable `v`.
    fn var(&self, v: usize) -> usize {
        v - self.at.len() + self.base
    }
}

/// A producer body moved into a consumer: loads become gathers at the consumer's index,
/// iotas of output variables its index expressions, and reduction variables are renumbered.
impl Rewriter for Subst<'_> {
    fn expr(&mut self, e: &Expr) -> Expr {
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => {
                let mut terms = vec![Idx::Const(*off)];
                for (d, &c) in coef.iter().enumerate() {
                    if c != 0 {
                        let v = self.idx(&Idx::Var(d));
                        terms.push(Idx::Mul(Box::new(v), c));
                    }
                }
                Expr::Gather {
                    input: self.map[*input],
                    dtype: *dtype,
                    index: vec![Idx::Add(terms)],
                    strides: vec![1],
                }
            }
            Expr::Gather { input, .. } => {
                let mut g = e.map_children(self);
                if let Expr::Gather { input: i, .. } = &mut g {
                    *i = self.map[*input];
                }
                g
            }
            Expr::Iota { var, dtype } if *var < self.at.len() => Expr::Index {
                idx: self.at[*var].clone(),
                dtype: *dtype,
            },
            Expr::Iota { var, dtype } => Expr::Iota {
                var: self.var(*var),
                dtype: *dtype,
            },
            Expr::Reduce { .. } => {
                let mut r = e.map_children(self);
                if let Expr::Reduce { vars, .. } = &mut r {
                    for v in vars {
                        v.0 = self.var(v.0);
                    }
                }
                r
            }
            Expr::Fold { .. } => {
                let mut r = e.map_children(self);
                if let Expr::Fold { fold, .. } = &mut r {
                    for v in &mut fold.vars {
                        v.0 = self.var(v.0);
                    }
                }
                r
            }
            _ => e.map_children(self),
        }
    }

    fn idx(&mut self, i: &Idx) -> Idx {
        match i {
            Idx::Var(d) if *d < self.at.len() => self.at[*d].clone(),
            Idx::Var(d) => Idx::Var(self.var(*d)),
            _ => i.map_children(self),
        }
    }
}

/// The position in `shape` of flat element `off + Σ c * var` (vars ranging over `extents`):
/// per dimension an affine expression of the variables when the terms split exactly between
/// dimensions without carries (broadcasts, transposes, slices, reshapes that keep dimensions),
/// otherwise by division and remainder of the flat index.
fn split_flat(terms: &[(usize, i64)], off: i64, shape: &[usize], extents: &[usize]) -> Vec<Idx> {
    // A variable with one value (a batch of one) is always zero: its term adds nothing, and
    // keeping it would defeat the exact split (its coefficient fits no dimension).
    let terms: Vec<(usize, i64)> = terms
        .iter()
        .copied()
        .filter(|&(v, _)| extents.get(v) != Some(&1))
        .collect();
    let terms = &terms[..];
    let st: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    let rank = shape.len();
    let mut parts: Vec<Vec<(usize, i64)>> = vec![Vec::new(); rank];
    let mut offs = vec![0i64; rank];
    let mut exact = off >= 0;
    // Each term goes to the outermost dimension whose stride divides its coefficient.
    for &(v, c) in terms {
        match (0..rank)
            .find(|&d| st[d] != 0 && c % st[d] == 0 && (c / st[d]).abs() < shape[d] as i64)
        {
            Some(d) => parts[d].push((v, c / st[d])),
            None => exact = false,
        }
    }
    let mut rest = off.max(0);
    for d in 0..rank {
        if st[d] > 0 {
            offs[d] = rest / st[d];
            rest %= st[d];
        }
    }
    exact &= rest == 0;
    if exact {
        for d in 0..rank {
            let (mut lo, mut hi) = (offs[d], offs[d]);
            for &(v, c) in &parts[d] {
                let e = extents.get(v).copied().unwrap_or(1) as i64 - 1;
                if c > 0 {
                    hi += c * e;
                } else {
                    lo += c * e;
                }
            }
            if lo < 0 || hi >= shape[d] as i64 {
                exact = false;
            }
        }
    }
    if exact {
        return (0..rank)
            .map(|d| {
                let mut xs: Vec<Idx> = parts[d]
                    .iter()
                    .map(|&(v, c)| {
                        if c == 1 {
                            Idx::Var(v)
                        } else {
                            Idx::Mul(Box::new(Idx::Var(v)), c)
                        }
                    })
                    .collect();
                if offs[d] != 0 || xs.is_empty() {
                    xs.push(Idx::Const(offs[d]));
                }
                if xs.len() == 1 {
                    xs.pop().expect("one term")
                } else {
                    Idx::Add(xs)
                }
            })
            .collect();
    }
    let mut flat = vec![Idx::Const(off)];
    flat.extend(
        terms
            .iter()
            .map(|&(v, c)| Idx::Mul(Box::new(Idx::Var(v)), c)),
    );
    unflatten(Idx::Add(flat), shape)
}

/// The position in `shape` of the (in-range) flat index `flat`, by division and remainder.
fn unflatten(flat: Idx, shape: &[usize]) -> Vec<Idx> {
    let st: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    (0..shape.len())
        .map(|d| {
            let q = Idx::Div(Box::new(flat.clone()), st[d].max(1));
            if d == 0 {
                q
            } else {
                // q mod shape[d] = q - (flat / st[d - 1]) * shape[d].
                let outer = Idx::Div(Box::new(flat.clone()), st[d - 1].max(1));
                Idx::Add(vec![q, Idx::Mul(Box::new(outer), -(shape[d] as i64))])
            }
        })
        .collect()
}
