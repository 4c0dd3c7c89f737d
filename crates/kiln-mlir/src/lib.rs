//! MLIR interoperability through melior: parsing and verifying MLIR modules with every
//! upstream dialect registered, and `stablehlo::import`: StableHLO text in MLIR's generic op
//! form imported through MLIR itself, sharing kiln-stablehlo's mapping onto kiln IR.
//!
//! MLIR links about 200 MB of code into each binary that uses it, so only this crate depends
//! on melior, and only under its feature `mlir` (off by default; the facade's feature `mlir`
//! turns it on and re-exports this crate as `kiln::mlir`): the workspace's default build and
//! tests leave MLIR out. Check or test it with `cargo test -p kiln-mlir --features mlir`.
#![warn(missing_docs)]

#[cfg(feature = "mlir")]
mod mlir;
#[cfg(feature = "mlir")]
pub use mlir::*;
#[cfg(feature = "mlir")]
pub mod stablehlo;
