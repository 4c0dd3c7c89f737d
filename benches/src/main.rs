//! kiln's side of the benchmark contract in `shared/bench/README.md`:
//! `kiln-bench --json FILE [--only a,b]` (run through `cargo xtask bench`).
//!
//! Every workload is written with kiln's user API and compiled with `jit`, as a user would. The
//! timed program checks itself: its first call (the very function that is timed, on the very
//! inputs) is compared with the reference interpreter on the same inputs, per element under
//! the ulp bounds of `kiln_reference::accuracy`; a mismatch exits with status 1 and the
//! workload's name, and no timing is reported. The comparison runs right after the timing, and
//! each workload runs in a process of its own, so that no reference evaluation (gigabytes of
//! allocations) runs in the process before a timing. Every workload is checked at the size it is timed at, the largest products
//! and convolutions included (docs/reliability.md lists the seconds each check takes).

use kiln::control::scan;
use kiln::nn::{Mlp, cross_entropy};
use kiln::optim::{Sgd, SgdState};
use kiln::random::{key, normal, uniform};
use kiln::{DType, Tensor, Tree, grad, jit, value_and_grad};
use std::time::Instant;

mod gpt;

/// A workload: builds inputs of a size and the function to time.
struct Workload {
    name: &'static str,
    /// The size timed (and checked).
    size: usize,
    /// Checks the first call against the reference, then times.
    run: fn(usize) -> Result<Timing, String>,
}

#[derive(Default)]
struct Timing {
    first: f64,
    samples: Vec<f64>,
    /// The fresh first calls of a compile_chain_* row (`first` is their median).
    first_calls: Vec<f64>,
    /// Seconds the check against the reference took (compiled call excluded).
    check_s: f64,
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
        ..Timing::default()
    })
}

/// The arguments `x` as literals.
fn literals<I: Tree>(x: &I) -> Result<Vec<kiln::ir::Literal>, String> {
    x.leaf_vec()
        .iter()
        .map(|t| t.to_literal())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// Checks `got`, the result of `f` at `x` computed some way, against the reference
/// interpreter's evaluation of `f` traced at `x`: per element, under the ulp bounds of
/// `kiln_reference::accuracy` for the traced program. Returns the seconds it took.
fn agrees<I: Tree, O: Tree>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
    got: &O,
) -> Result<f64, String> {
    let t = Instant::now();
    let func = kiln::lower::trace_ir(f, x).map_err(|e| e.to_string())?;
    let args = literals(x)?;
    let got = literals(got)?;
    kiln::reference::accuracy::check_outputs(&func, &args, &got)
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(t.elapsed().as_secs_f64())
}

