//! `stablehlo.send` and `stablehlo.recv` between the programs of an
//! `interpreter.run_parallel`: values sent on a channel (the `handle` of `channel_handle`) are
//! received in the order they were sent, by whichever program receives on that channel.
//!
//! kiln IR has no op that moves values between processes outside a collective, so the
//! importer (with checks only, in a function's own body, as for `infeed` and `outfeed`) makes
//! a `send` an output of its function and a `recv` a parameter, each recorded as a
//! [`Transfer`] in [`crate::FuncChecks::sends`] and [`crate::FuncChecks::recvs`]. A runner
//! gives every process of the grid what its `recv`s read before it runs and posts what its
//! `send`s wrote when it finishes, through one [`Channels`] per grid: a process waits to
//! receive while another process that could still send is running, so a `recv` that no
//! `send` can match (every other process finished, or waiting with nothing to take) is an
//! error naming the `recv` and its place in the text, and never a hang; a wait longer than
//! the timeout fails as a last resort. As a consequence, a program's sends cannot depend on what another
//! program sends it back (both would wait to receive): that is the same located error.
//!
//! The tokens the ops take and give hold nothing ([`crate::tuple`]).

use crate::ast::{OpAst, Sig};
use crate::error::{Error, Pos, Result};
use crate::import::{Body, Names, Tree};
use crate::literal::type_name;
use kiln_ir::{Literal, TensorType, ValueId};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How the error of a `recv` that failed because another process failed begins (the words
/// of `kiln_reference::spmd`, whose runner then reports the process that failed first).
pub const PEER_FAILED: &str = "another process failed";

/// One `stablehlo.send` or `stablehlo.recv` of a function.
#[derive(Clone, Debug, PartialEq)]
pub struct Transfer {
    /// The channel (`channel_handle`'s `handle`).
    pub channel: i64,
    /// Where the op is.
    pub pos: Pos,
    /// The function's outputs that hold what a `send` sends, or its parameters that receive
    /// what a `recv` reads.
    pub values: Range<usize>,
    /// The types of those values.
    pub types: Vec<TensorType>,
}

/// A `send` being imported: its channel, where it is, and the values it sends.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) channel: i64,
    pub(crate) pos: Pos,
    pub(crate) values: Vec<ValueId>,
}

