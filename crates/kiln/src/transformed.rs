//! The functions the eager transforms (`value_and_grad`, `grad`, `vjp`, `jvp`) derived, kept by
//! what they were derived from.
//!
//! An eager transform (`vmap` too) traces its function on every call: the closure may read anything, so
//! only its trace says what it computes. Differentiating the trace is the costly part, and a
//! training loop asks for the same derivative on every step: for a 3-layer MLP's loss the
//! autodiff transform, its verification and dead-code pass took about half of an eager
//! `value_and_grad` call's own time (0.32-0.41 ms a call on the thirty-ninth session's Xeon,
//! tiny shapes so that the run itself costs nothing). A derivative is a function of the
//! traced function, the transform and its arguments, so it is kept under a key holding all
//! three: the function's text (as the compile cache keys programs), the instructions' source
//! locations (which the derivative carries into its error messages; the text leaves them out),
//! and each custom rule's text.

use kiln_ir::Func;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// A derived function and its text, under which the compile cache keeps its executable
/// (printing it on every call took as long again as the trace).
pub(crate) struct Derived {
    /// The function.
    pub(crate) func: Func,
    /// [`kiln_ir::print_func`] of it.
    pub(crate) text: String,
    /// What the transform said of each output besides the function (`vmap`: whether the
    /// output is batched); empty for the others.
    pub(crate) outputs: Vec<bool>,
}

impl Derived {
    /// Runs the function on `args` (see [`kiln_trace::trace::call`]).
    pub(crate) fn call(
        &self,
        args: &[&kiln_trace::Tensor],
        op: &str,
        loc: kiln_ir::Loc,
    ) -> Vec<kiln_trace::Tensor> {
        kiln_trace::trace::call_printed(&self.func, &self.text, args, op, loc)
    }
}

/// Derived functions by key (see [`key`]); entries live as long as the process, like the
/// compile cache's executables of the same functions.
static DERIVED: Mutex<Option<HashMap<String, Arc<Derived>>>> = Mutex::new(None);

/// The key of `transform` (a name and its arguments) applied to `f` with the custom rules
/// `custom` (an instruction's index and its backward function).
pub(crate) fn key(transform: &str, f: &Func, custom: &[(usize, Func)]) -> String {
    let mut k = transform.to_string();
    with_locations(&mut k, f);
    for (i, bwd) in custom {
        let _ = write!(k, "\ncustom rule of {i}:");
        with_locations(&mut k, bwd);
    }
    k
}

/// Appends `f`'s text ([`kiln_ir::print_func`]: `f`, then each function it calls) to `k`, each
/// function followed by its instructions' locations (`-` for none).
fn with_locations(k: &mut String, f: &Func) {
    let one = |k: &mut String, g: &Func| {
        k.push('\n');
        k.push_str(&kiln_ir::print::print_one(g));
        k.push_str("\nlocations:");
        for inst in &g.insts {
            match &inst.loc {
                Some(l) => {
                    let _ = write!(k, " {}:{}:{}", l.file, l.line, l.column);
                }
                None => k.push_str(" -"),
            }
        }
    };
    one(k, f);
    for g in kiln_ir::call::callees(f) {
        one(k, &g);
    }
}

/// The function kept under `key`, else `derive`'s result, kept (an error is returned and not
/// kept).
pub(crate) fn derived<E>(
    key: String,
    derive: impl FnOnce() -> Result<Func, E>,
) -> Result<Arc<Derived>, E> {
    derived_with(key, || derive().map(|f| (f, Vec::new())))
}

