//! Rewrite rules, read from the rule files in `rules/` (one file per topic).
//!
//! Each rule is one line under a comment that states its identity:
//!
//! ```text
//! # x - 0 = x
//! sub-zero  exact  (subtract ?m ?x ?z) => ?x  if splat(?z, 0)
//! ```
//!
//! The fields are the rule's name, its tag, the pattern, `=>`, the replacement, and optional
//! conditions after `if`. Patterns are egg s-expressions over op mnemonics; an op's first
//! operand is its meta (attributes and result types). The replacement may call a function in
//! braces, `{compose_perm ?q ?p}`, which computes a new meta or node from bound variables and may
//! decline (then the rule does not fire). Tags:
//! - `exact`: both sides give the same bits for every input (IEEE semantics, signed zeros and
//!   NaNs included, under the spec's semantics of each op).
//! - `reassoc`: equal up to rounding (reassociation, identities that fail on signed zeros,
//!   infinities or NaN); these run only when the caller opts in to fast math.

use crate::analysis::{EGraph, add_splat, meta};
use crate::lang::{Meta, Node};
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};
use kiln_ir::{DType, Op, TensorType};
use std::sync::Arc;

/// The rule files, by topic.
pub const RULE_FILES: &[(&str, &str)] = &[
    ("algebra", include_str!("../rules/algebra.rules")),
    ("layout", include_str!("../rules/layout.rules")),
    ("reductions", include_str!("../rules/reductions.rules")),
];

/// Whether a rule is bit-exact or needs fast math.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Same bits for every input.
    Exact,
    /// Equal up to rounding; runs only under fast math.
    Reassoc,
}

/// One rule as written in its file.
#[derive(Clone, Debug)]
pub struct RuleDef {
    /// The rule's name.
    pub name: String,
    /// The file (topic) it comes from.
    pub topic: &'static str,
    /// The identity stated above it.
    pub identity: String,
    /// Exact or reassociating.
    pub tag: Tag,
    /// The pattern text.
    pub lhs: String,
    /// The replacement text.
    pub rhs: String,
    /// The applier: conditions, calls and the replacement pattern.
    pub applier: RuleApplier,
    /// The searcher.
    pub searcher: Pattern<Node>,
}

/// A condition on bound variables.
#[derive(Clone, Debug)]
struct Cond {
    name: String,
    vars: Vec<Var>,
    literal: Option<String>,
}

/// A computed variable: `var = name(args)`.
#[derive(Clone, Debug)]
struct Call {
    var: Var,
    name: String,
    args: Vec<Var>,
}

/// Checks conditions, computes the called functions and instantiates the replacement.
#[derive(Clone, Debug)]
pub struct RuleApplier {
    conds: Vec<Cond>,
    calls: Vec<Call>,
    rhs: PatternAst<Node>,
    rhs_var: Option<Var>,
}

/// Why a rule did not produce a replacement.
#[derive(Clone, Debug, PartialEq)]
pub enum Declined {
    /// A condition or function said no.
    NotApplicable,
    /// The replacement's types differ from the matched class's (a rule bug).
    TypeMismatch(String),
}

impl RuleApplier {
    /// The replacement for the match `subst` of class `eclass`, added to the e-graph but not
    /// merged with it.
    pub fn instantiate(&self, eg: &mut EGraph, eclass: Id, subst: &Subst) -> Result<Id, Declined> {
        for c in &self.conds {
            if !check(eg, c, subst) {
                return Err(Declined::NotApplicable);
            }
        }
        let mut s = subst.clone();
        for c in &self.calls {
            let args: Vec<Id> = c.args.iter().map(|v| s[*v]).collect();
            let id = call(eg, &c.name, &args).ok_or(Declined::NotApplicable)?;
            s.insert(c.var, id);
        }
        let id = match self.rhs_var {
            Some(v) => s[v],
            None => eg.add_instantiation(&self.rhs, &s),
        };
        let want = &eg[eclass].data.types;
        let got = &eg[id].data.types;
        if want != got {
            return Err(Declined::TypeMismatch(format!(
                "replacement has types {got:?}, the match {want:?}"
            )));
        }
        Ok(id)
    }
}

