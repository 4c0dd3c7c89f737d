//! The text printer. The parser in [`crate::parse`] reads exactly what this writes.
//!
//! ```text
//! func @main(%0: f32[2,3], %1: f32[3]) -> f32[2,3] {
//!   %2 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[2,3]
//!   %3 = add %0, %2 : f32[2,3]
//!   return %3
//! }
//! ```
//!
//! A region (the functions `while` and `case` run) is an attribute written as a function in
//! place, its lines indented under the instruction's; its values are numbered apart from the
//! enclosing function's, since a region sees only its own parameters:
//!
//! ```text
//! func @main(%0: f32[]) -> f32[] {
//!   %1 = while %0 {cond = func @cond(%0: f32[]) -> pred[] {
//!       %1 = constant {value = 10.0} : f32[]
//!       %2 = compare %0, %1 {comparison_direction = LT} : pred[]
//!       return %2
//!     }, body = func @body(%0: f32[]) -> f32[] {
//!       %1 = add %0, %0 : f32[]
//!       return %1
//!     }} : f32[]
//!   return %1
//! }
//! ```

use crate::{Attr, Func, Inst, Module, TensorType};
use std::fmt::Write;

/// The instruction without results and types: `add %0, %1 {attrs}`.
pub fn inst_head(inst: &Inst) -> String {
    head(inst, true)
}

/// [`inst_head`] with each region named instead of written out (`while %0 {cond = @cond,
/// body = @body}`): one line, for error messages.
pub fn inst_summary(inst: &Inst) -> String {
    head(inst, false)
}

fn head(inst: &Inst, regions: bool) -> String {
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
            let _ = write!(s, "{name} = ");
            attr_text(&mut s, a, regions);
        }
        s.push('}');
    }
    s
}

/// An attribute's text; a region written out, or only its name.
fn attr_text(s: &mut String, a: &Attr, regions: bool) {
    match a {
        Attr::Region(f) if !regions => {
            let _ = write!(s, "@{}", f.name);
        }
        Attr::List(items) if !regions => {
            s.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                attr_text(s, x, regions);
            }
            s.push(']');
        }
        _ => {
            let _ = write!(s, "{a}");
        }
    }
}

fn type_list(out: &mut String, tys: &[TensorType]) {
    for (i, t) in tys.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{t}");
    }
}

/// Prints one function, followed by the functions its calls run (directly or not, callees
/// before callers, each once), so that [`crate::parse_func_text`] reads it back whole.
pub fn print_func(f: &Func) -> String {
    let mut s = print_one(f);
    for g in crate::call::callees(f) {
        s.push('\n');
        s.push_str(&print_one(&g));
    }
    s
}

/// Prints one function alone: its calls name their callees.
pub fn print_one(f: &Func) -> String {
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
        // A region's lines go two spaces deeper than the instruction's.
        let _ = write!(s, " = {} : ", inst_head(inst).replace('\n', "\n    "));
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

/// Prints a module: its functions separated by blank lines (a call names its callee, which
/// the module defines).
pub fn print_module(m: &Module) -> String {
    m.funcs.iter().map(print_one).collect::<Vec<_>>().join("\n")
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
