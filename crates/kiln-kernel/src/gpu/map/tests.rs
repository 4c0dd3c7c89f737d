//! The mapping's decisions on an H200.

use super::*;
use crate::gpu::print::{program_text, verify};
use crate::options::Options;

/// The launches of the first kernel of `src` lowered for an H200.
fn mapped(src: &str) -> GpuProgram {
    mapped_under(src, &Options::default(), |_| {})
}

/// The launches of the first kernel of `src` lowered under `opts` for an H200 changed by
/// `change`, each verified.
fn mapped_under(src: &str, opts: &Options, change: impl Fn(&mut Gpu)) -> GpuProgram {
    let f = kiln_ir::parse_func_text(src).expect("valid IR");
    let mut target = TargetInfo::h200();
    change(target.gpu.as_mut().unwrap());
    let l =
        crate::pipeline::lower_program(&f, &[], opts, &target, None, &mut |_| {}).expect("lowers");
    let i = l
        .fused
        .kernels
        .iter()
        .position(Option::is_some)
        .expect("a kernel");
    let ins: Vec<TensorType> = l.fused.operands[i]
        .iter()
        .map(|v| l.func.values[v.index()].clone())
        .collect();
    let p = map(
        l.fused.kernels[i].as_ref().unwrap(),
        &ins,
        &target,
        opts,
        "k",
    )
    .expect("maps");
    for k in &p.launches {
        verify(k, target.gpu.as_ref().unwrap()).expect("verifies");
    }
    p
}

fn row_sum(shape: &str, out: &str) -> String {
    format!(
        "func @main(%0: f32[{shape}]) -> f32[{out}] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : f32[{out}]\n  return %2\n}}\n"
    )
}

#[test]
fn elementwise_kernels_fill_every_multiprocessor_with_grid_stride_loops() {
    let p = mapped(
        "func @main(%0: f32[8000000], %1: f32[8000000]) -> f32[8000000] {\n  %2 = add %0, %1 : f32[8000000]\n  return %2\n}\n",
    );
    let k = &p.launches[0];
    assert_eq!(
        (k.kind, k.grid, k.block),
        (MapKind::Elementwise, 132 * 16, 256)
    );
    // Four consecutive f32 elements per thread and iteration (16 bytes): 75 groups of 300.
    let small = mapped(
        "func @main(%0: f32[300]) -> f32[300] {\n  %1 = exponential %0 : f32[300]\n  return %1\n}\n",
    );
    assert_eq!(small.launches[0].grid, 1);
    let text = program_text(&small);
    assert!(
        text.contains("< 75;") && text.matches("out0[").count() == 4,
        "{text}"
    );
    // A size that does not divide into groups: one element per thread.
    let odd = mapped(
        "func @main(%0: f32[301]) -> f32[301] {\n  %1 = exponential %0 : f32[301]\n  return %1\n}\n",
    );
    let text = program_text(&odd);
    assert!(
        text.contains("< 301;") && text.matches("out0[").count() == 1,
        "{text}"
    );
}

#[test]
fn long_rows_get_a_warp_or_a_block_and_short_ones_a_thread() {
    let short = mapped(&row_sum("64,100", "64"));
    assert_eq!(short.launches[0].kind, MapKind::Elementwise);
    let warp = mapped(&row_sum("64,1000", "64"));
    let k = &warp.launches[0];
    assert_eq!((k.kind, k.grid, k.block), (MapKind::WarpRows, 8, 256));
    let text = program_text(&warp);
    assert!(
        text.contains("shfl.bfly r") && !text.contains("barrier"),
        "{text}"
    );
    // As many rows as multiprocessors or more: a block each (fewer split, see below).
    let block = mapped(&row_sum("200,5000", "200"));
    let k = &block.launches[0];
    assert_eq!((k.kind, k.grid, k.block), (MapKind::BlockRows, 200, 1024));
    let text = program_text(&block);
    assert_eq!(text.matches("barrier").count(), 2, "{text}");
    assert!(text.contains("shared0: f32[32]"), "{text}");
}

