//! A literal's `Display` summarizes large values like NumPy (above 1000 elements, the first
//! and last 3 items of each dimension around `...`), prints small ones in full, and `{:#}`
//! prints every element; the IR printer always writes constants in full, so text round-trips.

use kiln_ir::{DType, Literal, Op, TensorType, parse_func_text, print_func};

fn iota(shape: &[usize]) -> Literal {
    let n: usize = shape.iter().product();
    Literal::f32(shape.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
}

#[test]
fn small_literals_print_in_full() {
    assert_eq!(
        Literal::f32([2, 2], vec![1.0, 2.5, -3.0, 4.0])
            .unwrap()
            .to_string(),
        "[[1.0, 2.5], [-3.0, 4.0]] : f32[2,2]"
    );
    assert_eq!(
        Literal::i32([3], vec![1, -2, 3]).unwrap().to_string(),
        "[1, -2, 3] : i32[3]"
    );
    assert_eq!(
        Literal::f64(Vec::<usize>::new(), vec![0.5])
            .unwrap()
            .to_string(),
        "0.5 : f64[]"
    );
    // 1000 elements is NumPy's threshold: still in full.
    let s = iota(&[1000]).to_string();
    assert!(!s.contains("..."), "{s}");
    assert!(s.contains(", 500.0, "), "{s}");
    assert!(s.ends_with("999.0] : f32[1000]"), "{s}");
}

#[test]
fn large_literals_are_summarized() {
    let s = iota(&[1001]).to_string();
    assert_eq!(s, "[0.0, 1.0, 2.0, ..., 998.0, 999.0, 1000.0] : f32[1001]");
    let l = iota(&[40, 50]);
    let s = l.to_string();
    assert!(s.len() < 1024, "{} bytes: {s}", s.len());
    assert_eq!(
        s,
        "[[0.0, 1.0, 2.0, ..., 47.0, 48.0, 49.0], \
         [50.0, 51.0, 52.0, ..., 97.0, 98.0, 99.0], \
         [100.0, 101.0, 102.0, ..., 147.0, 148.0, 149.0], \
         ..., \
         [1850.0, 1851.0, 1852.0, ..., 1897.0, 1898.0, 1899.0], \
         [1900.0, 1901.0, 1902.0, ..., 1947.0, 1948.0, 1949.0], \
         [1950.0, 1951.0, 1952.0, ..., 1997.0, 1998.0, 1999.0]] : f32[40,50]"
    );
    // Dimensions of at most 6 items are kept whole, as in NumPy.
    let s = iota(&[2, 600]).to_string();
    assert!(
        s.starts_with("[[0.0, 1.0, 2.0, ..., 597.0, 598.0, 599.0], [600.0,"),
        "{s}"
    );
    // The alternate form prints everything.
    let full = format!("{l:#}");
    assert!(!full.contains("..."));
    assert!(full.contains(", 1234.0, "));
    assert!(full.ends_with(" : f32[40,50]"));
    // Other dtypes summarize alike.
    let p = Literal::from_i64s(TensorType::new(DType::Pred, [2000]), &[1; 2000]).unwrap();
    assert_eq!(
        p.to_string(),
        "[true, true, true, ..., true, true, true] : pred[2000]"
    );
}

#[test]
fn large_constants_round_trip_through_ir_text() {
    let value = iota(&[40, 50]);
    let mut b = kiln_ir::Builder::new("main");
    let c = b
        .push(
            Op::Constant {
                value: value.clone(),
            },
            &[],
        )
        .unwrap()[0];
    let f = b.finish(&[c]).unwrap();
    let text = print_func(&f);
    assert!(!text.contains("..."), "the IR holds every element");
    assert!(text.contains(", 1234.0, "));
    let g = parse_func_text(&text).unwrap();
    assert_eq!(print_func(&g), text);
    match &g.insts[0].op {
        Op::Constant { value: v } => assert_eq!(v, &value),
        op => panic!("{op:?}"),
    }
}

/// An empty constant prints as nested empty lists, which hide the sizes inside the empty
/// dimension; parsed back it takes them from its declared type (it was `i32[0]` for an
/// `i32[0,3]`, and the program no longer verified).
#[test]
fn empty_constants_of_any_rank_round_trip_through_ir_text() {
    for (dtype, shape) in [
        (DType::I32, vec![0, 3]),
        (DType::F64, vec![2, 0, 4]),
        (DType::F32, vec![0]),
    ] {
        let value = Literal::zeros(TensorType::new(dtype, shape));
        let mut b = kiln_ir::Builder::new("main");
        let c = b
            .push(
                Op::Constant {
                    value: value.clone(),
                },
                &[],
            )
            .unwrap()[0];
        let f = b.finish(&[c]).unwrap();
        let text = print_func(&f);
        let g = parse_func_text(&text).unwrap();
        kiln_ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(print_func(&g), text);
        match &g.insts[0].op {
            Op::Constant { value: v } => assert_eq!(v, &value),
            op => panic!("{op:?}"),
        }
    }
}
