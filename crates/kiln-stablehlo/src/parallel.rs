//! `interpreter.run_parallel` of StableHLO's interpreter tests: runs one function per process
//! of a `replicas x partitions` grid (`programs`, row by row) on the operands, each process
//! taking as many as its function has parameters, in process order; the results are every
//! process's results, in the same order.
//!
//! kiln IR has no op that starts processes, so the importer (with checks only) records the run
//! as a [`Parallel`] of its function: the operands become extra outputs (after the checked
//! values) and the results extra parameters. A caller runs the function once to get the
//! operands (they cannot depend on the results), runs the grid, and runs the function again
//! on the grid's results to check them. Its `infeed` functions, run first, give the queue
//! that the programs' `stablehlo.infeed` ops read in order ([`crate::tuple`]).

use crate::ast::{AttrVal, OpAst, Sig};
use crate::error::{Error, Result};
use crate::import::Body;
use kiln_ir::ValueId;
use std::ops::Range;

/// One `interpreter.run_parallel` of a function, as [`crate::FuncChecks::parallel`] lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct Parallel {
    /// The function each process runs: `programs[replica][partition]`.
    pub programs: Vec<Vec<String>>,
    /// The function's parameters that receive the results (every process's, in order).
    pub params: Range<usize>,
    /// The function's outputs that are the operands.
    pub outputs: Range<usize>,
    /// The functions whose results, in order, are the infeed queue the processes read
    /// (`infeed = [@f, ...]`; see [`crate::FuncChecks::infeed`]).
    pub infeed: Vec<String>,
}

/// A run recorded while its function is imported: operands and result parameters as values.
#[derive(Clone, Debug)]
pub struct PendingRun {
    pub(crate) programs: Vec<Vec<String>>,
    pub(crate) operands: Vec<ValueId>,
    pub(crate) params: Range<usize>,
    pub(crate) infeed: Vec<String>,
}

/// Records `op` (an `interpreter.run_parallel` with operands `args`): its results are new
/// parameters of the function.
pub fn record(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    if !body.allow_checks {
        return Err(Error::unsupported(
            op.pos,
            "`interpreter.run_parallel` here (read by `parse_with_checks`, in functions only)",
        ));
    }
    let bad = || {
        Error::invalid(
            op.pos,
            "`interpreter.run_parallel` needs `programs`, a list of lists of functions",
        )
    };
    let Some((AttrVal::List(rows), _)) = op.attr("programs") else {
        return Err(bad());
    };
    let programs: Vec<Vec<String>> = rows
        .iter()
        .map(|r| match r {
            AttrVal::List(items) => items
                .iter()
                .map(|i| match i {
                    AttrVal::Symbol(s) => Ok(s.clone()),
                    _ => Err(bad()),
                })
                .collect(),
            _ => Err(bad()),
        })
        .collect::<Result<_>>()?;
    if programs.is_empty()
        || programs[0].is_empty()
        || programs.iter().any(|r| r.len() != programs[0].len())
    {
        return Err(Error::invalid(
            op.pos,
            "the `programs` of `interpreter.run_parallel` must be a non-empty grid",
        ));
    }
    let Sig::Func(_, outs) = &op.sig else {
        return Err(Error::invalid(
            op.pos,
            "`interpreter.run_parallel` needs its function type",
        ));
    };
    let infeed = match op.attr("infeed") {
        None => Vec::new(),
        Some((AttrVal::List(items), p)) => items
            .iter()
            .map(|i| match i {
                AttrVal::Symbol(s) => Ok(s.clone()),
                _ => Err(Error::invalid(
                    p,
                    "the `infeed` of `interpreter.run_parallel` is a list of functions",
                )),
            })
            .collect::<Result<_>>()?,
        Some((_, p)) => {
            return Err(Error::invalid(
                p,
                "the `infeed` of `interpreter.run_parallel` is a list of functions",
            ));
        }
    };
    let first = body.b.param_count();
    let results: Vec<ValueId> = outs.iter().map(|t| body.b.param(t.clone())).collect();
    body.parallel.push(PendingRun {
        programs,
        operands: args.to_vec(),
        params: first..first + results.len(),
        infeed,
    });
    Ok(results)
}
