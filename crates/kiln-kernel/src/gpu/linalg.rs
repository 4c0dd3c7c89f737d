//! `cholesky`, `triangular_solve` and `lu` on the GPU ([`MapKind::Linalg`]): the unblocked
//! algorithms of the reference (`kiln_reference::linalg`), a thread per independent problem.
//!
//! - `cholesky`: a thread per matrix of the batch, column by column (the diagonal element
//!   from the row's squares, then the column below it), the factor kept in a scratch matrix;
//!   a pivot that is not positive (or NaN) makes the whole matrix NaN, as the reference's.
//! - `triangular_solve`: a thread per right-hand side (a column of `b` on the left, a row on
//!   the right) of each matrix, forward or back substitution on `t y = c` (the system
//!   `kiln_reference::Solve` brings every form to), each row's terms subtracted in order of
//!   their column; the solution so far is kept in a scratch matrix and each element stored
//!   once it is known.
//! - `lu`: a thread per matrix, Gaussian elimination with partial pivoting in the reference's
//!   order (the first largest magnitude, a NaN counting as largest; a zero pivot leaves its
//!   column undivided), on a scratch copy of the matrix, the permutation in a scratch vector.
//!
//! The arithmetic is the CPU's host routines' (`kiln_runtime::linalg`): f64 for f64 operands,
//! f32 for f32, f16 and bf16 (rounded once, as they are stored), so the scratch buffers hold
//! f32 or f64 whatever the operands' dtype. Results are within the bounds of the ops' specs
//! (`ir-specs/ops/`), checked on the emulator against the reference.
//!
//! These are latency-bound kernels: one thread does a whole problem's `O(n³)` (or `O(n²)` per
//! right-hand side) work, which suits the small matrices of the tests and of batched
//! factorizations, not one large matrix (a blocked form on tensor cores is not written). So
//! matrices larger than [`LARGEST`] stay with the host's blocked, multithreaded routines
//! (`kiln_runtime::linalg`), an explicit choice the device plan shows as a host step: at
//! `n = 128` a thread's Cholesky factorization is already about 0.7 million dependent
//! operations on global memory (milliseconds on one GPU thread), and the work grows as `n³`.
//!
//! A `triangular_solve` of complex operands (`c64`, `c128`) runs the same substitution on the
//! numbers' parts (`linalg/complex.rs`): each complex buffer is bound as a buffer of its parts (f32
//! or f64, the innermost dimension doubled: the same bytes), the products and Smith's division
//! written out as the reference's `kiln_reference::complex` computes them, `ADJOINT`
//! conjugating `a`'s elements.
//!
//! Left to the host (documented in `docs/gpu.md`): complex `cholesky` and `lu` (which the
//! verifier does not take) and float dtypes other than f16, bf16, f32 and f64.

mod complex;

use super::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, Stmt};
use crate::ir::{Ew, Expr};
use crate::target::{Gpu, SumTree};
use kiln_ir::{ComparisonDirection, DType, Op, OpKind, TensorType, TransposeA};

