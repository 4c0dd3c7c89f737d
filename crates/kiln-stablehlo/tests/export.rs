//! Export round trip: for every spec example (`ir-specs/ops/*.md`) and a few hundred random
//! programs, `parse(to_text(m))` prints as `m` does and evaluates to the same bits on the
//! reference interpreter.

mod common;

use kiln_ir::{Literal, Module, Op, parse_module, print_module};

/// Whether any function of `m` holds a `case` (whose branches StableHLO passes the operands
/// by capture, so a repeated operand reads back as one parameter).
fn has_case(m: &Module) -> bool {
    fn walk(f: &kiln_ir::Func) -> bool {
        f.insts
            .iter()
            .any(|i| matches!(i.op, Op::Case { .. }) || i.op.regions().into_iter().any(walk))
    }
    m.funcs.iter().any(walk)
}

/// `m` with its regions named as the importer names them (`cond`, `body`, `branchK`,
/// `comparator`): StableHLO regions carry no names.
fn region_names_as_imported(m: &Module) -> Module {
    fn walk(f: &mut kiln_ir::Func) {
        for inst in &mut f.insts {
            match &mut inst.op {
                Op::While { cond, body } => {
                    cond.name = "cond".into();
                    body.name = "body".into();
                }
                Op::Case { branches } => {
                    for (k, b) in branches.iter_mut().enumerate() {
                        b.name = format!("branch{k}");
                    }
                }
                Op::Sort { comparator, .. } => comparator.name = "comparator".into(),
                Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => {
                    body.name = "reducer".into()
                }
                Op::Map { computation, .. } => computation.name = "map".into(),
                Op::AllReduce { computation, .. }
                | Op::ReduceScatter { computation, .. }
                | Op::CollectiveReduce { computation, .. } => {
                    computation.name = "computation".into()
                }
                _ => {}
            }
            match &mut inst.op {
                Op::While { cond, body } => {
                    walk(cond);
                    walk(body);
                }
                Op::Case { branches } => branches.iter_mut().for_each(walk),
                Op::Sort { comparator, .. } => walk(comparator),
                Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => walk(body),
                Op::Map { computation, .. } => walk(computation),
                _ => {}
            }
        }
    }
    let mut m = m.clone();
    m.funcs.iter_mut().for_each(walk);
    m
}

/// Bits of every output.
fn bits(outs: &[Literal]) -> Vec<(String, Vec<u8>)> {
    outs.iter()
        .map(|l| (l.ty().to_string(), l.to_le_bytes()))
        .collect()
}

/// Exports, imports, compares texts and results; `Ok(false)` when only the results agree
/// (a case whose operands repeat).
fn round_trip(what: &str, m: &Module, args: &[Literal]) -> Result<bool, String> {
    let text = kiln_stablehlo::to_text(m).map_err(|e| format!("{what}: export: {e}"))?;
    let back = kiln_stablehlo::parse(&text).map_err(|e| format!("{what}: import: {e}\n{text}"))?;
    let want_text = print_module(&region_names_as_imported(m));
    let same_text = print_module(&back) == want_text;
    if !same_text && !has_case(m) {
        return Err(format!(
            "{what}: the module reads back differently\n--- kiln\n{want_text}\n--- stablehlo\n{text}\n--- back\n{}",
            print_module(&back)
        ));
    }
    let want = kiln_reference::eval_module(m, args);
    let got = kiln_reference::eval_module(&back, args);
    match (want, got) {
        (Ok(w), Ok(g)) if bits(&w) == bits(&g) => Ok(same_text),
        (Err(_), Err(_)) => Ok(same_text),
        (w, g) => Err(format!("{what}: results differ: {w:?} vs {g:?}\n{text}")),
    }
}

#[test]
fn spec_examples_round_trip() {
    let (mut exact, mut by_value, mut failures) = (0, 0, Vec::new());
    for (what, m, args) in common::spec_examples() {
        match round_trip(&what, &m, &args) {
            Ok(true) => exact += 1,
            Ok(false) => by_value += 1,
            Err(e) => failures.push(e),
        }
    }
    println!("spec examples: {exact} read back exactly, {by_value} with equal results only");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(exact > 100, "only {exact} examples ran");
}

