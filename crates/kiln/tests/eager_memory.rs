//! What eager ops allocate: an elementwise op with a Rust scalar (`x * 2.0`) reads the scalar
//! as it is, and an optimizer's step (`p - lr * g`) is one pass, so each allocates its result
//! and nothing of the result's size besides (the scalar used to be broadcast into a buffer of
//! the result's size, and the step's product written out before the difference).
//!
//! The bytes are counted by this binary's allocator, per thread (the threads a large loop is
//! split across allocate nothing of its size: the caller allocates the result).

use kiln::nn::Mlp;
use kiln::optim::{Adam, Sgd};
use kiln::random::{key, normal};
use kiln::{DType, Tensor, Tree};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static BYTES: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is the system allocator's; the count is a thread-local cell with a const
// initializer (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.with(|b| b.set(b.get() + layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        BYTES.with(|b| b.set(b.get() + layout.size()));
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.with(|b| b.set(b.get() + new_size));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `f`'s result and the bytes this thread allocated while it ran.
fn allocated<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = BYTES.with(Cell::get);
    let r = f();
    (r, BYTES.with(Cell::get) - before)
}

const N: usize = 1 << 20;

fn x(seed: u64) -> Tensor {
    normal(&key(seed), &[N / 1024, 1024], DType::F32)
}

#[test]
fn an_op_with_a_scalar_allocates_its_result_only() {
    let a = x(1);
    let result = N * 4;
    // Warm: the first eager ops of the process set the allocator up.
    let _ = &a * 2.0;
    for (name, op) in [
        ("mul", (|a: &Tensor| a * 2.0) as fn(&Tensor) -> Tensor),
        ("add", |a| 0.5 + a),
        ("max", |a| a.maximum(&Tensor::scalar(0.0f32))),
    ] {
        let (y, bytes) = allocated(|| op(&a));
        assert!(
            bytes < result + result / 2,
            "{name}: {bytes} bytes for a result of {result}"
        );
        let want = op(&a.contiguous());
        assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    }
    // A comparison with a scalar: a result of one byte an element.
    let (m, bytes) = allocated(|| a.gt(&Tensor::scalar(0.0f32)));
    assert!(bytes < N + N / 2, "gt: {bytes} bytes for a result of {N}");
    let pos = a
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .filter(|&&v| v > 0.0)
        .count();
    assert_eq!(m.cast(DType::F32).sum_all().item().unwrap() as usize, pos);
}

#[test]
fn an_eager_optimizer_step_is_one_pass() {
    let (p, g) = (x(2), x(3));
    let result = N * 4;
    let two_ops = &p - &(&g * 0.01);
    let (step, bytes) = allocated(|| p.sub_scaled(&g, 0.01));
    assert!(
        bytes < result + result / 2,
        "{bytes} bytes for a result of {result}"
    );
    assert_eq!(
        step.to_vec::<f32>().unwrap(),
        two_ops.to_vec::<f32>().unwrap()
    );

    // SGD on a model: it allocates its new parameters and no product of a parameter's size.
    let m = Mlp::new(&key(4), &[512, 1024, 256], DType::F32);
    let grads = Mlp::new(&key(5), &[512, 1024, 256], DType::F32);
    let params: usize = m
        .layers
        .iter()
        .map(|l| 4 * (numel(&l.weight) + l.bias.as_ref().map_or(0, numel)))
        .sum();
    let sgd = Sgd::new(0.01);
    let s = sgd.init(&m);
    let (_, bytes) = allocated(|| sgd.update(&m, &grads, &s).unwrap());
    assert!(
        bytes < params + params / 2,
        "sgd: {bytes} bytes for parameters of {params}"
    );
}

fn numel(t: &Tensor) -> usize {
    t.shape().iter().product()
}