/// [`derived`] for a transform that says something of each output besides the function
/// ([`Derived::outputs`]).
pub(crate) fn derived_with<E>(
    key: String,
    derive: impl FnOnce() -> Result<(Func, Vec<bool>), E>,
) -> Result<Arc<Derived>, E> {
    let lock = || DERIVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = lock().as_ref().and_then(|m| m.get(&key)) {
        return Ok(f.clone());
    }
    // Derived outside the lock: another thread may derive the same function meanwhile, and
    // both results are the same function.
    let (func, outputs) = derive()?;
    let text = kiln_ir::print_func(&func);
    let f = Arc::new(Derived {
        func,
        text,
        outputs,
    });
    lock()
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| f.clone());
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Tensor, value_and_grad, vjp};
    use kiln_ir::{DType, TensorType};
    use kiln_trace::trace::trace;

    fn traced(f: impl FnOnce(&[Tensor]) -> Vec<Tensor>) -> Func {
        trace("f", &[TensorType::new(DType::F32, [3])], f)
            .unwrap()
            .func
    }

    #[test]
    fn a_function_is_derived_once_per_key() {
        let f = traced(|p| vec![(&p[0] * 1234.5).sum_all()]);
        let k = key("test transform", &f, &[]);
        let mut derivations = 0;
        for _ in 0..3 {
            let d = derived(k.clone(), || {
                derivations += 1;
                Ok::<_, ()>(f.clone())
            })
            .unwrap();
            assert_eq!(d.text, kiln_ir::print_func(&f));
        }
        assert_eq!(derivations, 1);
        // An error is returned and not kept: the next call derives again.
        let k = key("failing transform", &f, &[]);
        assert_eq!(
            derived(k.clone(), || Err::<Func, _>("no")).err(),
            Some("no")
        );
        assert!(derived(k, || Ok::<_, ()>(f.clone())).is_ok());
    }

    #[test]
    fn keys_tell_functions_transforms_locations_and_custom_rules_apart() {
        // The same instructions traced at two lines: the same text, different keys.
        let a = traced(|p| vec![&p[0] * 2.0]);
        let b = traced(|p| vec![&p[0] * 2.0]);
        assert_eq!(kiln_ir::print_func(&a), kiln_ir::print_func(&b));
        assert_ne!(key("t", &a, &[]), key("t", &b, &[]));
        assert_eq!(key("t", &a, &[]), key("t", &a, &[]));
        assert_ne!(key("t", &a, &[]), key("u", &a, &[]));
        let c = traced(|p| vec![&p[0] * 3.0]);
        assert_ne!(key("t", &a, &[]), key("t", &c, &[]));
        // Custom rules are part of the key.
        assert_ne!(
            key("t", &a, &[(0, b.clone())]),
            key("t", &a, &[(0, c.clone())])
        );
        assert_ne!(key("t", &a, &[(0, c.clone())]), key("t", &a, &[(1, c)]));
    }

    #[test]
    fn a_loop_of_eager_gradients_reads_each_steps_data() {
        // One loss over captured data: the derivative is kept after the first step, and every
        // step's gradient and value are its own data's (d/dw sum((w x)^2) = 2 w x^2).
        let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3]).unwrap();
        for step in 0..4 {
            let xs = [1.0f32 + step as f32, -2.0, 0.25 * step as f32];
            let x = Tensor::from_vec(xs.to_vec(), [3]).unwrap();
            let (v, g) =
                value_and_grad(|w: &Tensor| (&(w * &x) * &(w * &x)).sum_all(), &w).unwrap();
            let ws = [0.5f32, -1.0, 2.0];
            let want: Vec<f32> = (0..3).map(|i| 2.0 * ws[i] * xs[i] * xs[i]).collect();
            let value: f32 = (0..3).map(|i| (ws[i] * xs[i]).powi(2)).sum();
            assert_eq!(g.to_vec::<f32>().unwrap(), want, "step {step}");
            assert_eq!(v.item().unwrap(), value as f64, "step {step}");
            // A pullback kept from the same trace differentiates the same data.
            let (_, pb) = vjp(|w: &Tensor| &(w * &x) * &(w * &x), &w).unwrap();
            let ct = Tensor::from_vec(vec![1.0f32; 3], [3]).unwrap();
            assert_eq!(
                pb.call(&ct).unwrap().to_vec::<f32>().unwrap(),
                want,
                "step {step}"
            );
        }
        // Another function of the same shapes is its own derivative.
        let (_, g) = value_and_grad(|w: &Tensor| (w * w * w).sum_all(), &w).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), [0.75, 3.0, 12.0]);
    }

    #[test]
    fn eager_vmaps_keep_their_batched_functions_apart_by_out_axes() {
        // One function batched twice per step, all outputs batched and the second left
        // unbatched: two kept functions, each with its own outputs' batching, over each step's
        // data.
        let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
        let f = |x: &Tensor| (x * &w, &w * 2.0);
        for step in 0..3 {
            let s = step as f32;
            let xs = Tensor::from_vec(vec![s, 1.0, 2.0, 3.0], [2, 2]).unwrap();
            let (a, b): (Tensor, Tensor) = crate::vmap(f).call(&xs).unwrap();
            assert_eq!(
                a.to_vec::<f32>().unwrap(),
                [s, 2.0, 2.0, 6.0],
                "step {step}"
            );
            assert_eq!(b.shape(), [2, 2]);
            assert_eq!(b.to_vec::<f32>().unwrap(), [2.0, 4.0, 2.0, 4.0]);
            let (a, b): (Tensor, Tensor) =
                crate::vmap(f).out_axes(&[Some(0), None]).call(&xs).unwrap();
            assert_eq!(
                a.to_vec::<f32>().unwrap(),
                [s, 2.0, 2.0, 6.0],
                "step {step}"
            );
            assert_eq!(b.shape(), [2]);
            assert_eq!(b.to_vec::<f32>().unwrap(), [2.0, 4.0]);
        }
    }
}
