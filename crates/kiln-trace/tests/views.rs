//! Eager views: data movements outside a trace share their operand's storage (no copy until
//! something needs row-major elements), compose, give the same values as copies would, and
//! behave under `reshape` of non-contiguous views, reading, tracing and reuse.

use kiln_ir::{DType, Loc, Op, TensorType};
use kiln_trace::Tensor;
use kiln_trace::trace::{apply, trace};

/// x[i, j, k] = 100 i + 10 j + k, of shape [2, 3, 4].
fn x() -> Tensor {
    let v: Vec<f32> = (0..2)
        .flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (100 * i + 10 * j + k) as f32)))
        .collect();
    Tensor::from_vec(v, [2, 3, 4]).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn data_movements_are_views_of_the_operands_storage() {
    let x = x();
    let t = x.transpose(&[2, 0, 1]);
    let s = x.slice(1, 1, 3, 1);
    let b = x.slice(0, 0, 1, 1).broadcast_to(&[5, 1, 3, 4]);
    let r = x.reshape(&[6, 4]);
    let u = x.unsqueeze(0).squeeze(0);
    let rev = apply(
        Op::Reverse {
            dimensions: vec![1],
        },
        &[&x],
        None,
        "reverse",
        Loc::caller(),
    )
    .remove(0);
    for (name, v) in [
        ("transpose", &t),
        ("slice", &s),
        ("broadcast", &b),
        ("reshape", &r),
        ("squeeze", &u),
        ("reverse", &rev),
    ] {
        assert!(v.shares_storage(&x), "{name} copied");
        assert!(
            v.is_uncopied_view(),
            "{name} was gathered before it was read"
        );
    }
    // Views of views are views of the first storage.
    let chain = x.transpose(&[1, 0, 2]).slice(2, 1, 4, 2).slice(0, 2, 3, 1);
    assert!(chain.shares_storage(&x) && chain.is_uncopied_view());
    assert_eq!(chain.shape(), vec![1, 2, 2]);
    // chain[0, i, k'] = x[i, 2, 1 + 2 k'].
    assert_eq!(f32s(&chain), vec![21.0, 23.0, 121.0, 123.0]);
    assert!(!chain.is_uncopied_view(), "reading gathers the elements");
    // The values of each view.
    assert_eq!(t.shape(), vec![4, 2, 3]);
    let tv = f32s(&t);
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(tv[k * 6 + i * 3 + j], (100 * i + 10 * j + k) as f32);
            }
        }
    }
    assert_eq!(&f32s(&s)[..4], &[10.0, 11.0, 12.0, 13.0]);
    assert_eq!(f32s(&b).len(), 5 * 12);
    assert!(f32s(&b).chunks(12).all(|c| c == &f32s(&x)[..12]));
    assert_eq!(f32s(&r), f32s(&x));
    assert_eq!(u.shape(), vec![2, 3, 4]);
    assert_eq!(&f32s(&rev)[..4], &[20.0, 21.0, 22.0, 23.0]);
}

#[test]
fn a_reshape_of_a_non_contiguous_view_copies() {
    let x = x();
    let t = x.transpose(&[1, 0, 2]);
    let flat = t.reshape(&[24]);
    assert!(
        !flat.shares_storage(&x),
        "a transposed view read as rows needs a copy"
    );
    let want: Vec<f32> = (0..3)
        .flat_map(|j| (0..2).flat_map(move |i| (0..4).map(move |k| (100 * i + 10 * j + k) as f32)))
        .collect();
    assert_eq!(f32s(&flat), want);
    // Leading rows of a contiguous tensor read row-major: a reshape of them is a view.
    let rows = x.slice(0, 1, 2, 1).reshape(&[3, 4]);
    assert!(rows.shares_storage(&x));
    assert_eq!(f32s(&rows)[0], 100.0);
}

#[test]
fn ops_on_views_and_traces_of_views_see_their_values() {
    let x = x();
    let t = x.transpose(&[0, 2, 1]);
    // An elementwise op gathers the view once; the view keeps the copy.
    let y = t.add(&t);
    assert_eq!(y.shape(), vec![2, 4, 3]);
    assert_eq!(f32s(&y)[..3], [0.0, 20.0, 40.0]);
    assert!(!t.is_uncopied_view());
    assert!(t.shares_storage(&x));
    // A view entering a trace is a constant with the view's values.
    let s = x.slice(2, 3, 4, 1);
    let traced = trace("f", &[TensorType::new(DType::F32, [2, 3, 1])], |p| {
        vec![p[0].add(&s)]
    })
    .unwrap();
    let text = traced.func.to_string();
    assert!(text.contains("3.0") && text.contains("123.0"), "{text}");
    // contiguous() copies out a storage of its own.
    let c = x.slice(1, 0, 2, 1).contiguous();
    assert!(!c.shares_storage(&x));
    assert_eq!(f32s(&c)[4..8], [10.0, 11.0, 12.0, 13.0]);
}

#[test]
fn views_of_every_dtype_and_empty_views() {
    let i = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    assert_eq!(
        i.transpose(&[1, 0]).to_vec::<i64>().unwrap(),
        vec![1, 4, 2, 5, 3, 6]
    );
    let p = Tensor::from_vec(vec![true, false, true, true], [4]).unwrap();
    assert_eq!(
        p.slice(0, 1, 4, 2).to_vec::<bool>().unwrap(),
        vec![false, true]
    );
    let e = x().slice(1, 2, 2, 1);
    assert_eq!(e.shape(), vec![2, 0, 4]);
    assert!(f32s(&e).is_empty());
    let h = Tensor::from_vec(vec![half::bf16::from_f32(1.5); 6], [3, 2]).unwrap();
    assert_eq!(h.transpose(&[1, 0]).shape(), vec![2, 3]);
    assert!(h.transpose(&[1, 0]).shares_storage(&h));
}
