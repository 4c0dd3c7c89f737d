//! The text form of the GPU IR (`--stage gpu`), and its verifier.

use super::ir::*;
use crate::target::Gpu;
use kiln_ir::DType;
use std::fmt::{self, Write as _};

impl fmt::Display for Special {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Special::Thread => "tid",
            Special::Block => "bid",
            Special::BlockDim => "ntid",
            Special::GridDim => "nctaid",
            Special::Lane => "lane",
            Special::Warp => "warp",
        })
    }
}

impl fmt::Display for Sc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bin =
            |f: &mut fmt::Formatter<'_>, a: &Sc, op: &str, b: &Sc| write!(f, "({a} {op} {b})");
        match self {
            Sc::Const(c) => write!(f, "{c}"),
            Sc::Special(s) => write!(f, "%{s}"),
            Sc::Reg(r) => write!(f, "r{r}"),
            Sc::Var(v) => write!(f, "v{v}"),
            Sc::Add(a, b) => bin(f, a, "+", b),
            Sc::Mul(a, b) => bin(f, a, "*", b),
            Sc::Div(a, b) => bin(f, a, "/", b),
            Sc::Rem(a, b) => bin(f, a, "%", b),
            Sc::Lt(a, b) => bin(f, a, "<", b),
            Sc::Eq(a, b) => bin(f, a, "==", b),
            Sc::And(a, b) => bin(f, a, "&&", b),
        }
    }
}

impl fmt::Display for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Buf::Input(i) => write!(f, "in{i}"),
            Buf::Output(k) => write!(f, "out{k}"),
            Buf::Scratch(s) => write!(f, "scratch{s}"),
        }
    }
}

