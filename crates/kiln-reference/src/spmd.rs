//! SPMD execution: one program per process of a grid of `replicas x partitions` processes,
//! each on its own thread, the collective ops meeting through a [`Communicator`].
//!
//! A process is `(replica, partition)`; its flat index is `replica * partitions + partition`
//! (StableHLO's order: the processes of `run_parallel`'s `programs` row by row). Every
//! process runs its program on the thread [`run_processes`] gives it; the collective ops find
//! their process, grid and communicator in a thread-local context ([`Process::current`]).
//! A function run outside a grid ([`crate::eval`]) is the one process of a 1 x 1 grid.
//!
//! A collective is matched across processes by its sequence number: the k-th collective a
//! process runs meets the k-th collective of every other process of its group. A process that
//! fails, finishes early, or runs another collective or group than its peers makes every
//! process waiting on it fail with a message naming both; a wait longer than
//! [`LocalCommunicator::timeout`] fails as a last resort.

mod local;

pub use local::LocalCommunicator;

use kiln_ir::Literal;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;

/// The shape of the process grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grid {
    /// How many replicas (the grid's rows).
    pub replicas: usize,
    /// How many partitions (the grid's columns).
    pub partitions: usize,
}

impl Grid {
    /// A grid of `replicas x partitions` processes.
    pub fn new(replicas: usize, partitions: usize) -> Grid {
        Grid {
            replicas,
            partitions,
        }
    }

    /// How many processes the grid has.
    pub fn processes(self) -> usize {
        self.replicas * self.partitions
    }

    /// The process of flat index `i`.
    pub fn process(self, i: usize) -> Process {
        Process {
            replica: i / self.partitions.max(1),
            partition: i % self.partitions.max(1),
        }
    }
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replica(s) x {} partition(s)",
            self.replicas, self.partitions
        )
    }
}

/// One process of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Process {
    /// Its replica index (what `replica_id` returns).
    pub replica: usize,
    /// Its partition index (what `partition_id` returns).
    pub partition: usize,
}

impl Process {
    /// The flat index of this process in `grid`.
    pub fn flat(self, grid: Grid) -> usize {
        self.replica * grid.partitions + self.partition
    }

    /// The process this thread runs as, and its grid: `(0, 0)` of a 1 x 1 grid outside
    /// [`run_processes`].
    pub fn current() -> (Process, Grid) {
        CONTEXT.with(|c| match &*c.borrow() {
            Some(ctx) => (ctx.me, ctx.grid),
            None => (
                Process {
                    replica: 0,
                    partition: 0,
                },
                Grid::new(1, 1),
            ),
        })
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.replica, self.partition)
    }
}

/// What a collective exchange failed on, in words fit for the user.
#[derive(Clone, Debug, PartialEq)]
pub struct CommError(pub String);

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommError {}

/// How the processes of a grid exchange values: the one primitive every collective op is
/// built on. The in-process implementation is [`LocalCommunicator`]; one over MPI or sockets
/// implements the same three methods (an exchange is an all-gather on the group's
/// sub-communicator).
pub trait Communicator: Send + Sync {
    /// The grid the processes form.
    fn grid(&self) -> Grid;

    /// Process `me` (a flat index) enters its collective number `seq`, `what` naming the op
    /// (for messages), with `group` the flat indices of the processes it meets in group order
    /// (`me` among them), contributing `data`. Returns the contribution of every process of
    /// the group, in group order, once all have contributed; fails when one of them fails,
    /// finishes, or runs another collective or group as its number `seq`.
    fn exchange(
        &self,
        me: usize,
        seq: u64,
        what: &str,
        group: &[usize],
        data: Vec<Literal>,
    ) -> Result<Vec<Vec<Literal>>, CommError>;

    /// Process `me` failed with `why`: every exchange waiting, now or later, fails with it.
    fn abort(&self, me: usize, why: &str);

    /// Process `me` finished its program: an exchange waiting for it fails.
    fn finish(&self, me: usize);
}

/// The per-thread state of a process run by [`run_processes`].
struct Context {
    comm: Arc<dyn Communicator>,
    me: Process,
    grid: Grid,
    seq: Cell<u64>,
}

