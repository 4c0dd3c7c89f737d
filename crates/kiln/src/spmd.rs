//! SPMD: one program run by every process of a grid of `replicas x partitions` processes, the
//! processes meeting in collectives ([`all_reduce_sum`], [`all_gather`], [`reduce_scatter_sum`],
//! [`all_to_all`], [`collective_permute`], [`collective_broadcast`]) and knowing who they are
//! ([`replica_id`], [`partition_id`]).
//!
//! [`run`] calls a jitted function on every process, each on its own thread of this program,
//! with its own inputs; the collectives of the compiled program are host steps that exchange
//! values through an in-process communicator ([`reference::spmd::LocalCommunicator`]), which
//! the [`reference::spmd::Communicator`] trait lets a distributed one replace. Results are
//! deterministic: a reduction folds the group's values in group order on every process. A
//! process that fails, or runs another collective than its peers, makes [`run`] fail with a
//! message naming it; no process waits forever.
//!
//! The collectives differentiate (a sum's gradient is summed back, a gather's is
//! reduce-scattered, ...), so [`crate::grad`] of a data-parallel loss is the data-parallel
//! gradient. Outside a grid a program is the one process of a 1 x 1 grid.
//!
//! ```
//! use kiln::{Tensor, jit, spmd};
//! // Data parallelism on two replicas: each holds a shard; the sum is the global sum.
//! let f = jit(|x: &Tensor| spmd::all_reduce_sum(&x.sum_all(), &[]));
//! let shards = [
//!     Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap(),
//!     Tensor::from_vec(vec![3.0f32, 4.0], [2]).unwrap(),
//! ];
//! let out = spmd::run(spmd::Grid::new(2, 1), &f, &shards).unwrap();
//! assert_eq!(out[0].item().unwrap(), 10.0);
//! assert_eq!(out[1].item().unwrap(), 10.0);
//! ```
//!
//! [`reference::spmd::LocalCommunicator`]: crate::reference::spmd::LocalCommunicator
//! [`reference::spmd::Communicator`]: crate::reference::spmd::Communicator

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Builder, DType, Func, Loc, Op, TensorType};
use kiln_trace::trace::apply;
use std::sync::Arc;

pub use kiln_reference::spmd::{Grid, Process};

/// `add` of two scalars of `dtype`: the computation of the summing collectives.
fn sum_computation(dtype: DType) -> Box<Func> {
    let s = TensorType::scalar(dtype);
    let mut b = Builder::new("sum");
    let x = b.param(s.clone());
    let y = b.param(s);
    let z = b
        .binary(Op::Add {}, x, y)
        .expect("add of two scalars of one type verifies");
    Box::new(b.finish(&[z]).expect("one add verifies"))
}

fn dtype_of(x: &Tensor) -> DType {
    x.dtype()
}

/// The sum of `x` over the processes of each replica group (`groups` lists replica indices;
/// empty: every replica in one group), on every process of the group.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// // Outside a grid, the one process sums with itself alone.
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// assert_eq!(spmd::all_reduce_sum(&x, &[]).to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// ```
#[track_caller]
pub fn all_reduce_sum(x: &Tensor, groups: &[Vec<i64>]) -> Tensor {
    let op = Op::AllReduce {
        replica_groups: groups.to_vec(),
        channel_id: 0,
        use_global_device_ids: false,
        computation: sum_computation(dtype_of(x)),
    };
    apply(op, &[x], None, "all_reduce_sum", Loc::caller()).remove(0)
}

/// The `x` of every replica of the group, concatenated along `dim` in group order.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// let x = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
/// assert_eq!(spmd::all_gather(&x, 0, &[]).to_vec::<i32>().unwrap(), [1, 2]);
/// ```
#[track_caller]
pub fn all_gather(x: &Tensor, dim: usize, groups: &[Vec<i64>]) -> Tensor {
    let op = Op::AllGather {
        all_gather_dim: dim as i64,
        replica_groups: groups.to_vec(),
        channel_id: 0,
        use_global_device_ids: false,
    };
    let declared = gathered_type(x, dim, groups, true).map(|t| vec![t]);
    apply(op, &[x], declared, "all_gather", Loc::caller()).remove(0)
}

/// The type of `x` with dimension `dim` multiplied (`grow`) or divided by the size of the
/// group (the grid's replica count for no groups); `None` when it cannot be known here.
fn gathered_type(x: &Tensor, dim: usize, groups: &[Vec<i64>], grow: bool) -> Option<TensorType> {
    let mut t = x.ty()?;
    let k = match groups.first() {
        Some(g) => g.len(),
        None => Process::current().1.replicas,
    };
    let d = t.shape.get_mut(dim)?;
    if grow {
        *d *= k;
    } else if k > 0 && d.is_multiple_of(k) {
        *d /= k;
    } else {
        return None;
    }
    Some(t)
}

/// The sum of `x` over the replicas of the group, split along `dim` into one part per replica:
/// the group's `i`-th replica gets part `i`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// let x = Tensor::from_vec(vec![1.0f64, 2.0], [2]).unwrap();
/// assert_eq!(spmd::reduce_scatter_sum(&x, 0, &[]).to_vec::<f64>().unwrap(), [1.0, 2.0]);
/// ```
#[track_caller]
pub fn reduce_scatter_sum(x: &Tensor, dim: usize, groups: &[Vec<i64>]) -> Tensor {
    let op = Op::ReduceScatter {
        scatter_dimension: dim as i64,
        replica_groups: groups.to_vec(),
        channel_id: 0,
        use_global_device_ids: false,
        computation: sum_computation(dtype_of(x)),
    };
    let declared = gathered_type(x, dim, groups, false).map(|t| vec![t]);
    apply(op, &[x], declared, "reduce_scatter_sum", Loc::caller()).remove(0)
}

