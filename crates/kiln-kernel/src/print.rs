//! The text form of kernels: each kernel's schedule, loop nest, index maps, guards and
//! reductions, one line per expression node (what `cargo xtask dump FILE --stage kernels`
//! prints, and the `kernels` filetests snapshot).
//!
//! A kernel prints as a header line and indented lines below it:
//!
//! ```text
//! kernel k8 (#8 divide) -> f32[2,3]
//!   members: #1 reduce, #2 broadcast_in_dim, #3 subtract, #4 exponential, #6 reduce, ...
//!   inputs: in0 = %0: f32[2,3], in1 = %1: f32[], in2 = %6: f32[]
//!   schedule: nest over v0 < 2, v1 < 3 (5 loop variables)
//!   body: divide f32
//!     exponential f32
//!       subtract f32
//!         gather in0 f32 [0 + 3*v0 + 1*v1] * [1]
//!         reduce max f32 over v2 < 3
//!           init: gather in1 f32 [0] * [1]
//!           body: gather in0 f32 [0 + 3*v0 + 1*v2] * [1]
//!     reduce add f32 over v3 < 3
//!       ...
//! ```
//!
//! Loop variables are `v0, v1, ...`: the output dimensions first, then the variables each
//! reduction binds (`over v2 < 3`). `load inJ T [flat]` reads element `flat` (an affine map of
//! the variables) of input `J` as `T`; `gather inJ T [i0, i1] * [s0, s1]` reads element
//! `Σ i_d * s_d` at any index expressions; `value(...)` is an index computed at run time;
//! `guard C1 and C2` evaluates `then:` where every condition holds, else `else:`.

use crate::fuse::Fused;
use crate::ir::{Cond, ConvPatches, Ew, Expr, Idx, Kernel, Schedule};
use kiln_ir::{DType, Func, TensorType};
use std::fmt::Write as _;

/// The name of an elementwise op in the text form.
pub fn ew_name(op: &Ew) -> String {
    match op {
        Ew::Kind(k) => k.mnemonic().to_string(),
        Ew::Cmp(d) => format!("compare {d}"),
        Ew::Select => "select".into(),
        Ew::Clamp => "clamp".into(),
        Ew::Convert => "convert".into(),
        Ew::Bitcast => "bitcast".into(),
        Ew::Narrow => "narrow".into(),
    }
}

/// A constant of `dtype`: integers without a fraction, floats as Rust prints them.
fn constant(dtype: DType, value: f64) -> String {
    if !dtype.is_float() && value.is_finite() && value.fract() == 0.0 && value.abs() < 1e18 {
        format!("{}", value as i64)
    } else {
        format!("{value:?}")
    }
}

/// `Σ terms + c` as `3*v0 + v1 - 2` (`0` when empty).
fn sum(terms: &[(String, i64)], c: i64) -> String {
    let mut s = String::new();
    let mut push = |k: i64, body: &str| {
        let (neg, k) = (k < 0, k.unsigned_abs());
        let factor = if k == 1 && !body.is_empty() {
            body.to_string()
        } else if body.is_empty() {
            k.to_string()
        } else {
            format!("{k}*{body}")
        };
        if s.is_empty() {
            s = if neg { format!("-{factor}") } else { factor };
        } else {
            let _ = write!(s, " {} {factor}", if neg { '-' } else { '+' });
        }
    };
    for (body, k) in terms {
        if *k != 0 {
            push(*k, body);
        }
    }
    if c != 0 {
        push(c, "");
    }
    if s.is_empty() { "0".into() } else { s }
}

/// A load's flat index `off + Σ coef[v] * v`.
pub fn affine(coef: &[i64], off: i64) -> String {
    let terms: Vec<(String, i64)> = coef
        .iter()
        .enumerate()
        .map(|(v, &c)| (format!("v{v}"), c))
        .collect();
    sum(&terms, off)
}

/// An index expression, as written: sums `a + b`, products `3*x`, truncating quotients
/// `x / 2`, `clamp(x, lo, hi)` and run-time values `value(...)`.
pub fn idx(i: &Idx) -> String {
    match i {
        Idx::Var(v) => format!("v{v}"),
        Idx::Const(c) => c.to_string(),
        Idx::Add(xs) if xs.is_empty() => "0".into(),
        Idx::Add(xs) => {
            let mut s = String::new();
            for (k, x) in xs.iter().enumerate() {
                let (neg, body) = match x {
                    Idx::Const(c) if *c < 0 && k > 0 => (true, c.unsigned_abs().to_string()),
                    Idx::Mul(y, c) if *c < 0 && k > 0 => (true, mul(y, c.unsigned_abs() as i64)),
                    Idx::Add(_) => (false, format!("({})", idx(x))),
                    _ => (false, idx(x)),
                };
                if k > 0 {
                    s.push_str(if neg { " - " } else { " + " });
                }
                s.push_str(&body);
            }
            s
        }
        Idx::Mul(x, c) => mul(x, *c),
        Idx::Div(x, c) => format!("{} / {c}", atom(x)),
        Idx::Clamp(x, lo, hi) => format!("clamp({}, {lo}, {hi})", idx(x)),
        Idx::Value(e) => format!("value({})", inline(e)),
    }
}

