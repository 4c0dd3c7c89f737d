//! `call`: text round trips, module resolution, the verifier's call constraints and inlining.

use kiln_ir::{
    Builder, Callee, DType, Loc, Module, Op, TensorType, inline_calls, parse_func_text,
    parse_module, print_func, print_module, verify, verify_module,
};

const SRC: &str = "func @main(%0: f32[2], %1: f32[2]) -> (f32[2], f32[2]) {
  %2 = call %0, %1 {callee = @mix} : f32[2]
  %3 = call %2, %0 {callee = @mix} : f32[2]
  %4, %5 = call %3 {callee = @pair} : f32[2], f32[2]
  return %4, %5
}

func @pair(%0: f32[2]) -> (f32[2], f32[2]) {
  %1 = negate %0 : f32[2]
  return %0, %1
}

func @mix(%0: f32[2], %1: f32[2]) -> f32[2] {
  %2, %3 = call %0 {callee = @pair} : f32[2], f32[2]
  %4 = add %3, %1 : f32[2]
  return %4
}
";

#[test]
fn a_module_with_calls_round_trips_and_verifies() {
    let m = parse_module(SRC).unwrap();
    verify_module(&m).unwrap();
    assert_eq!(print_module(&m), SRC);
    // Each call holds the module's function it names.
    let main = m.entry().unwrap();
    let Op::Call { callee } = &main.insts[0].op else {
        panic!("a call")
    };
    assert_eq!(callee.func.as_deref(), m.func("mix"));
}

#[test]
fn a_function_prints_with_its_callees_and_reads_back() {
    let m = parse_module(SRC).unwrap();
    let main = m.entry().unwrap();
    let text = print_func(main);
    // The callees follow, callees before callers, each once.
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("func @"))
        .map(|l| &l[..l.find('(').unwrap()])
        .collect();
    assert_eq!(names, ["main", "pair", "mix"]);
    let back = parse_func_text(&text).unwrap();
    assert_eq!(&back, main);
    verify(&back).unwrap();
    // A module of one function gains its callees.
    let again = Module::from_func(back);
    assert_eq!(again.funcs.len(), 3);
    verify_module(&again).unwrap();
    assert_eq!(parse_module(&print_module(&again)).unwrap(), again);
}

#[test]
fn a_function_text_rejects_functions_it_does_not_call() {
    let src = "func @main(%0: f32[]) -> f32[] {\n  return %0\n}\n\nfunc @other(%0: f32[]) -> f32[] {\n  return %0\n}\n";
    let e = parse_func_text(src).unwrap_err();
    assert_eq!((e.line, e.column), (5, 1), "{e}");
    assert!(e.message.contains("@other"), "{e}");
}

#[test]
fn inlining_removes_every_call_and_keeps_the_callers_line() {
    let mut m = parse_module(SRC).unwrap();
    let loc = Loc {
        file: "model.rs",
        line: 7,
        column: 3,
    };
    m.funcs[0].insts[1].loc = Some(loc);
    let f = inline_calls(&m.funcs[0]).unwrap();
    verify(&f).unwrap();
    assert!(!kiln_ir::inline::has_calls(&f));
    // mix: pair's negate and an add; twice; then pair's negate.
    let ops: Vec<&str> = f.insts.iter().map(|i| i.op.mnemonic()).collect();
    assert_eq!(ops, ["negate", "add", "negate", "add", "negate"]);
    // The second call's instructions take its line.
    assert_eq!(f.insts[0].loc, None);
    assert_eq!(f.insts[2].loc, Some(loc));
    assert_eq!(f.insts[3].loc, Some(loc));
    assert_eq!(f.params, m.funcs[0].params);
    assert_eq!(f.output_types, m.funcs[0].output_types);
}

#[test]
fn calls_in_regions_are_inlined_into_the_region() {
    let src = "func @main(%0: i32[], %1: f32[2]) -> f32[2] {
  %2 = case %0, %1 {branches = [func @b0(%0: f32[2]) -> f32[2] {
      %1 = call %0 {callee = @neg} : f32[2]
      return %1
    }, func @b1(%0: f32[2]) -> f32[2] {
      return %0
    }]} : f32[2]
  return %2
}

