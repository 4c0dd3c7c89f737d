//! The cost model: estimated nanoseconds on this CPU.
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

/// The machine the costs are estimated for.
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

    /// This CPU: its vector width and thread count, with the reference clock and bandwidth.
    pub fn host() -> Machine {
        #[cfg(target_arch = "x86_64")]
        let lanes = if std::arch::is_x86_feature_detected!("avx512f") {
            16.0
        } else if std::arch::is_x86_feature_detected!("avx2") {
            8.0
        } else {
            4.0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = 4.0;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        Machine {
            lanes,
            threads,
            ..Machine::REFERENCE
        }
    }

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
        // Every op costs a little, so that of equal programs the smaller one wins and the
        // choice graph has no cycles.
        const NODE: f64 = 1e-3;
        let kind = match &n.head {
            Head::Param(..) | Head::Meta(_) => return 0.0,
            Head::Get(_) => return NODE,
            Head::Op(k) => *k,
        };
        let Some(m) = meta(self.eg, n.children[0]) else {
            return NODE;
        };
        let numel = |t: &kiln_ir::TensorType| t.shape.iter().product::<usize>() as f64;
        let out: f64 = m.types.iter().map(numel).sum();
        let bytes: f64 = m
            .types
            .iter()
            .map(|t| numel(t) * t.dtype.bytes() as f64)
            .sum();
        let mk = &self.machine;
        let materialize = 2.0 * bytes * mk.byte_ns();
        let operand = |i: usize| self.eg[n.operands()[i]].data.ty().cloned();
        NODE + match (&m.op, kind) {
            (Op::Constant { .. }, OpKind::Constant) => {
                if out <= 1.0 {
                    0.0
                } else {
                    bytes * mk.byte_ns()
                }
            }
            (Op::DotGeneral { .. }, OpKind::DotGeneral) => {
                let k: f64 = match (&m.op, operand(0)) {
                    (
                        Op::DotGeneral {
                            lhs_contracting_dimensions,
                            ..
                        },
                        Some(lhs),
                    ) => lhs_contracting_dimensions
                        .iter()
                        .map(|&d| lhs.shape[d as usize] as f64)
                        .product(),
                    _ => 1.0,
                };
                out * k * mk.fma_ns() + materialize
            }
            (_, OpKind::Convolution) => {
                let k = operand(1).map_or(1.0, |w| {
                    numel(&w) / w.shape.first().copied().unwrap_or(1).max(1) as f64
                });
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
