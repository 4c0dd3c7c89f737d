//! What the e-graph knows about each class: its types, its value when it is a small constant,
//! and its value when every element is the same. Constant folding lives here: a class whose
//! op has only constant operands gets the reference interpreter's result as a constant node.

use crate::lang::{Head, Meta, Node, is_tuple};
use egg::{Analysis, DidMerge, Id};
use kiln_ir::{Literal, Op, OpKind, Props, TensorType};
use std::sync::Arc;

/// Constants with at most this many elements are folded and carried as values.
pub const FOLD_LIMIT: usize = 4096;

/// The e-graph of kiln programs.
pub type EGraph = egg::EGraph<Node, Facts>;

/// Facts about one e-class.
#[derive(Clone, Debug, Default)]
pub struct Data {
    /// Result types (one for values, several for tuples, none for meta leaves).
    pub types: Vec<TensorType>,
    /// The value, when the class is a constant of at most [`FOLD_LIMIT`] elements.
    pub konst: Option<Arc<Literal>>,
    /// The value of every element, when the class is known to be a splat.
    pub splat: Option<f64>,
}

impl Data {
    /// The type of a single-valued class.
    pub fn ty(&self) -> Option<&TensorType> {
        match self.types.as_slice() {
            [t] => Some(t),
            _ => None,
        }
    }
}

/// The analysis: [`Data`] per class, constant folding in `modify`.
pub struct Facts {
    /// Whether to fold constants (off when a test applies one rule in isolation).
    pub fold: bool,
    /// How many classes were folded to constants.
    pub folded: usize,
    /// How many rule applications were dropped because the replacement's types differed from
    /// the match's (a rule bug; tests require zero).
    pub type_mismatches: usize,
}

impl Default for Facts {
    fn default() -> Facts {
        Facts {
            fold: true,
            folded: 0,
            type_mismatches: 0,
        }
    }
}

/// The meta leaf in class `id` (op nodes' first child).
pub fn meta(eg: &EGraph, id: Id) -> Option<Arc<Meta>> {
    eg[id].nodes.iter().find_map(|n| match &n.head {
        Head::Meta(m) => Some(m.clone()),
        _ => None,
    })
}

/// The value of every element of `l`, when they are all equal (a complex literal's only when
/// every imaginary part is +0, so that the rules see the complex number itself).
pub fn splat_of(l: &Literal) -> Option<f64> {
    if l.dtype().is_complex()
        && l.to_complex_f64s()
            .iter()
            .any(|z| z[1].to_bits() != 0f64.to_bits())
    {
        return None;
    }
    let v = l.to_f64s();
    let first = *v.first()?;
    v.iter()
        .all(|x| x.to_bits() == first.to_bits())
        .then_some(first)
}

impl Analysis<Node> for Facts {
    type Data = Data;

