//! The SPMD runner and the in-process communicator: results in process order, deterministic
//! reductions, and every way processes fail to meet is an error naming them, never a hang.

use kiln_ir::{Literal, parse_func_text};
use kiln_reference::spmd::{
    CommError, Communicator, Grid, LocalCommunicator, eval_grid, run_processes,
};
use std::sync::Arc;
use std::time::Duration;

fn f32s(v: &[f32]) -> Literal {
    Literal::f32([v.len()], v.to_vec()).unwrap()
}

const SUM: &str = "func @main(%0: f32[2]) -> f32[2] {
  %1 = all_reduce %0 {replica_groups = [[0, 1, 2]], channel_id = 0, use_global_device_ids = false, computation = func @sum(%0: f32[], %1: f32[]) -> f32[] {
      %2 = add %0, %1 : f32[]
      return %2
    }} : f32[2]
  return %1
}
";

/// A float sum whose value depends on the order: every process gets the group-order fold
/// `(a + b) + c`, bit for bit, every run.
#[test]
fn reductions_fold_in_group_order() {
    let f = parse_func_text(SUM).unwrap();
    // Element 0: (1 + 1e8) - 1e8 = 0 in f32 (1 + (1e8 - 1e8) would be 1); element 1:
    // (1e8 - 1e8) + 1 = 1.
    let args = [
        vec![f32s(&[1.0, 1e8])],
        vec![f32s(&[1e8, -1e8])],
        vec![f32s(&[-1e8, 1.0])],
    ];
    let want = [0.0f32, 1.0];
    for _ in 0..10 {
        let out = eval_grid(Grid::new(3, 1), &[&f, &f, &f], &args).unwrap();
        for r in &out {
            assert_eq!(r[0].as_f32s().unwrap(), want);
        }
    }
}

/// A process whose program fails makes `run_processes` report it by name, and its peers
/// stop waiting.
#[test]
fn a_failing_process_is_named_and_its_peers_stop() {
    let comm = Arc::new(LocalCommunicator::new(Grid::new(2, 1)));
    let c2 = comm.clone();
    let e = run_processes(comm, move |p| {
        if p.replica == 1 {
            return Err("out of memory".to_string());
        }
        c2.exchange(0, 0, "all_reduce", &[0, 1], vec![f32s(&[1.0])])
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .unwrap_err();
    assert_eq!(e, "process (1, 0): out of memory");
}

/// A process that panics counts as failed: its peer stops waiting at once (well before the
/// 60-second limit) and the error names the panicking process.
#[test]
fn a_panicking_process_is_a_failure_its_peers_see() {
    let comm = Arc::new(LocalCommunicator::new(Grid::new(2, 1)));
    let c2 = comm.clone();
    let t = std::time::Instant::now();
    let e = run_processes(comm, move |p| {
        if p.replica == 1 {
            panic!("index out of bounds");
        }
        c2.exchange(0, 0, "all_reduce", &[0, 1], vec![f32s(&[1.0])])
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .unwrap_err();
    assert_eq!(e, "process (1, 0): panicked: index out of bounds");
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// Two processes running different ops as the same collective, a process that finishes
/// without joining, a process that joins another group, and a wait past the timeout.
#[test]
fn processes_that_do_not_meet_fail_with_both_named() {
    let mismatch = |what1: &'static str, group1: Vec<usize>, finish: bool| -> String {
        let comm = Arc::new(
            LocalCommunicator::new(Grid::new(3, 1)).with_timeout(Duration::from_millis(300)),
        );
        let c = comm.clone();
        run_processes(comm, move |p| {
            let me = p.replica;
            let (what, group) = match me {
                0 => ("all_reduce", vec![0, 1]),
                1 if finish => return Ok(()),
                1 => (what1, group1.clone()),
                // Process 2 meets process 1 where that is its group: then the two
                // complete without process 0, which must name the other group, whichever
                // of them finishes first.
                2 if group1.contains(&2) => (what1, group1.clone()),
                _ => return Ok(()),
            };
            c.exchange(me, 0, what, &group, vec![f32s(&[1.0])])
                .map(|_| ())
                .map_err(|e: CommError| e.to_string())
        })
        .unwrap_err()
    };
    let e = mismatch("all_gather", vec![0, 1], false);
    assert!(e.contains("all_gather") && e.contains("all_reduce"), "{e}");
    let e = mismatch("all_reduce", vec![0, 1], true);
    assert!(
        e.contains("process (1, 0) finished without joining all_reduce"),
        "{e}"
    );
    let e = mismatch("all_reduce", vec![1, 2], false);
    assert!(e.contains("another group"), "{e}");
    // Process 2 never joins {1, 2} and never finishes within the limit: the timeout names it.
    let comm =
        Arc::new(LocalCommunicator::new(Grid::new(3, 1)).with_timeout(Duration::from_millis(200)));
    let c = comm.clone();
    let e = run_processes(comm, move |p| {
        if p.replica == 2 {
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(());
        }
        let group = if p.replica == 0 { vec![0] } else { vec![1, 2] };
        c.exchange(p.replica, 0, "all_reduce", &group, vec![f32s(&[1.0])])
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .unwrap_err();
    assert!(e.contains("waited") && e.contains("(2, 0)"), "{e}");
}

/// Outside a grid a program is the one process of a 1 x 1 grid; a group naming another
/// replica is an error citing the op's label, not a hang.
#[test]
fn outside_a_grid_the_program_is_one_process() {
    let f = parse_func_text(SUM).unwrap();
    let e = kiln_reference::eval(&f, &[f32s(&[1.0, 2.0])]).unwrap_err();
    assert!(e.to_string().contains("all_reduce_c1"), "{e}");
    let id =
        parse_func_text("func @main() -> u32[] {\n  %0 = replica_id : u32[]\n  return %0\n}\n")
            .unwrap();
    assert_eq!(kiln_reference::eval(&id, &[]).unwrap()[0].to_i64s(), [0]);
}

/// The wrong number of functions or argument lists for the grid.
#[test]
fn a_grid_needs_one_program_per_process() {
    let f = parse_func_text(SUM).unwrap();
    let e = eval_grid(Grid::new(2, 1), &[&f], &[vec![f32s(&[1.0, 2.0])]]).unwrap_err();
    assert!(e.to_string().contains("needs 2 function(s)"), "{e}");
}
