//! Functional pseudo-random numbers with explicit keys, bit-compatible with `jax.random`
//! (Threefry-2x32, JAX's default "partitionable" layout).
//!
//! A key is a `u32[2]` tensor. Nothing is stateful: [`split`] and [`fold_in`] derive new keys,
//! and the same key always gives the same numbers. The generator is built from IR ops, so it
//! traces, compiles and differentiates (as a constant) like any other code.

use crate::{DType, Error, Result, Tensor, Tree};
use kiln_ir::Loc;

/// A PRNG key: a `u32[2]` tensor.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, random::{self, Key}};
/// let k = random::key(7);
/// // The same key, the same numbers.
/// let a = random::normal(&k, &[3], DType::F32).to_vec::<f32>().unwrap();
/// assert_eq!(random::normal(&k.clone(), &[3], DType::F32).to_vec::<f32>().unwrap(), a);
/// // Any u32[2] tensor is a key; other tensors are refused.
/// let raw = Key(Tensor::from_vec(vec![0u32, 7], [2]).unwrap());
/// assert_eq!(random::normal(&raw, &[3], DType::F32).to_vec::<f32>().unwrap(), a);
/// let bad = Key(Tensor::from_vec(vec![0i32, 7], [2]).unwrap());
/// assert!(random::normal(&bad, &[3], DType::F32).error().unwrap().message.contains("u32[2]"));
/// ```
#[derive(Clone, Debug)]
pub struct Key(pub Tensor);

impl Tree for Key {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.push(&self.0);
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        out.push(prefix.to_string());
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        Key(f(&self.0))
    }
}

/// The key for an integer seed, as `jax.random.PRNGKey(seed)` (the seed's high and low
/// 32-bit words).
///
/// # Examples
///
/// ```
/// let k = kiln::random::key(42);
/// assert_eq!(k.0.to_vec::<u32>().unwrap(), [0, 42]);
/// ```
pub fn key(seed: u64) -> Key {
    Key(Tensor::from_vec(vec![(seed >> 32) as u32, seed as u32], [2]).expect("two words"))
}

fn u32c(x: u32) -> Tensor {
    Tensor::scalar(x)
}

fn rotl(x: &Tensor, r: u32) -> Tensor {
    let l = shift(x, r, true);
    let rr = shift(x, 32 - r, false);
    or(&l, &rr)
}

fn apply2(op: kiln_ir::Op, a: &Tensor, b: &Tensor) -> Tensor {
    let shape = crate::ops_broadcast(&a.shape(), &b.shape());
    let (a, b) = (a.broadcast_to(&shape), b.broadcast_to(&shape));
    kiln_trace::trace::apply(op, &[&a, &b], None, "random", Loc::caller()).remove(0)
}

fn shift(x: &Tensor, by: u32, left: bool) -> Tensor {
    let op = if left {
        kiln_ir::Op::ShiftLeft {}
    } else {
        kiln_ir::Op::ShiftRightLogical {}
    };
    apply2(op, x, &u32c(by))
}

fn or(a: &Tensor, b: &Tensor) -> Tensor {
    apply2(kiln_ir::Op::Or {}, a, b)
}

fn xor(a: &Tensor, b: &Tensor) -> Tensor {
    apply2(kiln_ir::Op::Xor {}, a, b)
}

