//! The on-disk kernel cache: a second compile of the same function loads its kernels, a
//! damaged library is rebuilt, a different function does not load it, GEMM routines compiled
//! for one function serve the next (a damaged one is rebuilt), and every result agrees with
//! the reference.

mod common;

use common::close;
use kiln_codegen_llvm::cpu::CpuExecutable;

#[test]
fn cached_kernels_load_verify_and_agree() {
    let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[40,30], %1: f32[30,50], %2: f32[50]) -> f32[40,50] {
  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,50]
  %4 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[40,50]
  %5 = add %3, %4 : f32[40,50]
  %6 = tanh %5 : f32[40,50]
  return %6
}
",
    )
    .unwrap();
    let args = common::random_args(&f, 7);
    let want = kiln_reference::eval(&f, &args).unwrap();
    let run = |expect_hit: bool, what: &str| {
        let e = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
        assert_eq!(e.loaded_from_cache(), expect_hit, "{what}");
        close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
    };
    run(false, "the first compile builds the library");
    run(true, "the second loads it");
    // Damage the library: its checksum no longer matches, so it is rebuilt.
    let so = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "so"))
        .expect("a stored library");
    let mut bytes = std::fs::read(&so).unwrap();
    bytes.push(0);
    std::fs::write(&so, bytes).unwrap();
    run(false, "a damaged library is rebuilt");
    run(true, "and then loaded");
    // The GEMM routines (register tiles, packing of B) are objects of their own, shared by every
    // function whose products use the same tiles.
    let routines = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "o"))
            .collect();
        v.sort();
        v
    };
    let before = routines();
    assert!(!before.is_empty(), "the GEMM's routines are stored");
    // The same function with another shape or another operation has kernels of its own: it
    // must not load this library, whose key covers the kernels it was built from. Both use
    // the first one's GEMM routines, and store none of their own.
    for (from, to) in [("f32[40,", "f32[41,"), ("tanh", "exponential")] {
        let g = kiln_ir::parse_func_text(&f.to_string().replace(from, to)).unwrap();
        let args = common::random_args(&g, 8);
        let want = kiln_reference::eval(&g, &args).unwrap();
        let e = CpuExecutable::compile_with_cache(&g, Some(&dir)).unwrap();
        assert!(!e.loaded_from_cache(), "{g}");
        close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
        assert_eq!(routines(), before, "{g}");
    }
    // A damaged routine object fails its checksum and is compiled again.
    for o in &before {
        std::fs::write(o, b"not an object").unwrap();
    }
    let g = kiln_ir::parse_func_text(&f.to_string().replace("f32[40,", "f32[39,")).unwrap();
    let args_g = common::random_args(&g, 10);
    let want_g = kiln_reference::eval(&g, &args_g).unwrap();
    let e = CpuExecutable::compile_with_cache(&g, Some(&dir)).unwrap();
    close(&e.run(&args_g).unwrap()[0], &want_g[0]).unwrap();
    assert_eq!(routines(), before);
    assert!(
        before
            .iter()
            .all(|o| std::fs::read(o).unwrap() != b"not an object"),
        "damaged routines are rebuilt"
    );
    // A function without a GEMM whose kernel is large as emitted (here erf, tanh and logistic)
    // goes through the cache too; a small one (an add) is JIT-compiled every time.
    for (src, cached) in [
        (
            "func @main(%0: f32[100,100]) -> f32[100,100] {\n  %1 = erf %0 : f32[100,100]\n  %2 = tanh %0 : f32[100,100]\n  %3 = logistic %0 : f32[100,100]\n  %4 = multiply %2, %3 : f32[100,100]\n  %5 = add %1, %4 : f32[100,100]\n  return %5\n}\n",
            true,
        ),
        (
            "func @main(%0: f32[100,100]) -> f32[100,100] {\n  %1 = add %0, %0 : f32[100,100]\n  return %1\n}\n",
            false,
        ),
    ] {
        let g = kiln_ir::parse_func_text(src).unwrap();
        let args = common::random_args(&g, 9);
        let want = kiln_reference::eval(&g, &args).unwrap();
        for second in [false, true] {
            let e = CpuExecutable::compile_with_cache(&g, Some(&dir)).unwrap();
            assert_eq!(e.loaded_from_cache(), cached && second, "{g}");
            close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
        }
    }
    // Without a cache, the JIT compiles it.
    let e = CpuExecutable::compile_with_cache(&f, None).unwrap();
    assert!(!e.loaded_from_cache());
    close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
