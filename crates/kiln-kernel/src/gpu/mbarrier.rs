//! mbarriers (sm_90): barrier objects in shared memory that count arrivals and transaction
//! bytes, what [`Stmt::TmaLoad`]s complete and a warp-specialized ring waits on.
//!
//! An mbarrier is a 64-bit word of a shared array of `u64` ([`SharedArray::mbarriers`]),
//! named by an [`Mbar`]. Its state, as the PTX ISA defines it and the GPU emulator keeps it:
//!
//! - a phase number (0 after [`Stmt::MbarInit`]), the arrivals its phase still expects (the
//!   init's count at the start of each phase), and a transaction count (bytes still expected,
//!   0 at the start of each phase; it may go below zero when bytes land before they are
//!   expected);
//! - [`Stmt::MbarArrive`] adds its `tx` bytes to the transaction count, then takes one
//!   arrival; a TMA copy that lands takes its bytes off the transaction count;
//! - the phase completes when no arrival and no byte is left: the phase number goes up by
//!   one and the next phase starts expecting the init's count again;
//! - [`Stmt::MbarWait`] on parity `p` returns once the most recent phase of parity `p` has
//!   completed: at once when the current phase's parity is not `p` (the phase before it,
//!   which has completed, has parity `p`; before phase 0 completes, waiting on parity 1
//!   returns at once, as a producer's first wait on an empty slot does), else when the
//!   current phase completes.
//!
//! Parity waits are only meaningful while a waiter is at most one phase behind: the
//! emulator tracks, per thread and barrier, the phase its last wait returned on, and a wait
//! that would return on that phase again (a parity that was not flipped) or skip one is an
//! error, as is using a barrier never initialized (or invalidated), initializing one twice,
//! more arrivals than a phase expects, a generic load or store of a barrier's word, and a
//! wait on a phase that cannot complete (arrivals or bytes outstanding when nothing in
//! flight can provide them).
//!
//! PTX: `mbarrier.init`, `mbarrier.arrive` and `mbarrier.inval` through their NVVM
//! intrinsics; `mbarrier.arrive.expect_tx` and `mbarrier.try_wait.parity` as inline PTX (the
//! wait in a loop of the emitter's own).
//!
//! [`Stmt::TmaLoad`]: crate::gpu::ir::Stmt::TmaLoad
//! [`Stmt::MbarInit`]: crate::gpu::ir::Stmt::MbarInit
//! [`Stmt::MbarArrive`]: crate::gpu::ir::Stmt::MbarArrive
//! [`Stmt::MbarWait`]: crate::gpu::ir::Stmt::MbarWait
//! [`SharedArray::mbarriers`]: crate::gpu::ir::SharedArray::mbarriers
//! [`Mbar`]: crate::gpu::ir::Mbar

use super::ir::*;
use crate::target::SumTree;
use kiln_ir::{DType, TensorType};

/// Threads of the [`rounds`] kernel's block.
const THREADS: usize = 128;

/// The most arrivals a phase may expect (`mbarrier.init`'s count is below 2^20).
pub const MAX_COUNT: usize = (1 << 20) - 1;

/// The kernel the mbarrier statements are tested with on their own: thread 0 initializes
/// barrier 0 of a shared array of one for `count` arrivals (128, the block, when right),
/// a block barrier publishes it, then `rounds` rounds in which every thread arrives and
/// waits on the round's parity (`r % 2`), adding 1 to a register each round; each thread
/// stores its count in output 0 (`i64[128]`), and thread 0 invalidates the barrier after a
/// last block barrier.
pub fn rounds(count: usize, rounds: usize, sums: SumTree) -> GpuKernel {
    let c = Sc::Const;
    let tid = Sc::Special(Special::Thread);
    let bar = Mbar {
        array: 0,
        index: c(0),
    };
    let (round, total, one) = (0, 1, 2);
    let body = vec![
        Stmt::If {
            cond: Sc::eq(tid.clone(), c(0)),
            body: vec![Stmt::MbarInit {
                bar: bar.clone(),
                count,
            }],
        },
        Stmt::Barrier,
        Stmt::Let {
            reg: total,
            value: c(0),
        },
        Stmt::For {
            reg: round,
            start: c(0),
            end: c(rounds as i64),
            step: c(1),
            body: vec![
                Stmt::MbarArrive {
                    bar: bar.clone(),
                    tx: 0,
                },
                Stmt::MbarWait {
                    bar: bar.clone(),
                    parity: Sc::modulo(Sc::Reg(round), c(2)),
                },
                Stmt::Let {
                    reg: total,
                    value: Sc::plus(Sc::Reg(total), c(1)),
                },
            ],
        },
        Stmt::Let {
            reg: one,
            value: Sc::Reg(total),
        },
        Stmt::Store {
            buf: Buf::Output(0),
            index: tid.clone(),
            value: one,
        },
        Stmt::Barrier,
        Stmt::If {
            cond: Sc::eq(tid, c(0)),
            body: vec![Stmt::MbarInval { bar }],
        },
    ];
    GpuKernel {
        tensor_maps: Vec::new(),
        name: format!("mbarrier_rounds_c{count}_r{rounds}"),
        kind: MapKind::Elementwise,
        grid: 1,
        block: THREADS,
        warp: 32,
        inputs: Vec::new(),
        outputs: vec![(
            Buf::Output(0),
            TensorType {
                dtype: DType::I64,
                shape: vec![THREADS],
            },
        )],
        shared: vec![SharedArray::mbarriers(1)],
        dynamic_shared: 0,
        regs: 3,
        vars: 0,
        sums,
        body,
    }
}