/// The program running `op` (a `cholesky`, `triangular_solve` or `lu` of operands of types
/// `ins`, results of types `outs`) on `gpu`, its launch named `name`; `None` for any other
/// op, and for the operands the host keeps (see the module's documentation).
pub fn linalg_program(
    op: &Op,
    ins: &[TensorType],
    outs: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
) -> Option<GpuProgram> {
    let a = ins.first()?;
    let complex = matches!(a.dtype, DType::C64 | DType::C128);
    let real = matches!(a.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    if !(real || complex && matches!(op, Op::TriangularSolve { .. })) {
        return None;
    }
    let r = a.rank();
    if r < 2 {
        return None;
    }
    let n = a.shape[r - 1];
    if n > LARGEST {
        return None;
    }
    let batch: usize = a.shape[..r - 2].iter().product();
    let calc = if matches!(a.dtype, DType::F64 | DType::C128) {
        DType::F64
    } else {
        DType::F32
    };
    let mut b = Builder {
        regs: RAW + 1,
        inputs: ins.len(),
        calc,
        // Complex elements are read as their parts, already of the arithmetic's dtype.
        operand: if complex { calc } else { a.dtype },
    };
    // A complex buffer as its parts: the real type of its bytes, twice as many innermost.
    let view = |t: &TensorType| -> TensorType {
        if !t.dtype.is_complex() {
            return t.clone();
        }
        let mut shape = t.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last *= 2;
        }
        TensorType::new(calc, shape)
    };
    let (count, body, scratch) = match op {
        Op::Cholesky { lower } => {
            let work = TensorType::new(calc, [batch * n * n]);
            (batch, b.cholesky(n, *lower), vec![work])
        }
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        } => {
            let bt = ins.get(1)?;
            let rb = bt.rank();
            let (rows, cols) = (bt.shape[rb - 2], bt.shape[rb - 1]);
            let m = if *left_side { cols } else { rows };
            let solve = Solve {
                n,
                m,
                cols,
                left_side: *left_side,
                lower: *lower,
                unit_diagonal: *unit_diagonal,
                transposed: *transpose_a != TransposeA::NoTranspose,
            };
            if complex {
                let work = TensorType::new(calc, [batch * n * m * 2]);
                let adjoint = *transpose_a == TransposeA::Adjoint;
                (batch * m, b.complex_solve(&solve, adjoint), vec![work])
            } else {
                let work = TensorType::new(calc, [batch * n * m]);
                (batch * m, b.solve(&solve), vec![work])
            }
        }
        Op::Lu {} => {
            let work = TensorType::new(calc, [batch * n * n]);
            let perm = TensorType::new(DType::I64, [batch * n]);
            (batch, b.lu(n), vec![work, perm])
        }
        _ => return None,
    };
    if count == 0 || n == 0 {
        // Nothing to compute: every result is empty.
        return Some(GpuProgram::new(Vec::new(), Vec::new()));
    }
    let block = count
        .div_ceil(gpu.warp_size)
        .saturating_mul(gpu.warp_size)
        .min(gpu.elementwise_block)
        .max(gpu.warp_size);
    let grid = count
        .div_ceil(block)
        .min(gpu.sms * gpu.blocks_per_sm)
        .max(1);
    let problem = Stmt::grid_stride(PROBLEM, c(count), body);
    let mut outputs: Vec<(Buf, TensorType)> = outs
        .iter()
        .enumerate()
        .map(|(k, t)| (Buf::Output(k), view(t)))
        .collect();
    outputs.extend(
        scratch
            .iter()
            .enumerate()
            .map(|(s, t)| (Buf::Scratch(s), t.clone())),
    );
    Some(GpuProgram::new(
        scratch,
        vec![GpuKernel {
            name: name.to_string(),
            kind: MapKind::Linalg,
            grid,
            block,
            warp: gpu.warp_size,
            inputs: ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Input(i), view(t)))
                .collect(),
            outputs,
            shared: Vec::new(),
            dynamic_shared: 0,
            regs: b.regs,
            vars: 0,
            sums,
            tensor_maps: Vec::new(),
            body: vec![problem],
        }],
    ))
}

/// The largest matrix (`n x n`) the kernels take; larger ones run on the host (see the
/// module's documentation).
pub const LARGEST: usize = 128;

/// The register holding the thread's problem (its matrix, or its matrix and right-hand side).
const PROBLEM: usize = 0;

/// The register an operand's element is loaded into before its conversion to the
/// arithmetic's dtype (when that differs).
const RAW: usize = 1;

fn c(x: usize) -> Sc {
    Sc::Const(x as i64)
}

fn reg(r: usize) -> Sc {
    Sc::Reg(r)
}

/// A triangular solve's shape and attributes.
struct Solve {
    /// `a`'s matrix size, the right-hand sides, and `b`'s columns.
    n: usize,
    m: usize,
    cols: usize,
    left_side: bool,
    lower: bool,
    unit_diagonal: bool,
    /// `TRANSPOSE` or `ADJOINT` (the same on real numbers).
    transposed: bool,
}

