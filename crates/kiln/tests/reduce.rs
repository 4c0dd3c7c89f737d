//! `control::reduce`: a reduction whose body is a traced closure. Argmax with NaN and ties
//! against `Tensor::argmax` (eager and under `jit`), exclusive or and a sum with a count
//! against plain loops, a body that is a named combiner built as the IR's `reduce`, and the
//! gradient through the body (to the selected element, eagerly and under `jit`), and the
//! errors: a body that uses an outer traced tensor, bad dimensions.

use kiln::lower::trace_ir;
use kiln::{DType, Tensor, control, grad, jit};
use kiln_ir::OpKind;

/// Argmax of values and positions along `axis`: NaN greatest, ties to the first position.
fn argmax(x: &Tensor, axis: usize) -> Vec<Tensor> {
    let pos = Tensor::iota(DType::I32, &x.shape(), axis);
    control::reduce(
        &[x, &pos],
        &[&Tensor::scalar(f32::NEG_INFINITY), &Tensor::scalar(0i32)],
        &[axis as isize],
        |acc, x| {
            let x_nan = x[0].ne(&x[0]);
            let acc_nan = acc[0].ne(&acc[0]);
            let wins = x[0]
                .gt(&acc[0])
                .bitwise_or(&x_nan.bitwise_and(&acc_nan.bitwise_not()));
            let tie = x[0].eq(&acc[0]).bitwise_or(&x_nan.bitwise_and(&acc_nan));
            let pick = wins.bitwise_or(&tie.bitwise_and(&x[1].lt(&acc[1])));
            vec![pick.where_(&x[0], &acc[0]), pick.where_(&x[1], &acc[1])]
        },
    )
}

#[test]
fn argmax_agrees_with_tensor_argmax_eagerly_and_under_jit() {
    let v: Vec<f32> = (0..7 * 37)
        .map(|i| match (i * 7919) % 53 {
            0 => f32::NAN,
            1 => -0.0,
            r => (r % 11) as f32 - 5.0,
        })
        .collect();
    let x = Tensor::from_vec(v, [7, 37]).unwrap();
    for axis in 0..2 {
        let want = x.argmax(axis as isize, false).to_vec::<i32>().unwrap();
        let eager = argmax(&x, axis);
        assert_eq!(eager[1].to_vec::<i32>().unwrap(), want, "axis {axis}");
        let jitted = jit(move |x: &Tensor| argmax(x, axis)).call(&x).unwrap();
        assert_eq!(jitted[1].to_vec::<i32>().unwrap(), want, "axis {axis}");
        let ev = eager[0].to_vec::<f32>().unwrap();
        let jv = jitted[0].to_vec::<f32>().unwrap();
        assert_eq!(
            ev.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            jv.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
        );
    }
    let f = trace_ir(|x: &Tensor| argmax(x, 1), &x).unwrap();
    assert!(
        f.insts.iter().any(|i| i.op.kind() == OpKind::ReduceRegion),
        "{f}"
    );
}

#[test]
fn xor_and_sum_with_count_agree_with_loops() {
    let v: Vec<i32> = (0..6 * 5)
        .map(|i| (i * 2654435761u32 as i64 % 1000) as i32)
        .collect();
    let x = Tensor::from_vec(v.clone(), [6, 5]).unwrap();
    let xor = jit(|x: &Tensor| {
        control::reduce(&[x], &[&Tensor::scalar(0i32)], &[-1], |a, x| {
            vec![a[0].bitwise_xor(&x[0])]
        })
    })
    .call(&x)
    .unwrap();
    let want: Vec<i32> = v
        .chunks(5)
        .map(|r| r.iter().fold(0, |a, b| a ^ b))
        .collect();
    assert_eq!(xor[0].to_vec::<i32>().unwrap(), want);
    // The sum of the positive elements and their count, over both dimensions.
    let pos = x.gt(&Tensor::scalar(0i32));
    let vals = pos.where_(&x, &Tensor::scalar(0i32));
    let ones = pos.cast(DType::I64);
    let out = control::reduce(
        &[&vals, &ones],
        &[&Tensor::scalar(0i32), &Tensor::scalar(0i64)],
        &[0, 1],
        |a, x| vec![a[0].add(&x[0]), a[1].add(&x[1])],
    );
    let want_sum: i32 = v.iter().filter(|&&e| e > 0).sum();
    let want_count = v.iter().filter(|&&e| e > 0).count() as i64;
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![want_sum]);
    assert_eq!(out[1].to_vec::<i64>().unwrap(), vec![want_count]);
}

