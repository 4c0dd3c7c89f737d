//! kiln's side of the benchmark contract in `shared/bench/README.md`:
//! `kiln-bench --json FILE [--only a,b]` (run through `cargo xtask bench`).
//!
//! Every workload is written with kiln's user API and compiled with `jit`, as a user would. Before
//! timing, each one is checked against the reference interpreter on a smaller instance of the
//! same program, so a fast wrong answer cannot count.

use kiln::nn::{Mlp, cross_entropy};
use kiln::optim::{Sgd, SgdState};
use kiln::random::{key, normal, uniform};
use kiln::{DType, Tensor, Tree, grad, jit, value_and_grad};
use std::time::Instant;

/// A workload: builds inputs of a size and the function to time.
struct Workload {
    name: &'static str,
    /// (full size, small size for the correctness check)
    sizes: (usize, usize),
    run: fn(usize, bool) -> Result<Timing, String>,
}

#[derive(Default)]
struct Timing {
    first: f64,
    samples: Vec<f64>,
    /// The fresh first calls of a compile_chain_* row (`first` is their median).
    first_calls: Vec<f64>,
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    uniform(&key(seed), shape, DType::F32, -1.0, 1.0)
}

/// Times `f` per the contract: the first call alone, two warm-ups, then samples of `inner`
/// back-to-back calls (about 20 ms each) until at least 5 samples and 1 s.
fn time<O>(mut f: impl FnMut() -> Result<O, String>) -> Result<Timing, String> {
    let t = Instant::now();
    f()?;
    let first = t.elapsed().as_secs_f64();
    f()?;
    let t = Instant::now();
    f()?;
    let one = t.elapsed().as_secs_f64().max(1e-6);
    let inner = ((0.02 / one).ceil() as usize).max(1);
    let (mut samples, start) = (Vec::new(), Instant::now());
    while samples.len() < 5 || start.elapsed().as_secs_f64() < 1.0 {
        let t = Instant::now();
        for _ in 0..inner {
            f()?;
        }
        samples.push(t.elapsed().as_secs_f64() / inner as f64);
    }
    Ok(Timing {
        first,
        samples,
        first_calls: Vec::new(),
    })
}

/// Runs `f` on `x` compiled (the installed backend) and on the reference interpreter, and
/// checks they agree.
fn check<I: Tree, O: Tree + Clone>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
) -> Result<(), String> {
    let compiled = jit(f).call(x).map_err(|e| e.to_string())?;
    agrees(name, f, x, &compiled)
}

/// Checks `got`, the result of `f` at `x` computed some way, against the reference
/// interpreter's.
fn agrees<I: Tree, O: Tree>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
    compiled: &O,
) -> Result<(), String> {
    let func = kiln::lower::trace_ir(f, x).map_err(|e| e.to_string())?;
    let args: Vec<_> = x
        .leaf_vec()
        .iter()
        .map(|t| t.to_literal())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let want = kiln::reference::eval(&func, &args).map_err(|e| e.to_string())?;
    for (got, want) in compiled.leaf_vec().iter().zip(&want) {
        let g = got.to_literal().map_err(|e| e.to_string())?.to_f64s();
        let w = want.to_f64s();
        let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        if let Some(i) = g
            .iter()
            .zip(&w)
            .position(|(a, b)| (a - b).abs() > 1e-3 * scale)
        {
            return Err(format!(
                "{name}: element {i} is {} but the reference gives {}",
                g[i], w[i]
            ));
        }
    }
    Ok(())
}

/// On the small instance (`verify`), checks `f` at `x` against the reference; otherwise times
/// the compiled `f` at `x`.
fn measure<I: Tree, O: Tree + Clone>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
    verify: bool,
) -> Result<Timing, String> {
    if verify {
        check(name, f, x)?;
        return Ok(Timing::default());
    }
    let j = jit(f);
    time(|| j.call(x).map_err(|e| e.to_string()))
}

fn matmul(n: usize, verify: bool) -> Result<Timing, String> {
    let f = |(a, b): &(Tensor, Tensor)| a.matmul(b);
    let x = (rand(&[n, n], 1), rand(&[n, n], 2));
    measure("matmul", f, &x, verify)
}

fn gelu_chain(n: usize, verify: bool) -> Result<Timing, String> {
    let f = |x: &Tensor| (&(x * 1.5) + 0.25).gelu(true);
    let x = rand(&[n], 3);
    measure("gelu_chain", f, &x, verify)
}

