//! The kernel verifier: checks that a kernel is well formed before a backend renders it.
//!
//! - Every loop variable an expression uses is defined where it is used (an output variable
//!   of the kernel's index space, or a variable bound by an enclosing reduction) and below the
//!   kernel's variable count; reductions bind fresh variables only (not an output variable, not
//!   one an enclosing reduction binds).
//! - Every read names an input the kernel has, and stays inside that input's buffer at every
//!   position the loop nest reaches: index maps are evaluated over the loop extents as
//!   intervals, narrowed by the conditions of the guards around them, and both the flat
//!   element and (for gathers at the input's own strides) each dimension's index are checked.
//! - Dtypes agree: operands of elementwise ops with their results (comparisons produce `pred`,
//!   `select`'s condition is `pred`, a bitcast keeps the width), reductions' starting values
//!   and bodies with the reduction, guards' branches with each other, loads with their inputs,
//!   index values are integers, and the body with the output.
//! - Ops have their arity, and schedules agree with the kernel: a GEMM's sizes with its
//!   output, inputs and convolution patches, a chained product's with its B, an epilogue reads
//!   the product as the input after the kernel's inputs, extra outputs have the kernel's shape
//!   and the pointer slots after its inputs, scatters' targets have the output's rank.
//!
//! Errors name the kernel (its instruction and op, when the program is known), the part of it
//! and the path of expression nodes down to the offending one, and the problem.
//! [`debug_check`] runs it after lowering and after fusion in tests and debug builds.

use crate::fuse::Fused;
use crate::ir::{Cond, Ew, Expr, Fold, Idx, Kernel, Schedule, visit};
use crate::key::value_key;
use kiln_ir::{DType, Func, OpKind, Props, TensorType, strides};
use std::fmt;

mod gemm;
mod unread;

