//! The interpreter's instrumentation: `interpreter.probe` passes its value through and records
//! it, `check.expect_serialized_eq` compares bytes with a probed value, and `interpreter.print`
//! makes its value an output to print; each is a located error where kiln cannot read it.

use kiln_reference::eval;
use kiln_stablehlo::{ErrorKind, Piece, parse, parse_with_checks};

/// Imports `text` with its checks, runs its first function and verifies the checks.
fn checks_pass(text: &str) -> Result<(), String> {
    let m = parse_with_checks(Piece {
        text,
        first_line: 1,
    })
    .map_err(|e| e.to_string())?;
    let outs = eval(&m.module.funcs[0], &[]).map_err(|e| e.to_string())?;
    m.checks[0].checks.iter().try_for_each(|c| c.verify(&outs))
}

/// A function that probes `%x = value` under `"p"` twice (`%x`, then `%x + %x`) and checks
/// `%v = expected` against the probe's iteration `iter`.
fn probed(ty: &str, value: &str, expected: &str, iter: u32) -> String {
    format!(
        "func.func @main() {{
  %x = stablehlo.constant dense<{value}> : {ty}
  %v = stablehlo.constant dense<{expected}> : {ty}
  %p = interpreter.probe %x, probe_id = \"p\" : {ty}
  %y = stablehlo.add %p, %p : {ty}
  %q = interpreter.probe %y, probe_id = \"p\" : {ty}
  check.expect_serialized_eq %v, probe_id = \"p\", iter = {iter} : {ty}
  func.return
}}"
    )
}

#[test]
fn serialized_eq_compares_the_probed_bytes() {
    assert_eq!(
        checks_pass(&probed("tensor<2xf32>", "[1.5, -2.0]", "[1.5, -2.0]", 0)),
        Ok(())
    );
    assert_eq!(
        checks_pass(&probed("tensor<2xf32>", "[1.5, -2.0]", "[3.0, -4.0]", 1)),
        Ok(())
    );
    // Equal as numbers, not as bytes: 0.0 and -0.0.
    let e = checks_pass(&probed("tensor<2xf32>", "[0.0, 1.0]", "[-0.0, 1.0]", 0)).unwrap_err();
    assert!(e.contains("element 0") && e.contains("bytes differ"), "{e}");
    let e = checks_pass(&probed("tensor<2xi64>", "[7, 8]", "[7, 8]", 1)).unwrap_err();
    assert!(e.contains("element 0: got 7, expected 14"), "{e}");
}

#[test]
fn a_probe_is_its_operand() {
    let m = parse_with_checks(Piece {
        text: &probed("tensor<2xi32>", "[1, 2]", "[1, 2]", 0),
        first_line: 1,
    })
    .unwrap();
    let text = kiln_ir::print_module(&m.module);
    assert!(!text.contains("probe"), "{text}");
}

/// A loop of `n` iterations adding 10 to a sum each time, probing the sum under `"s"` after
/// one probe before the loop; the check reads the probe's execution `iter`.
fn looped(n: i64, expected: i64, iter: u32) -> String {
    format!(
        "func.func @main() {{
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %ten = stablehlo.constant dense<10> : tensor<i64>
  %n = stablehlo.constant dense<{n}> : tensor<i64>
  %v = stablehlo.constant dense<{expected}> : tensor<i64>
  %z = interpreter.probe %zero, probe_id = \"s\" : tensor<i64>
  %i, %sum = stablehlo.while(%a = %zero, %b = %z) : tensor<i64>, tensor<i64>
  cond {{
    %c = stablehlo.compare LT, %a, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }} do {{
    %s = stablehlo.add %b, %ten : tensor<i64>
    %p = interpreter.probe %s, probe_id = \"s\" : tensor<i64>
    %j = stablehlo.add %a, %one : tensor<i64>
    stablehlo.return %j, %p : tensor<i64>, tensor<i64>
  }}
  check.expect_serialized_eq %v, probe_id = \"s\", iter = {iter} : tensor<i64>
  func.return
}}"
    )
}

/// A function whose `if` on `pred` probes `1` (true) or `2` (false) under `"b"`, after a probe
/// of `0` before it; the check reads execution `iter`.
fn branched(pred: bool, expected: i64, iter: u32) -> String {
    format!(
        "func.func @main() {{
  %c = stablehlo.constant dense<{pred}> : tensor<i1>
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %v = stablehlo.constant dense<{expected}> : tensor<i64>
  %z = interpreter.probe %zero, probe_id = \"b\" : tensor<i64>
  %r = \"stablehlo.if\"(%c) ({{
    %one = stablehlo.constant dense<1> : tensor<i64>
    %p = interpreter.probe %one, probe_id = \"b\" : tensor<i64>
    stablehlo.return %p : tensor<i64>
  }}, {{
    %two = stablehlo.constant dense<2> : tensor<i64>
    %q = interpreter.probe %two, probe_id = \"b\" : tensor<i64>
    stablehlo.return %q : tensor<i64>
  }}) : (tensor<i1>) -> tensor<i64>
  check.expect_serialized_eq %v, probe_id = \"b\", iter = {iter} : tensor<i64>
  func.return
}}"
    )
}