fn mul(x: &Idx, c: i64) -> String {
    format!("{c}*{}", atom(x))
}

/// `x`, parenthesized unless it is a variable, a constant or a call.
fn atom(x: &Idx) -> String {
    match x {
        Idx::Var(_) | Idx::Clamp(..) | Idx::Value(_) => idx(x),
        Idx::Const(c) if *c >= 0 => idx(x),
        _ => format!("({})", idx(x)),
    }
}

/// A guard condition: `lo <= x < hi` or `x % m == 0`.
pub fn cond(c: &Cond) -> String {
    match c {
        Cond::InRange(i, lo, hi) => format!("{lo} <= {} < {hi}", idx(i)),
        Cond::Divisible(i, m) => format!("{} % {m} == 0", atom(i)),
    }
}

/// `v2 < 3, v3 < 4`.
fn loops(vars: &[(usize, usize)]) -> String {
    let parts: Vec<String> = vars.iter().map(|(v, n)| format!("v{v} < {n}")).collect();
    parts.join(", ")
}

/// The first line of an expression node (its operands follow on lines of their own).
fn head(e: &Expr) -> String {
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => format!("load in{input} {dtype} [{}]", affine(coef, *off)),
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } => {
            let index: Vec<String> = index.iter().map(idx).collect();
            let strides: Vec<String> = strides.iter().map(i64::to_string).collect();
            format!(
                "gather in{input} {dtype} [{}] * [{}]",
                index.join(", "),
                strides.join(", ")
            )
        }
        Expr::Iota { var, dtype } => format!("iota {dtype} v{var}"),
        Expr::Index { idx: i, dtype } => format!("index {dtype} {}", idx(i)),
        Expr::Const { dtype, value } => format!("const {dtype} {}", constant(*dtype, *value)),
        Expr::Op { op, dtype, .. } => format!("{} {dtype}", ew_name(op)),
        Expr::Reduce {
            kind, dtype, vars, ..
        } => format!("reduce {kind} {dtype} over {}", loops(vars)),
        Expr::Guard { conds, .. } => {
            let cs: Vec<String> = conds.iter().map(cond).collect();
            format!("guard {}", cs.join(" and "))
        }
        Expr::Fold { fold, result } => format!(
            "fold result {result} of {} {} over {}{}",
            fold.arity(),
            e.dtype(),
            loops(&fold.vars),
            if fold.in_order { " in order" } else { "" }
        ),
        Expr::Arg { slot, dtype } => format!("arg {dtype} a{slot}"),
    }
}

/// An expression on one line, operands in parentheses: `add f32 (load in0 f32 [v0], const f32 1.0)`.
pub fn inline(e: &Expr) -> String {
    match e {
        Expr::Op { args, .. } => {
            let args: Vec<String> = args.iter().map(inline).collect();
            format!("{} ({})", head(e), args.join(", "))
        }
        Expr::Reduce { init, body, .. } => {
            format!("{} (init {}, body {})", head(e), inline(init), inline(body))
        }
        Expr::Guard {
            then, otherwise, ..
        } => format!(
            "{} (then {}, else {})",
            head(e),
            inline(then),
            inline(otherwise)
        ),
        Expr::Fold { fold, .. } => {
            let all = |xs: &[Expr]| xs.iter().map(inline).collect::<Vec<_>>().join(", ");
            format!(
                "{} (inits {}, elements {}, body {})",
                head(e),
                all(&fold.inits),
                all(&fold.elems),
                all(&fold.body)
            )
        }
        _ => head(e),
    }
}