/// What is wrong with a kernel, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelError {
    /// The kernel: `k8 (#8 divide)` when the program is known, else empty.
    pub kernel: String,
    /// The part of the kernel (`body`, `extra output 0`, `schedule`, ...) and the path of
    /// expression nodes from its root to the offending one (`body > divide f32 > load in1`).
    pub at: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("kernel")?;
        if !self.kernel.is_empty() {
            write!(f, " {}", self.kernel)?;
        }
        if !self.at.is_empty() {
            write!(f, ", at {}", self.at)?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl std::error::Error for KernelError {}

type Res<T = ()> = Result<T, KernelError>;

/// An interval of integers, both ends included; `None` where nothing runs (an empty loop, a
/// guard that never holds).
type Range = Option<(i128, i128)>;

fn add(a: Range, b: Range) -> Range {
    let (a, b) = (a?, b?);
    Some((a.0.saturating_add(b.0), a.1.saturating_add(b.1)))
}

fn scale(a: Range, k: i128) -> Range {
    let (lo, hi) = a?;
    let (x, y) = (lo.saturating_mul(k), hi.saturating_mul(k));
    Some((x.min(y), x.max(y)))
}

fn meet(a: Range, b: Range) -> Range {
    let (a, b) = (a?, b?);
    let r = (a.0.max(b.0), a.1.min(b.1));
    (r.0 <= r.1).then_some(r)
}

fn show(r: (i128, i128)) -> String {
    format!("{}..={}", r.0, r.1)
}

/// A term of a linear index form: a loop variable, or a non-linear part taken as a whole.
#[derive(Clone, Debug)]
enum Atom {
    Var(usize),
    /// `x / d` (truncating).
    Div(Box<Lin>, i64),
    /// `clamp(x, lo, hi)`.
    Clamp(Box<Lin>, i64, i64),
    /// `x / d - (x / (d n)) * n`: the remainder of `x / d` by `n`, as unflattening writes it.
    Rem(Box<Lin>, i64, i64),
    /// A run-time value of an integer dtype.
    Value(DType),
}

/// `Σ coef * atom + c`, terms keyed by a canonical text of their atom (sorted, merged, no
/// zero coefficients).
#[derive(Clone, Debug)]
struct Lin {
    terms: Vec<(String, Atom, i128)>,
    c: i128,
}

impl Lin {
    fn constant(c: i128) -> Lin {
        Lin {
            terms: Vec::new(),
            c,
        }
    }

    fn atom(key: String, a: Atom) -> Lin {
        Lin {
            terms: vec![(key, a, 1)],
            c: 0,
        }
    }

    fn key(&self) -> String {
        let mut s = String::new();
        for (k, _, c) in &self.terms {
            s.push_str(&format!("{c}*{k}+"));
        }
        s.push_str(&self.c.to_string());
        s
    }

    fn plus(mut self, other: &Lin, k: i128) -> Lin {
        self.c = self.c.saturating_add(other.c.saturating_mul(k));
        for (key, a, c) in &other.terms {
            match self.terms.iter_mut().find(|t| t.0 == *key) {
                Some(t) => t.2 = t.2.saturating_add(c.saturating_mul(k)),
                None => self
                    .terms
                    .push((key.clone(), a.clone(), c.saturating_mul(k))),
            }
        }
        self.terms.retain(|t| t.2 != 0);
        self.terms.sort_by(|a, b| a.0.cmp(&b.0));
        self
    }

    fn coef(&self, key: &str) -> i128 {
        self.terms.iter().find(|t| t.0 == key).map_or(0, |t| t.2)
    }

    /// A factor `s` for which `self - s f` loses one of `f`'s terms (a loop variable if it
    /// can), when there is one.
    fn cancelling(&self, f: &Lin) -> Option<i128> {
        let factor = |(key, _, c): &(String, Atom, i128)| {
            let mine = self.coef(key);
            (mine != 0 && mine % c == 0).then(|| mine / c)
        };
        let vars = f.terms.iter().filter(|t| matches!(t.1, Atom::Var(_)));
        let others = f.terms.iter().filter(|t| !matches!(t.1, Atom::Var(_)));
        vars.chain(others).find_map(factor)
    }

    /// `s` when every term of `f` is in `self` with `s` times its coefficient.
    fn multiple_of(&self, f: &Lin) -> Option<i128> {
        let (key, _, c) = f.terms.first()?;
        let mine = self.coef(key);
        if mine == 0 || mine % c != 0 {
            return None;
        }
        let s = mine / c;
        f.terms
            .iter()
            .all(|(k, _, c)| self.coef(k) == s.saturating_mul(*c))
            .then_some(s)
    }
}

/// `lo <= f <= hi` as `n` in a range, `n` the terms of `f` divided by their greatest common
/// divisor, the first one's coefficient positive (`None` for a constant `f`).
fn normalized(f: &Lin, lo: i128, hi: i128) -> Option<(Lin, Range)> {
    fn gcd(a: i128, b: i128) -> i128 {
        if b == 0 { a.abs() } else { gcd(b, a % b) }
    }
    let first = f.terms.first()?.2;
    let g = f.terms.iter().fold(0, |g, t| gcd(g, t.2)).max(1);
    let k = if first < 0 { -g } else { g };
    // f = k n + c, so n = (f - c) / k.
    let (lo, hi) = (lo.saturating_sub(f.c), hi.saturating_sub(f.c));
    let (lo, hi) = if k > 0 {
        (lo, hi)
    } else {
        (hi.saturating_neg(), lo.saturating_neg())
    };
    let g = k.abs();
    let r = (
        lo.div_euclid(g) + i128::from(lo.rem_euclid(g) != 0),
        hi.div_euclid(g),
    );
    let n = Lin {
        terms: f
            .terms
            .iter()
            .map(|(key, a, c)| (key.clone(), a.clone(), c / k))
            .collect(),
        c: 0,
    };
    Some((n, (r.0 <= r.1).then_some(r)))
}

/// What a range of a dtype's values is.
fn dtype_range(d: DType) -> (i128, i128) {
    d.int_bounds()
        .unwrap_or((i64::MIN as i128, i64::MAX as i128))
}

/// A short name of an expression node for error paths.
fn node(e: &Expr) -> String {
    match e {
        Expr::Load { input, dtype, .. } => format!("load in{input} {dtype}"),
        Expr::Gather { input, dtype, .. } => format!("gather in{input} {dtype}"),
        Expr::Iota { var, dtype } => format!("iota {dtype} v{var}"),
        Expr::Index { dtype, .. } => format!("index {dtype}"),
        Expr::Const { dtype, .. } => format!("const {dtype}"),
        Expr::Op { op, dtype, .. } => format!("{} {dtype}", crate::print::ew_name(op)),
        Expr::Reduce { kind, dtype, .. } => format!("reduce {kind} {dtype}"),
        Expr::Guard { .. } => "guard".into(),
        Expr::Fold { fold, result } => format!("fold result {result} of {}", fold.arity()),
        Expr::Arg { slot, dtype } => format!("arg a{slot} {dtype}"),
    }
}

struct Checker<'a> {
    k: &'a Kernel,
    /// The number of inputs (the pointer slots of extra outputs follow them).
    ninputs: usize,
    /// The types of what the body may read: the inputs, then a GEMM epilogue's product.
    readable: Vec<TensorType>,
    /// Whether each input is read.
    read: Vec<bool>,
    /// Variables in scope with their extents, innermost last.
    bound: Vec<(usize, usize)>,
    /// How many of `bound` are the index space's (not bound by reductions).
    free: usize,
    /// What the enclosing guards' conditions say: `lo <= form <= hi`.
    facts: Vec<(Lin, i128, i128)>,
    /// Whether the enclosing guards' conditions never all hold (what is inside never runs, so
    /// its reads are not checked against the bounds).
    dead: bool,
    /// Atoms' ranges under the current variables and facts (cleared when they change).
    ranges: std::cell::RefCell<std::collections::HashMap<String, Range>>,
    /// Whether [`Checker::range`] is trying factors that leave part of a condition's form
    /// over; the ranges this needs use exact multiples only (a form inside a clamp could
    /// otherwise ask for the clamp's range again).
    inexact: std::cell::Cell<bool>,
    /// The part being checked, and the nodes from its root to the current one.
    part: String,
    path: Vec<String>,
    /// The dtypes of the arguments of the fold whose body is being checked (none outside).
    args: Vec<DType>,
}

