//! The instrumentation ops of StableHLO's interpreter, read with checks
//! ([`crate::parse_with_checks`]):
//!
//! | op | kiln |
//! |---|---|
//! | `%y = interpreter.probe %x, probe_id = "id"` | `%y` is `%x`; the value is recorded under `id` |
//! | `check.expect_serialized_eq %v, probe_id = "id", iter = n` | a check that `%v` has the bytes of the `n`-th value probed under `id` (`n` is 0 when left out) |
//! | `interpreter.print %x` | `%x` becomes an extra output of its function, which the test runner prints as the interpreter does ([`Print`]) |
//!
//! StableHLO's interpreter writes each probed value to a file and the check reads it back;
//! kiln keeps the probed value as a value of the function and the check compares it. Probes
//! and prints are read in a function's own body, where each runs once, and probes also in the
//! body of a `while` there, which runs once per iteration: the loop carries an iteration
//! counter and, for each execution a check reads ([`Slot`]), the value probed at that
//! iteration and a flag that it ran (the check fails when the loop stopped before). Probes
//! in the branches of a `case` or `if` there are read when every branch probes each id as
//! often as the others ([`BranchProbe`]): each branch also returns what it probed, and the
//! values of the branch taken are the executions. Elsewhere in a region (a branch whose
//! probes differ, a nested loop or branch) they are located `unsupported` errors.

use crate::ast::{AttrVal, Block, ModuleAst, OpAst};
use crate::checks::{Check, CheckKind};
use crate::error::{Error, Pos, Result};
use crate::import::Body;
use kiln_ir::{DType, Literal, Op, TensorType, ValueId};
use std::collections::HashMap;

/// An `interpreter.print`: which output of its function holds the printed value.
#[derive(Clone, Debug, PartialEq)]
pub struct Print {
    /// The printed value's name, as written (without `%`).
    pub name: String,
    /// Where the op is.
    pub pos: Pos,
    /// The output of the function holding the value.
    pub output: usize,
}

/// A value as StableHLO's interpreter prints a result or an `interpreter.print`: its type,
/// then its elements in braces, a scalar on the same line (`tensor<ui8> {1}`), a tensor's
/// nested lists one level of nesting a line (`tensor<2xi32> {` / `  [3, 3]` / `}`), floats
/// in exponent form (`1.000000e+00`).
pub fn interpreter_text(v: &Literal) -> String {
    let ty = crate::literal::type_name(v.ty());
    let d = v.dtype();
    let p = Printer {
        v,
        floats: (d.is_float() && !d.is_complex()).then(|| v.to_f64s()),
        strides: (0..v.shape().len())
            .map(|k| v.shape()[k + 1..].iter().product())
            .collect(),
    };
    if v.shape().is_empty() {
        return format!("{ty} {{{}}}", p.elem(0));
    }
    format!("{ty} {{\n  {}\n}}", p.lists(0, 0, 2))
}

/// A value being printed by [`interpreter_text`].
struct Printer<'a> {
    v: &'a Literal,
    /// The elements of a real float value.
    floats: Option<Vec<f64>>,
    /// The row-major stride of each dimension, in elements.
    strides: Vec<usize>,
}

impl Printer<'_> {
    /// The nested lists from dimension `dim` at element `offset`, their inner lines indented
    /// past `indent` spaces.
    fn lists(&self, dim: usize, offset: usize, indent: usize) -> String {
        let n = self.v.shape()[dim];
        if dim + 1 == self.v.shape().len() {
            let elems: Vec<String> = (0..n).map(|i| self.elem(offset + i)).collect();
            return format!("[{}]", elems.join(", "));
        }
        if n == 0 {
            return "[]".into();
        }
        let pad = " ".repeat(indent + 2);
        let items: Vec<String> = (0..n)
            .map(|i| {
                let inner = self.lists(dim + 1, offset + i * self.strides[dim], indent + 2);
                format!("{pad}{inner}")
            })
            .collect();
        format!("[\n{}\n{}]", items.join(",\n"), " ".repeat(indent))
    }

    /// One element: a finite real float as C's `%e` (`-3.000000e+00`), anything else as
    /// kiln writes it.
    fn elem(&self, i: usize) -> String {
        if let Some(x) = self.floats.as_ref().map(|f| f[i]).filter(|x| x.is_finite()) {
            let s = format!("{x:.6e}");
            if let Some((m, e)) = s.split_once('e') {
                let (sign, digits) = match e.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', e),
                };
                return format!("{m}e{sign}{digits:0>2}");
            }
        }
        self.v.format_elem(i)
    }
}