thread_local! {
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
    /// The message of the collective that failed on this thread (read by [`catch_abort`]).
    static FAILURE: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The unwinding payload a failed collective of the reference interpreter throws (without the
/// panic hook) to leave the interpreter's infallible recursion; [`catch_abort`] turns it into
/// an error.
struct CollectiveAbort;

/// Exchanges `data` with the processes of `group` (flat indices, `me` among them) as this
/// thread's next collective. Outside a grid, or for a group of one, returns `data` alone.
pub(crate) fn exchange(
    what: &str,
    group: &[usize],
    data: Vec<Literal>,
) -> Result<Vec<Vec<Literal>>, CommError> {
    CONTEXT.with(|c| {
        let c = c.borrow();
        let Some(ctx) = c.as_ref() else {
            return Ok(vec![data]);
        };
        let seq = ctx.seq.get();
        ctx.seq.set(seq + 1);
        if group.len() == 1 {
            return Ok(vec![data]);
        }
        let me = ctx.me.flat(ctx.grid);
        ctx.comm.exchange(me, seq, what, group, data)
    })
}

/// Counts a collective this process takes no part in (a process in no group of a
/// `collective_broadcast`), keeping its sequence numbers in step with its peers'.
pub(crate) fn skip() {
    CONTEXT.with(|c| {
        if let Some(ctx) = c.borrow().as_ref() {
            ctx.seq.set(ctx.seq.get() + 1);
        }
    })
}

/// Leaves the reference interpreter with the collective error `e` (see [`catch_abort`]).
pub(crate) fn abort(e: String) -> ! {
    CONTEXT.with(|c| {
        if let Some(ctx) = c.borrow().as_ref() {
            ctx.comm.abort(ctx.me.flat(ctx.grid), &e);
        }
    });
    FAILURE.with(|f| *f.borrow_mut() = Some(e));
    std::panic::resume_unwind(Box::new(CollectiveAbort))
}

/// Runs `f`, turning a failed collective inside it into `Err` with its message; other panics
/// continue.
pub fn catch_abort<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Ok(v),
        Err(p) if p.is::<CollectiveAbort>() => Err(FAILURE
            .with(|f| f.borrow_mut().take())
            .unwrap_or_else(|| "a collective failed".into())),
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Runs `body(process)` for every process of `comm`'s grid, each on its own thread with its
/// context set, and returns the results in flat order. The first failure (in flat order; a
/// panic of `body` counts as one) is the error, naming its process; the other processes are
/// told, so none waits forever.
pub fn run_processes<T: Send>(
    comm: Arc<dyn Communicator>,
    body: impl Fn(Process) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let grid = comm.grid();
    let outs: Vec<Result<T, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..grid.processes())
            .map(|i| {
                let comm = comm.clone();
                let body = &body;
                s.spawn(move || {
                    let me = grid.process(i);
                    CONTEXT.with(|c| {
                        *c.borrow_mut() = Some(Context {
                            comm: comm.clone(),
                            me,
                            grid,
                            seq: Cell::new(0),
                        })
                    });
                    // A panic of the body is this process's failure too: its peers are told.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        catch_abort(|| body(me)).and_then(|r| r)
                    }))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Err(format!("panicked: {msg}"))
                    });
                    match &r {
                        Ok(_) => comm.finish(i),
                        Err(e) => comm.abort(i, e),
                    }
                    CONTEXT.with(|c| *c.borrow_mut() = None);
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the process's thread panicked".into()))
            })
            .collect()
    });
    let mut results = Vec::with_capacity(outs.len());
    let mut first_error = None;
    for (i, r) in outs.into_iter().enumerate() {
        match r {
            Ok(v) => results.push(v),
            Err(e) => {
                // A process that failed because another did says so; report the origin.
                let origin = !e.starts_with(local::PEER_FAILED);
                let msg = format!("process {}: {e}", grid.process(i));
                match &first_error {
                    None => first_error = Some((origin, msg)),
                    Some((false, _)) if origin => first_error = Some((origin, msg)),
                    _ => {}
                }
            }
        }
    }
    match first_error {
        Some((_, e)) => Err(e),
        None => Ok(results),
    }
}

/// Runs one function per process of `grid` on the reference interpreter: `funcs[i]` on
/// `args[i]` for the process of flat index `i`, with an in-process [`LocalCommunicator`].
/// Returns every process's results, in flat order.
pub fn eval_grid(
    grid: Grid,
    funcs: &[&kiln_ir::Func],
    args: &[Vec<Literal>],
) -> crate::Result<Vec<Vec<Literal>>> {
    let n = grid.processes();
    if n == 0 || funcs.len() != n || args.len() != n {
        return Err(crate::Error::Args(format!(
            "a grid of {grid} needs {n} function(s) and argument lists, got {} and {}",
            funcs.len(),
            args.len()
        )));
    }
    for f in funcs {
        kiln_ir::verify(f).map_err(crate::Error::Verify)?;
    }
    for (f, a) in funcs.iter().zip(args) {
        crate::check_args(f, a)?;
    }
    let comm: Arc<dyn Communicator> = Arc::new(LocalCommunicator::new(grid));
    run_processes(comm, |p| {
        let i = p.flat(grid);
        let refs: Vec<&Literal> = args[i].iter().collect();
        Ok(crate::run(funcs[i], &refs))
    })
    .map_err(crate::Error::Collective)
}