impl Checker<'_> {
    fn err(&self, problem: impl Into<String>) -> KernelError {
        let mut at = self.part.clone();
        for p in &self.path {
            at.push_str(" > ");
            at.push_str(p);
        }
        KernelError {
            kernel: String::new(),
            at,
            problem: problem.into(),
        }
    }

    fn in_scope(&self) -> String {
        if self.bound.is_empty() {
            return "none".into();
        }
        let vs: Vec<String> = self
            .bound
            .iter()
            .map(|(v, n)| format!("v{v} < {n}"))
            .collect();
        vs.join(", ")
    }

    /// The extent of variable `v`, which must be in scope.
    fn var(&self, v: usize) -> Res<usize> {
        match self.bound.iter().rev().find(|b| b.0 == v) {
            Some(&(_, n)) => Ok(n),
            None => Err(self.err(format!(
                "loop variable v{v} is not defined here (in scope: {})",
                self.in_scope()
            ))),
        }
    }

    /// Checks `i` and returns its linear form.
    fn lin(&mut self, i: &Idx) -> Res<Lin> {
        Ok(match i {
            Idx::Var(v) => {
                self.var(*v)?;
                Lin::atom(format!("v{v}"), Atom::Var(*v))
            }
            Idx::Const(c) => Lin::constant(*c as i128),
            Idx::Add(xs) => {
                if let [Idx::Div(x, d), Idx::Mul(outer, m)] = &xs[..]
                    && let Idx::Div(y, dn) = &**outer
                    && x == y
                    && *m < 0
                    && *d > 0
                    && d.checked_mul(-m) == Some(*dn)
                {
                    let x = self.lin(x)?;
                    let key = format!("rem({}/{d},{})", x.key(), -m);
                    return Ok(Lin::atom(key, Atom::Rem(Box::new(x), *d, -m)));
                }
                let mut sum = Lin::constant(0);
                for x in xs {
                    sum = sum.plus(&self.lin(x)?, 1);
                }
                sum
            }
            Idx::Mul(x, c) => Lin::constant(0).plus(&self.lin(x)?, *c as i128),
            Idx::Div(x, d) => {
                if *d <= 0 {
                    return Err(self.err(format!(
                        "index `{}` divides by {d} (divisors are positive)",
                        crate::print::idx(i)
                    )));
                }
                let x = self.lin(x)?;
                if *d == 1 {
                    x
                } else if x.terms.is_empty() {
                    Lin::constant(x.c / *d as i128)
                } else {
                    Lin::atom(format!("({})/{d}", x.key()), Atom::Div(Box::new(x), *d))
                }
            }
            Idx::Clamp(x, lo, hi) => {
                if lo > hi {
                    return Err(self.err(format!(
                        "index `{}` clamps to an empty range",
                        crate::print::idx(i)
                    )));
                }
                let x = self.lin(x)?;
                let key = format!("clamp({},{lo},{hi})", x.key());
                Lin::atom(key, Atom::Clamp(Box::new(x), *lo, *hi))
            }
            Idx::Value(e) => {
                self.path.push("value".into());
                self.expr(e)?;
                if !e.dtype().is_int() {
                    return Err(self.err(format!(
                        "a run-time index must be an integer, got {}",
                        e.dtype()
                    )));
                }
                self.path.pop();
                Lin::atom(format!("value({})", value_key(e)), Atom::Value(e.dtype()))
            }
        })
    }

    /// Where atom `a` (keyed `key`) may be, given the loop extents and the guards around.
    fn atom_range(&self, key: &str, a: &Atom) -> Range {
        if let Some(r) = self.ranges.borrow().get(key) {
            return *r;
        }
        let base = match a {
            Atom::Var(v) => {
                let n = self
                    .bound
                    .iter()
                    .rev()
                    .find(|b| b.0 == *v)
                    .map_or(0, |b| b.1);
                (n > 0).then(|| (0, n as i128 - 1))
            }
            Atom::Div(x, d) => {
                let (lo, hi) = self.range(x)?;
                Some((lo / *d as i128, hi / *d as i128))
            }
            Atom::Clamp(x, lo, hi) => {
                let (a, b) = self.range(x)?;
                let (lo, hi) = (*lo as i128, *hi as i128);
                Some((a.clamp(lo, hi), b.clamp(lo, hi)))
            }
            Atom::Rem(x, d, n) => {
                let (lo, hi) = self.range(x)?;
                let n = *n as i128;
                if lo >= 0 {
                    Some((0, (n - 1).min(hi / *d as i128)))
                } else {
                    Some((-(n - 1), n - 1))
                }
            }
            Atom::Value(d) => Some(dtype_range(*d)),
        };
        let mut r = base;
        // Guards on this atom alone.
        for (f, lo, hi) in &self.facts {
            if let Some((n, fr)) = normalized(f, *lo, *hi)
                && let [(k, _, _)] = &n.terms[..]
                && k == key
            {
                r = meet(r, fr);
            }
        }
        self.ranges.borrow_mut().insert(key.to_string(), r);
        r
    }

    /// Forgets the atoms' ranges (the variables in scope or the facts changed).
    /// Checks fold `fold` (of which the node reads result `result`): one init, element and
    /// body expression per accumulator, of one dtype each; its variables bound like a
    /// reduction's around the elements; its body reading only its arguments and constants.
    fn fold(&mut self, fold: &Fold, result: usize) -> Res<()> {
        let k = fold.arity();
        if k == 0 || fold.elems.len() != k || fold.body.len() != k || result >= k {
            return Err(self.err(format!(
                "a fold of {k} inits, {} elements and {} body expressions, read at result                  {result}",
                fold.elems.len(),
                fold.body.len()
            )));
        }
        for (i, x) in fold.inits.iter().enumerate() {
            self.path.push(format!("init a{i}"));
            self.expr(x)?;
            self.path.pop();
        }
        let mark = self.bound.len();
        for &(v, n) in &fold.vars {
            if v >= self.k.vars {
                return Err(self.err(format!(
                    "binds v{v}, but the kernel has {} loop variables",
                    self.k.vars
                )));
            }
            if self.bound.iter().any(|b| b.0 == v) {
                return Err(self.err(format!("binds v{v} again")));
            }
            self.bound.push((v, n));
            self.changed();
        }
        for (i, x) in fold.elems.iter().enumerate() {
            self.path.push(format!("element a{}", k + i));
            self.expr(x)?;
            self.path.pop();
        }
        self.bound.truncate(mark);
        self.changed();
        let dtypes: Vec<DType> = fold.inits.iter().map(Expr::dtype).collect();
        for (i, (e, b)) in fold.elems.iter().zip(&fold.body).enumerate() {
            for (what, d) in [("element", e.dtype()), ("body", b.dtype())] {
                if d != dtypes[i] {
                    return Err(self.err(format!(
                        "the {what} of accumulator {i} is {d}, its init {}",
                        dtypes[i]
                    )));
                }
            }
        }
        let mut only_args = true;
        for b in &fold.body {
            visit(b, &mut |x| {
                only_args &= matches!(x, Expr::Op { .. } | Expr::Const { .. } | Expr::Arg { .. })
            });
        }
        if !only_args {
            return Err(self.err("a fold's body reads something other than its arguments"));
        }
        let saved = std::mem::replace(&mut self.args, dtypes.repeat(2));
        for (i, x) in fold.body.iter().enumerate() {
            self.path.push(format!("body a{i}"));
            let r = self.expr(x);
            self.path.pop();
            if let Err(e) = r {
                self.args = saved;
                return Err(e);
            }
        }
        self.args = saved;
        Ok(())
    }

    fn changed(&self) {
        self.ranges.borrow_mut().clear();
    }

    /// The sum of the ranges of `l`'s terms, each on its own.
    fn natural(&self, l: &Lin) -> Range {
        let mut r = Some((l.c, l.c));
        for (key, a, c) in &l.terms {
            r = add(r, scale(self.atom_range(key, a), *c));
        }
        r
    }

    /// Where `l` may be: its terms' ranges, and the guards' conditions on parts of it (a
    /// padded dimension `v - 1` inside `0 <= v - 1 < 3`).
    fn range(&self, l: &Lin) -> Range {
        let natural = self.natural(l);
        if self.facts.is_empty() {
            return natural;
        }
        // Conditions on the same form up to a factor and a constant (nested guards, a
        // guard's `else`) hold together.
        let mut facts: Vec<(String, Lin, Range)> = Vec::new();
        for (f, lo, hi) in self.facts.iter().rev() {
            let Some((n, r)) = normalized(f, *lo, *hi) else {
                continue;
            };
            let key = n.key();
            match facts.iter_mut().find(|x| x.0 == key) {
                Some(x) => x.2 = meet(x.2, r),
                None => facts.push((key, n, r)),
            }
        }
        // Each condition's form taken out of `l` in turn, innermost first, where `l` is a
        // multiple of it: `l = s f + rest` bounds `l` by `s` times the condition's range plus
        // `rest`'s.
        let mut rest = l.clone();
        let mut known = Some((0, 0));
        let mut used = vec![false; facts.len()];
        for (i, (_, f, r)) in facts.iter().enumerate() {
            if let Some(s) = rest.multiple_of(f) {
                rest = rest.plus(f, -s);
                known = add(known, scale(meet(*r, self.natural(f)), s));
                used[i] = true;
            }
        }
        let exact = add(known, self.natural(&rest));
        // The bound holds for any `s`, so each condition left over also takes out the multiple
        // of its form that cancels one of `rest`'s terms, a loop variable's if it can: with
        // one clamped start index c for two dimensions of a fused dynamic slice, `4 c + 3 v`
        // under `0 <= c + v < 3` is `3 (c + v) + c`. Both bounds hold, so both are kept.
        let mut bound = used.contains(&true).then_some(exact);
        if !self.inexact.get() && used.contains(&false) {
            self.inexact.set(true);
            let mut substituted = false;
            for (i, (_, f, r)) in facts.iter().enumerate() {
                if let Some(s) = (!used[i]).then(|| rest.cancelling(f)).flatten() {
                    rest = rest.plus(f, -s);
                    known = add(known, scale(meet(*r, self.natural(f)), s));
                    substituted = true;
                }
            }
            let b = add(known, self.natural(&rest));
            if substituted && b.is_some() {
                bound = Some(bound.map_or(b, |e| meet(e, b)));
            }
            self.inexact.set(false);
        }
        match bound {
            Some(b) => meet(natural, b),
            None => natural,
        }
    }

    /// Checks that a read of `elems` elements (of `ty`, as the read's dtype) at flat element
    /// `flat` stays inside.
    fn in_bounds(&self, flat: &Lin, elems: usize, ty: &TensorType, what: &str) -> Res {
        if !self.dead
            && let Some(r) = self.range(flat)
            && (r.0 < 0 || r.1 >= elems as i128)
        {
            return Err(self.err(format!(
                "{what} reads elements {} of an input of {elems} ({ty}): the index map leaves \
                 the buffer (loops: {})",
                show(r),
                self.in_scope()
            )));
        }
        Ok(())
    }

    /// The input a read names, its element count in the read's dtype, after checking both.
    fn input(&mut self, input: usize, dtype: DType) -> Res<(TensorType, usize)> {
        let Some(ty) = self.readable.get(input).cloned() else {
            return Err(self.err(format!(
                "reads input {input}, but the kernel has {} input(s){}",
                self.ninputs,
                if self.readable.len() > self.ninputs {
                    format!(" and the product as in{}", self.ninputs)
                } else {
                    String::new()
                }
            )));
        };
        if let Some(r) = self.read.get_mut(input) {
            *r = true;
        }
        // A read of bytes (a bitcast that copies bytes) may view any buffer as i8.
        if ty.dtype != dtype && dtype != DType::I8 {
            return Err(self.err(format!("reads {dtype} from in{input}, which holds {}", ty)));
        }
        Ok((ty.clone(), ty.numel() * ty.dtype.bytes() / dtype.bytes()))
    }

    fn expr(&mut self, e: &Expr) -> Res {
        // An op over operands, the node deep expressions are made of (the special functions'
        // polynomials nest hundreds deep), recurses in this small frame; every other node, with
        // the larger locals of its checks, in a frame of its own (`node_expr`), so that the
        // depth a thread's stack holds does not shrink as checks are added.
        if let Expr::Op { op, dtype, args } = e {
            self.path.push(node(e));
            for a in args {
                self.expr(a)?;
            }
            self.op(op, *dtype, args)?;
            self.path.pop();
            return Ok(());
        }
        self.node_expr(e)
    }

    /// Checks a node other than an op (see [`Self::expr`]).
    #[inline(never)]
    fn node_expr(&mut self, e: &Expr) -> Res {
        self.path.push(node(e));
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => {
                let (ty, elems) = self.input(*input, *dtype)?;
                let mut flat = Lin::constant(*off as i128);
                for (v, &c) in coef.iter().enumerate().filter(|c| *c.1 != 0) {
                    self.var(v)?;
                    flat = flat.plus(&Lin::atom(format!("v{v}"), Atom::Var(v)), c as i128);
                }
                self.in_bounds(&flat, elems, &ty, "the load")?;
            }
            Expr::Gather {
                input,
                dtype,
                index,
                strides: st,
            } => {
                if index.len() != st.len() {
                    return Err(self.err(format!(
                        "{} index expressions for {} strides",
                        index.len(),
                        st.len()
                    )));
                }
                let (ty, elems) = self.input(*input, *dtype)?;
                let mut flat = Lin::constant(0);
                let mut dims = Vec::new();
                for (i, &s) in index.iter().zip(st) {
                    let l = self.lin(i)?;
                    flat = flat.plus(&l, s as i128);
                    dims.push(l);
                }
                let own: Vec<i64> = strides(&ty.shape).iter().map(|&s| s as i64).collect();
                if *dtype == ty.dtype && *st == own && !self.dead {
                    for (d, l) in dims.iter().enumerate() {
                        if let Some(r) = self.range(l)
                            && (r.0 < 0 || r.1 >= ty.shape[d] as i128)
                        {
                            return Err(self.err(format!(
                                "index {d} (`{}`) ranges over {} outside dimension {d} of in{input} \
                                 ({ty}) (loops: {})",
                                crate::print::idx(&index[d]),
                                show(r),
                                self.in_scope()
                            )));
                        }
                    }
                } else {
                    // (Each dimension in its range puts the element in the buffer.)
                    self.in_bounds(&flat, elems, &ty, "the gather")?;
                }
            }
            Expr::Iota { var, dtype } => {
                self.var(*var)?;
                if !dtype.is_int() {
                    return Err(self.err(format!("an index value must be an integer, got {dtype}")));
                }
            }
            Expr::Index { idx, dtype } => {
                self.lin(idx)?;
                if !dtype.is_int() {
                    return Err(self.err(format!("an index value must be an integer, got {dtype}")));
                }
            }
            Expr::Const { dtype, value } => {
                let integral = value.is_finite() && value.fract() == 0.0;
                if (dtype.is_int() && !integral)
                    || (dtype.is_pred() && *value != 0.0 && *value != 1.0)
                {
                    return Err(self.err(format!("{value} is not a value of {dtype}")));
                }
            }
            Expr::Op { op, dtype, args } => {
                for a in args {
                    self.expr(a)?;
                }
                self.op(op, *dtype, args)?;
            }
            Expr::Reduce {
                dtype,
                init,
                vars,
                body,
                ..
            } => {
                self.path.push("init".into());
                self.expr(init)?;
                self.path.pop();
                let mark = self.bound.len();
                for &(v, n) in vars {
                    if v >= self.k.vars {
                        return Err(self.err(format!(
                            "binds v{v}, but the kernel has {} loop variables",
                            self.k.vars
                        )));
                    }
                    if let Some(p) = self.bound.iter().position(|b| b.0 == v) {
                        let whose = if p < self.free {
                            "an output loop variable"
                        } else {
                            "already bound by an enclosing reduction"
                        };
                        return Err(self.err(format!("binds v{v} again: it is {whose}")));
                    }
                    self.bound.push((v, n));
                    self.changed();
                }
                self.expr(body)?;
                self.bound.truncate(mark);
                self.changed();
                for (what, x) in [("starting value", init), ("body", body)] {
                    if x.dtype() != *dtype {
                        return Err(self.err(format!(
                            "the {what} is {}, but the reduction produces {dtype}",
                            x.dtype()
                        )));
                    }
                }
            }
            Expr::Fold { fold, result } => self.fold(fold, *result)?,
            Expr::Arg { slot, dtype } => match self.args.get(*slot) {
                Some(d) if d == dtype => {}
                Some(d) => {
                    return Err(self.err(format!("argument a{slot} is {d}, read as {dtype}")));
                }
                None => {
                    return Err(self.err(format!(
                        "argument a{slot} outside a fold's body, or past its {} arguments",
                        self.args.len()
                    )));
                }
            },
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                let mut facts = Vec::new();
                for c in conds {
                    match c {
                        Cond::InRange(i, lo, hi) => {
                            let l = self.lin(i)?;
                            if lo > hi {
                                return Err(self.err(format!(
                                    "condition `{}` has an empty range",
                                    crate::print::cond(c)
                                )));
                            }
                            facts.push((l, *lo as i128, *hi as i128 - 1));
                        }
                        Cond::Divisible(i, m) => {
                            self.lin(i)?;
                            if *m <= 0 {
                                return Err(self.err(format!(
                                    "condition `{}` tests divisibility by {m} (divisors are positive)",
                                    crate::print::cond(c)
                                )));
                            }
                        }
                    }
                }
                let mark = self.facts.len();
                // One condition that fails on one side only: `otherwise` runs on the other.
                let other = match &facts[..] {
                    [(l, lo, hi)] if conds.len() == 1 => match self.range(l) {
                        Some((a, _)) if a >= *lo => Some((l.clone(), hi + 1, i128::MAX)),
                        Some((_, b)) if b <= *hi => Some((l.clone(), i128::MIN, lo - 1)),
                        _ => None,
                    },
                    _ => None,
                };
                let was_dead = self.dead;
                for (branch, facts, e) in [
                    ("then", facts, then),
                    ("else", Vec::from_iter(other), otherwise),
                ] {
                    for (l, lo, hi) in &facts {
                        self.dead |= meet(self.range(l), Some((*lo, *hi))).is_none();
                    }
                    self.facts.extend(facts);
                    self.changed();
                    self.path.push(branch.into());
                    self.expr(e)?;
                    self.path.pop();
                    self.facts.truncate(mark);
                    self.changed();
                    self.dead = was_dead;
                }
                if then.dtype() != otherwise.dtype() {
                    return Err(self.err(format!(
                        "the branches differ in dtype: {} and {}",
                        then.dtype(),
                        otherwise.dtype()
                    )));
                }
            }
        }
        self.path.pop();
        Ok(())
    }

    /// Checks an elementwise op's arity and its operands' dtypes.
    fn op(&self, op: &Ew, dtype: DType, args: &[Expr]) -> Res {
        let name = crate::print::ew_name(op);
        let arity = match op {
            Ew::Kind(k) => {
                if !k.props().contains(Props::ELEMENTWISE)
                    || matches!(
                        k,
                        OpKind::Compare | OpKind::Select | OpKind::Clamp | OpKind::Convert
                    )
                {
                    return Err(self.err(format!("`{k}` is not an elementwise op of a kernel")));
                }
                match k.arity() {
                    kiln_ir::Arity::Fixed(n) | kiln_ir::Arity::AtLeast(n) => n,
                }
            }
            Ew::Cmp(_) => 2,
            Ew::Select | Ew::Clamp => 3,
            Ew::Convert | Ew::Bitcast | Ew::Narrow => 1,
        };
        if args.len() != arity {
            return Err(self.err(format!(
                "`{name}` takes {arity} operand(s), but has {}",
                args.len()
            )));
        }
        let want = |i: usize, d: DType, why: &str| -> Res {
            let got = args[i].dtype();
            if got == d {
                Ok(())
            } else {
                Err(self.err(format!("operand {i} of `{name}` is {got}, but {why} {d}")))
            }
        };
        match op {
            Ew::Kind(OpKind::IsFinite) => {
                if !args[0].dtype().is_float() {
                    return Err(self.err(format!(
                        "operand 0 of `{name}` is {}, not a float",
                        args[0].dtype()
                    )));
                }
                self.result(&name, dtype, DType::Pred)
            }
            Ew::Kind(_) | Ew::Clamp => {
                (0..arity).try_for_each(|i| want(i, dtype, "the op produces"))
            }
            Ew::Cmp(_) => {
                want(1, args[0].dtype(), "operand 0 is")?;
                self.result(&name, dtype, DType::Pred)
            }
            Ew::Select => {
                want(0, DType::Pred, "a selection's condition must be")?;
                want(1, dtype, "the op produces")?;
                want(2, dtype, "the op produces")
            }
            Ew::Convert => Ok(()),
            Ew::Bitcast => {
                // A small float's bit pattern is the low bits of a u8.
                let raw = |a: DType, b: DType| a.mini().is_some() && b == DType::U8;
                let (from, to) = (args[0].dtype(), dtype);
                if from.bits() != to.bits() && !raw(from, to) && !raw(to, from) {
                    return Err(self.err(format!(
                        "a bitcast from {} to {dtype} changes the width",
                        args[0].dtype()
                    )));
                }
                Ok(())
            }
            Ew::Narrow => {
                if !matches!(dtype, DType::F16 | DType::BF16) {
                    return Err(self.err(format!("`narrow` rounds to f16 or bf16, not {dtype}")));
                }
                want(0, dtype, "the op produces")
            }
        }
    }

    fn result(&self, name: &str, dtype: DType, want: DType) -> Res {
        if dtype == want {
            Ok(())
        } else {
            Err(self.err(format!("`{name}` produces {want}, but is typed {dtype}")))
        }
    }

    /// Checks `e`, a part of the kernel over the index space `shape`, which must produce
    /// `dtype`.
    fn part(&mut self, part: &str, e: &Expr, shape: &[usize], dtype: DType) -> Res {
        self.part = part.to_string();
        self.path.clear();
        self.bound = shape.iter().copied().enumerate().collect();
        self.free = shape.len();
        self.facts.clear();
        self.changed();
        self.dead = false;
        self.expr(e)?;
        if e.dtype() != dtype {
            return Err(self.err(format!("produces {}, but is stored as {dtype}", e.dtype())));
        }
        Ok(())
    }
}