fn softmax(n: usize, verify: bool) -> Result<Timing, String> {
    let f = |x: &Tensor| x.softmax(-1);
    let x = rand(&[n, n], 4);
    measure("softmax", f, &x, verify)
}

fn layernorm(rows: usize, verify: bool) -> Result<Timing, String> {
    let f = |(x, g, b): &(Tensor, Tensor, Tensor)| {
        let mean = x.mean(&[-1], true);
        let c = x - &mean;
        let var = (&c * &c).mean(&[-1], true);
        &(&(&c * &(&var + 1e-5).rsqrt()) * g) + b
    };
    let d = 1024;
    let x = (rand(&[rows, d], 5), rand(&[d], 6), rand(&[d], 7));
    measure("layernorm", f, &x, verify)
}

type MlpArgs = (Mlp, SgdState<Mlp>, Tensor, Tensor);

/// One step of plain SGD. Without momentum the optimizer's state (its velocity is just the
/// gradient) carries nothing to the next step, so only the parameters are returned and carried,
/// as the peers do.
fn mlp_step((m, s, x, y): &MlpArgs) -> (Mlp, Tensor) {
    let opt = Sgd::new(0.01);
    match value_and_grad(|m: &Mlp| cross_entropy(&m.forward(x), y), m)
        .and_then(|(l, g)| opt.update(m, &g, s).map(|(m, _)| (m, l)))
    {
        Ok(r) => r,
        Err(e) => (m.clone(), Tensor::failed(e)),
    }
}

/// The MLP step's model, optimizer state and batch (a model an eighth as wide for `verify`).
fn mlp_args(batch: usize, verify: bool) -> Result<MlpArgs, String> {
    let dims: &[usize] = if verify {
        &[784 / 8, 1024 / 8, 1024 / 8, 10]
    } else {
        &[784, 1024, 1024, 10]
    };
    let m = Mlp::new(&key(8), dims, DType::F32);
    let s = Sgd::new(0.01).init(&m);
    let x = normal(&key(9), &[batch, dims[0]], DType::F32);
    let y = Tensor::from_vec(
        (0..batch).map(|i| (i * 7 % 10) as i32).collect::<Vec<_>>(),
        [batch],
    )
    .map_err(|e| e.to_string())?;
    Ok((m, s, x, y))
}

fn mlp_train_step(batch: usize, verify: bool) -> Result<Timing, String> {
    let (m, s, x, y) = mlp_args(batch, verify)?;
    if verify {
        check("mlp_train_step", mlp_step, &(m, s, x, y))?;
        return Ok(Timing::default());
    }
    // Parameters are carried from call to call and donated, as the JAX peer does
    // (`donate_argnums`): the step updates them in place.
    let j = jit(mlp_step);
    let mut state = Some(m);
    time(|| {
        let m = state.take().expect("carried");
        let (m, l) = j
            .call_donating((m, s.clone(), x.clone(), y.clone()))
            .map_err(|e| e.to_string())?;
        state = Some(m);
        Ok(l)
    })
}

/// `mlp_train_step` without `jit`, as a user's eager loop runs it: the gradient comes from
/// `value_and_grad` (which compiles the gradient function once per signature) and the update
/// runs op by op.
fn mlp_train_step_eager(batch: usize, verify: bool) -> Result<Timing, String> {
    let (m, s, x, y) = mlp_args(batch, verify)?;
    if verify {
        let args = (m, s, x, y);
        let (m, l) = mlp_step(&args);
        return agrees("mlp_train_step_eager", mlp_step, &args, &(m, l))
            .map(|()| Timing::default());
    }
    let mut state = Some(m);
    time(|| {
        let m = state.take().expect("carried");
        let (m, l) = mlp_step(&(m, s.clone(), x.clone(), y.clone()));
        let l = l.item().map_err(|e| e.to_string())?;
        state = Some(m);
        Ok(l)
    })
}

