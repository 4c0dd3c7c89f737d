//! [`Function`]: a closure traced once and called many times, each call the IR's `call` of one
//! private function rather than a fresh copy of its operations.

use crate::{Error, Tensor, Tree};
use kiln_ir::{Callee, Func, Loc, Op, TensorType};
use kiln_trace::trace::{apply, trace};
use std::marker::PhantomData;

/// A closure of argument tree `A` and result tree `R`, traced once at the types of an example
/// and called on arguments of those types any number of times. Inside [`crate::jit`] each
/// [`Function::call`] records one `call` of the traced function (the program holds it once,
/// named as given, and the backends inline it); outside, a call runs at once. Calls compose
/// with [`crate::grad`], [`crate::vjp`], [`crate::jvp`] and [`crate::vmap`].
///
/// Tensors the closure uses from outside are captured: every call passes them to the function
/// as extra arguments, as they were when it was traced.
///
/// ```
/// use kiln::{Function, Tensor, jit};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2]).unwrap();
/// let layer = Function::trace("layer", |v: &Tensor| v.tanh() * 2.0, &x).unwrap();
/// let twice = jit(|v: &Tensor| layer.call(&layer.call(v)));
/// let want = layer.call(&layer.call(&x)).to_vec::<f32>().unwrap();
/// assert_eq!(twice.call(&x).unwrap().to_vec::<f32>().unwrap(), want);
/// // The program calls `@layer` twice; the function is traced once.
/// let text = twice.lower(&x).unwrap().to_string();
/// assert_eq!(text.matches("{callee = @layer}").count(), 2);
/// assert_eq!(text.matches("func @layer(").count(), 1);
/// ```
pub struct Function<A, R> {
    callee: Func,
    captures: Vec<Tensor>,
    arg_types: Vec<TensorType>,
    like: R,
    args: PhantomData<fn(&A)>,
}

fn types_of(leaves: &[&Tensor]) -> Result<Vec<TensorType>, Error> {
    leaves
        .iter()
        .map(|t| match t.error() {
            Some(e) => Err(e.clone()),
            None => Ok(t.ty().expect("a tensor that did not fail has a type")),
        })
        .collect()
}

fn list(tys: &[TensorType]) -> String {
    let v: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", v.join(", "))
}

impl<A: Tree, R: Tree> Function<A, R> {
    /// `f` traced at the types of `example`'s leaves into a function named `name`, which must
    /// differ from the names of the other functions a program calls (a module holds one
    /// function of each name). A closure that records a custom VJP rule
    /// ([`crate::custom_vjp`]) is an error: a call would not keep the rule.
    #[track_caller]
    pub fn trace(name: &str, f: impl FnOnce(&A) -> R, example: &A) -> Result<Self, Error> {
        let loc = Loc::caller();
        let types = types_of(&example.leaf_vec())?;
        let mut out: Option<R> = None;
        let t = trace(name, &types, |xs| {
            let r = f(&example.map_leaves(&mut {
                let mut it = xs.iter();
                move |old| it.next().cloned().unwrap_or_else(|| old.clone())
            }));
            let ls = r.leaf_vec().into_iter().cloned().collect();
            out = Some(r);
            ls
        })?;
        if !t.custom.is_empty() {
            return Err(Error::at(
                "Function::trace",
                format!(
                    "@{name} records a custom VJP rule, which a call does not keep: call the closure itself"
                ),
                loc,
            ));
        }
        Ok(Function {
            callee: t.func,
            captures: t.captures,
            arg_types: types,
            like: out.expect("the traced closure ran"),
            args: PhantomData,
        })
    }

    /// The traced function: the arguments' leaves, then one parameter per capture.
    pub fn func(&self) -> &Func {
        &self.callee
    }

    /// The function applied to `args`, whose leaves must have the example's types: inside a
    /// trace, a `call` recorded; outside, the call run. Arguments of other types give results
    /// that carry an error naming both type lists and the caller's line.
    #[track_caller]
    pub fn call(&self, args: &A) -> R {
        let loc = Loc::caller();
        let leaves = args.leaf_vec();
        let fail = |e: &Error| self.like.map_leaves(&mut |_| Tensor::failed(e.clone()));
        match types_of(&leaves) {
            Err(e) => return fail(&e),
            Ok(t) if t != self.arg_types => {
                return fail(&Error::at(
                    "Function::call",
                    format!(
                        "@{} was traced for {} but is called on {}",
                        self.callee.name,
                        list(&self.arg_types),
                        list(&t)
                    ),
                    loc,
                ));
            }
            Ok(_) => {}
        }
        let xs: Vec<&Tensor> = leaves.into_iter().chain(&self.captures).collect();
        let op = Op::Call {
            callee: Callee::of(&self.callee),
        };
        let outs = apply(op, &xs, None, "call", loc);
        let mut it = outs.into_iter();
        self.like
            .map_leaves(&mut |old| it.next().unwrap_or_else(|| old.clone()))
    }
}
