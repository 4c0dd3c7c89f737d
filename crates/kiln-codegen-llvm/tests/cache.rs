//! The on-disk kernel cache: a second compile of the same function loads its kernels, a
//! damaged library is rebuilt, a different function does not load it, GEMM routines compiled
//! for one function serve the next (a damaged one is rebuilt), and every result agrees with
//! the reference. The cache is private: created 0700 with files 0600, and a directory or file
//! that others may write is neither loaded from nor written to.

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

/// A function that goes through the kernel cache (it has a GEMM, of rows enough to pack B
/// through the shared routines), its arguments and the reference's results.
fn cached_case() -> (kiln_ir::Func, Vec<kiln_ir::Literal>, Vec<kiln_ir::Literal>) {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[40,16], %1: f32[16,20]) -> f32[40,20] {
  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[40,20]
  %3 = tanh %2 : f32[40,20]
  return %3
}
",
    )
    .unwrap();
    let args = common::random_args(&f, 11);
    let want = kiln_reference::eval(&f, &args).unwrap();
    (f, args, want)
}

fn temp_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cache-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn chmod(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn files(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    v
}

#[test]
fn the_cache_is_created_private() {
    let base = temp_dir("private");
    // kiln creates the directory and its missing parents, each for its owner only.
    let dir = base.join("kiln").join("kernels");
    let (f, args, want) = cached_case();
    let e = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(e.in_kernel_cache());
    close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
    for d in [&base, &base.join("kiln"), &dir] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let stored: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(stored.len() >= 4, "a library, routines and their checksums");
    for e in stored {
        assert_eq!(mode(&e.path()), 0o600, "{}", e.path().display());
    }
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_cache_directory_others_can_write_is_not_used() {
    let dir = temp_dir("shared-dir");
    let (f, args, want) = cached_case();
    let e = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(e.in_kernel_cache() && !e.loaded_from_cache());
    assert!(
        CpuExecutable::compile_with_cache(&f, Some(&dir))
            .unwrap()
            .loaded_from_cache()
    );
    let before = files(&dir, "");
    chmod(&dir, 0o777);
    // Anyone could have put a library there: nothing is loaded from it or stored in it, and
    // the function still compiles (with the JIT) and runs.
    let e = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(!e.loaded_from_cache() && !e.in_kernel_cache());
    close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
    let g = kiln_ir::parse_func_text(&f.to_string().replace("f32[40,", "f32[41,")).unwrap();
    let e = CpuExecutable::compile_with_cache(&g, Some(&dir)).unwrap();
    assert!(!e.in_kernel_cache());
    assert_eq!(files(&dir, ""), before, "nothing is written into it");
    // Group-writable is refused too.
    chmod(&dir, 0o770);
    assert!(
        !CpuExecutable::compile_with_cache(&f, Some(&dir))
            .unwrap()
            .in_kernel_cache()
    );
    chmod(&dir, 0o700);
    assert!(
        CpuExecutable::compile_with_cache(&f, Some(&dir))
            .unwrap()
            .loaded_from_cache()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_file_others_can_write_is_not_loaded() {
    let dir = temp_dir("shared-file");
    let (f, args, want) = cached_case();
    CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    for ext in [".so", ".sum"] {
        // The library or its checksum (not the routines' `.o.sum` files).
        let found: Vec<_> = files(&dir, ext)
            .into_iter()
            .filter(|p| !p.to_string_lossy().ends_with(".o.sum"))
            .collect();
        let [p] = &found[..] else {
            panic!("one {ext} file: {found:?}")
        };
        chmod(p, 0o666);
        let e = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
        assert!(
            !e.loaded_from_cache(),
            "a world-writable {ext} is not loaded"
        );
        assert!(e.in_kernel_cache(), "but rebuilt");
        close(&e.run(&args).unwrap()[0], &want[0]).unwrap();
        assert_eq!(mode(p), 0o600, "{}", p.display());
        assert!(
            CpuExecutable::compile_with_cache(&f, Some(&dir))
                .unwrap()
                .loaded_from_cache()
        );
    }
    // A GEMM routine's object that others can write is compiled again (and stored privately).
    let routines = files(&dir, ".o");
    assert!(!routines.is_empty());
    for o in &routines {
        chmod(o, 0o646);
    }
    let g = kiln_ir::parse_func_text(&f.to_string().replace("f32[40,", "f32[41,")).unwrap();
    CpuExecutable::compile_with_cache(&g, Some(&dir)).unwrap();
    for o in &routines {
        assert_eq!(mode(o), 0o600, "{} is rebuilt", o.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_dir_names_the_directory_and_says_why() {
    use kiln_codegen_llvm::cache::{check_dir, distrust, usable};
    let dir = temp_dir("check");
    let name = dir.display().to_string();
    // Not there yet: not a cache to load from, but usable (it is created private).
    assert!(check_dir(&dir).unwrap_err().contains(&name));
    assert!(usable(&dir));
    std::fs::create_dir(&dir).unwrap();
    for ok in [0o700, 0o755, 0o500] {
        chmod(&dir, ok);
        assert_eq!(check_dir(&dir), Ok(()), "{ok:o}");
        assert!(usable(&dir));
    }
    for (bad, why) in [
        (0o777, "writable by its group and all users (mode 777)"),
        (0o1777, "writable by its group and all users (mode 1777)"),
        (0o770, "writable by its group (mode 770)"),
        (0o702, "writable by all users (mode 702)"),
    ] {
        chmod(&dir, bad);
        let e = check_dir(&dir).unwrap_err();
        assert_eq!(e, format!("kernel cache directory {name}: it is {why}"));
        assert!(!usable(&dir));
    }
    chmod(&dir, 0o700);
    // Owned by another user (only root can give it away: elsewhere this part is skipped).
    if std::os::unix::fs::chown(&dir, Some(65534), None).is_ok() {
        let e = check_dir(&dir).unwrap_err();
        assert!(
            e.contains(&name) && e.contains("owned by user 65534"),
            "{e}"
        );
        assert!(!usable(&dir));
    }
    let file = dir.join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(
        check_dir(&file)
            .unwrap_err()
            .ends_with("it is not a directory")
    );
    let _ = std::fs::remove_dir_all(&dir);
    // The rule itself.
    assert_eq!(distrust(0o40700, 1000, 1000), None);
    assert_eq!(distrust(0o100644, 1000, 1000), None);
    assert!(distrust(0o700, 0, 1000).is_some_and(|w| w.contains("owned by user 0")));
    assert!(distrust(0o100620, 1000, 1000).is_some_and(|w| w.contains("its group")));
}
