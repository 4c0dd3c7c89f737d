//! A `triangular_solve` of complex operands on the GPU: the substitution of [`super`] on the
//! numbers' parts. Element `e` of a complex buffer is its parts `2e` (real) and `2e + 1`
//! (imaginary) of the buffer as the launch binds it; every operation is the reference's
//! (`kiln_reference::complex`): `t · y` as `(tr yr - ti yi, tr yi + ti yr)`, each row's terms
//! subtracted in order of their column, and the quotient by the diagonal by Smith's scaled
//! division (the larger part of the divisor first; by zero, each part divided by `|0|`; a
//! numerator or divisor of tiny parts scaled up first, `crate::complex::scale_tiny`).
//! `ADJOINT` conjugates `a`'s elements, its diagonal included.

use super::{Builder, Solve, SolveFrame, c, reg};
use crate::gpu::ir::{Buf, Sc, Stmt};
use crate::ir::Expr;
use kiln_ir::{ComparisonDirection, OpKind};

/// The real part's index of complex element `e`.
fn re(e: Sc) -> Sc {
    Sc::times(e, c(2))
}

/// The imaginary part's index of complex element `e`.
fn im(e: Sc) -> Sc {
    Sc::plus(Sc::times(e, c(2)), c(1))
}

impl Builder {
    /// `reg = f(scalars)`, an expression of the arithmetic's dtype over value registers.
    fn arith(&self, reg: usize, scalars: &[usize], f: impl Fn(&[Expr]) -> Expr) -> Stmt {
        let xs: Vec<Expr> = (0..scalars.len())
            .map(|i| self.scalar(i, self.calc))
            .collect();
        self.eval(reg, f(&xs), scalars.to_vec())
    }

    fn bin(&self, kind: OpKind, a: Expr, b: Expr) -> Expr {
        self.op(kind, vec![a, b], self.calc)
    }

    /// `a`'s element at complex index `e` into `(r, i)`, conjugated when `adjoint`.
    fn load_complex(&self, (r, i): (usize, usize), buf: Buf, e: Sc, adjoint: bool) -> Vec<Stmt> {
        let mut out = vec![
            Stmt::Load {
                reg: r,
                buf,
                index: re(e.clone()),
            },
            Stmt::Load {
                reg: i,
                buf,
                index: im(e),
            },
        ];
        if adjoint {
            out.push(self.arith(i, &[i], |x| {
                self.op(OpKind::Negate, vec![x[0].clone()], self.calc)
            }));
        }
        out
    }

    /// `x = x · 2^k` for both registers of `x` where both parts are below the bound of
    /// [`crate::complex::tiny_exponent`], with `s` set to the factor (2^k or 1).
    fn scale_tiny(&self, (a, b): (usize, usize), s: usize) -> Vec<Stmt> {
        let (k, bound) = crate::complex::tiny_exponent(self.calc);
        let k_ = |value: f64| Expr::Const {
            dtype: self.calc,
            value,
        };
        let factor = self.arith(s, &[a, b], |x| {
            let abs = |e: Expr| self.op(OpKind::Abs, vec![e], self.calc);
            let m = self.bin(OpKind::Maximum, abs(x[0].clone()), abs(x[1].clone()));
            Expr::Op {
                op: crate::ir::Ew::Select,
                dtype: self.calc,
                args: vec![
                    self.cmp(ComparisonDirection::Lt, m, k_(bound)),
                    k_(2f64.powi(k)),
                    k_(1.0),
                ],
            }
        });
        let times = |v: usize| {
            self.arith(v, &[v, s], |x| {
                self.bin(OpKind::Multiply, x[0].clone(), x[1].clone())
            })
        };
        vec![factor, times(a), times(b)]
    }

