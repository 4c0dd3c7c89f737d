//! The thread team compiled kernels (`kiln-runtime`) and eager loops (`kiln-trace`) are split
//! across: the calling thread and `threads - 1` workers of the team's own, which take a
//! launch's chunks from one shared counter.
//!
//! A launch through a thread pool's scope (`rayon::scope` from outside the pool) costs the
//! caller a sleep and a wake and the workers a wake each: on a 2-core KVM guest about 25 to 55
//! microseconds a launch (a launch of two 17-microsecond halves took 42 to 47 microseconds, of
//! two 175-microsecond halves 230), where a training step launches dozens of kernels and a
//! small product runs for about 100 microseconds. Here the caller runs chunks itself, and an
//! idle worker spins on the counter for [`SPIN`] before it sleeps, so launches that follow one
//! another within that time cost no wake at all (the same halves: 17.7 and 176 microseconds).
//! A spinning worker yields its core every few microseconds: with another process busy on one
//! of the two cores, spinning without yielding made the MLP training step slower than the
//! pool's scope (20.4-21.3 against 19.7-20.0 ms), yielding faster (17.3-19.0).
//!
//! One launch runs at a time: a launch made while the team is busy (from another thread, or
//! from inside a chunk) is refused ([`run`] returns `false`) and the caller runs it some other
//! way.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker watches for the next launch before it sleeps (a thread pool for
/// OpenMP keeps its workers spinning for a comparable time by default).
pub const SPIN: Duration = Duration::from_micros(200);

/// The most chunks one launch may have (the claim word's chunk fields are 16 bits).
pub const MAX_CHUNKS: usize = (1 << 16) - 1;

/// A launch's body: called once with each chunk index.
type Body<'a> = &'a (dyn Fn(usize) + Sync);

/// The claim word: the launch's number (32 bits), its chunk count (16) and the next chunk to
/// claim (16). A worker runs chunk `i` only after moving the word from `(e, n, i)` to
/// `(e, n, i + 1)`; since launch `e`'s caller does not return (nor publish launch `e + 1`)
/// before all `n` chunks are done, a claim that succeeds always finds launch `e`'s body alive.
/// (A worker would have to stall across 2^32 launches, holding the exact word, for a claim to
/// succeed on a stale one.)
fn pack(epoch: u64, chunks: usize, next: usize) -> u64 {
    (epoch << 32) | ((chunks as u64) << 16) | next as u64
}

fn unpack(w: u64) -> (u64, usize, usize) {
    (
        w >> 32,
        ((w >> 16) & 0xffff) as usize,
        (w & 0xffff) as usize,
    )
}

struct Team {
    workers: usize,
    claim: AtomicU64,
    /// The current launch's body (a pointer to the caller's fat reference), read only after a
    /// successful claim.
    body: AtomicPtr<Body<'static>>,
    /// Chunks of the current launch finished (run, or panicked).
    done: AtomicUsize,
    /// Set while a launch is in progress: launches are one at a time.
    busy: AtomicBool,
    /// Workers asleep or about to sleep: a launch wakes them through `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The first panic of a launch's chunks, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Team {
    /// Claims and runs chunks of the launch in `claim` until none is left unclaimed; returns
    /// whether it ran any.
    fn run_chunks(&self) -> bool {
        let mut ran = false;
        loop {
            let w = self.claim.load(Acquire);
            let (_, n, i) = unpack(w);
            if i >= n {
                return ran;
            }
            if self
                .claim
                .compare_exchange_weak(w, w + 1, Acquire, Relaxed)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim succeeded, so the launch whose word this was is unfinished
            // (chunk `i` is ours and not done) and its caller, which owns the body, waits for
            // it; the body's pointer was stored before the word was published (release) and
            // this claim read that word (acquire).
            let body = unsafe { &*self.body.load(Relaxed) };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| body(i))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Release);
            ran = true;
        }
    }

    /// Whether the claim word has a chunk left to claim.
    fn has_work(&self) -> bool {
        let (_, n, i) = unpack(self.claim.load(SeqCst));
        i < n
    }

    /// A worker's life: run what is published, spin for [`SPIN`] after the last chunk, then
    /// sleep until a launch wakes it.
    fn work(&self) {
        loop {
            if self.run_chunks() {
                continue;
            }
            let start = Instant::now();
            let mut spins = 0u32;
            while !self.has_work() {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) {
                    if start.elapsed() > SPIN {
                        self.sleep();
                        break;
                    }
                    // On a machine busier than the pool is wide, let a thread waiting for this
                    // core (the launch's caller among them) have it.
                    std::thread::yield_now();
                }
            }
        }
    }

    fn sleep(&self) {
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, SeqCst);
        while !self.has_work() {
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }
}

/// The process's team: `rayon`'s global thread count less the caller, started on first use.
fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        // Read outside any pool: the global pool's size, which `RAYON_NUM_THREADS` sets.
        let workers = rayon::current_num_threads().saturating_sub(1);
        let t: &'static Team = Box::leak(Box::new(Team {
            workers,
            claim: AtomicU64::new(0),
            body: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
        }));
        for w in 0..workers {
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-team-{w}"))
                .spawn(move || t.work());
            if spawned.is_err() {
                // Fewer workers than planned: the caller claims what they would have.
                break;
            }
        }
        t
    })
}

