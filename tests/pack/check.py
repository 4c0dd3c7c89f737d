#!/usr/bin/env python3
"""The GPU check of a kiln pack (written by `cargo xtask gpu-pack`): stdlib and PyTorch only.

Every program (spec examples and random programs) runs through `kiln-run`, which compares its
results with the reference interpreter's (`--expect`, under the bounds of kiln's differential
tests). Each workload runs on inputs `kiln-run` makes from a seed (`--random-inputs`, saved with
`--save-inputs`); its median (`--bench`) is put beside PyTorch's eager and torch.compile medians
on the same inputs and GPU, and its results are compared with PyTorch's. A workload compiled with
TF32 products allowed (`"precision": "tf32"` in pack.json) is computed by PyTorch with
`torch.backends.cuda.matmul.allow_tf32 = True`, every other with it False (exact f32 products).
PyTorch's convolutions (cuDNN) use TF32 by default: the check sets
`torch.backends.cudnn.allow_tf32 = False` for every workload, so that PyTorch's convolutions,
like kiln's, are exact f32 arithmetic and their results compare within 1e-4.

A workload whose arguments random ones (uniform in +-4) would not do (`"inputs": "check.py"`:
the transformer's step, which takes token ids and second moments) gets them from this script,
made with PyTorch from the workload's seed (see `make_inputs`), written as .npy and given to
`kiln-run --inputs`; the same tensors go to PyTorch.

Environment: KILN_RUN_DEVICE (cuda:0 by default, or `emulator`), KILN_CHECK_JOBS (programs run
side by side, 8 by default), KILN_CHECK_JSON (where the JSON goes; check-results.json beside
this script by default), KILN_CHECK_NO_COMPILE=1 (no torch.compile timings),
KILN_CHECK_TIMEOUT (seconds one program may run, 300 by default: a kernel that never ends is a
failure, not a hang). Exit code 0 only when everything passed.
"""
import ast
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KILN_RUN = os.path.join(HERE, "kiln-run")