/// The MLP step with the gradient written out by hand (as the NumPy peer writes it): the
/// forward pass, softmax cross-entropy, the backward pass's products and sums and the update
/// all run eagerly, op by op; nothing is traced or differentiated.
fn mlp_step_by_hand((m, _, x, y): &MlpArgs) -> (Mlp, Tensor) {
    let lr = 0.01;
    let mut hs = vec![x.clone()];
    let mut zs = Vec::new();
    for (i, l) in m.layers.iter().enumerate() {
        let z = l.forward(hs.last().expect("the input at least"));
        if i + 1 < m.layers.len() {
            hs.push(z.relu());
        }
        zs.push(z);
    }
    let logits = zs.last().expect("a layer at least");
    let loss = cross_entropy(logits, y);
    let onehot = y.one_hot(logits.shape()[1], logits.dtype());
    let mut dz = &(&logits.softmax(-1) - &onehot) * (1.0 / x.shape()[0] as f64);
    let mut layers = m.layers.clone();
    for i in (0..layers.len()).rev() {
        let dw = hs[i].t().matmul(&dz);
        let db = dz.sum(&[0], false);
        if i > 0 {
            let dh = dz.matmul(&layers[i].weight.t());
            let zero = Tensor::zeros(dh.dtype(), []);
            dz = zs[i - 1]
                .gt(&zero)
                .where_(&dh, &Tensor::zeros(dh.dtype(), dh.shape()));
        }
        let l = &mut layers[i];
        l.weight = &l.weight - &(&dw * lr);
        l.bias = l.bias.as_ref().map(|b| b - &(&db * lr));
    }
    (Mlp { layers }, loss)
}

/// `mlp_train_step` fully eager: [`mlp_step_by_hand`], checked against the reference's
/// evaluation of the traced `mlp_step` (autodiff's gradient).
fn mlp_train_step_eager_ops(batch: usize, verify: bool) -> Result<Timing, String> {
    let (m, s, x, y) = mlp_args(batch, verify)?;
    if verify {
        let args = (m, s, x, y);
        let (m, l) = mlp_step_by_hand(&args);
        return agrees("mlp_train_step_eager_ops", mlp_step, &args, &(m, l))
            .map(|()| Timing::default());
    }
    let mut state = Some(m);
    time(|| {
        let m = state.take().expect("carried");
        let (m, l) = mlp_step_by_hand(&(m, s.clone(), x.clone(), y.clone()));
        let l = l.item().map_err(|e| e.to_string())?;
        state = Some(m);
        Ok(l)
    })
}

fn conv(
    x_shape: [usize; 4],
    w_shape: [usize; 4],
    stride: usize,
    pad: usize,
    verify: bool,
) -> Result<Timing, String> {
    let f = move |(x, w): &(Tensor, Tensor)| x.conv2d(w, (stride, stride), (pad, pad), (1, 1), 1);
    let x = (rand(&x_shape, 10), rand(&w_shape, 11));
    measure("conv", f, &x, verify)
}

fn conv_7x7(n: usize, verify: bool) -> Result<Timing, String> {
    let hw = if verify { 28 } else { 224 };
    conv([n, 3, hw, hw], [64, 3, 7, 7], 2, 3, verify)
}

fn conv_3x3(n: usize, verify: bool) -> Result<Timing, String> {
    let (c, hw) = if verify { (8, 12) } else { (64, 56) };
    conv([n, c, hw, hw], [64, c, 3, 3], 1, 1, verify)
}

/// q, k and v of `t` positions, 8 heads of width 64, batch 8 (2 for the check).
fn attention_inputs(t: usize, verify: bool) -> (Tensor, Tensor, Tensor) {
    let b = if verify { 2 } else { 8 };
    (
        rand(&[b, 8, t, 64], 12),
        rand(&[b, 8, t, 64], 13),
        rand(&[b, 8, t, 64], 14),
    )
}

fn attention(t: usize, verify: bool) -> Result<Timing, String> {
    let f = |(q, k, v): &(Tensor, Tensor, Tensor)| {
        (&q.matmul(&k.t()) * (1.0 / 8.0)).softmax(-1).matmul(v)
    };
    measure("attention", f, &attention_inputs(t, verify), verify)
}

/// The same attention through the library's fused entry point (the peers' `attention_sdpa`
/// row: PyTorch's `F.scaled_dot_product_attention`), scale 1/sqrt(64) by default.
fn attention_sdpa(t: usize, verify: bool) -> Result<Timing, String> {
    let f = |(q, k, v): &(Tensor, Tensor, Tensor)| {
        kiln::nn::scaled_dot_product_attention(q, k, v, None, false, None)
    };
    measure("attention_sdpa", f, &attention_inputs(t, verify), verify)
}