fn stmts(out: &mut String, body: &[Stmt], depth: usize) {
    let pad = "  ".repeat(depth);
    for s in body {
        let _ = match s {
            Stmt::Let { reg, value } => writeln!(out, "{pad}r{reg} = {value}"),
            Stmt::SetVar { var, value } => writeln!(out, "{pad}v{var} = {value}"),
            Stmt::Eval { reg, expr, scalars } => {
                let text = crate::print::inline(expr);
                if scalars.is_empty() {
                    writeln!(out, "{pad}r{reg} = eval {text}")
                } else {
                    writeln!(out, "{pad}r{reg} = eval {text} scalars {scalars:?}")
                }
            }
            Stmt::Identity { reg, kind, dtype } => {
                writeln!(out, "{pad}r{reg} = identity {kind:?} : {dtype}")
            }
            Stmt::Combine {
                acc,
                value,
                kind,
                dtype,
            } => writeln!(out, "{pad}r{acc} = {kind:?}(r{acc}, r{value}) : {dtype}"),
            Stmt::MulAdd { acc, a, b, dtype } => {
                writeln!(out, "{pad}r{acc} = fma(r{a}, r{b}, r{acc}) : {dtype}")
            }
            Stmt::For {
                reg,
                start,
                end,
                step,
                body,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}for r{reg} = {start}; r{reg} < {end}; r{reg} += {step} {{"
                );
                stmts(out, body, depth + 1);
                writeln!(out, "{pad}}}")
            }
            Stmt::If { cond, body } => {
                let _ = writeln!(out, "{pad}if {cond} {{");
                stmts(out, body, depth + 1);
                writeln!(out, "{pad}}}")
            }
            Stmt::Load { reg, buf, index } => writeln!(out, "{pad}r{reg} = {buf}[{index}]"),
            Stmt::Store { buf, index, value } => writeln!(out, "{pad}{buf}[{index}] = r{value}"),
            Stmt::AtomicAdd { buf, index, value } => {
                writeln!(out, "{pad}{buf}[{index}] += r{value} (atomic)")
            }
            Stmt::SharedLoad { reg, array, index } => {
                writeln!(out, "{pad}r{reg} = shared{array}[{index}]")
            }
            Stmt::SharedStore {
                array,
                index,
                value,
            } => writeln!(out, "{pad}shared{array}[{index}] = r{value}"),
            Stmt::Barrier => writeln!(out, "{pad}barrier"),
            Stmt::Note(note) => writeln!(out, "{pad}// {note}"),
            Stmt::Shuffle { reg, src, mode } => match mode {
                Shuffle::Xor(n) => writeln!(out, "{pad}r{reg} = shfl.bfly r{src}, {n}"),
                Shuffle::Down(n) => writeln!(out, "{pad}r{reg} = shfl.down r{src}, {n}"),
            },
            Stmt::LdMatrix {
                regs,
                array,
                row,
                trans,
            } => writeln!(
                out,
                "{pad}{} = ldmatrix.x4{} shared{array}[{row}]",
                reg_list(regs),
                if *trans { ".trans" } else { "" }
            ),
            Stmt::CopyAsync {
                array,
                index,
                buf,
                src,
                elems,
            } => writeln!(
                out,
                "{pad}cp.async x{elems} shared{array}[{index}] <- {buf}[{src}]"
            ),
            Stmt::CopyCommit => writeln!(out, "{pad}cp.async.commit"),
            Stmt::CopyWait { pending } => writeln!(out, "{pad}cp.async.wait {pending}"),
            Stmt::RoundTf32 { reg } => writeln!(out, "{pad}r{reg} = cvt.rna.tf32 r{reg}"),
            Stmt::Mma {
                d,
                a,
                b,
                c,
                shape: (m, n, k),
                operand,
            } => writeln!(
                out,
                "{pad}{} = mma.m{m}n{n}k{k}.{} {}, {}, {}",
                reg_list(d),
                operand.name(),
                reg_list(a),
                reg_list(b),
                reg_list(c)
            ),
            Stmt::WgmmaFence => writeln!(out, "{pad}wgmma.fence"),
            Stmt::ProxyFence => writeln!(out, "{pad}fence.proxy.async"),
            Stmt::Wgmma {
                acc,
                a,
                b,
                n,
                operand,
            } => writeln!(
                out,
                "{pad}{} += wgmma.m64n{n}k16.{} {}, {}",
                reg_list(acc),
                operand.name(),
                desc_text(a),
                desc_text(b)
            ),
            Stmt::WgmmaCommit => writeln!(out, "{pad}wgmma.commit"),
            Stmt::WgmmaWait { pending } => writeln!(out, "{pad}wgmma.wait {pending}"),
            Stmt::MbarInit { bar, count } => {
                writeln!(out, "{pad}mbarrier.init {}, {count}", bar_text(bar))
            }
            Stmt::MbarArrive { bar, tx: 0 } => {
                writeln!(out, "{pad}mbarrier.arrive {}", bar_text(bar))
            }
            Stmt::MbarArrive { bar, tx } => {
                writeln!(
                    out,
                    "{pad}mbarrier.arrive.expect_tx {}, {tx}",
                    bar_text(bar)
                )
            }
            Stmt::MbarWait { bar, parity } => {
                writeln!(out, "{pad}mbarrier.wait {}, parity {parity}", bar_text(bar))
            }
            Stmt::MbarInval { bar } => writeln!(out, "{pad}mbarrier.inval {}", bar_text(bar)),
            Stmt::TmaLoad {
                map,
                array,
                index,
                coords,
                bar,
            } => writeln!(
                out,
                "{pad}tma.load shared{array}[{index}] <- map{map}[{}, {}], {}",
                coords[0],
                coords[1],
                bar_text(bar)
            ),
        };
    }
}

/// `desc(sharedA[start], lbo L, sbo S, swizzle W[, mn-major])`.
fn desc_text(d: &MatrixDesc) -> String {
    format!(
        "desc(shared{}[{}], lbo {}, sbo {}, swizzle {}{})",
        d.array,
        d.start,
        d.lbo,
        d.sbo,
        d.swizzle.name(),
        if d.mn_major { ", mn-major" } else { "" }
    )
}

/// `sharedA[index]`, an mbarrier.
fn bar_text(b: &Mbar) -> String {
    format!("shared{}[{}]", b.array, b.index)
}

/// `{rA, rB, ...}`.
fn reg_list(regs: &[usize]) -> String {
    let names: Vec<String> = regs.iter().map(|r| format!("r{r}")).collect();
    format!("{{{}}}", names.join(", "))
}

