//! Functions and modules: SSA instruction lists.

use crate::{Op, TensorType};
use std::fmt;

/// A value in a [`Func`]: a parameter or an instruction result. Displays as `%N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index of this value in [`Func::values`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where in user source an instruction was recorded (from `#[track_caller]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Source file.
    pub file: &'static str,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl Loc {
    /// The location of the caller of the function this is called in (through
    /// `#[track_caller]` frames).
    #[track_caller]
    pub fn caller() -> Loc {
        let l = std::panic::Location::caller();
        Loc {
            file: l.file(),
            line: l.line(),
            column: l.column(),
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One SSA instruction: an op applied to operands, defining results.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    /// The operation and its attributes.
    pub op: Op,
    /// Operand values, defined earlier in the function.
    pub operands: Vec<ValueId>,
    /// The values this instruction defines.
    pub results: Vec<ValueId>,
    /// Where the instruction came from, if known. Not part of the text form.
    pub loc: Option<Loc>,
}

/// A function: parameters, instructions in topological order, and returned values.
///
/// Value ids index [`Func::values`], which holds every value's type; parameters come first.
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    /// The name, printed as `@name`.
    pub name: String,
    /// Parameter values, in order.
    pub params: Vec<ValueId>,
    /// Instructions, each using only values defined before it.
    pub insts: Vec<Inst>,
    /// Returned values.
    pub outputs: Vec<ValueId>,
    /// The declared result types of the function (checked against `outputs` by the verifier).
    pub output_types: Vec<TensorType>,
    /// The type of every value, indexed by [`ValueId`].
    pub values: Vec<TensorType>,
}

impl Func {
    /// The named combiner this function is, as a reduction body: two scalar parameters of one
    /// type and one `add`, `multiply`, `maximum`, `minimum`, `and` or `or` of them (in either
    /// order) returned; `None` for any other function. A reduction with such a body is a
    /// `reduce` with that `kind`, which the backends have fast paths for.
    pub fn as_combiner(&self) -> Option<crate::Combiner> {
        use crate::Combiner;
        let ([p0, p1], [inst], [out]) = (&self.params[..], &self.insts[..], &self.outputs[..])
        else {
            return None;
        };
        let t = &self.values[p0.index()];
        if t.rank() != 0 || self.values[p1.index()] != *t || inst.results[..] != [*out] {
            return None;
        }
        if inst.operands[..] != [*p0, *p1] && inst.operands[..] != [*p1, *p0] {
            return None;
        }
        match inst.op {
            Op::Add {} => Some(Combiner::Add),
            Op::Multiply {} => Some(Combiner::Mul),
            Op::Maximum {} => Some(Combiner::Max),
            Op::Minimum {} => Some(Combiner::Min),
            Op::And {} => Some(Combiner::And),
            Op::Or {} => Some(Combiner::Or),
            _ => None,
        }
    }

    /// The type of `v`, if `v` exists.
    pub fn ty(&self, v: ValueId) -> Option<&TensorType> {
        self.values.get(v.index())
    }

    /// For each value, by index, whether an instruction reads it or the function returns it.
    pub fn used_values(&self) -> Vec<bool> {
        let mut used = vec![false; self.values.len()];
        for o in self
            .insts
            .iter()
            .flat_map(|i| &i.operands)
            .chain(&self.outputs)
        {
            used[o.index()] = true;
        }
        used
    }

    /// The parameter types, in order.
    pub fn param_types(&self) -> Vec<TensorType> {
        self.params
            .iter()
            .filter_map(|&p| self.ty(p).cloned())
            .collect()
    }
}

/// A set of functions. Ops with bodies (while, sort comparators, custom reductions) hold them
/// in place, as regions; a `call` names another function of the module (and holds it once
/// resolved, see [`crate::call`]). The entry point is `@main` or the first function; the
/// others are private functions its calls run.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    /// The functions, in text order.
    pub funcs: Vec<Func>,
}

impl Module {
    /// A module of `f` and the functions it calls, directly or not (callees before callers,
    /// after `f`).
    pub fn from_func(f: Func) -> Module {
        let callees = crate::call::callees(&f);
        let mut funcs = vec![f];
        funcs.extend(callees);
        Module { funcs }
    }

    /// The function named `name`.
    pub fn func(&self, name: &str) -> Option<&Func> {
        self.funcs.iter().find(|f| f.name == name)
    }

    /// The entry function: `@main` if present, else the first.
    pub fn entry(&self) -> Option<&Func> {
        self.func("main").or(self.funcs.first())
    }
}