/// The chain of `n` elementwise steps of the compile_chain_* rows: step i is
/// `x = sin(x) * 0.9` for even i and `x = tanh(x * 1.01 + 0.1)` for odd i; the loss is the sum.
fn chain_loss(n: usize) -> impl Fn(&Tensor) -> Tensor + Copy {
    move |x: &Tensor| {
        let mut x = x.clone();
        for i in 0..n {
            x = if i % 2 == 0 {
                &x.sin() * 0.9
            } else {
                (&(&x * 1.01) + 0.1).tanh()
            };
        }
        x.sum(&[0], false)
    }
}

/// The chain's gradient at `x`, computed in f64: the product of the steps' derivatives.
fn chain_grad_f64(n: usize, x: &[f32]) -> Vec<f64> {
    x.iter()
        .map(|&x| {
            let (mut v, mut d) = (f64::from(x), 1.0f64);
            for i in 0..n {
                if i % 2 == 0 {
                    d *= 0.9 * v.cos();
                    v = 0.9 * v.sin();
                } else {
                    v = (v * 1.01 + 0.1).tanh();
                    d *= 1.01 * (1.0 - v * v);
                }
            }
            d
        })
        .collect()
}

/// A fresh, empty kernel cache directory for one cold compile (removed by the caller).
fn fresh_cache_dir(tag: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kiln-bench-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One cold first call of `jit(grad(chain))` at `x`: tracing, compiling with every kiln
/// compile cache bypassed (a new `Jit`, no process-wide executable cache, an empty kernel
/// cache directory) and one execution. Returns the seconds, the gradient and, with `warm`,
/// samples of later calls of the compiled program.
fn chain_first_call(n: usize, x: &Tensor, warm: bool) -> Result<(f64, Vec<f32>, Vec<f64>), String> {
    let dir = fresh_cache_dir(&format!("chain{n}"));
    let t = Instant::now();
    let j = jit(grad(chain_loss(n))).bypassing_caches(Some(dir.clone()));
    let g = j.call(x).map_err(|e| e.to_string())?;
    let g = g.to_vec::<f32>().map_err(|e| e.to_string())?;
    let s = t.elapsed().as_secs_f64();
    let samples = if warm {
        time(|| j.call(x).map_err(|e| e.to_string()))?.samples
    } else {
        Vec::new()
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok((s, g, samples))
}

/// The compile_chain_* rows (shared/bench/README.md): the median of 3 cold first calls of the
/// jitted gradient of an `n`-step chain on x `f32[256]`, after one warm-up compile of a tiny
/// different program (n = 2, x `[8]`). The gradient is checked against [`chain_grad_f64`]; on
/// the small instance (`verify`) also against the reference interpreter.
fn compile_chain(n: usize, verify: bool) -> Result<Timing, String> {
    let size = if verify { 16 } else { 256 };
    let x = normal(&key(4), &[size], DType::F32);
    if verify {
        check(
            "compile_chain",
            move |x: &Tensor| grad(chain_loss(n))(x),
            &x,
        )?;
    } else {
        chain_first_call(2, &normal(&key(4), &[8], DType::F32), false)?;
    }
    let want = chain_grad_f64(n, &x.to_vec::<f32>().map_err(|e| e.to_string())?);
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut first_calls, mut samples) = (Vec::new(), Vec::new());
    let runs = if verify { 1 } else { 3 };
    for run in 0..runs {
        let (s, got, warm) = chain_first_call(n, &x, run + 1 == runs)?;
        samples = warm;
        // The gradient underflows (about 1e-24 at n = 250, 0 in f32 from n = 1000): an
        // absolute floor below f32's smallest normal number.
        if let Some(i) = got
            .iter()
            .zip(&want)
            .position(|(&g, &w)| (f64::from(g) - w).abs() > 1e-3 * scale + 1e-37)
        {
            return Err(format!(
                "compile_chain_{n}: element {i} is {} but the f64 gradient is {}",
                got[i], want[i]
            ));
        }
        first_calls.push(s);
    }
    Ok(Timing {
        first: median(&first_calls),
        samples,
        first_calls,
    })
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "matmul_256",
        sizes: (256, 32),
        run: matmul,
    },
    Workload {
        name: "matmul_1024",
        sizes: (1024, 48),
        run: matmul,
    },
    Workload {
        name: "matmul_2048",
        sizes: (2048, 64),
        run: matmul,
    },
    Workload {
        name: "gelu_chain_16M",
        sizes: (16 << 20, 1000),
        run: gelu_chain,
    },
    Workload {
        name: "softmax_4096x4096",
        sizes: (4096, 64),
        run: softmax,
    },
    Workload {
        name: "layernorm_8192x1024",
        sizes: (8192, 16),
        run: layernorm,
    },
    Workload {
        name: "mlp_train_step",
        sizes: (256, 16),
        run: mlp_train_step,
    },
    Workload {
        name: "mlp_train_step_eager",
        sizes: (256, 16),
        run: mlp_train_step_eager,
    },
    Workload {
        name: "mlp_train_step_eager_ops",
        sizes: (256, 16),
        run: mlp_train_step_eager_ops,
    },
    Workload {
        name: "conv_7x7s2_32x3x224",
        sizes: (32, 2),
        run: conv_7x7,
    },
    Workload {
        name: "conv_3x3_64x64x56",
        sizes: (64, 2),
        run: conv_3x3,
    },
    Workload {
        name: "attention_8x8x512x64",
        sizes: (512, 16),
        run: attention,
    },
    Workload {
        name: "attention_sdpa_8x8x512x64",
        sizes: (512, 16),
        run: attention_sdpa,
    },
    Workload {
        name: "compile_chain_250",
        sizes: (250, 24),
        run: compile_chain,
    },
    Workload {
        name: "compile_chain_1000",
        sizes: (1000, 25),
        run: compile_chain,
    },
    Workload {
        name: "compile_chain_4000",
        sizes: (4000, 26),
        run: compile_chain,
    },
];

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let out = value("--json");
    let only: Vec<String> = value("--only")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    if let Some(bad) = only
        .iter()
        .find(|o| !WORKLOADS.iter().any(|w| w.name == o.as_str()))
    {
        eprintln!(
            "unknown workload `{bad}`; known: {}",
            WORKLOADS
                .iter()
                .map(|w| w.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        std::process::exit(2);
    }
    let mut entries = Vec::new();
    for w in WORKLOADS
        .iter()
        .filter(|w| only.is_empty() || only.iter().any(|o| o == w.name))
    {
        if let Err(e) = (w.run)(w.sizes.1, true) {
            eprintln!("{}: wrong result on the small instance: {e}", w.name);
            std::process::exit(1);
        }
        match (w.run)(w.sizes.0, false) {
            Ok(t) => {
                let med = median(&t.samples);
                let min = t.samples.iter().copied().fold(f64::INFINITY, f64::min);
                eprintln!(
                    "{:24} median {:10.3} ms  first call {:10.3} ms",
                    w.name,
                    med * 1e3,
                    t.first * 1e3
                );
                let samples: Vec<String> = t.samples.iter().map(|s| format!("{s:.6e}")).collect();
                if !t.first_calls.is_empty() {
                    let firsts: Vec<String> =
                        t.first_calls.iter().map(|s| format!("{s:.6e}")).collect();
                    eprintln!("{:24} first calls {:?} s", w.name, t.first_calls);
                    entries.push(format!(
                        "\"{}\": {{\"first_call_s\": {:.6e}, \"first_calls_s\": [{}], \"median_s\": {med:.6e}, \"min_s\": {min:.6e}, \"samples_s\": [{}]}}",
                        w.name,
                        t.first,
                        firsts.join(", "),
                        samples.join(", ")
                    ));
                    continue;
                }
                entries.push(format!(
                    "\"{}\": {{\"first_call_s\": {:.6e}, \"median_s\": {med:.6e}, \"min_s\": {min:.6e}, \"compile_s\": {:.6e}, \"samples_s\": [{}]}}",
                    w.name,
                    t.first,
                    (t.first - med).max(0.0),
                    samples.join(", ")
                ));
            }
            Err(e) => {
                eprintln!("{}: {e}", w.name);
                std::process::exit(1);
            }
        }
    }
    let json = format!(
        "{{\"framework\": \"kiln\", \"results\": {{{}}}}}\n",
        entries.join(", ")
    );
    match out {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, json) {
                eprintln!("{path}: {e}");
                std::process::exit(1);
            }
        }
        None => print!("{json}"),
    }
}
