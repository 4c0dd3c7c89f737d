//! Folds ([`Expr::Fold`]: a `reduce_region` with an elementwise body) rendered as the kernel
//! layer scheduled them: in vector lanes along a row ([`KernelSchedule::row_folds`]), in a
//! column strip ([`KernelSchedule::strips`]), or in order. Every result of a fold is computed
//! at once; ahead of the loops it does not depend on they are kept in [`Emitter::hoisted`], so
//! the kernel's outputs that write the others read them there.

use super::*;
use crate::kernel::{Fold, ValueKey};
use kiln_kernel::fold::fold_key;

/// A fold's results in a strip: per result, its key, the array of the positions'
/// accumulators, and their type.
pub(super) type StripFold<'c> = Vec<(ValueKey, PointerValue<'c>, BasicTypeEnum<'c>)>;

impl<'c> Emitter<'c> {
    /// Every result of the fold `e` (an [`Expr::Fold`]) at the current position.
    pub(super) fn fold_results(&self, e: &Expr) -> Result<Vec<BasicValueEnum<'c>>> {
        let Expr::Fold { fold, .. } = e else {
            return Ok(vec![self.expr(e)?]);
        };
        let lanes = self
            .schedule
            .as_ref()
            .and_then(|s| {
                let key = fold_key(e);
                s.row_folds.iter().find(|r| r.fold == key)
            })
            .map_or(1, |r| r.lanes);
        let inits = self.all(&fold.inits)?;
        match fold.vars[..] {
            [(v, n)] if lanes > 1 && n >= 2 * lanes && !fold.in_order => {
                self.fold_lanes(fold, &inits, v, n, lanes)
            }
            _ => self.fold_in_order(fold, &inits),
        }
    }

    /// Computes the fold `e` here (every result), for the expressions emitted next to reuse
    /// (see [`Self::hoist`]): the kernel's outputs that write its other results read them
    /// there. Only where the expressions are dominated by this code (not under a guard).
    pub(super) fn hoist_fold(&self, e: &Expr) -> Result<()> {
        let Expr::Fold { fold, .. } = e else {
            return self.hoist_one(e);
        };
        let results = self.fold_results(e)?;
        let mut hoisted = self.hoisted.borrow_mut();
        for (j, &r) in results.iter().enumerate() {
            let key = value_key(&Expr::Fold {
                fold: fold.clone(),
                result: j,
            });
            hoisted.push((key, Hoisted::Value(r)));
        }
        Ok(())
    }

    /// The values of `xs`, in order.
    fn all(&self, xs: &[Expr]) -> Result<Vec<BasicValueEnum<'c>>> {
        xs.iter().map(|x| self.expr(x)).collect()
    }

    /// The fold's body applied to accumulators `accs` and elements `elems`.
    fn apply(
        &self,
        fold: &Fold,
        accs: &[BasicValueEnum<'c>],
        elems: &[BasicValueEnum<'c>],
    ) -> Result<Vec<BasicValueEnum<'c>>> {
        let args: Vec<BasicValueEnum<'c>> = accs.iter().chain(elems).copied().collect();
        let saved = self.args.replace(args);
        let out = self.all(&fold.body);
        self.args.replace(saved);
        out
    }

    /// One stack slot per accumulator, holding `values`.
    fn slots(&self, values: &[BasicValueEnum<'c>]) -> Result<Vec<PointerValue<'c>>> {
        values
            .iter()
            .map(|v| {
                let p = self.entry_alloca(v.get_type())?;
                self.b.build_store(p, *v).map_err(llvm)?;
                Ok(p)
            })
            .collect()
    }

    /// The values in `slots` (of the types of `like`).
    fn read(
        &self,
        slots: &[PointerValue<'c>],
        like: &[BasicValueEnum<'c>],
    ) -> Result<Vec<BasicValueEnum<'c>>> {
        slots
            .iter()
            .zip(like)
            .map(|(p, v)| self.b.build_load(v.get_type(), *p, "acc").map_err(llvm))
            .collect()
    }

    /// Stores `values` into `slots`.
    fn write(&self, slots: &[PointerValue<'c>], values: &[BasicValueEnum<'c>]) -> Result<()> {
        for (p, v) in slots.iter().zip(values) {
            self.b.build_store(*p, *v).map_err(llvm)?;
        }
        Ok(())
    }

    /// The accumulators in `slots` updated with the elements at the current position.
    fn step(
        &self,
        fold: &Fold,
        slots: &[PointerValue<'c>],
        like: &[BasicValueEnum<'c>],
    ) -> Result<()> {
        let elems = self.all(&fold.elems)?;
        let accs = self.read(slots, like)?;
        let next = self.apply(fold, &accs, &elems)?;
        self.write(slots, &next)
    }

    /// The fold in order: the inits, then the elements in row-major order of its loops.
    fn fold_in_order(
        &self,
        fold: &Fold,
        inits: &[BasicValueEnum<'c>],
    ) -> Result<Vec<BasicValueEnum<'c>>> {
        let slots = self.slots(inits)?;
        self.nest(&fold.vars, &mut |em: &Self| em.step(fold, &slots, inits))?;
        self.read(&slots, inits)
    }

    /// The fold over its one loop `v` (of `n >= 2 * lanes` positions) in `lanes` sets of
    /// accumulators: set `l` starts at element `l` and takes every `lanes`-th element after it;
    /// the positions past the last whole round go to set 0; the sets are then combined with
    /// the body, halving, and the inits with what is left. Each accumulator's sets are one
    /// stack array, and each round of the loop an inner loop of `lanes` iterations over them,
    /// which LLVM's loop vectorizer turns into vectors (straight-line lanes left to the SLP
    /// vectorizer became pairs).
    fn fold_lanes(
        &self,
        fold: &Fold,
        inits: &[BasicValueEnum<'c>],
        v: usize,
        n: usize,
        lanes: usize,
    ) -> Result<Vec<BasicValueEnum<'c>>> {
        let i64t = self.ctx.i64_type();
        let arrays = self.lane_arrays(inits, lanes)?;
        let zero = self.i64c(0);
        self.lanes_loop(v, zero, &arrays, inits, &|em, slots| {
            let elems = em.all(&fold.elems)?;
            em.write(slots, &elems)
        })?;
        let whole = (n / lanes * lanes) as i64;
        let slot = self.entry_alloca(i64t.into())?;
        let range = (self.i64c(lanes as i64), self.i64c(whole));
        self.labeled_loop("fold", slot, range, lanes as i64, &mut |em: &Self| {
            let i0 =
                em.b.build_load(i64t, slot, "i0")
                    .map_err(llvm)?
                    .into_int_value();
            em.lanes_loop(v, i0, &arrays, inits, &|em, slots| {
                em.step(fold, slots, inits)
            })
        })?;
        let first = self.lane_set(&arrays, inits, zero)?;
        let rest = (self.i64c(whole), self.i64c(n as i64));
        self.range_loop(v, rest.0, rest.1, 1, &mut |em: &Self| {
            em.step(fold, &first, inits)
        })?;
        let sets = (0..lanes)
            .map(|l| self.lane_set(&arrays, inits, self.i64c(l as i64)))
            .collect::<Result<Vec<_>>>()?;
        let mut live = lanes;
        while live > 1 {
            let half = live.div_ceil(2);
            for l in 0..live - half {
                let a = self.read(&sets[l], inits)?;
                let b = self.read(&sets[l + half], inits)?;
                let c = self.apply(fold, &a, &b)?;
                self.write(&sets[l], &c)?;
            }
            live = half;
        }
        let total = self.read(&sets[0], inits)?;
        self.apply(fold, inits, &total)
    }

    /// One stack array per accumulator (of the types of `like`), of `lanes` sets.
    fn lane_arrays(
        &self,
        like: &[BasicValueEnum<'c>],
        lanes: usize,
    ) -> Result<Vec<(PointerValue<'c>, usize)>> {
        like.iter()
            .map(|x| Ok((self.line_buffer(x.get_type(), lanes)?, lanes)))
            .collect()
    }

    /// Set `lane`'s accumulators: pointers into the arrays.
    fn lane_set(
        &self,
        arrays: &[(PointerValue<'c>, usize)],
        like: &[BasicValueEnum<'c>],
        lane: IntValue<'c>,
    ) -> Result<Vec<PointerValue<'c>>> {
        (arrays.iter().zip(like))
            .map(|((a, _), x)| {
                // SAFETY (of the emitted code): `lane` is below the arrays' length.
                unsafe { self.b.build_in_bounds_gep(x.get_type(), *a, &[lane], "set") }
                    .map_err(llvm)
            })
            .collect()
    }

    /// A loop over the sets of `arrays` (a constant trip count, which LLVM's loop vectorizer
    /// turns into vectors) with loop variable `v` at `base` plus the set's number, running
    /// `body` on each set.
    fn lanes_loop(
        &self,
        v: usize,
        base: IntValue<'c>,
        arrays: &[(PointerValue<'c>, usize)],
        like: &[BasicValueEnum<'c>],
        body: &dyn Fn(&Self, &[PointerValue<'c>]) -> Result<()>,
    ) -> Result<()> {
        let i64t = self.ctx.i64_type();
        let lanes = arrays.first().map_or(0, |a| a.1);
        let lane = self.entry_alloca(i64t.into())?;
        let range = (self.i64c(0), self.i64c(lanes as i64));
        self.labeled_loop("lane", lane, range, 1, &mut |em: &Self| {
            let l =
                em.b.build_load(i64t, lane, "l")
                    .map_err(llvm)?
                    .into_int_value();
            let i = em.b.build_int_nsw_add(base, l, "i").map_err(llvm)?;
            em.b.build_store(em.vars[v], i).map_err(llvm)?;
            body(em, &em.lane_set(arrays, like, l)?)
        })
    }

    /// The fold `e` at each of `width` positions of a column strip (innermost output variable
    /// `d` from `j0`), in order along its loops, with the accumulators of the positions side
    /// by side in arrays (each step a loop over the positions, which vectorizes): per result,
    /// its key and its array, for the strip's loop over the positions to read in place (a
    /// gathered fold's, [`kiln_kernel::loop_schedule::Strips::gathered`]) or to copy out.
    ///
    /// A gathered fold's arrays are only ever addressed by a loop's position, never one
    /// constant address per position: LLVM's capture tracking gives up on an alloca of more than 100 uses (a
    /// strip of 64 positions read one by one has more), and an array it takes for captured
    /// may alias the operand the step gathers from, a check the vectorizer cannot form for a
    /// gather (`loop not vectorized: cannot identify array bounds`), so the step stayed
    /// scalar.
    pub(super) fn fold_strip(
        &self,
        e: &Expr,
        width: usize,
        (d, j0): (usize, IntValue<'c>),
    ) -> Result<StripFold<'c>> {
        let Expr::Fold { fold, .. } = e else {
            return Ok(Vec::new());
        };
        // The inits read no loop variable (`column_strips` checks).
        let inits = self.all(&fold.inits)?;
        let arrays = self.lane_arrays(&inits, width)?;
        self.lanes_loop(d, j0, &arrays, &inits, &|em, slots| em.write(slots, &inits))?;
        // An element in a window's padding reads the inits (a guard's other side): those
        // computed here, so that the loop over the positions holds no load but its elements'
        // (and vectorizes with masked gathers).
        let mark = self.hoisted.borrow().len();
        self.hoisted.borrow_mut().extend(
            (fold.inits.iter().zip(&inits)).map(|(x, &v)| (value_key(x), Hoisted::Value(v))),
        );
        let stepped = self.nest(&fold.vars, &mut |em: &Self| {
            em.lanes_loop(d, j0, &arrays, &inits, &|em, slots| {
                em.step(fold, slots, &inits)
            })
        });
        self.hoisted.borrow_mut().truncate(mark);
        stepped?;
        Ok((arrays.iter().zip(&inits).enumerate())
            .map(|(j, ((array, _), init))| {
                let key = value_key(&Expr::Fold {
                    fold: fold.clone(),
                    result: j,
                });
                (key, *array, init.get_type())
            })
            .collect())
    }

    /// Argument `slot` of the fold body being emitted.
    pub(super) fn fold_arg(&self, slot: usize) -> Result<BasicValueEnum<'c>> {
        self.args
            .borrow()
            .get(slot)
            .copied()
            .ok_or_else(|| Error::Llvm(format!("fold argument a{slot} outside a fold's body")))
    }
}
