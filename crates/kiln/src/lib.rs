//! kiln: a graph-compiling ML framework with an XLA-like IR.
//!
//! Write tensor code once; it runs eagerly for inspection, and [`jit`] traces it into the IR
//! and compiles it. [`grad`] differentiates by transforming the traced IR, so it composes with
//! itself and with `jit`. Programs are typed SSA functions over tensors ([`ir`]); the reference
//! interpreter ([`mod@reference`]) is the oracle every backend is tested against.
//!
//! ```
//! use kiln::{Tensor, grad, jit};
//! let f = |x: &Tensor| (x * x * x).sum_all();
//! let x = Tensor::from_vec(vec![1.0f64, 2.0], [2]).unwrap();
//! // d/dx sum(x^3) = 3 x^2
//! assert_eq!(grad(f)(&x).to_vec::<f64>().unwrap(), vec![3.0, 12.0]);
//! // Second derivative of x^3 summed: 6 x.
//! let g2 = grad(|x: &Tensor| grad(f)(x).sum_all())(&x);
//! assert_eq!(g2.to_vec::<f64>().unwrap(), vec![6.0, 12.0]);
//! let step = jit(|x: &Tensor| x.tanh() * 2.0);
//! assert_eq!(step.call(&x).unwrap().shape(), vec![2]);
//! ```
#![warn(missing_docs)]

extern crate self as kiln;

pub mod aot;
pub mod backend;
pub mod checkpoint;
pub mod control;
pub mod data;
pub mod device;
mod function;
pub mod linalg;
pub mod lower;
mod map;
pub mod nn;
pub mod npy;
pub mod npz;
pub mod optim;
pub mod random;
mod reduce;
mod remat;
mod scan;
pub mod spmd;
pub mod testing;
pub mod train;
mod transformed;
mod transforms;
mod vmap;

/// `docs/tutorial.md`, whose Rust blocks run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/tutorial.md")]
pub struct Tutorial;

pub use backend::{MatmulPrecision, Options, options, set_options};
pub use kiln_derive::Tree;
pub use kiln_ir as ir;
pub use kiln_ir::DType;
#[cfg(feature = "mlir")]
pub use kiln_mlir as mlir;
pub use kiln_reference as reference;
/// StableHLO text in: `kiln::stablehlo::parse(text)` imports a module (both op syntaxes),
/// `parse_file(path)` reads one, `parse_split(text)` imports each `// -----` piece; every
/// unsupported op, attribute or type is an error with its line and column.
/// StableHLO text out: `kiln::stablehlo::to_text(&module)` writes a module as StableHLO that
/// XLA compiles and `parse` reads back to the same module.
/// Under feature `mlir`, `kiln::stablehlo::parse_with_mlir(text)` imports text in MLIR's
/// generic op form through MLIR itself (melior), with the same mapping onto kiln IR.
pub mod stablehlo {
    /// Imports one module of StableHLO text in MLIR's generic op form through MLIR itself:
    /// MLIR parses and verifies it (its diagnostics become located errors), and its
    /// operations go through the same mapping onto kiln IR as [`parse`]. Errors name the op
    /// with the line and column of its `loc(...)`.
    #[cfg(feature = "mlir")]
    pub use kiln_mlir::stablehlo::import as parse_with_mlir;
    pub use kiln_stablehlo::*;
}
pub use function::Function;
pub use kiln_trace::{
    Device, DeviceArg, DeviceBuffer, Element, Error, Result, TakeMode, Tensor, Tree, promote, tree,
};
pub use remat::{Remat, remat, tag};
pub use transforms::{
    Jit, Pullback, custom_vjp, grad, jit, jvp, value_and_grad, value_and_grad_with_aux, vjp,
};
pub use vmap::{Vmap, vmap};

/// The same values with no gradient flowing back (JAX `stop_gradient`).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, grad, stop_gradient};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// assert_eq!(stop_gradient(&x).to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// // d/dx (x * stop_gradient(x)) is the stopped factor x, not 2x.
/// let g = grad(|x: &Tensor| (x * stop_gradient(x)).sum_all())(&x);
/// assert_eq!(g.to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// ```
#[track_caller]
pub fn stop_gradient(t: &Tensor) -> Tensor {
    t.detach()
}

pub(crate) fn ops_broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    kiln_trace::ops::broadcast_shapes(a, b).unwrap_or_else(|| a.to_vec())
}
