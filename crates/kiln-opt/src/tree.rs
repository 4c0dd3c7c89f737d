//! The cheapest *tree* below each class: what `egg::Extractor` computes, in time about linear
//! in the e-graph.
//!
//! egg's extractor repeats passes over every class (in the e-graph's class order), each class
//! taking its node of least cost (its own cost plus its children's, the first such node in the
//! class's order) when that is strictly cheaper than what it has, until a pass changes nothing.
//! On a long chain whose classes the map orders against the chain's direction, each pass moves
//! the costs one step further: the passes are as many as the chain is long, and the work
//! quadratic (a 1,000-step chain's gradient spent seconds there). [`TreeCosts`] runs the same
//! passes in the same order but visits only the classes a child's update concerns: a class
//! later in the order than the child in the same pass, an earlier one in the next. A class none
//! of whose children changed would compute what it has already, so skipping it changes nothing:
//! the costs and the nodes chosen (ties included) are egg's.

use crate::analysis::EGraph;
use crate::cost::CostModel;
use crate::lang::Node;
use egg::Id;
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// Each class's position in `ids`, indexed by class id (`usize::MAX` for ids not in it).
pub(crate) fn positions(ids: &[Id]) -> Vec<usize> {
    let len = ids.iter().map(|&c| usize::from(c) + 1).max().unwrap_or(0);
    let mut pos = vec![usize::MAX; len];
    for (i, &c) in ids.iter().enumerate() {
        pos[usize::from(c)] = i;
    }
    pos
}

/// Each class's cheapest tree: its cost and the node at its root.
pub struct TreeCosts<'a> {
    eg: &'a EGraph,
    /// Class id -> position in the e-graph's class order.
    pos: Vec<usize>,
    /// Per position: (cost, node index), once the class has a finite tree.
    best: Vec<Option<(f64, usize)>>,
    ids: Vec<Id>,
}

