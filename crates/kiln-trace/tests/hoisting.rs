//! Data closed over by a hoisting trace (what `jit` and the transforms use) becomes a capture,
//! not a constant: two batches of the same shape give the same program, compiled once.

use kiln_ir::{DType, TensorType};
use kiln_trace::Tensor;
use kiln_trace::trace::trace_hoisting;

#[test]
fn closed_over_labels_are_captures_and_scalars_constants() {
    let program = |labels: &Tensor, scale: f32| {
        let scale = Tensor::scalar(scale);
        let t = trace_hoisting("f", &[TensorType::new(DType::I32, [16])], |p| {
            vec![p[0].add(labels).cast(DType::F32).mul(&scale)]
        })
        .unwrap();
        (t.func.to_string(), t.captures.len())
    };
    let a = Tensor::from_vec((0..16).collect::<Vec<i32>>(), [16]).unwrap();
    let b = Tensor::from_vec((0..16).map(|i| 15 - i).collect::<Vec<i32>>(), [16]).unwrap();
    let (pa, ca) = program(&a, 0.5);
    let (pb, cb) = program(&b, 0.5);
    assert_eq!(pa, pb, "two batches of labels gave two programs");
    assert_eq!((ca, cb), (1, 1));
    assert!(pa.contains("0.5"), "a scalar stays a constant:\n{pa}");
    // A scalar is folded into the program: another value is another program.
    let (pc, _) = program(&a, 0.25);
    assert_ne!(pa, pc);
}
