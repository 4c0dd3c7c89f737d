//! From the syntax tree to kiln IR: functions, value scopes, `func.call` (a kiln `call` of the
//! imported function, which keeps its name), and the regions of control flow (`while`, `if`,
//! `case`, `sort`), which become kiln functions. The op-by-op mapping is in [`crate::ops`].
//!
//! A callee with `check.*` ops (imported with checks) is inlined instead, its checks becoming
//! the caller's; so are composite decompositions.
//!
//! StableHLO regions may use values of the enclosing function (implicit captures); kiln's
//! regions take everything as parameters. So the importer passes each captured value in:
//! as an extra loop carry (returned unchanged by the body) for `while`, as an extra operand
//! for `case`/`if`.

use crate::ast::{Block, FuncAst, ModuleAst, Name, OpAst, Shape, Sig};
use crate::checks::{Check, FuncChecks};
use crate::error::{Error, Pos, Result};
use crate::literal::type_name;
use kiln_ir::{Builder, Func, Literal, Loc, Module, Op, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

/// The deepest chain of `func.call`s (and composite decompositions) the importer follows.
pub const MAX_CALL_DEPTH: usize = 64;

/// The `file` of the [`Loc`] each imported instruction carries.
pub const LOC_FILE: &str = "<stablehlo>";

/// A function being built: the builder, the constant values known so far (for the ops that
/// need a constant operand) and the checks recorded.
pub struct Body {
    /// The builder.
    pub b: Builder,
    /// Values defined by constants.
    pub consts: HashMap<ValueId, Literal>,
    /// Checks (`check.*` ops) recorded, with the values they check.
    pub checks: Vec<(Check, Vec<ValueId>)>,
    /// Whether `check.*` ops are allowed here.
    pub allow_checks: bool,
    /// The `interpreter.run_parallel` ops recorded (see [`crate::parallel`]).
    pub parallel: Vec<crate::parallel::PendingRun>,
    /// The values probed (`interpreter.probe`), with their probe ids, in order.
    pub probes: Vec<(String, ValueId)>,
    /// The values printed (`interpreter.print`): their names, where the op is, the value.
    pub prints: Vec<(String, Pos, ValueId)>,
    /// Whether `interpreter.probe` is read here without checks (a loop body, whose probes
    /// the loop carries out, see [`crate::probe`]).
    pub allow_probes: bool,
    /// For a value probed in a loop: the flag that says the loop ran that probe.
    pub probe_flags: HashMap<ValueId, ValueId>,
    /// The parameters that receive what `stablehlo.infeed` reads, in order.
    pub infeed: Vec<usize>,
    /// The values `stablehlo.outfeed` writes, in order.
    pub outfeed: Vec<ValueId>,
    /// The `stablehlo.send` ops, in order (their values become outputs).
    pub(crate) sends: Vec<crate::channel::Pending>,
    /// The `stablehlo.recv` ops, in order, with the parameters that receive their values.
    pub recvs: Vec<crate::channel::Transfer>,
}

/// A named value: a tensor, or a tuple of named values (kiln has no tuples; a tuple is the
/// list of its tensors, see [`crate::tuple`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Tree {
    /// A tensor.
    Leaf(ValueId),
    /// A tuple of its elements.
    Tuple(Vec<Tree>),
    /// A token: no tensor (it only orders the ops that take it).
    Token,
}

impl Tree {
    /// The tensors of the tree, in order.
    pub fn leaves(&self, out: &mut Vec<ValueId>) {
        match self {
            Tree::Leaf(v) => out.push(*v),
            Tree::Tuple(parts) => parts.iter().for_each(|p| p.leaves(out)),
            Tree::Token => {}
        }
    }

    /// `vals` grouped as `shape` says (they must be as many as its leaves).
    pub fn of(shape: &Shape, vals: &mut impl Iterator<Item = ValueId>) -> Option<Tree> {
        match shape {
            Shape::Leaf => vals.next().map(Tree::Leaf),
            Shape::Tuple(parts) => parts
                .iter()
                .map(|p| Tree::of(p, vals))
                .collect::<Option<Vec<_>>>()
                .map(Tree::Tuple),
            Shape::Token => Some(Tree::Token),
        }
    }
}

/// The value names in scope: one per function or inlined call.
#[derive(Clone, Debug, Default)]
pub struct Names {
    values: HashMap<String, ValueId>,
    tuples: HashMap<String, Tree>,
}

impl Names {
    /// No names.
    pub fn new() -> Names {
        Names::default()
    }

    /// The tuple named `n`, if `n` names one.
    pub fn tuple(&self, n: &Name) -> Option<&Tree> {
        self.tuples.get(&n.name)
    }
}

