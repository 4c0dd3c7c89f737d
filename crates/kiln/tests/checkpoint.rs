//! Checkpoints: bit-identical resumption, truncated and corrupt files, mismatch reports, and a
//! file written by PyTorch.

use kiln::checkpoint::{self, Metadata, TrainState};
use kiln::nn::{Linear, Mlp, cross_entropy};
use kiln::optim::{Adam, AdamState, Sgd, SgdState};
use kiln::random::{self, Key, normal, split};
use kiln::{DType, Result, Tensor, Tree, jit, value_and_grad};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-ckpt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bits(tree: &impl Tree) -> Vec<(String, Vec<u8>)> {
    tree.leaf_name_vec()
        .into_iter()
        .zip(tree.leaf_vec())
        .map(|(n, t)| (n, t.to_literal().unwrap().to_le_bytes()))
        .collect()
}

/// Generated classification data: x [32, 4] normal, y = argmax-ish labels in 0..3.
fn data() -> (Tensor, Tensor) {
    let ks = split(&random::key(11), 2);
    let x = normal(&ks[0], &[32, 4], DType::F32);
    let y = Tensor::from_vec((0..32i32).map(|i| i * 7 % 3).collect(), [32]).unwrap();
    (x, y)
}

type Args<S> = (Mlp, S, Key, Tensor, Tensor);

/// One step: the key is split, half of it perturbs the inputs (so the key's state matters),
/// the other half is carried to the next step.
fn loss_and_grads(m: &Mlp, k: &Key, x: &Tensor, y: &Tensor) -> Result<(Tensor, Mlp, Key)> {
    let ks = split(k, 2);
    let noisy = x + &(&normal(&ks[1], &x.shape(), DType::F32) * 0.05);
    let (l, g) = value_and_grad(|m: &Mlp| cross_entropy(&m.forward(&noisy), y), m)?;
    Ok((l, g, ks[0].clone()))
}

fn adam_step(
    opt: &Adam,
    (m, s, k, x, y): &Args<AdamState<Mlp>>,
) -> Result<(Mlp, AdamState<Mlp>, Key, Tensor)> {
    let (l, g, k) = loss_and_grads(m, k, x, y)?;
    let (m, s) = opt.update(m, &g, s)?;
    Ok((m, s, k, l))
}

fn sgd_step(
    opt: &Sgd,
    (m, s, k, x, y): &Args<SgdState<Mlp>>,
) -> Result<(Mlp, SgdState<Mlp>, Key, Tensor)> {
    let (l, g, k) = loss_and_grads(m, k, x, y)?;
    let (m, s) = opt.update(m, &g, s)?;
    Ok((m, s, k, l))
}

