//! The collective ops in StableHLO's forms: every attribute read (padded `replica_groups`,
//! `channel_handle`, the unit `use_global_device_ids`, the pretty `replica_id`), exported by
//! `to_text` and read back to the same kiln IR, and run on a grid of the reference
//! interpreter; `collective_reduce`'s `has_dynamic_root` is a located `unsupported` error.

use kiln_ir::{Literal, Op, print_module};
use kiln_reference::spmd::{Grid, eval_grid};
use kiln_stablehlo::{ErrorKind, parse, to_text};

const MODULE: &str = r#"
func.func @main(%x: tensor<2x2xi64>) -> (tensor<2x4xi64>, tensor<2x2xi64>, tensor<4x1xi64>, tensor<2x1xi64>, tensor<2x2xi64>, tensor<2x2xi64>, tensor<2x2xi64>, tensor<ui32>, tensor<ui32>) {
  %g = "stablehlo.all_gather"(%x) {
    all_gather_dim = 1 : i64,
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
    use_global_device_ids
  } : (tensor<2x2xi64>) -> tensor<2x4xi64>
  %r = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<i64>, %b: tensor<i64>):
      %s = stablehlo.add %a, %b : tensor<i64>
      stablehlo.return %s : tensor<i64>
  }) {
    replica_groups = dense<[[0, 1], [2, -1]]> : tensor<2x2xi64>
  } : (tensor<2x2xi64>) -> tensor<2x2xi64>
  %t = "stablehlo.all_to_all"(%x) {
    split_dimension = 1 : i64, concat_dimension = 0 : i64, split_count = 2 : i64,
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>
  } : (tensor<2x2xi64>) -> tensor<4x1xi64>
  %c = "stablehlo.reduce_scatter"(%x) ({
    ^bb0(%a: tensor<i64>, %b: tensor<i64>):
      %s = stablehlo.maximum %a, %b : tensor<i64>
      stablehlo.return %s : tensor<i64>
  }) {
    scatter_dimension = 1 : i64,
    replica_groups = dense<[[1, 0]]> : tensor<1x2xi64>
  } : (tensor<2x2xi64>) -> tensor<2x1xi64>
  %p = "stablehlo.collective_permute"(%x) {
    source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>
  } : (tensor<2x2xi64>) -> tensor<2x2xi64>
  %b = "stablehlo.collective_broadcast"(%x) {
    replica_groups = dense<[[1, 0]]> : tensor<1x2xi64>
  } : (tensor<2x2xi64>) -> tensor<2x2xi64>
  %d = "stablehlo.collective_reduce"(%x) ({
    ^bb0(%a: tensor<i64>, %b: tensor<i64>):
      %s = stablehlo.add %a, %b : tensor<i64>
      stablehlo.return %s : tensor<i64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>
  } : (tensor<2x2xi64>) -> tensor<2x2xi64>
  %i = stablehlo.replica_id : tensor<ui32>
  %j = "stablehlo.partition_id"() : () -> tensor<ui32>
  func.return %g, %r, %t, %c, %p, %b, %d, %i, %j : tensor<2x4xi64>, tensor<2x2xi64>, tensor<4x1xi64>, tensor<2x1xi64>, tensor<2x2xi64>, tensor<2x2xi64>, tensor<2x2xi64>, tensor<ui32>, tensor<ui32>
}
"#;

fn i64s(shape: &[usize], v: &[i64]) -> Literal {
    Literal::from_i64s(
        kiln_ir::TensorType::new(kiln_ir::DType::I64, shape.to_vec()),
        v,
    )
    .unwrap()
}

#[test]
fn collectives_import_with_their_attributes() {
    let m = parse(MODULE).unwrap_or_else(|e| panic!("{e}"));
    let ops: Vec<&Op> = m.funcs[0].insts.iter().map(|i| &i.op).collect();
    assert!(matches!(
        ops[0],
        Op::AllGather { all_gather_dim: 1, replica_groups, channel_id: 1, use_global_device_ids: true }
            if *replica_groups == [vec![0, 1]]
    ));
    assert!(matches!(
        ops[1],
        Op::AllReduce { replica_groups, channel_id: 0, use_global_device_ids: false, .. }
            if *replica_groups == [vec![0, 1], vec![2]]
    ));
    assert!(matches!(
        ops[4],
        Op::CollectivePermute { source_target_pairs, channel_id: 0 }
            if *source_target_pairs == [(0, 1), (1, 0)]
    ));
    assert!(matches!(ops[7], Op::ReplicaId {}));
    assert!(matches!(ops[8], Op::PartitionId {}));
}

