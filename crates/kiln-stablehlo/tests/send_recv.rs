//! `stablehlo.send` and `stablehlo.recv`: in an interpreter test's function a send's tensors
//! are outputs and a recv's are parameters, each recorded with its channel; a grid's
//! [`Channels`] hands what was sent on a channel to its receivers in order, and a recv that
//! nothing can match is an error naming it, not a hang. Where they cannot be read they are
//! located errors. (The peer suite runs `send_recv.mlir` on both backends through them.)

use kiln_ir::{DType, Literal, TensorType};
use kiln_stablehlo::channel::{Channels, Transfer, sent};
use kiln_stablehlo::{ErrorKind, Piece, Pos, parse_with_checks};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod located;
use located::fails;

fn i64s(v: &[i64]) -> Literal {
    Literal::from_i64s(TensorType::new(DType::I64, vec![v.len()]), v).unwrap()
}

fn ty(n: usize) -> TensorType {
    TensorType::new(DType::I64, vec![n])
}

const PROGRAMS: &str = "func.func @relay(%x: tensor<2xi64>, %t: !stablehlo.token) -> (tensor<2xi64>, !stablehlo.token) {
  %r:2 = \"stablehlo.recv\"(%t) {
    channel_handle = #stablehlo.channel_handle<handle = 1, type = 3>, is_host_transfer = true
  } : (!stablehlo.token) -> (tensor<2xi64>, !stablehlo.token)
  %s = stablehlo.add %x, %r#0 : tensor<2xi64>
  %u = \"stablehlo.send\"(%s, %x, %r#1) {
    channel_handle = #stablehlo.channel_handle<handle = 2, type = 2>, is_host_transfer = true
  } : (tensor<2xi64>, tensor<2xi64>, !stablehlo.token) -> !stablehlo.token
  func.return %s, %u : tensor<2xi64>, !stablehlo.token
}";