def read_npy(path):
    """(descr, shape, raw bytes) of a .npy file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    if data[6] == 1:
        n, start = int.from_bytes(data[8:10], "little"), 10
    else:
        n, start = int.from_bytes(data[8:12], "little"), 12
    header = ast.literal_eval(data[start:start + n].decode("latin1"))
    return header["descr"], tuple(header["shape"]), data[start + n:]


def to_torch(path, torch):
    descr, shape, raw = read_npy(path)
    dtypes = {
        "<f4": torch.float32, "<f8": torch.float64, "<f2": torch.float16, "<V2": torch.bfloat16,
        "<i4": torch.int32, "<i8": torch.int64, "|i1": torch.int8, "|u1": torch.uint8,
        "|b1": torch.bool,
    }
    if descr not in dtypes:
        raise ValueError(f"{path}: dtype {descr} is not read here")
    if not raw:
        return torch.zeros(shape, dtype=dtypes[descr])
    return torch.frombuffer(bytearray(raw), dtype=dtypes[descr]).reshape(shape)


def write_npy(path, t, torch):
    """Writes the tensor `t` as a .npy file (version 1.0, C order)."""
    import ctypes
    descr = {torch.float32: "<f4", torch.int32: "<i4"}[t.dtype]
    t = t.detach().cpu().contiguous()
    shape = tuple(t.shape)
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (
        descr, "(%d,)" % shape[0] if len(shape) == 1 else str(shape))
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + raw)


def gpt_sizes(shapes):
    """(parameters, blocks, vocabulary) of the transformer step whose argument shapes are
    `shapes`: the parameters, their first and second moments, the step count, the tokens."""
    n = (len(shapes) - 2) // 3
    return n, (n - 5) // 12, shapes[0][0]


def make_inputs(w, torch, dev):
    """The arguments of a workload packed with `"inputs": "check.py"`, from its seed: for the
    transformer's step, the model as the benchmark's contract draws it (weights N(0, 0.02^2),
    biases and shifts 0, LayerNorm scales 1), tokens uniform in the vocabulary, and moments
    as a run meets them after 3 steps (first moments uniform in +-1e-3, second in [1e-8,
    1e-6), the step count 3), as the pack's tiny size has them (`tests/pack/gpt.rs`). Not the
    first step's zero moments: there the update of a parameter whose gradient is zero but for
    rounding (the attention keys' bias: softmax ignores what it adds to every key alike) is
    lr * g / (|g| + eps) of that rounding, which no two implementations share."""
    if w["kind"] != "gpt_step":
        raise ValueError(f"{w['name']}: no way to make the inputs of a `{w['kind']}` workload")
    shapes = [tuple(s) for s in w["arg_shapes"]]
    n, layers, vocab = gpt_sizes(shapes)
    scales = {2 + 12 * l for l in range(layers)} | {8 + 12 * l for l in range(layers)} | {n - 3}
    g = torch.Generator(device="cpu").manual_seed(w["seed"])
    args = []
    for i, s in enumerate(shapes):
        if i == 3 * n + 1:
            args.append(torch.randint(0, vocab, s, generator=g, dtype=torch.int64).to(torch.int32))
        elif i < n and i in scales:
            args.append(torch.ones(s))
        elif i < n and len(s) == 2:
            args.append(torch.randn(s, generator=g) * 0.02)
        elif i < n:
            args.append(torch.zeros(s))
        elif i < 2 * n:
            args.append((torch.rand(s, generator=g) * 2 - 1) * 1e-3)
        elif i < 3 * n:
            args.append(1e-8 + torch.rand(s, generator=g) * (1e-6 - 1e-8))
        else:
            args.append(torch.full(s, 3.0))
    return [a.to(dev) for a in args]


def torch_workloads(torch):
    F = torch.nn.functional

    def gpt_step(*args):
        """The transformer's step as kiln's `tests/pack/gpt.rs` computes it: the loss, its
        gradients, AdamW (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, decoupled decay 0.01)."""
        n, layers, vocab = gpt_sizes([tuple(a.shape) for a in args])
        ps = [t.detach().clone().requires_grad_(True) for t in args[:n]]
        ms, vs, step, tokens = args[n:2 * n], args[2 * n:3 * n], args[3 * n], args[3 * n + 1]
        seq = tokens.shape[1] - 1
        inputs, targets = tokens[:, :seq].long(), tokens[:, 1:].long()
        d = ps[0].shape[1]
        heads = d // 64

        def ln(x, g, b):
            return F.layer_norm(x, (d,), g, b, 1e-5)

        with torch.enable_grad():
            x = ps[0][inputs] + ps[1]
            bsz = x.shape[0]
            for l in range(layers):
                p = ps[2 + 12 * l:14 + 12 * l]
                qkv = ln(x, p[0], p[1]) @ p[2] + p[3]
                q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(bsz, seq, heads, d // heads)
                           .transpose(1, 2) for i in range(3))
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)
                x = x + att.transpose(1, 2).reshape(bsz, seq, d) @ p[4] + p[5]
                hidden = F.gelu(ln(x, p[6], p[7]) @ p[8] + p[9], approximate="tanh")
                x = x + hidden @ p[10] + p[11]
            logits = ln(x, ps[n - 3], ps[n - 2]) @ ps[n - 1]
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
            gs = torch.autograd.grad(loss, ps)
        t = step + 1
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(ps, gs, ms, vs):
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            upd = (m / c1) / (torch.sqrt(v / c2) + 1e-8) + 0.01 * p.detach()
            new_p.append(p.detach() - 1e-3 * upd)
            new_m.append(m)
            new_v.append(v)
        return new_p + new_m + new_v + [t, loss.detach()]

    def mlp_step(w1, b1, w2, b2, w3, b3, x, y):
        ps = [t.detach().clone().requires_grad_(True) for t in (w1, b1, w2, b2, w3, b3)]
        with torch.enable_grad():
            h1 = torch.relu(x @ ps[0] + ps[1])
            h2 = torch.relu(h1 @ ps[2] + ps[3])
            logits = h2 @ ps[4] + ps[5]
            loss = -(y * torch.log_softmax(logits, -1)).sum(-1).mean()
            gs = torch.autograd.grad(loss, ps)
        return [p.detach() - 0.01 * g for p, g in zip(ps, gs)] + [loss.detach()]

    return {
        "gelu": lambda x: [F.gelu(x * 1.5 + 0.25, approximate="tanh")],
        "softmax": lambda x: [torch.softmax(x, -1)],
        "layernorm": lambda x, g, b: [
            (x - x.mean(-1, keepdim=True))
            * torch.rsqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-5)
            * g + b
        ],
        "matmul": lambda a, b: [a @ b],
        "matmul_f32": lambda a, b: [a @ b],
        "matmul_tf32": lambda a, b: [a @ b],
        "attention": lambda q, k, v: [torch.softmax((q @ k.transpose(-2, -1)) * 0.125, -1) @ v],
        "attention_causal": lambda q, k, v: [F.scaled_dot_product_attention(q, k, v, is_causal=True)],
        # bf16 Q, K and V: PyTorch's fused (flash) attention in bf16.
        "attention_bf16": lambda q, k, v: [F.scaled_dot_product_attention(q, k, v)],
        "attention_causal_bf16": lambda q, k, v: [F.scaled_dot_product_attention(q, k, v, is_causal=True)],
        "linear_bias_gelu": lambda x, w, b: [F.gelu(x @ w + b, approximate="tanh")],
        "mlp_step": mlp_step,
        "gpt_step": gpt_step,
        "conv": lambda x, w: [F.conv2d(x, w, stride=1, padding=1)],
        "conv_7x7s2": lambda x, w: [F.conv2d(x, w, stride=2, padding=3)],
        "sort": lambda x: [torch.sort(x, dim=-1, stable=True).values],
    }


def torch_device(device):
    """PyTorch's name of the GPU a KILN_RUN_DEVICE names (`cuda` or `cuda:N`)."""
    return "cuda:" + device.split(":")[1] if ":" in device else "cuda:0"


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def time_torch(torch, fn, args, calls):
    for _ in range(2):
        fn(*args)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return median(times)


def rel_error(torch, got, want):
    g, w = got.double(), want.double()
    return float(torch.linalg.vector_norm(g - w) / max(float(torch.linalg.vector_norm(w)), 1e-30))


def run(cmd, timeout):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr.strip()
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout} s"


