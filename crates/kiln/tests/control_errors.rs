//! Bad input to the control-flow, batching, rematerialization, sorting, indexing and linear
//! algebra front end:
//! every case is an error that names the operation, says what is wrong, and points at the
//! caller's line (this file), never a panic or a silently wrong number.

use kiln::control::{ScanOptions, cond, fori_loop, map, scan, scan_with, switch, while_loop};
use kiln::{DType, Remat, Tensor, grad, remat, value_and_grad, vmap};

fn v(values: &[f32]) -> Tensor {
    Tensor::from_vec(values.to_vec(), [values.len()]).unwrap()
}

/// The error of `t` (failed), checked to name `op`, contain every `words`, and this file.
fn failed(t: &Tensor, op: &str, words: &[&str]) {
    let e = t
        .to_vec::<f32>()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| {
            panic!("expected {op} to fail, got {t:?}");
        });
    check(&e, op, words);
}

fn check(e: &str, op: &str, words: &[&str]) {
    assert!(e.contains(op), "{e}");
    for w in words {
        assert!(e.contains(w), "missing `{w}` in: {e}");
    }
    assert!(
        e.contains("control_errors.rs"),
        "the error names the caller's line: {e}"
    );
}

#[test]
fn branches_and_loops() {
    let x = v(&[1.0, 2.0]);
    // 1. Branches returning different types.
    let r = cond(
        &Tensor::scalar(true),
        |x: &Tensor| x.clone(),
        |x: &Tensor| x.sum_all(),
        x.clone(),
    );
    failed(&r, "cond", &["f32[2]", "f32[]"]);
    // 2. A predicate that is not a pred[] scalar.
    let r = cond(
        &x,
        |x: &Tensor| x.clone(),
        |x: &Tensor| x.clone(),
        x.clone(),
    );
    failed(&r, "cond", &["pred[] scalar"]);
    // 3. A switch index that is a float.
    let b0 = |x: &Tensor| x.clone();
    let r = switch(&Tensor::scalar(1.0f32), &[&b0, &b0], x.clone()).unwrap();
    failed(&r, "switch", &["f32"]);
    // 4. Switch branches of different types.
    let b1 = |x: &Tensor| x.cast(DType::F64);
    let r = switch(&Tensor::scalar(0i32), &[&b0, &b1], x.clone()).unwrap();
    failed(&r, "switch", &["f64[2]", "f32[2]"]);
    // 5. A while body that changes its carry's type.
    let r = while_loop(
        |c: &Tensor| c.sum_all().lt(&Tensor::scalar(9.0f32)),
        |c: &Tensor| c.sum_all(),
        x.clone(),
    );
    failed(&r, "while_loop", &["f32[]", "f32[2]"]);
    // 6. A while condition that is not a pred[] scalar.
    let r = while_loop(|c: &Tensor| c.clone(), |c: &Tensor| c.clone(), x.clone());
    failed(&r, "while_loop", &["pred[]"]);
    // 7. A fori_loop body that changes its carry's shape.
    let r = fori_loop(
        0,
        3,
        |_: &Tensor, c: &Tensor| Tensor::concat(&[c, c], 0),
        x.clone(),
    );
    failed(&r, "fori_loop", &["f32[4]", "f32[2]"]);
    // 8. Reverse mode through a loop whose trip count depends on the data.
    let e = value_and_grad(
        |x: &Tensor| {
            while_loop(
                |c: &Tensor| c.sum_all().lt(&Tensor::scalar(100.0f32)),
                |c: &Tensor| c.mul(&Tensor::scalar(2.0f32)),
                x.clone(),
            )
            .sum_all()
        },
        &x,
    )
    .expect_err("a data-dependent loop has no reverse mode")
    .to_string();
    check(&e, "grad", &["trip count", "fori_loop"]);
}