    /// `(p, q) = (p, q) / (dc, dd)` by Smith's division, with `tmp` five value registers and
    /// `tests` two for its tests (a zero divisor, and `|dc| >= |dd|`); a numerator or divisor
    /// of tiny parts scaled up first, and the quotient by the ratio of the scales.
    fn smith(
        &self,
        (p, q): (usize, usize),
        (dc, dd): (usize, usize),
        tmp: [usize; 5],
        tests: [usize; 2],
    ) -> Vec<Stmt> {
        let [r, t, p0, sn, sd] = tmp;
        let [zero_divisor, big] = tests;
        let abs = |e: Expr| self.op(OpKind::Abs, vec![e], self.calc);
        let zero = Expr::Const {
            dtype: self.calc,
            value: 0.0,
        };
        use OpKind::{Add, Divide, Multiply, Subtract};
        // |c| >= |d|, and both zero.
        let both_zero = self.arith(zero_divisor, &[dc, dd], |x| Expr::Op {
            op: crate::ir::Ew::Kind(OpKind::And),
            dtype: kiln_ir::DType::Pred,
            args: vec![
                self.cmp(ComparisonDirection::Eq, x[0].clone(), zero.clone()),
                self.cmp(ComparisonDirection::Eq, x[1].clone(), zero.clone()),
            ],
        });
        let c_first = self.arith(big, &[dc, dd], |x| {
            self.cmp(
                ComparisonDirection::Ge,
                abs(x[0].clone()),
                abs(x[1].clone()),
            )
        });
        let by_zero = vec![
            self.arith(p, &[p, dc], |x| {
                self.bin(Divide, x[0].clone(), abs(x[1].clone()))
            }),
            self.arith(q, &[q, dc], |x| {
                self.bin(Divide, x[0].clone(), abs(x[1].clone()))
            }),
        ];
        // r = d / c, t = c + d r, ((p + q r) / t, (q - p r) / t).
        let c_larger = vec![
            self.arith(r, &[dd, dc], |x| {
                self.bin(Divide, x[0].clone(), x[1].clone())
            }),
            self.arith(t, &[dc, dd, r], |x| {
                self.bin(
                    Add,
                    x[0].clone(),
                    self.bin(Multiply, x[1].clone(), x[2].clone()),
                )
            }),
            self.arith(p0, &[p], |x| x[0].clone()),
            self.arith(p, &[p, q, r, t], |x| {
                let num = self.bin(
                    Add,
                    x[0].clone(),
                    self.bin(Multiply, x[1].clone(), x[2].clone()),
                );
                self.bin(Divide, num, x[3].clone())
            }),
            self.arith(q, &[q, p0, r, t], |x| {
                let num = self.bin(
                    Subtract,
                    x[0].clone(),
                    self.bin(Multiply, x[1].clone(), x[2].clone()),
                );
                self.bin(Divide, num, x[3].clone())
            }),
        ];
        // r = c / d, t = c r + d, ((p r + q) / t, (q r - p) / t).
        let d_larger = vec![
            self.arith(r, &[dc, dd], |x| {
                self.bin(Divide, x[0].clone(), x[1].clone())
            }),
            self.arith(t, &[dc, r, dd], |x| {
                self.bin(
                    Add,
                    self.bin(Multiply, x[0].clone(), x[1].clone()),
                    x[2].clone(),
                )
            }),
            self.arith(p0, &[p], |x| x[0].clone()),
            self.arith(p, &[p, r, q, t], |x| {
                let num = self.bin(
                    Add,
                    self.bin(Multiply, x[0].clone(), x[1].clone()),
                    x[2].clone(),
                );
                self.bin(Divide, num, x[3].clone())
            }),
            self.arith(q, &[q, r, p0, t], |x| {
                let num = self.bin(
                    Subtract,
                    self.bin(Multiply, x[0].clone(), x[1].clone()),
                    x[2].clone(),
                );
                self.bin(Divide, num, x[3].clone())
            }),
        ];
        let mut out = self.scale_tiny((p, q), sn);
        out.extend(self.scale_tiny((dc, dd), sd));
        out.extend([
            both_zero,
            c_first,
            Stmt::If {
                cond: reg(zero_divisor),
                body: by_zero,
            },
            Stmt::If {
                cond: Sc::and(Sc::is_zero(reg(zero_divisor)), reg(big)),
                body: c_larger,
            },
            Stmt::If {
                cond: Sc::and(Sc::is_zero(reg(zero_divisor)), Sc::is_zero(reg(big))),
                body: d_larger,
            },
            // The scales' ratio (exact: powers of two), then the quotient by it.
            self.arith(sd, &[sd, sn], |x| {
                self.bin(Divide, x[0].clone(), x[1].clone())
            }),
        ]);
        for v in [p, q] {
            out.push(self.arith(v, &[v, sd], |x| {
                self.bin(Multiply, x[0].clone(), x[1].clone())
            }));
        }
        out
    }

    /// [`Builder::solve`] on complex operands bound as their parts (see the module's
    /// documentation), `adjoint` conjugating `a`'s elements.
    pub(super) fn complex_solve(&mut self, s: &Solve, adjoint: bool) -> Vec<Stmt> {
        let f = SolveFrame::new(self, s);
        let [flag, big] = std::array::from_fn(|_| self.reg());
        let [ar, ai, tr, ti, yr, yi, pr, pi, dr, di, r, t, p0, sn, sd] =
            std::array::from_fn(|_| self.reg());
        let work = Buf::Output(1);
        let (i, q, at) = (f.i, f.q, f.at);
        use OpKind::{Add, Multiply, Subtract};
        let mut term = self.load_complex((tr, ti), Buf::Input(0), f.t_at(reg(i), reg(q)), adjoint);
        term.extend(self.load_complex((yr, yi), work, f.y_at(reg(q)), false));
        term.extend([
            self.arith(pr, &[tr, yr, ti, yi], |x| {
                self.bin(
                    Subtract,
                    self.bin(Multiply, x[0].clone(), x[1].clone()),
                    self.bin(Multiply, x[2].clone(), x[3].clone()),
                )
            }),
            self.arith(pi, &[tr, yi, ti, yr], |x| {
                self.bin(
                    Add,
                    self.bin(Multiply, x[0].clone(), x[1].clone()),
                    self.bin(Multiply, x[2].clone(), x[3].clone()),
                )
            }),
            self.arith(ar, &[ar, pr], |x| {
                self.bin(Subtract, x[0].clone(), x[1].clone())
            }),
            self.arith(ai, &[ai, pi], |x| {
                self.bin(Subtract, x[0].clone(), x[1].clone())
            }),
        ]);
        let mut row = f.row_start();
        row.extend(self.load_complex((ar, ai), Buf::Input(1), reg(at), false));
        let (from, to) = f.known();
        row.push(Stmt::count_up(q, from, to, term));
        if !s.unit_diagonal {
            row.extend(self.load_complex((dr, di), Buf::Input(0), f.t_at(reg(i), reg(i)), adjoint));
            row.extend(self.smith((ar, ai), (dr, di), [r, t, p0, sn, sd], [flag, big]));
        }
        for (part, v) in [(re as fn(Sc) -> Sc, ar), (im, ai)] {
            row.push(Stmt::Store {
                buf: work,
                index: part(f.y_at(reg(i))),
                value: v,
            });
            row.push(Stmt::Store {
                buf: Buf::Output(0),
                index: part(reg(at)),
                value: v,
            });
        }
        f.run(row)
    }
}
