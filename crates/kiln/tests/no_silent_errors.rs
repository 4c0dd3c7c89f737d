//! Inputs that used to give a plausible wrong number now give an error naming the operation
//! and the user's line (eager), or a documented value under `jit` (NaN, never a silent guess).

use kiln::nn::{Embedding, cross_entropy, mse};
use kiln::{DType, TakeMode, Tensor, jit};

fn f32s(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap()
}

fn i32s(v: &[i32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()]).unwrap()
}

#[track_caller]
fn fails_here(t: &Tensor, op: &str, text: &str) {
    let line = std::panic::Location::caller().line();
    let e = t.to_literal().expect_err("should fail");
    let s = e.to_string();
    assert_eq!(e.op, op, "{s}");
    assert!(s.contains(text), "`{text}` missing from: {s}");
    let loc = e.loc.expect("a location");
    assert!(loc.file.ends_with("no_silent_errors.rs"), "{s}");
    // The operation's own line: the call's first line or one of the few it spans.
    assert!(
        (line..line + 4).contains(&loc.line),
        "not near line {line}: {s}"
    );
}

#[test]
fn cross_entropy_refuses_labels_outside_the_classes() {
    let logits = f32s(&[1.0, 2.0, 3.0, 0.5, 0.5, 0.5], &[2, 3]);
    fails_here(
        &cross_entropy(&logits, &i32s(&[0, 3])),
        "cross_entropy",
        "label 3 (sample 1)",
    );
    fails_here(
        &cross_entropy(&logits, &i32s(&[-1, 0])),
        "cross_entropy",
        "label -1",
    );
    fails_here(
        &cross_entropy(&logits, &i32s(&[0, 1, 2])),
        "cross_entropy",
        "i32[3]",
    );
    // Under jit the labels have no values: a bad label makes the loss NaN.
    let step = jit(|(x, y): &(Tensor, Tensor)| cross_entropy(x, y));
    let bad = step.call(&(logits.clone(), i32s(&[0, 3]))).unwrap();
    assert!(bad.item().unwrap().is_nan());
    let good = step.call(&(logits.clone(), i32s(&[2, 0]))).unwrap();
    let want = ((1f64.exp() + 2f64.exp() + 3f64.exp()).ln() - 3.0 + 3f64.ln()) / 2.0;
    assert!((good.item().unwrap() - want).abs() < 1e-6);
    assert!((cross_entropy(&logits, &i32s(&[2, 0])).item().unwrap() - want).abs() < 1e-6);
}

#[test]
fn losses_refuse_operands_of_different_shapes() {
    let pred = f32s(&[1.0, 2.0, 3.0, 4.0], &[4, 1]);
    let target = f32s(&[1.0, 2.0, 3.0, 5.0], &[4]);
    fails_here(
        &mse(&pred, &target),
        "mse",
        "pred f32[4,1] and target f32[4]",
    );
    let ok = mse(&pred.reshape(&[4]), &target).item().unwrap();
    assert_eq!(ok, 0.25);
}

