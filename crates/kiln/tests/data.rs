//! `kiln::data`: datasets, samplers and the prefetching loader.

use kiln::data::{
    CsvDataset, CsvOptions, DataLoader, Dataset, Distributed, NpyDataset, SafetensorsDataset,
    Sampler, Sequential, Shuffled, TensorDataset,
};
use kiln::npy::NpyExt;
use kiln::{Result, Tensor};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-data-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// x [n, 3] with row i = (i, i + 0.5, -i), y [n] = i % 4.
fn xy(n: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..n)
        .flat_map(|i| [i as f32, i as f32 + 0.5, -(i as f32)])
        .collect();
    let y: Vec<i32> = (0..n).map(|i| (i % 4) as i32).collect();
    (
        Tensor::from_vec(x, [n, 3]).unwrap(),
        Tensor::from_vec(y, [n]).unwrap(),
    )
}

fn dataset(n: usize) -> TensorDataset {
    let (x, y) = xy(n);
    TensorDataset::new(vec![x, y]).unwrap()
}

/// The sample ids (row i has x[0] = i) of every batch of an epoch.
fn ids<D: Dataset + 'static>(loader: &DataLoader<D>, epoch: u64) -> Vec<Vec<usize>> {
    loader
        .epoch(epoch)
        .map(|b| {
            let b = b.unwrap();
            let x = b[0].to_vec::<f32>().unwrap();
            let y = b[1].to_vec::<i32>().unwrap();
            let ids: Vec<usize> = x.chunks(3).map(|r| r[0] as usize).collect();
            for (&i, &l) in ids.iter().zip(&y) {
                assert_eq!(l as usize, i % 4, "labels travel with their rows");
            }
            ids
        })
        .collect()
}

#[test]
fn sequential_batches_cover_the_dataset_in_order() {
    let loader = DataLoader::new(dataset(10), 4).unwrap();
    assert_eq!(loader.len(), 3);
    assert_eq!(
        ids(&loader, 0),
        vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
    );
    let b = loader.epoch(0).next().unwrap().unwrap();
    assert_eq!(b[0].shape(), [4, 3]);
    assert_eq!(b[1].shape(), [4]);
    assert_eq!(b[0].dtype(), kiln::DType::F32);
    assert_eq!(b[1].dtype(), kiln::DType::I32);
}

#[test]
fn drop_last_drops_only_a_short_batch() {
    let loader = DataLoader::new(dataset(10), 4).unwrap().drop_last(true);
    assert_eq!(loader.len(), 2);
    assert_eq!(ids(&loader, 0), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    let even = DataLoader::new(dataset(8), 4).unwrap().drop_last(true);
    assert_eq!(ids(&even, 0).len(), 2);
}

#[test]
fn shuffling_is_seeded_differs_by_epoch_and_visits_every_sample_once() {
    let loader = DataLoader::new(dataset(50), 8).unwrap().shuffle(3);
    let e0 = ids(&loader, 0);
    assert_eq!(e0, ids(&loader, 0), "same seed and epoch: same batches");
    let e1 = ids(&loader, 1);
    assert_ne!(e0, e1, "another epoch: another order");
    for e in [e0, e1] {
        let mut all: Vec<usize> = e.into_iter().flatten().collect();
        assert_ne!(all, (0..50).collect::<Vec<_>>(), "shuffled");
        all.sort();
        assert_eq!(all, (0..50).collect::<Vec<_>>());
    }
    let other = DataLoader::new(dataset(50), 8).unwrap().shuffle(4);
    assert_ne!(ids(&other, 0), ids(&loader, 0));
}

#[test]
fn the_batches_do_not_depend_on_the_number_of_workers() {
    let reference = ids(
        &DataLoader::new(dataset(37), 5)
            .unwrap()
            .shuffle(9)
            .workers(0),
        2,
    );
    for workers in [1, 2, 3, 8, 20] {
        for prefetch in [1, 4] {
            let l = DataLoader::new(dataset(37), 5)
                .unwrap()
                .shuffle(9)
                .workers(workers)
                .prefetch(prefetch);
            assert_eq!(
                ids(&l, 2),
                reference,
                "{workers} workers, prefetch {prefetch}"
            );
        }
    }
}

#[test]
fn a_transform_runs_on_every_sample_before_collation() {
    let loader = DataLoader::new(dataset(6), 3)
        .unwrap()
        .map(|s| Ok(vec![&s[0] * 2.0, s[1].clone()]));
    let b = loader.epoch(0).next().unwrap().unwrap();
    assert_eq!(
        b[0].to_vec::<f32>().unwrap(),
        [0.0, 1.0, 0.0, 2.0, 3.0, -2.0, 4.0, 5.0, -4.0]
    );
}

#[test]
fn an_epoch_dropped_early_stops_its_workers() {
    let loaded = Arc::new(AtomicUsize::new(0));
    let counter = loaded.clone();
    let loader = DataLoader::new(dataset(1000), 10)
        .unwrap()
        .workers(2)
        .prefetch(1)
        .map(move |s| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(s)
        });
    {
        let mut e = loader.epoch(0);
        e.next().unwrap().unwrap();
    }
    // Dropping joined the workers; each may have loaded the batch it was sending plus one
    // queued and one in hand: far from the 100 batches of the epoch.
    let n = loaded.load(Ordering::SeqCst);
    assert!(n <= 10 * 8, "{n} samples loaded after one batch");
}