#[test]
fn resuming_adam_from_a_checkpoint_is_bit_identical() {
    let (x, y) = data();
    let opt = Adam::new(0.05);
    let step = jit(|a: &Args<AdamState<Mlp>>| adam_step(&opt, a));
    let model = Mlp::new(&random::key(3), &[4, 16, 3], DType::F32);
    let start = TrainState {
        opt_state: opt.init(&model),
        params: model,
        key: random::key(5),
        step: 0,
    };
    let run = |mut s: TrainState<Mlp, AdamState<Mlp>>, n: usize| {
        for _ in 0..n {
            let (m, o, k, _l) = step
                .call(&(s.params, s.opt_state, s.key, x.clone(), y.clone()))
                .unwrap()
                .unwrap();
            s = TrainState {
                params: m,
                opt_state: o,
                key: k,
                step: s.step + 1,
            };
        }
        s
    };
    let straight = run(start.clone(), 6);

    let half = run(start.clone(), 3);
    let dir = tmp_dir("resume-adam");
    let path = dir.join("half.safetensors");
    let user = BTreeMap::from([("note".to_string(), "halfway".to_string())]);
    half.save(&path, &user).unwrap();
    // The template's values are not used: a differently initialized model of the same shape.
    let other = Mlp::new(&random::key(99), &[4, 16, 3], DType::F32);
    let template = TrainState {
        opt_state: opt.init(&other),
        params: other,
        key: random::key(0),
        step: 0,
    };
    let (loaded, meta) = TrainState::load(&path, &template).unwrap();
    assert_eq!(meta.step, 3);
    assert_eq!(loaded.step, 3);
    assert_eq!(meta.user["note"], "halfway");
    assert_eq!(meta.format_version, checkpoint::FORMAT_VERSION);
    assert_eq!(meta.kiln_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(bits(&loaded), bits(&half));
    let resumed = run(loaded, 3);

    assert_eq!(resumed.step, 6);
    let (a, b) = (bits(&straight), bits(&resumed));
    assert_eq!(a.len(), b.len());
    for ((na, ba), (nb, bb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(ba, bb, "leaf {na} differs after resuming");
    }
    // And training did move the parameters.
    assert_ne!(bits(&straight.params), bits(&start.params));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resuming_sgd_with_momentum_is_bit_identical() {
    let (x, y) = data();
    let opt = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.1)
    };
    let step = jit(|a: &Args<SgdState<Mlp>>| sgd_step(&opt, a));
    let model = Mlp::new(&random::key(4), &[4, 8, 3], DType::F32);
    let run = |mut s: TrainState<Mlp, SgdState<Mlp>>, n: usize| {
        for _ in 0..n {
            let (m, o, k, _) = step
                .call(&(s.params, s.opt_state, s.key, x.clone(), y.clone()))
                .unwrap()
                .unwrap();
            s = TrainState {
                params: m,
                opt_state: o,
                key: k,
                step: s.step + 1,
            };
        }
        s
    };
    let start = TrainState {
        opt_state: opt.init(&model),
        params: model,
        key: random::key(8),
        step: 0,
    };
    let straight = run(start.clone(), 5);
    let dir = tmp_dir("resume-sgd");
    let path = dir.join("sgd.safetensors");
    run(start.clone(), 2).save(&path, &BTreeMap::new()).unwrap();
    let (loaded, _) = TrainState::load(&path, &start).unwrap();
    assert_eq!(loaded.step, 2);
    assert_eq!(bits(&run(loaded, 3)), bits(&straight));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn leaves_are_named_by_their_paths_in_the_file() {
    let model = Mlp::new(&random::key(3), &[2, 3, 1], DType::F32);
    let opt = Adam::new(0.1);
    let state = TrainState {
        opt_state: opt.init(&model),
        params: model,
        key: random::key(1),
        step: 4,
    };
    let names = state.leaf_name_vec();
    assert_eq!(
        names,
        [
            "params.layers.0.weight",
            "params.layers.0.bias",
            "params.layers.1.weight",
            "params.layers.1.bias",
            "opt_state.m.layers.0.weight",
            "opt_state.m.layers.0.bias",
            "opt_state.m.layers.1.weight",
            "opt_state.m.layers.1.bias",
            "opt_state.v.layers.0.weight",
            "opt_state.v.layers.0.bias",
            "opt_state.v.layers.1.weight",
            "opt_state.v.layers.1.bias",
            "opt_state.step",
            "key",
        ]
    );
    let bytes = checkpoint::to_bytes(&state, &Metadata::new(4)).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert!(n > 0);
    let mut in_file: Vec<String> = meta.tensors().keys().cloned().collect();
    in_file.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(in_file, expected);
    let kiln_meta: serde_json::Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["kiln"]).unwrap();
    assert_eq!(kiln_meta["step"], 4);
    assert_eq!(kiln_meta["format_version"], checkpoint::FORMAT_VERSION);
}

fn small_tree() -> (Linear, Tensor) {
    (
        Linear::new(&random::key(2), 3, 2, DType::F32),
        Tensor::scalar(9i64),
    )
}

#[test]
fn a_truncated_checkpoint_is_refused_at_every_byte() {
    let tree = small_tree();
    let bytes = checkpoint::to_bytes(&tree, &Metadata::new(1)).unwrap();
    assert!(checkpoint::from_bytes(&bytes, &tree).is_ok());
    for cut in 0..bytes.len() {
        let e = match checkpoint::from_bytes(&bytes[..cut], &tree) {
            Ok(_) => panic!("a checkpoint cut at byte {cut} of {} loaded", bytes.len()),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("truncated or corrupt"),
            "cut at {cut}: unclear error: {e}"
        );
    }
    // Through a file, too.
    let dir = tmp_dir("truncated");
    let path = dir.join("cut.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let e = checkpoint::load(&path, &tree).unwrap_err().to_string();
    assert!(
        e.contains("cut.safetensors") && e.contains("truncated or corrupt"),
        "{e}"
    );
    let e = checkpoint::load(dir.join("absent.safetensors"), &tree)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("absent.safetensors") && e.contains("cannot read"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_bytes_give_errors_not_panics() {
    let tree = small_tree();
    let bytes = checkpoint::to_bytes(&tree, &Metadata::new(1)).unwrap();
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            let r = checkpoint::from_bytes(&b, &tree);
            // A flipped byte of tensor data is caught by the CRC; one in the header may still
            // be valid JSON (a digit of the step, say), but must never panic.
            if i >= header_end {
                let e = r
                    .err()
                    .unwrap_or_else(|| panic!("data byte {i} ^ {flip:#x} loaded"));
                assert!(e.to_string().contains("CRC-32"), "{e}");
            }
        }
    }
    // Garbage and an empty file.
    assert!(checkpoint::from_bytes(&[], &tree).is_err());
    assert!(checkpoint::from_bytes(&[0xff; 64], &tree).is_err());
    assert!(checkpoint::from_bytes(b"not a checkpoint at all", &tree).is_err());
}

#[derive(Clone, kiln::Tree)]
struct Target {
    weight: Tensor,
    bias: Tensor,
    count: Tensor,
    table: Tensor,
}

fn target() -> Target {
    Target {
        weight: Tensor::zeros(DType::F32, [2, 3]),
        bias: Tensor::zeros(DType::F32, [3]),
        count: Tensor::zeros(DType::I64, []),
        table: Tensor::zeros(DType::F32, [4]),
    }
}

/// Saves the named tensors (a map, through a Vec of (name, tensor) leaves named by index, so
/// the file's names are written by hand).
fn file_with(tensors: &[(&str, Tensor)]) -> Vec<u8> {
    #[derive(Clone)]
    struct Named(Vec<(String, Tensor)>);
    impl Tree for Named {
        fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
            out.extend(self.0.iter().map(|(_, t)| t));
        }
        fn leaf_names(&self, _prefix: &str, out: &mut Vec<String>) {
            out.extend(self.0.iter().map(|(n, _)| n.clone()));
        }
        fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            Named(self.0.iter().map(|(n, t)| (n.clone(), f(t))).collect())
        }
    }
    let named = Named(
        tensors
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect(),
    );
    checkpoint::to_bytes(&named, &Metadata::new(0)).unwrap()
}

