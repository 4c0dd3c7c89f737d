//! kiln's `Tensor`: eager values and traced graphs behind one type.
//!
//! Outside a trace, every operation runs at once, so values can be printed and inspected: most
//! as native loops with the reference interpreter's results (large dot products and
//! transcendental functions are compiled by the installed [`backend`] once used again), the
//! rest interpreted when small and compiled once per signature when large. Inside a trace ([`trace::trace`], used by `jit` and `grad`), the same operations
//! record IR instead. Broadcasting follows NumPy and is made explicit (`broadcast_in_dim`).
//!
//! Errors never panic: an operation that fails returns a failed tensor carrying the error and
//! the user's source line (every entry point is `#[track_caller]`); the error surfaces when
//! values are read or when a trace ends.
//!
//! ```
//! use kiln_trace::Tensor;
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
//! let y = (&x * 2.0 + 1.0).sum_all();
//! assert_eq!(y.to_vec::<f32>().unwrap(), vec![15.0]);
//! let bad = &x + &Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
//! let err = bad.to_vec::<f32>().unwrap_err();
//! assert!(err.to_string().contains("cannot broadcast f32[3] and f32[2]"));
//! ```
#![warn(missing_docs)]

pub mod backend;
mod composite;
pub mod device;
mod eager;
mod error;
mod indexing;
pub mod linalg;
mod math;
pub mod ops;
mod products;
pub mod promote;
mod scan;
mod shape;
mod sorting;
mod tensor;
pub mod trace;
pub mod tree;
mod view;

pub use composite::{composite, failure};
pub use device::{DeviceArg, DeviceBuffer};
pub use error::{Error, Result};
pub use indexing::TakeMode;
pub use tensor::{Device, Element, Tensor};
pub use tree::Tree;
