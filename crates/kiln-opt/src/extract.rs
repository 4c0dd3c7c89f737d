//! Extraction: the cheapest program in the e-graph, each value paid for once.
//!
//! egg's extractor picks, bottom up, each class's node with the cheapest *tree* below it: a
//! value used twice is paid twice, so a node that shares work with the rest of the program
//! looks dearer than it is (`x * x` with `x = exp(a)` costs two exps as a tree, one as the
//! program runs). [`extract`] starts from that choice and improves it under the program's
//! cost as a DAG, every class it reaches counted once: for each class the program uses, in
//! the order a walk from the outputs meets them, each other node is tried and kept when the
//! whole program gets cheaper. Choices that would make a class depend on itself are skipped.
//! A try is told from the classes the change brings in and those it leaves unused (use counts
//! per class), not a walk of the whole program, unless the new node reaches a class that might
//! use the one changed; a walk confirms each gain. Rounds repeat until none improves or a work
//! budget runs out. The result is never dearer than the tree choice, and is the same for the
//! same e-graph.

use crate::analysis::EGraph;
use crate::cost::{CostModel, Machine};
use crate::lang::{Head, Node};
use crate::tree::TreeCosts;
use egg::Id;

/// Node visits the improvement rounds may spend (each try walks the whole program).
const BUDGET: usize = 4_000_000;
/// Improvement rounds at most.
const ROUNDS: usize = 4;

/// The chosen program: a node per class.
pub struct Extraction {
    /// Per class number (see `num`): the index of its node.
    choice: Vec<usize>,
    /// Class id -> number.
    num: Vec<usize>,
    /// The program's cost (nanoseconds, see [`crate::cost`]), every class counted once.
    pub cost: f64,
    /// The cost of egg's tree choice, counted the same way.
    pub tree_cost: f64,
    /// Classes whose node differs from the tree choice.
    pub changed: usize,
    /// Classes visited by the walks and tries of the improvement rounds.
    pub visits: usize,
}

impl Extraction {
    /// The node chosen for class `c` (canonical).
    pub fn node<'a>(&self, eg: &'a EGraph, c: Id) -> &'a Node {
        let c = eg.find(c);
        &eg[c].nodes[self.choice[self.num[usize::from(c)]]]
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