/// The text form of one launch.
pub fn kernel_text(k: &GpuKernel) -> String {
    let mut out = format!(
        "gpu kernel {} ({}): grid {} x block {} (warp {}), {} registers\n",
        k.name,
        k.kind.name(),
        k.grid,
        k.block,
        k.warp,
        k.regs
    );
    for (i, (b, t)) in k.inputs.iter().enumerate() {
        let _ = writeln!(out, "  input {i}: {b} : {t}");
    }
    for (i, (b, t)) in k.outputs.iter().enumerate() {
        let _ = writeln!(out, "  output {i}: {b} : {t}");
    }
    let offsets = k.shared_offsets().0;
    for (i, a) in k.shared.iter().enumerate() {
        let packed = if a.packed { " packed" } else { "" };
        let swizzle = a
            .swizzle
            .map_or(String::new(), |s| format!(" swizzled by chunks >> {s}"));
        let at = if k.dynamic_shared > 0 {
            format!(" at dynamic +{}", offsets[i])
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  shared{i}: {}[{}]{packed}{swizzle}{at}",
            a.dtype, a.len
        );
    }
    if k.dynamic_shared > 0 {
        let _ = writeln!(out, "  dynamic shared memory: {} bytes", k.dynamic_shared);
    }
    for (i, m) in k.tensor_maps.iter().enumerate() {
        let _ = writeln!(
            out,
            "  map{i}: in{} {}[{} x {}] rows of {} bytes, box {} x {}, swizzle {}",
            m.input,
            m.dtype,
            m.dims[1],
            m.dims[0],
            m.row_stride,
            m.box_dims[1],
            m.box_dims[0],
            m.swizzle.name()
        );
    }
    stmts(&mut out, &k.body, 1);
    out
}

/// The text form of a mapped kernel: its scratch buffers, the buffers zeroed before its
/// launches (if any), then each launch.
pub fn program_text(p: &GpuProgram) -> String {
    let mut out = String::new();
    for (i, t) in p.scratch.iter().enumerate() {
        let _ = writeln!(out, "scratch{i}: {t}");
    }
    for (b, t) in &p.zeroed {
        let _ = writeln!(out, "zeroed {b}: {t}");
    }
    for k in &p.launches {
        out += &kernel_text(k);
    }
    out
}

