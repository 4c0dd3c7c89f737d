//! Random collectives, valid on the one process of a 1 x 1 grid (the grid a function runs on
//! outside an SPMD runner): every group is `[0]` (or no groups: every index, which is `[0]`
//! there), `all_to_all` splits in one part, `collective_permute` sends process 0 its own
//! operand or nothing. Reductions sum. `random_fft` makes them one time in three, and
//! [`Gen::maybe_rare_op`] one at a time.

use super::Gen;
use crate::{Builder, Func, Op, TensorType, ValueId};

/// `add` of two scalars of `t`'s element type.
fn sum(t: &TensorType) -> Option<Box<Func>> {
    let s = TensorType::scalar(t.dtype);
    let mut b = Builder::new("sum");
    let x = b.param(s.clone());
    let y = b.param(s);
    let z = b.binary(Op::Add {}, x, y).ok()?;
    b.finish(&[z]).ok().map(Box::new)
}

impl Gen<'_> {
    /// One collective (or `replica_id`, `partition_id`) of a random kind on `a`, if it fits.
    pub(super) fn one_collective(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let kind = self.rng.below(9);
        let op = self.collective_op(kind, t)?;
        let operands: &[ValueId] = match op {
            Op::ReplicaId {} | Op::PartitionId {} => &[],
            _ => &[a],
        };
        self.b.inst(op, operands).ok()
    }

    /// Every kind of collective (and `replica_id`, `partition_id`) on `a`, in a random order
    /// (the ops that pick a dimension only when `a` has one); one of their results.
    pub(super) fn random_collective(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let mut kinds: Vec<usize> = (0..9).collect();
        for i in (1..kinds.len()).rev() {
            let j = self.rng.below(i + 1);
            kinds.swap(i, j);
        }
        let mut results = Vec::new();
        for kind in kinds {
            if let Some(op) = self.collective_op(kind, t) {
                let operands: &[ValueId] = match op {
                    Op::ReplicaId {} | Op::PartitionId {} => &[],
                    _ => &[a],
                };
                results.push(self.b.inst(op, operands).ok()?);
            }
        }
        Some(*self.rng.pick(&results))
    }

    /// The collective `kind` (0 to 8) on a value of type `t`, if it fits.
    fn collective_op(&mut self, kind: usize, t: &TensorType) -> Option<Op> {
        let groups = if self.rng.chance(0.5) {
            vec![vec![0]]
        } else {
            Vec::new()
        };
        let channel_id = self.rng.below(2) as i64;
        let global = channel_id > 0 && self.rng.chance(0.5);
        let dim = |g: &mut Self| (t.rank() > 0).then(|| g.rng.below(t.rank()) as i64);
        Some(match kind {
            0 => Op::ReplicaId {},
            1 => Op::PartitionId {},
            2 => Op::AllGather {
                all_gather_dim: dim(self)?,
                replica_groups: groups,
                channel_id,
                use_global_device_ids: global,
            },
            3 => Op::AllReduce {
                replica_groups: groups,
                channel_id,
                use_global_device_ids: global,
                computation: sum(t)?,
            },
            4 => Op::AllToAll {
                split_dimension: dim(self)?,
                concat_dimension: dim(self)?,
                split_count: 1,
                replica_groups: groups,
                channel_id,
            },
            5 => Op::ReduceScatter {
                scatter_dimension: dim(self)?,
                replica_groups: groups,
                channel_id,
                use_global_device_ids: global,
                computation: sum(t)?,
            },
            6 => Op::CollectivePermute {
                source_target_pairs: if self.rng.chance(0.75) {
                    vec![(0, 0)]
                } else {
                    Vec::new()
                },
                channel_id,
            },
            7 => Op::CollectiveBroadcast {
                replica_groups: groups,
                channel_id,
                has_dynamic_root: false,
            },
            _ => Op::CollectiveReduce {
                replica_groups: groups,
                channel_id,
                computation: sum(t)?,
            },
        })
    }
}