/// Whether two nodes depend on the same set of classes.
fn same_classes(a: &[usize], b: &[usize]) -> bool {
    a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// The program a choice picks, kept for trying one change without walking all of it.
struct State {
    /// Per class: how many times the program's nodes and the roots use it (0: not in it).
    refs: Vec<u32>,
    /// Per class in the program: its number in a walk that numbers a class after all it uses.
    post: Vec<usize>,
    /// Marks of [`try_change`]'s walks, as in [`Marks`].
    mark: Vec<u64>,
    /// The number of the last try.
    trial: u64,
}

impl State {
    /// The state of the program `choice` picks from `roots`, whose classes are `order`
    /// (`mark`: a buffer to reuse).
    fn of(
        d: &Dense,
        roots: &[usize],
        choice: &[usize],
        order: &[usize],
        mut mark: Vec<u64>,
    ) -> State {
        let n = d.costs.len();
        let mut refs = vec![0u32; n];
        for &r in roots {
            refs[r] += 1;
        }
        for &c in order {
            for &x in &d.deps[c][choice[c]] {
                refs[x] += 1;
            }
        }
        let mut post = vec![usize::MAX; n];
        let mut next = 0;
        let mut stack: Vec<(usize, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((c, expanded)) = stack.pop() {
            if expanded {
                if post[c] == usize::MAX {
                    post[c] = next;
                    next += 1;
                }
                continue;
            }
            if post[c] != usize::MAX {
                continue;
            }
            stack.push((c, true));
            for &x in d.deps[c][choice[c]].iter().rev() {
                if post[x] == usize::MAX {
                    stack.push((x, false));
                }
            }
        }
        mark.iter_mut().for_each(|m| *m = 0);
        State {
            refs,
            post,
            mark,
            trial: 0,
        }
    }
}

/// What choosing another node for a class does to the program.
enum Trial {
    /// The program's cost changes by this much.
    Delta(f64),
    /// A class would depend on itself.
    Cycle,
    /// Only a walk can tell: the change reaches a class of the program that might use `c`.
    Unknown,
}

/// The effect of choosing node `alt` for class `c` of the program: the cost of the classes the
/// new node brings in (walking only classes not in the program yet) less those no longer used
/// (dropping uses from the old node down), and the two nodes' own costs. A class the walk
/// reaches that is in the program and numbered before `c` (`post`) cannot use `c`; one
/// numbered after might, and makes the answer [`Trial::Unknown`]. `state` is left as it was.
fn try_change(
    d: &Dense,
    state: &mut State,
    choice: &[usize],
    c: usize,
    alt: usize,
    visits: &mut usize,
) -> Trial {
    if state.refs[c] == 0 {
        // An earlier change this round dropped `c`: the program does not change.
        return Trial::Delta(0.0);
    }
    state.trial += 1;
    let (open, done) = (2 * state.trial + 1, 2 * state.trial + 2);
    let State {
        refs, post, mark, ..
    } = state;
    let mut log: Vec<(usize, u32)> = Vec::new();
    let mut delta = d.costs[c][alt] - d.costs[c][choice[c]];
    let mut verdict = None;
    let mut stack: Vec<(usize, bool)> = d.deps[c][alt].iter().rev().map(|&x| (x, false)).collect();
    while let Some((x, expanded)) = stack.pop() {
        *visits += 1;
        if expanded {
            mark[x] = done;
            continue;
        }
        if x == c || mark[x] == open {
            verdict = Some(Trial::Cycle);
            break;
        }
        let was = refs[x];
        log.push((x, was));
        refs[x] += 1;
        if mark[x] == done {
            continue;
        }
        if was > 0 {
            if post[x] > post[c] {
                verdict = Some(Trial::Unknown);
                break;
            }
            continue;
        }
        mark[x] = open;
        delta += d.costs[x][choice[x]];
        stack.push((x, true));
        stack.extend(d.deps[x][choice[x]].iter().rev().map(|&y| (y, false)));
    }
    if verdict.is_none() {
        let mut stack: Vec<usize> = d.deps[c][choice[c]].clone();
        while let Some(x) = stack.pop() {
            *visits += 1;
            log.push((x, refs[x]));
            refs[x] -= 1;
            if refs[x] == 0 {
                delta -= d.costs[x][choice[x]];
                stack.extend(&d.deps[x][choice[x]]);
            }
        }
    }
    for (x, r) in log.into_iter().rev() {
        refs[x] = r;
    }
    verdict.unwrap_or(Trial::Delta(delta))
}

/// The e-graph's classes numbered densely, with each node's cost and dependencies by number,
/// so that a walk of the program costs no hashing.
struct Dense {
    /// Class id -> number.
    num: Vec<usize>,
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
    extract_with(eg, roots, &model, &tree, &[])
}

/// The cost of the program in an e-graph where each class holds one node (a program added
/// without rules or folding), every class reached from `roots` counted once: what
/// [`extract`] reports as its cost there, summed in the same order, without its passes.
pub fn program_cost(eg: &EGraph, roots: &[Id], machine: Machine) -> f64 {
    let model = CostModel::new(eg, machine);
    let mut seen: std::collections::HashSet<Id> = std::collections::HashSet::new();
    let mut total = 0.0;
    let mut stack: Vec<Id> = roots.iter().rev().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        let [n] = &eg[c].nodes[..] else {
            panic!("class {c} holds {} nodes", eg[c].nodes.len());
        };
        total += model.node_cost(n);
        for &x in deps(n).iter().rev() {
            let x = eg.find(x);
            if !seen.contains(&x) {
                stack.push(x);
            }
        }
    }
    total
}

/// The classes of `eg` in its order, numbered densely, the tree choice by number, and the
/// roots' numbers.
fn dense(
    eg: &EGraph,
    roots: &[Id],
    model: &CostModel,
    tree: &TreeCosts,
) -> (Vec<Id>, Dense, Vec<usize>, Vec<usize>) {
    let ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    let num = crate::tree::positions(&ids);
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
            .map(|n| {
                deps(n)
                    .iter()
                    .map(|&x| d.num[usize::from(eg.find(x))])
                    .collect()
            })
            .collect();
        d.deps.push(deps);
    }
    let roots: Vec<usize> = roots
        .iter()
        .map(|&r| d.num[usize::from(eg.find(r))])
        .collect();
    (ids, d, choice, roots)
}