/// The importer of one module.
pub struct Importer<'m> {
    funcs: HashMap<&'m str, &'m FuncAst>,
    depth: usize,
    with_checks: bool,
    /// The functions imported so far, by name (each is imported once, calls share it).
    imported: HashMap<String, (Func, FuncChecks)>,
    /// The functions being imported, innermost last (a call of one of them recurses).
    importing: Vec<String>,
    /// The last iteration each probe id is checked at (`check.expect_serialized_eq`).
    probe_iters: HashMap<String, usize>,
}

/// A kiln [`Loc`] for a position in the input.
pub fn loc(pos: Pos) -> Loc {
    Loc {
        file: LOC_FILE,
        line: pos.line,
        column: pos.column,
    }
}

/// Imports a parsed module; with `with_checks`, `check.*` ops become extra outputs of their
/// function, described in the returned [`FuncChecks`].
pub fn import_module(m: &ModuleAst, with_checks: bool) -> Result<(Module, Vec<FuncChecks>)> {
    let mut funcs = HashMap::new();
    for f in &m.funcs {
        if funcs.insert(f.name.as_str(), f).is_some() {
            return Err(Error::invalid(
                f.pos,
                format!("function @{} is defined twice", f.name),
            ));
        }
    }
    let mut imp = Importer {
        funcs,
        depth: 0,
        with_checks,
        imported: HashMap::new(),
        importing: Vec::new(),
        probe_iters: crate::probe::checked_iterations(m),
    };
    let mut module = Module::default();
    let mut all_checks = Vec::new();
    for f in &m.funcs {
        let (func, checks) = imp.func(f)?;
        all_checks.push(checks);
        module.funcs.push(func);
    }
    Ok((module, all_checks))
}

impl<'m> Importer<'m> {
    /// Imports one function, once: a function imported before (as a callee) is reused.
    fn func(&mut self, f: &FuncAst) -> Result<(Func, FuncChecks)> {
        if let Some(done) = self.imported.get(&f.name) {
            return Ok(done.clone());
        }
        self.importing.push(f.name.clone());
        let r = self.func_body(f);
        self.importing.pop();
        let done = r?;
        self.imported.insert(f.name.clone(), done.clone());
        Ok(done)
    }

    /// Imports one function's body.
    fn func_body(&mut self, f: &FuncAst) -> Result<(Func, FuncChecks)> {
        let mut body = Body {
            b: Builder::new(&f.name),
            consts: HashMap::new(),
            checks: Vec::new(),
            allow_checks: self.with_checks,
            parallel: Vec::new(),
            probes: Vec::new(),
            prints: Vec::new(),
            allow_probes: false,
            probe_flags: HashMap::new(),
            infeed: Vec::new(),
            outfeed: Vec::new(),
            sends: Vec::new(),
            recvs: Vec::new(),
        };
        let mut names = Names::new();
        let params: Vec<ValueId> = f
            .body
            .args
            .iter()
            .map(|(_, t)| body.b.param(t.clone()))
            .collect();
        define_args(&mut names, f, &params)?;
        let (outs, ret_pos) =
            self.block(&mut body, &mut names, &f.body.ops, f.pos, "func.return")?;
        check_types(&body, &outs, &f.results, ret_pos, &format!("@{}", f.name))?;
        let mut outputs = outs.clone();
        let mut checks = Vec::new();
        for (c, vals) in std::mem::take(&mut body.checks) {
            let first = outputs.len();
            outputs.extend(&vals);
            checks.push(c.at_outputs(first..first + vals.len()));
        }
        let mut parallel = Vec::new();
        for run in std::mem::take(&mut body.parallel) {
            let first = outputs.len();
            outputs.extend(&run.operands);
            parallel.push(crate::parallel::Parallel {
                programs: run.programs,
                params: run.params,
                outputs: first..outputs.len(),
                infeed: run.infeed,
            });
        }
        let mut prints = Vec::new();
        for (name, pos, v) in std::mem::take(&mut body.prints) {
            prints.push(crate::probe::Print {
                name,
                pos,
                output: outputs.len(),
            });
            outputs.push(v);
        }
        let first = outputs.len();
        outputs.extend(std::mem::take(&mut body.outfeed));
        let outfeed = first..outputs.len();
        let mut sends = Vec::new();
        for send in std::mem::take(&mut body.sends) {
            let first = outputs.len();
            let types = send
                .values
                .iter()
                .map(|&v| value_type(&body, v))
                .collect::<Result<_>>()?;
            outputs.extend(&send.values);
            sends.push(crate::channel::Transfer {
                channel: send.channel,
                pos: send.pos,
                values: first..outputs.len(),
                types,
            });
        }
        let func = body
            .b
            .finish(&outputs)
            .map_err(|e| Error::invalid(f.pos, e.diag.message))?;
        Ok((
            func,
            FuncChecks {
                func: f.name.clone(),
                outputs: outs.len(),
                checks,
                parallel,
                prints,
                infeed: std::mem::take(&mut body.infeed),
                outfeed,
                sends,
                recvs: std::mem::take(&mut body.recvs),
            },
        ))
    }

