//! Losses. Each checks its operands' shapes (a `[n, 1]` prediction against a `[n]` target would
//! otherwise broadcast to `[n, n]` and give a plausible, wrong number) and names itself and the
//! user's line in its errors.

use crate::{DType, Error, Tensor};
use kiln_ir::Loc;
use kiln_trace::composite;

/// A failed tensor unless `a` and `b` have the same shape.
fn same_shape(op: &str, what: [&str; 2], a: &Tensor, b: &Tensor, loc: Loc) -> Option<Tensor> {
    if let Some(e) = a.error().or(b.error()) {
        return Some(Tensor::failed(e.clone()));
    }
    (a.shape() != b.shape()).then(|| {
        Tensor::failed(Error::at(
            op,
            format!(
                "{} {} and {} {} must have the same shape (reshape one of them; \
                 broadcasting them would compare every {} with every {})",
                what[0],
                type_of(a),
                what[1],
                type_of(b),
                what[0],
                what[1],
            ),
            loc,
        ))
    })
}

fn type_of(t: &Tensor) -> String {
    t.ty().map(|t| t.to_string()).unwrap_or_default()
}

/// Mean squared error of `pred` against `target` of the same shape.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, nn::mse};
/// let pred = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let target = Tensor::from_vec(vec![1.0f32, 4.0], [2]).unwrap();
/// assert_eq!(mse(&pred, &target).item().unwrap(), 2.0);
/// ```
#[track_caller]
pub fn mse(pred: &Tensor, target: &Tensor) -> Tensor {
    let loc = Loc::caller();
    if let Some(e) = same_shape("mse", ["pred", "target"], pred, target, loc) {
        return e;
    }
    composite("mse", loc, || {
        let d = pred - target;
        (&d * &d).mean_all()
    })
}

/// Softmax cross-entropy of `logits` `[..., classes]` against integer `labels` `[...]` (the
/// logits' shape without the class axis), averaged.
///
/// A label outside `[0, classes)` is an error when the labels have values (eager mode); under
/// `jit` its sample's loss is NaN, so the mean is NaN: never a plausible number that silently
/// left the sample out.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::cross_entropy};
/// let logits = Tensor::zeros(DType::F32, [2, 4]);
/// let labels = Tensor::from_vec(vec![0i32, 3], [2]).unwrap();
/// let loss = cross_entropy(&logits, &labels).item().unwrap();
/// assert!((loss - 4f64.ln()).abs() < 1e-6); // uniform over 4 classes
/// let bad = Tensor::from_vec(vec![0i32, 4], [2]).unwrap();
/// assert!(cross_entropy(&logits, &bad).item().is_err());
/// ```
#[track_caller]
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    let loc = Loc::caller();
    if let Some(e) = logits.error().or(labels.error()) {
        return Tensor::failed(e.clone());
    }
    let fail = |msg: String| Tensor::failed(Error::at("cross_entropy", msg, loc));
    let shape = logits.shape();
    let Some((&classes, batch)) = shape.split_last() else {
        return fail(format!(
            "logits must have a class axis, got {}",
            type_of(logits)
        ));
    };
    if !labels.dtype().is_int() {
        return fail(format!(
            "labels must be integers, got {} (for target probabilities use cross_entropy_probs)",
            type_of(labels)
        ));
    }
    if labels.shape() != batch {
        return fail(format!(
            "labels {} must have the logits' shape without the class axis: logits {} need \
             labels of shape {:?}",
            type_of(labels),
            type_of(logits),
            batch
        ));
    }
    if let Some(l) = labels.literal()
        && let Some((k, &y)) = l
            .to_i64s()
            .iter()
            .enumerate()
            .find(|&(_, &y)| y < 0 || y >= classes as i64)
    {
        return fail(format!(
            "label {y} (sample {k}) is outside [0, {classes}) for logits {}",
            type_of(logits)
        ));
    }
    composite("cross_entropy", loc, || {
        let logits = logits.to_inexact();
        let onehot = labels.one_hot(classes, logits.dtype());
        let per_sample = -(&logits.log_softmax(-1) * &onehot).sum(&[-1], false);
        // Under a trace the labels have no values: an out-of-range label's sample is NaN.
        let it = labels.dtype();
        let inside = labels.ge(&Tensor::full(it, [], 0.0)).where_(
            &labels.lt(&Tensor::full(it, [], classes as f64)),
            &Tensor::full(DType::Pred, [], 0.0),
        );
        let nan = Tensor::full(logits.dtype(), [], f64::NAN);
        inside.where_(&per_sample, &nan).mean_all()
    })
}

/// Softmax cross-entropy of `logits` against target probabilities of the same shape, averaged.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::cross_entropy_probs};
/// let logits = Tensor::zeros(DType::F32, [1, 2]);
/// let probs = Tensor::from_vec(vec![0.5f32, 0.5], [1, 2]).unwrap();
/// let loss = cross_entropy_probs(&logits, &probs).item().unwrap();
/// assert!((loss - 2f64.ln()).abs() < 1e-6);
/// ```
#[track_caller]
pub fn cross_entropy_probs(logits: &Tensor, probs: &Tensor) -> Tensor {
    let loc = Loc::caller();
    let op = "cross_entropy_probs";
    if let Some(e) = same_shape(op, ["logits", "probs"], logits, probs, loc) {
        return e;
    }
    composite(op, loc, || {
        -(&logits.log_softmax(-1) * probs)
            .sum(&[-1], false)
            .mean_all()
    })
}

/// Binary cross-entropy of `logits` against 0/1 `targets` of the same shape, computed stably
/// and averaged: max(z, 0) - z y + log(1 + e^-|z|).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, nn::binary_cross_entropy_with_logits as bce};
/// let logits = Tensor::from_vec(vec![0.0f32, 100.0], [2]).unwrap();
/// let targets = Tensor::from_vec(vec![1.0f32, 1.0], [2]).unwrap();
/// // ln 2 for the undecided logit, 0 for the confident right one: their mean.
/// assert!((bce(&logits, &targets).item().unwrap() - 2f64.ln() / 2.0).abs() < 1e-6);
/// ```
#[track_caller]
pub fn binary_cross_entropy_with_logits(logits: &Tensor, targets: &Tensor) -> Tensor {
    let loc = Loc::caller();
    let op = "binary_cross_entropy_with_logits";
    if let Some(e) = same_shape(op, ["logits", "targets"], logits, targets, loc) {
        return e;
    }
    composite(op, loc, || {
        let z = logits;
        (&(&z.relu() - &(z * targets)) + &(-z.abs()).exp().log1p()).mean_all()
    })
}