/// What a thread's triangular solve shares between real and complex operands: the
/// registers naming its matrix (`PROBLEM / m`) and right-hand side (`PROBLEM % m`), where
/// its operands start, the row `i` it solves at step `step` with its element `at` of `c`,
/// and the known rows `q` that row's terms run over; and how it addresses `t`, `c` and the
/// solution so far `y`.
struct SolveFrame {
    matrix: usize,
    rhs: usize,
    a_base: usize,
    b_base: usize,
    y_base: usize,
    step: usize,
    i: usize,
    q: usize,
    at: usize,
    n: usize,
    m: usize,
    cols: usize,
    left_side: bool,
    /// Whether `t` is `a` read transposed: in `t y = c`, t is op(a) on the left and op(a)ᵀ
    /// on the right.
    swapped: bool,
    /// Whether `t` is lower triangular (every transposition swaps the triangle).
    lower: bool,
}

impl SolveFrame {
    fn new(b: &mut Builder, s: &Solve) -> SolveFrame {
        let [matrix, rhs, a_base, b_base, y_base, step, i, q, at] =
            std::array::from_fn(|_| b.reg());
        let swapped = s.transposed ^ !s.left_side;
        SolveFrame {
            matrix,
            rhs,
            a_base,
            b_base,
            y_base,
            step,
            i,
            q,
            at,
            n: s.n,
            m: s.m,
            cols: s.cols,
            left_side: s.left_side,
            swapped,
            lower: s.lower ^ swapped,
        }
    }

    /// Element (r, k) of t in a.
    fn t_at(&self, r: Sc, k: Sc) -> Sc {
        let (r, k) = if self.swapped { (k, r) } else { (r, k) };
        Sc::plus(reg(self.a_base), Sc::plus(Sc::times(r, c(self.n)), k))
    }

    /// Element r of the thread's right-hand side in b (a column on the left, a row on the
    /// right).
    fn c_at(&self, r: Sc) -> Sc {
        let (row, col) = if self.left_side {
            (r, reg(self.rhs))
        } else {
            (reg(self.rhs), r)
        };
        Sc::plus(
            reg(self.b_base),
            Sc::plus(Sc::times(row, c(self.cols)), col),
        )
    }

    /// Element r of the thread's solution so far.
    fn y_at(&self, r: Sc) -> Sc {
        Sc::plus(
            reg(self.y_base),
            Sc::plus(Sc::times(r, c(self.m)), reg(self.rhs)),
        )
    }

    /// The rows already known when row `i` is solved: before it (lower), after it (upper).
    fn known(&self) -> (Sc, Sc) {
        if self.lower {
            (c(0), reg(self.i))
        } else {
            (Sc::plus(reg(self.i), c(1)), c(self.n))
        }
    }

    /// A step's first statements: its row `i` (from the top when lower, from the bottom
    /// when upper) and that row's element `at` of `c`.
    fn row_start(&self) -> Vec<Stmt> {
        vec![
            Stmt::Let {
                reg: self.i,
                value: if self.lower {
                    reg(self.step)
                } else {
                    // n - 1 - step, which a 0 x 0 matrix (no steps) must not compute here.
                    Sc::minus(c(self.n), Sc::plus(reg(self.step), c(1)))
                },
            },
            Stmt::Let {
                reg: self.at,
                value: self.c_at(reg(self.i)),
            },
        ]
    }

    /// The thread's solve: its matrix, right-hand side and bases, then `row` for each of
    /// the n steps.
    fn run(&self, row: Vec<Stmt>) -> Vec<Stmt> {
        let (n, m, cols) = (self.n, self.m, self.cols);
        let rows_b = if self.left_side { n } else { m };
        vec![
            Stmt::Let {
                reg: self.matrix,
                value: Sc::quot(reg(PROBLEM), c(m)),
            },
            Stmt::Let {
                reg: self.rhs,
                value: Sc::modulo(reg(PROBLEM), c(m)),
            },
            Stmt::Let {
                reg: self.a_base,
                value: Sc::times(reg(self.matrix), c(n * n)),
            },
            Stmt::Let {
                reg: self.b_base,
                value: Sc::times(reg(self.matrix), c(rows_b * cols)),
            },
            Stmt::Let {
                reg: self.y_base,
                value: Sc::times(reg(self.matrix), c(n * m)),
            },
            Stmt::count_up(self.step, c(0), c(n), row),
        ]
    }
}