/// Like [`agrees`] for a result computed by another program than `f` (the hand-written
/// gradient of `mlp_train_step_eager_ops`, which rounds differently from autodiff's): within
/// a relative tolerance of each output's largest value.
fn agrees_loosely<I: Tree, O: Tree>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
    got: &O,
) -> Result<f64, String> {
    let t = Instant::now();
    let func = kiln::lower::trace_ir(f, x).map_err(|e| e.to_string())?;
    let want = kiln::reference::eval(&func, &literals(x)?).map_err(|e| e.to_string())?;
    for (got, want) in literals(got)?.iter().zip(&want) {
        let g = got.to_f64s();
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
    Ok(t.elapsed().as_secs_f64())
}

/// Compiles `f` with `jit`, checks its first call at `x` against the reference and times it.
fn measure<I: Tree, O: Tree + Clone>(
    name: &str,
    f: impl Fn(&I) -> O + Copy,
    x: &I,
) -> Result<Timing, String> {
    let j = jit(f);
    // The first call (the compile) is timed here: it is the one checked.
    let t = Instant::now();
    let got = j.call(x).map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    let t = time(|| j.call(x).map_err(|e| e.to_string()))?;
    // The check runs after the timing (see the module's documentation).
    let check_s = agrees(name, f, x, &got)?;
    Ok(Timing {
        first,
        check_s,
        ..t
    })
}

fn matmul(n: usize) -> Result<Timing, String> {
    let f = |(a, b): &(Tensor, Tensor)| a.matmul(b);
    let x = (rand(&[n, n], 1), rand(&[n, n], 2));
    measure("matmul", f, &x)
}

/// `[rows, 4096] x [4096, 4096]`: a few tokens' activations times a weight matrix, as in
/// inference (the product streams B rather than packing it).
fn matmul_rows(rows: usize) -> Result<Timing, String> {
    let f = |(a, b): &(Tensor, Tensor)| a.matmul(b);
    let x = (rand(&[rows, 4096], 1), rand(&[4096, 4096], 2));
    measure("matmul_rows", f, &x)
}

/// `[1, 4096] x [4096, 4096]ᵀ`: a token's activations times a linear layer's weights stored by
/// output (`[out, in]`), B transposed (the product streams it by dot products).
fn matmul_rows_bt(rows: usize) -> Result<Timing, String> {
    let f = |(a, b): &(Tensor, Tensor)| a.matmul(&b.t());
    let x = (rand(&[rows, 4096], 1), rand(&[4096, 4096], 2));
    measure("matmul_rows_bt", f, &x)
}

fn gelu_chain(n: usize) -> Result<Timing, String> {
    let f = |x: &Tensor| (&(x * 1.5) + 0.25).gelu(true);
    let x = rand(&[n], 3);
    measure("gelu_chain", f, &x)
}

fn softmax(n: usize) -> Result<Timing, String> {
    let f = |x: &Tensor| x.softmax(-1);
    let x = rand(&[n, n], 4);
    measure("softmax", f, &x)
}

fn layernorm(rows: usize) -> Result<Timing, String> {
    let f = |(x, g, b): &(Tensor, Tensor, Tensor)| {
        let mean = x.mean(&[-1], true);
        let c = x - &mean;
        let var = (&c * &c).mean(&[-1], true);
        &(&(&c * &(&var + 1e-5).rsqrt()) * g) + b
    };
    let d = 1024;
    let x = (rand(&[rows, d], 5), rand(&[d], 6), rand(&[d], 7));
    measure("layernorm", f, &x)
}

type MlpArgs = (Mlp, SgdState<Mlp>, Tensor, Tensor);

/// One MLP step: the new parameters and the loss.
type MlpStep = fn(&MlpArgs) -> (Mlp, Tensor);

/// A check of an MLP step's result against the reference ([`agrees`] or [`agrees_loosely`]).
type MlpCheck = fn(&str, MlpStep, &MlpArgs, &(Mlp, Tensor)) -> Result<f64, String>;

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

/// The MLP step's model, optimizer state and a batch of `batch` rows.
fn mlp_args(batch: usize) -> Result<MlpArgs, String> {
    let dims: &[usize] = &[784, 1024, 1024, 10];
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

/// `x` with every leaf in storage of its own (a copy no handle of `x` shares).
fn fresh<T: Tree>(x: &T) -> T {
    x.map_leaves(&mut |t| match t.literal() {
        Some(l) => Tensor::new(l.clone()),
        None => t.clone(),
    })
}

fn mlp_train_step(batch: usize) -> Result<Timing, String> {
    let (m, s, x, y) = mlp_args(batch)?;
    // Parameters are carried from call to call and donated, as the JAX peer does
    // (`donate_argnums`): the step updates them in place. The first call donates them too, as
    // a user's loop does (and as the transformer step's first call does), so it compiles the
    // program every later call runs; the check reads copies of its arguments and result.
    let j = jit(mlp_step);
    // The first call (the compile) is timed here: it is the one checked.
    let args = (fresh(&m), s.clone(), x.clone(), y.clone());
    let t = Instant::now();
    let (m, l) = j
        .call_donating((m, s.clone(), x.clone(), y.clone()))
        .map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    let got = (fresh(&m), l);
    let mut state = Some(m);
    let t = time(|| {
        let m = state.take().expect("carried");
        let (m, l) = j
            .call_donating((m, s.clone(), x.clone(), y.clone()))
            .map_err(|e| e.to_string())?;
        state = Some(m);
        Ok(l)
    })?;
    let check_s = agrees("mlp_train_step", mlp_step, &args, &got)?;
    Ok(Timing {
        first,
        check_s,
        ..t
    })
}

/// Times `step` (an eager MLP step) from `args`, carrying the parameters, after checking its
/// first result with `agree`.
/// An eager MLP step taking its arguments: it may step the parameters in place.
type MlpStepOwned = fn(MlpArgs) -> (Mlp, Tensor);

fn eager_mlp(
    name: &str,
    step: MlpStepOwned,
    agree: MlpCheck,
    args: MlpArgs,
) -> Result<Timing, String> {
    // The first call (the gradient's compile) is timed here: it is the one checked.
    let t = Instant::now();
    let got = step(args.clone());
    got.1.item().map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    let checked = args.clone();
    let (m, s, x, y) = args;
    let mut state = Some(m);
    let t = time(|| {
        let m = state.take().expect("carried");
        let (m, l) = step((m, s.clone(), x.clone(), y.clone()));
        let l = l.item().map_err(|e| e.to_string())?;
        state = Some(m);
        Ok(l)
    })?;
    let check_s = agree(name, mlp_step, &checked, &got)?;
    Ok(Timing {
        first,
        check_s,
        ..t
    })
}

/// `mlp_train_step` without `jit`, as a user's eager loop runs it: the gradient comes from
/// `value_and_grad` (which compiles the gradient function once per signature) and the update
/// runs op by op, into the parameters the optimizer is handed (`Sgd::step`, as PyTorch's
/// `optimizer.step()` updates its parameters in place).
fn mlp_train_step_eager(batch: usize) -> Result<Timing, String> {
    eager_mlp(
        "mlp_train_step_eager",
        mlp_step_eager,
        agrees,
        mlp_args(batch)?,
    )
}

/// [`mlp_step`] with the parameters handed to the optimizer, which writes the step into them
/// where nothing else holds them.
fn mlp_step_eager((m, s, x, y): MlpArgs) -> (Mlp, Tensor) {
    let opt = Sgd::new(0.01);
    let (l, g) = match value_and_grad(|m: &Mlp| cross_entropy(&m.forward(&x), &y), &m) {
        Ok(r) => r,
        Err(e) => return (m, Tensor::failed(e)),
    };
    match opt.step(m, &g, s) {
        Ok((m, _)) => (m, l),
        Err(e) => (g, Tensor::failed(e)),
    }
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
/// Its result is a different program's (the gradient written by hand rounds otherwise than
/// autodiff's): checked within a relative tolerance, not the traced program's ulp bounds.
fn mlp_train_step_eager_ops(batch: usize) -> Result<Timing, String> {
    eager_mlp(
        "mlp_train_step_eager_ops",
        |a| mlp_step_by_hand(&a),
        agrees_loosely,
        mlp_args(batch)?,
    )
}

fn conv(
    x_shape: [usize; 4],
    w_shape: [usize; 4],
    stride: usize,
    pad: usize,
) -> Result<Timing, String> {
    let f = move |(x, w): &(Tensor, Tensor)| x.conv2d(w, (stride, stride), (pad, pad), (1, 1), 1);
    let x = (rand(&x_shape, 10), rand(&w_shape, 11));
    measure("conv", f, &x)
}

/// A batch of `n` images.
fn conv_7x7(n: usize) -> Result<Timing, String> {
    conv([n, 3, 224, 224], [64, 3, 7, 7], 2, 3)
}

/// A batch of `n` images.
fn conv_3x3(n: usize) -> Result<Timing, String> {
    conv([n, 64, 56, 56], [64, 64, 3, 3], 1, 1)
}

/// q, k and v of 512 positions, 8 heads of width 64, batch `b`.
fn attention_inputs(b: usize) -> (Tensor, Tensor, Tensor) {
    let t = 512;
    (
        rand(&[b, 8, t, 64], 12),
        rand(&[b, 8, t, 64], 13),
        rand(&[b, 8, t, 64], 14),
    )
}

/// A batch of `b`.
fn attention(b: usize) -> Result<Timing, String> {
    let f = |(q, k, v): &(Tensor, Tensor, Tensor)| {
        (&q.matmul(&k.t()) * (1.0 / 8.0)).softmax(-1).matmul(v)
    };
    measure("attention", f, &attention_inputs(b))
}

/// The same attention through the library's fused entry point (the peers' `attention_sdpa`
/// row: PyTorch's `F.scaled_dot_product_attention`), scale 1/sqrt(64) by default.
fn attention_sdpa(b: usize) -> Result<Timing, String> {
    let f = |(q, k, v): &(Tensor, Tensor, Tensor)| {
        kiln::nn::scaled_dot_product_attention(q, k, v, None, false, None)
    };
    measure("attention_sdpa", f, &attention_inputs(b))
}

/// An ascending sort of `n` standard normal f32 keys. Checked against Rust's own stable sort
/// of the same keys (the reference interpreter sorts by calling the comparator region for
/// every comparison: hours at this size), bit for bit.
fn sort(n: usize) -> Result<Timing, String> {
    let x = normal(&key(3), &[n], DType::F32);
    let j = jit(|x: &Tensor| x.sort(0, false));
    let t = Instant::now();
    let got = j.call(&x).map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    let timing = time(|| j.call(&x).map_err(|e| e.to_string()))?;
    let t = Instant::now();
    let mut want = x.to_vec::<f32>().map_err(|e| e.to_string())?;
    want.sort_by(|a, b| a.partial_cmp(b).expect("normal keys are numbers"));
    let got = got.to_vec::<f32>().map_err(|e| e.to_string())?;
    if let Some(i) = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        return Err(format!(
            "sort: element {i} is {} but a stable sort gives {}",
            got[i], want[i]
        ));
    }
    Ok(Timing {
        first,
        check_s: t.elapsed().as_secs_f64(),
        ..timing
    })
}

/// The stable descending order of each row of `v` ([rows, n] standard normal keys, no NaN),
/// positions of equal keys in order.
fn descending_rows(v: &[f32], n: usize) -> Vec<i32> {
    v.chunks(n)
        .flat_map(|row| {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by(|&a, &b| {
                row[b]
                    .partial_cmp(&row[a])
                    .expect("normal keys are numbers")
            });
            idx.into_iter().map(|i| i as i32)
        })
        .collect()
}

/// `top_k_64x50000_k5`: the 5 greatest of each row of `[64, n]` standard normal f32 keys and
/// their positions (`Tensor::top_k`). Checked against Rust's own stable sort of each row (the
/// reference interpreter calls the comparator region for every comparison), bit for bit.
fn top_k(n: usize) -> Result<Timing, String> {
    top_k_rows(n, true)
}

/// `top_k_eager_64x50000_k5`: [`top_k`] without `jit`, as an eager program calls it.
fn top_k_eager(n: usize) -> Result<Timing, String> {
    top_k_rows(n, false)
}

/// [`top_k`], under `jit` (`compiled`) or eagerly.
fn top_k_rows(n: usize, compiled: bool) -> Result<Timing, String> {
    let k = 5;
    let x = normal(&key(6), &[64, n], DType::F32);
    let j = jit(move |x: &Tensor| x.top_k(k, 1));
    let call = || -> Result<(Tensor, Tensor), String> {
        if compiled {
            j.call(&x).map_err(|e| e.to_string())
        } else {
            let (v, p) = x.top_k(k, 1);
            match v.error().or(p.error()) {
                Some(e) => Err(e.to_string()),
                None => Ok((v, p)),
            }
        }
    };
    let t = Instant::now();
    let (vals, pos) = call()?;
    let first = t.elapsed().as_secs_f64();
    let timing = time(call)?;
    let t = Instant::now();
    let v = x.to_vec::<f32>().map_err(|e| e.to_string())?;
    let want: Vec<i32> = descending_rows(&v, n)
        .chunks(n)
        .flat_map(|c| c[..k].to_vec())
        .collect();
    let got = pos.to_vec::<i32>().map_err(|e| e.to_string())?;
    let got_vals = vals.to_vec::<f32>().map_err(|e| e.to_string())?;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let (r, wv) = (i / k, v[(i / k) * n + w as usize]);
        if g != w || got_vals[i].to_bits() != wv.to_bits() {
            return Err(format!(
                "top_k: row {r} element {} is {} at {g} but a stable sort gives {wv} at {w}",
                i % k,
                got_vals[i]
            ));
        }
    }
    Ok(Timing {
        first,
        check_s: t.elapsed().as_secs_f64(),
        ..timing
    })
}

/// `argsort_64x50000`: the positions of each row of `[64, n]` standard normal f32 keys in
/// descending order (`Tensor::argsort`), the whole sort `top_k_64x50000_k5` avoids. Checked
/// against Rust's own stable sort, position for position.
fn argsort_rows(n: usize) -> Result<Timing, String> {
    let x = normal(&key(6), &[64, n], DType::F32);
    let j = jit(|x: &Tensor| x.argsort(1, true));
    let t = Instant::now();
    let got = j.call(&x).map_err(|e| e.to_string())?;
    let first = t.elapsed().as_secs_f64();
    let timing = time(|| j.call(&x).map_err(|e| e.to_string()))?;
    let t = Instant::now();
    let v = x.to_vec::<f32>().map_err(|e| e.to_string())?;
    let want = descending_rows(&v, n);
    let got = got.to_vec::<i32>().map_err(|e| e.to_string())?;
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        return Err(format!(
            "argsort: row {} element {} is {} but a stable sort gives {}",
            i / n,
            i % n,
            got[i],
            want[i]
        ));
    }
    Ok(Timing {
        first,
        check_s: t.elapsed().as_secs_f64(),
        ..timing
    })
}