/// Threefry-2x32 (20 rounds) of counter words `x0`, `x1` (same shape) under key words `k0`,
/// `k1` (scalars).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, random::threefry2x32};
/// // Random123's known answer (also `jax._src.random.threefry2x32`'s).
/// let w = |x: u32| Tensor::scalar(x);
/// let (a, b) = threefry2x32(&w(0x1319_8a2e), &w(0x0370_7344), &w(0x243f_6a88), &w(0x85a3_08d3));
/// assert_eq!(a.to_vec::<u32>().unwrap(), [0xc492_3a9c]);
/// assert_eq!(b.to_vec::<u32>().unwrap(), [0x483d_f7a0]);
/// let zeros = Tensor::from_vec(vec![0u32; 2], [2]).unwrap();
/// let (a, _) = threefry2x32(&w(0), &w(0), &zeros, &zeros);
/// assert_eq!(a.to_vec::<u32>().unwrap(), [0x6b20_0159; 2]);
/// ```
pub fn threefry2x32(k0: &Tensor, k1: &Tensor, x0: &Tensor, x1: &Tensor) -> (Tensor, Tensor) {
    const R: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
    let k2 = xor(&xor(k0, k1), &u32c(0x1BD1_1BDA));
    let ks = [k0.clone(), k1.clone(), k2];
    let mut a = x0 + &ks[0];
    let mut b = x1 + &ks[1];
    for round in 0..20 {
        a = &a + &b;
        b = rotl(&b, R[round % 8]);
        b = xor(&b, &a);
        if round % 4 == 3 {
            let s = round / 4 + 1;
            a = &a + &ks[s % 3];
            b = &(&b + &ks[(s + 1) % 3]) + &u32c(s as u32);
        }
    }
    (a, b)
}

fn key_words(k: &Key) -> (Tensor, Tensor) {
    (
        k.0.slice(0, 0, 1, 1).reshape(&[]),
        k.0.slice(0, 1, 2, 1).reshape(&[]),
    )
}

/// The (high, low) words of the row-major index of every position of `shape`.
fn counters(shape: &[usize]) -> (Tensor, Tensor) {
    let ty = kiln_ir::TensorType::new(DType::U32, shape.to_vec());
    if let Err(e) = ty.check_size() {
        let t = kiln_trace::failure("random", e, Loc::caller());
        return (t.clone(), t);
    }
    let n = ty.numel();
    let lo = Tensor::arange(n, DType::U32)
        .reshape(&shape.iter().map(|&s| s as isize).collect::<Vec<_>>());
    (Tensor::zeros(DType::U32, shape.to_vec()), lo)
}

/// `f()` as the user-level operation `name` at `loc`, after checking the key: a bad key, or
/// any error inside, names `name` and the user's line (not this file's).
fn keyed<T>(
    name: &'static str,
    k: &Key,
    loc: Loc,
    fail: impl Fn(Tensor) -> T,
    f: impl FnOnce() -> T,
) -> T {
    if let Some(t) = k.0.error().map(|e| Tensor::failed(e.clone())).or_else(|| {
        (k.0.ty() != Some(kiln_ir::TensorType::new(DType::U32, [2]))).then(|| {
            Tensor::failed(Error::at(
                name,
                format!(
                    "a key must be u32[2] (made by `key(seed)` or `split`), got {}",
                    k.0
                ),
                loc,
            ))
        })
    }) {
        return fail(t);
    }
    kiln_trace::composite(name, loc, f)
}

/// Uniformly random 32-bit words of `shape` (as `jax.random.bits`).
///
/// # Examples
///
/// ```
/// use kiln::random::{bits, key};
/// let b = bits(&key(42), &[3]).to_vec::<u32>().unwrap();
/// assert_eq!(b, [2098992034, 2919706841, 2646866425]); // as jax.random.bits
/// ```
#[track_caller]
pub fn bits(k: &Key, shape: &[usize]) -> Tensor {
    keyed("bits", k, Loc::caller(), |t| t, || raw_bits(k, shape))
}

fn raw_bits(k: &Key, shape: &[usize]) -> Tensor {
    let (k0, k1) = key_words(k);
    let (hi, lo) = counters(shape);
    let (a, b) = threefry2x32(&k0, &k1, &hi, &lo);
    xor(&a, &b)
}