def check_program(p, device):
    d = os.path.join(HERE, p["dir"])
    cmd = [KILN_RUN, os.path.join(d, "artifact"), "--device", device, "--inputs"]
    cmd += [os.path.join(d, f"arg{i}.npy") for i in range(p["args"])]
    cmd += ["--expect"] + [os.path.join(d, f"ref{i}.npy") for i in range(p["results"])]
    rc, _, err = run(cmd, int(os.environ.get("KILN_CHECK_TIMEOUT", "300")))
    if rc != 0:
        first = err.splitlines()[0] if err else ""
        progress(f"FAIL {p['name']} (exit {rc}): {first}")
    return p["name"], rc, err


def bench_json(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def numbered(d, prefix):
    """How many files `prefix0.npy`, `prefix1.npy`, ... folder `d` holds in a row."""
    n = 0
    while os.path.exists(os.path.join(d, f"{prefix}{n}.npy")):
        n += 1
    return n


def check_workload(w, device, torch, notes, variant=None):
    """A workload's row; with `variant` (a sweep entry), the variant's artifact, timed and
    checked against PyTorch but without PyTorch's timings."""
    name = w["name"] if variant is None else f"{w['name']} {variant['label']}"
    row = {"name": name, "kiln_ms": None, "torch_eager_ms": None, "torch_compile_ms": None,
           "max_rel_error": None, "ok": False, "note": ""}
    d = os.path.join(HERE, w["dir"] if variant is None else variant["dir"])
    if device == "emulator":
        # The tiny program's own arguments and results: a model's tiny size has fewer layers,
        # so fewer parameters, than the GPU size's (`w["args"]`).
        t = os.path.join(d, "tiny")
        cmd = [KILN_RUN, os.path.join(t, "artifact"), "--device", device, "--bench", "1", "--inputs"]
        cmd += [os.path.join(t, f"arg{i}.npy") for i in range(numbered(t, "arg"))]
        cmd += ["--expect"] + [os.path.join(t, f"ref{i}.npy") for i in range(numbered(t, "ref"))]
        rc, out, err = run(cmd, 300)
        b = bench_json(out)
        row["kiln_ms"] = b and b["median_ms"]
        row["ok"] = rc == 0
        row["note"] = "tiny size on the emulator, against the reference" + ("" if rc == 0 else f": {err}")
        return row
    tmp = tempfile.mkdtemp(prefix="kiln-check-")
    restore = []
    try:
        made = w.get("inputs") == "check.py"
        if made and (torch is None or not torch.cuda.is_available()):
            row["note"] = "its inputs are made with PyTorch, which is unavailable with CUDA"
            return row
        cmd = [KILN_RUN, os.path.join(d, "artifact"), "--device", device,
               "--out", os.path.join(tmp, "out"), "--bench", str(w["calls"])]
        if made:
            # Made here, with PyTorch, from the workload's seed.
            os.makedirs(os.path.join(tmp, "in"))
            dev = torch.device(torch_device(device))
            made = make_inputs(w, torch, dev)
            for i, a in enumerate(made):
                write_npy(os.path.join(tmp, "in", f"arg{i}.npy"), a, torch)
            cmd += ["--inputs"] + [os.path.join(tmp, "in", f"arg{i}.npy") for i in range(w["args"])]
        else:
            cmd += ["--random-inputs", str(w["seed"]), "--save-inputs", os.path.join(tmp, "in")]
        rc, out, err = run(cmd, 600)
        if rc != 0:
            row["note"] = f"kiln-run failed ({rc}): {err}"
            return row
        b = bench_json(out)
        row["kiln_ms"] = b and b["median_ms"]
        if torch is None or not torch.cuda.is_available():
            row["ok"] = True
            row["note"] = "PyTorch with CUDA unavailable: not compared"
            return row
        # PyTorch's products in the workload's precision (restored below).
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = w.get("precision") == "tf32"
        restore.append(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", allow_tf32))
        # cuDNN's convolutions default to TF32: exact f32 ones, as kiln computes them.
        conv_tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        restore.append(lambda: setattr(torch.backends.cudnn, "allow_tf32", conv_tf32))
        dev = torch.device(torch_device(device))
        args = [to_torch(os.path.join(tmp, "in", f"arg{i}.npy"), torch).to(dev) for i in range(w["args"])]
        if w.get("inputs") == "check.py":
            args = made
        got = [to_torch(os.path.join(tmp, "out", f"out{i}.npy"), torch).to(dev) for i in range(w["results"])]
        fn = torch_workloads(torch)[w["kind"]]
        want = fn(*args)
        errs = [rel_error(torch, g, x) for g, x in zip(got, want)]
        row["max_rel_error"] = max(errs)
        row["ok"] = len(got) == len(want) and all(e <= w["tolerance"] for e in errs)
        if not row["ok"]:
            row["note"] = f"results differ from PyTorch's: relative errors {errs}, tolerance {w['tolerance']}"
        if w["kind"] in ("gelu", "softmax", "layernorm") and row["kiln_ms"] and row["ok"]:
            moved = sum(a.numel() * a.element_size() for a in args + got)
            row["note"] = "kiln moves %.0f GB/s" % (moved / row["kiln_ms"] / 1e6)
        if variant is not None:
            return row
        row["torch_eager_ms"] = time_torch(torch, fn, args, w["calls"])
        if os.environ.get("KILN_CHECK_NO_COMPILE") == "1":
            notes.append(f"{w['name']}: torch.compile skipped (KILN_CHECK_NO_COMPILE=1)")
            return row
        try:
            row["torch_compile_ms"] = time_torch(torch, torch.compile(fn), args, w["calls"])
        except Exception as e:  # torch.compile needs a working compiler toolchain
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            notes.append(f"{w['name']}: torch.compile failed: {first}")
        return row
    finally:
        for r in restore:
            r()
        shutil.rmtree(tmp, ignore_errors=True)


def progress(message):
    print(f"[check] {message}", file=sys.stderr, flush=True)


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def main():
    device = os.environ.get("KILN_RUN_DEVICE", "cuda:0")
    with open(os.path.join(HERE, "pack.json")) as f:
        pack = json.load(f)
    notes = list(pack.get("skipped", []))
    # A copy that lost its modes (scp without -p, a zip) still runs.
    if not os.access(KILN_RUN, os.X_OK):
        os.chmod(KILN_RUN, 0o755)
    try:
        import torch
    except ImportError:
        torch = None
        notes.append("PyTorch is not importable: the workloads are not compared with PyTorch")
    start = time.time()
    if device != "emulator" and pack["programs"]:
        # Without a driver or the GPU every run fails alike: say it once.
        _, rc, err = check_program(pack["programs"][0], device)
        if rc == 5:
            print(f"kiln GPU check on {device}: {err}")
            print("(KILN_RUN_DEVICE=emulator runs the programs on kiln's GPU emulator instead)")
            sys.exit(3)
    jobs = int(os.environ.get("KILN_CHECK_JOBS", "8"))
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max(jobs, 1)) as ex:
        results = list(ex.map(lambda p: check_program(p, device), pack["programs"]))
    for name, rc, err in results:
        if rc != 0:
            failures.append({"name": name, "exit_code": rc, "message": err})
    progress(f"{len(results)} programs run, {len(failures)} failed, {time.time() - start:.0f} s")
    rows = []
    for w in pack["workloads"]:
        t = time.time()
        rows.append(check_workload(w, device, torch, notes))
        r = rows[-1]
        progress(f"workload {w['name']}: {'ok' if r['ok'] else 'FAIL'}, kiln {fmt(r['kiln_ms'])} ms, "
                 f"eager {fmt(r['torch_eager_ms'])} ms, compile {fmt(r['torch_compile_ms'])} ms, "
                 f"{time.time() - t:.0f} s{(': ' + r['note']) if r['note'] else ''}")
    sweep = []
    if device != "emulator":
        by_name = {w["name"]: w for w in pack["workloads"]}
        for v in pack.get("sweep", []):
            t = time.time()
            sweep.append(check_workload(by_name[v["workload"]], device, torch, notes, v))
            r = sweep[-1]
            progress(f"sweep {r['name']}: {'ok' if r['ok'] else 'FAIL'}, kiln {fmt(r['kiln_ms'])} ms, "
                     f"{time.time() - t:.0f} s{(': ' + r['note']) if r['note'] else ''}")
    elif pack.get("sweep"):
        notes.append("the sweep's variants run at the GPU size only: skipped on the emulator")
    if torch is not None and device != "emulator" and torch.cuda.is_available():
        # The device's copy bandwidth, the yardstick of the elementwise goal.
        x = torch.empty(1 << 28, dtype=torch.float32, device=torch_device(device))
        ms = time_torch(torch, lambda: x.clone(), [], 10)
        notes.append("device-to-device copy: %.0f GB/s (torch clone of 1 GiB)" % (2 * x.numel() * 4 / ms / 1e6))
        del x
    summary = {
        "device": device,
        "kiln_version": pack.get("kiln_version"),
        "programs": {"total": len(results), "passed": len(results) - len(failures),
                     "failed": len(failures), "failures": failures},
        "workloads": rows,
        "sweep": sweep,
        "notes": notes,
        "seconds": round(time.time() - start, 1),
    }
    print(f"kiln GPU check on {device}: {summary['programs']['passed']} of {len(results)} programs pass, "
          f"{len(failures)} fail")
    for f in failures:
        first = f["message"].splitlines()[0] if f["message"] else ""
        print(f"  FAIL {f['name']} (exit {f['exit_code']}): {first}")
    print()
    print(f"{'workload':28} {'kiln ms':>10} {'eager ms':>10} {'compile ms':>11} {'eager/kiln':>10} "
          f"{'compile/kiln':>12} {'rel err':>9}  check")
    for r in rows:
        k, e, c = r["kiln_ms"], r["torch_eager_ms"], r["torch_compile_ms"]
        ratio = lambda t: None if t is None or not k else t / k
        err = "-" if r["max_rel_error"] is None else "%.1e" % r["max_rel_error"]
        check = ("ok" if r["ok"] else "FAIL") + ((" (" + r["note"] + ")") if r["note"] else "")
        print(f"{r['name']:28} {fmt(k):>10} {fmt(e):>10} {fmt(c):>11} {fmt(ratio(e)):>10} "
              f"{fmt(ratio(c)):>12} {err:>9}  {check}")
    if sweep:
        # Each variant beside its workload's default (the `kiln ms` above).
        default = {r["name"]: r["kiln_ms"] for r in rows}
        print()
        print(f"{'sweep variant':60} {'kiln ms':>10} {'default/variant':>15}  check")
        for r in sweep:
            base = default.get(r["name"].split(" ")[0])
            speedup = None if not base or not r["kiln_ms"] else base / r["kiln_ms"]
            check = ("ok" if r["ok"] else "FAIL") + ((" (" + r["note"] + ")") if r["note"] else "")
            print(f"{r['name']:60} {fmt(r['kiln_ms']):>10} {fmt(speedup):>15}  {check}")
    for n in notes:
        print(f"note: {n}")
    out = os.environ.get("KILN_CHECK_JSON", os.path.join(HERE, "check-results.json"))
    try:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"JSON: {out}")
    except OSError as e:
        print(f"could not write {out}: {e}")
    # A variant that fails is a finding about that variant, not the defaults': reported, and
    # the check fails on it too, so that no failing variant goes unnoticed.
    bad = failures or any(not r["ok"] for r in rows + sweep)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
