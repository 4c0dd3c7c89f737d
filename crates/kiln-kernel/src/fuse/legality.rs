//! Legality: the fused program can run (no kernel reads a value computed only inside others,
//! and the kernels form a DAG).

use super::{Fused, step_reads};
use kiln_ir::Func;

/// Checks that the fused program can run: no kernel reads a value computed only inside other
/// kernels, and the kernels, with an edge from each kernel to every kernel that reads its
/// result, form a DAG (a topological order exists), so no fused group depends on itself.
pub fn check_legal(f: &Func, fused: &Fused) -> Result<(), String> {
    use petgraph::graph::{DiGraph, NodeIndex};
    let n = f.insts.len();
    let mut producer = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    let mut g: DiGraph<usize, ()> = DiGraph::with_capacity(n, n);
    let nodes: Vec<NodeIndex> = (0..n).map(|i| g.add_node(i)).collect();
    for u in (0..n).filter(|&u| !fused.inlined[u]) {
        for v in step_reads(f, fused, u) {
            let Some(p) = producer[v.index()] else {
                continue;
            };
            if fused.inlined[p] {
                return Err(format!(
                    "#{u} reads {v}, which #{p} computes only inside other kernels"
                ));
            }
            // A merged instruction's value is written by the kernel it merged into, which
            // runs at that kernel's place in the program.
            let w = fused.merged_into[p].unwrap_or(p);
            if w != p && w > u {
                return Err(format!(
                    "#{u} reads {v} before #{w}'s kernel writes it (merged from #{p})"
                ));
            }
            g.add_edge(nodes[w], nodes[u], ());
        }
    }
    petgraph::algo::toposort(&g, None)
        .map(|_| ())
        .map_err(|c| format!("the fused kernels form a cycle through #{}", g[c.node_id()]))
}