/// `x` split into `split_count` parts along `split_dim`, part `i` sent to the group's `i`-th
/// replica, the received parts concatenated along `concat_dim`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]).unwrap();
/// let y = spmd::all_to_all(&x, 1, 0, 1, &[vec![0]]);
/// assert_eq!(y.to_vec::<i64>().unwrap(), [1, 2, 3, 4]);
/// ```
#[track_caller]
pub fn all_to_all(
    x: &Tensor,
    split_dim: usize,
    concat_dim: usize,
    split_count: usize,
    groups: &[Vec<i64>],
) -> Tensor {
    let op = Op::AllToAll {
        split_dimension: split_dim as i64,
        concat_dimension: concat_dim as i64,
        split_count: split_count as i64,
        replica_groups: groups.to_vec(),
        channel_id: 0,
    };
    apply(op, &[x], None, "all_to_all", Loc::caller()).remove(0)
}

/// `x` of the source replica of each `(source, target)` pair, on its target; zeros on a
/// replica no pair targets.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// let x = Tensor::from_vec(vec![5.0f32], [1]).unwrap();
/// assert_eq!(spmd::collective_permute(&x, &[(0, 0)]).to_vec::<f32>().unwrap(), [5.0]);
/// ```
#[track_caller]
pub fn collective_permute(x: &Tensor, pairs: &[(i64, i64)]) -> Tensor {
    let op = Op::CollectivePermute {
        source_target_pairs: pairs.to_vec(),
        channel_id: 0,
    };
    apply(op, &[x], None, "collective_permute", Loc::caller()).remove(0)
}

/// `x` of the first replica of each group, on every replica of the group; zeros on a replica
/// in no group.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, spmd};
/// let x = Tensor::from_vec(vec![5.0f32], [1]).unwrap();
/// assert_eq!(spmd::collective_broadcast(&x, &[vec![0]]).to_vec::<f32>().unwrap(), [5.0]);
/// ```
#[track_caller]
pub fn collective_broadcast(x: &Tensor, groups: &[Vec<i64>]) -> Tensor {
    let op = Op::CollectiveBroadcast {
        replica_groups: groups.to_vec(),
        channel_id: 0,
        has_dynamic_root: false,
    };
    apply(op, &[x], None, "collective_broadcast", Loc::caller()).remove(0)
}

/// The replica index of the running process, a `u32` scalar (0 outside a grid).
///
/// # Examples
///
/// ```
/// use kiln::spmd;
/// assert_eq!(spmd::replica_id().to_vec::<u32>().unwrap(), [0]);
/// ```
#[track_caller]
pub fn replica_id() -> Tensor {
    apply(Op::ReplicaId {}, &[], None, "replica_id", Loc::caller()).remove(0)
}

/// The partition index of the running process, a `u32` scalar (0 outside a grid).
///
/// # Examples
///
/// ```
/// use kiln::spmd;
/// assert_eq!(spmd::partition_id().to_vec::<u32>().unwrap(), [0]);
/// ```
#[track_caller]
pub fn partition_id() -> Tensor {
    apply(Op::PartitionId {}, &[], None, "partition_id", Loc::caller()).remove(0)
}

/// Calls `f` on every process of `grid`, process `i` (flat: `replica * partitions +
/// partition`) on `inputs[i]`, each on its own thread with an in-process communicator, and
/// returns their results in the same order. `f` is any function, typically a [`crate::jit`]
/// one: its compiled program runs on every thread, its collectives meeting there. Fails with
/// the first failing process's error (named), when `inputs` does not have one entry per
/// process, or when a process does not join its peers' collective.
#[track_caller]
pub fn run<I, O, F>(grid: Grid, f: &F, inputs: &[I]) -> Result<Vec<O>>
where
    I: Tree + Sync,
    O: Send,
    F: SpmdFn<I, O>,
{
    let loc = Loc::caller();
    let n = grid.processes();
    if n == 0 || inputs.len() != n {
        return Err(Error::at(
            "spmd::run",
            format!(
                "a grid of {grid} needs one input per process ({n}), got {}",
                inputs.len()
            ),
            loc,
        ));
    }
    let comm = Arc::new(kiln_reference::spmd::LocalCommunicator::new(grid));
    kiln_reference::spmd::run_processes(comm, |p| {
        f.call_on(&inputs[p.flat(grid)]).map_err(|e| e.to_string())
    })
    .map_err(|m| Error::at("spmd::run", m, loc))
}

/// A function [`run`] can call on every process: a [`crate::Jit`], or any
/// `Fn(&I) -> Result<O>` that is `Sync`.
pub trait SpmdFn<I, O>: Sync {
    /// Calls the function on one process's input.
    fn call_on(&self, x: &I) -> Result<O>;
}

impl<I, O, F> SpmdFn<I, O> for crate::Jit<I, O, F>
where
    I: Tree,
    O: Tree + Clone,
    F: Fn(&I) -> O + Sync,
    crate::Jit<I, O, F>: Sync,
{
    fn call_on(&self, x: &I) -> Result<O> {
        self.call(x)
    }
}