#[test]
fn send_is_outputs_and_recv_is_parameters_with_their_channels() {
    let m = parse_with_checks(Piece {
        text: PROGRAMS,
        first_line: 1,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let (f, c) = (&m.module.funcs[0], &m.checks[0]);
    // Own parameter %x, then the recv's tensor; own output %s, then the send's two tensors.
    assert_eq!((f.params.len(), f.outputs.len(), c.outputs), (2, 3, 1));
    assert_eq!(
        c.recvs,
        [Transfer {
            channel: 1,
            pos: Pos {
                line: 2,
                column: 10
            },
            values: 1..2,
            types: vec![ty(2)],
        }]
    );
    assert_eq!(
        c.sends,
        [Transfer {
            channel: 2,
            pos: Pos { line: 6, column: 8 },
            values: 1..3,
            types: vec![ty(2), ty(2)],
        }]
    );
    let out = kiln_reference::eval(f, &[i64s(&[1, 2]), i64s(&[10, 20])]).unwrap();
    assert_eq!(
        sent(&c.sends, &out),
        [(2, vec![i64s(&[11, 22]), i64s(&[1, 2])])]
    );
}

/// A recv of one `i64[2]` on `channel` at line `line`.
fn recv(channel: i64, line: u32) -> Transfer {
    Transfer {
        channel,
        pos: Pos { line, column: 3 },
        values: 0..1,
        types: vec![ty(2)],
    }
}

#[test]
fn channels_deliver_in_order_to_a_waiting_receiver() {
    let ch = Arc::new(Channels::new(2, Duration::from_secs(60)));
    let receiver = {
        let ch = ch.clone();
        std::thread::spawn(move || ch.receive("r", &[recv(1, 4), recv(1, 5)]))
    };
    // The sender finishes after the receiver may have started waiting.
    std::thread::sleep(Duration::from_millis(20));
    ch.finish(vec![(1, vec![i64s(&[1, 2])]), (1, vec![i64s(&[3, 4])])]);
    let got = receiver.join().unwrap().unwrap();
    assert_eq!(got, [vec![i64s(&[1, 2])], vec![i64s(&[3, 4])]]);
    ch.finish(Vec::new());
}

#[test]
fn a_receiver_with_a_value_to_take_is_waited_for() {
    // The last process waits on channel 2, which the relay sends on once it has received on
    // channel 1; when the first process sends on 1 and finishes, no process runs, but the
    // relay has a value to take: the last process must wait for it.
    for _ in 0..20 {
        let ch = Arc::new(Channels::new(3, Duration::from_secs(60)));
        let last = {
            let ch = ch.clone();
            std::thread::spawn(move || {
                let r = ch.receive("last", &[recv(2, 1)]);
                ch.finish(Vec::new());
                r
            })
        };
        let relay = {
            let ch = ch.clone();
            std::thread::spawn(move || {
                let r = ch.receive("relay", &[recv(1, 2)]);
                match &r {
                    Ok(got) => ch.finish(vec![(2, got[0].clone())]),
                    Err(_) => ch.fail(),
                }
                r
            })
        };
        std::thread::sleep(Duration::from_millis(2));
        ch.finish(vec![(1, vec![i64s(&[5, 6])])]);
        assert_eq!(relay.join().unwrap().unwrap(), [vec![i64s(&[5, 6])]]);
        assert_eq!(last.join().unwrap().unwrap(), [vec![i64s(&[5, 6])]]);
    }
}

#[test]
fn a_recv_after_a_failed_process_says_so() {
    let ch = Channels::new(2, Duration::from_secs(60));
    ch.fail();
    let e = ch.receive("r", &[recv(3, 4)]).unwrap_err();
    assert_eq!(
        e,
        "another process failed, so `stablehlo.recv` of @r on channel 3 at 4:3 gets nothing"
    );
}

#[test]
fn a_recv_nothing_can_match_fails_naming_it_without_waiting() {
    // The other process sends on another channel and finishes: channel 7 gets nothing.
    let ch = Arc::new(Channels::new(2, Duration::from_secs(60)));
    let start = Instant::now();
    let receiver = {
        let ch = ch.clone();
        std::thread::spawn(move || ch.receive("r", &[recv(7, 12)]))
    };
    ch.finish(vec![(1, vec![i64s(&[1, 2])])]);
    let e = receiver.join().unwrap().unwrap_err();
    assert!(
        e.starts_with("12:3: `stablehlo.recv` of @r on channel 7 has no matching `stablehlo.send`"),
        "{e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "it waited for the timeout"
    );

    // Two processes that each wait to receive before they send: neither can go on.
    let ch = Arc::new(Channels::new(2, Duration::from_secs(60)));
    let waiters: Vec<_> = [(1, 3), (2, 9)]
        .into_iter()
        .map(|(c, line)| {
            let ch = ch.clone();
            std::thread::spawn(move || {
                let r = ch.receive("p", &[recv(c, line)]);
                ch.finish(Vec::new());
                r
            })
        })
        .collect();
    for w in waiters {
        let e = w.join().unwrap().unwrap_err();
        assert!(e.contains("has no matching `stablehlo.send`"), "{e}");
    }
}

#[test]
fn a_recv_of_other_types_than_sent_fails_naming_it() {
    let ch = Channels::new(2, Duration::from_secs(60));
    ch.finish(vec![(1, vec![i64s(&[1, 2, 3])])]);
    let e = ch.receive("r", &[recv(1, 8)]).unwrap_err();
    assert_eq!(
        e,
        "8:3: `stablehlo.recv` of @r on channel 1 reads (tensor<2xi64>), but the send gave (tensor<3xi64>)"
    );
}

#[test]
fn send_and_recv_where_they_cannot_be_read_are_located_errors() {
    // Without checks (an ordinary import) there is no grid to route them.
    fails(
        PROGRAMS,
        ErrorKind::Unsupported,
        "2:10",
        "`stablehlo.recv` here (read by `parse_with_checks`, in a function's own body only)",
    );
    let with_checks = |text: &str| {
        parse_with_checks(Piece {
            text,
            first_line: 1,
        })
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let e = with_checks(
        "func.func @f(%x: tensor<2xi64>, %t: !stablehlo.token) -> !stablehlo.token {
  %u = \"stablehlo.send\"(%x, %t) {is_host_transfer = true} : (tensor<2xi64>, !stablehlo.token) -> !stablehlo.token
  func.return %u : !stablehlo.token
}",
    );
    assert!(
        e.starts_with("2:8: ") && e.contains("`stablehlo.send` needs a `channel_handle`"),
        "{e}"
    );
    let e = with_checks(
        "func.func @f(%x: tensor<2xi64>, %t: !stablehlo.token) -> !stablehlo.token {
  %u = \"stablehlo.send\"(%x, %t) {
    channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
    source_target_pairs = dense<[[0, 1]]> : tensor<1x2xi64>
  } : (tensor<2xi64>, !stablehlo.token) -> !stablehlo.token
  func.return %u : !stablehlo.token
}",
    );
    assert!(
        e.starts_with("4:") && e.contains("`source_target_pairs` of `stablehlo.send`"),
        "{e}"
    );
    let e = with_checks(
        "func.func @f(%x: tensor<2xi64>) -> !stablehlo.token {
  %u = \"stablehlo.send\"(%x, %x) {
    channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>
  } : (tensor<2xi64>, tensor<2xi64>) -> !stablehlo.token
  func.return %u : !stablehlo.token
}",
    );
    assert!(
        e.starts_with("2:") && e.contains("the last operand of `stablehlo.send` must be a token"),
        "{e}"
    );
}
