//! Printing a tensor summarizes large values like NumPy; small ones print as before.

use kiln_trace::Tensor;

#[test]
fn a_large_tensor_prints_a_summary() {
    let t = Tensor::from_vec((0..2000).map(|i| i as f32).collect(), [40, 50]).unwrap();
    let s = t.to_string();
    assert!(s.len() < 1024, "{} bytes", s.len());
    assert!(
        s.starts_with("[[0.0, 1.0, 2.0, ..., 47.0, 48.0, 49.0], [50.0,"),
        "{s}"
    );
    assert!(s.contains("], ..., ["), "{s}");
    assert!(s.ends_with(", 1999.0]] : f32[40,50]"), "{s}");
    assert!(format!("{t:?}").len() < 1024);
    // `{:#}` prints every element.
    let full = format!("{t:#}");
    assert!(!full.contains("...") && full.contains(", 1234.0, "));
}

#[test]
fn a_small_tensor_prints_every_element() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.5, 5.0, 6.0], [2, 3]).unwrap();
    assert_eq!(
        t.to_string(),
        "[[1.0, 2.0, 3.0], [4.5, 5.0, 6.0]] : f32[2,3]"
    );
    assert_eq!(
        format!("{t:?}"),
        "Tensor([[1.0, 2.0, 3.0], [4.5, 5.0, 6.0]] : f32[2,3])"
    );
}
