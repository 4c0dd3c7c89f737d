//! The host steps of the collectives and of `replica_id` / `partition_id` ([`Step::Host`]):
//! a compiled program stops at each one, the host exchanges the values with the other
//! processes of its grid through the [`Communicator`] of the thread's process (see
//! [`kiln_reference::spmd`]), combines them in group order, and the program goes on with the
//! results. The exchange and the combination are [`kiln_reference::collective::eval`], which
//! the reference interpreter runs too, so both backends meet in one grid and agree bit for bit.
//!
//! [`Step::Host`]: kiln_kernel::Step::Host
//! [`Communicator`]: kiln_reference::spmd::Communicator

use kiln_ir::{Literal, Op, TensorType};

/// Runs the host step of `op` (a [`kiln_kernel::host_routine`]) on `x`: a collective, or a
/// linear algebra routine.
pub fn host_step(op: &Op, x: &[&Literal], types: &[TensorType]) -> Result<Vec<Literal>, String> {
    if kiln_reference::collective::is_collective(op) {
        kiln_reference::collective::eval(op, x, types)
    } else {
        crate::linalg::run(op, x, types)
    }
}
