//! A GEMM's unread elements (see [`crate::ir::Unread`]) checked against the program: every
//! reader of the product (part of [`super::verify_fused`]).

use crate::fuse::Fused;
use crate::ir::{Kernel, Schedule};
use crate::unread::{unread_by_epilogue, unread_by_readers};
use kiln_ir::Func;

/// Checks that the elements instruction `i`'s GEMM kernel `k` leaves out, if any, are used
/// by none of the product's readers: its own epilogue, or with none every kernel reading its
/// result, each reading it there only in a select's unchosen arm.
pub(super) fn unused_by_readers(
    f: &Func,
    fused: &Fused,
    i: usize,
    k: &Kernel,
) -> Result<(), String> {
    let Schedule::Gemm {
        epilogue,
        m,
        n,
        unread: Some(u),
        ..
    } = &k.schedule
    else {
        return Ok(());
    };
    let regions = match epilogue {
        None => unread_by_readers(f, fused, f.insts[i].results[0], (*m, *n)),
        Some(_) => unread_by_epilogue(f, &fused.operands[i], k),
    };
    match regions {
        Some(r) if r.contains(&u.at) => Ok(()),
        _ => Err(format!(
            "the product's elements where col * {} + row * {} + {} > 0 are left out, but {} \
             reads them",
            u.at.0,
            u.at.1,
            u.at.2,
            if epilogue.is_some() {
                "its epilogue"
            } else {
                "a reader of its result"
            }
        )),
    }
}