#[test]
fn a_probe_in_a_branch_records_the_branch_taken() {
    assert_eq!(checks_pass(&branched(true, 0, 0)), Ok(()));
    assert_eq!(checks_pass(&branched(true, 1, 1)), Ok(()));
    assert_eq!(checks_pass(&branched(false, 2, 1)), Ok(()));
    // The check's operand is what it got, the probed value what it expected.
    let e = checks_pass(&branched(false, 1, 1)).unwrap_err();
    assert!(e.contains("got 1, expected 2"), "{e}");
}

#[test]
fn a_probe_in_a_loop_records_each_iteration() {
    // Execution 0 is before the loop; execution k > 0 is iteration k - 1 of the loop.
    assert_eq!(checks_pass(&looped(3, 0, 0)), Ok(()));
    assert_eq!(checks_pass(&looped(3, 10, 1)), Ok(()));
    assert_eq!(checks_pass(&looped(3, 30, 3)), Ok(()));
    let e = checks_pass(&looped(3, 20, 3)).unwrap_err();
    assert!(e.contains("got 20, expected 30"), "{e}");
    // The loop stops after 2 iterations: there is no execution 3.
    let e = checks_pass(&looped(2, 0, 3)).unwrap_err();
    assert!(e.contains("whether the loop ran execution 3"), "{e}");
}

#[test]
fn print_makes_its_value_an_output() {
    let text = "func.func @main() -> tensor<2xi32> {
  %0 = stablehlo.iota dim = 0 : tensor<2xi32>
  %1 = stablehlo.add %0, %0 : tensor<2xi32>
  interpreter.print %1 : tensor<2xi32>
  return %0 : tensor<2xi32>
}";
    let m = parse_with_checks(Piece {
        text,
        first_line: 1,
    })
    .unwrap();
    let p = &m.checks[0].prints;
    assert_eq!((p.len(), p[0].name.as_str(), p[0].output), (1, "1", 1));
    let outs = eval(&m.module.funcs[0], &[]).unwrap();
    assert_eq!(outs[1].to_i64s(), [0, 2]);
}

/// Asserts that `text` (imported with checks) fails at `at` with `what`, of `kind`.
#[track_caller]
fn fails(text: &str, kind: ErrorKind, at: &str, what: &str) {
    let e = match parse_with_checks(Piece {
        text,
        first_line: 1,
    }) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e,
    };
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{at}: ")) && shown.contains(what) && e.kind == kind,
        "expected {kind:?} at {at}: …{what}…, got {:?}: {shown}",
        e.kind
    );
}

#[test]
fn instrumentation_kiln_cannot_read_is_located() {
    fails(
        &probed("tensor<i32>", "1", "1", 2),
        ErrorKind::Invalid,
        "7:3",
        "no value was probed under \"p\" for iteration 2 before this check",
    );
    // In one branch a probe runs, in the other not: which executions happened would depend
    // on the branch taken.
    let branch = "func.func @main() {
  %i = stablehlo.constant dense<0> : tensor<i32>
  %r = \"stablehlo.case\"(%i) ({
    %x = stablehlo.constant dense<1> : tensor<i64>
    %p = interpreter.probe %x, probe_id = \"p\" : tensor<i64>
    stablehlo.return %p : tensor<i64>
  }, {
    %y = stablehlo.constant dense<2> : tensor<i64>
    stablehlo.return %y : tensor<i64>
  }) : (tensor<i32>) -> tensor<i64>
  func.return
}";
    let e = parse_with_checks(Piece {
        text: branch,
        first_line: 1,
    })
    .unwrap_err();
    assert_eq!(
        (e.kind, e.pos.to_string()),
        (ErrorKind::Unsupported, "3:8".into())
    );
    assert!(
        e.message.contains("the probes under \"p\" of branch 1"),
        "{e}"
    );
    // A probe in a branch of a branch.
    let nested = "func.func @main() {
  %i = stablehlo.constant dense<0> : tensor<i32>
  %r = \"stablehlo.case\"(%i) ({
    %s = \"stablehlo.case\"(%i) ({
      %x = stablehlo.constant dense<1> : tensor<i64>
      %p = interpreter.probe %x, probe_id = \"p\" : tensor<i64>
      stablehlo.return %p : tensor<i64>
    }) : (tensor<i32>) -> tensor<i64>
    stablehlo.return %s : tensor<i64>
  }) : (tensor<i32>) -> tensor<i64>
  func.return
}";
    fails(
        nested,
        ErrorKind::Unsupported,
        "6:12",
        "`interpreter.probe` here",
    );
    // Without checks, nothing reads what is probed or printed.
    let e = parse(&probed("tensor<i32>", "1", "1", 0)).unwrap_err();
    assert_eq!(
        (e.kind, e.pos.to_string()),
        (ErrorKind::Unsupported, "4:8".into())
    );
}
