//! What eager ops allocate: an elementwise op with a Rust scalar (`x * 2.0`) reads the scalar
//! as it is, and an optimizer's step (`p - lr * g`) is one pass, so each allocates its result
//! and nothing of the result's size besides (the scalar used to be broadcast into a buffer of
//! the result's size, and the step's product written out before the difference).
//!
//! The bytes are counted by this binary's allocator, per thread (the threads a large loop is
//! split across allocate nothing of its size: the caller allocates the result).

use kiln::nn::Mlp;
use kiln::optim::Sgd;
use kiln::random::{key, normal};
use kiln::{DType, Tensor};
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
