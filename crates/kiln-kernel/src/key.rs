//! Value keys: a key per expression, equal for expressions that compute the same value.

use crate::access::affine;
use crate::ir::{Cond, Ew, Expr, Idx};
use kiln_ir::{Combiner, DType};
use std::fmt;

/// A key equal for expressions that compute the same value (see [`value_key`]); its text form
/// (`Display`) is what the verifier names a run-time value by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueKey(Node);

/// A loop variable in a key: bound by the `k`-th reduction variable around it (counted from
/// the key's root), or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Var {
    Bound(usize),
    Free(usize),
}

/// An expression node of a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Node {
    Load {
        input: usize,
        dtype: DType,
        off: i64,
        /// The nonzero coefficients, by variable.
        terms: Vec<(Var, i64)>,
    },
    Iota(Var, DType),
    Index(DType, Index),
    /// The bits of the value.
    Const(DType, u64),
    Op(Ew, DType, Vec<Node>),
    Reduce {
        kind: Combiner,
        dtype: DType,
        init: Box<Node>,
        vars: Vec<(Var, usize)>,
        body: Box<Node>,
    },
    Gather {
        input: usize,
        dtype: DType,
        strides: Vec<i64>,
        index: Vec<Index>,
    },
    Guard(Vec<Condition>, Box<Node>, Box<Node>),
    Fold {
        inits: Vec<Node>,
        vars: Vec<(Var, usize)>,
        elems: Vec<Node>,
        body: Vec<Node>,
        result: usize,
        in_order: bool,
    },
    Arg(usize, DType),
}

/// An index expression of a key: affine ones by their merged terms, so that sums with zeros
/// (`((v0 + 0) + 0)`, what inlining leaves) do not make equal values look different.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Index {
    /// `Σ k * var + c`, one term per variable, none zero, in variable order.
    Affine(Vec<(Var, i64)>, i64),
    Add(Vec<Index>),
    Mul(Box<Index>, i64),
    Div(Box<Index>, i64),
    Clamp(Box<Index>, i64, i64),
    Value(Box<Node>),
}

/// A guard's condition in a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Condition {
    InRange(Index, i64, i64),
    Divisible(Index, i64),
}

/// The key of `e`: equal for expressions that compute the same value, variables bound by
/// reductions inside `e` numbered by binding order, so two copies of one inlined reduction
/// (each given fresh loop variables) have the same key.
pub fn value_key(e: &Expr) -> ValueKey {
    ValueKey(node(e, &mut Vec::new()))
}

/// Variable `v` with the reduction variables `bound` around it.
fn var(v: usize, bound: &[usize]) -> Var {
    match bound.iter().rposition(|&b| b == v) {
        Some(k) => Var::Bound(k),
        None => Var::Free(v),
    }
}

fn node(e: &Expr, bound: &mut Vec<usize>) -> Node {
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => Node::Load {
            input: *input,
            dtype: *dtype,
            off: *off,
            terms: (coef.iter().enumerate())
                .filter(|c| *c.1 != 0)
                .map(|(v, c)| (var(v, bound), *c))
                .collect(),
        },
        Expr::Iota { var: v, dtype } => Node::Iota(var(*v, bound), *dtype),
        Expr::Index { idx, dtype } => Node::Index(*dtype, index(idx, bound)),
        Expr::Const { dtype, value } => Node::Const(*dtype, value.to_bits()),
        Expr::Op { op, dtype, args } => Node::Op(
            op.clone(),
            *dtype,
            args.iter().map(|a| node(a, bound)).collect(),
        ),
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => {
            let init = Box::new(node(init, bound));
            let depth = bound.len();
            let vars = vars
                .iter()
                .map(|&(v, n)| {
                    bound.push(v);
                    (var(v, bound), n)
                })
                .collect();
            let body = Box::new(node(body, bound));
            bound.truncate(depth);
            Node::Reduce {
                kind: *kind,
                dtype: *dtype,
                init,
                vars,
                body,
            }
        }
        Expr::Gather {
            input,
            dtype,
            index: at,
            strides,
        } => Node::Gather {
            input: *input,
            dtype: *dtype,
            strides: strides.clone(),
            index: at.iter().map(|i| index(i, bound)).collect(),
        },
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            let conds = conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, lo, hi) => Condition::InRange(index(i, bound), *lo, *hi),
                    Cond::Divisible(i, d) => Condition::Divisible(index(i, bound), *d),
                })
                .collect();
            let then = Box::new(node(then, bound));
            Node::Guard(conds, then, Box::new(node(otherwise, bound)))
        }
        Expr::Fold { fold, result } => {
            let inits = fold.inits.iter().map(|x| node(x, bound)).collect();
            let depth = bound.len();
            let vars = (fold.vars.iter())
                .map(|&(v, n)| {
                    bound.push(v);
                    (var(v, bound), n)
                })
                .collect();
            let elems = fold.elems.iter().map(|x| node(x, bound)).collect();
            bound.truncate(depth);
            let body = fold.body.iter().map(|x| node(x, bound)).collect();
            Node::Fold {
                inits,
                vars,
                elems,
                body,
                result: *result,
                in_order: fold.in_order,
            }
        }
        Expr::Arg { slot, dtype } => Node::Arg(*slot, *dtype),
    }
}

