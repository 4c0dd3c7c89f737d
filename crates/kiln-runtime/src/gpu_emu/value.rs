//! One element computed as the compiled CPU path computes it: f32 arithmetic in f32 (exact
//! operations are computed in f64 and rounded once, which is the same by the double-rounding
//! theorem), f16 and bf16 held in f32 and rounded by `Narrow` and on stores, f64 in f64,
//! integers wrapped to their dtype, and the reference's scalar functions
//! (`kiln_reference::scalar`) for everything else.

use super::{Buffer, EmuError};
use kiln_ir::literal::{convert_f64, round_to, wrap_to};
use kiln_ir::{Combiner, DType, Op, OpKind};
use kiln_kernel::gpu::ir::*;
use kiln_kernel::ir::{Cond, Ew, Expr, Fold, Idx};
use kiln_kernel::target::SumTree;
use kiln_reference::scalar;

/// A register's value: a float (f32-representable unless its dtype is f64) or an integer
/// (wrapped to its dtype; unsigned values are non-negative, `pred` is 0 or 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    /// A float.
    F(f64),
    /// An integer or `pred`.
    I(i64),
}

impl V {
    /// As a float.
    pub fn f(self) -> f64 {
        match self {
            V::F(x) => x,
            V::I(i) => i as f64,
        }
    }

    /// As an integer.
    pub fn i(self) -> i64 {
        match self {
            V::I(i) => i,
            V::F(x) => x as i64,
        }
    }
}

/// `x` at the precision a register of `d` holds: f64 for f64, f32 for the other floats.
pub fn hold(d: DType, x: f64) -> f64 {
    if d == DType::F64 { x } else { x as f32 as f64 }
}

/// The identity of `kind` in `d` (the start of a partial reduction).
pub fn identity(kind: Combiner, d: DType) -> V {
    if d.is_float() {
        return V::F(match kind {
            Combiner::Add | Combiner::Replace | Combiner::Or => -0.0,
            Combiner::Mul | Combiner::And => 1.0,
            Combiner::Max => f64::NEG_INFINITY,
            Combiner::Min => f64::INFINITY,
        });
    }
    // As i64s: a u64's largest value is its bits, all ones.
    let (lo, hi) = d.int_bounds().expect("an integer dtype");
    let (lo, hi) = (lo as i64, hi as i64);
    V::I(match kind {
        Combiner::Add | Combiner::Or | Combiner::Replace => 0,
        Combiner::Mul => 1,
        Combiner::And => wrap_to(d, -1),
        Combiner::Max => lo,
        Combiner::Min => hi,
    })
}

/// `kind(a, b)` in `d`.
pub fn combine(kind: Combiner, d: DType, a: V, b: V) -> V {
    if d.is_float() {
        V::F(hold(d, scalar::combine_f(kind, a.f(), b.f())))
    } else {
        V::I(scalar::combine_i(kind, d, a.i(), b.i()))
    }
}

/// What expressions read: the launch's input buffers, then its scalars.
pub(crate) struct Env<'a> {
    pub kernel: &'a str,
    pub inputs: &'a [&'a Buffer],
    pub scalars: &'a [V],
    pub sums: SumTree,
    /// The arguments of the fold body being applied ([`Expr::Arg`]).
    pub args: &'a [V],
}

impl Env<'_> {
    fn read(&self, input: usize, flat: i64) -> Result<V, EmuError> {
        if input >= self.inputs.len() {
            return self
                .scalars
                .get(input - self.inputs.len())
                .copied()
                .ok_or_else(|| EmuError(format!("{}: no input {input}", self.kernel)));
        }
        let b = self.inputs[input];
        if flat < 0 || flat as usize >= b.data.len() {
            return Err(EmuError(format!(
                "out-of-bounds read in kernel {}: {} index {flat} of {} elements",
                self.kernel,
                b.name,
                b.data.len()
            )));
        }
        Ok(b.data[flat as usize])
    }
}

/// The attribute-free op of kind `k` (the elementwise ops kernels compute), from the op
/// table, so every elementwise op is covered.
fn op_of(k: OpKind) -> Option<Op> {
    Op::from_attrs(k, &[], &kiln_ir::attr::AttrCtx { result_types: &[] }).ok()
}

