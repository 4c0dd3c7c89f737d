//! Type promotion (`kiln::promote`): every dtype pair, weakly typed Rust scalars, true
//! division and integer means, in eager mode and under `jit` alike, and the table in
//! `docs/dtype-promotion.md`.

use kiln::promote::promote_types;
use kiln::{DType, Tensor, jit};

fn ones(d: DType, n: usize) -> Tensor {
    Tensor::full(d, [n], 1.0)
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_literal().unwrap().to_f64s()
}

#[test]
fn every_pair_promotes_to_the_lattice_join_eagerly_and_in_jit() {
    for a in DType::ALL {
        for b in DType::ALL {
            let want = promote_types(a, b);
            let (x, y) = (ones(a, 3), Tensor::full(b, [3], 2.0).cast(b));
            let eager = &x + &y;
            let traced = jit(|(x, y): &(Tensor, Tensor)| x + y)
                .call(&(x.clone(), y.clone()))
                .unwrap();
            for (how, r) in [("eager", &eager), ("jit", &traced)] {
                assert_eq!(r.dtype(), want, "{how}: {a} + {b}");
                // 1 + 2, where a pred 2 is true (1), an i2 2 saturates to 1, a pred sum is an
                // or and an integer sum wraps (i2's 1 + 1 is -2).
                let vb = values(&Tensor::full(b, [1], 2.0))[0];
                let sum = match want {
                    DType::Pred => 1.0,
                    w if w.is_int() => kiln_ir::literal::wrap_to(w, 1 + vb as i64) as f64,
                    // 3 rounds to 4 in f8e8m0fnu (powers of two).
                    w => kiln_ir::literal::round_to(w, 1.0 + vb),
                };
                assert_eq!(values(r), vec![sum; 3], "{how}: {a} + {b}");
            }
        }
    }
}

#[test]
fn rust_scalars_are_weakly_typed() {
    let i = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    // A float scalar makes an integer tensor f32, never truncated.
    let r = &i + 1.5;
    assert_eq!(r.dtype(), DType::F32);
    assert_eq!(values(&r), vec![2.5, 3.5]);
    let u = Tensor::from_vec(vec![3u32, 4], [2]).unwrap();
    let r = &u * -1.0;
    assert_eq!((r.dtype(), values(&r)), (DType::F32, vec![-3.0, -4.0]));
    // An integer scalar keeps the tensor's dtype; pred becomes i32.
    let r = &i + 1;
    assert_eq!((r.dtype(), values(&r)), (DType::I32, vec![2.0, 3.0]));
    let r = 10 - &u;
    assert_eq!((r.dtype(), values(&r)), (DType::U32, vec![7.0, 6.0]));
    let p = Tensor::from_vec(vec![true, false], [2]).unwrap();
    let r = &p + 1;
    assert_eq!((r.dtype(), values(&r)), (DType::I32, vec![2.0, 1.0]));
    // A float scalar keeps a float tensor's dtype, however narrow.
    let h = Tensor::full(DType::BF16, [2], 2.0);
    assert_eq!((&h * 1.5).dtype(), DType::BF16);
    assert_eq!(h.powf(0.5).dtype(), DType::BF16);
}

#[test]
fn division_means_and_float_functions_of_integers_are_floats() {
    let i = Tensor::from_vec(vec![1i32, 2, 4, -7], [4]).unwrap();
    let two = Tensor::from_vec(vec![2i32], [1]).unwrap();
    let check = |t: Tensor| {
        let j = jit(|x: &Tensor| x / &two).call(&t).unwrap();
        for r in [&t / &two, j] {
            assert_eq!(r.dtype(), DType::F32);
            assert_eq!(values(&r), vec![0.5, 1.0, 2.0, -3.5]);
        }
    };
    check(i.clone());
    // Integer division, rounded toward zero, when asked for.
    let r = i.div_trunc(&two);
    assert_eq!(
        (r.dtype(), values(&r)),
        (DType::I32, vec![0.0, 1.0, 2.0, -3.0])
    );
    // The mean of integers is not truncated.
    for r in [
        i.mean_all(),
        jit(|x: &Tensor| x.mean_all()).call(&i).unwrap(),
    ] {
        assert_eq!((r.dtype(), values(&r)), (DType::F32, vec![0.0]));
    }
    let r = Tensor::from_vec(vec![1i32, 2], [2]).unwrap().mean_all();
    assert_eq!(values(&r), vec![1.5]);
    // Softmax and exp of integers compute in f32.
    let s = i.softmax(0);
    assert_eq!(s.dtype(), DType::F32);
    assert!((values(&s).iter().sum::<f64>() - 1.0).abs() < 1e-6);
    assert_eq!(i.exp().dtype(), DType::F32);
    // Mixed dtypes in where, matmul and concat promote too.
    let f = Tensor::from_vec(vec![0.5f32, 0.5, 0.5, 0.5], [4]).unwrap();
    let w = i.gt(&f).where_(&i, &f);
    assert_eq!(
        (w.dtype(), values(&w)),
        (DType::F32, vec![1.0, 2.0, 4.0, 0.5])
    );
    assert_eq!(i.matmul(&f).dtype(), DType::F32);
    assert_eq!(Tensor::concat(&[&i, &f], 0).dtype(), DType::F32);
}

/// The table in `docs/dtype-promotion.md` is the one `promote_types` computes.
#[test]
fn the_documented_table_is_the_implemented_one() {
    let mut table = String::from("| | ");
    table += &DType::ALL.map(|d| d.name()).join(" | ");
    table += " |\n|---|";
    table += &"---|".repeat(DType::ALL.len());
    table += "\n";
    for a in DType::ALL {
        table += &format!("| **{}** | ", a.name());
        table += &DType::ALL.map(|b| promote_types(a, b).name()).join(" | ");
        table += " |\n";
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/dtype-promotion.md");
    let doc = std::fs::read_to_string(path).unwrap();
    assert!(
        doc.contains(&table),
        "docs/dtype-promotion.md lacks the table:\n{table}"
    );
}