#[test]
fn a_named_combiner_body_is_a_plain_reduce() {
    let x = Tensor::from_vec(vec![1.0f32, 4.0, -2.0, 8.0], [2, 2]).unwrap();
    let f = trace_ir(
        |x: &Tensor| {
            control::reduce(&[x], &[&Tensor::scalar(0.0f32)], &[1], |a, x| {
                vec![x[0].add(&a[0])]
            })
        },
        &x,
    )
    .unwrap();
    let kinds: Vec<OpKind> = f.insts.iter().map(|i| i.op.kind()).collect();
    assert!(kinds.contains(&OpKind::Reduce), "{f}");
    assert!(!kinds.contains(&OpKind::ReduceRegion), "{f}");
}

#[test]
fn the_gradient_of_an_argmax_goes_to_the_element_it_selects() {
    let x = Tensor::from_vec(vec![1.0f32, 8.0, -2.0, 8.0, 3.0], [5]).unwrap();
    // Equal maxima: the first one is selected, and gets the gradient.
    let g = grad(|x: &Tensor| argmax(x, 0).remove(0).mul(&Tensor::scalar(3.0f32)))(&x);
    assert_eq!(g.to_vec::<f32>().unwrap(), [0.0, 3.0, 0.0, 0.0, 0.0]);
    // Rows of a matrix under jit: a one-hot row per row, at `Tensor::argmax`'s position.
    let v: Vec<f32> = (0..6 * 11)
        .map(|i| ((i * 37 + 11) % 23) as f32 - 11.0)
        .collect();
    let m = Tensor::from_vec(v.clone(), [6, 11]).unwrap();
    let f = jit(|x: &Tensor| {
        grad(|x: &Tensor| {
            let w = Tensor::from_vec((0..6).map(|i| i as f32 + 1.0).collect(), [6]).unwrap();
            argmax(x, 1).remove(0).mul(&w).sum(&[0], false)
        })(x)
    });
    let got = f.call(&m).unwrap().to_vec::<f32>().unwrap();
    let at = m.argmax(1, false).to_vec::<i32>().unwrap();
    let mut want = vec![0.0f32; 6 * 11];
    for (r, &c) in at.iter().enumerate() {
        want[r * 11 + c as usize] = r as f32 + 1.0;
    }
    assert_eq!(got, want);
}

#[test]
fn errors_name_the_op_and_the_line() {
    let x = Tensor::from_vec(vec![1.0f32, 4.0, -2.0, 8.0], [4]).unwrap();
    // Only the index used: no gradient needed through the body.
    let g = grad(|x: &Tensor| {
        let i = argmax(x, 0).remove(1).cast(DType::F32);
        x.sum(&[0], false).add(&i)
    })(&x);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    // Bad dimensions and a body that uses an outer traced tensor.
    let e = control::reduce(&[&x], &[&Tensor::scalar(0.0f32)], &[1], |a, _| a.to_vec())[0]
        .to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("reduce") && e.contains("out of range"), "{e}");
    let e = jit(|x: &Tensor| {
        control::reduce(&[x], &[&Tensor::scalar(0.0f32)], &[0], |a, e| {
            vec![a[0].add(&e[0]).mul(&x.sum(&[0], false))]
        })
    })
    .call(&x)
    .unwrap_err()
    .to_string();
    assert!(e.contains("enclosing trace"), "{e}");
}