#[test]
fn few_long_rows_and_columns_split_over_blocks_in_two_launches() {
    // Three rows of 100000: min(⌈2112 / 3⌉, ⌈100000 / 4096⌉) = 25 slices a row, 16 as a
    // multiple of the fan-out; then a thread per row over its 16 partials.
    let full = mapped(&row_sum("3,100000", "3"));
    let kinds: Vec<_> = full
        .launches
        .iter()
        .map(|k| (k.kind, k.grid, k.block))
        .collect();
    assert_eq!(
        kinds,
        [
            (MapKind::SplitPartials, 48, 256),
            (MapKind::Elementwise, 1, 256)
        ]
    );
    assert_eq!(full.scratch, [TensorType::new(DType::F32, vec![48])]);
    // A column sum of f32[1000, 300]: two tiles of 256 columns, min(⌈2112 / 2⌉, ⌈1000 / 128⌉)
    // = 8 slices of 125 rows each; then a thread per four columns over their 8 partials.
    let col = mapped(
        "func @main(%0: f32[1000,300]) -> f32[300] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[300]\n  return %2\n}\n",
    );
    let kinds: Vec<_> = col.launches.iter().map(|k| (k.kind, k.grid)).collect();
    assert_eq!(
        kinds,
        [(MapKind::ColumnPartials, 16), (MapKind::Elementwise, 1)]
    );
    let text = program_text(&col);
    assert!(text.contains("over v2 < 8"), "{text}");
    assert!(!text.contains("shfl"), "{text}");
    // No rows: nothing to split (a grid of no blocks would not launch).
    let empty = mapped(&row_sum("0,100000", "0"));
    assert!(empty.launches.iter().all(|k| k.grid >= 1));
    assert_eq!(empty.launches.len(), 1);
    let argmax = "func @main(%0: f32[0,100000]) -> f32[0] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[0]\n  return %2\n}\n";
    assert!(mapped(argmax).launches.iter().all(|k| k.grid >= 1));
    // A softmax's sum reads its maximum: the row mapping keeps both in one pass.
    let soft = "func @main(%0: f32[3,100000]) -> f32[3,100000] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[3]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[3,100000]\n  %4 = subtract %0, %3 : f32[3,100000]\n  %5 = exponential %4 : f32[3,100000]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[3]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[3,100000]\n  %9 = divide %5, %8 : f32[3,100000]\n  return %9\n}\n";
    let p = mapped(soft);
    assert_eq!(p.launches.len(), 1);
    assert_eq!(p.launches[0].kind, MapKind::BlockRows);
    // Rows scaled by their sums: the row's block computes each sum once for its elements.
    let scaled = "func @main(%0: f32[3,100000]) -> f32[3,100000] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[3]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[3,100000]\n  %4 = divide %0, %3 : f32[3,100000]\n  return %4\n}\n";
    let p = mapped(scaled);
    assert_eq!(p.launches.len(), 1);
    assert_eq!(p.launches[0].kind, MapKind::BlockRows);
}

#[test]
fn a_target_without_a_gpu_maps_nothing() {
    let f = kiln_ir::parse_func_text(&row_sum("2,3", "2")).unwrap();
    let ks = crate::pipeline::kernels(&f);
    let k = ks.iter().flatten().next().unwrap();
    let e = map(
        k,
        &[f.values[0].clone()],
        &TargetInfo::reference(),
        &Options::default(),
        "k",
    )
    .unwrap_err();
    assert!(e.contains("no GPU"), "{e}");
}

