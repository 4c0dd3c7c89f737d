//! The in-process [`Communicator`]: the processes are threads of one program and meet in a
//! table of open exchanges under one lock.

use super::{CommError, Communicator, Grid};
use kiln_ir::Literal;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How a process's error begins when it failed because another process did.
pub(super) const PEER_FAILED: &str = "another process failed";

/// One open exchange: who contributed what, and how many have still to read.
struct Slot {
    what: String,
    data: Vec<Option<Vec<Literal>>>,
    unread: usize,
}

#[derive(Default)]
struct State {
    slots: HashMap<(u64, Vec<usize>), Slot>,
    /// How many collectives each process has entered.
    entered: Vec<u64>,
    /// Which processes finished their program.
    finished: Vec<bool>,
    /// The first failure, which every waiting exchange reports.
    failed: Option<String>,
}

/// Threads of one process exchanging values in memory.
pub struct LocalCommunicator {
    grid: Grid,
    state: Mutex<State>,
    wake: Condvar,
    timeout: Duration,
}

impl LocalCommunicator {
    /// A communicator for the processes of `grid`, waiting at most 60 seconds for a peer.
    pub fn new(grid: Grid) -> LocalCommunicator {
        LocalCommunicator {
            grid,
            state: Mutex::new(State {
                entered: vec![0; grid.processes()],
                finished: vec![false; grid.processes()],
                ..State::default()
            }),
            wake: Condvar::new(),
            timeout: Duration::from_secs(60),
        }
    }

    /// The same communicator with another last-resort wait limit.
    pub fn with_timeout(mut self, timeout: Duration) -> LocalCommunicator {
        self.timeout = timeout;
        self
    }

    /// How long an exchange waits for a peer before it fails.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, st: &mut State, why: String) -> CommError {
        if st.failed.is_none() {
            st.failed = Some(why.clone());
        }
        self.wake.notify_all();
        CommError(why)
    }
}

impl Communicator for LocalCommunicator {
    fn grid(&self) -> Grid {
        self.grid
    }

    fn exchange(
        &self,
        me: usize,
        seq: u64,
        what: &str,
        group: &[usize],
        data: Vec<Literal>,
    ) -> Result<Vec<Vec<Literal>>, CommError> {
        let name = |i: usize| self.grid.process(i).to_string();
        let pos = group
            .iter()
            .position(|&g| g == me)
            .ok_or_else(|| CommError(format!("process {} is not in its group", name(me))))?;
        let key = (seq, group.to_vec());
        let deadline = Instant::now() + self.timeout;
        let mut st = self.lock();
        if let Some(f) = &st.failed {
            return Err(CommError(format!("{PEER_FAILED}: {f}")));
        }
        st.entered[me] = seq + 1;
        let slot = st.slots.entry(key.clone()).or_insert_with(|| Slot {
            what: what.to_string(),
            data: vec![None; group.len()],
            unread: group.len(),
        });
        if slot.what != what {
            let other = slot.what.clone();
            return Err(self.fail(
                &mut st,
                format!(
                    "collective #{seq} is {what} on process {} but {other} on another process of its group",
                    name(me)
                ),
            ));
        }
        slot.data[pos] = Some(data);
        self.wake.notify_all();
        loop {
            if let Some(f) = &st.failed {
                return Err(CommError(format!("{PEER_FAILED}: {f}")));
            }
            let slot = st
                .slots
                .get_mut(&key)
                .expect("an open exchange stays until read");
            let missing: Vec<usize> = group
                .iter()
                .zip(&slot.data)
                .filter(|(_, d)| d.is_none())
                .map(|(&g, _)| g)
                .collect();
            if missing.is_empty() {
                let all: Vec<Vec<Literal>> = slot.data.iter().flatten().cloned().collect();
                slot.unread -= 1;
                if slot.unread == 0 {
                    st.slots.remove(&key);
                }
                return Ok(all);
            }
            for &m in &missing {
                if st.entered[m] > seq {
                    return Err(self.fail(
                        &mut st,
                        format!(
                            "process {} ran its collective #{seq} with another group than {what} of process {} (group {:?})",
                            name(m),
                            name(me),
                            group.iter().map(|&g| name(g)).collect::<Vec<_>>()
                        ),
                    ));
                }
                if st.finished[m] {
                    return Err(self.fail(
                        &mut st,
                        format!(
                            "process {} finished without joining {what} (collective #{seq}) with process {}",
                            name(m),
                            name(me)
                        ),
                    ));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.fail(
                    &mut st,
                    format!(
                        "{what} (collective #{seq}) of process {} waited {:?} for process(es) {}",
                        name(me),
                        self.timeout,
                        missing
                            .iter()
                            .map(|&m| name(m))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            st = self
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn abort(&self, me: usize, why: &str) {
        let mut st = self.lock();
        let msg = format!("process {}: {why}", self.grid.process(me));
        self.fail(&mut st, msg);
    }

    fn finish(&self, me: usize) {
        let mut st = self.lock();
        st.finished[me] = true;
        self.wake.notify_all();
    }
}