/// Registers and value expressions of one launch.
struct Builder {
    /// Registers allocated (the first are [`PROBLEM`] and [`RAW`]).
    regs: usize,
    /// The launch's inputs (value registers are read as inputs after them).
    inputs: usize,
    /// The dtype the arithmetic runs in.
    calc: DType,
    /// The operands' dtype.
    operand: DType,
}

impl Builder {
    fn reg(&mut self) -> usize {
        self.regs += 1;
        self.regs - 1
    }

    /// Value register `i` of an [`Stmt::Eval`]'s scalars, of `dtype`.
    fn scalar(&self, i: usize, dtype: DType) -> Expr {
        Expr::Load {
            input: self.inputs + i,
            dtype,
            coef: Vec::new(),
            off: 0,
        }
    }

    fn op(&self, kind: OpKind, args: Vec<Expr>, dtype: DType) -> Expr {
        Expr::Op {
            op: Ew::Kind(kind),
            dtype,
            args,
        }
    }

    fn cmp(&self, d: ComparisonDirection, a: Expr, b: Expr) -> Expr {
        Expr::Op {
            op: Ew::Cmp(d),
            dtype: DType::Pred,
            args: vec![a, b],
        }
    }

    /// `reg = expr` over the value registers `scalars`.
    fn eval(&self, reg: usize, expr: Expr, scalars: Vec<usize>) -> Stmt {
        Stmt::Eval { reg, expr, scalars }
    }

    /// `reg = buf[index]`, converted to the arithmetic's dtype from `dtype` (a load of an
    /// operand; the scratch buffers hold that dtype already).
    fn load(&self, reg: usize, buf: Buf, index: Sc, dtype: DType) -> Vec<Stmt> {
        if dtype == self.calc {
            return vec![Stmt::Load { reg, buf, index }];
        }
        vec![
            Stmt::Load {
                reg: RAW,
                buf,
                index,
            },
            self.eval(
                reg,
                Expr::Op {
                    op: Ew::Convert,
                    dtype: self.calc,
                    args: vec![self.scalar(0, dtype)],
                },
                vec![RAW],
            ),
        ]
    }

    /// `acc = acc - x · y` in the arithmetic's dtype (the product rounded, then the
    /// difference, as the reference's `s -= x * y`).
    fn sub_product(&self, acc: usize, x: usize, y: usize) -> Stmt {
        let d = self.calc;
        let product = self.op(
            OpKind::Multiply,
            vec![self.scalar(1, d), self.scalar(2, d)],
            d,
        );
        self.eval(
            acc,
            self.op(OpKind::Subtract, vec![self.scalar(0, d), product], d),
            vec![acc, x, y],
        )
    }

    /// `reg = a / b` in the arithmetic's dtype.
    fn quotient(&self, reg: usize, a: usize, b: usize) -> Stmt {
        let d = self.calc;
        self.eval(
            reg,
            self.op(
                OpKind::Divide,
                vec![self.scalar(0, d), self.scalar(1, d)],
                d,
            ),
            vec![a, b],
        )
    }

    /// `reg = value` in the arithmetic's dtype.
    fn constant(&self, reg: usize, value: f64) -> Stmt {
        self.eval(
            reg,
            Expr::Const {
                dtype: self.calc,
                value,
            },
            Vec::new(),
        )
    }