#[test]
fn a_softmax_computes_each_row_reduction_once() {
    // The maximum appears twice in the fused body (in the numerator and, with variables of its
    // own, inside the denominator's sum): one value, one cooperative reduction.
    let src = "func @main(%0: f32[4,300]) -> f32[4,300] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[4]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[4,300]\n  %4 = subtract %0, %3 : f32[4,300]\n  %5 = exponential %4 : f32[4,300]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[4]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[4,300]\n  %9 = divide %5, %8 : f32[4,300]\n  return %9\n}\n";
    let p = mapped(src);
    assert_eq!(p.launches[0].kind, MapKind::WarpRows);
    let text = program_text(&p);
    // Two reductions of five shuffle levels each (warps of 32), and no reduction left inside
    // the elements' expression.
    assert_eq!(text.matches("shfl.bfly").count(), 10, "{text}");
    let last = text.lines().rev().find(|l| l.contains("= eval")).unwrap();
    assert!(!last.contains("reduce"), "{text}");
}

/// The launches of the first kernel of `src` lowered for an H200 changed by `change`.
fn mapped_with(src: &str, change: impl Fn(&mut Gpu)) -> GpuProgram {
    mapped_under(src, &Options::default(), change)
}

fn softmax(rows: usize, cols: usize, dtype: &str) -> String {
    let t = |s: &str| format!("{dtype}[{s}]");
    let (m, r) = (t(&format!("{rows},{cols}")), t(&format!("{rows}")));
    format!(
        "func @main(%0: {m}) -> {m} {{\n  %1 = constant {{value = -inf}} : {dtype}[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = max}} : {r}\n  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [0]}} : {m}\n  %4 = subtract %0, %3 : {m}\n  %5 = exponential %4 : {m}\n  %6 = constant {{value = 0.0}} : {dtype}[]\n  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : {r}\n  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : {m}\n  %9 = divide %5, %8 : {m}\n  return %9\n}}\n"
    )
}

/// Global loads of launch input `input` that every thread of `k` runs, counted by running
/// the launch's integer control flow (its loops, guards and positions) per thread: one per
/// load in each evaluated expression and per [`Stmt::Load`].
fn loads_of(k: &GpuKernel, input: usize) -> usize {
    struct Thread<'k> {
        k: &'k GpuKernel,
        special: [i64; 6],
        regs: Vec<i64>,
        input: usize,
        count: usize,
    }
    impl Thread<'_> {
        fn sc(&self, s: &Sc) -> i64 {
            match s {
                Sc::Const(x) => *x,
                Sc::Special(sp) => self.special[*sp as usize],
                Sc::Reg(r) => self.regs[*r],
                Sc::Var(_) => panic!("positions read registers"),
                Sc::Add(a, b) => self.sc(a) + self.sc(b),
                Sc::Mul(a, b) => self.sc(a) * self.sc(b),
                Sc::Div(a, b) => self.sc(a) / self.sc(b),
                Sc::Rem(a, b) => self.sc(a) % self.sc(b),
                Sc::Lt(a, b) => (self.sc(a) < self.sc(b)) as i64,
                Sc::Eq(a, b) => (self.sc(a) == self.sc(b)) as i64,
                Sc::And(a, b) => (self.sc(a) != 0 && self.sc(b) != 0) as i64,
            }
        }
        fn run(&mut self, body: &[Stmt]) {
            for s in body {
                match s {
                    Stmt::Let { reg, value } => self.regs[*reg] = self.sc(value),
                    Stmt::For {
                        reg,
                        start,
                        end,
                        step,
                        body,
                    } => {
                        self.regs[*reg] = self.sc(start);
                        while self.regs[*reg] < self.sc(end) {
                            self.run(body);
                            self.regs[*reg] += self.sc(step);
                        }
                    }
                    Stmt::If { cond, body } if self.sc(cond) != 0 => self.run(body),
                    Stmt::Eval { expr, .. } => {
                        struct Count(usize, usize);
                        impl Visitor<'_> for Count {
                            fn expr(&mut self, e: &Expr) {
                                if matches!(e, Expr::Load { input, .. } | Expr::Gather { input, .. } if *input == self.1)
                                {
                                    self.0 += 1;
                                }
                                e.for_each_child(self);
                            }
                        }
                        let mut c = Count(0, self.input);
                        c.expr(expr);
                        self.count += c.0;
                    }
                    Stmt::Load {
                        buf: Buf::Input(i), ..
                    } if *i == self.input => self.count += 1,
                    _ => {}
                }
            }
        }
    }
    let mut count = 0;
    for block in 0..k.grid {
        for thread in 0..k.block {
            // Special registers in declaration order: thread, block, block size, grid, lane,
            // warp.
            let special = [
                thread as i64,
                block as i64,
                k.block as i64,
                k.grid as i64,
                (thread % k.warp) as i64,
                (thread / k.warp) as i64,
            ];
            let mut t = Thread {
                k,
                special,
                regs: vec![0; k.regs],
                input,
                count: 0,
            };
            t.run(&t.k.body.clone());
            count += t.count;
        }
    }
    count
}