/// Checks what the hardware requires of a launch on `gpu`: a block of whole warps within the
/// thread limit, shared memory within the block's, at least one block, and registers and
/// arrays that exist.
pub fn verify(k: &GpuKernel, gpu: &Gpu) -> Result<(), String> {
    let fail = |m: String| Err(format!("gpu kernel {}: {m}", k.name));
    if k.grid == 0
        || k.block == 0
        || !k.block.is_multiple_of(k.warp)
        || k.block > gpu.max_threads_per_block
    {
        return fail(format!(
            "a block of {} threads (warp {}, at most {})",
            k.block, k.warp, gpu.max_threads_per_block
        ));
    }
    if k.dynamic_shared == 0 && k.shared_bytes() > gpu.shared_limit() {
        return fail(format!(
            "{} bytes of shared memory per block, more than the target's {} (its block's, within what a kernel declares statically)",
            k.shared_bytes(),
            gpu.shared_limit()
        ));
    }
    if k.dynamic_shared != 0 {
        let laid = k.shared_offsets().1;
        if k.dynamic_shared != laid {
            return fail(format!(
                "{} bytes of dynamic shared memory for arrays that take {laid}",
                k.dynamic_shared
            ));
        }
        if laid > gpu.dynamic_limit() {
            return fail(format!(
                "{laid} bytes of dynamic shared memory per block, more than the target's {} (what a block may opt into)",
                gpu.dynamic_limit()
            ));
        }
    }
    for (i, a) in k.shared.iter().enumerate() {
        // A swizzle moves 16-byte chunks within aligned groups of 8: a packed array of
        // 16-bit elements (8 a chunk) or an array of 32-bit ones (4 a chunk), whole groups
        // long.
        let chunked = (a.packed && a.dtype.bits() == 16) || (!a.packed && a.dtype.bits() == 32);
        if a.swizzle.is_some() && (!chunked || a.len % (8 * a.chunk_elems()) != 0) {
            return fail(format!(
                "shared{i} is swizzled but is not a packed array of 16-bit elements or one of \
                 32-bit elements, whole groups of 8 chunks long ({}[{}])",
                a.dtype, a.len
            ));
        }
    }
    // Whole warpgroups, and one warp more where a producer loads by TMA for them.
    let groups = k.block.is_multiple_of(128) || (k.uses_tma() && k.block % 128 == 32);
    if k.uses_wgmma() && (!gpu.wgmma || k.warp != 32 || !groups) {
        return fail(format!(
            "warpgroup products (wgmma) in blocks of {} threads (warp {}) on a target {}",
            k.block,
            k.warp,
            if gpu.wgmma {
                "whose blocks must be whole warpgroups of 128 threads (and one producer warp)"
            } else {
                "without them (sm_90a only)"
            }
        ));
    }
    if k.uses_tma() && !gpu.wgmma {
        return fail("mbarriers or TMA loads on a target without them (sm_90a only)".to_string());
    }
    for (i, m) in k.tensor_maps.iter().enumerate() {
        m.check().or_else(fail)?;
        let input = k.inputs.get(m.input).map(|b| &b.1);
        let fits = input.is_some_and(|t| {
            t.dtype == m.dtype
                && m.row_stride.is_multiple_of(m.elem_bytes())
                && t.numel() >= (m.dims[1] - 1) * (m.row_stride / m.elem_bytes()) + m.dims[0]
        });
        if !fits {
            return fail(format!(
                "tensor map {i} reads input {} ({input:?}) as {}[{} x {}] rows of {} bytes",
                m.input, m.dtype, m.dims[1], m.dims[0], m.row_stride
            ));
        }
    }
    fn check(k: &GpuKernel, body: &[Stmt]) -> Result<(), String> {
        for s in body {
            let (regs, arrays): (Vec<usize>, Vec<usize>) = match s {
                Stmt::Let { reg, .. } | Stmt::Identity { reg, .. } | Stmt::Load { reg, .. } => {
                    (vec![*reg], vec![])
                }
                Stmt::Eval { reg, scalars, .. } => (
                    std::iter::once(*reg)
                        .chain(scalars.iter().copied())
                        .collect(),
                    vec![],
                ),
                Stmt::Combine { acc, value, .. } => (vec![*acc, *value], vec![]),
                Stmt::MulAdd { acc, a, b, dtype } => {
                    if !matches!(dtype, DType::F32 | DType::F64) {
                        return Err(format!("a fused multiply-add in {dtype}"));
                    }
                    (vec![*acc, *a, *b], vec![])
                }
                Stmt::For { reg, body, .. } => {
                    check(k, body)?;
                    (vec![*reg], vec![])
                }
                Stmt::If { body, .. } => {
                    check(k, body)?;
                    (vec![], vec![])
                }
                Stmt::Store { value, buf, .. } => {
                    if !matches!(buf, Buf::Output(i) if *i < k.outputs.len()) {
                        return Err(format!("a store to {buf}, not an output"));
                    }
                    (vec![*value], vec![])
                }
                Stmt::AtomicAdd { value, buf, .. } => {
                    let dtype = match buf {
                        Buf::Output(i) => k.outputs.get(*i).map(|o| o.1.dtype),
                        _ => None,
                    };
                    if !matches!(dtype, Some(DType::F32 | DType::F16)) {
                        return Err(format!(
                            "an atomic addition into {buf}, not an f32 or f16 output"
                        ));
                    }
                    (vec![*value], vec![])
                }
                Stmt::SharedLoad { reg, array, .. } => (vec![*reg], vec![*array]),
                Stmt::SharedStore { value, array, .. } => (vec![*value], vec![*array]),
                Stmt::Shuffle { reg, src, .. } => (vec![*reg, *src], vec![]),
                Stmt::SetVar { var, .. } => {
                    if *var >= k.vars {
                        return Err(format!("variable v{var} of {}", k.vars));
                    }
                    (vec![], vec![])
                }
                Stmt::Barrier | Stmt::Note(_) => (vec![], vec![]),
                Stmt::LdMatrix {
                    regs, array, trans, ..
                } => {
                    // Two registers a 32-bit word from packed 16-bit elements, one from 32-bit
                    // ones (never transposed: `.trans` moves 16-bit elements).
                    let want = match k.shared.get(*array) {
                        Some(a) if a.packed && a.dtype.bits() == 16 => Some(8),
                        Some(a) if !a.packed && a.dtype.bits() == 32 && !trans => Some(4),
                        _ => None,
                    };
                    if want != Some(regs.len()) {
                        return Err(format!(
                            "ldmatrix{} of {} registers from shared{array}, not a packed array of \
                             16-bit elements (8 registers) or one of 32-bit elements (4, not \
                             transposed)",
                            if *trans { ".trans" } else { "" },
                            regs.len()
                        ));
                    }
                    (regs.clone(), vec![*array])
                }
                Stmt::RoundTf32 { reg } => (vec![*reg], vec![]),
                Stmt::CopyAsync {
                    array, buf, elems, ..
                } => {
                    let (Some(a), Buf::Input(i)) = (k.shared.get(*array), buf) else {
                        return Err(format!("cp.async from {buf} to shared{array}"));
                    };
                    let bytes = a.dtype.bits().div_ceil(8) as usize;
                    let held = if a.packed { bytes } else { bytes.max(4) };
                    let global = k
                        .inputs
                        .get(*i)
                        .map(|t| t.1.dtype.bits().div_ceil(8) as usize);
                    if global != Some(held) || ![4, 8, 16].contains(&(elems * held)) {
                        return Err(format!(
                            "cp.async of {elems} elements of {held} bytes from {buf} ({global:?} \
                             bytes each)"
                        ));
                    }
                    (vec![], vec![*array])
                }
                Stmt::CopyCommit
                | Stmt::CopyWait { .. }
                | Stmt::WgmmaFence
                | Stmt::ProxyFence
                | Stmt::WgmmaCommit
                | Stmt::WgmmaWait { .. } => (vec![], vec![]),
                Stmt::MbarInit { bar, count } => {
                    if !(1..=super::mbarrier::MAX_COUNT).contains(count) {
                        return Err(format!("an mbarrier.init of count {count}"));
                    }
                    (vec![], vec![check_bar(k, bar)?])
                }
                Stmt::MbarArrive { bar, tx } => {
                    if *tx > super::mbarrier::MAX_COUNT {
                        return Err(format!("an mbarrier.arrive expecting {tx} bytes"));
                    }
                    (vec![], vec![check_bar(k, bar)?])
                }
                Stmt::MbarWait { bar, .. } | Stmt::MbarInval { bar } => {
                    (vec![], vec![check_bar(k, bar)?])
                }
                Stmt::TmaLoad {
                    map, array, bar, ..
                } => {
                    let (Some(m), Some(a)) = (k.tensor_maps.get(*map), k.shared.get(*array)) else {
                        return Err(format!("a TMA load of map {map} into shared{array}"));
                    };
                    if (!a.packed && m.elem_bytes() < 4)
                        || a.dtype != m.dtype
                        || a.swizzle.is_some()
                        || a.len < m.box_dims[0] * m.box_dims[1]
                    {
                        return Err(format!(
                            "a TMA load of map {map} ({} box of {} x {}) into shared{array} \
                             ({}[{}]{}), not an unswizzled array of its dtype that holds the box",
                            m.dtype,
                            m.box_dims[1],
                            m.box_dims[0],
                            a.dtype,
                            a.len,
                            if a.packed { " packed" } else { "" }
                        ));
                    }
                    (vec![], vec![check_bar(k, bar)?])
                }
                Stmt::Wgmma {
                    acc,
                    a,
                    b,
                    n,
                    operand,
                } => {
                    if *operand == MmaOperand::Tf32
                        || !n.is_multiple_of(8)
                        || !(8..=256).contains(n)
                        || acc.len() != n / 2
                    {
                        return Err(format!(
                            "a wgmma m64n{n}k16 of {} with {} accumulators (bf16 or f16, n a \
                             multiple of 8 up to 256, n / 2 accumulators)",
                            operand.name(),
                            acc.len()
                        ));
                    }
                    for d in [a, b] {
                        check_desc(k, d, *operand)?;
                    }
                    (acc.clone(), vec![a.array, b.array])
                }
                Stmt::Mma {
                    d,
                    a,
                    b,
                    c,
                    shape,
                    operand,
                } => {
                    if *shape != operand.shape()
                        || a.len() != operand.a_regs()
                        || b.len() != operand.b_regs()
                        || k.warp != 32
                    {
                        return Err(format!(
                            "an mma {shape:?} of {} with {} A and {} B registers in warps of {} \
                             (its shape is {:?}, with {} and {})",
                            operand.name(),
                            a.len(),
                            b.len(),
                            k.warp,
                            operand.shape(),
                            operand.a_regs(),
                            operand.b_regs()
                        ));
                    }
                    (
                        d.iter().chain(a).chain(b).chain(c).copied().collect(),
                        vec![],
                    )
                }
            };
            if let Some(r) = regs.iter().find(|&&r| r >= k.regs) {
                return Err(format!("register r{r} of {}", k.regs));
            }
            if let Some(a) = arrays.iter().find(|&&a| a >= k.shared.len()) {
                return Err(format!("shared array {a} of {}", k.shared.len()));
            }
        }
        Ok(())
    }
    check(k, &k.body).or_else(fail)
}

