//! Calls between the functions of a module: the `call` op's callee, resolving callee names
//! in a parsed module, and the module's call graph.
//!
//! A `call` names its callee (`%2 = call %0, %1 {callee = @g} : f32[2]`) and also holds the
//! callee itself once resolved, so a function with calls is a whole program on its own: the
//! backends, the interpreter and the transformations take one [`Func`]. The callee held is the
//! module's function of that name; [`crate::verify_module`] checks it is.

use crate::attr::{Attr, AttrCtx, AttrValue};
use crate::error::{Diag, VerifyError, quote};
use crate::print::inst_summary;
use crate::{Func, Module, Op};
use std::collections::HashMap;

/// The function a `call` runs: its name in the module and, once resolved, the function.
#[derive(Clone, Debug, PartialEq)]
pub struct Callee {
    /// The callee's name, printed as `@name`.
    pub name: String,
    /// The callee, with its own calls resolved; `None` until the module's function of that
    /// name is found (the verifier rejects a call left unresolved).
    pub func: Option<Box<Func>>,
}

impl Callee {
    /// A callee resolved to `f`.
    pub fn of(f: &Func) -> Callee {
        Callee {
            name: f.name.clone(),
            func: Some(Box::new(f.clone())),
        }
    }
}

impl AttrValue for Callee {
    fn to_attr(&self) -> Attr {
        Attr::Token(format!("@{}", self.name))
    }
    fn from_attr(a: &Attr, _: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::Token(t) if t.len() > 1 && t.starts_with('@') => Ok(Callee {
                name: t[1..].to_string(),
                func: None,
            }),
            _ => Err(format!(
                "expected a function name such as `@g`, found {}",
                quote(a)
            )),
        }
    }
}

/// Calls `visit` on every `call` of `f`, in its instructions and, through other ops, in their
/// regions; not inside the callees.
pub fn for_each_call_mut(f: &mut Func, visit: &mut dyn FnMut(&mut Callee)) {
    for inst in &mut f.insts {
        if let Op::Call { callee } = &mut inst.op {
            visit(callee);
        } else {
            for r in inst.op.regions_mut() {
                for_each_call_mut(r, visit);
            }
        }
    }
}

/// Calls `visit` on every `call` of `f`, in its instructions and, through other ops, in their
/// regions; not inside the callees.
pub fn for_each_call(f: &Func, visit: &mut dyn FnMut(&Callee)) {
    for inst in &f.insts {
        if let Op::Call { callee } = &inst.op {
            visit(callee);
        } else {
            for r in inst.op.regions() {
                for_each_call(r, visit);
            }
        }
    }
}

/// The names `f` calls (in its instructions and regions, not inside the callees), in order,
/// each once.
pub fn callee_names(f: &Func) -> Vec<String> {
    let mut names = Vec::new();
    for_each_call(f, &mut |c| {
        if !names.contains(&c.name) {
            names.push(c.name.clone())
        }
    });
    names
}

/// Whether `a` and `b` are the same function: equal, or printing alike (a constant holding a
/// NaN is not equal to itself, but prints as itself).
pub fn same_function(a: &Func, b: &Func) -> bool {
    a == b || crate::print::print_one(a) == crate::print::print_one(b)
}

