//! kiln's graph optimizer: equality saturation over the IR's op set.
//!
//! A function becomes an e-graph ([`lang`]: one node kind per op, generated from the op
//! declaration; attributes and result types in meta leaves). The rules of the rule files
//! ([`rules`]: algebra, layout, reductions; each one line, tagged `exact` or `reassoc`) grow it
//! until it saturates or a limit is hit, constant folding runs as the e-graph's analysis
//! ([`analysis`]), and extraction picks the cheapest program under the cost model ([`cost`]),
//! each value paid for once ([`extract`]). A program longer than [`Options::region_insts`] is
//! optimized in regions of consecutive instructions, each under limits in proportion to its size,
//! and stitched back together ([`region`]), so the work grows linearly with the program.
//!
//! ```
//! use kiln_ir::parse_func_text;
//! let f = parse_func_text(
//!     "func @main(%0: f32[2,3]) -> f32[2,3] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[3,2]\n  %2 = transpose %1 {permutation = [1, 0]} : f32[2,3]\n  %3 = negate %2 : f32[2,3]\n  %4 = negate %3 : f32[2,3]\n  return %4\n}\n",
//! ).unwrap();
//! let (g, report) = kiln_opt::optimize(&f, &kiln_opt::Options::default()).unwrap();
//! assert!(g.insts.is_empty(), "{g}");
//! assert!(report.applied.iter().any(|(rule, _)| rule == "transpose-transpose"));
//! ```
#![warn(missing_docs)]

pub mod analysis;
pub mod cost;
pub mod extract;
pub mod lang;
pub mod region;
pub mod rules;
pub mod tree;

use analysis::{EGraph, Facts, meta};
use cost::{CostModel, Machine};
use egg::{Id, Rewrite, Runner, StopReason};
use kiln_ir::{Builder, Func, ValueId};
use lang::{Head, Meta, Node, is_tuple};
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;
use tree::TreeCosts;

/// What the optimizer may do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Also run `reassoc` rules (equal up to rounding), like `-ffast-math`.
    pub fast_math: bool,
    /// Stop growing a region's e-graph past this many nodes, for a region of `region_insts`
    /// instructions; a smaller one gets a proportional share, at least a quarter
    /// ([`Options::node_limit_for`]).
    pub node_limit: usize,
    /// Stop after this many rounds of rule application (per region).
    pub iter_limit: usize,
    /// Stop a region after this long (a safety net; the node and round limits stop first in
    /// practice, which keeps the output deterministic). A program's total is this times its
    /// number of regions.
    pub time_limit: Duration,
    /// The machine the cost model estimates for (by default [`Machine::REFERENCE`]; a backend
    /// passes its target's).
    pub machine: Machine,
    /// The most instructions saturated together: a longer program is cut into regions of at
    /// most this many consecutive instructions, each optimized alone ([`region`]).
    pub region_insts: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            fast_math: false,
            node_limit: 20_000,
            iter_limit: 12,
            time_limit: Duration::from_secs(5),
            machine: Machine::REFERENCE,
            region_insts: 2_000,
        }
    }
}

impl Options {
    /// The node limit of a region of `insts` instructions: `node_limit` for `region_insts`,
    /// in proportion for fewer, but no less than for a quarter of `region_insts`.
    pub fn node_limit_for(&self, insts: usize) -> usize {
        let full = self.region_insts.max(1);
        let n = insts.clamp(full.div_ceil(4), full);
        (self.node_limit as u128 * n as u128 / full as u128).max(1) as usize
    }
}