#[test]
fn the_queue_is_bounded() {
    // With a consumer that has taken 2 batches, 2 workers with prefetch 1 can be at most
    // 2 (queued) + 2 (in hand) batches ahead.
    let loaded = Arc::new(AtomicUsize::new(0));
    let counter = loaded.clone();
    let loader = DataLoader::new(dataset(1000), 10)
        .unwrap()
        .workers(2)
        .prefetch(1)
        .map(move |s| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(s)
        });
    let mut e = loader.epoch(0);
    e.next().unwrap().unwrap();
    e.next().unwrap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let n = loaded.load(Ordering::SeqCst);
    assert!(
        n <= 10 * (2 + 2 + 2),
        "{n} samples loaded after two batches"
    );
    assert!(e.waited() < std::time::Duration::from_secs(60));
}

#[test]
fn errors_surface_as_items_and_end_the_epoch() {
    for workers in [0, 2] {
        let loader = DataLoader::new(dataset(20), 4)
            .unwrap()
            .workers(workers)
            .map(|s| {
                if s[0].to_vec::<f32>()?[0] == 9.0 {
                    Err(kiln::Error::new("my_transform", "sample 9 is bad"))
                } else {
                    Ok(s)
                }
            });
        let items: Vec<Result<Vec<Tensor>>> = loader.epoch(0).collect();
        assert_eq!(
            items.len(),
            3,
            "{workers} workers: two good batches, then the error"
        );
        let e = items[2].as_ref().err().unwrap();
        assert_eq!(e.message, "sample 9 is bad");
    }
}

#[test]
fn a_panicking_transform_is_an_error_not_a_panic() {
    let loader = DataLoader::new(dataset(8), 4).unwrap().workers(1).map(|s| {
        if s[0].to_vec::<f32>()?[0] == 5.0 {
            panic!("bad row");
        }
        Ok(s)
    });
    let items: Vec<_> = loader.epoch(0).collect();
    assert!(items[0].is_ok());
    let e = items[1].as_ref().err().unwrap();
    assert!(
        e.message.contains("batch 1") && e.message.contains("bad row"),
        "{e}"
    );
}

#[test]
fn samples_that_do_not_stack_are_an_error_naming_both() {
    let loader = DataLoader::new(dataset(4), 4).unwrap().map(|s| {
        let n = s[0].to_vec::<f32>()?[0] as usize;
        Ok(vec![
            s[0].slice(0, 0, 1 + (n % 2) as isize, 1),
            s[1].clone(),
        ])
    });
    let e = loader.epoch(0).next().unwrap().unwrap_err();
    assert!(e.message.contains("field 0 of sample 1"), "{e}");
    assert!(
        e.message.contains("f32[2]") && e.message.contains("f32[1]"),
        "{e}"
    );
}