#[test]
fn an_owned_optimizer_step_writes_into_its_parameters() {
    let (p, g) = (x(6), x(7));
    let want = p.sub_scaled(&g, 0.01).to_vec::<f32>().unwrap();
    let at = p.literal().unwrap().as_ptr();
    let (p, bytes) = allocated(|| p.sub_scaled_owned(&g, 0.01));
    assert!(bytes < 4096, "{bytes} bytes for a step in place");
    assert_eq!(p.literal().unwrap().as_ptr(), at, "the same storage");
    assert_eq!(p.to_vec::<f32>().unwrap(), want);

    // SGD's owned step on a model takes no buffer for the new parameters (with Nesterov
    // momentum and weight decay, the six ops before the step take one each), and its values
    // are `update`'s.
    let m = Mlp::new(&key(8), &[512, 1024, 256], DType::F32);
    let grads = Mlp::new(&key(9), &[512, 1024, 256], DType::F32);
    let params: usize = m
        .layers
        .iter()
        .map(|l| 4 * (numel(&l.weight) + l.bias.as_ref().map_or(0, numel)))
        .sum();
    for sgd in [
        Sgd::new(0.01),
        Sgd {
            momentum: 0.9,
            weight_decay: 0.1,
            nesterov: true,
            ..Sgd::new(0.01)
        },
    ] {
        let s = sgd.init(&m);
        let (want, want_s) = sgd.update(&m, &grads, &s).unwrap();
        // A copy of the model's values (not of its tensors), so that `m` stays the only holder.
        let own = m.map_leaves(&mut |t| Tensor::new(t.to_literal().unwrap()));
        let ((got, got_s), bytes) = allocated(|| sgd.step(own, &grads, s).unwrap());
        let extra = if sgd.momentum == 0.0 { 0 } else { 6 * params };
        assert!(
            bytes < extra + params / 2,
            "sgd {sgd:?}: {bytes} bytes for parameters of {params}"
        );
        for (a, b) in got.leaf_vec().into_iter().zip(want.leaf_vec()) {
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        }
        for (a, b) in got_s
            .velocity
            .leaf_vec()
            .into_iter()
            .zip(want_s.velocity.leaf_vec())
        {
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        }
    }
}

#[test]
fn an_owned_step_leaves_what_shares_its_parameters_alone() {
    // A clone or a view of a parameter alive: the step takes a new buffer, and what shares the
    // old one keeps its values.
    let (p, g) = (x(10), x(11));
    let old = p.to_vec::<f32>().unwrap();
    let want = p.sub_scaled(&g, 0.5).to_vec::<f32>().unwrap();
    let clone = p.clone();
    let view = p.reshape(&[1024, (N / 1024) as isize]).transpose(&[1, 0]);
    let p = p.sub_scaled_owned(&g, 0.5);
    assert_eq!(p.to_vec::<f32>().unwrap(), want);
    assert_eq!(clone.to_vec::<f32>().unwrap(), old);
    drop(clone);
    let back = view
        .transpose(&[1, 0])
        .reshape(&[(N / 1024) as isize, 1024]);
    assert_eq!(back.to_vec::<f32>().unwrap(), old);
    // With only a view left, the step still leaves the view's storage alone.
    let p2 = x(10);
    let view2 = p2.transpose(&[1, 0]);
    let p2 = p2.sub_scaled_owned(&g, 0.5);
    assert_eq!(p2.to_vec::<f32>().unwrap(), want);
    assert_eq!(view2.transpose(&[1, 0]).to_vec::<f32>().unwrap(), old);
    let want_view = view.sub_scaled(&view, 0.5).to_vec::<f32>().unwrap();
    let q = view.clone().sub_scaled_owned(&view, 0.5);
    assert_eq!(q.to_vec::<f32>().unwrap(), want_view);
    // A step of the gradient itself: both operands are one tensor.
    let g2 = g.clone();
    let twice = g.sub_scaled(&g2, 2.0).to_vec::<f32>().unwrap();
    assert_eq!(g.sub_scaled_owned(&g2, 2.0).to_vec::<f32>().unwrap(), twice);
    assert_eq!(g2.to_vec::<f32>().unwrap(), x(11).to_vec::<f32>().unwrap());
    // Other float dtypes step by `sub_scaled`, with its values.
    let b = x(12).cast(DType::BF16);
    let gb = x(13).cast(DType::BF16);
    let want = b
        .sub_scaled(&gb, 0.25)
        .cast(DType::F32)
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(
        b.sub_scaled_owned(&gb, 0.25)
            .cast(DType::F32)
            .to_vec::<f32>()
            .unwrap(),
        want
    );
}

#[test]
fn adam_steps_its_parameters_in_place_with_updates_values() {
    for opt in [
        Adam::new(0.01),
        Adam {
            weight_decay: 0.1,
            decoupled: true,
            ..Adam::new(0.01)
        },
        Adam {
            weight_decay: 0.1,
            ..Adam::new(0.01)
        },
    ] {
        let (mut p, g) = (x(14), x(15));
        let mut s = opt.init(&p);
        for _ in 0..3 {
            let (want, want_s) = opt.update(&p, &g, &s).unwrap();
            let at = p.literal().unwrap().as_ptr();
            let (q, t) = opt.step(p, &g, s).unwrap();
            assert_eq!(
                q.literal().unwrap().as_ptr(),
                at,
                "{opt:?}: the same storage"
            );
            assert_eq!(q.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            assert_eq!(
                t.m.to_vec::<f32>().unwrap(),
                want_s.m.to_vec::<f32>().unwrap()
            );
            assert_eq!(
                t.v.to_vec::<f32>().unwrap(),
                want_s.v.to_vec::<f32>().unwrap()
            );
            assert_eq!(t.step.item().unwrap(), want_s.step.item().unwrap());
            (p, s) = (q, t);
        }
    }
}