    /// A thread's Cholesky factorization of matrix `PROBLEM` (`n x n`, input 0) into output
    /// 0, the lower factor built in scratch output 1 (see the module's documentation).
    fn cholesky(&mut self, n: usize, lower: bool) -> Vec<Stmt> {
        let a_dtype = self.operand;
        let (base, bad, j, k, i, s, x, y, d, ok, zero, nan, row, col) = (
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
        );
        let work = Buf::Output(1);
        let nn = n * n;
        // Element (r, q) of the matrix as the lower factor reads it: the upper factor is the
        // transpose of the lower one of the matrix mirrored from the upper triangle.
        let at = |r: Sc, q: Sc| -> Sc {
            let (r, q) = if lower { (r, q) } else { (q, r) };
            Sc::plus(reg(base), Sc::plus(Sc::times(r, c(n)), q))
        };
        let l_at = |r: Sc, q: Sc| Sc::plus(reg(base), Sc::plus(Sc::times(r, c(n)), q));
        let mut diagonal = self.load(s, Buf::Input(0), at(reg(j), reg(j)), a_dtype);
        diagonal.push(Stmt::count_up(
            k,
            c(0),
            reg(j),
            vec![
                Stmt::Load {
                    reg: x,
                    buf: work,
                    index: l_at(reg(j), reg(k)),
                },
                self.sub_product(s, x, x),
            ],
        ));
        diagonal.extend([
            // `!(s > 0)` also catches NaN.
            self.eval(
                ok,
                self.cmp(
                    ComparisonDirection::Gt,
                    self.scalar(0, self.calc),
                    Expr::Const {
                        dtype: self.calc,
                        value: 0.0,
                    },
                ),
                vec![s],
            ),
            Stmt::Let {
                reg: bad,
                value: Sc::lt(c(0), Sc::plus(reg(bad), Sc::is_zero(reg(ok)))),
            },
            self.eval(
                d,
                self.op(OpKind::Sqrt, vec![self.scalar(0, self.calc)], self.calc),
                vec![s],
            ),
            Stmt::Store {
                buf: work,
                index: l_at(reg(j), reg(j)),
                value: d,
            },
        ]);
        let mut below = self.load(s, Buf::Input(0), at(reg(i), reg(j)), a_dtype);
        below.extend([
            Stmt::count_up(
                k,
                c(0),
                reg(j),
                vec![
                    Stmt::Load {
                        reg: x,
                        buf: work,
                        index: l_at(reg(i), reg(k)),
                    },
                    Stmt::Load {
                        reg: y,
                        buf: work,
                        index: l_at(reg(j), reg(k)),
                    },
                    self.sub_product(s, x, y),
                ],
            ),
            self.quotient(s, s, d),
            Stmt::Store {
                buf: work,
                index: l_at(reg(i), reg(j)),
                value: s,
            },
        ]);
        diagonal.push(Stmt::count_up(i, Sc::plus(reg(j), c(1)), c(n), below));
        // The result: the factor's triangle (transposed for the upper one), zeros elsewhere,
        // or NaN everywhere.
        let (fr, fc) = if lower {
            (reg(row), reg(col))
        } else {
            (reg(col), reg(row))
        };
        let in_triangle = Sc::lt(Sc::minus(fc.clone(), fr.clone()), c(1));
        let out_at = Sc::plus(reg(base), Sc::plus(Sc::times(reg(row), c(n)), reg(col)));
        let element = vec![
            Stmt::If {
                cond: reg(bad),
                body: vec![Stmt::Store {
                    buf: Buf::Output(0),
                    index: out_at.clone(),
                    value: nan,
                }],
            },
            Stmt::If {
                cond: Sc::and(Sc::is_zero(reg(bad)), in_triangle.clone()),
                body: vec![
                    Stmt::Load {
                        reg: x,
                        buf: work,
                        index: l_at(fr, fc),
                    },
                    Stmt::Store {
                        buf: Buf::Output(0),
                        index: out_at.clone(),
                        value: x,
                    },
                ],
            },
            Stmt::If {
                cond: Sc::and(Sc::is_zero(reg(bad)), Sc::is_zero(in_triangle)),
                body: vec![Stmt::Store {
                    buf: Buf::Output(0),
                    index: out_at,
                    value: zero,
                }],
            },
        ];
        vec![
            Stmt::Let {
                reg: base,
                value: Sc::times(reg(PROBLEM), c(nn)),
            },
            Stmt::Let {
                reg: bad,
                value: c(0),
            },
            self.constant(zero, 0.0),
            self.constant(nan, f64::NAN),
            Stmt::count_up(j, c(0), c(n), diagonal),
            Stmt::count_up(
                row,
                c(0),
                c(n),
                vec![Stmt::count_up(col, c(0), c(n), element)],
            ),
        ]
    }

