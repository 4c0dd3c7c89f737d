//! The compile cache compiles each signature once: callers that ask for it while the first
//! compile runs wait for that compile (and share its error, which a later call may retry),
//! while different signatures compile side by side.
//!
//! `set_backend` is process-wide, so these tests live in a binary of their own and share one
//! counting backend, each test with functions of its own names.

use kiln_ir::{Func, Literal};
use kiln_trace::backend::{Backend, Executable, compile_cached, set_backend};
use kiln_trace::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long each compile of the counting backend takes.
const COMPILE_TIME: Duration = Duration::from_millis(300);

/// A backend whose compile sleeps, counts its calls per function name, tracks how many run at
/// once, and fails the first compile of a function named `fail_once_*` (panics in the first of
/// `panic_once_*`).
#[derive(Default)]
struct Counting {
    calls: Mutex<HashMap<String, usize>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

struct Nothing;

impl Executable for Nothing {
    fn run(&self, _: &[&Literal]) -> Result<Vec<Literal>> {
        Ok(Vec::new())
    }
}

impl Backend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(f.name.clone()).or_default();
            *n += 1;
            *n
        };
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(COMPILE_TIME);
        self.running.fetch_sub(1, Ordering::SeqCst);
        if f.name.starts_with("panic_once") && n == 1 {
            panic!("the first compile panics");
        }
        if f.name.starts_with("fail_once") && n == 1 {
            return Err(Error::internal("compile", "the first compile fails"));
        }
        Ok(Arc::new(Nothing))
    }
}

fn backend() -> &'static Arc<Counting> {
    static B: OnceLock<Arc<Counting>> = OnceLock::new();
    B.get_or_init(|| {
        let b = Arc::new(Counting::default());
        set_backend(b.clone());
        b
    })
}

fn compiles(name: &str) -> usize {
    backend()
        .calls
        .lock()
        .unwrap()
        .get(name)
        .copied()
        .unwrap_or(0)
}

fn func(name: &str) -> Func {
    kiln_ir::parse_func_text(&format!(
        "func @{name}(%0: f32[4]) -> f32[4] {{\n  %1 = add %0, %0 : f32[4]\n  return %1\n}}\n"
    ))
    .unwrap()
}

/// Calls `compile_cached(f)` from `threads` threads released at once.
fn from_threads(f: &Func, threads: usize) -> Vec<Result<Arc<dyn Executable>>> {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    compile_cached(f)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn concurrent_first_calls_compile_once() {
    backend();
    let f = func("single_flight");
    let results = from_threads(&f, 8);
    assert_eq!(
        compiles("single_flight"),
        1,
        "eight first callers, one compile"
    );
    let exes: Vec<Arc<dyn Executable>> = results.into_iter().map(|r| r.unwrap()).collect();
    assert!(
        exes.iter().all(|e| Arc::ptr_eq(e, &exes[0])),
        "every caller gets the one executable"
    );
    // Later calls hit the cache.
    compile_cached(&f).unwrap();
    assert_eq!(compiles("single_flight"), 1);
}

#[test]
fn a_failed_compile_reaches_every_waiter_and_is_retried_later() {
    backend();
    let f = func("fail_once_shared");
    let results = from_threads(&f, 8);
    assert_eq!(compiles("fail_once_shared"), 1, "one compile, failing");
    for r in &results {
        let e = r.as_ref().err().expect("every waiter gets the error");
        assert!(e.message.contains("the first compile fails"), "{e}");
    }
    // The failure is not cached: the next call compiles again (and now succeeds).
    compile_cached(&f).unwrap();
    assert_eq!(compiles("fail_once_shared"), 2);
    compile_cached(&f).unwrap();
    assert_eq!(compiles("fail_once_shared"), 2);
}

#[test]
fn a_panicking_compile_does_not_leave_waiters_hanging() {
    backend();
    let f = func("panic_once_shared");
    let start = Barrier::new(4);
    let outcomes: Vec<std::thread::Result<Result<Arc<dyn Executable>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    compile_cached(&f)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    assert_eq!(compiles("panic_once_shared"), 1);
    // The compiling thread panicked; the others got an error instead of waiting forever.
    assert_eq!(outcomes.iter().filter(|o| o.is_err()).count(), 1);
    for o in outcomes.into_iter().flatten() {
        let e = o.err().expect("the waiters get an error");
        assert!(e.message.contains("panicked"), "{e}");
    }
    compile_cached(&f).unwrap();
    assert_eq!(
        compiles("panic_once_shared"),
        2,
        "a later call compiles again"
    );
}

#[test]
fn different_functions_compile_side_by_side() {
    let b = backend();
    let (f, g) = (func("side_by_side_f"), func("side_by_side_g"));
    let start = Barrier::new(2);
    let began = Instant::now();
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            start.wait();
            compile_cached(&f)
        });
        let c = s.spawn(|| {
            start.wait();
            compile_cached(&g)
        });
        a.join().unwrap().unwrap();
        c.join().unwrap().unwrap();
    });
    assert_eq!(compiles("side_by_side_f"), 1);
    assert_eq!(compiles("side_by_side_g"), 1);
    assert!(
        b.most_running.load(Ordering::SeqCst) >= 2,
        "two different functions compiled at the same time"
    );
    assert!(
        began.elapsed() < 2 * COMPILE_TIME,
        "not one after the other: {:?}",
        began.elapsed()
    );
}
