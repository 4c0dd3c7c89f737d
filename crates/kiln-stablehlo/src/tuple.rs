//! Tuples, flattened at import: kiln has no tuple values, so a tuple is the list of its
//! tensors (its leaves, nested tuples in order) with its shape ([`Tree`]) kept by name.
//! `tuple` builds the tree of its operands, `get_tuple_element` picks a sub-tree, and a
//! tuple passed to `func.call` or `func.return`, or taken as a function parameter, is its
//! leaves (the function's kiln parameters and outputs are the flat list). So are the
//! carries of a `while` (its regions' tuple arguments grouped back by name) and the results
//! of `while`, `if` and `case` (their regions return tuples as their leaves). Any other use
//! of a tuple (an op, a region's capture) is a located `unsupported` error.
//!
//! A token (`!stablehlo.token`) is the empty list: it holds no data and only orders the
//! side-effecting ops that take it, and kiln's imported ops have no side effects to order.
//! `after_all` makes one, and tokens pass through functions and calls as tuples do.
//! In the functions of an interpreter test (read with checks), `infeed` reads each tensor as a
//! new parameter of its function, which the runner feeds from the `run_parallel`'s infeed
//! queue, and `outfeed` writes each tensor as an output ([`crate::FuncChecks::infeed`],
//! [`crate::FuncChecks::outfeed`]); `send` and `recv` likewise move tensors between the
//! programs of a `run_parallel` through channels ([`crate::channel`]).

use crate::ast::{OpAst, Shape, Sig};
use crate::error::{Error, Result};
use crate::import::{Body, Importer, Names, Tree, check_types, define_tree, lookup};
use kiln_ir::{TensorType, ValueId};

/// The shapes of `op`'s results as its signature writes them.
fn result_shapes(op: &OpAst) -> Vec<Shape> {
    if op.tuples.is_empty() {
        return vec![Shape::Leaf; op.results.len()];
    }
    match &op.sig {
        Sig::Func(..) => op
            .tuples
            .get(op.tuple_inputs..)
            .unwrap_or_default()
            .to_vec(),
        Sig::List(_) if op.tuples.len() == op.results.len() => op.tuples.clone(),
        _ => op.tuples.last().cloned().into_iter().collect(),
    }
}

/// The tensor types of `op`'s results as its signature writes them (a tuple's leaves).
fn result_leaf_types(op: &OpAst) -> Option<Vec<TensorType>> {
    match &op.sig {
        Sig::Func(_, outs) => Some(outs.clone()),
        Sig::List(ts) if op.tuples.len() == 1 => Some(ts.clone()),
        _ => None,
    }
}

/// The shape of a tree.
pub(crate) fn shape_of(t: &Tree) -> Shape {
    match t {
        Tree::Leaf(_) => Shape::Leaf,
        Tree::Tuple(parts) => Shape::Tuple(parts.iter().map(shape_of).collect()),
        Tree::Token => Shape::Token,
    }
}

/// The leaves of a tree.
fn leaves(t: &Tree) -> Vec<ValueId> {
    let mut out = Vec::new();
    t.leaves(&mut out);
    out
}

/// Checks that `t` is what `op`'s signature says its one result is, and names it.
fn bind_one(body: &Body, names: &mut Names, op: &OpAst, t: Tree) -> Result<()> {
    let [r] = &op.results[..] else {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}` defines one value, but {} are named",
                op.name,
                op.results.len()
            ),
        ));
    };
    if let [shape] = &result_shapes(op)[..]
        && *shape != shape_of(&t)
    {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}`: the result's tuple structure differs from the signature's",
                op.name
            ),
        ));
    }
    if let Some(tys) = result_leaf_types(op) {
        check_types(
            body,
            &leaves(&t),
            &tys,
            op.pos,
            &format!("the result of `{}`", op.name),
        )?;
    }
    define_tree(names, r, t)
}

