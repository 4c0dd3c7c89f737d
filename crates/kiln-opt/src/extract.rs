//! Extraction: the cheapest program in the e-graph, each value paid for once.
//!
//! egg's extractor picks, bottom up, each class's node with the cheapest *tree* below it: a
//! value used twice is paid twice, so a node that shares work with the rest of the program
//! looks dearer than it is (`x * x` with `x = exp(a)` costs two exps as a tree, one as the
//! program runs). [`extract`] starts from that choice and improves it under the program's
//! cost as a DAG, every class it reaches counted once: for each class the program uses, in
//! the order a walk from the outputs meets them, each other node is tried and kept when the
//! whole program gets cheaper. Choices that would make a class depend on itself are skipped.
//! Rounds repeat until none improves or a work budget runs out. The result is never dearer
//! than the tree choice, and is the same for the same e-graph.

use crate::analysis::EGraph;
use crate::cost::{CostModel, Machine};
use crate::lang::{Head, Node};
use crate::tree::TreeCosts;
use egg::Id;
use std::collections::HashMap;

/// Node visits the improvement rounds may spend (each try walks the whole program).
const BUDGET: usize = 4_000_000;
/// Improvement rounds at most.
const ROUNDS: usize = 4;

/// The chosen program: a node per class.
pub struct Extraction {
    choice: HashMap<Id, usize>,
    /// The program's cost (nanoseconds, see [`crate::cost`]), every class counted once.
    pub cost: f64,
    /// The cost of egg's tree choice, counted the same way.
    pub tree_cost: f64,
    /// Classes whose node differs from the tree choice.
    pub changed: usize,
}

impl Extraction {
    /// The node chosen for class `c` (canonical).
    pub fn node<'a>(&self, eg: &'a EGraph, c: Id) -> &'a Node {
        let c = eg.find(c);
        &eg[c].nodes[self.choice[&c]]
    }
}

/// The classes a node's value depends on (operands, or a tuple's class).
fn deps(n: &Node) -> &[Id] {
    match n.head {
        Head::Op(_) => n.operands(),
        Head::Get(_) => &n.children,
        _ => &[],
    }
}

/// The e-graph's classes numbered densely, with each node's cost and dependencies by number,
/// so that a walk of the program costs no hashing.
struct Dense {
    /// Class id -> number.
    num: HashMap<Id, usize>,
    /// Per class and node: the node's own cost.
    costs: Vec<Vec<f64>>,
    /// Per class and node: the numbers of the classes it depends on.
    deps: Vec<Vec<Vec<usize>>>,
}

/// Walk marks: a class is on the walk's stack while its mark is `2 * walk + 1`, done at
/// `2 * walk + 2`; older marks mean unvisited (no clearing between walks).
struct Marks {
    mark: Vec<u64>,
    walk: u64,
}