/// Random programs (seeds 0 to 399, or those `KILN_EXPORT_PROGRAMS` names: a count `N` or a
/// range `A..B` of fresh seeds) exported and read back compute what they did.
#[test]
fn random_programs_round_trip() {
    let (mut exact, mut by_value, mut failures) = (0, 0, Vec::new());
    let knob = std::env::var("KILN_EXPORT_PROGRAMS").ok();
    let seeds = kiln_ir::random::seeds::seed_range("KILN_EXPORT_PROGRAMS", knob.as_deref(), 0..400)
        .unwrap();
    let n = seeds.end - seeds.start;
    let programs = common::random_programs(seeds);
    let control = programs.iter().filter(|p| p.3).count();
    for (what, m, args, _) in programs {
        match round_trip(&what, &m, &args) {
            Ok(true) => exact += 1,
            Ok(false) => by_value += 1,
            Err(e) => failures.push(e),
        }
    }
    println!(
        "random programs: {exact} read back exactly, {by_value} with equal results only ({control} seeds with control flow)"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // One seed in ten or so asks for control flow.
    assert!(
        n < 400 || control as u64 > n / 10,
        "{control} of {n} seeds with control flow"
    );
}

#[test]
fn special_floats_keep_their_bits() {
    let vals = [
        f32::NAN,
        f32::from_bits(0x7FC0_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.1,
        1e-45,
        3.4028235e38,
    ];
    let lit = Literal::f32([vals.len()], vals.to_vec()).expect("literal");
    let text = kiln_stablehlo::dense::dense_text(&lit);
    assert!(
        text.contains("0x7FC00001") && text.contains("0x80000000"),
        "{text}"
    );
    let src =
        "func @main() -> (f32[8]) {\n  %0 = constant {value = 0.0} : f32[8]\n  return %0\n}\n";
    let mut m = parse_module(src).expect("kiln text");
    // Set the value directly: kiln's text form has no NaN payloads.
    m.funcs[0].insts[0].op = Op::Constant { value: lit.clone() };
    let back =
        kiln_stablehlo::parse(&kiln_stablehlo::to_text(&m).expect("export")).expect("import");
    let Op::Constant { value } = &back.funcs[0].insts[0].op else {
        panic!("not a constant: {}", print_module(&back));
    };
    assert_eq!(value.to_le_bytes(), lit.to_le_bytes());
}

#[test]
fn every_small_float_pattern_keeps_its_bits() {
    for d in kiln_ir::DType::ALL
        .into_iter()
        .filter(|d| d.mini().is_some())
    {
        let m = d.mini().unwrap();
        let n = 1usize << m.bits();
        let lit = Literal::new(
            kiln_ir::TensorType::new(d, [n]),
            kiln_ir::Data::Mini(m, (0..n).map(|c| c as u8).collect()),
        )
        .expect("literal");
        let src = format!(
            "func @main() -> ({d}[{n}]) {{\n  %0 = constant {{value = 1.0}} : {d}[{n}]\n  return %0\n}}\n"
        );
        let mut module = parse_module(&src).expect("kiln text");
        module.funcs[0].insts[0].op = Op::Constant { value: lit.clone() };
        let text = kiln_stablehlo::to_text(&module).expect("export");
        assert!(text.contains(m.stablehlo_name()), "{text}");
        let back = kiln_stablehlo::parse(&text).expect("import");
        let Op::Constant { value } = &back.funcs[0].insts[0].op else {
            panic!("not a constant: {}", print_module(&back));
        };
        // NaNs of a format with several (f8e5m2's payloads, f8e4m3fn's two signs) are written
        // by their bits, like every other pattern that decimal would not bring back.
        assert_eq!(value.to_le_bytes(), lit.to_le_bytes(), "{d}: {text}");
    }
}

#[test]
fn unexportable_combiner_is_an_error_naming_the_op() {
    let src = "func @main(%0: f32[4]) -> (f32[]) {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]\n  return %2\n}\n";
    let mut m = parse_module(src).expect("kiln text");
    kiln_stablehlo::to_text(&m).expect("a sum exports");
    // `replace` is no reduction: the verifier refuses it, and so must the exporter.
    if let Op::Reduce { kind, .. } = &mut m.funcs[0].insts[1].op {
        *kind = kiln_ir::Combiner::Replace;
    }
    let e = kiln_stablehlo::to_text(&m).expect_err("replace is no reduction");
    assert_eq!(e.op, "reduce");
    assert!(e.to_string().contains("`reduce` in @main"), "{e}");
    // A value without a type is an error, not a panic.
    m.funcs[0].outputs[0] = kiln_ir::ValueId(99);
    let e = kiln_stablehlo::to_text(&m).expect_err("%99 does not exist");
    assert!(e.to_string().contains("%99 has no type"), "{e}");
}
