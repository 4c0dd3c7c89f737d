//! The small floats (`f8e4m3fn` ... `f4e2m1fn`) through the facade: casts round once to the
//! type by its rules, arithmetic rounds its f32 result once, eager mode and `jit` agree, and
//! files take them where a format has a name for them.

use kiln::npy::NpyExt;
use kiln::{DType, Tensor, checkpoint, jit};

fn values(t: &Tensor) -> Vec<f64> {
    t.to_literal().unwrap().to_f64s()
}

#[test]
fn casts_round_by_each_formats_rules() {
    let x = Tensor::from_vec(vec![0.1f32, 464.0, 500.0, 2.5, -0.3], [5]).unwrap();
    let nan = f64::NAN;
    for (d, want) in [
        (DType::F8E4M3FN, [0.1015625, 448.0, nan, 2.5, -0.3125]),
        (DType::F8E5M2, [0.09375, 448.0, 512.0, 2.5, -0.3125]),
        (DType::F8E4M3FNUZ, [0.1015625, nan, nan, 2.5, -0.3125]),
        (DType::F4E2M1FN, [0.0, 6.0, 6.0, 2.0, -0.5]),
        (DType::F8E8M0FNU, [0.125, 512.0, 512.0, 2.0, nan]),
    ] {
        let eager = x.cast(d);
        let traced = jit(move |x: &Tensor| x.cast(d)).call(&x).unwrap();
        for (how, t) in [("eager", &eager), ("jit", &traced)] {
            assert_eq!(t.dtype(), d);
            let got = values(t);
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g.is_nan() && w.is_nan()) || *g == w,
                    "{how} {d}: {got:?}, want {want:?}"
                );
            }
        }
    }
}

#[test]
fn arithmetic_computes_in_f32_and_rounds_once() {
    let a = Tensor::from_vec(vec![1.0f32, 3.0, 448.0, 0.0625], [4])
        .unwrap()
        .cast(DType::F8E4M3FN);
    let b = Tensor::from_vec(vec![0.125f32, 0.25, 64.0, 0.0625], [4])
        .unwrap()
        .cast(DType::F8E4M3FN);
    // 1.125 is exact; 3.25 is exact; 512 overflows to NaN; 0.125 is exact.
    let eager = &a + &b;
    let traced = jit(|(a, b): &(Tensor, Tensor)| a + b)
        .call(&(a.clone(), b.clone()))
        .unwrap();
    for (how, t) in [("eager", &eager), ("jit", &traced)] {
        assert_eq!(t.dtype(), DType::F8E4M3FN);
        let v = values(t);
        assert_eq!(&v[..2], [1.125, 3.25], "{how}");
        assert!(v[2].is_nan(), "{how}: {v:?}");
        assert_eq!(v[3], 0.125, "{how}");
    }
    // 1 + 0.0625 lies halfway between 1 and 1.125 in f8e4m3fn: ties to even, 1.
    let one = Tensor::full(DType::F8E4M3FN, [1], 1.0);
    let tiny = Tensor::full(DType::F8E4M3FN, [1], 0.0625);
    assert_eq!(values(&(&one + &tiny)), [1.0]);
    // A float scalar keeps the small float's dtype.
    assert_eq!((&one * 1.5).dtype(), DType::F8E4M3FN);
}

#[test]
fn checkpoints_take_the_8_bit_formats_and_npy_refuses_them() {
    let dir = std::env::temp_dir().join(format!("kiln-small-floats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = Tensor::from_vec(vec![0.5f32, -3.0, 240.0], [3])
        .unwrap()
        .cast(DType::F8E5M2);
    let path = dir.join("x.safetensors");
    checkpoint::save(&path, &x, &checkpoint::Metadata::new(1)).unwrap();
    let (back, _) = checkpoint::load(&path, &x).unwrap();
    assert_eq!(back.dtype(), DType::F8E5M2);
    assert_eq!(values(&back), [0.5, -3.0, 256.0]);
    let err = x.save_npy(dir.join("x.npy")).unwrap_err();
    assert!(err.message.contains("f8e5m2"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
