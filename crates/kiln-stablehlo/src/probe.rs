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
//! and prints are read in a function's own body, where each runs once; in a region (a loop
//! body, a branch) they are located `unsupported` errors.

use crate::ast::{AttrVal, OpAst};
use crate::checks::{Check, CheckKind};
use crate::error::{Error, Pos, Result};
use crate::import::Body;
use kiln_ir::ValueId;

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

/// Refuses `op` where instrumentation is not read: outside checks, or in a region.
fn allowed(body: &Body, op: &OpAst) -> Result<()> {
    if body.allow_checks {
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
