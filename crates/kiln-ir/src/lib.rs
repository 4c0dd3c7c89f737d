//! The kiln IR: element types, tensor types, the op set, SSA functions, the verifier, and the
//! text printer and parser.
//!
//! ```
//! use kiln_ir::{parse_func_text, verify};
//! let src = "func @main(%0: f32[2], %1: f32[2]) -> f32[2] {\n  %2 = add %0, %1 : f32[2]\n  return %2\n}\n";
//! let f = parse_func_text(src).unwrap();
//! verify(&f).unwrap();
//! assert_eq!(f.to_string(), src);
//! ```
#![warn(missing_docs)]

pub mod attr;
mod builder;
pub mod call;
mod dead_code;
mod dtype;
pub mod error;
pub mod fft;
mod func;
pub mod half_round;
pub mod inline;
pub mod literal;
pub mod minifloat;
mod op;
pub mod parse;
pub mod print;
pub mod random;
pub mod rng_layout;
pub mod shrink;
mod types;
pub mod verify;
pub mod window_fold;

pub use attr::{Attr, Combiner, ComparisonDirection, FftType, RngAlgorithm, TransposeA};
pub use builder::{Builder, relocate_inst};
pub use call::Callee;
pub use dead_code::eliminate_dead_code;
pub use dtype::{DType, DTypeClass};
pub use error::{Diag, Error, ParseError, Result, VerifyError};
pub use func::{Func, Inst, Loc, Module, ValueId};
pub use inline::inline_calls;
pub use literal::{Data, Literal, LiteralError};
pub use minifloat::MiniFloat;
pub use op::{Arity, Op, OpKind, Props, ResultCount, attr_default};
pub use parse::{parse_func_text, parse_literal, parse_module};
pub use print::{print_func, print_module};
pub use types::{MAX_SIZE, ShapeDisplay, TensorType, strides};
pub use verify::{type_rule, verify, verify_module};