/// The index expression `i` at `vars`.
pub(crate) fn idx(i: &Idx, env: &Env, vars: &mut [i64]) -> Result<i64, EmuError> {
    Ok(match i {
        Idx::Var(v) => vars[*v],
        Idx::Const(c) => *c,
        Idx::Add(xs) => {
            let mut s = 0i64;
            for x in xs {
                s = s.wrapping_add(idx(x, env, vars)?);
            }
            s
        }
        Idx::Mul(x, c) => idx(x, env, vars)?.wrapping_mul(*c),
        Idx::Div(x, c) => idx(x, env, vars)? / c,
        Idx::Clamp(x, lo, hi) => idx(x, env, vars)?.max(*lo).min(*hi),
        Idx::Value(e) => kiln_ir::literal::index_of(e.dtype(), eval(e, env, vars)?.i()),
    })
}

fn cond(c: &Cond, env: &Env, vars: &mut [i64]) -> Result<bool, EmuError> {
    Ok(match c {
        Cond::InRange(i, lo, hi) => {
            let x = idx(i, env, vars)?;
            *lo <= x && x < *hi
        }
        Cond::Divisible(i, m) => idx(i, env, vars)? % m == 0,
    })
}

fn int_value(d: DType, x: i64) -> V {
    if d.is_float() {
        V::F(hold(d, x as f64))
    } else {
        V::I(wrap_to(d, x))
    }
}

/// `e` at the loop variables `vars` (a reduction sets its own variables there).
pub(crate) fn eval(e: &Expr, env: &Env, vars: &mut [i64]) -> Result<V, EmuError> {
    match e {
        Expr::Load {
            input, coef, off, ..
        } => {
            let flat = coef
                .iter()
                .zip(vars.iter())
                .fold(*off, |s, (c, v)| s.wrapping_add(c.wrapping_mul(*v)));
            env.read(*input, flat)
        }
        Expr::Gather {
            input,
            index,
            strides,
            ..
        } => {
            let mut flat = 0i64;
            for (i, s) in index.iter().zip(strides) {
                flat = flat.wrapping_add(idx(i, env, vars)?.wrapping_mul(*s));
            }
            env.read(*input, flat)
        }
        Expr::Iota { var, dtype } => Ok(int_value(*dtype, vars[*var])),
        Expr::Index { idx: i, dtype } => Ok(int_value(*dtype, idx(i, env, vars)?)),
        Expr::Const { dtype, value } => Ok(if dtype.is_float() {
            V::F(hold(*dtype, round_to(*dtype, *value)))
        } else {
            V::I(convert_f64(*dtype, *value))
        }),
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            for c in conds {
                if !cond(c, env, vars)? {
                    return eval(otherwise, env, vars);
                }
            }
            eval(then, env, vars)
        }
        Expr::Op { op, dtype, args } => {
            let mut v = [V::I(0); 3];
            for (k, a) in args.iter().enumerate().take(3) {
                v[k] = eval(a, env, vars)?;
            }
            let in_dt = match op {
                Ew::Select => args[1].dtype(),
                _ => args[0].dtype(),
            };
            apply(op, in_dt, *dtype, &v[..args.len().min(3)], env.kernel)
        }
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars: rv,
            body,
        } => reduce(*kind, *dtype, init, rv, body, env, vars),
        Expr::Fold { fold, result } => Ok(fold_in_order(fold, env, vars)?[*result]),
        Expr::Arg { slot, .. } => env
            .args
            .get(*slot)
            .copied()
            .ok_or_else(|| EmuError(format!("{}: no fold argument {slot}", env.kernel))),
    }
}