fn good() -> Vec<(&'static str, Tensor)> {
    vec![
        ("weight", Tensor::ones(DType::F32, [2, 3])),
        ("bias", Tensor::ones(DType::F32, [3])),
        ("count", Tensor::scalar(3i64)),
        ("table", Tensor::ones(DType::F32, [4])),
    ]
}

fn load_err(bytes: &[u8]) -> String {
    match checkpoint::from_bytes(bytes, &target()) {
        Ok(_) => panic!("a mismatched checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_mismatch_is_named() {
    let (t, _) = checkpoint::from_bytes(&file_with(&good()), &target()).unwrap();
    assert_eq!(t.count.to_vec::<i64>().unwrap(), [3]);
    assert_eq!(t.weight.to_vec::<f32>().unwrap(), [1.0; 6]);

    let mut wrong_dtype = good();
    wrong_dtype[2].1 = Tensor::scalar(3i32);
    let e = load_err(&file_with(&wrong_dtype));
    assert!(
        e.contains("tensor `count`: file has dtype i32, expected i64") && e.contains("1 problem"),
        "{e}"
    );

    let mut missing = good();
    missing.remove(1);
    let e = load_err(&file_with(&missing));
    assert!(e.contains("missing tensor `bias` (expected f32[3])"), "{e}");

    let mut extra = good();
    extra.push(("running_mean", Tensor::zeros(DType::F32, [3])));
    let e = load_err(&file_with(&extra));
    assert!(e.contains("extra tensor `running_mean`"), "{e}");

    let mut shape = good();
    shape[0].1 = Tensor::ones(DType::F32, [3, 2]);
    let e = load_err(&file_with(&shape));
    assert!(
        e.contains("tensor `weight`: file has shape [3, 2], expected [2, 3]"),
        "{e}"
    );
}

#[test]
fn all_mismatches_are_reported_at_once() {
    let all = vec![
        ("weight", Tensor::ones(DType::F32, [3, 2])),
        ("count", Tensor::scalar(3.0f64)),
        ("table", Tensor::ones(DType::F32, [4])),
        ("extra.thing", Tensor::ones(DType::I8, [1])),
    ];
    let e = load_err(&file_with(&all));
    for want in [
        "4 problems",
        "tensor `weight`: file has shape [3, 2], expected [2, 3]",
        "tensor `count`: file has dtype f64, expected i64",
        "missing tensor `bias`",
        "extra tensor `extra.thing` (i8[1])",
    ] {
        assert!(e.contains(want), "`{want}` not in:\n{e}");
    }
    // Both a wrong dtype and a wrong shape on one tensor are one problem naming both.
    let both = vec![
        ("weight", Tensor::ones(DType::F64, [6])),
        ("bias", Tensor::ones(DType::F32, [3])),
        ("count", Tensor::scalar(3i64)),
        ("table", Tensor::ones(DType::F32, [4])),
    ];
    let e = load_err(&file_with(&both));
    assert!(
        e.contains("tensor `weight`: file has dtype f64, expected f32; shape [6], expected [2, 3]"),
        "{e}"
    );
}

#[test]
fn saving_is_atomic_and_replaces_the_old_file() {
    let dir = tmp_dir("atomic");
    let path = dir.join("ckpt.safetensors");
    let tree = small_tree();
    checkpoint::save(&path, &tree, &Metadata::new(1)).unwrap();
    checkpoint::save(&path, &tree, &Metadata::new(2)).unwrap();
    let (_, meta) = checkpoint::load(&path, &tree).unwrap();
    assert_eq!(meta.step, 2);
    // No temporary files are left behind.
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(entries.len(), 1);
    // A traced or failed leaf is refused before anything is written.
    let bad = (Tensor::failed(kiln::Error::new("test", "boom")),);
    let e = checkpoint::save(dir.join("bad.safetensors"), &bad, &Metadata::new(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`0`") && e.contains("boom"), "{e}");
    assert!(!dir.join("bad.safetensors").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The tree the PyTorch fixture maps into: a kiln MLP (with PyTorch's `[out, in]` weights, to
/// be transposed), the input batch, PyTorch's output on it, and two other dtypes.
#[derive(Clone, kiln::Tree)]
struct FromTorch {
    model: Mlp,
    x: Tensor,
    y: Tensor,
    num_batches: Tensor,
    mask: Tensor,
}

#[test]
fn a_pytorch_safetensors_file_loads_with_a_name_mapping() {
    let torch_layer = |out: usize, inp: usize| Linear {
        weight: Tensor::zeros(DType::F32, [out, inp]),
        bias: Some(Tensor::zeros(DType::F32, [out])),
    };
    let like = FromTorch {
        model: Mlp {
            layers: vec![torch_layer(4, 3), torch_layer(2, 4)],
        },
        x: Tensor::zeros(DType::F32, [2, 3]),
        y: Tensor::zeros(DType::F32, [2, 2]),
        num_batches: Tensor::zeros(DType::I64, [1]),
        mask: Tensor::zeros(DType::Pred, [3]),
    };
    // `net.0.weight` -> `model.layers.0.weight`, `net.2.bias` -> `model.layers.1.bias`
    // (index 1 of nn.Sequential is the ReLU); other names are kept.
    let map = |name: &str| -> Option<String> {
        match name.strip_prefix("net.") {
            Some(rest) => {
                let (i, field) = rest.split_once('.')?;
                let i: usize = i.parse().ok()?;
                Some(format!("model.layers.{}.{field}", i / 2))
            }
            None => Some(name.to_string()),
        }
    };
    let (t, meta) = checkpoint::load_mapped(fixture("torch_mlp.safetensors"), &like, map).unwrap();
    // Not a kiln checkpoint: no kiln metadata block.
    assert_eq!(meta.step, 0);
    assert_eq!(meta.kiln_version, "");

    // Values as make_fixtures.py printed them (Python printed each f32 as the f64 it is, so
    // they compare exactly).
    let f64s = |t: &Tensor| -> Vec<f64> {
        t.to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    };
    assert_eq!(
        f64s(t.model.layers[0].bias.as_ref().unwrap()),
        [
            -0.55157071352005,
            -0.3823687434196472,
            -0.2379971146583557,
            0.021387115120887756
        ]
    );
    assert_eq!(
        f64s(&t.model.layers[1].weight)[..4],
        [
            0.19766759872436523,
            0.30001139640808105,
            -0.3389705419540405,
            -0.21773141622543335
        ]
    );
    assert_eq!(t.num_batches.to_vec::<i64>().unwrap(), [7]);
    assert_eq!(t.mask.to_vec::<bool>().unwrap(), [true, false, true]);

    // kiln's Linear is `x W` with W [in, out]: transpose PyTorch's weights and check that
    // the kiln model computes what PyTorch did.
    let mut model = t.model.clone();
    for l in &mut model.layers {
        l.weight = l.weight.t();
    }
    let out = model.forward(&t.x).to_vec::<f32>().unwrap();
    let want = t.y.to_vec::<f32>().unwrap();
    for (a, b) in out.iter().zip(&want) {
        assert!((a - b).abs() < 1e-6, "kiln {out:?} vs torch {want:?}");
    }

    // Without the mapping, every name is reported.
    let e = checkpoint::load(fixture("torch_mlp.safetensors"), &like)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("missing tensor `model.layers.0.weight`")
            && e.contains("extra tensor `net.2.bias`"),
        "{e}"
    );
}

#[test]
fn tuple_structs_and_hand_written_trees_have_names() {
    #[derive(Clone, kiln::Tree)]
    struct Pair(Tensor, Option<Tensor>);
    let t = Tensor::scalar(1.0f32);
    assert_eq!(Pair(t.clone(), Some(t.clone())).leaf_name_vec(), ["0", "1"]);
    assert_eq!(Pair(t.clone(), None).leaf_name_vec(), ["0"]);

    // A hand-written impl that predates names: its leaves are numbered under its prefix.
    #[derive(Clone)]
    struct Old(Tensor, Tensor);
    impl Tree for Old {
        fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
            out.push(&self.0);
            out.push(&self.1);
        }
        fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            Old(f(&self.0), f(&self.1))
        }
    }
    #[derive(Clone, kiln::Tree)]
    struct Holder {
        old: Old,
        key: Key,
    }
    let h = Holder {
        old: Old(t.clone(), t.clone()),
        key: random::key(1),
    };
    assert_eq!(h.leaf_name_vec(), ["old.0", "old.1", "key"]);
    let (back, _) =
        checkpoint::from_bytes(&checkpoint::to_bytes(&h, &Metadata::new(0)).unwrap(), &h).unwrap();
    assert_eq!(bits(&back), bits(&h));

    // Two leaves with one name cannot be saved.
    #[derive(Clone)]
    struct Clash(Tensor, Tensor);
    impl Tree for Clash {
        fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
            out.push(&self.0);
            out.push(&self.1);
        }
        fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
            out.push(prefix.to_string());
            out.push(prefix.to_string());
        }
        fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            Clash(f(&self.0), f(&self.1))
        }
    }
    let e = checkpoint::to_bytes(&(Clash(t.clone(), t),), &Metadata::new(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("both named `0`"), "{e}");
}