#[test]
fn scans() {
    let xs = v(&[1.0, 2.0, 3.0]);
    let e = |r: kiln::Result<(Tensor, Tensor)>| r.expect_err("scan must fail").to_string();
    // 9. A step that changes the carry's type.
    let s = e(scan(
        |c: &Tensor, x: &Tensor| (c.add(x).cast(DType::F64), c.clone()),
        Tensor::scalar(0.0f32),
        &xs,
    ));
    check(&s, "scan", &["f64[]", "f32[]"]);
    // 10. Inputs of different lengths.
    let s = e(scan(
        |c: &Tensor, (a, b): &(Tensor, Tensor)| (c.clone(), a.add(b)),
        Tensor::scalar(0.0f32),
        &(xs.clone(), v(&[1.0, 2.0])),
    ));
    check(&s, "scan", &["2 steps", "expects 3"]);
    // 11. A scalar input.
    let s = e(scan(
        |c: &Tensor, x: &Tensor| (c.clone(), x.clone()),
        Tensor::scalar(0.0f32),
        &Tensor::scalar(1.0f32),
    ));
    check(&s, "scan", &["scalar"]);
    // 12. Neither inputs nor a length.
    let s = e(scan(
        |c: &Tensor, _: &()| (c.clone(), c.clone()),
        Tensor::scalar(0.0f32),
        &(),
    ));
    check(&s, "scan", &["length"]);
    // 13. A length that disagrees with the inputs.
    let opts = ScanOptions {
        length: Some(5),
        ..ScanOptions::default()
    };
    let s = e(scan_with(
        |c: &Tensor, x: &Tensor| (c.clone(), x.clone()),
        Tensor::scalar(0.0f32),
        &xs,
        opts,
    ));
    check(&s, "scan", &["the length"]);
    // 14. No unrolling at all.
    let opts = ScanOptions {
        unroll: 0,
        ..ScanOptions::default()
    };
    let s = e(scan_with(
        |c: &Tensor, x: &Tensor| (c.clone(), x.clone()),
        Tensor::scalar(0.0f32),
        &xs,
        opts,
    ));
    check(&s, "scan", &["unroll"]);
}

#[test]
fn maps() {
    let xs = v(&[1.0, 2.0, 3.0]);
    let e = |r: kiln::Result<Tensor>| r.expect_err("map must fail").to_string();
    // 1. A scalar input: no leading dimension to map over.
    let s = e(map(|x: &Tensor| x.clone(), &Tensor::scalar(1.0f32)));
    check(
        &s,
        "map",
        &["input leaf 0 is a scalar", "leading dimension"],
    );
    // 2. Inputs whose leading dimensions differ.
    let s = e(map(
        |(a, b): &(Tensor, Tensor)| a.add(b),
        &(xs.clone(), v(&[1.0, 2.0])),
    ));
    check(&s, "map", &["input leaf 1 has 2 steps", "expects 3"]);
    // 3. A tree with no tensor in it.
    let s = e(map(|_: &()| xs.clone(), &()));
    check(&s, "map", &["needs at least one input"]);
    // 4. A slice function that fails (a product of a [2] slice with a [3] vector) names the
    // line inside it.
    let m = Tensor::from_vec(vec![1.0f32; 6], [3, 2]).unwrap();
    let s = e(map(|row: &Tensor| row.matmul(&xs), &m));
    check(&s, "matmul", &[]);
    // 5. A failed input passes its own error through.
    let bad = xs.matmul(&m.reshape(&[2, 3]));
    let s = e(map(|x: &Tensor| x.clone(), &bad));
    check(&s, "matmul", &[]);
}

#[test]
fn batching() {
    let m = Tensor::from_vec(vec![1.0f32; 6], [2, 3]).unwrap();
    let w = v(&[1.0, 2.0, 3.0, 4.0]);
    let f = |(a, b): &(Tensor, Tensor)| a.sum_all().add(&b.sum_all());
    let e = |r: kiln::Result<Tensor>| r.expect_err("vmap must fail").to_string();
    // 15. Batch sizes that differ.
    check(
        &e(vmap(f).call(&(m.clone(), w.clone()))),
        "vmap",
        &["batch sizes differ"],
    );
    // 16. An in_axes entry out of range.
    check(
        &e(vmap(f)
            .in_axes(&[Some(5), None])
            .call(&(m.clone(), w.clone()))),
        "vmap",
        &["in_axes[0] = 5"],
    );
    // 17. in_axes of the wrong length.
    check(
        &e(vmap(f).in_axes(&[None]).call(&(m.clone(), w.clone()))),
        "vmap",
        &["in_axes has 1"],
    );
    // 18. Nothing batched.
    check(
        &e(vmap(f).in_axes(&[None, None]).call(&(m.clone(), w.clone()))),
        "vmap",
        &["no leaf"],
    );
    // 19. An out_axes entry out of range.
    check(
        &e(vmap(|a: &Tensor| a.sum_all()).out_axes(&[Some(3)]).call(&m)),
        "vmap",
        &["out_axes[0] = 3"],
    );
    // 20. A batched function that fails inside: the inner error, at its own line.
    let r = vmap(|a: &Tensor| a.matmul(&Tensor::ones(DType::F32, [5, 5]))).call(&m);
    check(
        &r.expect_err("a bad product fails").to_string(),
        "matmul",
        &["3", "5"],
    );
}