#[test]
fn bad_construction_is_refused_with_the_callers_line() {
    let (x, _) = xy(4);
    let (_, y) = xy(5);
    let e = TensorDataset::new(vec![x, y]).err().unwrap();
    assert!(e.message.contains("4") && e.message.contains("5"), "{e}");
    assert!(e.loc.is_some_and(|l| l.file.ends_with("data.rs")), "{e:?}");
    let e = TensorDataset::new(vec![Tensor::scalar(1.0f32)])
        .err()
        .unwrap();
    assert!(e.message.contains("scalar"), "{e}");
    assert!(TensorDataset::new(vec![]).is_err());
    let e = DataLoader::new(dataset(3), 0).err().unwrap();
    assert!(e.message.contains("batch size is 0"), "{e}");
    let e = Distributed::new(2, 2).err().unwrap();
    assert!(e.message.contains("rank 2"), "{e}");
    assert!(Distributed::new(0, 0).is_err());
    let e = dataset(3).get(3).unwrap_err();
    assert!(e.message.contains("sample 3 is out of range"), "{e}");
}

#[test]
fn distributed_ranks_split_every_epoch_disjointly() {
    for (n, world) in [(10, 3), (12, 4), (5, 8), (0, 2)] {
        let shares: Vec<Vec<usize>> = (0..world)
            .map(|r| Distributed::new(r, world).unwrap().shuffle(1).indices(n, 7))
            .collect();
        let per = n.div_ceil(world);
        assert!(shares.iter().all(|s| s.len() == per), "{n} over {world}");
        let mut all: Vec<usize> = shares.concat();
        all.sort();
        all.dedup();
        assert_eq!(
            all,
            (0..n).collect::<Vec<_>>(),
            "{n} over {world}: every sample"
        );
        // Without padding: disjoint.
        let cut: Vec<Vec<usize>> = (0..world)
            .map(|r| {
                Distributed::new(r, world)
                    .unwrap()
                    .shuffle(1)
                    .drop_last(true)
                    .indices(n, 7)
            })
            .collect();
        let mut flat: Vec<usize> = cut.concat();
        let len = flat.len();
        assert_eq!(len, n / world * world);
        flat.sort();
        flat.dedup();
        assert_eq!(flat.len(), len, "disjoint");
    }
    // The same seed and epoch on every rank: a rank's share is reproducible.
    let d = Distributed::new(1, 3).unwrap().shuffle(5);
    assert_eq!(d.indices(30, 2), d.indices(30, 2));
    assert_ne!(d.indices(30, 2), d.indices(30, 3));
    assert_eq!(Sequential.indices(3, 9), [0, 1, 2]);
    assert_eq!(Shuffled { seed: 1 }.indices(5, 0).len(), 5);
    // As a loader's sampler.
    let loader = DataLoader::new(dataset(10), 2)
        .unwrap()
        .sampler(Distributed::new(0, 2).unwrap());
    assert_eq!(ids(&loader, 0), vec![vec![0, 2], vec![4, 6], vec![8]]);
}