#[test]
fn take_counts_negative_indices_from_the_end_and_refuses_out_of_range_ones() {
    let table = f32s(&[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2]);
    let rows = |t: &Tensor| t.to_vec::<f32>().unwrap();
    assert_eq!(
        rows(&table.take(&i32s(&[-1, 0]), 0)),
        vec![20.0, 21.0, 0.0, 1.0]
    );
    fails_here(
        &table.take(&i32s(&[3]), 0),
        "take",
        "index 3 is out of range",
    );
    fails_here(
        &table.take(&i32s(&[-4]), 0),
        "take",
        "index -4 is out of range",
    );
    let emb = Embedding {
        table: table.clone(),
    };
    fails_here(&emb.forward(&i32s(&[1, 7])), "take", "index 7");
    assert_eq!(rows(&emb.forward(&i32s(&[-3]))), vec![0.0, 1.0]);
    // Modes, eagerly and under jit.
    let idx = i32s(&[4, -5, 1]);
    for (mode, want) in [
        (TakeMode::Clip, vec![20.0, 21.0, 0.0, 1.0, 10.0, 11.0]),
        (TakeMode::Wrap, vec![10.0, 11.0, 10.0, 11.0, 10.0, 11.0]),
    ] {
        assert_eq!(rows(&table.take_with(&idx, 0, mode)), want, "{mode:?}");
        let j = jit(|(t, i): &(Tensor, Tensor)| t.take_with(i, 0, mode));
        assert_eq!(rows(&j.call(&(table.clone(), idx.clone())).unwrap()), want);
    }
    // Fill: NaN rows for the bad indices, under jit by default.
    let j = jit(|(t, i): &(Tensor, Tensor)| t.take(i, 0));
    let got = rows(&j.call(&(table.clone(), idx.clone())).unwrap());
    assert!(got[..4].iter().all(|x| x.is_nan()), "{got:?}");
    assert_eq!(got[4..], [10.0, 11.0]);
    // Along another axis, with 2-D indices.
    let cols = table.take(&Tensor::from_vec(vec![-1i32, 0, 0, 1], [2, 2]).unwrap(), 1);
    assert_eq!(cols.shape(), vec![3, 2, 2]);
    assert_eq!(rows(&cols)[..4], [1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn windows_larger_than_the_padded_input_are_errors() {
    let x = Tensor::zeros(DType::F32, [1, 1, 4, 4]);
    let w = Tensor::zeros(DType::F32, [1, 1, 5, 5]);
    fails_here(
        &x.conv2d(&w, (1, 1), (0, 0), (1, 1), 1),
        "conv2d",
        "5x5 window",
    );
    let w3 = Tensor::zeros(DType::F32, [1, 1, 3, 3]);
    fails_here(
        &x.conv2d(&w3, (1, 1), (0, 0), (2, 2), 1),
        "conv2d",
        "dilation 2x2",
    );
    fails_here(
        &x.max_pool2d((5, 5), (1, 1), (0, 0)),
        "max_pool2d",
        "larger than the 4x4",
    );
    fails_here(
        &x.avg_pool2d((3, 7), (1, 1), (1, 1)),
        "avg_pool2d",
        "padded to 6x6",
    );
    // Windows that just fit still work.
    assert_eq!(
        x.conv2d(&w, (1, 1), (1, 1), (1, 1), 1).shape(),
        vec![1, 1, 2, 2]
    );
    assert_eq!(
        x.max_pool2d((4, 4), (1, 1), (0, 0)).shape(),
        vec![1, 1, 1, 1]
    );
}

#[test]
fn an_empty_sum_is_positive_zero_eagerly_and_under_jit() {
    let cases = [
        Tensor::zeros(DType::F32, [0, 3]),
        Tensor::zeros(DType::F32, [0, 70000]),
        Tensor::zeros(DType::F64, [0, 2]),
        Tensor::zeros(DType::F16, [0, 2]),
        Tensor::zeros(DType::F32, [0, 1]),
    ];
    for t in &cases {
        let eager = t.sum(&[0], false).to_literal().unwrap().to_f64s();
        let traced = jit(|x: &Tensor| x.sum(&[0], false)).call(t).unwrap();
        for (how, v) in [
            ("eager", eager),
            ("jit", traced.to_literal().unwrap().to_f64s()),
        ] {
            assert!(
                v.iter().all(|x| *x == 0.0 && x.is_sign_positive()),
                "{how}: {v:?}"
            );
        }
        let all = jit(|x: &Tensor| x.sum_all())
            .call(t)
            .unwrap()
            .item()
            .unwrap();
        assert!(all == 0.0 && all.is_sign_positive());
        assert!(t.sum_all().item().unwrap().is_sign_positive());
    }
}

#[test]
fn a_jitted_step_that_uses_the_question_mark_returns_its_error() {
    use kiln::nn::Mlp;
    use kiln::optim::{Adam, AdamState};
    let model = Mlp::new(&kiln::random::key(0), &[2, 4, 3], DType::F32);
    let opt = Adam::new(0.01);
    let state = opt.init(&model);
    let line = line!();
    let step = jit(
        |(m, s, x, y): &(Mlp, AdamState<Mlp>, Tensor, Tensor)| -> kiln::Result<_> {
            let (loss, g) = kiln::value_and_grad(|m: &Mlp| cross_entropy(&m.forward(x), y), m)?;
            let (m, s) = opt.update(m, &g, s)?;
            Ok((m, s, loss))
        },
    );
    let x = Tensor::zeros(DType::F32, [5, 2]);
    // Labels of the wrong shape: an error naming cross_entropy and its line, not a panic.
    let bad = Tensor::zeros(DType::I32, [5, 1]);
    let e = step
        .call(&(model.clone(), state.clone(), x.clone(), bad))
        .and_then(|r| r)
        .map(|_| ())
        .expect_err("labels [5, 1] for logits [5, 3]");
    assert_eq!(e.op, "cross_entropy", "{e}");
    // The line of the `cross_entropy` call in the step, a few lines below `line`.
    assert!(
        e.loc
            .is_some_and(|l| (line + 1..line + 6).contains(&l.line)),
        "{e}"
    );
    let good = Tensor::zeros(DType::I32, [5]);
    let (_, _, loss) = step.call(&(model, state, x, good)).unwrap().unwrap();
    assert!((loss.item().unwrap() - 3f64.ln()).abs() < 0.5);
}

#[test]
fn huge_shapes_are_errors_not_aborts() {
    for (t, op) in [
        (Tensor::zeros(DType::F32, [1 << 40]), "zeros"),
        (Tensor::zeros(DType::F32, [1 << 40, 1 << 40]), "zeros"),
        (Tensor::ones(DType::I8, [usize::MAX]), "ones"),
        (Tensor::full(DType::F64, [1 << 31, 1 << 31], 2.0), "full"),
        (Tensor::arange(usize::MAX / 2, DType::F32), "arange"),
    ] {
        let line = line!() - 7;
        let e = t.to_literal().expect_err("too large");
        assert_eq!(e.op, op, "{e}");
        assert!(e.loc.is_some_and(|l| l.line > line), "{e}");
    }
    // Traced shapes are checked by the verifier's size rule.
    let e = jit(|x: &Tensor| x.broadcast_to(&[1 << 40, 1 << 40]))
        .call(&Tensor::zeros(DType::F32, [1]))
        .map(|_| ())
        .expect_err("too large");
    assert!(e.to_string().contains("overflows"), "{e}");
}