/// `n` new keys from `k` (as `jax.random.split`).
///
/// # Examples
///
/// ```
/// use kiln::random::{key, split};
/// let ks = split(&key(42), 2);
/// assert_eq!(ks.len(), 2);
/// assert_eq!(ks[0].0.to_vec::<u32>().unwrap(), [1832780943, 270669613]); // as jax.random.split
/// assert_ne!(ks[0].0.to_vec::<u32>().unwrap(), ks[1].0.to_vec::<u32>().unwrap());
/// ```
#[track_caller]
pub fn split(k: &Key, n: usize) -> Vec<Key> {
    keyed(
        "split",
        k,
        Loc::caller(),
        |t| vec![Key(t); n],
        || raw_split(k, n),
    )
}

fn raw_split(k: &Key, n: usize) -> Vec<Key> {
    let (k0, k1) = key_words(k);
    let (hi, lo) = counters(&[n]);
    let (a, b) = threefry2x32(&k0, &k1, &hi, &lo);
    (0..n as isize)
        .map(|i| {
            Key(Tensor::concat(
                &[&a.slice(0, i, i + 1, 1), &b.slice(0, i, i + 1, 1)],
                0,
            ))
        })
        .collect()
}

/// A new key from `k` and an integer (as `jax.random.fold_in`).
///
/// # Examples
///
/// ```
/// use kiln::random::{fold_in, key};
/// assert_eq!(fold_in(&key(42), 7).0.to_vec::<u32>().unwrap(), [2547012911, 1371500959]);
/// ```
#[track_caller]
pub fn fold_in(k: &Key, data: u32) -> Key {
    keyed("fold_in", k, Loc::caller(), Key, || raw_fold_in(k, data))
}

fn raw_fold_in(k: &Key, data: u32) -> Key {
    let (k0, k1) = key_words(k);
    let (a, b) = threefry2x32(
        &k0,
        &k1,
        &Tensor::zeros(DType::U32, [1]),
        &Tensor::from_vec(vec![data], [1]).expect("one word"),
    );
    Key(Tensor::concat(&[&a, &b], 0))
}

/// Uniform floats in [lo, hi) of `shape` and `dtype` (f32 or f64 use their mantissa bits as
/// `jax.random.uniform` does; f16/bf16 are drawn in f32 and rounded).
///
/// # Examples
///
/// ```
/// use kiln::{DType, random};
/// let k = random::key(0);
/// let u = random::uniform(&k, &[1000], DType::F32, -1.0, 1.0).to_vec::<f32>().unwrap();
/// assert!(u.iter().all(|&v| (-1.0..1.0).contains(&v)));
/// // The same key gives the same numbers.
/// assert_eq!(random::uniform(&k, &[1000], DType::F32, -1.0, 1.0).to_vec::<f32>().unwrap(), u);
/// ```
#[track_caller]
pub fn uniform(k: &Key, shape: &[usize], dtype: DType, lo: f64, hi: f64) -> Tensor {
    let loc = Loc::caller();
    keyed(
        "uniform",
        k,
        loc,
        |t| t,
        || raw_uniform(k, shape, dtype, lo, hi, loc),
    )
}

fn raw_uniform(k: &Key, shape: &[usize], dtype: DType, lo: f64, hi: f64, loc: Loc) -> Tensor {
    if !dtype.is_float() {
        return Tensor::failed(Error::at(
            "uniform",
            format!("uniform needs a float dtype, got {dtype}"),
            loc,
        ));
    }
    if dtype != DType::F32 {
        return raw_uniform(k, shape, DType::F32, lo, hi, loc).cast(dtype);
    }
    let b = raw_bits(k, shape);
    let mant = or(&shift(&b, 32 - 23, false), &u32c(1.0f32.to_bits()));
    let shape_ty = kiln_ir::TensorType::new(DType::F32, shape.to_vec());
    let one_two = kiln_trace::trace::apply(
        kiln_ir::Op::BitcastConvert {},
        &[&mant],
        Some(vec![shape_ty]),
        "uniform",
        loc,
    )
    .remove(0);
    let f = &one_two - 1.0;
    let scaled = &(&f * (hi - lo)) + lo;
    scaled.maximum(&Tensor::full(DType::F32, [], lo))
}