fn index(i: &Idx, bound: &mut Vec<usize>) -> Index {
    if let Some((terms, c)) = affine(i) {
        let mut merged: Vec<(Var, i64)> = Vec::new();
        for (v, k) in terms {
            let v = var(v, bound);
            match merged.iter_mut().find(|t| t.0 == v) {
                Some(t) => t.1 += k,
                None => merged.push((v, k)),
            }
        }
        merged.retain(|t| t.1 != 0);
        merged.sort_unstable();
        return Index::Affine(merged, c);
    }
    let sub = |x: &Idx, bound: &mut Vec<usize>| Box::new(index(x, bound));
    match i {
        Idx::Add(xs) => Index::Add(xs.iter().map(|x| index(x, bound)).collect()),
        Idx::Mul(x, c) => Index::Mul(sub(x, bound), *c),
        Idx::Div(x, c) => Index::Div(sub(x, bound), *c),
        Idx::Clamp(x, lo, hi) => Index::Clamp(sub(x, bound), *lo, *hi),
        Idx::Value(e) => Index::Value(Box::new(node(e, bound))),
        Idx::Var(_) | Idx::Const(_) => unreachable!("variables and constants are affine"),
    }
}

impl fmt::Display for ValueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Var::Bound(k) => write!(f, "b{k}"),
            Var::Free(v) => write!(f, "v{v}"),
        }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Load {
                input,
                dtype,
                off,
                terms,
            } => {
                write!(f, "L{input}:{dtype}:{off}[")?;
                for (v, c) in terms {
                    write!(f, "{v}*{c},")?;
                }
                write!(f, "]")
            }
            Node::Iota(v, dtype) => write!(f, "I{v}:{dtype}"),
            Node::Index(dtype, i) => write!(f, "X{dtype}({i})"),
            Node::Const(dtype, bits) => write!(f, "C{dtype}:{bits:x}"),
            Node::Op(op, dtype, args) => {
                write!(f, "O{op:?}:{dtype}(")?;
                for a in args {
                    write!(f, "{a},")?;
                }
                write!(f, ")")
            }
            Node::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } => {
                write!(f, "R{kind:?}:{dtype}({init}")?;
                for (v, n) in vars {
                    write!(f, ";{v}<{n}")?;
                }
                write!(f, "|{body})")
            }
            Node::Gather {
                input,
                dtype,
                strides,
                index,
            } => {
                write!(f, "G{input}:{dtype}:{strides:?}(")?;
                for i in index {
                    write!(f, "{i},")?;
                }
                write!(f, ")")
            }
            Node::Guard(conds, then, otherwise) => {
                write!(f, "W(")?;
                for c in conds {
                    match c {
                        Condition::InRange(i, lo, hi) => write!(f, "in{lo}:{hi}:{i},")?,
                        Condition::Divisible(i, d) => write!(f, "div{d}:{i},")?,
                    }
                }
                write!(f, "{then}?{otherwise})")
            }
            Node::Fold {
                inits,
                vars,
                elems,
                body,
                result,
                in_order,
            } => {
                let o = if *in_order { "o" } else { "" };
                write!(f, "F{o}{result}(")?;
                for x in inits {
                    write!(f, "{x},")?;
                }
                for (v, n) in vars {
                    write!(f, ";{v}<{n}")?;
                }
                write!(f, "|")?;
                for x in elems {
                    write!(f, "{x},")?;
                }
                write!(f, "|")?;
                for x in body {
                    write!(f, "{x},")?;
                }
                write!(f, ")")
            }
            Node::Arg(slot, dtype) => write!(f, "A{slot}:{dtype}"),
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Index::Affine(terms, c) => {
                // By the variables' names, as the text form always had them.
                let mut named: Vec<(String, i64)> =
                    terms.iter().map(|(v, k)| (v.to_string(), *k)).collect();
                named.sort();
                write!(f, "a(")?;
                for (name, k) in named {
                    write!(f, "{name}*{k},")?;
                }
                write!(f, "{c})")
            }
            Index::Add(xs) => {
                write!(f, "+(")?;
                for x in xs {
                    write!(f, "{x},")?;
                }
                write!(f, ")")
            }
            Index::Mul(x, c) => write!(f, "*({x},{c})"),
            Index::Div(x, c) => write!(f, "/({x},{c})"),
            Index::Clamp(x, lo, hi) => write!(f, "c({x},{lo},{hi})"),
            Index::Value(e) => write!(f, "v({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{ComparisonDirection, OpKind};

    /// The text keys [`value_key`] built before it built structures: the reference its
    /// `Display` and its equality are checked against.
    /// A text key equal for expressions that compute the same value: variables bound by
    /// reductions inside `e` are numbered by binding order, so two copies of one inlined reduction
    /// (each given fresh loop variables) have the same key.
    fn text_key(e: &Expr) -> String {
        let mut s = String::new();
        key_expr(e, &mut Vec::new(), &mut s);
        s
    }

    fn key_var(v: usize, bound: &[usize]) -> String {
        match bound.iter().rposition(|&b| b == v) {
            Some(k) => format!("b{k}"),
            None => format!("v{v}"),
        }
    }

    fn key_expr(e: &Expr, bound: &mut Vec<usize>, s: &mut String) {
        use std::fmt::Write as _;
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => {
                let _ = write!(s, "L{input}:{dtype}:{off}[");
                for (v, c) in coef.iter().enumerate().filter(|c| *c.1 != 0) {
                    let _ = write!(s, "{}*{c},", key_var(v, bound));
                }
                s.push(']');
            }
            Expr::Iota { var, dtype } => {
                let _ = write!(s, "I{}:{dtype}", key_var(*var, bound));
            }
            Expr::Index { idx, dtype } => {
                let _ = write!(s, "X{dtype}(");
                key_idx(idx, bound, s);
                s.push(')');
            }
            Expr::Const { dtype, value } => {
                let _ = write!(s, "C{dtype}:{:x}", value.to_bits());
            }
            Expr::Op { op, dtype, args } => {
                let _ = write!(s, "O{op:?}:{dtype}(");
                for a in args {
                    key_expr(a, bound, s);
                    s.push(',');
                }
                s.push(')');
            }
            Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } => {
                let _ = write!(s, "R{kind:?}:{dtype}(");
                key_expr(init, bound, s);
                let depth = bound.len();
                for &(v, n) in vars {
                    bound.push(v);
                    let _ = write!(s, ";{}<{n}", key_var(v, bound));
                }
                s.push('|');
                key_expr(body, bound, s);
                bound.truncate(depth);
                s.push(')');
            }
            Expr::Gather {
                input,
                dtype,
                index,
                strides,
            } => {
                let _ = write!(s, "G{input}:{dtype}:{strides:?}(");
                for i in index {
                    key_idx(i, bound, s);
                    s.push(',');
                }
                s.push(')');
            }
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                s.push_str("W(");
                for c in conds {
                    match c {
                        Cond::InRange(i, lo, hi) => {
                            let _ = write!(s, "in{lo}:{hi}:");
                            key_idx(i, bound, s);
                        }
                        Cond::Divisible(i, d) => {
                            let _ = write!(s, "div{d}:");
                            key_idx(i, bound, s);
                        }
                    }
                    s.push(',');
                }
                key_expr(then, bound, s);
                s.push('?');
                key_expr(otherwise, bound, s);
                s.push(')');
            }
            Expr::Fold { fold, result } => {
                let o = if fold.in_order { "o" } else { "" };
                let _ = write!(s, "F{o}{result}(");
                for x in &fold.inits {
                    key_expr(x, bound, s);
                    s.push(',');
                }
                let depth = bound.len();
                for &(v, n) in &fold.vars {
                    bound.push(v);
                    let _ = write!(s, ";{}<{n}", key_var(v, bound));
                }
                s.push('|');
                for x in &fold.elems {
                    key_expr(x, bound, s);
                    s.push(',');
                }
                bound.truncate(depth);
                s.push('|');
                for x in &fold.body {
                    key_expr(x, bound, s);
                    s.push(',');
                }
                s.push(')');
            }
            Expr::Arg { slot, dtype } => {
                let _ = write!(s, "A{slot}:{dtype}");
            }
        }
    }

    fn key_idx(i: &Idx, bound: &mut Vec<usize>, s: &mut String) {
        use std::fmt::Write as _;
        // An affine index by its terms: inlining a producer wraps its indices in sums with zeros
        // (`((v0 + 0) + 0)`), which must not make equal values look different.
        if let Some((terms, c)) = affine(i) {
            let mut merged: Vec<(String, i64)> = Vec::new();
            for (v, k) in terms {
                let name = key_var(v, bound);
                match merged.iter_mut().find(|t| t.0 == name) {
                    Some(t) => t.1 += k,
                    None => merged.push((name, k)),
                }
            }
            merged.retain(|t| t.1 != 0);
            merged.sort();
            s.push_str("a(");
            for (name, k) in merged {
                let _ = write!(s, "{name}*{k},");
            }
            let _ = write!(s, "{c})");
            return;
        }
        match i {
            Idx::Var(v) => s.push_str(&key_var(*v, bound)),
            Idx::Const(c) => {
                let _ = write!(s, "{c}");
            }
            Idx::Add(xs) => {
                s.push_str("+(");
                for x in xs {
                    key_idx(x, bound, s);
                    s.push(',');
                }
                s.push(')');
            }
            Idx::Mul(x, c) => {
                s.push_str("*(");
                key_idx(x, bound, s);
                let _ = write!(s, ",{c})");
            }
            Idx::Div(x, c) => {
                s.push_str("/(");
                key_idx(x, bound, s);
                let _ = write!(s, ",{c})");
            }
            Idx::Clamp(x, lo, hi) => {
                s.push_str("c(");
                key_idx(x, bound, s);
                let _ = write!(s, ",{lo},{hi})");
            }
            Idx::Value(e) => {
                s.push_str("v(");
                key_expr(e, bound, s);
                s.push(')');
            }
        }
    }

    /// Inlined producers wrap indices in sums with zeros; equal values keep equal keys.
    #[test]
    fn value_keys_see_through_zero_sums() {
        let gather = |index: Idx| Expr::Gather {
            input: 1,
            dtype: DType::F32,
            index: vec![index],
            strides: vec![1],
        };
        let plain = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), 1024), Idx::Var(1)]);
        let wrapped = Idx::Add(vec![
            Idx::Const(0),
            Idx::Mul(
                Box::new(Idx::Add(vec![
                    Idx::Add(vec![Idx::Var(0), Idx::Const(0)]),
                    Idx::Const(0),
                ])),
                1024,
            ),
            Idx::Mul(Box::new(Idx::Var(1)), 1),
        ]);
        assert_eq!(
            value_key(&gather(plain.clone())),
            value_key(&gather(wrapped))
        );
        let other = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), 1024), Idx::Var(2)]);
        assert_ne!(value_key(&gather(plain)), value_key(&gather(other)));
    }

    /// The text form is the text key of old, and keys are equal exactly where text keys were.
    #[test]
    fn keys_print_and_compare_as_text_keys_did() {
        let f32 = DType::F32;
        let load = |input: usize, coef: Vec<i64>| Expr::Load {
            input,
            dtype: f32,
            coef,
            off: 3,
        };
        let reduce = |v: usize, body: Expr| Expr::Reduce {
            kind: Combiner::Max,
            dtype: f32,
            init: Box::new(Expr::Const {
                dtype: f32,
                value: f64::NEG_INFINITY,
            }),
            vars: vec![(v, 8)],
            body: Box::new(body),
        };
        let guarded = |i: Idx| Expr::Guard {
            conds: vec![
                Cond::InRange(i.clone(), 0, 4),
                Cond::Divisible(Idx::Div(Box::new(i.clone()), 2), 2),
            ],
            then: Box::new(Expr::Gather {
                input: 0,
                dtype: f32,
                index: vec![
                    i.clone(),
                    Idx::Clamp(Box::new(Idx::Value(Box::new(load(2, vec![0, 1])))), 0, 7),
                ],
                strides: vec![8, 1],
            }),
            otherwise: Box::new(Expr::Index {
                idx: Idx::Add(vec![Idx::Var(12), Idx::Var(3), Idx::Mul(Box::new(i), -1)]),
                dtype: DType::I64,
            }),
        };
        let exprs = vec![
            load(0, vec![1, 0, 16]),
            load(1, vec![1, 0, 16]),
            reduce(5, load(0, vec![16, 0, 0, 0, 0, 1])),
            reduce(9, load(0, vec![16, 0, 0, 0, 0, 0, 0, 0, 0, 1])),
            reduce(9, load(0, vec![16, 0, 0, 0, 0, 0, 0, 0, 0, 2])),
            Expr::Op {
                op: Ew::Cmp(ComparisonDirection::Lt),
                dtype: DType::Pred,
                args: vec![
                    Expr::Iota {
                        var: 1,
                        dtype: DType::I64,
                    },
                    reduce(4, Expr::Iota { var: 4, dtype: f32 }),
                ],
            },
            Expr::Op {
                op: Ew::Kind(OpKind::Exponential),
                dtype: f32,
                args: vec![guarded(Idx::Add(vec![Idx::Var(0), Idx::Const(-1)]))],
            },
            guarded(Idx::Add(vec![Idx::Var(0), Idx::Const(-1)])),
            guarded(Idx::Add(vec![Idx::Const(-1), Idx::Var(0), Idx::Const(0)])),
            guarded(Idx::Var(11)),
        ];
        for a in &exprs {
            assert_eq!(value_key(a).to_string(), text_key(a));
            for b in &exprs {
                assert_eq!(value_key(a) == value_key(b), text_key(a) == text_key(b));
            }
        }
    }
}
