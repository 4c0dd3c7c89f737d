//! Building functions in memory, with type inference and checking at each step.

use crate::error::{Diag, VerifyError};
use crate::print::inst_summary;
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

    /// How many parameters the function has so far.
    pub fn param_count(&self) -> usize {
        self.f.params.len()
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> Option<&TensorType> {
        self.f.ty(v)
    }

    /// The function built so far.
    pub fn func(&self) -> &Func {
        &self.f
    }

    fn error(&self, op: &Op, operands: &[ValueId], loc: Option<Loc>, diag: Diag) -> VerifyError {
        let inst = Inst {
            op: op.clone(),
            operands: operands.to_vec(),
            results: vec![],
            loc,
        };
        VerifyError {
            func: self.f.name.clone(),
            inst: Some(inst_summary(&inst)),
            loc,
            diag,
        }
    }

    fn add(
        &mut self,
        op: Op,
        operands: &[ValueId],
        declared: Option<&[TensorType]>,
        loc: Option<Loc>,
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
            loc,
        });
        Ok(results)
    }

    /// Adds an instruction at a given source location, with result types inferred (`None`) or
    /// declared. The location may be none (`Option<Loc>`): a rewrite of an instruction that
    /// has none passes its `None` on, so an error about what it builds names the user's
    /// operation without naming a line of the rewrite's own code.
    pub fn push_at(
        &mut self,
        op: Op,
        operands: &[ValueId],
        declared: Option<&[TensorType]>,
        loc: impl Into<Option<Loc>>,
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.add(op, operands, declared, loc.into())
    }

    /// How many instructions the function has so far: where the next one goes (see
    /// [`Builder::locate_from`]).
    pub fn inst_count(&self) -> usize {
        self.f.insts.len()
    }

    /// Gives every instruction from the `first`-th on the location `loc`, or none: the
    /// instructions a rewrite expands one instruction into carry that instruction's location
    /// (the user's line, or none), never the lines of the rewrite's code that the
    /// `#[track_caller]` helpers ([`Builder::inst`], [`Builder::binary`], ...) record.
    pub fn locate_from(&mut self, first: usize, loc: Option<Loc>) {
        for inst in self.f.insts.iter_mut().skip(first) {
            inst.loc = loc;
        }
    }

    /// Gives the instructions from the `first`-th on, and those of their regions at any
    /// depth, the location `loc` (or none), except where `keep` accepts the location they
    /// have: a transform that builds an instruction's derivative with the `#[track_caller]`
    /// helpers, and copies the user's own regions (located at the user's lines, which `keep`
    /// accepts) into it, leaves only the user's lines.
    pub fn relocate_from(&mut self, first: usize, loc: Option<Loc>, keep: &dyn Fn(&Loc) -> bool) {
        for inst in self.f.insts.iter_mut().skip(first) {
            relocate_inst(inst, loc, keep);
        }
    }

    /// Adds an instruction whose result types are inferred.
    #[track_caller]
    pub fn push(&mut self, op: Op, operands: &[ValueId]) -> Result<Vec<ValueId>, VerifyError> {
        self.add(op, operands, None, Some(Loc::caller()))
    }

    /// Adds an instruction with declared result types (needed by reshape, convert, iota, ...).
    #[track_caller]
    pub fn push_typed(
        &mut self,
        op: Op,
        operands: &[ValueId],
        types: &[TensorType],
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.add(op, operands, Some(types), Some(Loc::caller()))
    }

    /// Adds a single-result instruction whose result type is inferred.
    #[track_caller]
    pub fn inst(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId, VerifyError> {
        Ok(self.add(op, operands, None, Some(Loc::caller()))?[0])
    }

    /// Adds a single-result instruction with a declared result type.
    #[track_caller]
    pub fn inst_typed(
        &mut self,
        op: Op,
        operands: &[ValueId],
        ty: TensorType,
    ) -> Result<ValueId, VerifyError> {
        Ok(self.add(
            op,
            operands,
            Some(std::slice::from_ref(&ty)),
            Some(Loc::caller()),
        )?[0])
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

/// Shorthands for common instructions. Each infers or states the result type and reports the
/// caller's source line on error.
impl Builder {
    /// A scalar constant of `dtype` (floats rounded, integers truncated, `pred` nonzero).
    #[track_caller]
    pub fn scalar(&mut self, dtype: crate::DType, x: f64) -> Result<ValueId, VerifyError> {
        let value = crate::Literal::from_f64s(TensorType::scalar(dtype), &[x])
            .expect("one element for a scalar");
        self.inst(Op::Constant { value }, &[])
    }

    /// A tensor of `ty` filled with `x`.
    #[track_caller]
    pub fn full(&mut self, ty: &TensorType, x: f64) -> Result<ValueId, VerifyError> {
        let s = self.scalar(ty.dtype, x)?;
        self.broadcast(s, &[], &ty.shape)
    }

    /// `broadcast_in_dim` of `v` into `shape`, operand dimension i landing on `dims[i]`.
    #[track_caller]
    pub fn broadcast(
        &mut self,
        v: ValueId,
        dims: &[i64],
        shape: &[usize],
    ) -> Result<ValueId, VerifyError> {
        let dtype = self.ty(v).map(|t| t.dtype).unwrap_or(crate::DType::F32);
        self.inst_typed(
            Op::BroadcastInDim {
                broadcast_dimensions: dims.to_vec(),
            },
            &[v],
            TensorType::new(dtype, shape),
        )
    }

    /// `reshape` of `v` into `shape`.
    #[track_caller]
    pub fn reshape(&mut self, v: ValueId, shape: &[usize]) -> Result<ValueId, VerifyError> {
        let dtype = self.ty(v).map(|t| t.dtype).unwrap_or(crate::DType::F32);
        self.inst_typed(Op::Reshape {}, &[v], TensorType::new(dtype, shape))
    }

    /// `convert` of `v` to `dtype`.
    #[track_caller]
    pub fn convert(&mut self, v: ValueId, dtype: crate::DType) -> Result<ValueId, VerifyError> {
        let shape = self.ty(v).map(|t| t.shape.clone()).unwrap_or_default();
        self.inst_typed(Op::Convert {}, &[v], TensorType::new(dtype, shape))
    }

    /// Sum of `v` over `dims`.
    #[track_caller]
    pub fn sum(&mut self, v: ValueId, dims: &[i64]) -> Result<ValueId, VerifyError> {
        let dtype = self.ty(v).map(|t| t.dtype).unwrap_or(crate::DType::F32);
        let zero = self.scalar(dtype, 0.0)?;
        self.inst(
            Op::Reduce {
                dimensions: dims.to_vec(),
                kind: crate::Combiner::Add,
            },
            &[v, zero],
        )
    }

    /// `transpose` of `v` by `permutation`.
    #[track_caller]
    pub fn transpose(&mut self, v: ValueId, permutation: &[i64]) -> Result<ValueId, VerifyError> {
        self.inst(
            Op::Transpose {
                permutation: permutation.to_vec(),
            },
            &[v],
        )
    }

    /// An elementwise binary op.
    #[track_caller]
    pub fn binary(&mut self, op: Op, a: ValueId, b: ValueId) -> Result<ValueId, VerifyError> {
        self.inst(op, &[a, b])
    }

    /// An elementwise unary op.
    #[track_caller]
    pub fn unary(&mut self, op: Op, a: ValueId) -> Result<ValueId, VerifyError> {
        self.inst(op, &[a])
    }

    /// `compare` of `a` and `b`.
    #[track_caller]
    pub fn compare(
        &mut self,
        a: ValueId,
        b: ValueId,
        dir: crate::ComparisonDirection,
    ) -> Result<ValueId, VerifyError> {
        self.inst(
            Op::Compare {
                comparison_direction: dir,
            },
            &[a, b],
        )
    }

    /// `select` between `t` and `f` by `p`.
    #[track_caller]
    pub fn select(&mut self, p: ValueId, t: ValueId, f: ValueId) -> Result<ValueId, VerifyError> {
        self.inst(Op::Select {}, &[p, t, f])
    }

    /// Copies every instruction of `f` into this builder, with `args` for its parameters;
    /// returns the values standing for its outputs.
    #[track_caller]
    pub fn inline(&mut self, f: &Func, args: &[ValueId]) -> Result<Vec<ValueId>, VerifyError> {
        let values = self.inline_values(f, args)?;
        Ok(f.outputs.iter().map(|o| values[o.index()]).collect())
    }

    /// Like [`Builder::inline`], but returns the value standing for every value of `f`, indexed
    /// by `f`'s value ids.
    #[track_caller]
    pub fn inline_values(
        &mut self,
        f: &Func,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.inline_values_given(f, args, &[])
    }

    /// Like [`Builder::inline_values`], where each `(v, g)` of `given` stands for `f`'s value
    /// `v` (computed earlier) and the instruction defining it is not copied (one with several
    /// results only when all of them are given).
    #[track_caller]
    pub fn inline_values_given(
        &mut self,
        f: &Func,
        args: &[ValueId],
        given: &[(ValueId, ValueId)],
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.inline_given_at(f, args, given, Some(Loc::caller()))
    }

    /// Like [`Builder::inline`], with `f`'s instructions that have no location given `loc`
    /// instead of the caller's line; `None` leaves them without one (a rewrite inlining a
    /// region the user wrote without locations adds none of its own code's).
    pub fn inline_at(
        &mut self,
        f: &Func,
        args: &[ValueId],
        loc: Option<Loc>,
    ) -> Result<Vec<ValueId>, VerifyError> {
        let values = self.inline_given_at(f, args, &[], loc)?;
        Ok(f.outputs.iter().map(|o| values[o.index()]).collect())
    }

    /// [`Builder::inline_values_given`] with `f`'s instructions that have no location given
    /// `loc` (none with `None`) instead of the caller's line: a transform copying a function
    /// adds no line of its own code to it.
    pub fn inline_values_given_at(
        &mut self,
        f: &Func,
        args: &[ValueId],
        given: &[(ValueId, ValueId)],
        loc: Option<Loc>,
    ) -> Result<Vec<ValueId>, VerifyError> {
        self.inline_given_at(f, args, given, loc)
    }

    fn inline_given_at(
        &mut self,
        f: &Func,
        args: &[ValueId],
        given: &[(ValueId, ValueId)],
        loc: Option<Loc>,
    ) -> Result<Vec<ValueId>, VerifyError> {
        if args.len() != f.params.len() {
            let d = Diag {
                label: "ir_operands".into(),
                message: format!(
                    "@{} takes {} argument(s), {} given",
                    f.name,
                    f.params.len(),
                    args.len()
                ),
            };
            return Err(VerifyError {
                func: self.f.name.clone(),
                inst: None,
                loc,
                diag: d,
            });
        }
        let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
        for (&p, &a) in f.params.iter().zip(args) {
            map[p.index()] = Some(a);
        }
        for &(v, g) in given {
            map[v.index()] = Some(g);
        }
        for inst in &f.insts {
            if !given.is_empty() && inst.results.iter().all(|r| map[r.index()].is_some()) {
                continue;
            }
            let ops: Vec<ValueId> = inst
                .operands
                .iter()
                .map(|o| map[o.index()].expect("the inlined function is verified"))
                .collect();
            let tys: Vec<TensorType> = inst
                .results
                .iter()
                .map(|r| f.values[r.index()].clone())
                .collect();
            let rs = self.add(inst.op.clone(), &ops, Some(&tys), inst.loc.or(loc))?;
            for (&r, v) in inst.results.iter().zip(rs) {
                map[r.index()] = Some(v);
            }
        }
        Ok(map
            .into_iter()
            .map(|v| v.expect("the inlined function is verified"))
            .collect())
    }
}

/// Gives `inst` and the instructions of its regions, at any depth, the location `loc` where
/// `keep` does not accept the one they have (see [`Builder::relocate_from`]).
pub fn relocate_inst(inst: &mut Inst, loc: Option<Loc>, keep: &dyn Fn(&Loc) -> bool) {
    if !inst.loc.as_ref().is_some_and(keep) {
        inst.loc = loc;
    }
    for region in inst.op.regions_mut() {
        for i in &mut region.insts {
            relocate_inst(i, loc, keep);
        }
    }
}
