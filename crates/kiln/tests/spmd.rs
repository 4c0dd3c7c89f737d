//! `kiln::spmd`: jitted functions run by every process of a grid, their collectives meeting
//! on threads; data-parallel gradients against the full-batch gradient; every collective's
//! gradient through the grid; and the errors of processes that do not meet.

use kiln::{DType, Tensor, grad, jit, spmd};

fn vec_f64(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()]).unwrap()
}

/// The gradient of a squared loss over a batch split across four replicas, summed with
/// `all_reduce_sum`, is the full batch's gradient on every replica.
#[test]
fn data_parallel_gradient_is_the_full_batch_gradient() {
    let data: Vec<f64> = (0..8).map(|i| i as f64 * 0.5 - 1.0).collect();
    let w = 0.75;
    let loss = |w: &Tensor, x: &Tensor| {
        let d = (x * w) - 1.0;
        (&d * &d).sum_all()
    };
    let step = jit(move |x: &Tensor| {
        let w = Tensor::scalar(w);
        let g = grad(|w: &Tensor| loss(w, x))(&w);
        spmd::all_reduce_sum(&g, &[])
    });
    let shards: Vec<Tensor> = data.chunks(2).map(vec_f64).collect();
    let out = spmd::run(spmd::Grid::new(4, 1), &step, &shards).unwrap();
    let full = grad(|w: &Tensor| loss(w, &vec_f64(&data)))(&Tensor::scalar(w));
    let want = full.item().unwrap();
    for g in &out {
        assert!((g.item().unwrap() - want).abs() < 1e-12, "{g:?} vs {want}");
    }
}

/// Every process knows its place: replica and partition indices on a 2 x 3 grid.
#[test]
fn processes_see_their_indices() {
    let f = jit(|x: &Tensor| {
        let r = spmd::replica_id().cast(DType::F32);
        let p = spmd::partition_id().cast(DType::F32);
        x + &(r * 10.0 + p)
    });
    let inputs: Vec<Tensor> = (0..6).map(|_| Tensor::scalar(0.5f32)).collect();
    let out = spmd::run(spmd::Grid::new(2, 3), &f, &inputs).unwrap();
    let got: Vec<f32> = out.iter().map(|t| t.item().unwrap() as f32).collect();
    assert_eq!(got, [0.5, 1.5, 2.5, 10.5, 11.5, 12.5]);
}

/// The gradient of `all_gather` reaches every process: with the loss of replica `q` weighted
/// by `q + 1`, the global loss is `(1 + 2 + 3) * sum of every shard`, so each shard's gradient
/// is 6 everywhere; the reduce-scatter back (and the all-to-all and permutation inverses)
/// give it.
#[test]
fn collective_gradients_flow_across_processes() {
    let weight = || spmd::replica_id().cast(DType::F64) + 1.0;
    let gather = jit(move |x: &Tensor| {
        grad(|x: &Tensor| spmd::all_gather(x, 0, &[]).sum_all() * weight())(x)
    });
    let inputs: Vec<Tensor> = (0..3).map(|i| vec_f64(&[i as f64, 1.0])).collect();
    for g in spmd::run(spmd::Grid::new(3, 1), &gather, &inputs).unwrap() {
        assert_eq!(g.to_vec::<f64>().unwrap(), [6.0, 6.0]);
    }
    // A shift to the next replica: replica p's shard reaches replica p + 1 (weight p + 2),
    // the last one's reaches nobody.
    let shift = jit(move |x: &Tensor| {
        grad(|x: &Tensor| spmd::collective_permute(x, &[(0, 1), (1, 2)]).sum_all() * weight())(x)
    });
    let out = spmd::run(spmd::Grid::new(3, 1), &shift, &inputs).unwrap();
    let got: Vec<Vec<f64>> = out.iter().map(|g| g.to_vec::<f64>().unwrap()).collect();
    assert_eq!(got, [vec![2.0, 2.0], vec![3.0, 3.0], vec![0.0, 0.0]]);
    // all_to_all on two replicas: element j of replica p goes to replica j, weighted j + 1.
    let a2a = jit(move |x: &Tensor| {
        grad(|x: &Tensor| spmd::all_to_all(x, 0, 0, 2, &[]).sum_all() * weight())(x)
    });
    let two: Vec<Tensor> = (0..2).map(|_| vec_f64(&[1.0, 2.0])).collect();
    for g in spmd::run(spmd::Grid::new(2, 1), &a2a, &two).unwrap() {
        assert_eq!(g.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    }
}

/// A process that skips the collective its peer runs makes the run fail, naming it, instead
/// of waiting forever; a wrong number of inputs is an error too.
#[test]
fn processes_that_do_not_meet_are_errors() {
    let f = jit(|x: &Tensor| {
        if x.shape()[0] == 2 {
            spmd::all_reduce_sum(x, &[])
        } else {
            x * 2.0
        }
    });
    let inputs = [vec_f64(&[1.0, 2.0]), vec_f64(&[1.0, 2.0, 3.0])];
    let e = spmd::run(spmd::Grid::new(2, 1), &f, &inputs).unwrap_err();
    assert!(
        e.to_string()
            .contains("finished without joining all_reduce"),
        "{e}"
    );
    let e = spmd::run(spmd::Grid::new(2, 1), &f, &inputs[..1]).unwrap_err();
    assert!(e.to_string().contains("needs one input per process"), "{e}");
    // Groups that name a replica past the grid.
    let g = jit(|x: &Tensor| spmd::all_reduce_sum(x, &[vec![0, 5]]));
    let e = spmd::run(
        spmd::Grid::new(2, 1),
        &g,
        &[inputs[0].clone(), inputs[0].clone()],
    )
    .unwrap_err();
    assert!(e.to_string().contains("all_reduce_c1"), "{e}");
}