/// Appends `e` as a tree: its first line at `indent` (after `label`), each operand on lines
/// of its own two spaces further in.
pub fn tree(e: &Expr, indent: usize, label: &str, out: &mut String) {
    let _ = writeln!(out, "{:indent$}{label}{}", "", head(e));
    let inner = indent + 2;
    match e {
        Expr::Op { args, .. } => args.iter().for_each(|a| tree(a, inner, "", out)),
        Expr::Reduce { init, body, .. } => {
            tree(init, inner, "init: ", out);
            tree(body, inner, "body: ", out);
        }
        Expr::Guard {
            then, otherwise, ..
        } => {
            tree(then, inner, "then: ", out);
            tree(otherwise, inner, "else: ", out);
        }
        Expr::Fold { fold, .. } => {
            let k = fold.arity();
            for (i, x) in fold.inits.iter().enumerate() {
                tree(x, inner, &format!("init a{i}: "), out);
            }
            for (i, x) in fold.elems.iter().enumerate() {
                tree(x, inner, &format!("element a{}: ", k + i), out);
            }
            for (i, x) in fold.body.iter().enumerate() {
                tree(x, inner, &format!("body a{i}: "), out);
            }
        }
        _ => {}
    }
}

fn list<T: std::fmt::Display>(xs: &[T]) -> String {
    let parts: Vec<String> = xs.iter().map(T::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The output loops `v0 < d0, v1 < d1, ...` over `shape`.
fn out_loops(shape: &[usize]) -> String {
    let vars: Vec<(usize, usize)> = shape.iter().copied().enumerate().collect();
    if vars.is_empty() {
        "one position".into()
    } else {
        loops(&vars)
    }
}

fn conv_text(p: &ConvPatches) -> String {
    format!(
        "convolution patches of a [N, {}, {}, {}] input, {} x {} kernel, stride {}, dilation {}, \
         output {} x {}{}",
        p.h,
        p.w,
        p.c,
        p.kh,
        p.kw,
        list(&p.stride),
        list(&p.dilation),
        p.oh,
        p.ow,
        if p.planes {
            ", stored by planes [N, O, OH, OW]"
        } else {
            ""
        }
    )
}

/// The lines of a kernel below its header, `indent` spaces in: its schedule and loop nest,
/// its body (the epilogue of a matrix product) and its extra outputs.
pub fn kernel(k: &Kernel, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let inner = indent + 2;
    let vars = format!("{} loop variables", k.vars);
    match &k.schedule {
        Schedule::Nest => {
            let _ = writeln!(
                out,
                "{pad}schedule: nest over {} ({vars})",
                out_loops(&k.out.shape)
            );
            tree(&k.body, indent, "body: ", out);
        }
        Schedule::Scatter {
            updates,
            target,
            kind,
        } => {
            let target: Vec<String> = target.iter().map(idx).collect();
            let _ = writeln!(
                out,
                "{pad}schedule: scatter {kind} over updates {} into out[{}] ({vars}); out starts as in0",
                out_loops(updates),
                target.join(", ")
            );
            tree(&k.body, indent, "update: ", out);
        }
        Schedule::SelectScatter {
            grid,
            window,
            strides,
            pad_low,
            select,
            kind,
        } => {
            let _ = writeln!(
                out,
                "{pad}schedule: select_and_scatter over grid {}, window {}, strides {}, pad_low {}, \
                 select {select} among in0, combine {kind} ({vars}); out starts as in2",
                out_loops(grid),
                list(window),
                list(strides),
                list(pad_low)
            );
            tree(&k.body, indent, "source: ", out);
        }
        Schedule::Gemm {
            epilogue,
            batch,
            m,
            n,
            k: kk,
            conv,
            a_trans,
            b_trans,
            chain,
            strides,
            store,
            zero,
            unread,
        } => {
            let mut flags = String::new();
            if *a_trans {
                flags.push_str(", A transposed");
            }
            if *b_trans {
                flags.push_str(", B transposed");
            }
            let _ = writeln!(
                out,
                "{pad}schedule: gemm batch {batch}, m {m}, n {n}, k {kk}: A = in0, B = in1{flags} ({vars})"
            );
            if let Some(p) = conv {
                let _ = writeln!(out, "{pad}  A: {}", conv_text(p));
            }
            for (s, what) in strides.iter().zip(["A", "B"]) {
                if let Some(s) = s {
                    let _ = writeln!(out, "{pad}  {what} read in place: {}", strides_text(s));
                }
            }
            if let Some(st) = store {
                let _ = writeln!(
                    out,
                    "{pad}  product stored in place into {}: {}",
                    st.buffer,
                    strides_text(&st.strides)
                );
            }
            if let Some(z) = zero {
                let (what, x) = if z.operand == 0 {
                    ("A", "row")
                } else {
                    ("B", "col")
                };
                let (a, b, c) = z.at;
                let terms = [("step".to_string(), a), (x.to_string(), b)];
                let _ = writeln!(
                    out,
                    "{pad}  {what} zero where {} > 0: those steps left out where checked at run time",
                    sum(&terms, c)
                );
            }
            if let Some(u) = unread {
                let (a, b, c) = u.at;
                let terms = [("col".to_string(), a), ("row".to_string(), b)];
                let _ = writeln!(
                    out,
                    "{pad}  product unread where {} > 0: tiles wholly there left out",
                    sum(&terms, c)
                );
            }
            if let Some(c) = chain {
                let _ = writeln!(
                    out,
                    "{pad}  chain: the epilogue's result times in{} ({} columns{}) -> {}",
                    c.b,
                    c.n,
                    if c.b_trans { ", transposed" } else { "" },
                    c.out
                );
                if let Some(s) = &c.b_strides {
                    let _ = writeln!(out, "{pad}    its B read in place: {}", strides_text(s));
                }
                if let Some(h) = &c.online {
                    tree(h, inner, "online softmax of: ", out);
                }
                if let Some((a, b, cc)) = c.masked {
                    let terms = [("col".to_string(), a), ("row".to_string(), b)];
                    let _ = writeln!(out, "{pad}    masked where {} > 0", sum(&terms, cc));
                }
            }
            match epilogue {
                Some(p) => {
                    let _ = writeln!(
                        out,
                        "{pad}epilogue over {}, reading the product as in{p}:",
                        out_loops(&k.out.shape)
                    );
                    tree(&k.body, inner, "", out);
                }
                None => {
                    let _ = writeln!(out, "{pad}no epilogue");
                }
            }
        }
    }
    for (e, x) in k.extra.iter().enumerate() {
        let _ = writeln!(
            out,
            "{pad}extra output {e} -> {} (pointer in slot {}):",
            x.out, x.slot
        );
        tree(&x.body, inner, "", out);
    }
}

/// A kernel alone: its output type, then [`kernel`]'s lines.
pub fn kernel_text(k: &Kernel) -> String {
    let mut s = format!("kernel -> {}\n", k.out);
    kernel(k, 2, &mut s);
    s
}

/// Every kernel of the fused program `fused` of `f`, in program order: its instruction, output
/// type, member instructions, inputs (the values whose buffers it reads, with their types),
/// extra outputs, and [`kernel`]'s lines; between them, one line for each instruction the
/// reference interpreter runs, with why it has no kernel ([`Fused::no_kernel`]):
/// `#5 rng_bit_generator: interpreted (a generator with two results, ...)`. Constants and
/// pass-throughs, which run nothing, are left out.
pub fn fused_text(f: &Func, fused: &Fused) -> String {
    fused_text_scheduled(f, fused, &[])
}

/// What the fusion descriptions (`--stage fused`, for the CPU and for the PTX target) say of
/// kernel `i` of `g` on its first line: its members (`#m op`, comma-separated), the values it
/// reads (likewise), and `; also writes [v: type, ...]` for its extra outputs (empty without).
pub fn kernel_members_and_reads(g: &Func, fused: &Fused, i: usize) -> (String, String, String) {
    let members: Vec<String> = fused.members[i]
        .iter()
        .map(|&m| format!("#{m} {}", g.insts[m].op.mnemonic()))
        .collect();
    let reads: Vec<String> = fused.operands[i].iter().map(|v| v.to_string()).collect();
    let also = if fused.extra[i].is_empty() {
        String::new()
    } else {
        let vs: Vec<String> = fused.extra[i]
            .iter()
            .map(|v| format!("{v}: {}", g.values[v.index()]))
            .collect();
        format!("; also writes [{}]", vs.join(", "))
    };
    (members.join(", "), reads.join(", "), also)
}

/// [`fused_text`] with each loop-nest kernel's loop schedule (`schedules[i]`, for the kernel
/// of instruction `i`, see [`crate::loop_schedule`]) on a `loops:` line.
pub fn fused_text_scheduled(
    f: &Func,
    fused: &Fused,
    schedules: &[Option<crate::loop_schedule::KernelSchedule>],
) -> String {
    let mut s = String::new();
    let count = fused.kernels.iter().flatten().count();
    let _ = writeln!(s, "// {count} kernels");
    for (i, k) in fused.kernels.iter().enumerate() {
        let inst = &f.insts[i];
        let Some(k) = k else {
            let passive = matches!(
                inst.op,
                kiln_ir::Op::Constant { .. } | kiln_ir::Op::OptimizationBarrier {}
            );
            if !fused.inlined[i] && fused.merged_into[i].is_none() && !passive {
                let why = match fused.no_kernel.get(i).copied().flatten() {
                    Some(why) => format!(" ({why})"),
                    None => String::new(),
                };
                let how = if inst.op.regions().is_empty() && !crate::host_routine(&inst.op) {
                    "interpreted"
                } else {
                    "on the host"
                };
                let _ = writeln!(s, "#{i} {}: {how}{why}", inst.op.mnemonic());
            }
            continue;
        };
        let ty = |v: kiln_ir::ValueId| -> &TensorType { &f.values[v.index()] };
        let result = ty(inst.results[0]);
        let _ = writeln!(
            s,
            "kernel k{i} (#{i} {}) -> {result}{}",
            inst.op.mnemonic(),
            if *result != k.out {
                format!(" (kernel output {})", k.out)
            } else {
                String::new()
            }
        );
        if fused.members[i].len() > 1 {
            let members: Vec<String> = fused.members[i]
                .iter()
                .map(|&m| format!("#{m} {}", f.insts[m].op.mnemonic()))
                .collect();
            let _ = writeln!(s, "  members: {}", members.join(", "));
        }
        let inputs: Vec<String> = fused.operands[i]
            .iter()
            .enumerate()
            .map(|(j, &v)| format!("in{j} = {v}: {}", ty(v)))
            .collect();
        let inputs = if inputs.is_empty() {
            "none".to_string()
        } else {
            inputs.join(", ")
        };
        let _ = writeln!(s, "  inputs: {inputs}");
        if !fused.extra[i].is_empty() {
            let also: Vec<String> = fused.extra[i]
                .iter()
                .map(|&v| format!("{v}: {}", ty(v)))
                .collect();
            let _ = writeln!(s, "  also writes: {}", also.join(", "));
        }
        if let Some(Some(sched)) = schedules.get(i) {
            let _ = writeln!(s, "  loops: {sched}");
        }
        kernel(k, 2, &mut s);
    }
    s
}

/// The kernels of `f` as the backends get them (optimized, canonicalized, lowered, fused and
/// scheduled as for the dumps, see [`crate::pipeline::lowered_for_printing`]), verified
/// ([`crate::verify::verify_fused`]): the program they index into, then [`fused_text`] with
/// each loop nest's schedule on the reference target ([`crate::TargetInfo::reference`]).
pub fn describe_kernels(f: &Func, opts: &crate::Options) -> crate::Result<String> {
    let (g, fused) = crate::pipeline::lowered_for_printing(f, opts)?;
    verified(&g, &fused)?;
    let schedules = crate::pipeline::loop_schedules(&fused, opts, &crate::TargetInfo::reference());
    Ok(kernels_text(&g, &fused, &schedules))
}

/// [`describe_kernels`] for `f` lowered for `target`, a machine's own properties rather than
/// the reference CPU's (fusion, blocks and schedules as a compile for it decides them),
/// headed by [`target_header`] naming it `machine`.
pub fn describe_kernels_on(
    f: &Func,
    opts: &crate::Options,
    target: &crate::TargetInfo,
    machine: &str,
) -> crate::Result<String> {
    let l = crate::pipeline::lower_program(f, &[], opts, target, None, &mut |_| {})?;
    verified(&l.func, &l.fused)?;
    Ok(target_header(target, machine) + &kernels_text(&l.func, &l.fused, &l.schedules))
}

/// The line that heads a description of kernels decided for `target` (`machine`, in words:
/// "this machine", "the CPU skylake-avx512"): the properties of it that were detected, its
/// widest vectors and its threads.
pub fn target_header(target: &crate::TargetInfo, machine: &str) -> String {
    format!(
        "// for {machine}: {}-bit vectors, {} thread{}\n",
        target.vector_bytes * 8,
        target.threads,
        if target.threads == 1 { "" } else { "s" }
    )
}

/// `g`'s kernels `fused` checked by [`crate::verify::verify_fused`].
fn verified(g: &Func, fused: &Fused) -> crate::Result<()> {
    crate::verify::verify_fused(g, fused)
        .map_err(|e| crate::Error::Lowering(format!("@{}: {e}", g.name)))
}

/// The program `g`, then its kernels `fused` with their loop `schedules` ([`fused_text`]),
/// which were verified.
fn kernels_text(
    g: &Func,
    fused: &Fused,
    schedules: &[Option<crate::loop_schedule::KernelSchedule>],
) -> String {
    let mut s = format!("{g}\n");
    s.push_str(&fused_text_scheduled(g, fused, schedules));
    let _ = writeln!(s, "// verified");
    s
}

/// Where an operand read through strides lies, in words.
fn strides_text(s: &crate::ir::Strides) -> String {
    let batch: Vec<String> = s
        .batch
        .iter()
        .map(|(e, st)| format!("{e} x {st}"))
        .collect();
    format!(
        "from element {}, batches {}, rows {} apart",
        s.offset,
        batch.join(", "),
        s.ld
    )
}