/// Every result of `fold` computed by one thread in order: its inits, then the body applied to
/// the accumulators and the elements at each position of its loops, row-major (the
/// reference's order).
fn fold_in_order(fold: &Fold, env: &Env, vars: &mut [i64]) -> Result<Vec<V>, EmuError> {
    let mut accs = fold
        .inits
        .iter()
        .map(|x| eval(x, env, vars))
        .collect::<Result<Vec<V>, EmuError>>()?;
    let n: usize = fold.vars.iter().map(|v| v.1).product();
    for &(v, _) in &fold.vars {
        vars[v] = 0;
    }
    for _ in 0..n {
        let mut args = accs.clone();
        for x in &fold.elems {
            args.push(eval(x, env, vars)?);
        }
        let inner = Env {
            args: &args,
            ..*env
        };
        accs = fold
            .body
            .iter()
            .map(|x| eval(x, &inner, vars))
            .collect::<Result<Vec<V>, EmuError>>()?;
        for &(v, e) in fold.vars.iter().rev() {
            vars[v] += 1;
            if (vars[v] as usize) < e {
                break;
            }
            vars[v] = 0;
        }
    }
    Ok(accs)
}

/// A reduction: in order from `init` when it is short or not a float sum or product, else as
/// [`SumTree`] says (chains of `leaf` terms, their results in chains of `fanout`), the total
/// then combined into `init`.
fn reduce(
    kind: Combiner,
    d: DType,
    init: &Expr,
    rv: &[(usize, usize)],
    body: &Expr,
    env: &Env,
    vars: &mut [i64],
) -> Result<V, EmuError> {
    let start = eval(init, env, vars)?;
    let n: usize = rv.iter().map(|v| v.1).product();
    if n == 0 {
        return Ok(start);
    }
    for &(v, _) in rv {
        vars[v] = 0;
    }
    let next = |vars: &mut [i64]| {
        for &(v, e) in rv.iter().rev() {
            vars[v] += 1;
            if (vars[v] as usize) < e {
                return;
            }
            vars[v] = 0;
        }
    };
    let tree = d.is_float() && matches!(kind, Combiner::Add | Combiner::Mul) && n > env.sums.leaf;
    if !tree {
        let mut acc = start;
        for _ in 0..n {
            let x = eval(body, env, vars)?;
            acc = combine(kind, d, acc, x);
            next(vars);
        }
        return Ok(acc);
    }
    let leaf = env.sums.leaf.max(1);
    let mut partials = Vec::with_capacity(n.div_ceil(leaf));
    let mut done = 0;
    while done < n {
        let mut p = eval(body, env, vars)?;
        next(vars);
        for _ in 1..leaf.min(n - done) {
            let x = eval(body, env, vars)?;
            p = combine(kind, d, p, x);
            next(vars);
        }
        partials.push(p);
        done += leaf.min(n - done);
    }
    let fanout = env.sums.fanout.max(2);
    while partials.len() > 1 {
        partials = partials
            .chunks(fanout)
            .map(|g| g[1..].iter().fold(g[0], |a, &b| combine(kind, d, a, b)))
            .collect();
    }
    Ok(combine(kind, d, start, partials[0]))
}

/// The elementwise op `op` on operands of dtype `from` (the second's for a select), giving
/// `to`.
pub(crate) fn apply(op: &Ew, from: DType, to: DType, v: &[V], kernel: &str) -> Result<V, EmuError> {
    Ok(match op {
        Ew::Select => {
            if v[0].i() != 0 {
                v[1]
            } else {
                v[2]
            }
        }
        Ew::Clamp => {
            let m = apply(&Ew::Kind(OpKind::Maximum), to, to, &[v[1], v[0]], kernel)?;
            apply(&Ew::Kind(OpKind::Minimum), to, to, &[m, v[2]], kernel)?
        }
        Ew::Narrow => V::F(round_to(to, v[0].f())),
        Ew::Convert => convert(from, to, v[0]),
        Ew::Bitcast => bitcast(from, to, v[0]),
        Ew::Cmp(dir) => V::I(if from.is_float() {
            scalar::compare_f(*dir, v[0].f(), v[1].f())
        } else {
            scalar::compare_i(*dir, from, v[0].i(), v[1].i())
        } as i64),
        Ew::Kind(k) => {
            let unsupported = || EmuError(format!("{kernel}: `{}` on {from}", k.mnemonic()));
            if from.is_float() && *k == OpKind::IsFinite {
                return Ok(V::I(v[0].f().is_finite() as i64));
            }
            let o = op_of(*k).ok_or_else(unsupported)?;
            if from.is_float() {
                if let Some(f) = scalar::float_binary(&o) {
                    V::F(hold(to, f(v[0].f(), v[1].f())))
                } else if let Some(f) = scalar::float_unary(&o) {
                    V::F(hold(to, f(v[0].f())))
                } else {
                    return Err(unsupported());
                }
            } else if scalar::is_int_binary(&o) {
                V::I(scalar::int_binary(&o, to, v[0].i(), v[1].i()))
            } else if scalar::is_int_unary(&o) {
                V::I(scalar::int_unary(&o, to, v[0].i()))
            } else {
                return Err(unsupported());
            }
        }
    })
}