#[test]
fn a_softmax_row_that_fits_registers_is_loaded_once() {
    // Rows of 300 on a warp: 10 slots per lane, the last one past the row's end for lanes
    // 12 and up.
    let p = mapped(&softmax(20, 300, "f32"));
    let k = &p.launches[0];
    let text = program_text(&p);
    assert!(
        text.contains(
            "// row cache: 300 elements of in0 (f32) read once, in registers, 10 slots per thread"
        ),
        "{text}"
    );
    assert_eq!(loads_of(k, 0), 20 * 300, "{text}");
    // The reductions are still five shuffle levels each, and no loop runs over the row.
    assert_eq!(text.matches("shfl.bfly").count(), 10, "{text}");
    assert_eq!(text.matches("for r").count(), 1, "{text}");
    // Without the cache, each of the three passes reads the row.
    let off = mapped_with(&softmax(20, 300, "f32"), |g| {
        g.row_registers = 0;
        g.row_shared_bytes = 0;
    });
    let text = program_text(&off);
    assert_eq!(loads_of(&off.launches[0], 0), 3 * 20 * 300, "{text}");
    assert!(text.contains("// row cache: none"), "{text}");
}

#[test]
fn a_row_too_long_for_registers_is_cached_in_shared_memory() {
    // 1200 > 32 x 32 f32 per warp; 8 rows of 1200 f32 per block take 38400 bytes.
    let p = mapped(&softmax(9, 1200, "f32"));
    let k = &p.launches[0];
    let text = program_text(&p);
    assert!(
        text.contains("in shared memory, shared0..shared0") && text.contains("shared0: f32[9600]"),
        "{text}"
    );
    assert_eq!(loads_of(k, 0), 9 * 1200, "{text}");
    // Block per row with registers off: shared memory; with both off, three reads.
    let block = mapped_with(&softmax(2, 5000, "f16"), |g| g.row_registers = 0);
    let k = &block.launches[0];
    assert_eq!(k.kind, MapKind::BlockRows);
    let text = program_text(&block);
    assert!(text.contains("shared0: f16[5000]"), "{text}");
    assert_eq!(loads_of(k, 0), 2 * 5000, "{text}");
    // Rows that fit neither: read in every pass, and the plan says why.
    let neither = mapped(&softmax(3, 2000, "f64"));
    let text = program_text(&neither);
    assert!(
        text.contains("// row cache: none (rows of 2000 elements"),
        "{text}"
    );
    assert_eq!(loads_of(&neither.launches[0], 0), 3 * 3 * 2000, "{text}");
}