    /// A thread's substitution for right-hand side `PROBLEM % m` of matrix `PROBLEM / m`
    /// (`a` input 0, `b` input 1) into output 0, the solution so far in scratch output 1.
    fn solve(&mut self, s: &Solve) -> Vec<Stmt> {
        let dtype = self.operand;
        let f = SolveFrame::new(self, s);
        let [acc, t, y, d] = std::array::from_fn(|_| self.reg());
        let work = Buf::Output(1);
        let (i, q, at) = (f.i, f.q, f.at);
        let mut row = f.row_start();
        row.extend(self.load(acc, Buf::Input(1), reg(at), dtype));
        let mut term = self.load(t, Buf::Input(0), f.t_at(reg(i), reg(q)), dtype);
        term.extend([
            Stmt::Load {
                reg: y,
                buf: work,
                index: f.y_at(reg(q)),
            },
            self.sub_product(acc, t, y),
        ]);
        let (from, to) = f.known();
        row.push(Stmt::count_up(q, from, to, term));
        if !s.unit_diagonal {
            row.extend(self.load(d, Buf::Input(0), f.t_at(reg(i), reg(i)), dtype));
            row.push(self.quotient(acc, acc, d));
        }
        row.extend([
            Stmt::Store {
                buf: work,
                index: f.y_at(reg(i)),
                value: acc,
            },
            Stmt::Store {
                buf: Buf::Output(0),
                index: reg(at),
                value: acc,
            },
        ]);
        f.run(row)
    }