/// Refuses `op` where instrumentation is not read: outside checks, or in a region.
fn allowed(body: &Body, op: &OpAst) -> Result<()> {
    if body.allow_checks || (op.name == "interpreter.probe" && body.allow_probes) {
        return Ok(());
    }
    Err(Error::unsupported(
        op.pos,
        format!(
            "`{}` here (read by `parse_with_checks`, in a function's own body only)",
            op.name
        ),
    ))
}

/// The string attribute `probe_id`.
fn probe_id(op: &OpAst) -> Result<String> {
    match op.attr("probe_id") {
        Some((AttrVal::Str(s), _)) => Ok(s.clone()),
        Some((_, p)) => Err(Error::invalid(
            p,
            format!("the `probe_id` of `{}` must be a string", op.name),
        )),
        None => Err(Error::invalid(
            op.pos,
            format!("`{}` needs a `probe_id`", op.name),
        )),
    }
}

/// `interpreter.probe`: the operand, recorded under its probe id.
pub fn probe(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    allowed(body, op)?;
    let [x] = args else {
        return Err(Error::invalid(
            op.pos,
            "`interpreter.probe` takes one operand",
        ));
    };
    body.probes.push((probe_id(op)?, *x));
    Ok(vec![*x])
}

/// `interpreter.print`: the operand becomes an output to print; it defines no values.
pub fn print(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    allowed(body, op)?;
    let ([x], [n]) = (args, &op.operands[..]) else {
        return Err(Error::invalid(
            op.pos,
            "`interpreter.print` takes one operand",
        ));
    };
    body.prints.push((n.name.clone(), op.pos, *x));
    Ok(Vec::new())
}