/// Imports a `stablehlo.send` (its tensors are recorded to become outputs of the function)
/// or a `stablehlo.recv` (its tensors are new parameters of the function, recorded as a
/// [`Transfer`]).
pub(crate) fn lower(
    body: &mut Body,
    names: &mut Names,
    op: &OpAst,
    args: &[ValueId],
) -> Result<()> {
    if !body.allow_checks {
        return Err(Error::unsupported(
            op.pos,
            format!(
                "`{}` here (read by `parse_with_checks`, in a function's own body only)",
                op.name
            ),
        ));
    }
    if let Some((_, p)) = op.attr("source_target_pairs") {
        return Err(Error::unsupported(
            p,
            format!(
                "`source_target_pairs` of `{}` (kiln routes transfers by channel only)",
                op.name
            ),
        ));
    }
    match op.operands.last() {
        Some(n) if matches!(names.tuple(n), Some(Tree::Token)) => {}
        Some(n) => {
            return Err(Error::invalid(
                n.pos,
                format!("the last operand of `{}` must be a token", op.name),
            ));
        }
        None => {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` needs a token operand", op.name),
            ));
        }
    }
    let channel = match op.attr("channel_handle") {
        None => {
            return Err(Error::invalid(
                op.pos,
                format!("`{}` needs a `channel_handle`", op.name),
            ));
        }
        Some(_) => crate::collective::channel_id(op)?,
    };
    let results = if op.name == "stablehlo.send" {
        body.sends.push(Pending {
            channel,
            pos: op.pos,
            values: args.to_vec(),
        });
        Vec::new()
    } else {
        if !args.is_empty() {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.recv` takes only a token",
            ));
        }
        let Sig::Func(_, outs) = &op.sig else {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.recv` needs its function type",
            ));
        };
        let first = body.b.param_count();
        let values: Vec<ValueId> = outs.iter().map(|t| body.b.param(t.clone())).collect();
        body.recvs.push(Transfer {
            channel,
            pos: op.pos,
            values: first..first + values.len(),
            types: outs.clone(),
        });
        values
    };
    crate::tuple::bind_shaped(names, op, results)
}

/// What each of `sends` sent, read from the outputs `outs` of its function: (channel,
/// values), in the order the sends ran.
pub fn sent(sends: &[Transfer], outs: &[Literal]) -> Vec<(i64, Vec<Literal>)> {
    sends
        .iter()
        .map(|s| {
            (
                s.channel,
                outs.get(s.values.clone()).unwrap_or_default().to_vec(),
            )
        })
        .collect()
}

/// The state of a grid's channels.
struct State {
    /// What was sent and not yet received, per channel, oldest first.
    queues: HashMap<i64, VecDeque<Vec<Literal>>>,
    /// How many processes are running: neither finished nor waiting to receive.
    running: usize,
    /// How many processes failed.
    failed: usize,
    /// The channel each waiting process waits on.
    waiting: Vec<i64>,
}

/// The channels of one grid of processes: each process calls [`Channels::receive`] before
/// it runs and [`Channels::finish`] after it succeeded, or [`Channels::fail`] after it
/// failed.
pub struct Channels {
    state: Mutex<State>,
    wake: Condvar,
    timeout: Duration,
}

impl Channels {
    /// The channels of a grid of `processes` processes, all running; a `recv` waits at most
    /// `timeout` for a `send`.
    pub fn new(processes: usize, timeout: Duration) -> Channels {
        Channels {
            state: Mutex::new(State {
                queues: HashMap::new(),
                running: processes,
                failed: 0,
                waiting: Vec::new(),
            }),
            wake: Condvar::new(),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the `recvs` of the function `func` read, one list per `recv`, in order: each the
    /// oldest values sent on its channel. Waits while another process runs (it may still
    /// send) or another waiting process has a value to take (it will run again); fails,
    /// naming the `recv`, when neither holds (or after the timeout), or when what was sent
    /// does not have the types the `recv` declares.
    pub fn receive(&self, func: &str, recvs: &[Transfer]) -> Result<Vec<Vec<Literal>>, String> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.lock();
        st.running = st.running.saturating_sub(1);
        self.wake.notify_all();
        let mut got = Vec::with_capacity(recvs.len());
        let mut failure = None;
        'recvs: for r in recvs {
            loop {
                if let Some(v) = st.queues.get_mut(&r.channel).and_then(VecDeque::pop_front) {
                    let types: Vec<&TensorType> = v.iter().map(Literal::ty).collect();
                    if types.len() != r.types.len()
                        || types.iter().zip(&r.types).any(|(a, b)| *a != b)
                    {
                        failure = Some(format!(
                            "{}: `stablehlo.recv` of @{func} on channel {} reads ({}), but the send gave ({})",
                            r.pos,
                            r.channel,
                            names(r.types.iter()),
                            names(types.into_iter())
                        ));
                        break 'recvs;
                    }
                    got.push(v);
                    break;
                }
                // Stuck: no process runs, and none that waits has a value to take.
                let stuck = st.running == 0
                    && st
                        .waiting
                        .iter()
                        .all(|c| st.queues.get(c).is_none_or(VecDeque::is_empty));
                if stuck && st.failed > 0 {
                    // The runner reports the failure that caused this one.
                    failure = Some(format!(
                        "{PEER_FAILED}, so `stablehlo.recv` of @{func} on channel {} at {} gets nothing",
                        r.channel, r.pos
                    ));
                    break 'recvs;
                }
                if stuck {
                    failure = Some(format!(
                        "{}: `stablehlo.recv` of @{func} on channel {} has no matching `stablehlo.send` (no process that could still send on it is running)",
                        r.pos, r.channel
                    ));
                    break 'recvs;
                }
                let now = Instant::now();
                if now >= deadline {
                    failure = Some(format!(
                        "{}: `stablehlo.recv` of @{func} on channel {} waited {:?} for a `stablehlo.send`",
                        r.pos, r.channel, self.timeout
                    ));
                    break 'recvs;
                }
                st.waiting.push(r.channel);
                st = self
                    .wake
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if let Some(k) = st.waiting.iter().position(|&c| c == r.channel) {
                    st.waiting.swap_remove(k);
                }
            }
        }
        // Running again (until `finish`), whether it received everything or not.
        st.running += 1;
        match failure {
            Some(f) => Err(f),
            None => Ok(got),
        }
    }

    /// The process finished: what its sends sent (see [`sent`]) is posted to the channels,
    /// in order.
    pub fn finish(&self, sent: Vec<(i64, Vec<Literal>)>) {
        let mut st = self.lock();
        for (channel, values) in sent {
            st.queues.entry(channel).or_default().push_back(values);
        }
        st.running = st.running.saturating_sub(1);
        self.wake.notify_all();
    }

    /// The process failed: it sends nothing, and a `recv` left without a value says that a
    /// process failed (its message begins with [`PEER_FAILED`], as a collective's does).
    pub fn fail(&self) {
        let mut st = self.lock();
        st.failed += 1;
        st.running = st.running.saturating_sub(1);
        self.wake.notify_all();
    }
}

/// Type names, comma-separated.
fn names<'a>(types: impl Iterator<Item = &'a TensorType>) -> String {
    types.map(type_name).collect::<Vec<_>>().join(", ")
}