/// egg's order of optional costs: none is dearest.
fn cmp(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

impl<'a> TreeCosts<'a> {
    /// The cheapest tree of every class of `eg` under `model`.
    pub fn new(eg: &'a EGraph, model: &CostModel) -> TreeCosts<'a> {
        let ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        let pos = positions(&ids);
        // Per position: each node's own cost and its children's positions.
        let mut own: Vec<Vec<f64>> = Vec::with_capacity(ids.len());
        let mut kids: Vec<Vec<Vec<usize>>> = Vec::with_capacity(ids.len());
        let mut parents: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
        for (p, &c) in ids.iter().enumerate() {
            let nodes = &eg[c].nodes;
            own.push(nodes.iter().map(|n| model.node_cost(n)).collect());
            let ks: Vec<Vec<usize>> = nodes
                .iter()
                .map(|n| {
                    n.children
                        .iter()
                        .map(|&k| pos[usize::from(eg.find(k))])
                        .collect()
                })
                .collect();
            for &k in ks.iter().flatten() {
                if parents[k].last() != Some(&p) {
                    parents[k].push(p);
                }
            }
            kids.push(ks);
        }
        for ps in &mut parents {
            ps.sort_unstable();
            ps.dedup();
        }
        let mut best: Vec<Option<(f64, usize)>> = vec![None; ids.len()];
        // This pass's classes still to visit, and the next pass's.
        let mut now: BTreeSet<usize> = (0..ids.len()).collect();
        let mut next: BTreeSet<usize> = BTreeSet::new();
        loop {
            while let Some(p) = now.pop_first() {
                // egg's `make_pass`: the first node of least total cost.
                let mut pick: Option<(Option<f64>, usize)> = None;
                for (j, ks) in kids[p].iter().enumerate() {
                    let total = ks
                        .iter()
                        .try_fold(own[p][j], |acc, &k| best[k].map(|(c, _)| acc + c));
                    if pick.is_none_or(|(b, _)| cmp(total, b) == Ordering::Less) {
                        pick = Some((total, j));
                    }
                }
                let Some((Some(cost), j)) = pick else {
                    continue;
                };
                let better = match best[p] {
                    None => true,
                    Some((old, _)) => cost < old,
                };
                if better {
                    best[p] = Some((cost, j));
                    for &q in &parents[p] {
                        if q > p {
                            now.insert(q);
                        } else {
                            next.insert(q);
                        }
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            std::mem::swap(&mut now, &mut next);
        }
        TreeCosts { eg, pos, best, ids }
    }

    fn at(&self, c: Id) -> (f64, usize) {
        let p = self.pos[usize::from(self.eg.find(c))];
        self.best[p].unwrap_or_else(|| panic!("class {} has no finite tree", self.ids[p]))
    }

    /// The cheapest tree's root node in class `c`.
    pub fn find_best_node(&self, c: Id) -> &'a Node {
        let c = self.eg.find(c);
        &self.eg[c].nodes[self.at(c).1]
    }

    /// The index of [`TreeCosts::find_best_node`] among class `c`'s nodes.
    pub fn find_best_index(&self, c: Id) -> usize {
        self.at(c).1
    }

    /// The cheapest tree's cost in class `c`.
    pub fn find_best_cost(&self, c: Id) -> f64 {
        self.at(c).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::Facts;
    use crate::cost::Machine;
    use crate::{Options, add_func, saturate};
    use egg::Extractor;
    use kiln_ir::parse_func_text;

    /// Costs and chosen nodes equal egg's on saturated e-graphs of a few programs.
    #[test]
    fn agrees_with_egg() {
        let srcs = [
            "func @a(%0: f32[64], %1: f32[64]) -> f32[64] {\n  %2 = multiply %0, %1 : f32[64]\n  %3 = multiply %1, %0 : f32[64]\n  %4 = add %2, %3 : f32[64]\n  %5 = negate %4 : f32[64]\n  %6 = negate %5 : f32[64]\n  return %6\n}\n",
            "func @b(%0: f32[8,16]) -> f32[16,8] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[16,8]\n  %2 = transpose %1 {permutation = [1, 0]} : f32[8,16]\n  %3 = exponential %2 : f32[8,16]\n  %4 = multiply %3, %3 : f32[8,16]\n  %5 = transpose %4 {permutation = [1, 0]} : f32[16,8]\n  return %5\n}\n",
        ];
        for src in srcs {
            let f = parse_func_text(src).unwrap();
            let runner = saturate(&f, &Options::default()).runner;
            let eg = &runner.egraph;
            let model = CostModel::new(eg, Machine::REFERENCE);
            let ours = TreeCosts::new(eg, &model);
            let egg = Extractor::new(eg, CostModel::new(eg, Machine::REFERENCE));
            for c in eg.classes() {
                assert_eq!(ours.find_best_cost(c.id), egg.find_best_cost(c.id), "{src}");
                assert_eq!(ours.find_best_node(c.id), egg.find_best_node(c.id), "{src}");
            }
            let mut plain = EGraph::new(Facts::default());
            add_func(&mut plain, &f);
            plain.rebuild();
            let model = CostModel::new(&plain, Machine::REFERENCE);
            let ours = TreeCosts::new(&plain, &model);
            let egg = Extractor::new(&plain, CostModel::new(&plain, Machine::REFERENCE));
            for c in plain.classes() {
                assert_eq!(ours.find_best_node(c.id), egg.find_best_node(c.id));
            }
        }
    }

    /// The same on the saturated e-graphs of 200 random programs.
    #[test]
    fn agrees_with_egg_on_random_programs() {
        use kiln_ir::random::{Config, Rng, random_func};
        for seed in 0..200u64 {
            let cfg = Config {
                ops: 1 + (seed as usize % 30),
                ..Config::default()
            };
            let f = random_func(&mut Rng::new(seed), &cfg);
            let runner = saturate(&f, &Options::default()).runner;
            let eg = &runner.egraph;
            let model = CostModel::new(eg, Machine::REFERENCE);
            let ours = TreeCosts::new(eg, &model);
            let egg = Extractor::new(eg, CostModel::new(eg, Machine::REFERENCE));
            for c in eg.classes() {
                assert_eq!(
                    ours.find_best_cost(c.id),
                    egg.find_best_cost(c.id),
                    "seed {seed}"
                );
                assert_eq!(
                    ours.find_best_node(c.id),
                    egg.find_best_node(c.id),
                    "seed {seed}"
                );
            }
        }
    }
}
