//! `kiln bench`: compile time and the median run time of a model.

use crate::error::Error;
use crate::{model, run};
use std::path::Path;
use std::time::Instant;

/// Compile and run times, in milliseconds.
pub struct Timing {
    /// One compile.
    pub compile_ms: f64,
    /// The median of the runs.
    pub median_ms: f64,
    /// How many runs.
    pub runs: usize,
}

/// `kiln bench MODEL [--input NAME=FILE]... [--runs N] [--seed S]`: inputs are random (from
/// `seed`) when none are given.
pub fn bench(
    model: &Path,
    inputs: &[(String, String)],
    runs: usize,
    seed: u64,
) -> Result<Timing, Error> {
    let m = model::load(model)?;
    let f = model::entry(&m)?;
    let args = if inputs.is_empty() {
        model::random_inputs(f, seed)
    } else {
        model::inputs(f, inputs)?
    };
    let t = Instant::now();
    let exe = run::compile(f)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        run::call(exe.as_ref(), &args)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(Timing {
        compile_ms,
        median_ms: times[times.len() / 2],
        runs: times.len(),
    })
}