/// Checks kernel `k`, whose inputs (the buffers it reads, in order) have the types `inputs`.
pub fn verify_kernel(k: &Kernel, inputs: &[TensorType]) -> Result<(), KernelError> {
    check(k, inputs, false)
}

/// [`verify_kernel`]; with `all_read`, a loop nest must read every input (as lowered: fusion
/// may leave an input unread where it simplified a read away, which costs only a pointer).
fn check(k: &Kernel, inputs: &[TensorType], all_read: bool) -> Result<(), KernelError> {
    let mut c = Checker {
        k,
        ninputs: inputs.len(),
        readable: inputs.to_vec(),
        read: vec![false; inputs.len()],
        bound: Vec::new(),
        free: 0,
        facts: Vec::new(),
        dead: false,
        ranges: Default::default(),
        inexact: Default::default(),
        part: "schedule".into(),
        path: Vec::new(),
        args: Vec::new(),
    };
    let bad = |c: &Checker, problem: String| Err(c.err(problem));
    let rank = k.out.rank();
    let vars_at_least = |n: usize, what: &str| {
        if k.vars < n {
            Err(KernelError {
                kernel: String::new(),
                at: "schedule".into(),
                problem: format!("{} loop variables, fewer than {what} ({n})", k.vars),
            })
        } else {
            Ok(())
        }
    };
    if !k.extra.is_empty() && k.schedule != Schedule::Nest {
        return bad(
            &c,
            "extra outputs on a kernel that is not a loop nest".into(),
        );
    }
    match &k.schedule {
        Schedule::Nest => {
            vars_at_least(rank, "the output's rank")?;
            c.part("body", &k.body, &k.out.shape, k.out.dtype)?;
        }
        Schedule::Scatter {
            updates,
            target,
            kind: _,
        } => {
            vars_at_least(updates.len(), "the updates' rank")?;
            if inputs.len() != 3 {
                return bad(
                    &c,
                    format!("a scatter reads 3 inputs, not {}", inputs.len()),
                );
            }
            if inputs[0] != k.out {
                return bad(
                    &c,
                    format!("the operand in0 is {}, not the output's type", inputs[0]),
                );
            }
            if target.len() != rank {
                return bad(
                    &c,
                    format!(
                        "{} target indices for an output of rank {rank}",
                        target.len()
                    ),
                );
            }
            c.part = "scatter target".into();
            c.bound = updates.iter().copied().enumerate().collect();
            c.free = updates.len();
            c.changed();
            for t in target {
                c.lin(t)?;
            }
            c.part("update", &k.body, updates, k.out.dtype)?;
        }
        Schedule::SelectScatter {
            grid,
            window,
            strides: st,
            pad_low,
            ..
        } => {
            vars_at_least(2 * rank, "twice the output's rank")?;
            if [grid.len(), window.len(), st.len(), pad_low.len()] != [rank; 4] {
                return bad(
                    &c,
                    format!(
                        "grid, window, strides and padding of ranks {}, {}, {}, {} for an \
                         output of rank {rank}",
                        grid.len(),
                        window.len(),
                        st.len(),
                        pad_low.len()
                    ),
                );
            }
            if inputs.len() != 3 {
                return bad(
                    &c,
                    format!("a select_and_scatter reads 3 inputs, not {}", inputs.len()),
                );
            }
            if inputs[0] != k.out {
                return bad(
                    &c,
                    format!("the operand in0 is {}, not the output's type", inputs[0]),
                );
            }
            if inputs[2] != TensorType::new(k.out.dtype, []) {
                return bad(
                    &c,
                    format!(
                        "the initial value in2 is {}, not a scalar of the output's dtype",
                        inputs[2]
                    ),
                );
            }
            c.part("source", &k.body, grid, k.out.dtype)?;
        }
        Schedule::Gemm {
            epilogue, chain, ..
        } => {
            let dtype = match gemm::operands(k, inputs) {
                Ok(d) => d,
                Err(problem) => return bad(&c, problem),
            };
            match epilogue {
                Some(p) => {
                    if *p != inputs.len() {
                        return bad(
                            &c,
                            format!(
                                "the epilogue reads the product as in{p}, but it follows the {} inputs (in{})",
                                inputs.len(),
                                inputs.len()
                            ),
                        );
                    }
                    vars_at_least(rank, "the output's rank")?;
                    c.readable.push(TensorType {
                        dtype,
                        shape: k.out.shape.clone(),
                    });
                    c.part("epilogue", &k.body, &k.out.shape, k.out.dtype)?;
                    if let Some(h) = chain.as_ref().and_then(|ch| ch.online.as_ref()) {
                        c.part("chain's online softmax", h, &k.out.shape, h.dtype())?;
                    }
                }
                None => {
                    if !matches!(k.body, Expr::Const { .. }) {
                        return bad(
                            &c,
                            "a GEMM without an epilogue has a body other than a constant".into(),
                        );
                    }
                }
            }
        }
    }
    for (e, x) in k.extra.iter().enumerate() {
        let part = format!("extra output {e}");
        if x.out.shape != k.out.shape {
            c.part = part;
            return bad(
                &c,
                format!("writes {}, not the kernel's shape {:?}", x.out, k.out.shape),
            );
        }
        if x.slot != inputs.len() + e {
            c.part = part;
            return bad(
                &c,
                format!(
                    "its pointer is in slot {}, but extra output {e} of a kernel with {} inputs is in slot {}",
                    x.slot,
                    inputs.len(),
                    inputs.len() + e
                ),
            );
        }
        c.part(&part, &x.body, &k.out.shape, x.out.dtype)?;
    }
    if all_read
        && k.schedule == Schedule::Nest
        && let Some(j) = c.read.iter().position(|r| !r)
    {
        c.part = "inputs".into();
        c.path.clear();
        return bad(&c, format!("input {j} ({}) is never read", inputs[j]));
    }
    Ok(())
}

