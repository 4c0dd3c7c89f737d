//! User-level operations made of others: their errors name the operation the user called and
//! the user's source line, not the pieces (`mean` is a sum and a division, `softmax` a maximum,
//! an exponential, a sum and a division; an error in any piece is the `mean`'s or the
//! `softmax`'s).

use kiln_ir::Loc;
use std::cell::Cell;

thread_local! {
    /// The outermost user-level operation running on this thread, and where it was called.
    static OUTER: Cell<Option<(&'static str, Loc)>> = const { Cell::new(None) };
}

/// Runs `f` as the user-level operation `name` called at `loc`: errors raised by the
/// operations it is made of name `name` and `loc` instead of their own. Nested composites keep
/// the outermost name (the one the user wrote).
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, composite};
/// use kiln_ir::Loc;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let y = composite("my_norm", Loc::caller(), || (&x * &x).sum(&[1], false).sqrt());
/// // The failing piece (`sum` over a missing axis) reports the composite's name.
/// assert_eq!(y.error().unwrap().op, "my_norm");
/// ```
pub fn composite<T>(name: &'static str, loc: Loc, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<(&'static str, Loc)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OUTER.with(|o| o.set(self.0));
        }
    }
    let before = OUTER.with(|o| o.get());
    let _restore = Restore(before);
    if before.is_none() {
        OUTER.with(|o| o.set(Some((name, loc))));
    }
    f()
}

/// The operation name and location an error of `op` at `loc` reports: the enclosing
/// user-level operation's, if any.
pub(crate) fn naming(op: &str, loc: Loc) -> (String, Loc) {
    match OUTER.with(|o| o.get()) {
        Some((name, at)) => (name.to_string(), at),
        None => (op.to_string(), loc),
    }
}

/// A failed tensor for an error of `op` at `loc`, named after the enclosing user-level
/// operation when there is one (see [`composite`]).
///
/// # Examples
///
/// ```
/// use kiln_trace::failure;
/// use kiln_ir::Loc;
/// let t = failure("my_op", "bad input", Loc::caller());
/// assert_eq!((t.error().unwrap().op.as_str(), t.error().unwrap().message.as_str()), ("my_op", "bad input"));
/// ```
pub fn failure(op: &str, message: impl Into<String>, loc: Loc) -> crate::Tensor {
    let (op, loc) = naming(op, loc);
    crate::Tensor::failed(crate::Error::at(&op, message, loc))
}