#[test]
fn a_loss_without_an_output_row_reads_its_logits_once() {
    // Cross-entropy per row: the logits' maximum, the sum of exponentials and the sum against
    // the labels are three passes over the row, and the output is one value per row; the
    // labels are read by one pass only, so they are not cached.
    let src = "func @main(%0: f32[6,700], %1: f32[6,700]) -> f32[6] {\n  %2 = constant {value = -inf} : f32[]\n  %3 = reduce %0, %2 {dimensions = [1], kind = max} : f32[6]\n  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f32[6,700]\n  %5 = subtract %0, %4 : f32[6,700]\n  %6 = exponential %5 : f32[6,700]\n  %7 = constant {value = 0.0} : f32[]\n  %8 = reduce %6, %7 {dimensions = [1], kind = add} : f32[6]\n  %9 = log %8 : f32[6]\n  %10 = add %9, %3 : f32[6]\n  %11 = multiply %0, %1 : f32[6,700]\n  %12 = reduce %11, %7 {dimensions = [1], kind = add} : f32[6]\n  %13 = subtract %10, %12 : f32[6]\n  return %13\n}\n";
    let p = mapped(src);
    let k = &p.launches[0];
    let text = program_text(&p);
    let logits = k
        .inputs
        .iter()
        .position(|(_, t)| t.shape == [6, 700])
        .expect("the logits");
    let labels = k
        .inputs
        .iter()
        .rposition(|(_, t)| t.shape == [6, 700])
        .expect("the labels");
    assert_ne!(logits, labels);
    assert!(
        text.contains(&format!(
            "// row cache: 700 elements of in{logits} (f32) read once, in registers, 22 slots"
        )),
        "{text}"
    );
    assert_eq!(loads_of(k, logits), 6 * 700, "{text}");
    assert_eq!(loads_of(k, labels), 6 * 700, "{text}");
}

