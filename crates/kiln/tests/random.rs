//! `kiln::random` against known answers produced by `jax.random` 0.10.2 (Threefry-2x32,
//! partitionable layout, JAX's default).

use kiln::random::{bits, fold_in, key, normal, split, uniform};
use kiln::{DType, Tensor, jit};

#[test]
fn bits_split_fold_in_match_jax() {
    let k = key(42);
    assert_eq!(k.0.to_vec::<u32>().unwrap(), vec![0, 42]);
    assert_eq!(
        bits(&k, &[5]).to_vec::<u32>().unwrap(),
        vec![2098992034, 2919706841, 2646866425, 2409546199, 1935504149]
    );
    let s: Vec<Vec<u32>> = split(&k, 3)
        .iter()
        .map(|k| k.0.to_vec::<u32>().unwrap())
        .collect();
    assert_eq!(
        s,
        vec![
            vec![1832780943, 270669613],
            vec![64467757, 2916123636],
            vec![2465931498, 255383827]
        ]
    );
    assert_eq!(
        fold_in(&k, 7).0.to_vec::<u32>().unwrap(),
        vec![2547012911, 1371500959]
    );
    assert_eq!(
        bits(&key(0), &[2, 3]).to_vec::<u32>().unwrap(),
        vec![
            4070199207, 4202968722, 1427181096, 2012915765, 2447653815, 710830403
        ]
    );
}

#[test]
fn uniform_and_normal_match_jax_bit_for_bit() {
    let k = key(42);
    let u: Vec<u32> = uniform(&k, &[4], DType::F32, 0.0, 1.0)
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(u, vec![1056585764, 1059981104, 1058915320, 1057988288]);
    // `jax.random.normal(jax.random.PRNGKey(42), (4,))` in JAX 0.10.2, as bits: equal eagerly
    // and compiled.
    let want = vec![3169312533u32, 1055861736, 1050109537, 1042103076];
    let bits_of = |t: Tensor| -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert_eq!(bits_of(normal(&k, &[4], DType::F32)), want, "eager");
    let compiled = jit(|k: &kiln::random::Key| normal(k, &[4], DType::F32))
        .call(&k)
        .unwrap();
    assert_eq!(bits_of(compiled), want, "jit");
}

#[test]
fn random_numbers_trace_and_compile() {
    let draw = jit(|k: &kiln::random::Key| uniform(k, &[3], DType::F32, -1.0, 1.0));
    let eager = uniform(&key(5), &[3], DType::F32, -1.0, 1.0)
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(draw.call(&key(5)).unwrap().to_vec::<f32>().unwrap(), eager);
    let n = normal(&key(1), &[4000], DType::F32);
    let mean = n.mean_all().item().unwrap();
    let var = (&n * &n).mean_all().item().unwrap() - mean * mean;
    assert!(
        mean.abs() < 0.05 && (var - 1.0).abs() < 0.08,
        "mean {mean}, var {var}"
    );
}
