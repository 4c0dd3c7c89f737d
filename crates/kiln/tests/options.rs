//! One `Options` value carries every switch: a jitted function can be given its own
//! (`jit(f).options(..)`), which its compiles use instead of the process's.

use kiln::{Options, Tensor, jit};

fn fresh_dir(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-options-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn files_in(d: &std::path::Path) -> usize {
    std::fs::read_dir(d).map_or(0, |r| r.count())
}

#[test]
fn a_jitted_function_compiles_under_its_own_options() {
    let mine = fresh_dir("mine");
    let other = fresh_dir("other");
    kiln::set_options(Options {
        kernel_cache: Some(other.clone()),
        ..kiln::options()
    });
    // A matrix product: its kernels always go through the kernel cache when there is one.
    let f = |x: &(Tensor, Tensor)| x.0.matmul(&x.1).tanh();
    let a = Tensor::from_vec(
        (0..64 * 48).map(|i| i as f32 * 1e-3).collect::<Vec<_>>(),
        [64, 48],
    )
    .unwrap();
    let b = Tensor::from_vec(
        (0..48 * 32).map(|i| i as f32 * 1e-3).collect::<Vec<_>>(),
        [48, 32],
    )
    .unwrap();
    let own = jit(f).options(Options {
        kernel_cache: Some(mine.clone()),
        ..kiln::options()
    });
    let y = own.call(&(a.clone(), b.clone())).unwrap();
    assert!(
        files_in(&mine) > 0,
        "the function's own kernel cache is empty"
    );
    assert_eq!(files_in(&other), 0, "the process's kernel cache was used");
    // The process's options for a function given none.
    let z = jit(f).call(&(a, b)).unwrap();
    assert!(
        files_in(&other) > 0,
        "the process's kernel cache was not used"
    );
    assert_eq!(y.to_vec::<f32>().unwrap(), z.to_vec::<f32>().unwrap());
    let _ = std::fs::remove_dir_all(&mine);
    let _ = std::fs::remove_dir_all(&other);
}
