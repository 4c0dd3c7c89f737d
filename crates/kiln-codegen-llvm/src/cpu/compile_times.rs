//! `KILN_COMPILE_TIMES=1`: how long each phase of a compile took, on stderr.
//!
//! A function prints one line per phase (`kiln compile @main: fuse: 0.4 ms`). Eager ops are
//! compiled as one-op functions named `eager_<op>` (see `kiln_trace::trace`), a few hundred in
//! a small program, so they print no lines of their own: their phases are tallied, and a
//! summary of all eager compiles so far is printed after the 1st, 10th, 100th, ... and once
//! more at exit (`kiln compile: eager ops: 12 compiles (multiply x5, add x4, tanh x3), 130.2 ms
//! (optimize and canonicalize the graph 40.1 ms, ...)`).

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The name prefix of the one-op functions eager ops compile.
const EAGER_PREFIX: &str = "eager_";

/// The most op kinds a summary names (the rest are `...`).
const SUMMARY_KINDS: usize = 8;

/// Whether compiling the function `name` prints a line per phase (else it is an eager op,
/// tallied into the eager summary).
pub(super) fn prints_phases(name: &str) -> bool {
    !name.starts_with(EAGER_PREFIX)
}

/// Eager compiles so far: how many, by op kind and by phase.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct EagerTally {
    /// The number of eager compiles.
    pub compiles: usize,
    /// Per op kind, in the order first seen: its mnemonic, compiles and total time.
    pub ops: Vec<(String, usize, Duration)>,
    /// Per phase, in the order first seen: its name and total time.
    pub phases: Vec<(String, Duration)>,
}

impl EagerTally {
    const fn new() -> EagerTally {
        EagerTally {
            compiles: 0,
            ops: Vec::new(),
            phases: Vec::new(),
        }
    }

    /// Counts one compile of `op` whose phases took `laps`. A phase's name is taken up to its
    /// details in parentheses (`emit LLVM IR (120 instructions, ...)`), so they add up.
    pub fn add(&mut self, op: &str, laps: &[(String, Duration)]) {
        self.compiles += 1;
        let total: Duration = laps.iter().map(|l| l.1).sum();
        match self.ops.iter_mut().find(|o| o.0 == op) {
            Some(o) => {
                o.1 += 1;
                o.2 += total;
            }
            None => self.ops.push((op.to_string(), 1, total)),
        }
        for (phase, t) in laps {
            let phase = phase.split(" (").next().unwrap_or(phase);
            match self.phases.iter_mut().find(|p| p.0 == phase) {
                Some(p) => p.1 += *t,
                None => self.phases.push((phase.to_string(), *t)),
            }
        }
    }
}

fn ms(t: Duration) -> String {
    format!("{:.1} ms", t.as_secs_f64() * 1e3)
}

/// The summary line of `t`: the compiles, the op kinds most compiled first (ties by name, at
/// most [`SUMMARY_KINDS`]), the total time and the time of each phase.
pub(super) fn summary(t: &EagerTally) -> String {
    let mut ops: Vec<&(String, usize, Duration)> = t.ops.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut kinds: Vec<String> = ops
        .iter()
        .take(SUMMARY_KINDS)
        .map(|(op, n, _)| format!("{op} x{n}"))
        .collect();
    if ops.len() > SUMMARY_KINDS {
        kinds.push("...".to_string());
    }
    let total: Duration = t.ops.iter().map(|o| o.2).sum();
    let phases: Vec<String> = t
        .phases
        .iter()
        .map(|(p, d)| format!("{p} {}", ms(*d)))
        .collect();
    format!(
        "kiln compile: eager ops: {} compile{} ({}), {} ({})",
        t.compiles,
        if t.compiles == 1 { "" } else { "s" },
        kinds.join(", "),
        ms(total),
        phases.join(", ")
    )
}

/// Whether the summary is printed after the `n`th eager compile: 1, 10, 100, ...
pub(super) fn due(n: usize) -> bool {
    let mut p = 1;
    while p < n {
        p = p.saturating_mul(10);
    }
    p == n
}

/// The eager compiles of this process, and how many the last printed summary counted.
static EAGER: Mutex<(EagerTally, usize)> = Mutex::new((EagerTally::new(), 0));

fn print_summary(t: &EagerTally) {
    // Not `eprintln!`: this also runs at exit, where a panic could not unwind.
    let _ = writeln!(std::io::stderr(), "{}", summary(t));
}

/// Prints the summary at exit if compiles came after the last one printed.
extern "C" fn summary_at_exit() {
    // Another thread may still hold the lock while the process exits: then say nothing.
    if let Ok(g) = EAGER.try_lock()
        && g.0.compiles > g.1
    {
        print_summary(&g.0);
    }
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// `struct timespec` of 64-bit Linux.
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

/// Linux's `CLOCK_THREAD_CPUTIME_ID`.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// The CPU time the calling thread has used so far: the module lines of `KILN_COMPILE_TIMES`
/// report it beside the wall time, which on a busy machine counts the time other processes
/// ran on the core as well.
pub(super) fn thread_cpu() -> Duration {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid `struct timespec` for the call to fill.
    if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.sec.max(0) as u64, ts.nsec.clamp(0, 999_999_999) as u32)
}