    /// Imports the ops of a block; the last must be `terminator`, whose operands are
    /// returned with its position.
    pub fn block(
        &mut self,
        body: &mut Body,
        names: &mut Names,
        ops: &[OpAst],
        pos: Pos,
        terminator: &str,
    ) -> Result<(Vec<ValueId>, Pos)> {
        let Some((last, rest)) = ops.split_last() else {
            return Err(Error::invalid(
                pos,
                format!("a block without `{terminator}`"),
            ));
        };
        for op in rest {
            if is_terminator(&op.name) {
                return Err(Error::invalid(
                    op.pos,
                    format!("`{}` before the end of its block", op.name),
                ));
            }
            self.op(body, names, op)?;
        }
        if last.name != terminator {
            return Err(Error::invalid(
                last.pos,
                format!("a block must end with `{terminator}`, not `{}`", last.name),
            ));
        }
        // A tuple returned (by a function, or a region of control flow) is its tensors.
        let vals = operands(names, last, true)?;
        if let Sig::List(ts) | Sig::Func(ts, _) = &last.sig {
            check_types(body, &vals, ts, last.pos, &format!("`{terminator}`"))?;
        }
        Ok((vals, last.pos))
    }

    /// Imports one op (anything but a terminator).
    fn op(&mut self, body: &mut Body, names: &mut Names, op: &OpAst) -> Result<()> {
        let args = operands(names, op, true)?;
        if let Sig::Func(ins, _) = &op.sig {
            check_types(
                body,
                &args,
                ins,
                op.pos,
                &format!("the operands of `{}`", op.name),
            )?;
        }
        if !op.tuples.is_empty() || op.operands.iter().any(|n| names.tuple(n).is_some()) {
            return crate::tuple::lower(self, body, names, op, &args);
        }
        if !op.quant.is_empty() && !crate::quant::passes_storage(&op.name) {
            let results = crate::quant::lower(body, op, &args)?;
            return bind_results(names, op, &results);
        }
        let results = match op.name.as_str() {
            "func.call" => self.call(body, op, &args)?,
            "stablehlo.composite" => self.composite(body, op, &args)?,
            "stablehlo.while" => self.while_op(body, names, op, &args)?,
            "stablehlo.if" => self.if_op(body, names, op, &args)?,
            "stablehlo.case" => self.case_op(body, names, op, &args)?,
            "stablehlo.sort" => self.sort_op(body, op, &args)?,
            "stablehlo.map" => self.map_op(body, op, &args)?,
            "chlo.scan" => self.scan_op(body, op, &args)?,
            "stablehlo.reduce" if !crate::ops::has_combiner(op, &args) => {
                self.reduce_op(body, op, &args)?
            }
            "stablehlo.reduce_window" if !crate::ops::has_combiner(op, &args) => {
                self.reduce_window_op(body, op, &args)?
            }
            "check.expect_serialized_eq" => crate::probe::expect_serialized_eq(body, op, &args)?,
            n if n.starts_with("check.") => crate::checks::record(body, op, &args)?,
            "interpreter.probe" => crate::probe::probe(body, op, &args)?,
            "interpreter.print" => crate::probe::print(body, op, &args)?,
            "interpreter.run_parallel" => crate::parallel::record(body, op, &args)?,
            n if crate::collective::has_region(n) => {
                let f = self.closed_region(body, op, "collective", "computation")?;
                crate::collective::with_region(body, op, &args, f)?
            }
            n if crate::collective::handles(n) => crate::collective::lower(body, op, &args)?,
            _ => crate::ops::map_op(body, op, &args)?,
        };
        bind_results(names, op, &results)
    }