    fn make(eg: &mut EGraph, n: &Node, _id: Id) -> Data {
        match &n.head {
            Head::Param(_, t) => Data {
                types: vec![t.clone()],
                ..Data::default()
            },
            Head::Meta(_) => Data::default(),
            Head::Get(i) => Data {
                types: eg[n.children[0]]
                    .data
                    .types
                    .get(*i as usize)
                    .cloned()
                    .into_iter()
                    .collect(),
                ..Data::default()
            },
            Head::Op(kind) => {
                let Some(m) = meta(eg, n.children[0]) else {
                    return Data::default();
                };
                let mut d = Data {
                    types: m.types.clone(),
                    ..Data::default()
                };
                match (&m.op, kind) {
                    (Op::Constant { value }, OpKind::Constant) => {
                        d.splat = splat_of(value);
                        if value.numel() <= FOLD_LIMIT {
                            d.konst = Some(Arc::new(value.clone()));
                        }
                    }
                    (
                        _,
                        OpKind::BroadcastInDim
                        | OpKind::Reshape
                        | OpKind::Transpose
                        | OpKind::Slice
                        | OpKind::Reverse,
                    ) => d.splat = eg[n.children[1]].data.splat,
                    _ => {}
                }
                d
            }
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        debug_assert!(
            a.types == b.types || a.types.is_empty() || b.types.is_empty(),
            "merging classes of types {:?} and {:?}",
            a.types,
            b.types
        );
        let mut to_a = false;
        let mut to_b = false;
        if a.types.is_empty() && !b.types.is_empty() {
            a.types = b.types.clone();
            to_a = true;
        }
        match (&a.konst, &b.konst) {
            (None, Some(_)) => {
                a.konst = b.konst.clone();
                to_a = true;
            }
            (Some(_), None) => to_b = true,
            _ => {}
        }
        match (a.splat, b.splat) {
            (None, Some(s)) => {
                a.splat = Some(s);
                to_a = true;
            }
            (Some(_), None) => to_b = true,
            _ => {}
        }
        DidMerge(to_a, to_b)
    }

    fn modify(eg: &mut EGraph, id: Id) {
        if !eg.analysis.fold || eg[id].data.konst.is_some() {
            return;
        }
        let Some(ty) = eg[id].data.ty().cloned() else {
            return;
        };
        if ty.numel() > FOLD_LIMIT {
            return;
        }
        let folded = eg[id].nodes.iter().find_map(|n| {
            let kind = n.kind()?;
            if kind == OpKind::Constant || is_tuple(kind) || kind.props().contains(Props::BARRIER) {
                return None;
            }
            let args: Option<Vec<Arc<Literal>>> = n
                .operands()
                .iter()
                .map(|&c| eg[c].data.konst.clone())
                .collect();
            let args = args?;
            let m = meta(eg, n.children[0])?;
            let op = m.op_as(kind)?;
            let refs: Vec<&Literal> = args.iter().map(|a| a.as_ref()).collect();
            let types: Vec<&TensorType> = refs.iter().map(|a| a.ty()).collect();
            // Only fold what the verifier accepts; a rewrite bug must not reach the reference.
            kiln_ir::type_rule(&op, &types, Some(&m.types)).ok()?;
            kiln_reference::eval_op(&op, &refs, &m.types)
                .into_iter()
                .next()
        });
        if let Some(value) = folded {
            let c = add_constant(eg, value);
            eg.union(id, c);
            eg.analysis.folded += 1;
        }
    }
}

/// Adds a constant node holding `value`.
pub fn add_constant(eg: &mut EGraph, value: Literal) -> Id {
    let ty = value.ty().clone();
    let m = eg.add(Node::leaf(Head::Meta(Arc::new(Meta::new(
        Op::Constant { value },
        vec![ty],
    )))));
    eg.add(Node {
        head: Head::Op(OpKind::Constant),
        children: vec![m],
    })
}

/// Adds `x` (a scalar of `ty`'s dtype) broadcast to `ty`.
pub fn add_splat(eg: &mut EGraph, ty: &TensorType, x: f64) -> Option<Id> {
    let scalar = TensorType {
        dtype: ty.dtype,
        shape: vec![],
    };
    let c = add_constant(eg, Literal::from_f64s(scalar, &[x]).ok()?);
    if ty.shape.is_empty() {
        return Some(c);
    }
    Some(add_op(
        eg,
        Op::BroadcastInDim {
            broadcast_dimensions: vec![],
        },
        vec![ty.clone()],
        &[c],
    ))
}

/// Adds the op node `op` with `types` over `operands`.
pub fn add_op(eg: &mut EGraph, op: Op, types: Vec<TensorType>, operands: &[Id]) -> Id {
    let kind = op.kind();
    let m = eg.add(Node::leaf(Head::Meta(Arc::new(Meta::new(op, types)))));
    let mut children = vec![m];
    children.extend_from_slice(operands);
    eg.add(Node {
        head: Head::Op(kind),
        children,
    })
}