fn convert(from: DType, to: DType, x: V) -> V {
    match (from.is_float(), to.is_float()) {
        // f16 and bf16 values stay f32 in registers: they round on a store or a narrow.
        (true, true) => V::F(hold(to, x.f())),
        (true, false) => V::I(convert_f64(to, x.f())),
        (false, true) => V::F(match (from == DType::U64, to == DType::F64) {
            (true, true) => x.i() as u64 as f64,
            (true, false) => x.i() as u64 as f32 as f64,
            (false, true) => x.i() as f64,
            (false, false) => x.i() as f32 as f64,
        }),
        (false, false) => V::I(if to == DType::Pred {
            (x.i() != 0) as i64
        } else {
            wrap_to(to, x.i())
        }),
    }
}

fn bitcast(from: DType, to: DType, x: V) -> V {
    let bits: u64 = match from {
        DType::F32 => (x.f() as f32).to_bits() as u64,
        DType::F64 => x.f().to_bits(),
        DType::F16 => kiln_ir::half_round::f16_from_f64(x.f()).to_bits() as u64,
        DType::BF16 => kiln_ir::half_round::bf16_from_f64(x.f()).to_bits() as u64,
        DType::I32 | DType::U32 => x.i() as u32 as u64,
        DType::I16 | DType::U16 => x.i() as u16 as u64,
        DType::I8 | DType::U8 | DType::Pred => x.i() as u8 as u64,
        _ => x.i() as u64,
    };
    match to {
        DType::F16 => V::F(half::f16::from_bits(bits as u16).to_f64()),
        DType::BF16 => V::F(half::bf16::from_bits(bits as u16).to_f64()),
        DType::F32 => V::F(f32::from_bits(bits as u32) as f64),
        DType::F64 => V::F(f64::from_bits(bits)),
        _ => V::I(wrap_to(to, bits as i64)),
    }
}

/// The thread-level integer `s` for thread `t` of block `b`.
pub(crate) struct Thread<'a> {
    pub t: usize,
    pub block: usize,
    pub k: &'a GpuKernel,
    pub regs: &'a [V],
    pub vars: &'a [i64],
}

impl Thread<'_> {
    pub(crate) fn sc(&self, s: &Sc) -> i64 {
        match s {
            Sc::Const(c) => *c,
            Sc::Special(sp) => {
                (match sp {
                    Special::Thread => self.t,
                    Special::Block => self.block,
                    Special::BlockDim => self.k.block,
                    Special::GridDim => self.k.grid,
                    Special::Lane => self.t % self.k.warp,
                    Special::Warp => self.t / self.k.warp,
                }) as i64
            }
            Sc::Reg(r) => self.regs[*r].i(),
            Sc::Var(v) => self.vars[*v],
            Sc::Add(a, b) => self.sc(a).wrapping_add(self.sc(b)),
            Sc::Mul(a, b) => self.sc(a).wrapping_mul(self.sc(b)),
            Sc::Div(a, b) => self.sc(a) / self.sc(b).max(1),
            Sc::Rem(a, b) => self.sc(a) % self.sc(b).max(1),
            Sc::Lt(a, b) => (self.sc(a) < self.sc(b)) as i64,
            Sc::Eq(a, b) => (self.sc(a) == self.sc(b)) as i64,
            Sc::And(a, b) => (self.sc(a) != 0 && self.sc(b) != 0) as i64,
        }
    }
}