    /// A thread's LU factorization of matrix `PROBLEM` (input 0) into outputs 0 (the packed
    /// factors), 1 (the pivots) and 2 (the permutation), on a scratch copy of the matrix
    /// (output 3) and of the permutation (output 4).
    fn lu(&mut self, n: usize) -> Vec<Stmt> {
        let dtype = self.operand;
        let (base, p_base, e, j, i, col, best, bv, x, better, f, u, tmp, pi, pj) = (
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
            self.reg(),
        );
        let (work, perm) = (Buf::Output(3), Buf::Output(4));
        let w_at = |r: Sc, k: Sc| Sc::plus(reg(base), Sc::plus(Sc::times(r, c(n)), k));
        let p_at = |r: Sc| Sc::plus(reg(p_base), r);
        let d = self.calc;
        let mut copy = self.load(x, Buf::Input(0), Sc::plus(reg(base), reg(e)), dtype);
        copy.push(Stmt::Store {
            buf: work,
            index: Sc::plus(reg(base), reg(e)),
            value: x,
        });
        // A better pivot: a larger magnitude, NaN larger than every number, and nothing
        // better than a NaN (so the first NaN is kept, and the first of equals).
        let is_nan = |e: Expr| self.cmp(ComparisonDirection::Ne, e.clone(), e);
        let abs = |e: Expr| self.op(OpKind::Abs, vec![e], d);
        let better_pivot = Expr::Op {
            op: Ew::Kind(OpKind::And),
            dtype: DType::Pred,
            args: vec![
                self.cmp(
                    ComparisonDirection::Eq,
                    self.scalar(1, d),
                    self.scalar(1, d),
                ),
                Expr::Op {
                    op: Ew::Kind(OpKind::Or),
                    dtype: DType::Pred,
                    args: vec![
                        is_nan(self.scalar(0, d)),
                        self.cmp(
                            ComparisonDirection::Gt,
                            abs(self.scalar(0, d)),
                            abs(self.scalar(1, d)),
                        ),
                    ],
                },
            ],
        };
        let search = Stmt::count_up(
            i,
            Sc::plus(reg(j), c(1)),
            c(n),
            vec![
                Stmt::Load {
                    reg: x,
                    buf: work,
                    index: w_at(reg(i), reg(j)),
                },
                self.eval(better, better_pivot, vec![x, bv]),
                Stmt::If {
                    cond: reg(better),
                    body: vec![
                        Stmt::Let {
                            reg: best,
                            value: reg(i),
                        },
                        self.eval(bv, self.scalar(0, d), vec![x]),
                    ],
                },
            ],
        );
        let swap_rows = Stmt::If {
            cond: Sc::is_zero(Sc::eq(reg(best), reg(j))),
            body: vec![
                Stmt::count_up(
                    col,
                    c(0),
                    c(n),
                    vec![
                        Stmt::Load {
                            reg: x,
                            buf: work,
                            index: w_at(reg(j), reg(col)),
                        },
                        Stmt::Load {
                            reg: tmp,
                            buf: work,
                            index: w_at(reg(best), reg(col)),
                        },
                        Stmt::Store {
                            buf: work,
                            index: w_at(reg(j), reg(col)),
                            value: tmp,
                        },
                        Stmt::Store {
                            buf: work,
                            index: w_at(reg(best), reg(col)),
                            value: x,
                        },
                    ],
                ),
                Stmt::Load {
                    reg: pj,
                    buf: perm,
                    index: p_at(reg(j)),
                },
                Stmt::Load {
                    reg: pi,
                    buf: perm,
                    index: p_at(reg(best)),
                },
                Stmt::Store {
                    buf: perm,
                    index: p_at(reg(j)),
                    value: pi,
                },
                Stmt::Store {
                    buf: perm,
                    index: p_at(reg(best)),
                    value: pj,
                },
            ],
        };
        // Row i below the pivot: its multiplier (divided unless the pivot is zero), then the
        // row's elements to the right less the multiple of the pivot's row.
        let eliminate = Stmt::count_up(
            i,
            Sc::plus(reg(j), c(1)),
            c(n),
            vec![
                Stmt::Load {
                    reg: f,
                    buf: work,
                    index: w_at(reg(i), reg(j)),
                },
                Stmt::If {
                    cond: reg(better),
                    body: vec![
                        self.quotient(f, f, bv),
                        Stmt::Store {
                            buf: work,
                            index: w_at(reg(i), reg(j)),
                            value: f,
                        },
                    ],
                },
                Stmt::count_up(
                    col,
                    Sc::plus(reg(j), c(1)),
                    c(n),
                    vec![
                        Stmt::Load {
                            reg: x,
                            buf: work,
                            index: w_at(reg(i), reg(col)),
                        },
                        Stmt::Load {
                            reg: u,
                            buf: work,
                            index: w_at(reg(j), reg(col)),
                        },
                        self.sub_product(x, f, u),
                        Stmt::Store {
                            buf: work,
                            index: w_at(reg(i), reg(col)),
                            value: x,
                        },
                    ],
                ),
            ],
        );
        let column = vec![
            Stmt::Let {
                reg: best,
                value: reg(j),
            },
            Stmt::Load {
                reg: bv,
                buf: work,
                index: w_at(reg(j), reg(j)),
            },
            search,
            Stmt::Store {
                buf: Buf::Output(1),
                index: p_at(reg(j)),
                value: best,
            },
            swap_rows,
            // The pivot, and whether it divides (`better` reused: nonzero).
            Stmt::Load {
                reg: bv,
                buf: work,
                index: w_at(reg(j), reg(j)),
            },
            self.eval(
                better,
                self.cmp(
                    ComparisonDirection::Ne,
                    self.scalar(0, d),
                    Expr::Const {
                        dtype: d,
                        value: 0.0,
                    },
                ),
                vec![bv],
            ),
            eliminate,
        ];
        let finish = vec![
            Stmt::Load {
                reg: x,
                buf: work,
                index: Sc::plus(reg(base), reg(e)),
            },
            Stmt::Store {
                buf: Buf::Output(0),
                index: Sc::plus(reg(base), reg(e)),
                value: x,
            },
        ];
        let permutation = vec![
            Stmt::Load {
                reg: pi,
                buf: perm,
                index: p_at(reg(e)),
            },
            Stmt::Store {
                buf: Buf::Output(2),
                index: p_at(reg(e)),
                value: pi,
            },
        ];
        vec![
            Stmt::Let {
                reg: base,
                value: Sc::times(reg(PROBLEM), c(n * n)),
            },
            Stmt::Let {
                reg: p_base,
                value: Sc::times(reg(PROBLEM), c(n)),
            },
            Stmt::count_up(e, c(0), c(n * n), copy),
            Stmt::count_up(
                e,
                c(0),
                c(n),
                vec![
                    Stmt::Let {
                        reg: pi,
                        value: reg(e),
                    },
                    Stmt::Store {
                        buf: perm,
                        index: p_at(reg(e)),
                        value: pi,
                    },
                ],
            ),
            Stmt::count_up(j, c(0), c(n), column),
            Stmt::count_up(e, c(0), c(n * n), finish),
            Stmt::count_up(e, c(0), c(n), permutation),
        ]
    }
}
