//! The GPU emulator's own checks on planted kernels: a race on shared memory, a barrier that
//! part of a block reaches, accesses out of bounds, and shuffles that need the whole warp.

use kiln_ir::{Combiner, DType, TensorType};
use kiln_kernel::gpu::ir::*;
use kiln_kernel::ir::Expr;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, V, run_kernel};

/// A launch of one block of `threads` threads (warps of 32) running `body`, with one f32
/// input of 4 elements, one output of 64 and two registers.
fn launch(threads: usize, shared: usize, body: Vec<Stmt>) -> GpuKernel {
    let t = |n| TensorType {
        dtype: DType::F32,
        shape: vec![n],
    };
    GpuKernel {
        tensor_maps: Vec::new(),
        dynamic_shared: 0,
        name: "planted".into(),
        kind: MapKind::Elementwise,
        grid: 1,
        block: threads,
        warp: 32,
        inputs: vec![(Buf::Input(0), t(4))],
        outputs: vec![(Buf::Output(0), t(64))],
        shared: vec![SharedArray {
            dtype: DType::F32,
            len: shared,
            packed: false,
            swizzle: None,
        }],
        regs: 2,
        vars: 1,
        sums: TargetInfo::h200().sums,
        body,
    }
}

fn run(k: &GpuKernel) -> Result<Vec<V>, String> {
    let input = Buffer {
        name: "%in".into(),
        dtype: DType::F32,
        data: vec![V::F(1.0); 4],
    };
    let mut out = vec![Buffer::zeros("%out", &k.outputs[0].1)];
    run_kernel(k, &[&input], &mut out).map_err(|e| e.to_string())?;
    Ok(out.pop().unwrap().data)
}

fn tid() -> Sc {
    Sc::Special(Special::Thread)
}

#[test]
fn two_threads_writing_one_shared_address_without_a_barrier_race() {
    let set = Stmt::Identity {
        reg: 0,
        kind: Combiner::Add,
        dtype: DType::F32,
    };
    // Every thread writes shared0[tid / 2]: threads 0 and 1 meet at element 0.
    let k = launch(
        64,
        32,
        vec![
            set.clone(),
            Stmt::SharedStore {
                array: 0,
                index: Sc::quot(tid(), Sc::Const(2)),
                value: 0,
            },
        ],
    );
    let e = run(&k).unwrap_err();
    assert!(e.contains("race") && e.contains("shared0[0]"), "{e}");
    assert!(
        e.contains("thread 1") && e.contains("thread 0") && e.contains("planted"),
        "{e}"
    );
    // A write, then a read of another thread's element in the same phase, races too; with a
    // barrier between them it does not.
    let read_other = |barrier: bool| {
        let mut body = vec![
            set.clone(),
            Stmt::SharedStore {
                array: 0,
                index: tid(),
                value: 0,
            },
        ];
        if barrier {
            body.push(Stmt::Barrier);
        }
        body.push(Stmt::SharedLoad {
            reg: 1,
            array: 0,
            index: Sc::modulo(Sc::plus(tid(), Sc::Const(1)), Sc::Const(32)),
        });
        launch(32, 32, body)
    };
    assert!(run(&read_other(false)).unwrap_err().contains("race"));
    run(&read_other(true)).unwrap();
}

#[test]
fn a_barrier_reached_by_part_of_the_block_is_an_error() {
    let k = launch(
        64,
        1,
        vec![Stmt::If {
            cond: Sc::lt(tid(), Sc::Const(32)),
            body: vec![Stmt::Barrier],
        }],
    );
    let e = run(&k).unwrap_err();
    assert!(
        e.contains("barrier reached by 32 of the block's 64 threads"),
        "{e}"
    );
}

#[test]
fn reads_and_writes_out_of_bounds_are_errors() {
    let read = launch(
        32,
        1,
        vec![Stmt::Eval {
            reg: 0,
            expr: Expr::Load {
                input: 0,
                dtype: DType::F32,
                coef: vec![],
                off: 4,
            },
            scalars: vec![],
        }],
    );
    let e = run(&read).unwrap_err();
    assert!(
        e.contains("out-of-bounds read") && e.contains("%in index 4 of 4"),
        "{e}"
    );
    let write = launch(
        32,
        1,
        vec![
            Stmt::Identity {
                reg: 0,
                kind: Combiner::Add,
                dtype: DType::F32,
            },
            Stmt::Store {
                buf: Buf::Output(0),
                index: Sc::plus(tid(), Sc::Const(40)),
                value: 0,
            },
        ],
    );
    let e = run(&write).unwrap_err();
    assert!(e.contains("%out index 64 of 64"), "{e}");
    let shared = launch(
        32,
        8,
        vec![Stmt::SharedLoad {
            reg: 0,
            array: 0,
            index: tid(),
        }],
    );
    let e = run(&shared).unwrap_err();
    assert!(e.contains("shared0 index 8 of 8"), "{e}");
}

#[test]
fn shuffles_read_the_other_lanes_and_need_the_whole_warp() {
    // r0 = tid; r1 = r0 of lane ^ 1 (or lane + 4, its own past the warp's end), stored at
    // tid.
    let shuffled = |cond: Sc, mode: Shuffle| {
        vec![
            Stmt::Let {
                reg: 0,
                value: tid(),
            },
            Stmt::If {
                cond,
                body: vec![Stmt::Shuffle {
                    reg: 1,
                    src: 0,
                    mode,
                }],
            },
            Stmt::Store {
                buf: Buf::Output(0),
                index: tid(),
                value: 1,
            },
        ]
    };
    let out = run(&launch(64, 1, shuffled(Sc::Const(1), Shuffle::Xor(1)))).unwrap();
    assert_eq!(out[5], V::F(4.0));
    assert_eq!(out[40], V::F(41.0));
    let out = run(&launch(64, 1, shuffled(Sc::Const(1), Shuffle::Down(4)))).unwrap();
    assert_eq!(
        (out[3], out[27], out[30], out[61]),
        (V::F(7.0), V::F(31.0), V::F(30.0), V::F(61.0))
    );
    let partial = shuffled(Sc::lt(tid(), Sc::Const(16)), Shuffle::Xor(1));
    let e = run(&launch(64, 1, partial)).unwrap_err();
    assert!(e.contains("shuffle by 16 of the 32 lanes of warp 0"), "{e}");
}