/// Whether kernel `k` computes a value of type `ty`: its output (a chained product's), or the
/// bytes of `ty` (a bitcast that copies bytes).
fn computes(k: &Kernel, ty: &TensorType) -> Result<(), String> {
    let out = match &k.schedule {
        Schedule::Gemm {
            chain: Some(ch), ..
        } => &ch.out,
        Schedule::Gemm {
            store: Some(st), ..
        } => &st.buffer,
        _ => &k.out,
    };
    if out == ty || (k.schedule == Schedule::Nest && bytes_of(out, ty)) {
        Ok(())
    } else {
        Err(format!(
            "computes {out}, but the instruction's result is {ty}"
        ))
    }
}

/// Whether `out` is the bytes of `ty`: what a bitcast that copies bytes writes.
fn bytes_of(out: &TensorType, ty: &TensorType) -> bool {
    out.dtype == DType::I8 && out.rank() == 1 && out.numel() == ty.numel() * ty.dtype.bytes()
}

fn named(f: &Func, i: usize) -> impl Fn(KernelError) -> KernelError + '_ {
    move |e| KernelError {
        kernel: format!("k{i} (#{i} {})", f.insts[i].op.mnemonic()),
        ..e
    }
}

fn program_error(problem: String) -> KernelError {
    KernelError {
        kernel: String::new(),
        at: "program".into(),
        problem,
    }
}