/// What one optimization did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Why saturation stopped: `saturated`, or the limit that was hit (with several regions:
    /// each reason and how many regions it stopped).
    pub stop: String,
    /// Regions optimized one by one (1 unless the program is longer than
    /// [`Options::region_insts`]).
    pub regions: usize,
    /// Rounds of rule application (the most any region took).
    pub iterations: usize,
    /// E-nodes and e-classes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Classes folded to constants.
    pub folded: usize,
    /// Successful applications per rule (rules that never fired are left out), by name.
    pub applied: Vec<(String, usize)>,
    /// Estimated cost of the input and of the output (nanoseconds, see [`cost`]).
    pub cost_before: f64,
    /// Estimated cost of the extracted program.
    pub cost_after: f64,
    /// Estimated cost of the program egg's tree extraction picks (each use of a value paid for
    /// again), counted like `cost_after`.
    pub tree_cost: f64,
    /// Classes of the extracted program whose node differs from the tree extraction's.
    pub dag_changed: usize,
    /// Rule applications dropped because they would change a type (must be zero).
    pub type_mismatches: usize,
    /// The work saturation and extraction did, counted in nodes rather than time: per region,
    /// the e-graph's nodes at the end times its rounds (each round searches every class) plus
    /// the classes extraction's improvement rounds visited; summed over the regions.
    pub work: usize,
    /// For each value of the result whose class held other programs: the op kept and the
    /// cheapest alternatives rejected, with their costs (one line each, in value order; left
    /// empty for programs of several regions).
    pub rejected: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.regions > 1 {
            writeln!(
                f,
                "stop: {} in {} regions, at most {} rounds; {} nodes in {} classes; {} folded",
                self.stop, self.regions, self.iterations, self.nodes, self.classes, self.folded
            )?;
        } else {
            writeln!(
                f,
                "stop: {} after {} rounds; {} nodes in {} classes; {} folded",
                self.stop, self.iterations, self.nodes, self.classes, self.folded
            )?;
        }
        writeln!(
            f,
            "cost: {:.1} ns -> {:.1} ns (estimated)",
            self.cost_before, self.cost_after
        )?;
        if self.dag_changed > 0 {
            writeln!(
                f,
                "extraction: {} class(es) changed from the tree choice ({:.1} ns) for shared work",
                self.dag_changed, self.tree_cost
            )?;
        }
        if self.applied.is_empty() {
            writeln!(f, "rules applied: none")?;
        } else {
            let list: Vec<String> = self
                .applied
                .iter()
                .map(|(r, n)| format!("{r} x{n}"))
                .collect();
            writeln!(f, "rules applied: {}", list.join(", "))?;
        }
        for r in &self.rejected {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Adds `f` to `eg`; returns the classes of its outputs.
pub fn add_func(eg: &mut EGraph, f: &Func) -> Vec<Id> {
    add_func_nodes(eg, f).0
}

/// [`add_func`], also returning each instruction's op node as added and its class.
fn add_func_nodes(eg: &mut EGraph, f: &Func) -> (Vec<Id>, Vec<(Id, Node)>) {
    let mut ops = Vec::with_capacity(f.insts.len());
    let mut val: Vec<Option<Id>> = vec![None; f.values.len()];
    for (i, &p) in f.params.iter().enumerate() {
        let ty = f.values[p.index()].clone();
        val[p.index()] = Some(eg.add(Node::leaf(Head::Param(i as u32, ty))));
    }
    for inst in &f.insts {
        let types = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let m = eg.add(Node::leaf(Head::Meta(Arc::new(Meta::new(
            inst.op.clone(),
            types,
        )))));
        let mut children = vec![m];
        children.extend(inst.operands.iter().map(|o| val[o.index()].expect("SSA")));
        let kind = inst.op.kind();
        let node = Node {
            head: Head::Op(kind),
            children,
        };
        let id = eg.add(node.clone());
        ops.push((id, node));
        if is_tuple(kind) {
            for (j, r) in inst.results.iter().enumerate() {
                val[r.index()] = Some(eg.add(Node {
                    head: Head::Get(j as u32),
                    children: vec![id],
                }));
            }
        } else {
            val[inst.results[0].index()] = Some(id);
        }
    }
    let roots = f
        .outputs
        .iter()
        .map(|o| val[o.index()].expect("SSA"))
        .collect();
    (roots, ops)
}

/// Per instruction added as `ops` (from [`add_func_nodes`]): its class in the grown e-graph
/// and the index of its own node there (rules merge classes, never drop nodes).
fn program_nodes(eg: &EGraph, ops: &[(Id, Node)]) -> Vec<(Id, usize)> {
    ops.iter()
        .filter_map(|(id, node)| {
            let c = eg.find(*id);
            let mut canonical = node.clone();
            canonical.children.iter_mut().for_each(|k| *k = eg.find(*k));
            let k = eg[c].nodes.iter().position(|n| *n == canonical)?;
            Some((c, k))
        })
        .collect()
}

/// Rebuilds a function from the e-graph, taking `choose(class)` as each class's node.
pub fn build_func(
    eg: &EGraph,
    f: &Func,
    roots: &[Id],
    choose: impl Fn(Id) -> Node,
) -> Result<Func, String> {
    build_func_with_values(eg, f, roots, choose).map(|(g, _)| g)
}

/// [`build_func`], also returning the values each class became.
fn build_func_with_values(
    eg: &EGraph,
    f: &Func,
    roots: &[Id],
    choose: impl Fn(Id) -> Node,
) -> Result<(Func, HashMap<Id, Vec<ValueId>>), String> {
    let mut b = Builder::new(&f.name);
    let params: Vec<ValueId> = f
        .params
        .iter()
        .map(|p| b.param(f.values[p.index()].clone()))
        .collect();
    let mut done: HashMap<Id, Vec<ValueId>> = HashMap::new();
    let mut stack: Vec<(Id, bool)> = roots.iter().rev().map(|&r| (eg.find(r), false)).collect();
    while let Some((c, expanded)) = stack.pop() {
        if done.contains_key(&c) {
            continue;
        }
        let n = choose(c);
        let deps: Vec<Id> = match n.head {
            Head::Op(_) => n.operands().iter().map(|&x| eg.find(x)).collect(),
            Head::Get(_) => vec![eg.find(n.children[0])],
            _ => vec![],
        };
        if !expanded {
            stack.push((c, true));
            for &d in deps.iter().rev() {
                if !done.contains_key(&d) {
                    stack.push((d, false));
                }
            }
            continue;
        }
        let vals = match &n.head {
            Head::Param(i, _) => vec![params[*i as usize]],
            Head::Meta(_) => return Err("a meta leaf used as a value".into()),
            Head::Get(i) => vec![done[&deps[0]][*i as usize]],
            Head::Op(kind) => {
                let m = meta(eg, n.children[0]).ok_or("an op without its meta")?;
                let op = m
                    .op_as(*kind)
                    .ok_or_else(|| format!("`{kind}` cannot take the attributes {:?}", m.op))?;
                let operands: Vec<ValueId> = deps.iter().map(|d| done[d][0]).collect();
                b.push_typed(op, &operands, &m.types)
                    .map_err(|e| e.to_string())?
            }
        };
        done.insert(c, vals);
    }
    let outs: Vec<ValueId> = roots.iter().map(|r| done[&eg.find(*r)][0]).collect();
    let g = b.finish(&outs).map_err(|e| e.to_string())?;
    Ok((g, done))
}

/// Why saturation stopped, in words.
fn stop_text(reason: &Option<StopReason>) -> String {
    match reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(StopReason::IterationLimit(n)) => format!("round limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
        Some(StopReason::TimeLimit(t)) => format!("time limit ({t:.1} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".to_string(),
    }
}

/// How many matches a rule may have in a round before egg's scheduler sets it aside for a few
/// rounds, for a program of `insts` instructions: egg's 1,000, or two per instruction if that
/// is more, so that a rule matching each step of a long region (an operand swap) is not set
/// aside and revisited over extra rounds, which made rounds grow with the region.
fn match_limit_for(insts: usize) -> usize {
    1_000usize.max(2 * insts)
}

/// The rewrites of the rules `fast_math` allows (read from the rule files once).
fn cached_rules(fast_math: bool) -> &'static [Rewrite<Node, Facts>] {
    static EXACT: std::sync::OnceLock<Vec<Rewrite<Node, Facts>>> = std::sync::OnceLock::new();
    static FAST: std::sync::OnceLock<Vec<Rewrite<Node, Facts>>> = std::sync::OnceLock::new();
    let cell = if fast_math { &FAST } else { &EXACT };
    cell.get_or_init(|| rules::rewrites(fast_math))
}

/// An e-graph grown from a program by the rules.
struct Grown {
    /// The runner, holding the e-graph and what each round did.
    runner: Runner<Node, Facts>,
    /// The classes of the program's outputs.
    roots: Vec<Id>,
    /// Each instruction's class and the index of its own node there.
    own: Vec<(Id, usize)>,
}

/// The e-graph of `f` grown by the rules `opts` allows, under the limits of a region of `f`'s
/// size.
fn saturate(f: &Func, opts: &Options) -> Grown {
    let mut eg = EGraph::new(Facts::default());
    let (roots, ops) = add_func_nodes(&mut eg, f);
    eg.rebuild();
    let runner = Runner::<Node, Facts>::default()
        .with_scheduler(
            egg::BackoffScheduler::default()
                .with_initial_match_limit(match_limit_for(f.insts.len())),
        )
        .with_egraph(eg)
        .with_node_limit(opts.node_limit_for(f.insts.len()))
        .with_iter_limit(opts.iter_limit)
        .with_time_limit(opts.time_limit)
        .run(cached_rules(opts.fast_math));
    let own = program_nodes(&runner.egraph, &ops);
    Grown { runner, roots, own }
}

thread_local! {
    static RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many times [`optimize`] has run on this thread (for tests that a cache skips it).
pub fn runs_on_this_thread() -> usize {
    RUNS.with(|r| r.get())
}

/// Optimizes `f`: saturates with the rules `opts` allows, then extracts the cheapest program;
/// a program longer than [`Options::region_insts`] region by region ([`region`]).
///
/// The result computes what `f` computes (bit for bit unless `fast_math`), verifies, and is the
/// same for the same input and options.
pub fn optimize(f: &Func, opts: &Options) -> Result<(Func, Report), String> {
    RUNS.with(|r| r.set(r.get() + 1));
    kiln_ir::verify(f).map_err(|e| e.to_string())?;
    let (out, report) = if f.insts.len() <= opts.region_insts {
        optimize_region(f, opts, true)?
    } else {
        let regions = region::split(f, opts.region_insts);
        let done = optimize_regions(&regions, opts)?;
        let (funcs, reports): (Vec<Func>, Vec<Report>) = done.into_iter().unzip();
        let out = region::stitch(f, &regions, &funcs);
        let mut report = merge_reports(&reports);
        report.cost_before = region::program_cost(f, opts.machine);
        report.cost_after = region::deduped_cost(&out, opts.machine);
        (out, report)
    };
    kiln_ir::verify(&out).map_err(|e| format!("the optimized program does not verify: {e}"))?;
    Ok((out, report))
}

/// Each region optimized (on as many threads as the machine runs, each taking the next region
/// in order; the results do not depend on which thread took which).
fn optimize_regions(
    regions: &[region::Region],
    opts: &Options,
) -> Result<Vec<(Func, Report)>, String> {
    let one = |k: usize| -> Result<(Func, Report), String> {
        let g = &regions[k].func;
        if g.outputs.is_empty() {
            // Nothing of it is used later.
            let mut empty = g.clone();
            empty.insts.clear();
            let report = Report {
                stop: "saturated".into(),
                ..Report::default()
            };
            return Ok((empty, report));
        }
        optimize_region(g, opts, false)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(regions.len());
    if threads <= 1 {
        return (0..regions.len()).map(one).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<Option<Result<(Func, Report), String>>> =
        (0..regions.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= regions.len() {
                            return mine;
                        }
                        mine.push((k, one(k)));
                    }
                })
            })
            .collect();
        for w in workers {
            match w.join() {
                Ok(mine) => mine.into_iter().for_each(|(k, r)| done[k] = Some(r)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    done.into_iter()
        .map(|r| r.expect("every region optimized"))
        .collect()
}

/// The report of a program optimized in regions: sums, the most rounds, and the reasons to
/// stop with how many regions each stopped (`saturated x3, node limit (5001) x1`); the costs
/// before and after are left to the caller.
fn merge_reports(reports: &[Report]) -> Report {
    let mut stops: Vec<(String, usize)> = Vec::new();
    let mut applied: HashMap<String, usize> = HashMap::new();
    let mut out = Report {
        regions: reports.len(),
        ..Report::default()
    };
    for r in reports {
        match stops.iter_mut().find(|s| s.0 == r.stop) {
            Some(s) => s.1 += 1,
            None => stops.push((r.stop.clone(), 1)),
        }
        for (rule, n) in &r.applied {
            *applied.entry(rule.clone()).or_default() += n;
        }
        out.iterations = out.iterations.max(r.iterations);
        out.nodes += r.nodes;
        out.classes += r.classes;
        out.folded += r.folded;
        out.tree_cost += r.tree_cost;
        out.dag_changed += r.dag_changed;
        out.type_mismatches += r.type_mismatches;
        out.work += r.work;
    }
    out.stop = stops
        .iter()
        .map(|(s, n)| format!("{s} x{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    out.applied = applied.into_iter().collect();
    out.applied.sort();
    out
}

/// Saturates and extracts `f`, a whole program (`whole`) or one region of one; for a whole
/// program the report has its cost before and the rejected alternatives. Does not verify the
/// result.
fn optimize_region(f: &Func, opts: &Options, whole: bool) -> Result<(Func, Report), String> {
    let cost_before = if !whole {
        0.0
    } else {
        let mut plain = EGraph::new(Facts {
            fold: false,
            ..Facts::default()
        });
        let roots = add_func(&mut plain, f);
        plain.rebuild();
        extract::program_cost(&plain, &roots, opts.machine)
    };
    let Grown { runner, roots, own } = saturate(f, opts);
    let eg = &runner.egraph;
    let mut applied: HashMap<String, usize> = HashMap::new();
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            *applied.entry(rule.to_string()).or_default() += n;
        }
    }
    let mut applied: Vec<(String, usize)> = applied.into_iter().filter(|(_, n)| *n > 0).collect();
    applied.sort();
    let model = CostModel::new(eg, opts.machine);
    let ex = TreeCosts::new(eg, &model);
    let chosen = extract::extract_with(eg, &roots, &model, &ex, &own);
    let (out, values) = build_func_with_values(eg, f, &roots, |c| chosen.node(eg, c).clone())?;
    let rejected = if whole {
        rejected_alternatives(eg, &ex, &chosen, &model, &values)
    } else {
        Vec::new()
    };
    let report = Report {
        stop: stop_text(&runner.stop_reason),
        regions: 1,
        iterations: runner.iterations.len(),
        nodes: eg.total_number_of_nodes(),
        classes: eg.number_of_classes(),
        folded: eg.analysis.folded,
        applied,
        cost_before,
        cost_after: chosen.cost,
        tree_cost: chosen.tree_cost,
        dag_changed: chosen.changed,
        type_mismatches: eg.analysis.type_mismatches,
        work: eg.total_number_of_nodes() * runner.iterations.len() + chosen.visits,
        rejected,
    };
    Ok((out, report))
}

/// One line per output value whose class had alternatives: what extraction kept and the (up to
/// three) cheapest rejected nodes, each with the cost of its cheapest program.
fn rejected_alternatives(
    eg: &EGraph,
    ex: &TreeCosts,
    chosen: &extract::Extraction,
    model: &CostModel,
    values: &HashMap<Id, Vec<ValueId>>,
) -> Vec<String> {
    // An operand is named by the value it became, or by its class when extraction left it out.
    let operand = |c: Id| -> String {
        let c = eg.find(c);
        values
            .get(&c)
            .map_or_else(|| format!("c{c}"), |v| v[0].to_string())
    };
    let label = |n: &Node| -> String {
        match &n.head {
            Head::Param(i, _) => format!("param {i}"),
            Head::Get(j) => format!("get {j}"),
            Head::Meta(_) => "meta".into(),
            Head::Op(k) => {
                let args: Vec<String> = n.operands().iter().map(|&c| operand(c)).collect();
                format!("{}({})", k.mnemonic(), args.join(", "))
            }
        }
    };
    let total = |n: &Node| -> f64 {
        model.node_cost(n)
            + n.children
                .iter()
                .map(|&c| ex.find_best_cost(c))
                .sum::<f64>()
    };
    let mut rows: Vec<(ValueId, String)> = Vec::new();
    for (&c, vals) in values {
        let best = chosen.node(eg, c);
        let mut others: Vec<(f64, String)> = eg[c]
            .nodes
            .iter()
            .filter(|n| *n != best && !matches!(n.head, Head::Meta(_)))
            .map(|n| (total(n), label(n)))
            .collect();
        if others.is_empty() {
            continue;
        }
        others.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        others.dedup_by(|a, b| a.1 == b.1);
        let list: Vec<String> = others
            .iter()
            .take(3)
            .map(|(cost, l)| format!("{l} ({cost:.3})"))
            .collect();
        rows.push((
            vals[0],
            format!(
                "{}: kept {} ({:.3}); rejected {}",
                vals[0],
                label(best),
                total(best),
                list.join(", ")
            ),
        ));
    }
    rows.sort_by_key(|r| r.0);
    rows.into_iter().map(|r| r.1).collect()
}

/// Applies the rule named `rule` alone at each of its matches in `f`, one match at a time and
/// without constant folding: the rewritten programs, one per match where the rule's conditions
/// hold. Errors name a rule whose replacement would change a type.
pub fn rewrite_once(f: &Func, rule: &str) -> Result<Vec<Func>, String> {
    let def = rules::all_rules()
        .into_iter()
        .find(|r| r.name == rule)
        .ok_or_else(|| format!("no rule named `{rule}`"))?;
    kiln_ir::verify(f).map_err(|e| e.to_string())?;
    let mut eg = EGraph::new(Facts {
        fold: false,
        ..Facts::default()
    });
    let roots = add_func(&mut eg, f);
    eg.rebuild();
    let matches = egg::Searcher::search(&def.searcher, &eg);
    let mut out = Vec::new();
    for m in matches {
        for subst in &m.substs {
            let id = match def.applier.instantiate(&mut eg, m.eclass, subst) {
                Ok(id) => id,
                Err(rules::Declined::NotApplicable) => continue,
                Err(rules::Declined::TypeMismatch(e)) => return Err(format!("{rule}: {e}")),
            };
            let from = eg.find(m.eclass);
            let g = build_func(&eg, f, &roots, |c| {
                let c = if c == from { eg.find(id) } else { c };
                eg[c].nodes[0].clone()
            })?;
            out.push(g);
        }
    }
    Ok(out)
}

/// The saturated e-graph of `f` as text: every class reachable from the outputs, with its
/// type, its nodes (`op(attrs) c1 c2`), the cost of each node's cheapest program, and `*` on the
/// node extraction picks. Deterministic: classes in the order a walk from the outputs meets
/// them, nodes in the e-graph's order.
///
/// A program longer than [`Options::region_insts`] prints each region's e-graph in turn, under
/// a line naming its instructions.
pub fn dump_egraph(f: &Func, opts: &Options) -> Result<String, String> {
    kiln_ir::verify(f).map_err(|e| e.to_string())?;
    if f.insts.len() <= opts.region_insts {
        return Ok(dump_region(f, opts));
    }
    let regions = region::split(f, opts.region_insts);
    let mut s = String::new();
    for (k, r) in regions.iter().enumerate() {
        let _ = writeln!(
            s,
            "// region {} of {}: instructions {}..{} of @{}",
            k + 1,
            regions.len(),
            r.range.start,
            r.range.end,
            f.name
        );
        s.push_str(&dump_region(&r.func, opts));
    }
    Ok(s)
}

/// [`dump_egraph`] of one region (or a whole program of one).
fn dump_region(f: &Func, opts: &Options) -> String {
    let Grown { runner, roots, own } = saturate(f, opts);
    let eg = &runner.egraph;
    let model = CostModel::new(eg, opts.machine);
    let ex = TreeCosts::new(eg, &model);
    let chosen = extract::extract_with(eg, &roots, &model, &ex, &own);
    let mut order: Vec<Id> = Vec::new();
    let mut seen: std::collections::HashSet<Id> = std::collections::HashSet::new();
    let mut stack: Vec<Id> = roots.iter().rev().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        order.push(c);
        for n in eg[c].nodes.iter().rev() {
            let kids: Vec<Id> = match n.head {
                Head::Op(_) => n.operands().to_vec(),
                Head::Get(_) => n.children.clone(),
                _ => vec![],
            };
            for k in kids.into_iter().rev() {
                stack.push(eg.find(k));
            }
        }
    }
    let name: HashMap<Id, usize> = order.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let mut s = String::new();
    for (i, &c) in order.iter().enumerate() {
        let ty = eg[c]
            .data
            .types
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(s, "c{i}: {ty}");
        let best = chosen.node(eg, c);
        for n in &eg[c].nodes {
            let label = match &n.head {
                Head::Param(p, _) => format!("param {p}"),
                Head::Meta(_) => continue,
                Head::Get(j) => format!("get {j}"),
                Head::Op(k) => {
                    let attrs = meta(eg, n.children[0])
                        .and_then(|m| m.op_as(*k))
                        .map(|op| {
                            let a: Vec<String> = op
                                .attrs()
                                .iter()
                                .map(|(n, a)| format!("{n} = {a}"))
                                .collect();
                            if a.is_empty() {
                                String::new()
                            } else {
                                format!(" {{{}}}", a.join(", "))
                            }
                        })
                        .unwrap_or_default();
                    format!("{k}{attrs}")
                }
            };
            let kids: Vec<String> = match n.head {
                Head::Op(_) => n.operands().to_vec(),
                Head::Get(_) => n.children.clone(),
                _ => vec![],
            }
            .iter()
            .map(|k| format!("c{}", name.get(&eg.find(*k)).copied().unwrap_or(usize::MAX)))
            .collect();
            let total: f64 = model.node_cost(n)
                + n.children
                    .iter()
                    .map(|&k| ex.find_best_cost(k))
                    .sum::<f64>();
            let _ = writeln!(
                s,
                "  {} {label} {}  (cost {total:.3})",
                if n == best { "*" } else { " " },
                kids.join(" ")
            );
        }
    }
    let _ = writeln!(
        s,
        "// {} classes shown of {}; {} nodes; stop: {} after {} rounds",
        order.len(),
        eg.number_of_classes(),
        eg.total_number_of_nodes(),
        stop_text(&runner.stop_reason),
        runner.iterations.len()
    );
    s
}

/// The optimized program and report as text (for dumps and snapshots).
pub fn explain(f: &Func, opts: &Options) -> Result<String, String> {
    let (g, report) = optimize(f, opts)?;
    let mut s = String::new();
    let _ = write!(s, "{g}\n// {}", report.to_string().replace('\n', "\n// "));
    Ok(s.trim_end_matches("// ").to_string())
}
