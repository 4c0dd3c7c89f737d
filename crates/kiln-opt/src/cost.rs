//! The cost model: estimated nanoseconds on the machine it is given ([`Machine`]: the
//! backend describes its target, see `kiln_kernel::TargetInfo`; kiln-opt never reads the host).
//!
//! Elementwise and layout ops are assumed fused into their users (no memory traffic of their
//! own), so they cost their arithmetic only. Ops that materialize their result (reductions,
//! matrix products, convolutions, gathers and the rest) also pay for writing their result and
//! reading it back. Large constants pay for being read. Arithmetic is weighted per op (a
//! transcendental costs about fifteen adds) and divided by the machine's vector lanes and
//! threads; matrix products run at the FMA peak.

use crate::analysis::{EGraph, meta};
use crate::lang::{Head, Node};
use egg::{CostFunction, Id};
use kiln_ir::{Op, OpKind, Props};

/// The machine the costs are estimated for (a backend derives it from its target's
/// description; [`Machine::REFERENCE`] where none is given).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// f32 lanes per vector.
    pub lanes: f64,
    /// Threads kernels run on.
    pub threads: f64,
    /// Clock, in GHz.
    pub ghz: f64,
    /// Memory bandwidth, in GB/s.
    pub gbps: f64,
}

impl Machine {
    /// A fixed machine (AVX2, 2 threads, 2.5 GHz, 15 GB/s), for reproducible dumps and tests.
    pub const REFERENCE: Machine = Machine {
        lanes: 8.0,
        threads: 2.0,
        ghz: 2.5,
        gbps: 15.0,
    };

    /// Nanoseconds per elementwise operation on one element.
    fn element_ns(&self) -> f64 {
        1.0 / (self.lanes * self.ghz * self.threads)
    }

    /// Nanoseconds per multiply-add in a matrix product (two FMA units).
    fn fma_ns(&self) -> f64 {
        1.0 / (2.0 * self.lanes * self.ghz * self.threads)
    }

    /// Nanoseconds per byte moved to or from memory.
    fn byte_ns(&self) -> f64 {
        1.0 / self.gbps
    }
}

/// Relative arithmetic cost of one element of an elementwise op (an add is 1).
pub fn weight(kind: OpKind) -> f64 {
    use OpKind::*;
    match kind {
        Divide | Sqrt | Rsqrt => 4.0,
        Remainder => 10.0,
        Exponential | Log | LogPlusOne | ExponentialMinusOne | Tanh | Logistic | Erf => 15.0,
        Sine | Cosine => 25.0,
        Power => 30.0,
        k if k.props().contains(Props::LAYOUT) => 0.5,
        Iota => 0.5,
        _ => 1.0,
    }
}

/// The number of elements of a shape, as f64 (the arithmetic of the model): 0 for an empty
/// shape, otherwise capped at `i64::MAX`, so that it is finite for any shape, even one the
/// verifier rejects, and costs never become infinite or NaN.
pub fn elements(shape: &[usize]) -> f64 {
    if shape.contains(&0) {
        return 0.0;
    }
    shape
        .iter()
        .map(|&d| d as f64)
        .product::<f64>()
        .min(i64::MAX as f64)
}

/// What every op node costs on top of its work, so that of equal programs the smaller one wins
/// and the choice graph has no cycles.
pub const NODE: f64 = 1e-3;

/// The cost of every op node, for egg's extractor.
pub struct CostModel<'a> {
    eg: &'a EGraph,
    machine: Machine,
}

