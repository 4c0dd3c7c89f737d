//! The importer through MLIR against kiln-stablehlo's hand-written one: every module of
//! StableHLO's interpreter tests (the peer suite next to the repository) and every JAX
//! program of kiln-stablehlo's test data is written in MLIR's generic op form (the syntax
//! tree printed generically, then parsed and printed again by MLIR with its generic-form
//! flag), imported through MLIR, and compared with the hand-written import of the original
//! text: both kiln modules (and checks) must be equal, or both imports fail alike. Malformed
//! text gives located errors.

use kiln_mlir::stablehlo::{import, import_bytes, parse_ast};
use kiln_stablehlo::import::import_module;
use kiln_stablehlo::{ErrorKind, FuncChecks, Piece, parse_ast as hand_ast, split};
use melior::Context;
use melior::ir::Module;
use melior::ir::operation::{OperationLike, OperationPrintingFlags};
use std::path::{Path, PathBuf};

/// MLIR's generic form of `text` (itself generic text): parsed, verified and printed by MLIR.
fn mlir_generic(text: &str) -> Result<String, String> {
    let ctx = Context::new();
    ctx.set_allow_unregistered_dialects(true);
    melior::dialect::DialectHandle::func().load_dialect(&ctx);
    let messages = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = messages.clone();
    let id = ctx.attach_diagnostic_handler(move |d| {
        sink.borrow_mut().push(format!("{} {d}", d.location()));
        true
    });
    let said = || messages.borrow().join("; ");
    let out = match Module::parse(&ctx, text) {
        None => Err(format!("MLIR cannot parse it ({})", said())),
        Some(m) if !m.as_operation().verify() => Err(format!("MLIR rejects it ({})", said())),
        Some(m) => m
            .as_operation()
            .to_string_with_flags(OperationPrintingFlags::new().print_generic_operation_form())
            .map_err(|e| e.to_string()),
    };
    ctx.detach_diagnostic_handler(id);
    out
}

#[derive(Default, Debug)]
struct Counts {
    same: usize,
    both_refused: usize,
    hand_parser_rejects: usize,
    no_generic_form: usize,
    mismatches: Vec<String>,
    /// Labels of [`KNOWN`] that still differ.
    known: Vec<String>,
}

/// Modules whose two imports are known to differ, each with the reason; each must still
/// differ (the test fails when one agrees, so the list cannot go stale).
const KNOWN: &[(&str, &str)] = &[(
    "constant.mlir#23",
    "0.0 as f8E8M0FNU (no zero): MLIR's APFloat rounds it to the smallest value, 2^-127; kiln \
     converts as ml_dtypes does, to NaN (ml_dtypes and kiln agree on every conversion)",
)];

/// Compares both importers on one module.
fn compare(label: &str, piece: Piece, with_checks: bool, counts: &mut Counts) {
    let ast = match hand_ast(piece) {
        Ok(a) => a,
        Err(_) => {
            // Not StableHLO as kiln reads it: nothing to write generically.
            counts.hand_parser_rejects += 1;
            return;
        }
    };
    let hand = import_module(&ast, with_checks);
    let generic = match kiln_stablehlo::generic::print_generic(&ast) {
        Ok(g) => g,
        // Quantized, tuple and token types: the syntax tree does not keep them as written.
        Err(e) if e.kind == ErrorKind::Unsupported => {
            counts.no_generic_form += 1;
            return;
        }
        Err(e) => {
            counts
                .mismatches
                .push(format!("{label}: no generic form: {e}"));
            return;
        }
    };
    let printed = match mlir_generic(&generic) {
        Ok(p) => p,
        Err(e) => {
            counts.mismatches.push(format!("{label}: {e}:\n{generic}"));
            return;
        }
    };
    let via_mlir = parse_ast(&printed).and_then(|a| import_module(&a, with_checks));
    match (hand, via_mlir) {
        (Ok(h), Ok(m))
            if h.0.to_string() == m.0.to_string()
                && format!("{:?}", unplaced(&h.1)) == format!("{:?}", unplaced(&m.1)) =>
        {
            counts.same += 1
        }
        (Ok(_), Ok(_)) if KNOWN.iter().any(|(k, _)| *k == label) => {
            counts.known.push(label.to_string())
        }
        (Ok(h), Ok(m)) => counts.mismatches.push(format!(
            "{label}: different modules:\n{}\n---\n{}",
            h.0, m.0
        )),
        // Refused alike (unsupported, or invalid for the verifier): the same kind and message;
        // the positions differ, MLIR's printed text being laid out anew.
        (Err(h), Err(m)) if h.kind == m.kind && h.message == m.message => counts.both_refused += 1,
        (h, m) => counts.mismatches.push(format!(
            "{label}: hand-written {:?}, through MLIR {:?}",
            h.map(|_| ()),
            m.map(|_| ())
        )),
    }
}