func @neg(%0: f32[2]) -> f32[2] {
  %1 = negate %0 : f32[2]
  return %1
}
";
    let m = parse_module(src).unwrap();
    verify_module(&m).unwrap();
    assert_eq!(print_module(&m), src);
    let f = inline_calls(m.entry().unwrap()).unwrap();
    assert!(!kiln_ir::inline::has_calls(&f));
    let Op::Case { branches } = &f.insts[0].op else {
        panic!("a case")
    };
    assert_eq!(branches[0].insts[0].op, Op::Negate {});
}

#[test]
fn the_verifier_checks_the_callee_and_the_call_graph() {
    let t = TensorType::new(DType::F32, [2]);
    let mut b = Builder::new("g");
    let p = b.param(t.clone());
    let n = b.inst(Op::Negate {}, &[p]).unwrap();
    let g = b.finish(&[n]).unwrap();
    let mut b = Builder::new("main");
    let x = b.param(t.clone());
    let r = b
        .push(
            Op::Call {
                callee: Callee::of(&g),
            },
            &[x],
        )
        .unwrap();
    let main = b.finish(&r).unwrap();
    verify(&main).unwrap();
    // The module lacks @g: call_c1.
    let m = Module {
        funcs: vec![main.clone()],
    };
    assert_eq!(verify_module(&m).unwrap_err().diag.label, "call_c1");
    // The module's @g differs from the one the call holds: call_c1.
    let mut other = g.clone();
    other.insts[0].op = Op::Abs {};
    let m = Module {
        funcs: vec![main.clone(), other],
    };
    assert_eq!(verify_module(&m).unwrap_err().diag.label, "call_c1");
    assert_eq!(
        verify_module(&Module::from_func(main.clone())).map_err(|e| e.to_string()),
        Ok(())
    );
    // An unresolved call does not verify on its own, and has no results to give.
    let mut lone = main.clone();
    let Op::Call { callee } = &mut lone.insts[0].op else {
        panic!("a call")
    };
    callee.func = None;
    let e = verify(&lone).unwrap_err();
    assert_eq!(e.diag.label, "call_c1");
    assert!(e.to_string().contains("@g"), "{e}");
    assert_eq!(inline_calls(&lone).unwrap_err().diag.label, "call_c1");
    // Operands of other types: call_c2.
    let mut b = Builder::new("main");
    let x = b.param(TensorType::new(DType::F32, [3]));
    let e = b
        .push(
            Op::Call {
                callee: Callee::of(&g),
            },
            &[x],
        )
        .unwrap_err();
    assert_eq!(e.diag.label, "call_c2");
}

#[test]
fn a_recursive_module_is_rejected_naming_the_cycle() {
    let src = "func @main(%0: f32[]) -> f32[] {
  %1 = call %0 {callee = @f} : f32[]
  return %1
}

func @f(%0: f32[]) -> f32[] {
  %1 = call %0 {callee = @g} : f32[]
  return %1
}

func @g(%0: f32[]) -> f32[] {
  %1 = call %0 {callee = @f} : f32[]
  return %1
}
";
    let m = parse_module(src).unwrap();
    let e = verify_module(&m).unwrap_err();
    assert_eq!(e.diag.label, "call_c4");
    assert!(e.to_string().contains("@f calls @g calls @f"), "{e}");
    // It prints as it reads, though it does not verify.
    assert_eq!(print_module(&m), src);
}

#[test]
fn a_callee_holding_a_nan_is_the_module_function_it_names() {
    let src = "func @main(%0: f32[2]) -> f32[2] {
  %1 = call %0 {callee = @g} : f32[2]
  return %1
}

func @g(%0: f32[2]) -> f32[2] {
  %1 = constant {value = [nan, 1.0]} : f32[2]
  %2 = add %0, %1 : f32[2]
  return %2
}
";
    let m = parse_module(src).unwrap();
    verify_module(&m).unwrap();
}
