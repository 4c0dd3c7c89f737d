//! The `tabular` example on real data: the iris flowers that `linfa-datasets` ships, split by
//! a seeded shuffle, trained through a `DataLoader`, scored on the held-out samples.

#[path = "../examples/tabular.rs"]
mod tabular;

#[test]
fn iris_is_learned_well_above_chance() {
    let t = tabular::iris();
    assert_eq!((t.rows(), t.features, t.classes), (150, 4, 3));
    assert_eq!(t.x.len(), 150 * 4);
    assert!(t.y.iter().all(|c| (0..3).contains(c)));
    let r = tabular::run(&t, 16, 25, 16, false).unwrap();
    assert_eq!((r.train_rows, r.test_rows), (120, 30));
    assert_eq!(r.steps, 25 * (120 / 16));
    assert_eq!(r.compiles, 1, "full batches only: one shape, one compile");
    // Chance is 1/3; a linear model reaches about 95% on iris.
    assert!(
        r.test_accuracy >= 0.85,
        "held-out accuracy {:.3} (train {:.3}, loss {:.4})",
        r.test_accuracy,
        r.train_accuracy,
        r.last_loss
    );
    assert!(
        r.train_accuracy >= 0.85,
        "train accuracy {:.3}",
        r.train_accuracy
    );
    // Deterministic: the same seeds give the same split, batches and model.
    let again = tabular::run(&t, 16, 25, 16, false).unwrap();
    assert_eq!(again.test_accuracy, r.test_accuracy);
    assert_eq!(again.last_loss, r.last_loss);
}

#[test]
fn wine_quality_beats_always_guessing_the_commonest_score() {
    let t = tabular::wine();
    assert_eq!((t.rows(), t.features, t.classes), (1599, 11, 6));
    assert!(t.x.iter().all(|v| v.is_finite()));
    let commonest = (0..6)
        .map(|c| t.y.iter().filter(|&&y| y == c).count())
        .max()
        .unwrap() as f64
        / t.rows() as f64;
    let r = tabular::run(&t, 32, 20, 16, false).unwrap();
    // About 43% of the wines share the commonest score; the MLP reaches about 58%.
    assert!(
        r.test_accuracy >= 0.52 && r.test_accuracy > commonest + 0.05,
        "held-out accuracy {:.3}, commonest score {commonest:.3}",
        r.test_accuracy
    );
}