/// `check.expect_serialized_eq`: a check that its operand has the bytes of a probed value.
pub fn expect_serialized_eq(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    allowed(body, op)?;
    let [x] = args else {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` takes one operand", op.name),
        ));
    };
    let id = probe_id(op)?;
    let iter = match op.attr("iter") {
        None => 0,
        Some((AttrVal::Int(i), p)) => usize::try_from(*i)
            .map_err(|_| Error::invalid(p, format!("iteration {i} is negative")))?,
        Some((_, p)) => return Err(Error::invalid(p, "`iter` must be an integer")),
    };
    let Some(&(_, probed)) = body.probes.iter().filter(|(p, _)| *p == id).nth(iter) else {
        return Err(Error::invalid(
            op.pos,
            format!("no value was probed under \"{id}\" for iteration {iter} before this check"),
        ));
    };
    if let Some(&flag) = body.probe_flags.get(&probed) {
        // Probed in a loop: the loop must have run that iteration.
        let ran = Literal::from_i64s(TensorType::scalar(DType::Pred), &[1])
            .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
        body.checks.push((
            Check {
                op: format!(
                    "{} (whether the loop ran execution {iter} of \"{id}\")",
                    op.name
                ),
                pos: op.pos,
                kind: CheckKind::EqConst(ran),
                outputs: 0..0,
            },
            vec![flag],
        ));
    }
    body.checks.push((
        Check {
            op: op.name.clone(),
            pos: op.pos,
            kind: CheckKind::SameBytes,
            outputs: 0..0,
        },
        vec![*x, probed],
    ));
    Ok(Vec::new())
}

/// The last iteration each probe id is checked at, over a module's
/// `check.expect_serialized_eq` ops.
pub fn checked_iterations(m: &ModuleAst) -> HashMap<String, usize> {
    fn walk(b: &Block, out: &mut HashMap<String, usize>) {
        for op in &b.ops {
            if op.name == "check.expect_serialized_eq"
                && let Ok(id) = probe_id(op)
            {
                let iter = match op.attr("iter") {
                    Some((AttrVal::Int(i), _)) => usize::try_from(*i).unwrap_or(0),
                    _ => 0,
                };
                let e = out.entry(id).or_insert(0);
                *e = (*e).max(iter);
            }
            op.regions.iter().for_each(|r| walk(r, out));
        }
    }
    let mut out = HashMap::new();
    m.funcs.iter().for_each(|f| walk(&f.body, &mut out));
    out
}

/// One recorded execution of a probe in a loop body: the `probe`-th probe op of the body at
/// loop iteration `iteration`, carried out of the loop as the value probed under `id`.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// The probe id.
    pub id: String,
    /// Which of the body's probe ops (in text order).
    pub probe: usize,
    /// The loop iteration.
    pub iteration: i64,
    /// The probed value's type.
    pub ty: TensorType,
}

/// The slots a loop body's probes need: for each probe id the body probes, one per
/// execution up to the last iteration a check reads (`iters`), counting the executions before
/// the loop (`body.probes`).
pub fn loop_slots(body: &Body, step: &Block, iters: &HashMap<String, usize>) -> Result<Vec<Slot>> {
    let mut probes = Vec::new();
    for op in step.ops.iter().filter(|o| o.name == "interpreter.probe") {
        let ty = match (&op.sig, crate::import::result_types(op).as_deref()) {
            (_, Some([t])) => t.clone(),
            _ => {
                return Err(Error::invalid(op.pos, "`interpreter.probe` needs its type"));
            }
        };
        probes.push((probe_id(op)?, ty));
    }
    let mut slots = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (id, _) in &probes {
        if seen.contains(&id.as_str()) {
            continue;
        }
        seen.push(id);
        let Some(&last) = iters.get(id) else {
            continue;
        };
        let ops: Vec<usize> = (0..probes.len()).filter(|&m| probes[m].0 == *id).collect();
        let before = body.probes.iter().filter(|(p, _)| p == id).count();
        for g in before..=last {
            let r = g - before;
            let probe = ops[r % ops.len()];
            slots.push(Slot {
                id: id.clone(),
                probe,
                iteration: (r / ops.len()) as i64,
                ty: probes[probe].1.clone(),
            });
        }
    }
    Ok(slots)
}

/// A probe of the branches of a `case` or `if`: every branch probes its id the same number of
/// times, so the value of this execution is the taken branch's, returned by each branch.
#[derive(Clone, Debug, PartialEq)]
pub struct BranchProbe {
    /// The probe id.
    pub id: String,
    /// The probed value's type.
    pub ty: TensorType,
}

/// The probes of a branch's own body: (id, type), in text order.
fn own_probes(b: &Block) -> Result<Vec<(String, TensorType)>> {
    let mut out = Vec::new();
    for op in b.ops.iter().filter(|o| o.name == "interpreter.probe") {
        let types = crate::import::result_types(op);
        let Some([ty]) = types.as_deref() else {
            return Err(Error::invalid(op.pos, "`interpreter.probe` needs its type"));
        };
        out.push((probe_id(op)?, ty.clone()));
    }
    Ok(out)
}

/// The probes of `op`'s branches `regions`, in the first branch's order; every branch must
/// probe each id as often as the others, with the same types (else which executions of an id
/// happened would depend on the branch taken, which kiln does not record).
pub fn branch_probes(op: &OpAst, regions: &[&Block]) -> Result<Vec<BranchProbe>> {
    let all: Vec<Vec<(String, TensorType)>> = regions
        .iter()
        .map(|r| own_probes(r))
        .collect::<Result<_>>()?;
    let Some(first) = all.first() else {
        return Ok(Vec::new());
    };
    let of = |probes: &[(String, TensorType)], id: &str| -> Vec<TensorType> {
        probes
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, t)| t.clone())
            .collect()
    };
    for (b, probes) in all.iter().enumerate() {
        for (id, _) in probes.iter().chain(first) {
            if of(probes, id) != of(first, id) {
                return Err(Error::unsupported(
                    op.pos,
                    format!(
                        "the probes under \"{id}\" of branch {b} of `{}`: kiln reads probes in branches that each probe an id as often as the others, with the same types",
                        op.name
                    ),
                ));
            }
        }
    }
    Ok(first
        .iter()
        .map(|(id, ty)| BranchProbe {
            id: id.clone(),
            ty: ty.clone(),
        })
        .collect())
}

/// What a branch returns for `probes` after its own results: the value of each execution,
/// as its own probes (`body.probes`) probed it.
pub fn branch_outputs(body: &Body, probes: &[BranchProbe], pos: Pos) -> Result<Vec<ValueId>> {
    let mut out = Vec::with_capacity(probes.len());
    for (k, p) in probes.iter().enumerate() {
        let j = probes[..k].iter().filter(|q| q.id == p.id).count();
        let Some(&(_, v)) = body.probes.iter().filter(|(i, _)| *i == p.id).nth(j) else {
            return Err(Error::invalid(pos, "a probe of a branch was not read"));
        };
        out.push(v);
    }
    Ok(out)
}

/// The loop function's parameters for `slots`: the iteration counter, each slot's value and
/// each slot's flag (none without slots).
pub fn slot_params(body: &mut Body, slots: &[Slot]) -> Vec<ValueId> {
    if slots.is_empty() {
        return Vec::new();
    }
    let mut out = vec![body.b.param(TensorType::scalar(DType::I64))];
    out.extend(slots.iter().map(|s| body.b.param(s.ty.clone())));
    out.extend(
        slots
            .iter()
            .map(|_| body.b.param(TensorType::scalar(DType::Pred))),
    );
    out
}

/// One kiln instruction of the loop machinery.
fn emit(
    body: &mut Body,
    kop: Op,
    operands: &[ValueId],
    ty: TensorType,
    pos: Pos,
) -> Result<ValueId> {
    body.b
        .push_at(kop, operands, Some(&[ty]), crate::import::loc(pos))
        .map(|r| r[0])
        .map_err(|e| Error::invalid(pos, format!("a probe in a loop: {}", e.diag.message)))
}

/// A scalar constant.
fn scalar(body: &mut Body, dtype: DType, v: i64, pos: Pos) -> Result<ValueId> {
    let value = Literal::from_i64s(TensorType::scalar(dtype), &[v])
        .map_err(|e| Error::invalid(pos, e.to_string()))?;
    emit(
        body,
        Op::Constant { value },
        &[],
        TensorType::scalar(dtype),
        pos,
    )
}

/// The loop body's next values of the slot parameters `params` (after the body's own ops,
/// whose probes are `body.probes`): the counter plus one, and each slot set to its probe's
/// value at its iteration, its flag raised.
pub fn slot_updates(
    body: &mut Body,
    slots: &[Slot],
    params: &[ValueId],
    pos: Pos,
) -> Result<Vec<ValueId>> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let n = slots.len();
    let counter = params[0];
    let pred = TensorType::scalar(DType::Pred);
    let mut values = Vec::with_capacity(n);
    let mut flags = Vec::with_capacity(n);
    for (k, s) in slots.iter().enumerate() {
        let Some(&(_, probed)) = body.probes.get(s.probe) else {
            return Err(Error::invalid(pos, "a probe of the loop body was not read"));
        };
        let j = scalar(body, DType::I64, s.iteration, pos)?;
        let now = emit(
            body,
            Op::Compare {
                comparison_direction: kiln_ir::ComparisonDirection::Eq,
            },
            &[counter, j],
            pred.clone(),
            pos,
        )?;
        let wide = emit(
            body,
            Op::BroadcastInDim {
                broadcast_dimensions: Vec::new(),
            },
            &[now],
            s.ty.with_dtype(DType::Pred),
            pos,
        )?;
        values.push(emit(
            body,
            Op::Select {},
            &[wide, probed, params[1 + k]],
            s.ty.clone(),
            pos,
        )?);
        flags.push(emit(
            body,
            Op::Or {},
            &[now, params[1 + n + k]],
            pred.clone(),
            pos,
        )?);
    }
    let one = scalar(body, DType::I64, 1, pos)?;
    let next = emit(
        body,
        Op::Add {},
        &[counter, one],
        TensorType::scalar(DType::I64),
        pos,
    )?;
    let mut out = vec![next];
    out.extend(values);
    out.extend(flags);
    Ok(out)
}

/// The initial values of the slot carries: the counter 0, zeros, flags down.
pub fn slot_inits(body: &mut Body, slots: &[Slot], pos: Pos) -> Result<Vec<ValueId>> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = vec![scalar(body, DType::I64, 0, pos)?];
    for s in slots {
        let value =
            Literal::try_zeros(s.ty.clone()).map_err(|e| Error::invalid(pos, e.to_string()))?;
        out.push(emit(body, Op::Constant { value }, &[], s.ty.clone(), pos)?);
    }
    for _ in slots {
        out.push(scalar(body, DType::Pred, 0, pos)?);
    }
    Ok(out)
}

/// Records the loop's slot results (`outs`: counter, values, flags) as the values probed.
pub fn record_slots(body: &mut Body, slots: &[Slot], outs: &[ValueId]) {
    let n = slots.len();
    if n == 0 || outs.len() != 1 + 2 * n {
        return;
    }
    for (k, s) in slots.iter().enumerate() {
        body.probes.push((s.id.clone(), outs[1 + k]));
        body.probe_flags.insert(outs[1 + k], outs[1 + n + k]);
    }
}
