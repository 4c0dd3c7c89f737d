//! The reference interpreter: slow, obviously correct, and the oracle for every test.
//!
//! Every op is computed in the widest domain (f64 for floats, wrapping i64 for integers) and the
//! result is rounded (floats, ties to even) or wrapped (integers) to the storage type once per
//! op. Reductions and dot products accumulate in f64 and round once at the end, so the
//! reference is at least as accurate as any backend it checks.
//!
//! ```
//! use kiln_ir::{parse_func_text, Literal};
//! let f = parse_func_text("func @main(%0: f32[2]) -> f32[2] {\n  %1 = add %0, %0 : f32[2]\n  return %1\n}\n").unwrap();
//! let out = kiln_reference::eval(&f, &[Literal::f32([2], vec![1.0, 2.5]).unwrap()]).unwrap();
//! assert_eq!(out[0].as_f32s().unwrap(), &[2.0, 5.0]);
//! ```
#![warn(missing_docs)]

pub mod accuracy;
pub mod collective;
pub mod compare;
pub mod complex;
mod fft;
mod linalg;
mod ops;
mod products;
mod reduce_region;
mod rng;
pub mod scalar;
mod sort;
pub mod spmd;

use kiln_ir::{Func, Literal, Module, VerifyError};
use std::fmt;

pub use linalg::{Solve, better_pivot, cholesky, lu, triangular_solve};
pub use ops::{case_branch, eval_op, for_each_index, take as take_positions};
pub use rng::threefry2x32;
pub use sort::{merge_sort_by, permutation as sort_permutation};

/// An error of the reference interpreter.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// The function is ill-formed.
    Verify(VerifyError),
    /// The arguments do not fit the function's parameters.
    Args(String),
    /// The module has no function to run.
    NoEntry,
    /// A collective op failed: its process groups do not fit the grid, or a process of its
    /// group failed, finished early or ran another collective (see [`spmd`]).
    Collective(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Verify(e) => write!(f, "verify error: {e}"),
            Error::Args(m) => write!(f, "bad arguments: {m}"),
            Error::NoEntry => f.write_str("the module has no function"),
            Error::Collective(m) => write!(f, "collective: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `args` fit the parameters of `f`: count, dtypes and shapes.
pub fn check_args<L: std::borrow::Borrow<Literal>>(f: &Func, args: &[L]) -> Result<()> {
    let params = f.param_types();
    if args.len() != params.len() {
        return Err(Error::Args(format!(
            "@{} takes {} argument(s), {} given",
            f.name,
            params.len(),
            args.len()
        )));
    }
    for (i, (a, p)) in args.iter().zip(&params).enumerate() {
        let a = a.borrow();
        if a.ty() != p {
            return Err(Error::Args(format!(
                "argument {i} of @{} must be {p}, got {}",
                f.name,
                a.ty()
            )));
        }
    }
    Ok(())
}

/// Runs `f` on `args` after verifying it. Outside [`spmd::run_processes`] the function runs
/// as the one process of a 1 x 1 grid (its collectives' groups may only name index 0).
pub fn eval(f: &Func, args: &[Literal]) -> Result<Vec<Literal>> {
    kiln_ir::verify(f).map_err(Error::Verify)?;
    check_args(f, args)?;
    let refs: Vec<&Literal> = args.iter().collect();
    spmd::catch_abort(|| run(f, &refs)).map_err(Error::Collective)
}

/// Runs the verified function `f` on arguments of its parameter types (a region of `while` or
/// `case` is verified with the instruction that holds it).
pub(crate) fn run(f: &Func, args: &[&Literal]) -> Vec<Literal> {
    let mut env: Vec<Option<Literal>> = vec![None; f.values.len()];
    for (&p, &a) in f.params.iter().zip(args) {
        env[p.index()] = Some(a.clone());
    }
    for inst in &f.insts {
        let operands: Vec<&Literal> = inst
            .operands
            .iter()
            .map(|o| env[o.index()].as_ref().expect("verified SSA"))
            .collect();
        let types: Vec<_> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let outs = eval_op(&inst.op, &operands, &types);
        for (&r, v) in inst.results.iter().zip(outs) {
            env[r.index()] = Some(v);
        }
    }
    f.outputs
        .iter()
        .map(|o| env[o.index()].clone().expect("verified SSA"))
        .collect()
}

/// Runs the entry function (`@main` or the first) of a module.
pub fn eval_module(m: &Module, args: &[Literal]) -> Result<Vec<Literal>> {
    kiln_ir::verify_module(m).map_err(Error::Verify)?;
    eval(m.entry().ok_or(Error::NoEntry)?, args)
}