    /// `func.call @f(args)`: a `call` of the imported `@f`, or, when `@f` has checks (directly
    /// or through its calls) and checks are imported, `@f` inlined.
    pub fn call(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let Some((crate::ast::AttrVal::Symbol(callee), _)) = op.attr("callee") else {
            return Err(Error::syntax(op.pos, "`func.call` needs a callee"));
        };
        let Some(&f) = self.funcs.get(callee.as_str()) else {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` calls @{callee}, which is not defined", op.name),
            ));
        };
        if self.with_checks && self.has_checks(f, &mut HashSet::new()) {
            return self.inline(body, op, callee, args);
        }
        if self.importing.iter().any(|n| n == callee) {
            return Err(Error::unsupported(
                op.pos,
                format!(
                    "@{callee} calls itself (through {}): kiln's call graph is acyclic",
                    self.importing
                        .iter()
                        .map(|n| format!("@{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if self.depth >= MAX_CALL_DEPTH {
            return Err(Error::unsupported(
                op.pos,
                format!("calls nested more than {MAX_CALL_DEPTH} deep at @{callee}"),
            ));
        }
        self.depth += 1;
        let r = self.func(f);
        self.depth -= 1;
        let (g, _) = r?;
        if g.params.len() != args.len() {
            return Err(Error::invalid(
                op.pos,
                format!(
                    "@{callee} takes {} arguments, {} given",
                    g.params.len(),
                    args.len()
                ),
            ));
        }
        check_types(
            body,
            args,
            &g.param_types(),
            op.pos,
            &format!("the arguments of @{callee}"),
        )?;
        let call = Op::Call {
            callee: kiln_ir::Callee::of(&g),
        };
        body.b
            .push_at(call, args, None, loc(op.pos))
            .map_err(|e| Error::invalid(op.pos, e.diag.message))
    }

    /// Whether `f` has `check.*` ops (or `send` / `recv`, which the runner routes by the
    /// function it runs), in its body, its regions or the functions it calls.
    fn has_checks(&self, f: &FuncAst, seen: &mut HashSet<String>) -> bool {
        if !seen.insert(f.name.clone()) {
            return false;
        }
        fn ops<'a>(b: &'a Block, out: &mut Vec<&'a OpAst>) {
            for op in &b.ops {
                out.push(op);
                op.regions.iter().for_each(|r| ops(r, out));
            }
        }
        let mut all = Vec::new();
        ops(&f.body, &mut all);
        all.iter().any(|op| {
            op.name.starts_with("check.")
                || matches!(op.name.as_str(), "stablehlo.send" | "stablehlo.recv")
                || (op.name == "func.call"
                    && matches!(op.attr("callee"), Some((crate::ast::AttrVal::Symbol(c), _))
                        if self.funcs.get(c.as_str()).is_some_and(|g| self.has_checks(g, seen))))
        })
    }

    /// Inlines a composite's decomposition.
    fn composite(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let Some((crate::ast::AttrVal::Symbol(callee), _)) = op.attr("decomposition") else {
            return Err(Error::syntax(
                op.pos,
                "`stablehlo.composite` needs a `decomposition`",
            ));
        };
        self.inline(body, op, callee, args)
    }

    /// Imports the body of the function `callee` in place, its parameters bound to `args`.
    fn inline(
        &mut self,
        body: &mut Body,
        op: &OpAst,
        callee: &str,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let Some(&f) = self.funcs.get(callee) else {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` calls @{callee}, which is not defined", op.name),
            ));
        };
        if self.depth >= MAX_CALL_DEPTH {
            return Err(Error::unsupported(
                op.pos,
                format!("calls nested more than {MAX_CALL_DEPTH} deep (recursion?) at @{callee}"),
            ));
        }
        if f.body.args.len() != args.len() {
            return Err(Error::invalid(
                op.pos,
                format!(
                    "@{callee} takes {} arguments, {} given",
                    f.body.args.len(),
                    args.len()
                ),
            ));
        }
        let tys: Vec<TensorType> = f.body.args.iter().map(|(_, t)| t.clone()).collect();
        check_types(
            body,
            args,
            &tys,
            op.pos,
            &format!("the arguments of @{callee}"),
        )?;
        let mut names = Names::new();
        define_args(&mut names, f, args)?;
        self.depth += 1;
        let r = self.block(body, &mut names, &f.body.ops, f.pos, "func.return");
        self.depth -= 1;
        let (outs, pos) = r?;
        check_types(body, &outs, &f.results, pos, &format!("@{callee}"))?;
        Ok(outs)
    }

    /// Builds a kiln function from a region: parameters are the block arguments, then the
    /// captured outer values `captured` (name, outer value), then a loop's probe carries
    /// ([`crate::probe::Slot`]); a loop body (`role`) appends the captured parameters and
    /// the next probe carries to what the region returns.
    fn region(
        &mut self,
        outer: &Body,
        name: &str,
        block: &Block,
        pos: Pos,
        captured: &[(String, ValueId)],
        role: Role,
    ) -> Result<Func> {
        let (extra_outputs, slots, branch_probes) = match role {
            Role::Plain => (false, &[][..], None),
            Role::LoopCond(slots) => (false, slots, None),
            Role::LoopBody(slots) => (true, slots, None),
            Role::Branch(probes) => (false, &[][..], Some(probes)),
        };
        let mut body = Body {
            b: Builder::new(name),
            consts: HashMap::new(),
            checks: Vec::new(),
            allow_checks: false,
            parallel: Vec::new(),
            probes: Vec::new(),
            prints: Vec::new(),
            allow_probes: false,
            probe_flags: HashMap::new(),
            infeed: Vec::new(),
            outfeed: Vec::new(),
            sends: Vec::new(),
            recvs: Vec::new(),
        };
        let mut names = Names::new();
        let params: Vec<ValueId> = block
            .args
            .iter()
            .map(|(_, t)| body.b.param(t.clone()))
            .collect();
        define_block_args(&mut names, &block.args, &block.arg_shapes, &params)?;
        let mut cap_params = Vec::new();
        for (n, outer_v) in captured {
            let t = value_type(outer, *outer_v)?;
            let v = body.b.param(t);
            if let Some(l) = outer.consts.get(outer_v) {
                body.consts.insert(v, l.clone());
            }
            names.values.insert(n.clone(), v);
            cap_params.push(v);
        }
        let slot_params = crate::probe::slot_params(&mut body, slots);
        body.allow_probes = (extra_outputs || branch_probes.is_some()) && outer.allow_checks;
        let (mut outs, _) =
            self.block(&mut body, &mut names, &block.ops, pos, "stablehlo.return")?;
        if let Some(probes) = branch_probes {
            outs.extend(crate::probe::branch_outputs(&body, probes, pos)?);
        }
        if extra_outputs {
            outs.extend(cap_params);
            outs.extend(crate::probe::slot_updates(
                &mut body,
                slots,
                &slot_params,
                pos,
            )?);
        }
        body.b
            .finish(&outs)
            .map_err(|e| Error::invalid(pos, e.diag.message))
    }

    /// `while`, `if` or `case` (`op`, a control flow op by its name), its operands `args`
    /// (tuples as their tensors); returns its results (tuples as their tensors).
    pub(crate) fn control(
        &mut self,
        body: &mut Body,
        names: &Names,
        op: &OpAst,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        match op.name.as_str() {
            "stablehlo.while" => self.while_op(body, names, op, args),
            "stablehlo.if" => self.if_op(body, names, op, args),
            _ => self.case_op(body, names, op, args),
        }
    }

    /// `while`: captured values become extra carries.
    fn while_op(
        &mut self,
        body: &mut Body,
        names: &Names,
        op: &OpAst,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let [cond, step] = &op.regions[..] else {
            return Err(Error::invalid(
                op.pos,
                format!("`stablehlo.while` has 2 regions, not {}", op.regions.len()),
            ));
        };
        // Each region takes the carries as they are written: tuples and tokens included.
        let carried: Vec<Shape> = op
            .operands
            .iter()
            .map(|n| names.tuple(n).map_or(Shape::Leaf, crate::tuple::shape_of))
            .collect();
        for r in [cond, step] {
            let taken: Vec<Shape> = if r.arg_shapes.is_empty() {
                vec![Shape::Leaf; r.args.len()]
            } else {
                r.arg_shapes.iter().map(|(_, s)| s.clone()).collect()
            };
            if taken != carried {
                return Err(Error::invalid(
                    op.pos,
                    "the arguments of a `stablehlo.while` region are not its operands' tuples, tokens and tensors",
                ));
            }
            if r.args.len() != args.len() {
                return Err(Error::invalid(
                    op.pos,
                    format!(
                        "a `stablehlo.while` region takes {} arguments for {} operands",
                        r.args.len(),
                        args.len()
                    ),
                ));
            }
        }
        let captured = captures(names, &[cond, step], op.pos)?;
        let slots = if body.allow_checks {
            crate::probe::loop_slots(body, step, &self.probe_iters)?
        } else {
            Vec::new()
        };
        let c = self.region(
            body,
            "cond",
            cond,
            op.pos,
            &captured,
            Role::LoopCond(&slots),
        )?;
        let s = self.region(
            body,
            "body",
            step,
            op.pos,
            &captured,
            Role::LoopBody(&slots),
        )?;
        let mut carries = args.to_vec();
        carries.extend(captured.iter().map(|(_, v)| *v));
        carries.extend(crate::probe::slot_inits(body, &slots, op.pos)?);
        let mut out = push(
            body,
            op,
            Op::While {
                cond: Box::new(c),
                body: Box::new(s),
            },
            &carries,
            None,
        )?;
        crate::probe::record_slots(body, &slots, &out[args.len() + captured.len()..]);
        out.truncate(args.len());
        Ok(out)
    }

    /// `case`: captured values become extra operands of every branch.
    fn case_op(
        &mut self,
        body: &mut Body,
        names: &Names,
        op: &OpAst,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let [index] = args else {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.case` takes one operand, the branch index",
            ));
        };
        self.branches(body, names, op, *index)
    }

    /// `if`: the predicate picks branch 0 (true) or 1 (false) of a kiln `case`.
    fn if_op(
        &mut self,
        body: &mut Body,
        names: &Names,
        op: &OpAst,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let [pred] = args else {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.if` takes one operand, the predicate",
            ));
        };
        let l = loc(op.pos);
        let err = |e: kiln_ir::VerifyError| {
            Error::invalid(op.pos, format!("`stablehlo.if`: {}", e.diag.message))
        };
        let i32s = TensorType::scalar(kiln_ir::DType::I32);
        let c = |x: i32| Op::Constant {
            value: Literal::i32([], vec![x])
                .unwrap_or_else(|_| Literal::zeros(TensorType::scalar(kiln_ir::DType::I32))),
        };
        let zero = body
            .b
            .push_at(c(0), &[], Some(std::slice::from_ref(&i32s)), l)
            .map_err(err)?[0];
        let one = body
            .b
            .push_at(c(1), &[], Some(std::slice::from_ref(&i32s)), l)
            .map_err(err)?[0];
        let index = body
            .b
            .push_at(Op::Select {}, &[*pred, zero, one], None, l)
            .map_err(err)?[0];
        self.branches(body, names, op, index)
    }

    /// A kiln `case` over the op's regions, on `index`.
    fn branches(
        &mut self,
        body: &mut Body,
        names: &Names,
        op: &OpAst,
        index: ValueId,
    ) -> Result<Vec<ValueId>> {
        let regions: Vec<&Block> = op.regions.iter().collect();
        if regions.is_empty() {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` needs at least one branch", op.name),
            ));
        }
        if let Some(r) = regions.iter().find(|r| !r.args.is_empty()) {
            return Err(Error::invalid(
                op.pos,
                format!(
                    "a `{}` branch takes no arguments, this one takes {}",
                    op.name,
                    r.args.len()
                ),
            ));
        }
        let captured = captures(names, &regions, op.pos)?;
        let probes = if body.allow_checks {
            crate::probe::branch_probes(op, &regions)?
        } else {
            Vec::new()
        };
        let role = if probes.is_empty() {
            Role::Plain
        } else {
            Role::Branch(&probes)
        };
        let mut branches = Vec::new();
        for (i, r) in regions.iter().enumerate() {
            branches.push(self.region(body, &format!("branch{i}"), r, op.pos, &captured, role)?);
        }
        let mut operands = vec![index];
        operands.extend(captured.iter().map(|(_, v)| *v));
        let declared = result_types(op).map(|mut d| {
            d.extend(probes.iter().map(|p| p.ty.clone()));
            d
        });
        let mut out = push(
            body,
            op,
            Op::Case { branches },
            &operands,
            declared.as_deref(),
        )?;
        // The values the taken branch probed, in the order its probes ran.
        let own = out.len().saturating_sub(probes.len());
        for (p, &v) in probes.iter().zip(&out[own..]) {
            body.probes.push((p.id.clone(), v));
        }
        out.truncate(own);
        Ok(out)
    }

    /// The one region of `op` as a kiln function named `name`; an error when there is not one
    /// region or the body uses an outer value (`what` names the body in that error).
    fn closed_region(
        &mut self,
        body: &mut Body,
        op: &OpAst,
        what: &str,
        name: &str,
    ) -> Result<kiln_ir::Func> {
        let [region] = &op.regions[..] else {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` has one region", op.name),
            ));
        };
        if let Err(e) = captures(&Names::new(), &[region], op.pos) {
            return Err(Error::unsupported(
                e.pos,
                format!("a {what} body that uses an outer value ({})", e.message),
            ));
        }
        self.region(body, name, region, op.pos, &[], Role::Plain)
    }

    /// `map`: the body becomes a kiln function of scalars, the region of kiln's `map`
    /// (`dimensions`, when given, must be all of the operands' dimensions).
    fn map_op(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let f = self.closed_region(body, op, "map", "map")?;
        let Some(&first) = args.first() else {
            return Err(Error::invalid(op.pos, "`stablehlo.map` needs an operand"));
        };
        let rank = value_type(body, first)?.rank() as i64;
        let dimensions = match crate::ops::ints_attr(op, &["dimensions"])? {
            Some(d) => d,
            None => (0..rank).collect(),
        };
        let kop = Op::Map {
            dimensions,
            computation: Box::new(f),
        };
        let declared = result_types(op);
        push(body, op, kop, args, declared.as_deref())
    }

    /// `chlo.scan`: the body becomes a kiln function, unrolled over the scanned dimension.
    fn scan_op(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let f = self.closed_region(body, op, "scan", "scan")?;
        crate::decompose::scan(body, op, &f, args)
    }

    /// `reduce` whose body is no named combiner, or of several inputs: a `reduce_region` with
    /// the body as its region.
    fn reduce_op(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let f = self.closed_region(body, op, "reduce", "reducer")?;
        let kop = Op::ReduceRegion {
            dimensions: crate::ops::need_ints(op, &["dimensions"])?,
            body: Box::new(f),
        };
        let declared = result_types(op);
        push(body, op, kop, args, declared.as_deref())
    }

    /// `reduce_window` whose body is no named combiner, or of several inputs: a
    /// `reduce_window_region` with the body as its region.
    fn reduce_window_op(
        &mut self,
        body: &mut Body,
        op: &OpAst,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let f = self.closed_region(body, op, "reduce_window", "reducer")?;
        let w = crate::ops::window_attrs(op)?;
        let kop = Op::ReduceWindowRegion {
            window_dimensions: w.dims,
            window_strides: w.strides,
            base_dilations: w.base_dilations,
            window_dilations: w.window_dilations,
            padding: w.padding,
            body: Box::new(f),
        };
        let declared = result_types(op);
        push(body, op, kop, args, declared.as_deref())
    }

    /// `sort`: the comparator becomes a kiln function of scalars.
    fn sort_op(&mut self, body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
        let [cmp] = &op.regions[..] else {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.sort` has one region, the comparator",
            ));
        };
        if args.is_empty() {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.sort` needs at least one operand",
            ));
        }
        if cmp.args.len() != 2 * args.len() {
            return Err(Error::invalid(
                op.pos,
                format!(
                    "the comparator of `stablehlo.sort` takes {} arguments for {} operands",
                    cmp.args.len(),
                    args.len()
                ),
            ));
        }
        let rank = value_type(body, args[0])?.rank() as i64;
        let mut dimension = crate::ops::int_attr(op, &["dimension"])?.unwrap_or(-1);
        if dimension < 0 {
            dimension += rank;
        }
        let is_stable = match op.attr("is_stable") {
            Some((crate::ast::AttrVal::Bool(b), _)) => *b,
            Some((_, p)) => return Err(Error::invalid(p, "`is_stable` must be `true` or `false`")),
            None => false,
        };
        if let Err(e) = captures(&Names::new(), &[cmp], op.pos) {
            return Err(Error::unsupported(
                e.pos,
                format!("a sort comparator that uses an outer value ({})", e.message),
            ));
        }
        let comparator =
            Box::new(self.region(body, "comparator", cmp, op.pos, &[], Role::Plain)?);
        let declared = result_types(op);
        push(
            body,
            op,
            Op::Sort {
                dimension,
                is_stable,
                comparator,
            },
            args,
            declared.as_deref(),
        )
    }
}