/// Checks an mbarrier's array: `u64` words, not swizzled; its index.
fn check_bar(k: &GpuKernel, bar: &Mbar) -> Result<usize, String> {
    match k.shared.get(bar.array) {
        Some(a) if a.dtype == DType::U64 && a.swizzle.is_none() => Ok(bar.array),
        _ => Err(format!(
            "an mbarrier in shared{}, not an unswizzled array of u64",
            bar.array
        )),
    }
}

/// Checks a [`Stmt::Wgmma`] operand's descriptor: a packed array of the operand's dtype,
/// unswizzled or swizzled by chunks `>> 3` (which moves a chunk back where it came from, so
/// the emulator can find an element from its address), strides the descriptor holds.
fn check_desc(k: &GpuKernel, d: &MatrixDesc, operand: MmaOperand) -> Result<(), String> {
    let Some(a) = k.shared.get(d.array) else {
        return Err(format!("a wgmma descriptor of shared array {}", d.array));
    };
    if !a.packed || a.dtype != operand.dtype() || !matches!(a.swizzle, None | Some(3)) {
        return Err(format!(
            "a wgmma of {} reads shared{} ({}[{}]{}{}), not a packed array of its dtype \
             unswizzled or swizzled by chunks >> 3",
            operand.name(),
            d.array,
            a.dtype,
            a.len,
            if a.packed { " packed" } else { "" },
            a.swizzle
                .map_or(String::new(), |s| format!(" swizzled >> {s}"))
        ));
    }
    for (what, v) in [("leading", d.lbo), ("stride", d.sbo)] {
        if !v.is_multiple_of(16) || v >= 1 << 18 {
            return Err(format!(
                "a wgmma descriptor's {what} byte offset {v} (a multiple of 16 below 2^18)"
            ));
        }
    }
    Ok(())
}