impl Applier<Node, crate::analysis::Facts> for RuleApplier {
    fn apply_one(
        &self,
        eg: &mut EGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Node>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        match self.instantiate(eg, eclass, subst) {
            Ok(id) if eg.union(eclass, id) => vec![eclass],
            Ok(_) => vec![],
            Err(Declined::NotApplicable) => vec![],
            Err(Declined::TypeMismatch(_)) => {
                eg.analysis.type_mismatches += 1;
                vec![]
            }
        }
    }
}

/// Every rule of every rule file, in file order.
pub fn all_rules() -> Vec<RuleDef> {
    let mut out = Vec::new();
    for (topic, text) in RULE_FILES {
        out.extend(parse_rules(topic, text).unwrap_or_else(|e| panic!("rules/{topic}.rules: {e}")));
    }
    out
}

/// The egg rewrites for the rules allowed under `fast_math`.
pub fn rewrites(fast_math: bool) -> Vec<Rewrite<Node, crate::analysis::Facts>> {
    all_rules()
        .into_iter()
        .filter(|r| fast_math || r.tag == Tag::Exact)
        .map(|r| Rewrite::new(r.name.clone(), r.searcher, r.applier).expect("rule variables"))
        .collect()
}

/// Parses one rule file.
pub fn parse_rules(topic: &'static str, text: &str) -> Result<Vec<RuleDef>, String> {
    let mut out: Vec<RuleDef> = Vec::new();
    let mut identity: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = |e: String| format!("line {}: {e}", n + 1);
        if line.is_empty() {
            identity = None;
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            identity = Some(c.trim().to_string());
            continue;
        }
        let identity = identity
            .clone()
            .ok_or_else(|| at("a rule without a comment stating its identity above it".into()))?;
        let (name, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let name = name.to_string();
        let (tag, rest) = rest
            .trim_start()
            .split_once(char::is_whitespace)
            .unwrap_or((rest, ""));
        let tag = match tag {
            "exact" => Tag::Exact,
            "reassoc" => Tag::Reassoc,
            other => return Err(at(format!("tag must be exact or reassoc, not `{other}`"))),
        };
        let rest = rest.trim();
        let (lhs, rhs) = rest
            .split_once("=>")
            .ok_or_else(|| at("expected `=>`".into()))?;
        let (rhs, conds) = match rhs.split_once(" if ") {
            Some((r, c)) => (r, Some(c)),
            None => (rhs, None),
        };
        if out.iter().any(|r| r.name == name) {
            return Err(at(format!("rule `{name}` is defined twice")));
        }
        let searcher: Pattern<Node> = lhs
            .trim()
            .parse()
            .map_err(|e| at(format!("pattern: {e:?}")))?;
        let applier = parse_applier(rhs.trim(), conds.map(str::trim)).map_err(at)?;
        let bound = searcher.vars();
        for v in applier
            .conds
            .iter()
            .flat_map(|c| &c.vars)
            .chain(applier.calls.iter().flat_map(|c| &c.args))
        {
            if !bound.contains(v) {
                return Err(at(format!("{v} is not bound by the pattern")));
            }
        }
        out.push(RuleDef {
            name,
            topic,
            identity,
            tag,
            lhs: lhs.trim().to_string(),
            rhs: rhs.trim().to_string(),
            applier,
            searcher,
        });
    }
    Ok(out)
}