/// Checks without their positions (which differ between the two texts); compared as text,
/// since a NaN literal is not equal to itself.
fn unplaced(checks: &[FuncChecks]) -> Vec<FuncChecks> {
    let mut checks = checks.to_vec();
    for f in &mut checks {
        for c in &mut f.checks {
            c.pos = Default::default();
        }
        for p in &mut f.prints {
            p.pos = Default::default();
        }
        for t in f.sends.iter_mut().chain(&mut f.recvs) {
            t.pos = Default::default();
        }
    }
    checks
}

fn peer_suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer-suites/stablehlo-interpret")
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn peer_suite_and_jax_programs_import_alike_through_mlir() {
    let mut peer = Counts::default();
    let dir = peer_suite_dir();
    let mut modules = 0;
    for f in files(&dir, "mlir") {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, piece) in split(&text).into_iter().enumerate() {
            if piece.text.lines().all(|l| {
                let l = l.trim();
                l.is_empty() || l.starts_with("//")
            }) {
                continue;
            }
            modules += 1;
            let label = format!("{}#{i}", f.file_name().unwrap().to_string_lossy());
            compare(&label, piece, true, &mut peer);
        }
    }
    let mut jax = Counts::default();
    let jax_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-stablehlo/tests/data/jax");
    let programs = files(&jax_dir, "mlir");
    for f in &programs {
        let text = std::fs::read_to_string(f).unwrap();
        let label = f.display().to_string();
        compare(
            &label,
            Piece {
                text: &text,
                first_line: 1,
            },
            false,
            &mut jax,
        );
    }
    eprintln!(
        "peer suite: {modules} modules: {} same, {} refused alike by both, {} rejected by the \
         hand-written parser, {} without a generic form, {} mismatches; JAX: {} programs: {} \
         same, {} refused alike by both, {} mismatches",
        peer.same,
        peer.both_refused,
        peer.hand_parser_rejects,
        peer.no_generic_form,
        peer.mismatches.len(),
        programs.len(),
        jax.same,
        jax.both_refused,
        jax.mismatches.len()
    );
    for (label, why) in KNOWN {
        if peer.known.iter().any(|k| k == label) {
            eprintln!("known difference, {label}: {why}");
        } else {
            peer.mismatches.push(format!(
                "{label}: both imports now agree; remove it from the known differences ({why})"
            ));
        }
    }
    let all: Vec<_> = peer.mismatches.iter().chain(&jax.mismatches).collect();
    assert!(
        all.is_empty(),
        "{} mismatches:\n{}",
        all.len(),
        all.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    assert!(peer.same > 300, "{peer:?}");
    assert_eq!(jax.same, programs.len(), "{jax:?}");
    assert!(programs.len() >= 6);
}

const ADD: &str = r#"func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
  %0 = "stablehlo.add"(%a, %b) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  "func.return"(%0) : (tensor<2xf32>) -> ()
}
"#;

#[test]
fn generic_text_imports_like_the_hand_written_importer() {
    let m = import(ADD).unwrap();
    assert_eq!(
        m.to_string(),
        kiln_stablehlo::parse(ADD).unwrap().to_string()
    );
}

#[test]
fn an_unsupported_op_names_its_line_and_column() {
    let text = ADD.replace("stablehlo.add", "stablehlo.frobnicate");
    let e = import(&text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("stablehlo.frobnicate"), "{e}");
    // Where the op's name is, as the hand-written importer says.
    assert_eq!((e.pos.line, e.pos.column), (2, 8), "{e}");
    assert_eq!(e, kiln_stablehlo::parse(&text).unwrap_err());
}

