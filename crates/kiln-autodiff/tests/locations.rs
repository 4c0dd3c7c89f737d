//! The transforms keep source locations: what `vjp`, `value_and_grad`, `jvp` and `vmap` build
//! for an instruction carries that instruction's location (the user's line), or none where it
//! has none, and never a line of kiln's own code or of Rust's library, so an error a later
//! stage finds in a derivative names the user's operation and line. Checked on random
//! programs (control flow, region ops and calls included) with every instruction, at any
//! depth, located at the user's line, and with none located.

use kiln_autodiff::{jvp, value_and_grad, vjp, vmap};
use kiln_ir::random::{Config, Rng, random_func};
use kiln_ir::{Func, Loc};

/// Where the test's "user" wrote every instruction of a located function.
const USER: Loc = Loc {
    file: "model.rs",
    line: 7,
    column: 5,
};

/// The location of every instruction of `f` and of its regions, at any depth.
fn locations(f: &Func, into: &mut Vec<Option<Loc>>) {
    for inst in &f.insts {
        into.push(inst.loc);
        for r in inst.op.regions() {
            locations(r, into);
        }
    }
}

/// `f` with every instruction, at any depth, at `loc`.
fn located(f: &Func, loc: Option<Loc>) -> Func {
    fn walk(f: &mut Func, loc: Option<Loc>) {
        for inst in &mut f.insts {
            inst.loc = loc;
            for r in inst.op.regions_mut() {
                walk(r, loc);
            }
        }
    }
    let mut g = f.clone();
    walk(&mut g, loc);
    g
}

/// Checks one transform of `f`: with no location in `f`, none in what it gives; with every
/// instruction of `f` at [`USER`], only that. Returns whether the transform applied (an op
/// without a rule is an error, which is not what this test is about).
fn check(what: &str, seed: u64, f: &Func, transform: &dyn Fn(&Func) -> Option<Func>) -> bool {
    let f = &located(f, None);
    let Some(g) = transform(f) else {
        return false;
    };
    let mut locs = Vec::new();
    locations(&g, &mut locs);
    let foreign: Vec<Loc> = locs.iter().flatten().copied().collect();
    assert!(
        foreign.is_empty(),
        "{what} of random program {seed} (no locations) gave its own code's: {:?}\n{f}",
        &foreign[..foreign.len().min(4)]
    );
    let g = transform(&located(f, Some(USER)))
        .unwrap_or_else(|| panic!("{what} of {seed} located failed"));
    let mut locs = Vec::new();
    locations(&g, &mut locs);
    let foreign: Vec<Loc> = locs
        .iter()
        .flatten()
        .filter(|&&l| l != USER)
        .copied()
        .collect();
    assert!(
        foreign.is_empty(),
        "{what} of random program {seed} gave lines that are not the user's: {:?}\n{f}",
        &foreign[..foreign.len().min(4)]
    );
    assert!(
        locs.contains(&Some(USER)),
        "{what} of random program {seed} lost every location\n{f}"
    );
    true
}

fn float_params(f: &Func) -> Vec<usize> {
    (0..f.params.len())
        .filter(|&i| f.values[f.params[i].index()].dtype.is_float())
        .collect()
}

#[test]
fn derivatives_are_at_the_users_lines() {
    let (mut reverse, mut forward, mut scalar) = (0, 0, 0);
    for seed in 0..300 {
        let f = random_func(&mut Rng::new(seed), &Config::gradient_profile(seed));
        let wrt = float_params(&f);
        if wrt.is_empty() {
            continue;
        }
        reverse += check("vjp", seed, &f, &|f| vjp(f, &wrt).ok()) as usize;
        forward += check("jvp", seed, &f, &|f| jvp(f, &wrt).ok()) as usize;
        // A scalar loss of the first output, for `value_and_grad`.
        if f.output_types[0].rank() == 0 && f.output_types[0].dtype.is_float() {
            scalar += check("value_and_grad", seed, &f, &|f| {
                value_and_grad(f, &wrt, true).ok()
            }) as usize;
        }
    }
    // Most programs are differentiated (so that errors never hide the check).
    assert!(reverse > 200 && forward > 200, "{reverse} {forward}");
    assert!(scalar > 10, "{scalar}");
}

#[test]
fn batched_programs_are_at_the_users_lines() {
    let mut batched = 0;
    for seed in 0..300 {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed));
        let flags: Vec<bool> = (0..f.params.len()).map(|i| i % 2 == 0).collect();
        batched += check("vmap", seed, &f, &|f| vmap(f, &flags, 3).ok()) as usize;
    }
    assert!(batched > 200, "{batched}");
}