fn parse_applier(rhs: &str, conds: Option<&str>) -> Result<RuleApplier, String> {
    // Replace each `{name ?a ?b}` by a fresh variable bound by a call.
    let mut calls = Vec::new();
    let mut text = String::new();
    let mut rest = rhs;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .ok_or("unclosed `{` in the replacement")?
            + open;
        text.push_str(&rest[..open]);
        let mut parts = rest[open + 1..close].split_whitespace();
        let name = parts.next().ok_or("empty `{}`")?.to_string();
        if !FUNCTIONS.contains(&name.as_str()) {
            return Err(format!("unknown function `{name}`"));
        }
        let args = parts
            .map(|a| a.parse::<Var>().map_err(|e| format!("argument {a}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let var: Var = format!("?call{}", calls.len()).parse().expect("var");
        text.push_str(&var.to_string());
        calls.push(Call { var, name, args });
        rest = &rest[close + 1..];
    }
    text.push_str(rest);
    let text = text.trim();
    let (rhs, rhs_var) = if let Ok(v) = text.parse::<Var>() {
        (PatternAst::default(), Some(v))
    } else {
        let p: Pattern<Node> = text.parse().map_err(|e| format!("replacement: {e:?}"))?;
        (p.ast, None)
    };
    let mut out = Vec::new();
    if let Some(conds) = conds {
        for c in split_conds(conds) {
            let (name, args) = c
                .split_once('(')
                .and_then(|(n, a)| Some((n.trim(), a.strip_suffix(')')?)))
                .ok_or_else(|| format!("condition `{c}` is not `name(args)`"))?;
            if !CONDITIONS.contains(&name) {
                return Err(format!("unknown condition `{name}`"));
            }
            let mut vars = Vec::new();
            let mut literal = None;
            for a in args.split(',').map(str::trim) {
                if a.starts_with('?') {
                    vars.push(a.parse::<Var>().map_err(|e| format!("{a}: {e}"))?);
                } else {
                    literal = Some(a.to_string());
                }
            }
            out.push(Cond {
                name: name.to_string(),
                vars,
                literal,
            });
        }
    }
    Ok(RuleApplier {
        conds: out,
        calls,
        rhs,
        rhs_var,
    })
}

fn split_conds(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out
}

/// The conditions a rule may state after `if`.
pub const CONDITIONS: &[&str] = &[
    "splat",
    "not_float",
    "same_type",
    "result_is",
    "pow2",
    "float",
    "combiner",
    "identity_of",
    "identity_perm",
];

/// The functions a replacement may call in braces.
pub const FUNCTIONS: &[&str] = &[
    "compose_perm",
    "retype",
    "redtype",
    "with_type",
    "plain",
    "compose_bcast",
    "permute_bcast",
    "slice_slice",
    "slice_under_bcast",
    "dot_fold_lhs",
    "dot_fold_rhs",
    "merge_reduce",
    "bcast_after_reduce",
    "reduced_count",
    "zeros",
    "reciprocal",
];

/// The type of a value class, or a meta's first result type.
fn type_of(eg: &EGraph, id: Id) -> Option<TensorType> {
    if let Some(t) = eg[id].data.ty() {
        return Some(t.clone());
    }
    meta(eg, id).map(|m| m.ty().clone())
}

fn check(eg: &EGraph, c: &Cond, s: &Subst) -> bool {
    let ids: Vec<Id> = c.vars.iter().map(|v| s[*v]).collect();
    let lit = c.literal.as_deref().unwrap_or("");
    match c.name.as_str() {
        "splat" => {
            let (Some(v), Some(ty), Ok(want)) = (
                eg[ids[0]].data.splat,
                eg[ids[0]].data.ty(),
                lit.parse::<f64>(),
            ) else {
                return false;
            };
            if ty.dtype.is_float() {
                v.to_bits() == want.to_bits()
            } else {
                v == want
            }
        }
        // The integers and `pred` (exact arithmetic): not the floats, nor the complex numbers
        // built of them.
        "not_float" => eg[ids[0]]
            .data
            .ty()
            .is_some_and(|t| !t.dtype.is_float() && !t.dtype.is_complex()),
        "float" => eg[ids[0]].data.ty().is_some_and(|t| t.dtype.is_float()),
        "same_type" => {
            let a = type_of(eg, ids[0]);
            a.is_some() && a == type_of(eg, ids[1])
        }
        "result_is" => {
            let a = meta(eg, ids[0]).map(|m| m.ty().clone());
            a.is_some() && a.as_ref() == eg[ids[1]].data.ty()
        }
        "pow2" => {
            let (Some(v), Some(ty)) = (eg[ids[0]].data.splat, eg[ids[0]].data.ty()) else {
                return false;
            };
            // 1/v must be exact and normal in the dtype: a power of two well inside the range.
            let e = v.abs().log2();
            ty.dtype.is_float() && v != 0.0 && e.fract() == 0.0 && e.abs() <= 14.0
        }
        "combiner" => meta(eg, ids[0]).is_some_and(|m| match &m.op {
            Op::Reduce { kind, .. } => lit.split('|').any(|k| k == kind.to_string()),
            _ => false,
        }),
        "identity_of" => {
            let (Some(v), Some(m)) = (eg[ids[0]].data.splat, meta(eg, ids[1])) else {
                return false;
            };
            match &m.op {
                Op::Reduce { kind, .. } => match kind.to_string().as_str() {
                    "add" => v == 0.0,
                    "mul" => v == 1.0,
                    "max" => v == f64::NEG_INFINITY,
                    "min" => v == f64::INFINITY,
                    _ => false,
                },
                _ => false,
            }
        }
        "identity_perm" => meta(eg, ids[0]).is_some_and(|m| match &m.op {
            Op::Transpose { permutation } => {
                permutation.iter().enumerate().all(|(i, &p)| p == i as i64)
            }
            _ => false,
        }),
        _ => false,
    }
}

/// Adds a meta leaf; `None` unless `op` type-checks over `operands` with result `ty`.
fn checked_meta(eg: &mut EGraph, op: Op, operands: &[&TensorType], ty: TensorType) -> Option<Id> {
    let types = vec![ty];
    kiln_ir::type_rule(&op, operands, Some(&types)).ok()?;
    Some(
        eg.add(Node::leaf(crate::lang::Head::Meta(Arc::new(Meta::new(
            op, types,
        ))))),
    )
}

fn add_meta(eg: &mut EGraph, m: Meta) -> Id {
    eg.add(Node::leaf(crate::lang::Head::Meta(Arc::new(m))))
}

fn call(eg: &mut EGraph, name: &str, a: &[Id]) -> Option<Id> {
    match name {
        // transpose(transpose(x, q), p) = transpose(x, r) with r[i] = q[p[i]].
        "compose_perm" => {
            let (q, p) = (meta(eg, a[0])?, meta(eg, a[1])?);
            let (Op::Transpose { permutation: q_ }, Op::Transpose { permutation: p_ }) =
                (&q.op, &p.op)
            else {
                return None;
            };
            let r = p_.iter().map(|&i| q_[i as usize]).collect();
            Some(add_meta(
                eg,
                Meta::new(Op::Transpose { permutation: r }, p.types.clone()),
            ))
        }
        // The meta of `a` with the shape of `b` (dtype kept).
        "retype" => {
            let (m, t) = (meta(eg, a[0])?, type_of(eg, a[1])?);
            let ty = TensorType {
                dtype: m.ty().dtype,
                shape: t.shape,
            };
            Some(add_meta(eg, Meta::new(m.op.clone(), vec![ty])))
        }
        // The meta of `a` with the dtype of `b` (shape kept).
        "redtype" => {
            let (m, t) = (meta(eg, a[0])?, type_of(eg, a[1])?);
            let ty = TensorType {
                dtype: t.dtype,
                shape: m.ty().shape.clone(),
            };
            Some(add_meta(eg, Meta::new(m.op.clone(), vec![ty])))
        }
        // The meta of `a` with the type of `b`.
        "with_type" => {
            let (m, t) = (meta(eg, a[0])?, type_of(eg, a[1])?);
            Some(add_meta(eg, Meta::new(m.op.clone(), vec![t])))
        }
        // A meta without attributes of the type of `a`.
        "plain" => {
            let t = type_of(eg, a[0])?;
            Some(add_meta(eg, Meta::plain(t)))
        }
        // broadcast(broadcast(x, c), b): x dim i lands in dim b[c[i]].
        "compose_bcast" => {
            let (c, b) = (meta(eg, a[0])?, meta(eg, a[1])?);
            let (
                Op::BroadcastInDim {
                    broadcast_dimensions: c_,
                },
                Op::BroadcastInDim {
                    broadcast_dimensions: b_,
                },
            ) = (&c.op, &b.op)
            else {
                return None;
            };
            let dims = c_.iter().map(|&i| b_[i as usize]).collect();
            Some(add_meta(
                eg,
                Meta::new(
                    Op::BroadcastInDim {
                        broadcast_dimensions: dims,
                    },
                    b.types.clone(),
                ),
            ))
        }
        // transpose(broadcast(x, dims), p): x dim i lands in dim p^-1[dims[i]].
        "permute_bcast" => {
            let (b, p, x) = (meta(eg, a[0])?, meta(eg, a[1])?, type_of(eg, a[2])?);
            let (
                Op::BroadcastInDim {
                    broadcast_dimensions: d,
                },
                Op::Transpose { permutation },
            ) = (&b.op, &p.op)
            else {
                return None;
            };
            let mut inv = vec![0i64; permutation.len()];
            for (i, &q) in permutation.iter().enumerate() {
                inv[q as usize] = i as i64;
            }
            let dims = d.iter().map(|&i| inv[i as usize]).collect();
            checked_meta(
                eg,
                Op::BroadcastInDim {
                    broadcast_dimensions: dims,
                },
                &[&x],
                p.ty().clone(),
            )
        }
        // slice(slice(x, s), t) = slice(x, composed).
        "slice_slice" => {
            let (t, s, x) = (meta(eg, a[0])?, meta(eg, a[1])?, type_of(eg, a[2])?);
            let (
                Op::Slice {
                    start_indices: ts,
                    strides: tt,
                    ..
                },
                Op::Slice {
                    start_indices: ss,
                    strides: st,
                    ..
                },
            ) = (&t.op, &s.op)
            else {
                return None;
            };
            let out = &t.ty().shape;
            let mut start = Vec::new();
            let mut limit = Vec::new();
            let mut stride = Vec::new();
            for d in 0..out.len() {
                let b = ts[d].checked_mul(st[d])?.checked_add(ss[d])?;
                let step = st[d].checked_mul(tt[d])?;
                start.push(b);
                stride.push(step);
                limit.push(if out[d] == 0 {
                    b
                } else {
                    (out[d] as i64 - 1)
                        .checked_mul(step)?
                        .checked_add(b)?
                        .checked_add(1)?
                });
            }
            checked_meta(
                eg,
                Op::Slice {
                    start_indices: start,
                    limit_indices: limit,
                    strides: stride,
                },
                &[&x],
                t.ty().clone(),
            )
        }
        // slice(broadcast(x, dims), s): the part of x that the slice reads, as a slice of x.
        "slice_under_bcast" => {
            let (s, b, x) = (meta(eg, a[0])?, meta(eg, a[1])?, type_of(eg, a[2])?);
            let (
                Op::Slice {
                    start_indices,
                    limit_indices,
                    strides,
                },
                Op::BroadcastInDim {
                    broadcast_dimensions: dims,
                },
            ) = (&s.op, &b.op)
            else {
                return None;
            };
            let out = &s.ty().shape;
            let mut st = Vec::new();
            let mut li = Vec::new();
            let mut sd = Vec::new();
            let mut shape = Vec::new();
            for (i, &d) in dims.iter().enumerate() {
                let d = d as usize;
                if x.shape[i] == 1 && b.ty().shape[d] != 1 {
                    st.push(0);
                    li.push(1);
                    sd.push(1);
                    shape.push(1);
                } else {
                    st.push(start_indices[d]);
                    li.push(limit_indices[d]);
                    sd.push(strides[d]);
                    shape.push(out[d]);
                }
            }
            let ty = TensorType {
                dtype: x.dtype,
                shape,
            };
            checked_meta(
                eg,
                Op::Slice {
                    start_indices: st,
                    limit_indices: li,
                    strides: sd,
                },
                &[&x],
                ty,
            )
        }
        "dot_fold_lhs" | "dot_fold_rhs" => {
            let lhs = name == "dot_fold_lhs";
            let (d, p, x, other) = (
                meta(eg, a[0])?,
                meta(eg, a[1])?,
                type_of(eg, a[2])?,
                type_of(eg, a[3])?,
            );
            let (
                Op::DotGeneral {
                    lhs_batching_dimensions: lb,
                    rhs_batching_dimensions: rb,
                    lhs_contracting_dimensions: lc,
                    rhs_contracting_dimensions: rc,
                },
                Op::Transpose { permutation },
            ) = (&d.op, &p.op)
            else {
                return None;
            };
            let (batch, contract) = if lhs { (lb, lc) } else { (rb, rc) };
            // The free dims must keep their relative order, which fixes the result's layout.
            let free: Vec<i64> = (0..permutation.len() as i64)
                .filter(|i| !batch.contains(i) && !contract.contains(i))
                .map(|i| permutation[i as usize])
                .collect();
            if free.windows(2).any(|w| w[0] > w[1]) {
                return None;
            }
            let map = |v: &Vec<i64>| v.iter().map(|&i| permutation[i as usize]).collect();
            let op = if lhs {
                Op::DotGeneral {
                    lhs_batching_dimensions: map(lb),
                    rhs_batching_dimensions: rb.clone(),
                    lhs_contracting_dimensions: map(lc),
                    rhs_contracting_dimensions: rc.clone(),
                }
            } else {
                Op::DotGeneral {
                    lhs_batching_dimensions: lb.clone(),
                    rhs_batching_dimensions: map(rb),
                    lhs_contracting_dimensions: lc.clone(),
                    rhs_contracting_dimensions: map(rc),
                }
            };
            let operands = if lhs { [&x, &other] } else { [&other, &x] };
            checked_meta(eg, op, &operands, d.ty().clone())
        }
        // reduce(reduce(x, s), r) = reduce(x, s ∪ r') where r' are r's dims in x's numbering.
        "merge_reduce" => {
            let (s, r, x) = (meta(eg, a[0])?, meta(eg, a[1])?, type_of(eg, a[2])?);
            let (
                Op::Reduce {
                    dimensions: sd,
                    kind: sk,
                },
                Op::Reduce {
                    dimensions: rd,
                    kind: rk,
                },
            ) = (&s.op, &r.op)
            else {
                return None;
            };
            if sk != rk {
                return None;
            }
            let kept: Vec<i64> = (0..x.shape.len() as i64)
                .filter(|i| !sd.contains(i))
                .collect();
            let mut dims: Vec<i64> = sd.clone();
            dims.extend(rd.iter().map(|&i| kept[i as usize]));
            dims.sort_unstable();
            checked_meta(
                eg,
                Op::Reduce {
                    dimensions: dims,
                    kind: *sk,
                },
                &[
                    &x,
                    &TensorType {
                        dtype: x.dtype,
                        shape: vec![],
                    },
                ],
                r.ty().clone(),
            )
        }
        // reduce(broadcast(x, b), r) where r reduces only dims the broadcast added (each of
        // size >= 1): the broadcast of x into the reduced shape.
        "bcast_after_reduce" => {
            let (r, b, x) = (meta(eg, a[0])?, meta(eg, a[1])?, type_of(eg, a[2])?);
            let (
                Op::Reduce { dimensions, .. },
                Op::BroadcastInDim {
                    broadcast_dimensions: bd,
                },
            ) = (&r.op, &b.op)
            else {
                return None;
            };
            let full = &b.ty().shape;
            if dimensions
                .iter()
                .any(|d| bd.contains(d) || full[*d as usize] == 0)
            {
                return None;
            }
            let kept: Vec<i64> = (0..full.len() as i64)
                .filter(|i| !dimensions.contains(i))
                .collect();
            let dims = bd
                .iter()
                .map(|d| kept.iter().position(|k| k == d).map(|p| p as i64))
                .collect::<Option<Vec<_>>>()?;
            checked_meta(
                eg,
                Op::BroadcastInDim {
                    broadcast_dimensions: dims,
                },
                &[&x],
                r.ty().clone(),
            )
        }
        // The number of elements a reduce combines into each result, splat to its result type.
        "reduced_count" => {
            let (r, b) = (meta(eg, a[0])?, meta(eg, a[1])?);
            let Op::Reduce { dimensions, .. } = &r.op else {
                return None;
            };
            let n = dimensions
                .iter()
                .map(|&d| b.ty().shape.get(usize::try_from(d).ok()?).copied())
                .try_fold(1usize, |n, d| n.checked_mul(d?))?;
            let ty = r.ty().clone();
            if !ty.dtype.is_float() && ty.dtype != DType::I32 && ty.dtype != DType::I64 {
                return None;
            }
            add_splat(eg, &ty, n as f64)
        }
        // Zeros of the type of `a`.
        "zeros" => {
            let t = type_of(eg, a[0])?;
            add_splat(eg, &t, 0.0)
        }
        // 1/c for a splat c, of c's type.
        "reciprocal" => {
            let (v, t) = (eg[a[0]].data.splat?, type_of(eg, a[0])?);
            add_splat(eg, &t, 1.0 / v)
        }
        _ => None,
    }
}