/// Imports an op with tuple operands or results.
pub fn lower(
    imp: &mut Importer,
    body: &mut Body,
    names: &mut Names,
    op: &OpAst,
    args: &[ValueId],
) -> Result<()> {
    match op.name.as_str() {
        "stablehlo.tuple" => {
            let mut parts = Vec::with_capacity(op.operands.len());
            for n in &op.operands {
                parts.push(match names.tuple(n) {
                    Some(t) => t.clone(),
                    None => Tree::Leaf(lookup(names, n)?),
                });
            }
            bind_one(body, names, op, Tree::Tuple(parts))
        }
        "stablehlo.after_all" => {
            // Its operands are tokens, which hold nothing; so is its result.
            if let Some(n) = op
                .operands
                .iter()
                .find(|n| !matches!(names.tuple(n), Some(Tree::Token)))
            {
                return Err(Error::invalid(
                    n.pos,
                    format!(
                        "the operand %{} of `stablehlo.after_all` is not a token",
                        n.name
                    ),
                ));
            }
            bind_one(body, names, op, Tree::Token)
        }
        "stablehlo.get_tuple_element" => {
            let [n] = &op.operands[..] else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.get_tuple_element` takes one operand",
                ));
            };
            let Some(Tree::Tuple(parts)) = names.tuple(n) else {
                return Err(Error::invalid(
                    n.pos,
                    format!(
                        "the operand %{} of `stablehlo.get_tuple_element` is not a tuple",
                        n.name
                    ),
                ));
            };
            let index = crate::ops::int_attr(op, &["index"])?.ok_or_else(|| {
                Error::invalid(op.pos, "`stablehlo.get_tuple_element` needs an index")
            })?;
            let Some(part) = usize::try_from(index).ok().and_then(|i| parts.get(i)) else {
                return Err(Error::invalid(
                    op.pos,
                    format!(
                        "index {index} of a tuple of {} elements (get_tuple_element_c1)",
                        parts.len()
                    ),
                ));
            };
            let part = part.clone();
            bind_one(body, names, op, part)
        }
        "func.call" | "interpreter.run_parallel" => {
            let results = if op.name == "func.call" {
                imp.call(body, op, args)?
            } else {
                crate::parallel::record(body, op, args)?
            };
            bind_shaped(names, op, results)
        }
        "stablehlo.while" | "stablehlo.if" | "stablehlo.case" => {
            let results = imp.control(body, names, op, args)?;
            bind_shaped(names, op, results)
        }
        "stablehlo.infeed" | "stablehlo.outfeed" if body.allow_checks => {
            feed(body, names, op, args)
        }
        name @ ("stablehlo.infeed" | "stablehlo.outfeed") => Err(Error::unsupported(
            op.pos,
            format!("`{name}` here (read by `parse_with_checks`, in a function's own body only)"),
        )),
        "stablehlo.send" | "stablehlo.recv" => crate::channel::lower(body, names, op, args),
        name => Err(Error::unsupported(
            op.pos,
            format!(
                "tuple or token operands or results of `{name}` (kiln flattens tuples through `tuple`, `get_tuple_element`, `func.call` and `func.return`, and tokens through `after_all` too)"
            ),
        )),
    }
}

/// `infeed`: each tensor it reads is a new parameter of the function, which a runner feeds
/// from the infeed queue; `outfeed`: each tensor it writes is an output of the function.
/// Either's token result holds nothing.
fn feed(body: &mut Body, names: &mut Names, op: &OpAst, args: &[ValueId]) -> Result<()> {
    let mut results = Vec::new();
    if op.name == "stablehlo.infeed" {
        let Sig::Func(_, outs) = &op.sig else {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.infeed` needs its function type",
            ));
        };
        for t in outs {
            body.infeed.push(body.b.param_count());
            results.push(body.b.param(t.clone()));
        }
    } else {
        body.outfeed.extend_from_slice(args);
    }
    bind_shaped(names, op, results)
}

/// Names `op`'s results, `results` grouped as its signature's result types say.
pub(crate) fn bind_shaped(names: &mut Names, op: &OpAst, results: Vec<ValueId>) -> Result<()> {
    let shapes = result_shapes(op);
    let leaves: usize = shapes.iter().map(Shape::leaves).sum();
    if shapes.len() != op.results.len() || leaves != results.len() {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}` gives {} tensors, its {} named results hold {leaves}",
                op.name,
                results.len(),
                op.results.len()
            ),
        ));
    }
    let mut vals = results.into_iter();
    for (n, shape) in op.results.iter().zip(&shapes) {
        let t = Tree::of(shape, &mut vals)
            .ok_or_else(|| Error::invalid(op.pos, format!("`{}`: too few results", op.name)))?;
        define_tree(names, n, t)?;
    }
    Ok(())
}
