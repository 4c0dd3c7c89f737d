//! kiln: a graph-compiling ML framework with an XLA-like IR.
//!
//! Programs are typed SSA functions over tensors ([`ir`]); the reference interpreter
//! ([`mod@reference`]) runs every op and is the oracle every backend is tested against.
//!
//! ```
//! use kiln::ir::{parse_func_text, Literal};
//! let f = parse_func_text(
//!     "func @main(%0: f32[2,2]) -> f32[2] {
//!        %1 = constant {value = 0.0} : f32[]
//!        %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[2]
//!        return %2
//!      }",
//! )
//! .unwrap();
//! let x = Literal::f32([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
//! let sums = kiln::reference::eval(&f, &[x]).unwrap();
//! assert_eq!(sums[0].as_f32s().unwrap(), &[3.0, 7.0]);
//! ```
#![warn(missing_docs)]

pub use kiln_ir as ir;
pub use kiln_reference as reference;