/// The pack's attention (1024 queries and keys, heads and outputs of 64) maps by the H200's
/// first register tile: 64 query rows on 128 threads, and per head index 8 shared loads for 16
/// multiply-adds of the scores, per key 12 for 32 of the output (the loads per multiply-add
/// `attention_tiles.rs` argues from), within 48 KiB of shared memory.
#[test]
fn attention_register_tiles_load_less_than_they_multiply() {
    let (b, m, k, n2) = (2, 1024, 64, 64);
    let s = format!("f32[{b},{m},{m}]");
    let p = mapped(&format!(
        "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{m},{k}], %2: f32[{b},{m},{n2}]) -> f32[{b},{m},{n2}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}
  %4 = constant {{value = 0.125}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
  %6 = multiply %3, %5 : {s}
  %7 = constant {{value = -inf}} : f32[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : f32[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : f32[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : f32[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{b},{m},{n2}]
  return %16
}}
"
    ));
    let l = &p.launches[0];
    assert_eq!(
        (p.launches.len(), l.kind, l.block, l.grid),
        (1, MapKind::AttentionTiled, 128, b * m / 64)
    );
    assert_eq!(l.shared_bytes(), 43008);
    // (shared loads, multiply-adds) of each loop that multiplies, innermost.
    fn loops(body: &[Stmt], out: &mut Vec<(usize, usize)>) {
        for s in body {
            match s {
                Stmt::For { body, .. } => {
                    let (mut loads, mut fmas) = (0, 0);
                    for s in body {
                        match s {
                            Stmt::SharedLoad { .. } => loads += 1,
                            Stmt::MulAdd { .. } => fmas += 1,
                            _ => {}
                        }
                    }
                    if fmas > 0 {
                        out.push((loads, fmas));
                    }
                    loops(body, out);
                }
                Stmt::If { body, .. } => loops(body, out),
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    loops(&l.body, &mut found);
    assert_eq!(found, vec![(8, 16), (12, 32)]);
}

/// The options with float atomics allowed.
fn atomics() -> Options {
    Options {
        float_atomics: true,
        ..Options::default()
    }
}

#[test]
fn float_atomics_sum_whole_tensors_and_columns_in_one_launch_where_allowed() {
    // The blocks of the split above, each adding its partial into the zeroed result.
    let full = mapped_under(&row_sum("3,100000", "3"), &atomics(), |_| {});
    let kinds: Vec<_> = (full.launches.iter())
        .map(|k| (k.kind, k.grid, k.block))
        .collect();
    assert_eq!(kinds, [(MapKind::SplitAtomic, 48, 256)]);
    assert!(full.scratch.is_empty());
    let zeroed = vec![(Buf::Output(0), TensorType::new(DType::F32, vec![3]))];
    assert_eq!(full.zeroed, zeroed);
    let text = program_text(&full);
    assert_eq!(text.matches("(atomic)").count(), 1, "{text}");
    assert!(text.starts_with("zeroed out0: f32[3]\n"), "{text}");
    let column = "func @main(%0: f32[1000,300]) -> f32[300] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[300]\n  return %2\n}\n";
    let col = mapped_under(column, &atomics(), |_| {});
    let kinds: Vec<_> = col.launches.iter().map(|k| (k.kind, k.grid)).collect();
    assert_eq!(kinds, [(MapKind::ColumnAtomic, 16)]);
    assert_eq!(col.zeroed.len(), 1);
    // Off by default: the deterministic two launches, nothing zeroed.
    let det = mapped(column);
    assert_eq!(det.launches.len(), 2);
    assert!(det.zeroed.is_empty());
    // Only bare f32 sums: a mean (an epilogue after the sum), a maximum, f64 and bf16 sums
    // keep their two launches.
    let mean = "func @main(%0: f32[100000]) -> f32[] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]\n  %3 = constant {value = 0.00001} : f32[]\n  %4 = multiply %2, %3 : f32[]\n  return %4\n}\n";
    let max = "func @main(%0: f32[100000]) -> f32[] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = max} : f32[]\n  return %2\n}\n";
    let sum = |dt: &str| {
        format!(
            "func @main(%0: {dt}[100000]) -> {dt}[] {{\n  %1 = constant {{value = 0.0}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : {dt}[]\n  return %2\n}}\n"
        )
    };
    assert_eq!(
        mapped_under(&sum("f32"), &atomics(), |_| {}).launches[0].kind,
        MapKind::SplitAtomic
    );
    for src in [mean.to_string(), max.to_string(), sum("f64"), sum("bf16")] {
        let p = mapped_under(&src, &atomics(), |_| {});
        let kinds: Vec<_> = p.launches.iter().map(|k| k.kind).collect();
        assert_eq!(kinds[0], MapKind::SplitPartials, "{src}");
        assert_eq!(kinds.len(), 2, "{src}");
        assert!(p.zeroed.is_empty(), "{src}");
    }
}

#[test]
fn float_atomics_scatter_add_f32_and_f16_without_sorting() {
    // 20000 updates into 1000 elements: the sorted form (a radix sort) by default.
    let text = |dt: &str, kind: &str| {
        format!(
            "func @main(%0: {dt}[1000], %1: i32[20000,1], %2: {dt}[20000]) -> {dt}[1000] {{\n  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = {kind}}} : {dt}[1000]\n  return %3\n}}\n"
        )
    };
    for (dt, kind, atomic) in [
        ("f32", "add", true),
        ("f16", "add", true),
        ("bf16", "add", false),
        ("f32", "max", false),
        ("i32", "add", false),
    ] {
        let p = mapped_under(&text(dt, kind), &atomics(), |_| {});
        let kinds: Vec<_> = p.launches.iter().map(|k| k.kind).collect();
        let printed = program_text(&p);
        if atomic {
            assert_eq!(kinds, [MapKind::ScatterAtomic; 2], "{dt} {kind}");
            assert_eq!(printed.matches("(atomic)").count(), 1, "{printed}");
            assert!(p.scratch.is_empty() && p.zeroed.is_empty());
        } else {
            assert!(kinds.contains(&MapKind::Sort), "{dt} {kind}: {kinds:?}");
            assert!(!printed.contains("(atomic)"), "{printed}");
        }
        // Off by default: sorted.
        let det = mapped(&text(dt, kind));
        assert!(det.launches.iter().any(|k| k.kind == MapKind::Sort));
    }
}