/// The cost of the program `choice` picks from `roots`, and its classes in the order a walk
/// from the roots meets them; `None` when a class depends on itself.
fn dag_cost(
    d: &Dense,
    roots: &[usize],
    choice: &[usize],
    marks: &mut Marks,
    visits: &mut usize,
) -> Option<(f64, Vec<usize>)> {
    marks.walk += 1;
    let (open, done) = (2 * marks.walk + 1, 2 * marks.walk + 2);
    let mark = &mut marks.mark;
    let mut order = Vec::new();
    let mut total = 0.0;
    let mut stack: Vec<(usize, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
    while let Some((c, expanded)) = stack.pop() {
        *visits += 1;
        if expanded {
            mark[c] = done;
            continue;
        }
        if mark[c] == done {
            continue;
        }
        if mark[c] == open {
            return None;
        }
        mark[c] = open;
        order.push(c);
        let k = choice[c];
        total += d.costs[c][k];
        stack.push((c, true));
        for &x in d.deps[c][k].iter().rev() {
            if mark[x] == done {
                continue;
            }
            if mark[x] == open {
                return None;
            }
            stack.push((x, false));
        }
    }
    Some((total, order))
}

/// The cheapest program for `roots` in `eg` on `machine` (see the module documentation).
pub fn extract(eg: &EGraph, roots: &[Id], machine: Machine) -> Extraction {
    let model = CostModel::new(eg, machine);
    let tree = TreeCosts::new(eg, &model);
    let ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    let num: HashMap<Id, usize> = ids.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let mut d = Dense {
        costs: Vec::with_capacity(ids.len()),
        deps: Vec::with_capacity(ids.len()),
        num,
    };
    let mut choice: Vec<usize> = Vec::with_capacity(ids.len());
    for &c in &ids {
        let nodes = &eg[c].nodes;
        choice.push(tree.find_best_index(c));
        d.costs
            .push(nodes.iter().map(|n| model.node_cost(n)).collect());
        let deps = nodes
            .iter()
            .map(|n| deps(n).iter().map(|&x| d.num[&eg.find(x)]).collect())
            .collect();
        d.deps.push(deps);
    }
    let roots: Vec<usize> = roots.iter().map(|&r| d.num[&eg.find(r)]).collect();
    let mut marks = Marks {
        mark: vec![0; ids.len()],
        walk: 0,
    };
    let tree_choice = choice.clone();
    let mut visits = 0usize;
    let (tree_cost, mut order) =
        dag_cost(&d, &roots, &choice, &mut marks, &mut visits).expect("egg's choice is acyclic");
    let mut best = tree_cost;
    'rounds: for _ in 0..ROUNDS {
        let mut improved = false;
        for c in order.clone() {
            let nodes = &eg[ids[c]].nodes;
            if nodes.len() < 2 {
                continue;
            }
            for (alt, node) in nodes.iter().enumerate() {
                let current = choice[c];
                if alt == current || matches!(node.head, Head::Meta(_)) {
                    continue;
                }
                if visits > BUDGET {
                    break 'rounds;
                }
                choice[c] = alt;
                match dag_cost(&d, &roots, &choice, &mut marks, &mut visits) {
                    Some((cost, o)) if cost < best - 1e-6 => {
                        best = cost;
                        order = o;
                        improved = true;
                    }
                    _ => {
                        choice[c] = current;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    let changed = order
        .iter()
        .filter(|&&c| choice[c] != tree_choice[c])
        .count();
    Extraction {
        choice: ids.iter().zip(choice).map(|(&c, k)| (c, k)).collect(),
        cost: best,
        tree_cost,
        changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::add_func;
    use crate::analysis::Facts;
    use kiln_ir::{OpKind, parse_func_text};

    /// One class holding `sine(a)` and `exp(a) * exp(a)`: as trees the product costs two exps
    /// (30 adds a element) against the sine's 25; as the program runs it costs one exp (15).
    fn shared_exp() -> (EGraph, Id) {
        let mut eg = EGraph::new(Facts {
            fold: false,
            ..Facts::default()
        });
        let sine = parse_func_text(
            "func @s(%0: f32[4096]) -> f32[4096] {\n  %1 = sine %0 : f32[4096]\n  return %1\n}\n",
        )
        .unwrap();
        let product = parse_func_text(
            "func @p(%0: f32[4096]) -> f32[4096] {\n  %1 = exponential %0 : f32[4096]\n  %2 = multiply %1, %1 : f32[4096]\n  return %2\n}\n",
        )
        .unwrap();
        let a = add_func(&mut eg, &sine)[0];
        let b = add_func(&mut eg, &product)[0];
        eg.union(a, b);
        eg.rebuild();
        (eg, a)
    }

    #[test]
    fn shared_work_is_paid_for_once() {
        let (eg, root) = shared_exp();
        let tree = egg::Extractor::new(&eg, CostModel::new(&eg, Machine::REFERENCE));
        assert_eq!(tree.find_best_node(root).head, Head::Op(OpKind::Sine));
        let x = extract(&eg, &[root], Machine::REFERENCE);
        assert_eq!(x.node(&eg, root).head, Head::Op(OpKind::Multiply));
        assert!(x.cost < x.tree_cost, "{} < {}", x.cost, x.tree_cost);
        assert_eq!(x.changed, 1);
        // Multiply (1) and one exp (15) per element, against the sine's 25.
        let per = |w: f64| 4096.0 * w / (8.0 * 2.5 * 2.0);
        assert!((x.cost - per(16.0)).abs() < 0.01, "{}", x.cost);
        assert!((x.tree_cost - per(25.0)).abs() < 0.01, "{}", x.tree_cost);
    }

    #[test]
    fn extraction_is_deterministic_and_never_dearer_than_the_tree() {
        let (eg, root) = shared_exp();
        let a = extract(&eg, &[root], Machine::REFERENCE);
        for _ in 0..5 {
            let b = extract(&eg, &[root], Machine::REFERENCE);
            assert_eq!(a.cost, b.cost);
            assert_eq!(a.node(&eg, root), b.node(&eg, root));
        }
        assert!(a.cost <= a.tree_cost);
    }
}
