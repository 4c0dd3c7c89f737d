//! Building functions in memory, with type inference and checking at each step.

use crate::error::{Diag, VerifyError};
use crate::print::inst_head;
use crate::verify::type_rule;
use crate::{Func, Inst, Loc, Op, TensorType, ValueId};

/// Builds a [`Func`] instruction by instruction; every instruction is type-checked as it is
/// added, so errors point at the caller's source line.
#[derive(Clone, Debug)]
pub struct Builder {
    f: Func,
}

impl Builder {
    /// A builder for a function named `name`.
    pub fn new(name: &str) -> Builder {
        Builder {
            f: Func {
                name: name.to_string(),
                params: Vec::new(),
                insts: Vec::new(),
                outputs: Vec::new(),
                output_types: Vec::new(),
                values: Vec::new(),
            },
        }
    }

    /// Adds a parameter.
    pub fn param(&mut self, ty: TensorType) -> ValueId {
        let v = ValueId(self.f.values.len() as u32);
        self.f.values.push(ty);
        self.f.params.push(v);
        v
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> Option<&TensorType> {
        self.f.ty(v)
    }

    /// The function built so far.
    pub fn func(&self) -> &Func {
        &self.f
    }

    fn error(&self, op: &Op, operands: &[ValueId], loc: Loc, diag: Diag) -> VerifyError {
        let inst = Inst {
            op: op.clone(),
            operands: operands.to_vec(),
            results: vec![],
            loc: Some(loc),
        };
        VerifyError {
            func: self.f.name.clone(),
            inst: Some(inst_head(&inst)),
            loc: Some(loc),
            diag,
        }
    }

    fn add(
        &mut self,
        op: Op,
        operands: &[ValueId],
        declared: Option<&[TensorType]>,
        loc: Loc,
    ) -> Result<Vec<ValueId>, VerifyError> {
        let mut tys = Vec::with_capacity(operands.len());
        for &o in operands {
            match self.f.ty(o) {
                Some(t) => tys.push(t),
                None => {
                    let d = Diag {
                        label: "ir_ssa".into(),
                        message: format!("operand {o} is not defined"),
                    };
                    return Err(self.error(&op, operands, loc, d));
                }
            }
        }
        let types =
            type_rule(&op, &tys, declared).map_err(|d| self.error(&op, operands, loc, d))?;
        let results: Vec<ValueId> = types
            .into_iter()
            .map(|t| {
                self.f.values.push(t);
                ValueId(self.f.values.len() as u32 - 1)
            })
            .collect();
        self.f.insts.push(Inst {
            op,
            operands: operands.to_vec(),
            results: results.clone(),
            loc: Some(loc),
        });
        Ok(results)
    }

    /// Adds an instruction whose result types are inferred.
    #[track_caller]
    pub fn push(&mut self, op: Op, operands: &[ValueId]) -> Result<Vec<ValueId>, VerifyError> {
        self.add(op, operands, None, Loc::caller())
    }

    /// Adds an instruction with declared result types (needed by reshape, convert, iota, ...).
    #[track_caller]
    pub fn push_typed(
        &mut self,
        op: Op,
        operands: &[ValueId],
        types: &[TensorType],
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.add(op, operands, Some(types), Loc::caller())
    }

    /// Adds a single-result instruction whose result type is inferred.
    #[track_caller]
    pub fn inst(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId, VerifyError> {
        Ok(self.add(op, operands, None, Loc::caller())?[0])
    }

    /// Adds a single-result instruction with a declared result type.
    #[track_caller]
    pub fn inst_typed(
        &mut self,
        op: Op,
        operands: &[ValueId],
        ty: TensorType,
    ) -> Result<ValueId, VerifyError> {
        Ok(self.add(op, operands, Some(std::slice::from_ref(&ty)), Loc::caller())?[0])
    }

    /// Finishes the function, returning `outputs`.
    pub fn finish(mut self, outputs: &[ValueId]) -> Result<Func, VerifyError> {
        let mut tys = Vec::new();
        for &o in outputs {
            match self.f.ty(o) {
                Some(t) => tys.push(t.clone()),
                None => {
                    return Err(VerifyError {
                        func: self.f.name.clone(),
                        inst: None,
                        loc: None,
                        diag: Diag {
                            label: "ir_ssa".into(),
                            message: format!("returned value {o} is not defined"),
                        },
                    });
                }
            }
        }
        self.f.outputs = outputs.to_vec();
        self.f.output_types = tys;
        Ok(canonicalize(self.f))
    }
}

/// Renumbers values densely in definition order (parameters first, then each instruction's
/// results), the order the text form uses, so a built function prints as it would parse.
fn canonicalize(mut f: Func) -> Func {
    let mut map = vec![ValueId(u32::MAX); f.values.len()];
    let mut values = Vec::with_capacity(f.values.len());
    let order = f
        .params
        .iter()
        .chain(f.insts.iter().flat_map(|i| i.results.iter()));
    for &v in order {
        map[v.index()] = ValueId(values.len() as u32);
        values.push(f.values[v.index()].clone());
    }
    let m = |v: &mut ValueId| *v = map[v.index()];
    f.params.iter_mut().for_each(m);
    f.outputs.iter_mut().for_each(m);
    for inst in &mut f.insts {
        inst.operands.iter_mut().for_each(m);
        inst.results.iter_mut().for_each(m);
    }
    f.values = values;
    f
}