/// One step of the scan rows' recurrence: `h' = tanh(h W + x)`, for `h` and `x` of
/// `[16, 64]` and `W` of `[64, 64]`.
fn rnn_step(w: &Tensor, h: &Tensor, x: &Tensor) -> Tensor {
    h.matmul(w).add(x).tanh()
}

/// `scan_N`: `N` steps of [`rnn_step`] as one `scan` (a loop in the program, run by the host):
/// what the loop costs over the same steps written out.
fn scan_rnn(n: usize) -> Result<Timing, String> {
    let w = &rand(&[64, 64], 21) * 0.125;
    let xs = rand(&[n, 16, 64], 22);
    let h0 = rand(&[16, 64], 23);
    measure(
        "scan",
        |(w, xs, h0): &(Tensor, Tensor, Tensor)| {
            scan(
                |h: &Tensor, x: &Tensor| (rnn_step(w, h, x), ()),
                h0.clone(),
                xs,
            )
            .map(|(h, ())| h)
            .unwrap_or_else(Tensor::failed)
        },
        &(w, xs, h0),
    )
}

/// `scan_N_unrolled`: the same `N` steps written out in one straight-line program.
fn scan_rnn_unrolled(n: usize) -> Result<Timing, String> {
    let w = &rand(&[64, 64], 21) * 0.125;
    let xs = rand(&[n, 16, 64], 22);
    let h0 = rand(&[16, 64], 23);
    measure(
        "scan_unrolled",
        |(w, xs, h0): &(Tensor, Tensor, Tensor)| {
            let mut h = h0.clone();
            for t in 0..xs.shape()[0] {
                h = rnn_step(w, &h, &xs.index(t as isize));
            }
            h
        },
        &(w, xs, h0),
    )
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
/// different program (n = 2, x `[8]`). Every call's gradient is checked against
/// [`chain_grad_f64`], the first also against the reference interpreter.
fn compile_chain(n: usize) -> Result<Timing, String> {
    let x = normal(&key(4), &[256], DType::F32);
    chain_first_call(2, &normal(&key(4), &[8], DType::F32), false)?;
    let want = chain_grad_f64(n, &x.to_vec::<f32>().map_err(|e| e.to_string())?);
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut first_calls, mut samples, mut check_s) = (Vec::new(), Vec::new(), 0.0);
    for run in 0..3 {
        let (s, got, warm) = chain_first_call(n, &x, run == 2)?;
        samples = warm;
        if run == 0 {
            let got = Tensor::from_vec(got.clone(), [got.len()]).map_err(|e| e.to_string())?;
            check_s = agrees(
                &format!("compile_chain_{n}"),
                move |x: &Tensor| grad(chain_loss(n))(x),
                &x,
                &got,
            )?;
        }
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
        check_s,
    })
}