#[test]
fn remat_sorting_and_indexing() {
    let x = v(&[3.0, 1.0, 2.0]);
    // 21. A rematerialized function that fails while traced under grad.
    let g = grad(|x: &Tensor| {
        remat(
            |x: &Tensor| x.reshape(&[2, 2]).sum_all(),
            Remat::SaveNothing,
        )(x)
    })(&x);
    failed(&g, "reshape", &["[2, 2]"]);
    // 22. Sorting along an axis that does not exist.
    failed(&x.sort(3, false), "sort", &["axis"]);
    // 23. top-k of more elements than there are.
    let (vals, _) = x.topk(5, 0);
    failed(&vals, "topk", &["5", "3"]);
    // 24. take_along_axis with indices of another rank.
    let idx = Tensor::from_vec(vec![0i32, 1], [1, 2]).unwrap();
    failed(
        &x.take_along_axis(&idx, 0),
        "take_along_axis",
        &["must have the shape of"],
    );
    // 25. cumsum along an axis that does not exist.
    failed(&x.cumsum(2, false), "cumsum", &["axis"]);
    // 26. A dynamic slice larger than the tensor.
    failed(
        &x.dynamic_slice(&[&Tensor::scalar(0i32)], &[4]),
        "dynamic_slice",
        &["slice_sizes"],
    );
    // 27. Start indices of mixed types.
    let m = Tensor::from_vec(vec![1.0f32; 4], [2, 2]).unwrap();
    failed(
        &m.dynamic_slice(&[&Tensor::scalar(0i32), &Tensor::scalar(0i64)], &[1, 1]),
        "dynamic_slice",
        &["start indices"],
    );
    // 28. An update of another rank.
    failed(
        &m.dynamic_update_slice(&x, &[&Tensor::scalar(0i32), &Tensor::scalar(0i32)]),
        "dynamic_update_slice",
        &["rank"],
    );
    // 29. argmax along an axis that does not exist.
    let a = x.argmax(1, false);
    assert!(a.to_vec::<i64>().is_err() && a.to_vec::<i32>().is_err());
    check(&a.error().expect("failed").to_string(), "argmax", &["axis"]);
}

#[test]
fn linear_algebra() {
    use kiln::linalg::{self, Assume, SolveTriangular};
    let m = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|i| i as f64).collect(), shape.to_vec()).unwrap()
    };
    // 1. A rank below 2.
    failed(
        &linalg::cholesky(&m(&[3]), true),
        "cholesky",
        &["rank at least 2", "f64[3]"],
    );
    // 2. A matrix that is not square.
    failed(
        &linalg::cholesky(&m(&[2, 3]), true),
        "cholesky",
        &["square", "f64[2,3]"],
    );
    // 3. Integer elements.
    let ints = Tensor::from_vec(vec![1i32, 0, 0, 1], [2, 2]).unwrap();
    failed(
        &linalg::cholesky(&ints, true),
        "cholesky",
        &["float", "i32[2,2]"],
    );
    // 4. Batch dimensions that differ.
    let r = linalg::solve_triangular(&m(&[2, 3, 3]), &m(&[4, 3, 1]), SolveTriangular::lower());
    failed(&r, "solve_triangular", &["batch dimensions", "f64[4,3,1]"]);
    // 5. A right-hand side of the wrong size, on either side.
    let r = linalg::solve_triangular(&m(&[3, 3]), &m(&[2, 1]), SolveTriangular::lower());
    failed(&r, "solve_triangular", &["3 rows", "f64[2,1]"]);
    let r = linalg::solve_triangular(&m(&[3, 3]), &m(&[3, 2]), SolveTriangular::upper().right());
    failed(&r, "solve_triangular", &["3 columns", "f64[3,2]"]);
    // 6. Element types that differ.
    let r = linalg::solve_triangular(
        &m(&[2, 2]),
        &m(&[2, 1]).cast(DType::F32),
        SolveTriangular::lower(),
    );
    failed(&r, "solve_triangular", &["one element type"]);
    // 7. cho_solve and solve check their operands too, naming themselves.
    failed(
        &linalg::cho_solve(&m(&[2, 3]), true, &m(&[2])),
        "cho_solve",
        &["square"],
    );
    failed(
        &linalg::solve(&m(&[3, 3]), &m(&[4]), Assume::Pos),
        "solve",
        &["3 rows"],
    );
    failed(
        &linalg::solve(&ints, &m(&[2]), Assume::Pos),
        "solve",
        &["float"],
    );
    // 8. The LU factorization and the general solve check theirs.
    failed(
        &linalg::solve(&m(&[2, 3]), &m(&[2]), Assume::General),
        "solve",
        &["square"],
    );
    failed(&linalg::lu(&ints).0, "lu", &["float", "i32[2,2]"]);
    failed(&linalg::lu(&m(&[4])).2, "lu", &["rank at least 2"]);
}