/// What a region is to the op that holds it.
#[derive(Clone, Copy)]
enum Role<'s> {
    /// A region that returns what its block returns.
    Plain,
    /// A loop's condition: it also takes the loop's probe carries.
    LoopCond(&'s [crate::probe::Slot]),
    /// A loop's body: it also takes and returns the captured values and the probe carries.
    LoopBody(&'s [crate::probe::Slot]),
    /// A branch of `case` or `if`: it also returns the values its probes probed.
    Branch(&'s [crate::probe::BranchProbe]),
}

/// Whether `name` ends a block.
fn is_terminator(name: &str) -> bool {
    matches!(name, "func.return" | "stablehlo.return")
}

/// Defines a value name, refusing a second definition.
pub fn define(names: &mut Names, n: &Name, v: ValueId) -> Result<()> {
    define_tree(names, n, Tree::Leaf(v))
}

/// Defines a value name for a tensor or a tuple, refusing a second definition.
pub fn define_tree(names: &mut Names, n: &Name, t: Tree) -> Result<()> {
    let taken = names.values.contains_key(&n.name) || names.tuples.contains_key(&n.name);
    if taken {
        return Err(Error::invalid(
            n.pos,
            format!("value %{} is defined twice", n.name),
        ));
    }
    match t {
        Tree::Leaf(v) => {
            names.values.insert(n.name.clone(), v);
        }
        t => {
            names.tuples.insert(n.name.clone(), t);
        }
    }
    Ok(())
}

/// Names a function's parameters `params` (one per tensor of its arguments, a tuple argument
/// grouped as its shape says).
fn define_args(names: &mut Names, f: &FuncAst, params: &[ValueId]) -> Result<()> {
    define_block_args(names, &f.body.args, &f.arg_shapes, params)
}

/// Names the parameters `params` of a function or region whose block arguments are `args`
/// (one per tensor) of shapes `shapes` (empty when every argument is a tensor).
fn define_block_args(
    names: &mut Names,
    args: &[(Name, TensorType)],
    shapes: &[(Name, Shape)],
    params: &[ValueId],
) -> Result<()> {
    if shapes.is_empty() {
        for ((n, _), &v) in args.iter().zip(params) {
            define(names, n, v)?;
        }
        return Ok(());
    }
    let mut vals = params.iter().copied();
    for (n, shape) in shapes {
        let tree = Tree::of(shape, &mut vals)
            .ok_or_else(|| Error::invalid(n.pos, "fewer arguments than the signature's types"))?;
        define_tree(names, n, tree)?;
    }
    Ok(())
}

/// Binds an op's result names to the values built for it.
pub fn bind_results(names: &mut Names, op: &OpAst, vals: &[ValueId]) -> Result<()> {
    if op.results.len() != vals.len() {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}` defines {} values, but {} are named",
                op.name,
                vals.len(),
                op.results.len()
            ),
        ));
    }
    for (n, &v) in op.results.iter().zip(vals) {
        define(names, n, v)?;
    }
    Ok(())
}

/// Looks up a value name (`%x#0` also finds a single-result `%x`).
pub fn lookup(names: &Names, n: &Name) -> Result<ValueId> {
    if let Some(&v) = names.values.get(&n.name) {
        return Ok(v);
    }
    if let Some(base) = n.name.strip_suffix("#0")
        && let Some(&v) = names.values.get(base)
    {
        return Ok(v);
    }
    if names.tuples.contains_key(&n.name) {
        return Err(Error::unsupported(
            n.pos,
            format!(
                "the tuple %{} here (kiln flattens tuples through `tuple`, `get_tuple_element`, `func.call` and `func.return`)",
                n.name
            ),
        ));
    }
    Err(Error::invalid(
        n.pos,
        format!("value %{} is not defined", n.name),
    ))
}

/// The values an op uses; with `flatten`, a tuple operand is its tensors in order.
fn operands(names: &Names, op: &OpAst, flatten: bool) -> Result<Vec<ValueId>> {
    let mut out = Vec::with_capacity(op.operands.len());
    for n in &op.operands {
        match names.tuple(n) {
            Some(t) if flatten => t.leaves(&mut out),
            _ => out.push(lookup(names, n)?),
        }
    }
    Ok(out)
}

/// The type of a value built so far.
pub fn value_type(body: &Body, v: ValueId) -> Result<TensorType> {
    body.b
        .ty(v)
        .cloned()
        .ok_or_else(|| Error::invalid(Pos::default(), format!("internal: value {v} has no type")))
}

/// Checks that `vals` have the types `tys` (count and each type).
pub fn check_types(
    body: &Body,
    vals: &[ValueId],
    tys: &[TensorType],
    pos: Pos,
    what: &str,
) -> Result<()> {
    if vals.len() != tys.len() {
        return Err(Error::invalid(
            pos,
            format!(
                "{what}: {} values where the signature has {} types",
                vals.len(),
                tys.len()
            ),
        ));
    }
    for (i, (&v, t)) in vals.iter().zip(tys).enumerate() {
        let vt = value_type(body, v)?;
        if vt != *t {
            return Err(Error::invalid(
                pos,
                format!(
                    "{what}: value #{i} has type {}, the signature says {}",
                    type_name(&vt),
                    type_name(t)
                ),
            ));
        }
    }
    Ok(())
}

/// The result types an op's signature declares: all of a function type's results, or the
/// list's types when there is one per result, or its last type for a single result.
pub fn result_types(op: &OpAst) -> Option<Vec<TensorType>> {
    match &op.sig {
        Sig::Func(_, outs) => Some(outs.clone()),
        Sig::List(ts) if ts.len() == op.results.len() => Some(ts.clone()),
        Sig::List(ts) if op.results.len() == 1 => ts.last().map(|t| vec![t.clone()]),
        _ => None,
    }
}

/// Adds a kiln instruction for `op`, turning a type error into a located one.
pub fn push(
    body: &mut Body,
    op: &OpAst,
    kop: Op,
    operands: &[ValueId],
    declared: Option<&[TensorType]>,
) -> Result<Vec<ValueId>> {
    body.b
        .push_at(kop, operands, declared, loc(op.pos))
        .map_err(|e| {
            Error::invalid(
                op.pos,
                format!("`{}`: {} ({})", op.name, e.diag.message, e.diag.label),
            )
        })
}

/// The outer values that `regions` use without defining them, in order of first use.
fn captures(names: &Names, regions: &[&Block], pos: Pos) -> Result<Vec<(String, ValueId)>> {
    let mut defined = HashSet::new();
    let mut used = Vec::new();
    for r in regions {
        collect(r, &mut defined, &mut used);
    }
    let mut out: Vec<(String, ValueId)> = Vec::new();
    for n in used {
        if defined.contains(&n.name) || out.iter().any(|(m, _)| *m == n.name) {
            continue;
        }
        let v = lookup(names, &n).map_err(|e| Error {
            pos: if e.pos == Pos::default() { pos } else { e.pos },
            ..e
        })?;
        out.push((n.name.clone(), v));
    }
    Ok(out)
}

/// The names a block tree defines and uses.
fn collect(b: &Block, defined: &mut HashSet<String>, used: &mut Vec<Name>) {
    // Every argument, tokens (which have no tensor in `args`) included.
    for n in b
        .args
        .iter()
        .map(|(n, _)| n)
        .chain(b.arg_shapes.iter().map(|(n, _)| n))
    {
        defined.insert(n.name.clone());
    }
    for op in &b.ops {
        used.extend(op.operands.iter().cloned());
        for r in &op.results {
            defined.insert(r.name.clone());
            if let Some(base) = r.name.strip_suffix("#0") {
                defined.insert(base.to_string());
            }
        }
        for r in &op.regions {
            collect(r, defined, used);
        }
    }
}