/// [`extract`] with the cost model and tree costs already computed; `own` names, per class,
/// the node of the program the e-graph was grown from (class, node index), kept wherever no
/// other is cheaper: where rules only added forms of equal cost (operands in another order),
/// the program stays as written, and equal steps of it stay equal.
pub fn extract_with(
    eg: &EGraph,
    roots: &[Id],
    model: &CostModel,
    tree: &TreeCosts,
    own: &[(Id, usize)],
) -> Extraction {
    let (ids, d, mut choice, roots) = dense(eg, roots, model, tree);
    let mut marks = Marks {
        mark: vec![0; ids.len()],
        walk: 0,
    };
    let tree_choice = choice.clone();
    let mut visits = 0usize;
    let (tree_cost, mut order) =
        dag_cost(&d, &roots, &choice, &mut marks, &mut visits).expect("egg's choice is acyclic");
    let mut best = tree_cost;
    let mut state = State::of(&d, &roots, &choice, &order, vec![0; ids.len()]);
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
                // Most tries are told from the classes the change adds and drops; a walk of
                // the whole program only confirms a gain, or decides when the change reaches
                // a class that might depend on `c`.
                match try_change(&d, &mut state, &choice, c, alt, &mut visits) {
                    Trial::Cycle => continue,
                    Trial::Delta(delta) if delta >= -1e-6 => continue,
                    _ => {}
                }
                choice[c] = alt;
                match dag_cost(&d, &roots, &choice, &mut marks, &mut visits) {
                    Some((cost, o)) if cost < best - 1e-6 => {
                        best = cost;
                        order = o;
                        improved = true;
                        state = State::of(&d, &roots, &choice, &order, state.mark);
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
    for &(id, k) in own {
        let c = d.num[usize::from(eg.find(id))];
        if choice[c] == k || state.refs[c] == 0 {
            continue;
        }
        if let Trial::Delta(delta) = try_change(&d, &mut state, &choice, c, k, &mut visits)
            && delta <= 0.0
        {
            let current = choice[c];
            choice[c] = k;
            if same_classes(&d.deps[c][k], &d.deps[c][current]) {
                best += delta;
            } else {
                match dag_cost(&d, &roots, &choice, &mut marks, &mut visits) {
                    Some((cost, o)) if cost <= best => {
                        best = cost;
                        order = o;
                        state = State::of(&d, &roots, &choice, &order, state.mark);
                    }
                    _ => choice[c] = current,
                }
            }
        }
    }
    Extraction {
        choice,
        num: d.num,
        cost: best,
        tree_cost,
        changed,
        visits,
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

    /// A try's verdict agrees with a walk of the whole changed program, for every other node
    /// of every class of the tree choice's program, on the saturated e-graphs of random
    /// programs (the cost to within rounding, cycles exactly).
    #[test]
    fn tries_agree_with_walks() {
        use kiln_ir::random::{Config, Rng, random_func};
        let (mut told, mut unknown) = (0, 0);
        for seed in 0..150u64 {
            let cfg = Config {
                ops: 1 + (seed as usize % 30),
                ..Config::default()
            };
            let f = random_func(&mut Rng::new(seed), &cfg);
            let crate::Grown { runner, roots, .. } =
                crate::saturate(&f, &crate::Options::default());
            let eg = &runner.egraph;
            let model = CostModel::new(eg, Machine::REFERENCE);
            let tree = TreeCosts::new(eg, &model);
            let (ids, d, mut choice, roots) = dense(eg, &roots, &model, &tree);
            let mut marks = Marks {
                mark: vec![0; ids.len()],
                walk: 0,
            };
            let mut visits = 0;
            let (best, order) = dag_cost(&d, &roots, &choice, &mut marks, &mut visits).unwrap();
            let mut state = State::of(&d, &roots, &choice, &order, vec![0; ids.len()]);
            for &c in &order {
                for alt in 0..d.costs[c].len() {
                    let current = choice[c];
                    if alt == current || matches!(eg[ids[c]].nodes[alt].head, Head::Meta(_)) {
                        continue;
                    }
                    let trial = try_change(&d, &mut state, &choice, c, alt, &mut visits);
                    choice[c] = alt;
                    let walk = dag_cost(&d, &roots, &choice, &mut marks, &mut visits);
                    choice[c] = current;
                    match (trial, walk) {
                        (Trial::Cycle, None) => told += 1,
                        (Trial::Delta(delta), Some((cost, _))) => {
                            assert!(
                                (best + delta - cost).abs() <= 1e-9 * cost.abs().max(1.0),
                                "seed {seed}: {best} + {delta} against {cost}"
                            );
                            told += 1;
                        }
                        (Trial::Unknown, _) => unknown += 1,
                        (Trial::Cycle, Some(_)) => panic!("seed {seed}: a cycle the walk lacks"),
                        (Trial::Delta(_), None) => panic!("seed {seed}: a cycle missed"),
                    }
                }
            }
        }
        assert!(told > 10 * unknown, "{told} told, {unknown} left to walks");
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
