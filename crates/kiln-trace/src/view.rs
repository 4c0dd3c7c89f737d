//! Eager views: outside a trace, `reshape`, `transpose`/`permute`, `slice` (and the indexing
//! built on it), `broadcast_in_dim` (`expand`, `broadcast_to`), `reverse` and the squeezes and
//! unsqueezes (reshapes) return a tensor that shares its operand's storage, as PyTorch's
//! views do: the storage of some eager tensor, read through a strided view (shape, strides,
//! offset; a stride may be 0, a broadcast, or negative, a reversal). Views of views compose
//! into one view of the first storage. Nothing is copied until an op needs the elements in
//! row-major order (any op but these, reading values, entering a trace): the view is then
//! gathered once, and the copy kept with it for later uses.
//!
//! Values are immutable, so a view can never see a write. It keeps its storage alive, as
//! PyTorch's do: a small slice of a large tensor holds the large one until it is dropped
//! (`.contiguous()` gives a tensor of its own). A reshape is a view only of a view that
//! reads row-major order (a contiguous tensor, a slice of leading rows); any other is copied,
//! as PyTorch's `reshape` copies what `view` refuses.

use crate::eager::layout::{View, materialize, view_through};
use crate::tensor::{Repr, Tensor};
use kiln_ir::{Literal, Op, TensorType};
use std::sync::OnceLock;

/// A view of another tensor's storage.
pub(crate) struct ViewRepr {
    /// The tensor whose storage the view reads: always one holding a literal.
    base: Tensor,
    /// How the view reads it.
    view: View,
    /// The view's type.
    ty: TensorType,
    /// The elements in row-major order, once something needed them.
    value: OnceLock<Literal>,
}

impl ViewRepr {
    /// The view's type.
    pub(crate) fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The elements in row-major order, gathered the first time they are asked for.
    pub(crate) fn literal(&self) -> &Literal {
        self.value.get_or_init(|| {
            let Repr::Eager(src) = self.base.repr() else {
                unreachable!("a view's base holds a literal")
            };
            materialize(src, &self.view, &self.ty)
                .expect("a view's type and strides fit its base (checked when it was made)")
        })
    }

    /// The elements by move.
    pub(crate) fn into_literal(self) -> Literal {
        self.literal();
        self.value.into_inner().expect("just gathered")
    }

    /// Whether the elements have been gathered.
    pub(crate) fn gathered(&self) -> bool {
        self.value.get().is_some()
    }

    /// The tensor whose storage the view reads.
    pub(crate) fn base(&self) -> &Tensor {
        &self.base
    }
}

/// `op` on the eager tensor `x` as a view of its storage, when `op` is a data movement that
/// reads its operand through a strided view (see the module documentation) and `ty` is its
/// result type; `None` for any other op.
pub(crate) fn view_op(op: &Op, x: &Tensor, ty: &TensorType) -> Option<Tensor> {
    if !matches!(
        op,
        Op::Reshape {}
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::BroadcastInDim { .. }
            | Op::Reverse { .. }
    ) {
        return None;
    }
    let (base, src) = match x.repr() {
        Repr::Eager(l) => (x.clone(), View::whole(l.shape())),
        Repr::View(v) => (v.base.clone(), v.view.clone()),
        _ => return None,
    };
    if x.dtype() != ty.dtype {
        return None;
    }
    let view = view_through(op, &src, ty)?;
    Some(Tensor::from_repr(Repr::View(Box::new(ViewRepr {
        base,
        view,
        ty: ty.clone(),
        value: OnceLock::new(),
    }))))
}

impl Tensor {
    /// Whether this tensor and `other` read the same storage (one is a view of the other, or
    /// both are views of one tensor).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// let y = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// assert!(x.shares_storage(&x.clone()));
    /// assert!(!x.shares_storage(&y));
    /// ```
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        let storage = |t: &Tensor| match t.repr() {
            Repr::Eager(_) => Some(t.identity()),
            Repr::View(v) => Some(v.base().identity()),
            _ => None,
        };
        storage(self).is_some_and(|s| storage(other) == Some(s))
    }

    /// Whether this tensor is a view of another's storage whose elements have not been
    /// copied out (see [`Tensor::shares_storage`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap();
    /// assert!(!x.is_uncopied_view());
    /// assert!(!x.t().contiguous().is_uncopied_view());
    /// ```
    pub fn is_uncopied_view(&self) -> bool {
        matches!(self.repr(), Repr::View(v) if !v.gathered())
    }

    /// The one value every element of this tensor reads, when it is an uncopied view of a
    /// tensor of one element (a scalar broadcast, as `x * 2.0` makes of its 2.0); `None` for
    /// any other tensor.
    pub(crate) fn single_value(&self) -> Option<&Literal> {
        match self.repr() {
            Repr::View(v) if !v.gathered() => match v.base().repr() {
                Repr::Eager(l) if l.numel() == 1 => Some(l),
                _ => None,
            },
            _ => None,
        }
    }

    /// This tensor with storage of its own, in row-major order: a view's elements copied
    /// out; any other tensor itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap().t().contiguous();
    /// assert!(!x.is_uncopied_view());
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [1, 3, 2, 4]);
    /// ```
    pub fn contiguous(&self) -> Tensor {
        match self.repr() {
            Repr::View(v) => Tensor::new(v.literal().clone()),
            _ => self.clone(),
        }
    }
}