/// Each malformed text and the line its error must name.
const MALFORMED: &[(&str, &str, u32)] = &[
    (
        "truncated",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a",
        2,
    ),
    (
        "undefined value",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%b) : (tensor<2xf32>) -> tensor<2xf32>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        2,
    ),
    (
        "wrong result count",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0, %1 = \"stablehlo.abs\"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        2,
    ),
    (
        "unknown type syntax",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a) : (tensor<2xf32>) -> tensor<2xfloaty>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        2,
    ),
    (
        "operand type differs from its value",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a) : (tensor<3xf32>) -> tensor<2xf32>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        2,
    ),
    (
        "return type differs from the function's",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a) : (tensor<2xf32>) -> tensor<2xi32>\n  \"func.return\"(%0) : (tensor<2xi32>) -> ()\n}",
        3,
    ),
    (
        "value defined twice",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n  %0 = \"stablehlo.abs\"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        3,
    ),
    (
        "unclosed string",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs(%a) : (tensor<2xf32>) -> tensor<2xf32>\n}",
        2,
    ),
    (
        "bad attribute",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a) {x = #} : (tensor<2xf32>) -> tensor<2xf32>\n  \"func.return\"(%0) : (tensor<2xf32>) -> ()\n}",
        2,
    ),
    (
        "NUL character",
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.abs\"(%a)\0 : (tensor<2xf32>) -> tensor<2xf32>\n}",
        2,
    ),
    (
        "nested too deep",
        "func.func @main() {\n  \"x.y\"() {a = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]} : () -> ()\n}",
        2,
    ),
    (
        "top-level op other than a function",
        "\"stablehlo.constant\"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>",
        1,
    ),
    (
        "non-tensor type",
        "func.func @main(%a: memref<2xf32>) -> memref<2xf32> {\n  \"func.return\"(%a) : (memref<2xf32>) -> ()\n}",
        1,
    ),
    (
        "region of two blocks",
        "func.func @main(%a: tensor<f32>) -> tensor<f32> {\n  %0 = \"stablehlo.abs\"(%a) : (tensor<f32>) -> tensor<f32>\n  \"func.return\"(%0) : (tensor<f32>) -> ()\n^bb1:\n  \"func.return\"(%a) : (tensor<f32>) -> ()\n}",
        1,
    ),
];

#[test]
fn malformed_text_gives_located_errors() {
    for (what, text, line) in MALFORMED {
        let e = import(text).expect_err(what);
        assert_eq!(e.pos.line, *line, "{what}: {e}");
        assert!(e.pos.column > 0, "{what}: {e}");
        assert!(!e.message.is_empty(), "{what}");
        eprintln!("{what}: {e}");
    }
    let e = import_bytes(b"func.func @main() {\n  \xff\n}").unwrap_err();
    assert_eq!(e.pos.line, 2, "{e}");
}

#[test]
fn large_literals_that_mlir_prints_in_hex_import_alike() {
    let floats: Vec<String> = (0..150).map(|i| format!("{}.5", i - 75)).collect();
    let ints: Vec<String> = (0..150).map(|i| (i - 75).to_string()).collect();
    let bools: Vec<String> = (0..150).map(|i| (i % 3 == 0).to_string()).collect();
    let text = format!(
        "func.func @main() -> (tensor<150xf32>, tensor<150xi8>, tensor<150xi1>) {{\n  \
         %0 = \"stablehlo.constant\"() {{value = dense<[{}]> : tensor<150xf32>}} : () -> tensor<150xf32>\n  \
         %1 = \"stablehlo.constant\"() {{value = dense<[{}]> : tensor<150xi8>}} : () -> tensor<150xi8>\n  \
         %2 = \"stablehlo.constant\"() {{value = dense<[{}]> : tensor<150xi1>}} : () -> tensor<150xi1>\n  \
         \"func.return\"(%0, %1, %2) : (tensor<150xf32>, tensor<150xi8>, tensor<150xi1>) -> ()\n}}\n",
        floats.join(", "),
        ints.join(", "),
        bools.join(", ")
    );
    let via_mlir = import(&text).unwrap();
    assert_eq!(
        via_mlir.to_string(),
        kiln_stablehlo::parse(&text).unwrap().to_string()
    );
}
