//! The importer on damaged input: every module of the peer suite (when it is present) and
//! every program exported from JAX (`tests/data/jax`), cut at many positions and with
//! characters dropped or doubled, gives a result or an error, never a panic; and a large
//! module imports fast.

use kiln_stablehlo::{Piece, parse, parse_with_checks, split};
use std::path::Path;
use std::time::Instant;

/// The peer suite's files (none when it is absent) and the JAX programs' modules.
fn suite_texts() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/peer-suites/stablehlo-interpret");
    let mut out = Vec::new();
    for sub in ["", "chlo"] {
        let Ok(rd) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "mlir")
                && let Ok(t) = std::fs::read_to_string(&p)
            {
                out.push((p.display().to_string(), t));
            }
        }
    }
    let jax = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax");
    for e in std::fs::read_dir(jax).into_iter().flatten().flatten() {
        let p = e.path().join("module.mlir");
        if let Ok(t) = std::fs::read_to_string(&p) {
            out.push((p.display().to_string(), t));
        }
    }
    out.sort();
    out
}

/// Imports `text`, failing the test with the input's origin if the importer panics.
fn no_panic(origin: &str, text: &str) {
    let r = std::panic::catch_unwind(|| {
        let _ = parse_with_checks(Piece {
            text,
            first_line: 1,
        });
    });
    assert!(r.is_ok(), "the importer panicked on {origin}:\n{text}");
}

/// The byte offsets of `n` evenly spread character boundaries of `s`.
fn cut_points(s: &str, n: usize) -> Vec<usize> {
    let bounds: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
    let step = (bounds.len() / n).max(1);
    bounds.into_iter().step_by(step).collect()
}

#[test]
fn damaged_suite_modules_never_panic() {
    let texts = suite_texts();
    if texts.is_empty() {
        println!("SKIPPED: the StableHLO peer suite is not present");
        return;
    }
    let mut cases = 0usize;
    for (path, text) in &texts {
        for (k, piece) in split(text).into_iter().enumerate() {
            let t = piece.text;
            for at in cut_points(t, 60) {
                let origin = format!("{path}#{k} cut at byte {at}");
                no_panic(&origin, &t[..at]);
                let next = t[at..].chars().next().map_or(0, char::len_utf8);
                let dropped = format!("{}{}", &t[..at], &t[at + next..]);
                no_panic(
                    &format!("{path}#{k} without the character at byte {at}"),
                    &dropped,
                );
                let doubled = format!("{}{}", &t[..at + next], &t[at..]);
                no_panic(
                    &format!("{path}#{k} with the character at byte {at} doubled"),
                    &doubled,
                );
                cases += 3;
            }
        }
    }
    println!("{cases} damaged modules imported without a panic");
    assert!(cases > 10_000, "too few cases: {cases}");
}

/// A module of `n` ops: a chain of elementwise ops on a vector, in the pretty syntax.
fn big_module(n: usize) -> String {
    let mut s = String::from("func.func @main(%x: tensor<16xf32>) -> tensor<16xf32> {\n");
    s += "  %v0 = stablehlo.add %x, %x : tensor<16xf32>\n";
    let ops = [
        "stablehlo.add",
        "stablehlo.multiply",
        "stablehlo.subtract",
        "stablehlo.maximum",
    ];
    for i in 1..n {
        let op = ops[i % ops.len()];
        s += &format!(
            "  %v{i} = {op} %v{}, %x : tensor<16xf32> loc(\"f.py\":{i}:3)\n",
            i - 1
        );
    }
    s += &format!("  func.return %v{} : tensor<16xf32>\n}}\n", n - 1);
    s
}

#[test]
fn a_module_of_ten_thousand_ops_imports_quickly() {
    let text = big_module(10_000);
    let t = Instant::now();
    let m = parse(&text).expect("the module imports");
    let took = t.elapsed();
    assert_eq!(m.funcs[0].insts.len(), 10_000);
    kiln_ir::verify_module(&m).expect("the imported module verifies");
    println!("imported 10,000 ops ({} bytes) in {took:?}", text.len());
    // The target is 200 ms in a release build; a debug build gets ten times that.
    let limit = if cfg!(debug_assertions) { 2000 } else { 200 };
    assert!(
        took.as_millis() < limit,
        "importing 10,000 ops took {took:?}"
    );
}

/// `depth` `case` ops nested in each other's branches.
fn nested_cases(depth: usize) -> String {
    let mut s = String::from(
        "func.func @main() -> tensor<f32> {\n  %i = stablehlo.constant dense<0> : tensor<i32>\n",
    );
    for _ in 0..depth {
        s += "  %r = \"stablehlo.case\"(%i) ({\n";
    }
    s +=
        "  %c = stablehlo.constant dense<1.0> : tensor<f32>\n  stablehlo.return %c : tensor<f32>\n";
    for k in 0..depth {
        let ret = if k + 1 == depth {
            "func.return"
        } else {
            "stablehlo.return"
        };
        s += &format!("  }}) : (tensor<i32>) -> tensor<f32>\n  {ret} %r : tensor<f32>\n");
    }
    s + "}\n"
}

#[test]
fn deeply_nested_regions_import_or_fail_cleanly() {
    // Within kiln's region nesting limit the module imports; past it, and past the parser's
    // nesting limit, the error says so. None overflows the stack of a test thread.
    let m = parse(&nested_cases(64)).expect("64 nested regions import");
    kiln_ir::verify_module(&m).expect("and verify");
    let e = parse(&nested_cases(65)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("68:3: unsupported: regions nested more than 64 deep"),
        "{e}"
    );
    let e = parse(&nested_cases(400)).unwrap_err();
    assert!(e.to_string().contains("nested more than"), "{e}");
}