/// `f` lowered for an H200 ([`crate::target::TargetInfo::h200`]) under `opts`, each kernel
/// mapped to the GPU and printed (`cargo xtask dump FILE --stage gpu`); the instructions
/// without a kernel are named with how they run.
pub fn describe_gpu(f: &kiln_ir::Func, opts: &crate::Options) -> crate::Result<String> {
    let target = crate::target::TargetInfo::h200();
    let l = crate::pipeline::lower_program(f, &[], opts, &target, None, &mut |_| {})?;
    let mut out = String::new();
    for (i, inst) in l.func.insts.iter().enumerate() {
        let Some(k) = l.fused.kernels[i].as_ref() else {
            if !matches!(l.steps[i], crate::Step::Fused | crate::Step::Merged) {
                let _ = writeln!(out, "// #{i} {}: {:?}", inst.op.mnemonic(), l.steps[i]);
            }
            continue;
        };
        let ins: Vec<kiln_ir::TensorType> = l.fused.operands[i]
            .iter()
            .map(|v| l.func.values[v.index()].clone())
            .collect();
        let name = format!("k{i}_{}", inst.op.mnemonic());
        match super::map(k, &ins, &target, opts, &name) {
            Ok(p) => out += &program_text(&p),
            Err(e) => {
                let _ = writeln!(out, "// #{i}: not mapped: {e}");
            }
        }
    }
    Ok(out)
}

