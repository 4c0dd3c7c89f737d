//! The text printer. The parser in [`crate::parse`] reads exactly what this writes.
//!
//! ```text
//! func @main(%0: f32[2,3], %1: f32[3]) -> f32[2,3] {
//!   %2 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[2,3]
//!   %3 = add %0, %2 : f32[2,3]
//!   return %3
//! }
//! ```

use crate::{Func, Inst, Module, TensorType};
use std::fmt::Write;

/// The instruction without results and types: `add %0, %1 {attrs}`.
pub fn inst_head(inst: &Inst) -> String {
    let mut s = String::from(inst.op.mnemonic());
    for (i, o) in inst.operands.iter().enumerate() {
        s.push_str(if i == 0 { " " } else { ", " });
        let _ = write!(s, "{o}");
    }
    let attrs = inst.op.attrs();
    if !attrs.is_empty() {
        s.push_str(" {");
        for (i, (name, a)) in attrs.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{name} = {a}");
        }
        s.push('}');
    }
    s
}

fn type_list(out: &mut String, tys: &[TensorType]) {
    for (i, t) in tys.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{t}");
    }
}

/// Prints one function.
pub fn print_func(f: &Func) -> String {
    let mut s = String::new();
    let _ = write!(s, "func @{}(", f.name);
    for (i, &p) in f.params.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{p}: {}", f.values[p.index()]);
    }
    s.push_str(") -> ");
    if f.output_types.len() == 1 {
        let _ = write!(s, "{}", f.output_types[0]);
    } else {
        s.push('(');
        type_list(&mut s, &f.output_types);
        s.push(')');
    }
    s.push_str(" {\n");
    for inst in &f.insts {
        s.push_str("  ");
        for (i, r) in inst.results.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{r}");
        }
        let _ = write!(s, " = {} : ", inst_head(inst));
        let tys: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        type_list(&mut s, &tys);
        s.push('\n');
    }
    s.push_str("  return");
    for (i, o) in f.outputs.iter().enumerate() {
        s.push_str(if i == 0 { " " } else { ", " });
        let _ = write!(s, "{o}");
    }
    s.push_str("\n}\n");
    s
}

/// Prints a module: its functions separated by blank lines.
pub fn print_module(m: &Module) -> String {
    m.funcs
        .iter()
        .map(print_func)
        .collect::<Vec<_>>()
        .join("\n")
}

impl std::fmt::Display for Func {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_func(self))
    }
}

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_module(self))
    }
}