impl<'a> CostModel<'a> {
    /// The model over `eg` for `machine`.
    pub fn new(eg: &'a EGraph, machine: Machine) -> CostModel<'a> {
        CostModel { eg, machine }
    }

    /// The node's own cost, without its children's.
    pub fn node_cost(&self, n: &Node) -> f64 {
        let kind = match &n.head {
            Head::Param(..) | Head::Meta(_) => return 0.0,
            Head::Get(_) => return NODE,
            Head::Op(k) => *k,
        };
        let Some(m) = meta(self.eg, n.children[0]) else {
            return NODE;
        };
        let operand = |i: usize| self.eg[n.operands()[i]].data.ty().cloned();
        NODE + op_cost(&self.machine, &m.op, kind, &m.types, operand)
    }
}

/// The cost of an op of `kind` with the attributes of `op`, result types `types` and operand
/// types `operand(i)`, without the per-node constant (see [`CostModel::node_cost`]).
pub fn op_cost(
    mk: &Machine,
    op: &Op,
    kind: OpKind,
    types: &[kiln_ir::TensorType],
    operand: impl Fn(usize) -> Option<kiln_ir::TensorType>,
) -> f64 {
    let numel = |t: &kiln_ir::TensorType| elements(&t.shape);
    let out: f64 = types.iter().map(numel).sum();
    let bytes: f64 = types
        .iter()
        .map(|t| numel(t) * t.dtype.bytes() as f64)
        .sum();
    let materialize = 2.0 * bytes * mk.byte_ns();
    match (op, kind) {
        (Op::Constant { .. }, OpKind::Constant) => {
            if out <= 1.0 {
                0.0
            } else {
                bytes * mk.byte_ns()
            }
        }
        (Op::DotGeneral { .. }, OpKind::DotGeneral) => {
            let k: f64 = match (op, operand(0)) {
                (
                    Op::DotGeneral {
                        lhs_contracting_dimensions,
                        ..
                    },
                    Some(lhs),
                ) => elements(
                    &lhs_contracting_dimensions
                        .iter()
                        .map(|&d| usize::try_from(d).ok().and_then(|d| lhs.shape.get(d)))
                        .map(|d| d.copied().unwrap_or(1))
                        .collect::<Vec<_>>(),
                ),
                _ => 1.0,
            };
            out * k * mk.fma_ns() + materialize
        }
        (_, OpKind::Convolution) => {
            let k = operand(1).map_or(1.0, |w| {
                numel(&w) / w.shape.first().copied().unwrap_or(1).max(1) as f64
            });
            // Bounded like a count, so that the product below stays finite.
            let k = k.min(i64::MAX as f64);
            out * k * mk.fma_ns() + materialize
        }
        (_, OpKind::Reduce) => {
            let input = operand(0).map_or(out, |t| numel(&t));
            input * mk.element_ns() + materialize
        }
        _ if kind.props().contains(Props::ELEMENTWISE)
            || kind.props().contains(Props::LAYOUT)
            || matches!(kind, OpKind::Iota) =>
        {
            out * weight(kind) * mk.element_ns()
        }
        _ => 4.0 * out * mk.element_ns() + materialize,
    }
}

impl CostFunction<Node> for CostModel<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, n: &Node, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        n.children
            .iter()
            .fold(self.node_cost(n), |acc, &c| acc + costs(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::Facts;
    use crate::{Options, add_func, extract, optimize};
    use kiln_ir::parse_func_text;

    /// 2^40: two such dimensions make 2^80 elements, past i64 and usize.
    const BIG: usize = 1 << 40;

    /// The e-graph of `src` (parsed, not verified) and the cost of every node in it.
    fn costs_of_unverified(src: &str) -> Vec<f64> {
        let f = parse_func_text(src).unwrap();
        assert!(
            kiln_ir::verify(&f).is_err(),
            "the test wants an invalid function"
        );
        let mut eg = EGraph::new(Facts::default());
        let roots = add_func(&mut eg, &f);
        eg.rebuild();
        let model = CostModel::new(&eg, Machine::REFERENCE);
        let mut costs: Vec<f64> = eg
            .classes()
            .flat_map(|c| c.nodes.iter().map(|n| model.node_cost(n)))
            .collect();
        costs.push(extract::extract(&eg, &roots, Machine::REFERENCE).cost);
        costs
    }

    #[test]
    fn costs_of_unverified_huge_shapes_do_not_overflow() {
        let deep = format!("{},0", vec![BIG.to_string(); 30].join(","));
        let src = format!(
            "func @main(%0: f32[{BIG},{BIG}], %1: f32[{BIG},{BIG}], %2: f32[{deep}]) -> f32[{BIG},{BIG}] {{
  %3 = add %0, %1 : f32[{BIG},{BIG}]
  %4 = exponential %3 : f32[{BIG},{BIG}]
  %5 = dot_general %4, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [7], rhs_contracting_dimensions = [0]}} : f32[{BIG},{BIG}]
  %6 = constant {{value = 0.0}} : f32[]
  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : f32[{BIG}]
  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : f32[{BIG},{BIG}]
  %9 = negate %2 : f32[{deep}]
  %10 = multiply %8, %5 : f32[{BIG},{BIG}]
  return %10
}}
"
        );
        for c in costs_of_unverified(&src) {
            assert!(c.is_finite() && c >= 0.0, "cost {c}");
        }
    }

    #[test]
    fn optimize_handles_huge_but_valid_shapes() {
        let (m, n) = (1usize << 30, 1usize << 20);
        let src = format!(
            "func @main(%0: f32[{m},{n}], %1: f32[{n},2]) -> (f32[{m},2], f32[{m}]) {{
  %2 = transpose %0 {{permutation = [1, 0]}} : f32[{n},{m}]
  %3 = transpose %2 {{permutation = [1, 0]}} : f32[{m},{n}]
  %4 = exponential %3 : f32[{m},{n}]
  %5 = constant {{value = 0.0}} : f32[]
  %6 = broadcast_in_dim %5 {{broadcast_dimensions = []}} : f32[{m},{n}]
  %7 = add %4, %6 : f32[{m},{n}]
  %8 = dot_general %7, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{m},2]
  %9 = reduce %7, %5 {{dimensions = [1], kind = add}} : f32[{m}]
  return %8, %9
}}
"
        );
        let f = parse_func_text(&src).unwrap();
        kiln_ir::verify(&f).unwrap();
        let opts = Options {
            machine: Machine::REFERENCE,
            ..Options::default()
        };
        let (g, report) = optimize(&f, &opts).unwrap();
        kiln_ir::verify(&g).unwrap();
        assert!(report.cost_before.is_finite(), "{report}");
        assert!(report.cost_after.is_finite(), "{report}");
        assert!(report.cost_after <= report.cost_before, "{report}");
    }

    #[test]
    fn optimize_rejects_types_whose_size_overflows() {
        let src = format!(
            "func @main(%0: f32[{BIG},{BIG}]) -> f32[{BIG},{BIG}] {{\n  %1 = negate %0 : f32[{BIG},{BIG}]\n  return %1\n}}\n"
        );
        let f = parse_func_text(&src).unwrap();
        let e = optimize(&f, &Options::default()).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
    }
}