/// Tallies an eager compile of `op`, printing the summary when it is due.
fn record_eager(op: &str, laps: &[(String, Duration)]) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function that only locks without waiting and writes to stderr.
    AT_EXIT.call_once(|| unsafe {
        atexit(summary_at_exit);
    });
    let mut g = EAGER.lock().unwrap_or_else(|e| e.into_inner());
    g.0.add(op, laps);
    if due(g.0.compiles) {
        g.1 = g.0.compiles;
        print_summary(&g.0);
    }
}

/// With `KILN_COMPILE_TIMES=1`, times the phases of one compile: prints each as it ends, or
/// for an eager op tallies them when the compile ends (see the module docs).
pub(super) struct PhaseClock {
    /// The function's name, when timing is on.
    name: Option<String>,
    laps: Vec<(String, Duration)>,
    last: Instant,
}

impl PhaseClock {
    pub fn new(name: &str, on: bool) -> PhaseClock {
        PhaseClock {
            name: on.then(|| name.to_string()),
            laps: Vec::new(),
            last: Instant::now(),
        }
    }

    /// Ends the phase `phase`, which began at the previous lap (or the clock's start).
    pub fn lap(&mut self, phase: &str) {
        let Some(name) = &self.name else {
            return;
        };
        let now = Instant::now();
        let took = now - self.last;
        self.last = now;
        if prints_phases(name) {
            eprintln!("kiln compile @{name}: {phase}: {}", ms(took));
        } else {
            self.laps.push((phase.to_string(), took));
        }
    }
}

impl Drop for PhaseClock {
    fn drop(&mut self) {
        if let Some(name) = &self.name
            && let Some(op) = name.strip_prefix(EAGER_PREFIX)
        {
            record_eager(op, &self.laps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn laps(ms: &[(&str, u64)]) -> Vec<(String, Duration)> {
        ms.iter()
            .map(|&(p, t)| (p.to_string(), Duration::from_millis(t)))
            .collect()
    }

    #[test]
    fn eager_ops_are_tallied_and_functions_print_their_phases() {
        assert!(!prints_phases("eager_multiply"));
        assert!(!prints_phases("eager_dot_general"));
        assert!(prints_phases("main"));
        assert!(prints_phases("train_step"));
        assert!(prints_phases("not_eager_add"));
    }

    #[test]
    fn the_summary_counts_ops_and_phases() {
        let mut t = EagerTally::default();
        t.add(
            "add",
            &laps(&[("fuse", 1), ("emit LLVM IR (10 instructions, 0 costly)", 4)]),
        );
        assert_eq!(
            summary(&t),
            "kiln compile: eager ops: 1 compile (add x1), 5.0 ms (fuse 1.0 ms, emit LLVM IR 4.0 ms)"
        );
        for op in ["multiply", "multiply", "tanh", "add", "multiply"] {
            t.add(
                op,
                &laps(&[
                    ("fuse", 2),
                    ("emit LLVM IR (12 instructions)", 3),
                    ("LLVM O2", 5),
                ]),
            );
        }
        assert_eq!(
            summary(&t),
            "kiln compile: eager ops: 6 compiles (multiply x3, add x2, tanh x1), 55.0 ms \
             (fuse 11.0 ms, emit LLVM IR 19.0 ms, LLVM O2 25.0 ms)"
        );
    }

    #[test]
    fn the_summary_names_at_most_eight_kinds() {
        let mut t = EagerTally::default();
        for (i, op) in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
            .iter()
            .enumerate()
        {
            for _ in 0..=i {
                t.add(op, &laps(&[("fuse", 1)]));
            }
        }
        let s = summary(&t);
        assert!(
            s.starts_with(
                "kiln compile: eager ops: 55 compiles (j x10, i x9, h x8, g x7, f x6, e x5, d x4, c x3, ...), 55.0 ms"
            ),
            "{s}"
        );
    }

    #[test]
    fn summaries_are_due_at_powers_of_ten() {
        let due_at: Vec<usize> = (0..=1000).filter(|&n| due(n)).collect();
        assert_eq!(due_at, [1, 10, 100, 1000]);
    }

    #[test]
    fn the_thread_cpu_clock_counts_work_and_not_sleep() {
        let t0 = thread_cpu();
        std::thread::sleep(Duration::from_millis(60));
        let slept = thread_cpu() - t0;
        let t1 = thread_cpu();
        let mut x = 1u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let worked = thread_cpu() - t1;
        assert!(slept < Duration::from_millis(20), "asleep: {slept:?}");
        assert!(worked > Duration::from_millis(5), "busy: {worked:?}");
        assert!(worked > slept, "busy {worked:?}, asleep {slept:?}");
    }
}