/// The threads a launch through the team runs on (the caller included), or `None` where the
/// team would not take one from this thread: inside a thread pool (whose own size then rules,
/// as in a pool of one thread installed for a test) or with a pool of one thread.
pub fn threads() -> Option<usize> {
    if rayon::current_thread_index().is_some() || rayon::current_num_threads() < 2 {
        return None;
    }
    Some(team().workers + 1)
}

/// Runs `body(0) .. body(chunks - 1)` on the team (the calling thread among them) and returns
/// `true` when all have run; returns `false` without running any where the team does not take
/// the launch ([`threads`] is `None`, more than [`MAX_CHUNKS`] chunks, or a launch already in
/// progress). A chunk's panic is resumed here once every chunk has finished.
pub fn run(chunks: usize, body: &(dyn Fn(usize) + Sync)) -> bool {
    if chunks > MAX_CHUNKS || threads().is_none() {
        return false;
    }
    let t = team();
    if t.busy.swap(true, Acquire) {
        return false;
    }
    struct Free<'a>(&'a AtomicBool);
    impl Drop for Free<'_> {
        fn drop(&mut self) {
            self.0.store(false, Release);
        }
    }
    let _free = Free(&t.busy);
    // SAFETY of the lifetime's erasure: workers read the body only through a claim of this
    // launch's chunks, and this function returns only once every chunk is done.
    let body: Body<'static> = unsafe { std::mem::transmute::<Body<'_>, Body<'static>>(body) };
    let slot: *const Body<'static> = &body;
    t.body.store(slot.cast_mut(), Relaxed);
    t.done.store(0, Relaxed);
    let (epoch, _, _) = unpack(t.claim.load(Relaxed));
    t.claim
        .store(pack(epoch.wrapping_add(1) & 0xffff_ffff, chunks, 0), SeqCst);
    if t.sleepers.load(SeqCst) > 0 {
        let _g = t.lock.lock().unwrap_or_else(|e| e.into_inner());
        t.wake.notify_all();
    }
    t.run_chunks();
    let mut spins = 0u32;
    while t.done.load(Acquire) < chunks {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            // A worker holding a chunk may have lost its core: give it ours.
            std::thread::yield_now();
        }
    }
    let p = t.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = p {
        resume_unwind(p);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// `run`, retried while another test's launch holds the team; `None` where the team takes
    /// no launch from this thread at all (a pool of one thread).
    fn run_when_free(chunks: usize, body: &(dyn Fn(usize) + Sync)) -> Option<()> {
        threads()?;
        for _ in 0..10_000 {
            if run(chunks, body) {
                return Some(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the team stayed busy for 10 seconds");
    }

    /// Every chunk of every launch runs once, launches back to back and after the workers
    /// have gone to sleep.
    #[test]
    fn every_chunk_runs_once() {
        for chunks in [1usize, 2, 3, 7, 64, 1000] {
            for pause in [false, true] {
                if pause {
                    std::thread::sleep(SPIN * 3);
                }
                let seen: Vec<AtomicU32> = (0..chunks).map(|_| AtomicU32::new(0)).collect();
                if run_when_free(chunks, &|i| {
                    seen[i].fetch_add(1, Relaxed);
                })
                .is_some()
                {
                    assert!(seen.iter().all(|s| s.load(Relaxed) == 1), "{chunks} chunks");
                }
            }
        }
        assert!(!run(MAX_CHUNKS + 1, &|_| {}));
    }

    /// A launch from inside a chunk is refused (the team is busy), so the chunk runs it some
    /// other way; a launch from inside a thread pool is refused too.
    #[test]
    fn nested_launches_are_refused() {
        let inner = AtomicU32::new(0);
        if run_when_free(2, &|_| {
            if !run(2, &|_| {}) {
                inner.fetch_add(1, Relaxed);
            }
        })
        .is_some()
        {
            assert_eq!(inner.load(Relaxed), 2);
        }
        rayon::scope(|_| assert!(!run(2, &|_| {}) && threads().is_none()));
    }

    /// A chunk's panic reaches the caller after every chunk has finished, and the team takes
    /// the next launch.
    #[test]
    fn a_chunk_panic_reaches_the_caller() {
        if threads().is_none() {
            return;
        }
        let count = AtomicU32::new(0);
        let body = |i| {
            count.fetch_add(1, Relaxed);
            if i == 3 {
                panic!("chunk 3");
            }
        };
        let r = catch_unwind(AssertUnwindSafe(|| run_when_free(8, &body)));
        let p = r.expect_err("chunk 3 panics");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"chunk 3"));
        assert_eq!(count.load(Relaxed), 8);
        let again = AtomicU32::new(0);
        run_when_free(4, &|_| {
            again.fetch_add(1, Relaxed);
        });
        assert_eq!(again.load(Relaxed), 4);
    }
}