/// erf⁻¹ in f32 by Giles' polynomials (the approximation XLA uses).
fn erf_inv(x: &Tensor) -> Tensor {
    const SMALL: [f64; 9] = [
        2.81022636e-08,
        3.43273939e-07,
        -3.5233877e-06,
        -4.39150654e-06,
        0.00021858087,
        -0.00125372503,
        -0.00417768164,
        0.246640727,
        1.50140941,
    ];
    const LARGE: [f64; 9] = [
        -0.000200214257,
        0.000100950558,
        0.00134934322,
        -0.00367342844,
        0.00573950773,
        -0.0076224613,
        0.00943887047,
        1.00167406,
        2.83297682,
    ];
    let w = -((-(x * x)).log1p());
    let dt = x.dtype();
    let lt = w.lt(&Tensor::full(dt, [], 5.0));
    let ws = lt.where_(&(&w - 2.5), &(&w.sqrt() - 3.0));
    let coef = |i: usize| {
        lt.where_(
            &Tensor::full(dt, [], SMALL[i]),
            &Tensor::full(dt, [], LARGE[i]),
        )
    };
    let mut p = coef(0).broadcast_to(&x.shape());
    for i in 1..9 {
        p = &coef(i) + &(&p * &ws);
    }
    let r = &p * x;
    let edge = x.abs().eq(&Tensor::full(dt, [], 1.0));
    edge.where_(&(x * f32::MAX as f64), &r)
}

/// Standard normal floats of `shape` (as `jax.random.normal`: sqrt(2) erf⁻¹(u) for uniform u in
/// (-1, 1)).
///
/// # Examples
///
/// ```
/// use kiln::{DType, random};
/// let x = random::normal(&random::key(1), &[2, 500], DType::F32);
/// assert_eq!(x.shape(), [2, 500]);
/// let mean = x.mean_all().item().unwrap();
/// assert!(mean.abs() < 0.1, "{mean}");
/// ```
#[track_caller]
pub fn normal(k: &Key, shape: &[usize], dtype: DType) -> Tensor {
    let loc = Loc::caller();
    keyed(
        "normal",
        k,
        loc,
        |t| t,
        || {
            let d = if dtype.is_float() { DType::F32 } else { dtype };
            let lo = f32::from_bits((-1.0f32).to_bits() - 1) as f64;
            let u = raw_uniform(k, shape, d, lo, 1.0, loc);
            (&erf_inv(&u) * std::f64::consts::SQRT_2).cast(if dtype.is_float() { dtype } else { d })
        },
    )
}

/// Bernoulli draws: `true` with probability `p`.
///
/// # Examples
///
/// ```
/// use kiln::random::{bernoulli, key};
/// let b = bernoulli(&key(3), 0.25, &[4000]).to_vec::<bool>().unwrap();
/// let frac = b.iter().filter(|&&x| x).count() as f64 / 4000.0;
/// assert!((frac - 0.25).abs() < 0.03, "{frac}");
/// ```
#[track_caller]
pub fn bernoulli(k: &Key, p: f64, shape: &[usize]) -> Tensor {
    let loc = Loc::caller();
    keyed(
        "bernoulli",
        k,
        loc,
        |t| t,
        || raw_uniform(k, shape, DType::F32, 0.0, 1.0, loc).lt(&Tensor::full(DType::F32, [], p)),
    )
}

/// Checks that a key is a `u32[2]` tensor.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, random};
/// assert!(random::check_key(&random::key(0)).is_ok());
/// assert!(random::check_key(&random::Key(Tensor::scalar(0u32))).is_err());
/// ```
#[track_caller]
pub fn check_key(k: &Key) -> Result<()> {
    match k.0.ty() {
        Some(t) if t == kiln_ir::TensorType::new(DType::U32, [2]) => Ok(()),
        _ => Err(Error::new(
            "random",
            format!("a key must be u32[2], got {}", k.0),
        )),
    }
}