#[test]
fn npy_files_are_mapped_row_by_row() {
    let d = dir("npy");
    let (x, y) = xy(7);
    x.save_npy(d.join("x.npy")).unwrap();
    y.save_npy(d.join("y.npy")).unwrap();
    let ds = NpyDataset::open(&[d.join("x.npy"), d.join("y.npy")]).unwrap();
    assert_eq!(ds.len(), 7);
    let loader = DataLoader::new(ds, 3).unwrap();
    assert_eq!(ids(&loader, 0), vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);

    // Mismatched lengths, a missing file, a truncated file, Fortran order: clear errors.
    let (_, y5) = xy(5);
    y5.save_npy(d.join("y5.npy")).unwrap();
    let e = NpyDataset::open(&[d.join("x.npy"), d.join("y5.npy")])
        .err()
        .unwrap();
    assert!(e.message.contains("different numbers of samples"), "{e}");
    let e = NpyDataset::open(&[d.join("nope.npy")]).err().unwrap();
    assert!(e.message.contains("cannot open"), "{e}");
    let bytes = std::fs::read(d.join("x.npy")).unwrap();
    std::fs::write(d.join("cut.npy"), &bytes[..bytes.len() - 5]).unwrap();
    let e = NpyDataset::open(&[d.join("cut.npy")]).err().unwrap();
    assert!(e.message.contains("truncated"), "{e}");
    let mut fortran = bytes.clone();
    let at = bytes
        .windows(5)
        .position(|w| w == b"False")
        .expect("the header says fortran_order False");
    fortran[at..at + 5].copy_from_slice(b"True ");
    std::fs::write(d.join("f.npy"), &fortran).unwrap();
    let e = NpyDataset::open(&[d.join("f.npy")]).err().unwrap();
    assert!(e.message.contains("Fortran"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn safetensors_tensors_are_mapped_by_name() {
    let d = dir("st");
    let (x, y) = xy(5);
    #[derive(kiln::Tree)]
    struct Data {
        x: Tensor,
        y: Tensor,
    }
    kiln::checkpoint::save(
        d.join("d.safetensors"),
        &Data { x, y },
        &kiln::checkpoint::Metadata::new(0),
    )
    .unwrap();
    let ds = SafetensorsDataset::open(d.join("d.safetensors"), &["x", "y"]).unwrap();
    assert_eq!(ds.len(), 5);
    assert_eq!(
        ids(&DataLoader::new(ds, 2).unwrap(), 0),
        vec![vec![0, 1], vec![2, 3], vec![4]]
    );
    let e = SafetensorsDataset::open(d.join("d.safetensors"), &["x", "z"])
        .err()
        .unwrap();
    assert!(
        e.message.contains("no tensor `z`") && e.message.contains("x, y"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn csv_tables_with_integer_or_text_labels() {
    let d = dir("csv");
    std::fs::write(d.join("t.csv"), "w,h,kind\n1.5,2,b\n3,4,a\n-1e3,0.25,b\n").unwrap();
    let ds = CsvDataset::open(d.join("t.csv"), CsvOptions::default().label("kind")).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.columns(), ["w", "h"]);
    assert_eq!(ds.classes(), ["a", "b"]);
    let b = DataLoader::new(ds, 3)
        .unwrap()
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        b[0].to_vec::<f32>().unwrap(),
        [1.5, 2.0, 3.0, 4.0, -1000.0, 0.25]
    );
    assert_eq!(b[1].to_vec::<i32>().unwrap(), [1, 0, 1]);

    std::fs::write(d.join("n.csv"), "5;1;2\n7;3;4\n").unwrap();
    let ds = CsvDataset::open(
        d.join("n.csv"),
        CsvOptions::default()
            .no_header()
            .delimiter(b';')
            .label("0")
            .features(&["2", "1"])
            .dtype(kiln::DType::F64),
    )
    .unwrap();
    let s = ds.get(1).unwrap();
    assert_eq!(s[0].to_vec::<f64>().unwrap(), [4.0, 3.0]);
    assert_eq!(s[1].to_vec::<i32>().unwrap(), [7]);
    assert!(ds.classes().is_empty());

    std::fs::write(d.join("bad.csv"), "a,b\n1,2\n3,x\n").unwrap();
    let e = CsvDataset::open(d.join("bad.csv"), CsvOptions::default())
        .err()
        .unwrap();
    assert!(
        e.message.contains("line 3") && e.message.contains("`b`") && e.message.contains("`x`"),
        "{e}"
    );
    std::fs::write(d.join("gap.csv"), "a,b\n1,\n").unwrap();
    let e = CsvDataset::open(d.join("gap.csv"), CsvOptions::default())
        .err()
        .unwrap();
    assert!(e.message.contains("missing value"), "{e}");
    let e = CsvDataset::open(d.join("t.csv"), CsvOptions::default().label("colour"))
        .err()
        .unwrap();
    assert!(e.message.contains("no column `colour`"), "{e}");
    let e = CsvDataset::open(d.join("t.csv"), CsvOptions::default())
        .err()
        .unwrap();
    assert!(
        e.message.contains("`b`"),
        "the text column is not a feature: {e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