/// A cycle of the module's call graph, as the function names along it (the first repeated at
/// the end), if there is one.
pub fn call_cycle(m: &Module) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Open,
        Done,
    }
    fn visit(
        m: &Module,
        name: &str,
        state: &mut HashMap<String, State>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(name) {
            Some(State::Done) => return None,
            Some(State::Open) => {
                let start = path.iter().position(|n| n == name).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(name.to_string());
                return Some(cycle);
            }
            None => {}
        }
        let f = m.func(name)?;
        state.insert(name.to_string(), State::Open);
        path.push(name.to_string());
        for g in callee_names(f) {
            if let Some(c) = visit(m, &g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(name.to_string(), State::Done);
        None
    }
    let mut state = HashMap::new();
    m.funcs
        .iter()
        .find_map(|f| visit(m, &f.name, &mut state, &mut Vec::new()))
}

/// Resolves every call of the module's functions to the module's function of that name (with
/// its own calls resolved). A call of a name the module does not define, or one that closes a
/// cycle of calls, is left unresolved for the verifier to report.
pub fn resolve_calls(m: &mut Module) {
    fn resolve(
        m: &Module,
        name: &str,
        done: &mut HashMap<String, Func>,
        open: &mut Vec<String>,
    ) -> Option<Func> {
        if let Some(f) = done.get(name) {
            return Some(f.clone());
        }
        if open.iter().any(|n| n == name) {
            return None;
        }
        let mut f = m.func(name)?.clone();
        open.push(name.to_string());
        for_each_call_mut(&mut f, &mut |c| {
            if c.func.is_none() {
                c.func = resolve(m, &c.name, done, open).map(Box::new);
            }
        });
        open.pop();
        done.insert(name.to_string(), f.clone());
        Some(f)
    }
    let mut done = HashMap::new();
    let resolved: Vec<Func> = m
        .funcs
        .iter()
        .map(|f| resolve(m, &f.name, &mut done, &mut Vec::new()).unwrap_or_else(|| f.clone()))
        .collect();
    m.funcs = resolved;
}

/// The functions `f` calls, directly or through its callees, each once, callees before their
/// callers (the private functions a module holding `f` needs).
pub fn callees(f: &Func) -> Vec<Func> {
    fn walk(f: &Func, out: &mut Vec<Func>) {
        let mut found = Vec::new();
        for_each_call(f, &mut |c| {
            if let Some(callee) = &c.func {
                found.push(callee.as_ref().clone());
            }
        });
        for callee in found {
            if out.iter().any(|o| o.name == callee.name) {
                continue;
            }
            walk(&callee, out);
            if !out.iter().any(|o| o.name == callee.name) {
                out.push(callee);
            }
        }
    }
    let mut out = Vec::new();
    walk(f, &mut out);
    out
}

/// The module's call constraints: no function calls itself, directly or through others
/// (`call_c4`), and each call names a function of the module and holds that function
/// (`call_c1`).
pub(crate) fn verify_calls(m: &Module) -> Result<(), VerifyError> {
    if let Some(cycle) = call_cycle(m) {
        let caller = m
            .func(&cycle[0])
            .expect("a cycle runs through the module's functions");
        let call = caller
            .insts
            .iter()
            .find(|i| matches!(&i.op, Op::Call { callee } if callee.name == cycle[1]));
        return Err(VerifyError {
            func: caller.name.clone(),
            inst: call.map(inst_summary),
            loc: call.and_then(|i| i.loc),
            diag: Diag {
                label: "call_c4".into(),
                message: format!(
                    "the calls recurse: {}",
                    cycle
                        .iter()
                        .map(|n| format!("@{n}"))
                        .collect::<Vec<_>>()
                        .join(" calls ")
                ),
            },
        });
    }
    for f in &m.funcs {
        let mut bad = None;
        for_each_call(f, &mut |c| {
            let same = match (c.func.as_deref(), m.func(&c.name)) {
                (Some(held), Some(g)) => same_function(held, g),
                _ => false,
            };
            if bad.is_none() && !same {
                bad = Some(c.name.clone());
            }
        });
        if let Some(name) = bad {
            let call = f
                .insts
                .iter()
                .find(|i| matches!(&i.op, Op::Call { callee } if callee.name == name));
            return Err(VerifyError {
                func: f.name.clone(),
                inst: call.map(inst_summary),
                loc: call.and_then(|i| i.loc),
                diag: Diag {
                    label: "call_c1".into(),
                    message: match m.func(&name) {
                        None => format!("callee @{name} is not a function of the module"),
                        Some(_) => format!("the callee held differs from the module's @{name}"),
                    },
                },
            });
        }
    }
    Ok(())
}