/// Checks the per-instruction kernels `ks` of `f` (as [`crate::pipeline::kernels`] lowers
/// them): each reads its instruction's operands (a loop nest every one of them) and computes
/// its result.
pub fn verify_lowered(f: &Func, ks: &[Option<Kernel>]) -> Result<(), KernelError> {
    if ks.len() != f.insts.len() {
        return Err(program_error(format!(
            "{} kernels for {} instructions",
            ks.len(),
            f.insts.len()
        )));
    }
    for (i, (inst, k)) in f.insts.iter().zip(ks).enumerate() {
        let Some(k) = k else { continue };
        let inputs: Vec<TensorType> = inst
            .operands
            .iter()
            .map(|v| f.values[v.index()].clone())
            .collect();
        check(k, &inputs, true).map_err(named(f, i))?;
        computes(k, &f.values[inst.results[0].index()]).map_err(|p| {
            named(f, i)(KernelError {
                kernel: String::new(),
                at: "output".into(),
                problem: p,
            })
        })?;
    }
    Ok(())
}

/// Checks the fused program `fused` of `f`: every kernel (reading the buffers of its operands,
/// computing its instruction's result and the results merged into it, a GEMM's unread
/// elements unused by every reader), and that inlined and merged instructions have no kernel
/// of their own.
pub fn verify_fused(f: &Func, fused: &Fused) -> Result<(), KernelError> {
    let n = f.insts.len();
    let lens = [
        fused.kernels.len(),
        fused.operands.len(),
        fused.inlined.len(),
        fused.members.len(),
        fused.merged_into.len(),
        fused.extra.len(),
    ];
    if lens.iter().any(|&l| l != n) {
        return Err(program_error(format!(
            "per-instruction tables of lengths {lens:?} for {n} instructions"
        )));
    }
    for (i, k) in fused.kernels.iter().enumerate() {
        let Some(k) = k else { continue };
        let name = named(f, i);
        let whole = |problem: String| {
            name(KernelError {
                kernel: String::new(),
                at: "program".into(),
                problem,
            })
        };
        if fused.inlined[i] {
            return Err(whole(
                "the instruction is inlined into its users, yet has a kernel".into(),
            ));
        }
        if let Some(j) = fused.merged_into[i] {
            return Err(whole(format!(
                "the instruction is merged into #{j}, yet has a kernel"
            )));
        }
        let mut inputs = Vec::with_capacity(fused.operands[i].len());
        for v in &fused.operands[i] {
            match f.values.get(v.index()) {
                Some(t) => inputs.push(t.clone()),
                None => {
                    return Err(whole(format!(
                        "reads {v}, which the function does not define"
                    )));
                }
            }
        }
        verify_kernel(k, &inputs).map_err(&name)?;
        computes(k, &f.values[f.insts[i].results[0].index()]).map_err(&whole)?;
        unread::unused_by_readers(f, fused, i, k).map_err(&whole)?;
        if fused.extra[i].len() != k.extra.len() {
            return Err(whole(format!(
                "{} extra outputs, but {} results merged into it",
                k.extra.len(),
                fused.extra[i].len()
            )));
        }
        for (e, (x, v)) in k.extra.iter().zip(&fused.extra[i]).enumerate() {
            if f.values[v.index()] != x.out && !bytes_of(&x.out, &f.values[v.index()]) {
                return Err(whole(format!(
                    "extra output {e} is {}, but {v} is {}",
                    x.out,
                    f.values[v.index()]
                )));
            }
        }
    }
    Ok(())
}

/// In tests and debug builds, checks the kernels of the prepared function `f` as lowered
/// ([`verify_lowered`]) and as fused into `fused` ([`verify_fused`]); nothing in release
/// builds. The error names the stage, the function and the kernel.
pub fn debug_check(f: &Func, fused: &Fused) -> crate::Result<()> {
    if cfg!(debug_assertions) {
        let stage = |what: &str| {
            let name = f.name.clone();
            let what = what.to_string();
            move |e: KernelError| {
                crate::Error::Lowering(format!("kernel verifier after {what} of @{name}: {e}"))
            }
        };
        verify_lowered(f, &crate::pipeline::kernels(f)).map_err(stage("lowering"))?;
        verify_fused(f, fused).map_err(stage("fusion"))?;
    }
    Ok(())
}
