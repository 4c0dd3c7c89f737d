//! `.npy` and `.npz`: a round trip per dtype, files written by NumPy, refusals.

use half::f16;
use kiln::npy::{NpyExt, from_npy_bytes, to_npy_bytes};
use kiln::{DType, Tensor, npz};
use std::path::PathBuf;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-arrays-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A version 1.0 `.npy` file with header dictionary `dict` (padded as NumPy pads it) and
/// `data`.
fn npy_file(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut h = dict.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((h.len() as u16).to_le_bytes());
    bytes.extend(h.as_bytes());
    bytes.extend(data);
    bytes
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// One tensor of every dtype NumPy has, with awkward values (extremes, NaN, -0.0, subnormals).
fn samples() -> Vec<(&'static str, Tensor)> {
    vec![
        (
            "bool",
            Tensor::from_vec(vec![true, false, false, true, true, false], [2, 3]).unwrap(),
        ),
        (
            "i8",
            Tensor::from_vec(vec![i8::MIN, -1, 0, 1, i8::MAX, 7], [3, 2]).unwrap(),
        ),
        (
            "i32",
            Tensor::from_vec(vec![i32::MIN, -5, 0, i32::MAX], [2, 1, 2]).unwrap(),
        ),
        (
            "i64",
            Tensor::from_vec(vec![i64::MIN, -5, 0, i64::MAX], [4]).unwrap(),
        ),
        (
            "u32",
            Tensor::from_vec(vec![0u32, 1, u32::MAX, 1 << 31], [2, 2]).unwrap(),
        ),
        (
            "u8",
            Tensor::from_vec(vec![0u8, 1, 128, 255], [4, 1]).unwrap(),
        ),
        (
            "i16",
            Tensor::from_vec(vec![i16::MIN, -1, 0, i16::MAX], [2, 2]).unwrap(),
        ),
        (
            "u16",
            Tensor::from_vec(vec![0u16, 1, 1 << 15, u16::MAX], [4]).unwrap(),
        ),
        (
            "u64",
            Tensor::from_vec(vec![0u64, 1, 1 << 63, u64::MAX], [1, 4]).unwrap(),
        ),
        (
            "f16",
            Tensor::from_vec(
                vec![
                    f16::from_f32(1.5),
                    f16::MAX,
                    f16::MIN_POSITIVE_SUBNORMAL,
                    f16::NEG_INFINITY,
                    f16::NAN,
                    f16::from_f32(-0.0),
                ],
                [6],
            )
            .unwrap(),
        ),
        (
            "f32",
            Tensor::from_vec(
                vec![
                    1.0f32,
                    -0.0,
                    f32::NAN,
                    f32::INFINITY,
                    f32::MIN_POSITIVE / 4.0,
                    3.25,
                ],
                [3, 2],
            )
            .unwrap(),
        ),
        (
            "f64",
            Tensor::from_vec(vec![std::f64::consts::PI, -1e300, 5e-324, 0.0], [1, 4]).unwrap(),
        ),
        ("scalar", Tensor::scalar(42.5f64)),
        ("empty", Tensor::zeros(DType::F32, [0, 3])),
    ]
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    let (a, b) = (a.to_literal().unwrap(), b.to_literal().unwrap());
    a.ty() == b.ty() && a.to_le_bytes() == b.to_le_bytes()
}

#[test]
fn every_numpy_dtype_round_trips_through_npy() {
    let dir = tmp_dir("npy");
    for (name, t) in samples() {
        let path = dir.join(format!("{name}.npy"));
        t.save_npy(&path).unwrap();
        let back = Tensor::load_npy(&path).unwrap();
        assert!(same(&t, &back), "{name}: {t} came back as {back}");
        // In memory too, and the file is what to_npy_bytes gives.
        assert_eq!(std::fs::read(&path).unwrap(), to_npy_bytes(&t).unwrap());
        assert!(same(
            &t,
            &from_npy_bytes(&to_npy_bytes(&t).unwrap()).unwrap()
        ));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_numpy_dtype_round_trips_through_npz() {
    let dir = tmp_dir("npz");
    let path = dir.join("all.npz");
    let s = samples();
    npz::save(&path, s.iter().map(|(n, t)| (*n, t))).unwrap();
    let back = npz::load(&path).unwrap();
    assert_eq!(back.len(), s.len());
    for (name, t) in &s {
        assert!(same(t, &back[*name]), "{name}");
    }
    // Duplicate names are refused.
    let t = Tensor::scalar(1i32);
    let e = npz::save(dir.join("dup.npz"), [("a", &t), ("a", &t)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("two arrays are named `a`"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bf16_is_refused_clearly() {
    let t = Tensor::zeros(DType::BF16, [2]);
    let e = to_npy_bytes(&t).unwrap_err().to_string();
    assert!(
        e.contains("bf16 is not a NumPy dtype") && e.contains("cast"),
        "{e}"
    );
    let dir = tmp_dir("bf16");
    let e = t.save_npy(dir.join("x.npy")).unwrap_err().to_string();
    assert!(e.contains("x.npy") && e.contains("bf16"), "{e}");
    assert!(!dir.join("x.npy").exists());
    let e = npz::save(dir.join("x.npz"), [("w", &t)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("array `w`") && e.contains("bf16"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_npy_written_by_numpy_loads() {
    // np.save("numpy_f64.npy", (np.arange(6, dtype=np.float64) * 0.5 - 1.0).reshape(2, 3))
    let t = Tensor::load_npy(fixture("numpy_f64.npy")).unwrap();
    assert_eq!(t.dtype(), DType::F64);
    assert_eq!(t.shape(), [2, 3]);
    assert_eq!(t.to_vec::<f64>().unwrap(), [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
}

#[test]
fn a_npz_written_by_numpy_loads() {
    let a = npz::load(fixture("numpy_arrays.npz")).unwrap();
    assert_eq!(a.keys().collect::<Vec<_>>(), ["flags", "halves", "ints"]);
    assert_eq!(a["ints"].to_vec::<i32>().unwrap(), [0, -1, 2, -3]);
    assert_eq!(a["flags"].to_vec::<bool>().unwrap(), [true, false]);
    assert_eq!(
        a["halves"].to_vec::<f16>().unwrap(),
        [f16::from_f32(1.5), f16::from_f32(-2.0)]
    );
}

#[test]
fn fortran_order_and_big_endian_files_read_as_row_major() {
    // A hand-made header: float32 big-endian, Fortran order, shape (2, 3); column-major data
    // 1..6 means rows [1, 3, 5] and [2, 4, 6].
    let data: Vec<u8> = (1..=6).flat_map(|x| (x as f32).to_be_bytes()).collect();
    let bytes = npy_file(
        "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }",
        &data,
    );
    let t = from_npy_bytes(&bytes).unwrap();
    assert_eq!(t.shape(), [2, 3]);
    assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
}

#[test]
fn bad_files_give_errors() {
    let good = to_npy_bytes(&Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap()).unwrap();
    for cut in 0..good.len() {
        assert!(
            from_npy_bytes(&good[..cut]).is_err(),
            "a .npy cut at {cut} loaded"
        );
    }
    // A dtype kiln lacks (complex64); i16 it has.
    let c64s = npy_file(
        "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
        &[0, 0, 128, 63, 0, 0, 0, 64],
    );
    let e = from_npy_bytes(&c64s).unwrap_err().to_string();
    assert!(e.contains("<c8") && e.contains("no kiln dtype"), "{e}");
    // The message lists every NumPy dtype that loads.
    for name in ["int16", "uint8", "uint16", "uint64"] {
        assert!(e.contains(name), "{e}");
    }
    let i16s = npy_file(
        "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }",
        &[1, 0, 254, 255],
    );
    let t = from_npy_bytes(&i16s).unwrap();
    assert_eq!(t.to_vec::<i16>().unwrap(), [1, -2]);
    // A header claiming far more data than there is.
    let huge = npy_file(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (999999999,), }",
        &[0; 12],
    );
    let e = from_npy_bytes(&huge).unwrap_err().to_string();
    assert!(e.contains("truncated or corrupt"), "{e}");
    let e = npz::from_npz_bytes(b"PK not really")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a valid .npz"), "{e}");
    let dir = tmp_dir("bad");
    let e = Tensor::load_npy(dir.join("absent.npy"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent.npy") && e.contains("cannot read"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
