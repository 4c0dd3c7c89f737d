//! Value keys: a text key per expression, equal for expressions that compute the same value.

use crate::access::affine;
use crate::ir::{Cond, Expr, Idx};

/// A text key equal for expressions that compute the same value: variables bound by
/// reductions inside `e` are numbered by binding order, so two copies of one inlined reduction
/// (each given fresh loop variables) have the same key.
pub fn value_key(e: &Expr) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DType;

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
}
