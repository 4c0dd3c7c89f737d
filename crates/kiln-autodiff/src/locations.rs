//! Where the instructions a transform builds come from. What a rule builds for an
//! instruction (its derivative, its batched form) carries that instruction's location: the
//! user's line, or none where it has none. No instruction a transform returns names a line of
//! kiln's own code (the `#[track_caller]` builder helpers the rules use record those), so an
//! error a later stage finds in it names the user's operation and line.

use kiln_ir::{Builder, Func, Loc, relocate_inst};
use std::collections::HashSet;

/// The locations of a user's function: its instructions' and its regions', at any depth.
pub(crate) struct UserLines(HashSet<Loc>);

impl UserLines {
    pub fn of(f: &Func) -> UserLines {
        fn walk(f: &Func, into: &mut HashSet<Loc>) {
            for inst in &f.insts {
                into.extend(inst.loc);
                for r in inst.op.regions() {
                    walk(r, into);
                }
            }
        }
        let mut set = HashSet::new();
        walk(f, &mut set);
        UserLines(set)
    }

    fn has(&self, l: &Loc) -> bool {
        self.0.contains(l)
    }

    /// Gives what `b` holds from its `first`-th instruction on the location `loc` wherever it
    /// has none of the user's (see [`Builder::relocate_from`]).
    pub fn locate_from(&self, b: &mut Builder, first: usize, loc: Option<Loc>) {
        b.relocate_from(first, loc, &|l| self.has(l));
    }

    /// `g` (a transform of the user's function) with every location that is not one of the
    /// user's removed.
    pub fn keep_only(&self, mut g: Func) -> Func {
        for inst in &mut g.insts {
            relocate_inst(inst, None, &|l| self.has(l));
        }
        g
    }
}