/// The workloads, each checked at the size it is timed at (docs/reliability.md lists the
/// seconds each check takes).
const WORKLOADS: &[Workload] = &[
    Workload {
        name: "matmul_256",
        size: 256,
        run: matmul,
    },
    Workload {
        name: "matmul_1024",
        size: 1024,
        run: matmul,
    },
    Workload {
        name: "matmul_2048",
        size: 2048,
        run: matmul,
    },
    Workload {
        name: "matmul_1x4096x4096",
        size: 1,
        run: matmul_rows,
    },
    Workload {
        name: "matmul_8x4096x4096",
        size: 8,
        run: matmul_rows,
    },
    Workload {
        name: "matmul_1x4096x4096_bt",
        size: 1,
        run: matmul_rows_bt,
    },
    Workload {
        name: "gelu_chain_16M",
        size: 16 << 20,
        run: gelu_chain,
    },
    Workload {
        name: "softmax_4096x4096",
        size: 4096,
        run: softmax,
    },
    Workload {
        name: "layernorm_8192x1024",
        size: 8192,
        run: layernorm,
    },
    Workload {
        name: "mlp_train_step",
        size: 256,
        run: mlp_train_step,
    },
    Workload {
        name: "transformer_train_step",
        size: 16,
        run: gpt::transformer_train_step,
    },
    Workload {
        name: "mlp_train_step_eager",
        size: 256,
        run: mlp_train_step_eager,
    },
    Workload {
        name: "mlp_train_step_eager_ops",
        size: 256,
        run: mlp_train_step_eager_ops,
    },
    Workload {
        name: "conv_7x7s2_32x3x224",
        size: 32,
        run: conv_7x7,
    },
    Workload {
        name: "conv_3x3_64x64x56",
        size: 64,
        run: conv_3x3,
    },
    Workload {
        name: "attention_8x8x512x64",
        size: 8,
        run: attention,
    },
    Workload {
        name: "attention_sdpa_8x8x512x64",
        size: 8,
        run: attention_sdpa,
    },
    Workload {
        name: "sort_16M",
        size: 16 << 20,
        run: sort,
    },
    Workload {
        name: "top_k_64x50000_k5",
        size: 50000,
        run: top_k,
    },
    Workload {
        name: "top_k_eager_64x50000_k5",
        size: 50000,
        run: top_k_eager,
    },
    Workload {
        name: "argsort_64x50000",
        size: 50000,
        run: argsort_rows,
    },
    Workload {
        name: "scan_1000",
        size: 1000,
        run: scan_rnn,
    },
    Workload {
        name: "scan_1000_unrolled",
        size: 1000,
        run: scan_rnn_unrolled,
    },
    Workload {
        name: "compile_chain_250",
        size: 250,
        run: compile_chain,
    },
    Workload {
        name: "compile_chain_1000",
        size: 1000,
        run: compile_chain,
    },
    Workload {
        name: "compile_chain_4000",
        size: 4000,
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
    let selected = WORKLOADS
        .iter()
        .filter(|w| only.is_empty() || only.iter().any(|o| o == w.name));
    // Each workload runs in a process of its own (this program again, with `--entry FILE`,
    // which writes that workload's JSON entry): a check's reference evaluation leaves the
    // process's memory in a state that made the memory-bound workload timed after it up to
    // 1.75x slower (gelu_chain_16M: 33.7 ms after matmul_1024's check, 19.2 ms alone).
    let entry_file = value("--entry");
    if entry_file.is_none() {
        let exe = std::env::current_exe().unwrap_or_else(|e| {
            eprintln!("cannot find this program to run each workload in its own process: {e}");
            std::process::exit(1)
        });
        let dir = std::env::temp_dir();
        let mut entries = Vec::new();
        for w in selected {
            let file = dir.join(format!("kiln-bench-{}-{}.json", std::process::id(), w.name));
            let status = std::process::Command::new(&exe)
                .args(["--only", w.name, "--entry"])
                .arg(&file)
                .status();
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => std::process::exit(s.code().unwrap_or(1)),
                Err(e) => {
                    eprintln!("{}: cannot start {}: {e}", w.name, exe.display());
                    std::process::exit(1);
                }
            }
            match std::fs::read_to_string(&file) {
                Ok(e) => entries.push(e),
                Err(e) => {
                    eprintln!("{}: {}: {e}", w.name, file.display());
                    std::process::exit(1);
                }
            }
            let _ = std::fs::remove_file(&file);
        }
        write_results(out, &entries);
        return;
    }
    let mut entries = Vec::new();
    for w in selected {
        let run = (w.run)(w.size);
        match run {
            Ok(t) => {
                let med = median(&t.samples);
                let min = t.samples.iter().copied().fold(f64::INFINITY, f64::min);
                eprintln!(
                    "{:24} median {:10.3} ms  first call {:10.3} ms  checked in {:.1} s",
                    w.name,
                    med * 1e3,
                    t.first * 1e3,
                    t.check_s,
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
    if let Some(path) = entry_file
        && let Err(e) = std::fs::write(&path, entries.join(", "))
    {
        eprintln!("{path}: {e}");
        std::process::exit(1);
    }
}

/// Writes the results' JSON (the contract in `shared/bench/README.md`) to `out`, or prints it.
fn write_results(out: Option<String>, entries: &[String]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The check accepts a compiled product and refuses it with one element off by a
    /// thousandth (far past the sum's bound, far inside the old tolerance of a thousandth of
    /// the largest value).
    #[test]
    fn the_check_refuses_a_wrong_element() {
        let f = |(a, b): &(Tensor, Tensor)| a.matmul(b);
        let x = (rand(&[40, 30], 1), rand(&[30, 20], 2));
        let got = jit(f).call(&x).unwrap();
        agrees("matmul", f, &x, &got).unwrap();
        let mut v = got.to_vec::<f32>().unwrap();
        v[7] += 1e-3 * v[7].abs().max(1e-3);
        let bad = Tensor::from_vec(v, [40, 20]).unwrap();
        let e = agrees("matmul", f, &x, &bad).unwrap_err();
        assert!(e.contains("element 7"), "{e}");
    }
}