#[test]
fn collectives_export_and_read_back() {
    let m = parse(MODULE).unwrap();
    let text = to_text(&m).unwrap_or_else(|e| panic!("{e}"));
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_module(&back), print_module(&m), "{text}");
}

/// The module on a 3 x 1 grid (the `all_reduce` groups `[0, 1]` and `[2]`) after a round
/// trip through `to_text`, against values worked out by hand — on the processes of the
/// groups every op names (the others of a 3-replica grid are in no group of `all_gather`, so
/// the run is an error naming `all_gather_c2`).
#[test]
fn collectives_run_on_a_grid_after_a_round_trip() {
    let m = parse(&to_text(&parse(MODULE).unwrap()).unwrap()).unwrap();
    let f = &m.funcs[0];
    let x0 = i64s(&[2, 2], &[1, 2, 3, 4]);
    let x1 = i64s(&[2, 2], &[5, 6, 7, 8]);
    let x2 = i64s(&[2, 2], &[9, 9, 9, 9]);
    let e = eval_grid(
        Grid::new(3, 1),
        &[f, f, f],
        &[vec![x0.clone()], vec![x1.clone()], vec![x2]],
    )
    .unwrap_err();
    assert!(e.to_string().contains("all_gather_c2"), "{e}");
    // On two replicas the `[2]` group of all_reduce names a replica past the grid.
    let e = eval_grid(
        Grid::new(2, 1),
        &[f, f],
        &[vec![x0.clone()], vec![x1.clone()]],
    )
    .unwrap_err();
    assert!(e.to_string().contains("all_reduce_c1"), "{e}");
}

/// The module with one `all_reduce` group on two replicas, after a round trip, against
/// values worked out by hand.
#[test]
fn collectives_compute_on_two_replicas_after_a_round_trip() {
    let text = MODULE.replace(
        "dense<[[0, 1], [2, -1]]> : tensor<2x2xi64>",
        "dense<[[0, 1]]> : tensor<1x2xi64>",
    );
    let m = parse(&to_text(&parse(&text).unwrap()).unwrap()).unwrap();
    let f = &m.funcs[0];
    let x0 = i64s(&[2, 2], &[1, 2, 3, 4]);
    let x1 = i64s(&[2, 2], &[5, 6, 7, 8]);
    let out = eval_grid(
        Grid::new(2, 1),
        &[f, f],
        &[vec![x0.clone()], vec![x1.clone()]],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ints = |l: &Literal| l.to_i64s();
    let want: [[Vec<i64>; 9]; 2] = [
        [
            vec![1, 2, 5, 6, 3, 4, 7, 8],
            vec![6, 8, 10, 12],
            vec![1, 3, 5, 7],
            vec![6, 8],
            vec![5, 6, 7, 8],
            vec![5, 6, 7, 8],
            vec![6, 8, 10, 12],
            vec![0],
            vec![0],
        ],
        [
            vec![1, 2, 5, 6, 3, 4, 7, 8],
            vec![6, 8, 10, 12],
            vec![2, 4, 6, 8],
            vec![5, 7],
            vec![1, 2, 3, 4],
            vec![5, 6, 7, 8],
            vec![0, 0, 0, 0],
            vec![1],
            vec![0],
        ],
    ];
    for (p, (got, want)) in out.iter().zip(&want).enumerate() {
        let got: Vec<Vec<i64>> = got.iter().map(ints).collect();
        assert_eq!(got, want.to_vec(), "replica {p}");
    }
}

#[test]
fn a_dynamic_root_is_unsupported() {
    let text = r#"
func.func @main(%x: tensor<2xi64>, %r: tensor<1xi32>) -> tensor<2xi64> {
  %b = "stablehlo.collective_reduce"(%x, %r) ({
    ^bb0(%a: tensor<i64>, %c: tensor<i64>):
      %s = stablehlo.add %a, %c : tensor<i64>
      stablehlo.return %s : tensor<i64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    has_dynamic_root
  } : (tensor<2xi64>, tensor<1xi32>) -> tensor<2xi64>
  func.return %b : tensor<2xi64>
}
"#;
    let e = parse(text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("has_dynamic_root"), "{e}");
}