/// `f` lowered as the PTX target lowers it (for an H200, [`crate::target::TargetInfo::h200`],
/// under `opts`): the optimized program and its kernels, fused by the GPU target's rules
/// (`cargo xtask dump FILE --stage kernels --target ptx`), verified like the CPU's.
pub fn describe_kernels_gpu(f: &kiln_ir::Func, opts: &crate::Options) -> crate::Result<String> {
    let target = crate::target::TargetInfo::h200();
    let l = crate::pipeline::lower_program(f, &[], opts, &target, None, &mut |_| {})?;
    crate::verify::verify_fused(&l.func, &l.fused)
        .map_err(|e| crate::Error::Lowering(format!("@{}: {e}", l.func.name)))?;
    let mut s = format!("// target: ptx (fused for an H200)\n{}\n", l.func);
    s += &crate::print::fused_text(&l.func, &l.fused);
    s += "// verified\n";
    Ok(s)
}

/// The fused kernels of `f` as the PTX target makes them (`cargo xtask dump FILE --stage
/// fused --target ptx`): per kernel its members and the buffers it reads, then one line per
/// launch of its GPU mapping (kind, grid, block, shared memory, registers); the
/// instructions without a kernel are named with how they run.
pub fn describe_fusion_gpu(f: &kiln_ir::Func, opts: &crate::Options) -> crate::Result<String> {
    let target = crate::target::TargetInfo::h200();
    let l = crate::pipeline::lower_program(f, &[], opts, &target, None, &mut |_| {})?;
    let (g, fused) = (&l.func, &l.fused);
    let mut s = format!("// target: ptx (fused for an H200)\n{g}\n");
    let count = fused.kernels.iter().flatten().count();
    let _ = writeln!(s, "// {count} kernels");
    for (i, inst) in g.insts.iter().enumerate() {
        let Some(k) = fused.kernels[i].as_ref() else {
            if !matches!(l.steps[i], crate::Step::Fused | crate::Step::Merged) {
                let _ = writeln!(s, "// #{i} {}: {:?}", inst.op.mnemonic(), l.steps[i]);
            }
            continue;
        };
        let (members, reads, also) = crate::print::kernel_members_and_reads(g, fused, i);
        let _ = writeln!(
            s,
            "kernel k{i}: {} -> {}{also}; members [{members}]; reads [{reads}]",
            inst.op.mnemonic(),
            g.values[inst.results[0].index()],
        );
        let ins: Vec<kiln_ir::TensorType> = fused.operands[i]
            .iter()
            .map(|v| g.values[v.index()].clone())
            .collect();
        let name = format!("k{i}_{}", inst.op.mnemonic());
        match super::map(k, &ins, &target, opts, &name) {
            Ok(p) => {
                for t in &p.scratch {
                    let _ = writeln!(s, "  scratch {t}");
                }
                for (b, t) in &p.zeroed {
                    let _ = writeln!(s, "  zeroed {b}: {t}");
                }
                for k in &p.launches {
                    let _ = writeln!(
                        s,
                        "  launch {} ({}): grid {} x block {}, {} bytes of shared memory, {} registers",
                        k.name,
                        k.kind.name(),
                        k.grid,
                        k.block,
                        k.shared_bytes().max(k.dynamic_shared),
                        k.regs
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(s, "  not mapped: {e}");
            }
        }
    }
    Ok(s)
}
