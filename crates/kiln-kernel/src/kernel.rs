//! The kernel IR and the lowering of ops to kernels under one path, as the emitters import
//! them: the data types ([`crate::ir`]), the lowering ([`crate::lower`]), how bodies read their
//! inputs ([`crate::access`]), value keys ([`crate::key`]), rewrites of bodies
//! ([`crate::rewrite`]) and the expression shapes fusion and the emitters recognize
//! ([`crate::pattern`]).

pub use crate::access::*;
pub use crate::ir::*;
pub use crate::key::*;
pub use crate::lower::*;
pub use crate::pattern::*;
pub use crate::rewrite::*;
