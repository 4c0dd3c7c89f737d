//! Rewrites the CPU backend applies before making kernels.
//!
//! - [`fold_transposed_products`]: `transpose(a b)` becomes `b a` with the operands swapped.
//! - [`winograd_convs`]: 3 x 3 convolutions with enough features become Winograd's F(4x4, 3x3).
//! - [`gemm_convs`]: 2-D convolutions take the layouts the GEMM reads as an implicit im2col.
//! - [`expand_rngs`]: `rng_bit_generator` becomes Threefry integer arithmetic.
//! - [`canonicalize_dots`]: every float `dot_general` gets operands the GEMM reads in place
//!   (`[B, M, K]` or `[B, K, M]` times `[B, K, N]` or `[B, N, K]`, see
//!   [`matmul_layout`]), by transposing an operand whose dimensions are in neither order
//!   (an O(size) copy in front of the O(M N K) product; none for `x @ w`, `x^T @ y`, `x @ w^T`).
//!   The result type is unchanged: its dimensions are batch, lhs free, rhs free either way.
//!
//! Canonicalization rewrites the graph into what lowering takes ([`crate::lower`]), so it
//! imports lowering's layouts and never the other way around.

use crate::lower::{
    GEMM_CONV_INPUT, GEMM_CONV_KERNEL, GEMM_CONV_OUTPUT, GEMM_CONV_PLANES, is_gemm_conv,
    matmul_layout,
};
use crate::target::TargetInfo;
use kiln_ir::{Builder, DType, Func, Inst, Op, TensorType, ValueId, VerifyError};

fn free_dims(rank: usize, a: &[i64], c: &[i64]) -> Vec<i64> {
    (0..rank as i64)
        .filter(|d| !a.contains(d) && !c.contains(d))
        .collect()
}

/// Permutes `v` to `perm` (skipped when it is the identity).
fn permute(b: &mut Builder, v: ValueId, perm: &[i64]) -> Result<ValueId, VerifyError> {
    if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        Ok(v)
    } else {
        b.transpose(v, perm)
    }
}

/// `f` rebuilt instruction by instruction, values renumbered in definition order and source
/// locations kept; `rewrite` may replace one (given the builder, the instruction and its
/// operands' new values) by returning the values standing for its results. Every instruction
/// built for one of `f`'s has that one's location, or none when it has none (never a line of
/// the rewrite's code).
pub fn rebuild(
    f: &Func,
    mut rewrite: impl FnMut(
        &mut Builder,
        &Inst,
        &[ValueId],
    ) -> Result<Option<Vec<ValueId>>, VerifyError>,
) -> Result<Func, VerifyError> {
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for &p in &f.params {
        map[p.index()] = Some(b.param(f.values[p.index()].clone()));
    }
    for inst in &f.insts {
        let ops: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("verified SSA"))
            .collect();
        let first = b.inst_count();
        let results = match rewrite(&mut b, inst, &ops)? {
            Some(r) => r,
            None => {
                let tys: Vec<TensorType> = inst
                    .results
                    .iter()
                    .map(|r| f.values[r.index()].clone())
                    .collect();
                b.push_at(inst.op.clone(), &ops, Some(&tys), inst.loc)?
            }
        };
        b.locate_from(first, inst.loc);
        for (&r, v) in inst.results.iter().zip(results) {
            map[r.index()] = Some(v);
        }
    }
    let outs: Vec<ValueId> = f
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("verified SSA"))
        .collect();
    b.finish(&outs)
}

/// The function with every `dot_general` or `convolution` whose result type is wider than its
/// operands' (`preferred_element_type`: bf16 x bf16 -> f32, i8 x i8 -> i32) computed as the
/// product of its operands converted to the result type. The conversions are exact, so the products and
/// sums are those of the wider type, as the op's spec defines them; the rest of the pipeline
/// (the optimizer included) then sees only products of one element type.
///
/// With `keep_half`, a product of bf16 or f16 operands with an f32 result is kept as it is:
/// a GPU's tensor cores multiply such operands themselves (the GPU mapping reads them in
/// their own dtype and accumulates in f32); and a product of bf16 or f16 operands with a
/// result of their dtype becomes that f32 product converted to the result's dtype (the sum
/// rounded once at the end, as the reference rounds it), which fusion makes the product's
/// epilogue, so the tensor cores compute it and the conversion happens as it is stored.
pub fn widen_dots(f: &Func, keep_half: bool) -> Result<Func, VerifyError> {
    let dtypes = |i: &kiln_ir::Inst| {
        (
            f.values[i.operands[0].index()].dtype,
            f.values[i.operands[1].index()].dtype,
            f.values[i.results[0].index()].dtype,
        )
    };
    let is_half = |d: DType| matches!(d, DType::BF16 | DType::F16);
    let mixed = |i: &kiln_ir::Inst| {
        if matches!(i.op, Op::Convolution { .. }) {
            let (x, _, y) = dtypes(i);
            return x != y;
        }
        if !matches!(i.op, Op::DotGeneral { .. }) {
            return false;
        }
        let (x, _, y) = dtypes(i);
        let half = keep_half && is_half(x) && y == DType::F32;
        x != y && !half
    };
    let narrow = |i: &kiln_ir::Inst| {
        if !keep_half || !matches!(i.op, Op::DotGeneral { .. }) {
            return false;
        }
        let (x, w, y) = dtypes(i);
        is_half(x) && x == w && y == x
    };
    if !f.insts.iter().any(|i| mixed(i) || narrow(i)) {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let out = f.values[inst.results[0].index()].clone();
        if narrow(inst) {
            let wide = TensorType::new(DType::F32, out.shape.clone());
            let product = b.inst_typed(inst.op.clone(), &[ops[0], ops[1]], wide)?;
            return Ok(Some(vec![b.convert(product, out.dtype)?]));
        }
        if !mixed(inst) {
            return Ok(None);
        }
        let a = b.convert(ops[0], out.dtype)?;
        let c = b.convert(ops[1], out.dtype)?;
        Ok(Some(vec![b.inst_typed(inst.op.clone(), &[a, c], out)?]))
    })
}

/// The function with its float dot_generals in canonical form.
pub fn canonicalize_dots(f: &Func) -> Result<Func, VerifyError> {
    if !f
        .insts
        .iter()
        .any(|i| matches!(i.op, Op::DotGeneral { .. }))
    {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let out_ty = &f.values[inst.results[0].index()];
        let Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } = &inst.op
        else {
            return Ok(None);
        };
        if !out_ty.dtype.is_float() {
            return Ok(None);
        }
        let (lt, rt) = (
            &f.values[inst.operands[0].index()],
            &f.values[inst.operands[1].index()],
        );
        if matmul_layout(lb, rb, lc, rc, lt, rt).is_some() {
            return Ok(None);
        }
        let (lf, rf) = (free_dims(lt.rank(), lb, lc), free_dims(rt.rank(), rb, rc));
        let lperm: Vec<i64> = lb.iter().chain(&lf).chain(lc).copied().collect();
        let rperm: Vec<i64> = rb.iter().chain(rc).chain(&rf).copied().collect();
        let a = permute(b, ops[0], &lperm)?;
        let c = permute(b, ops[1], &rperm)?;
        let (nb, nc) = (lb.len() as i64, lc.len() as i64);
        let range = |lo: i64, hi: i64| (lo..hi).collect::<Vec<i64>>();
        let canon = Op::DotGeneral {
            lhs_batching_dimensions: range(0, nb),
            rhs_batching_dimensions: range(0, nb),
            lhs_contracting_dimensions: range(lt.rank() as i64 - nc, lt.rank() as i64),
            rhs_contracting_dimensions: range(nb, nb + nc),
        };
        // The free dimensions keep their order, so the result type is unchanged (a wider
        // element type than the operands' included: `f16 x f16 -> f32` on the GPU).
        Ok(Some(vec![b.inst_typed(canon, &[a, c], out_ty.clone())?]))
    })
}

/// A convolution's attributes (see `Op::Convolution`).
struct Conv<'a> {
    window_strides: &'a [i64],
    padding: &'a [(i64, i64)],
    lhs_dilation: &'a [i64],
    rhs_dilation: &'a [i64],
    feature_group_count: i64,
    input_dims: &'a [i64],
    kernel_dims: &'a [i64],
    output_dims: &'a [i64],
    batch_group_count: i64,
}

/// `f` rebuilt (see [`rebuild`]) with `rewrite` offered each convolution, given its attributes
/// and its result type; `f` itself when it has none.
fn rebuild_convs(
    f: &Func,
    mut rewrite: impl FnMut(
        &mut Builder,
        &Inst,
        &[ValueId],
        &Conv,
        &TensorType,
    ) -> Result<Option<Vec<ValueId>>, VerifyError>,
) -> Result<Func, VerifyError> {
    if !f
        .insts
        .iter()
        .any(|i| matches!(i.op, Op::Convolution { .. }))
    {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let Op::Convolution {
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            feature_group_count,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count,
        } = &inst.op
        else {
            return Ok(None);
        };
        let conv = Conv {
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            feature_group_count: *feature_group_count,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count: *batch_group_count,
        };
        rewrite(b, inst, ops, &conv, &f.values[inst.results[0].index()])
    })
}

/// A convolution's `[N, OH, OW, O]` result `y` in the layout of `output_dims`: output dimension
/// `output_dims[k]` holds canonical dimension k, which sits at NHWC position
/// `GEMM_CONV_OUTPUT[k]`.
fn from_nhwc(b: &mut Builder, y: ValueId, output_dims: &[i64]) -> Result<ValueId, VerifyError> {
    let mut perm = vec![0i64; 4];
    for (k, &d) in output_dims.iter().enumerate() {
        perm[d as usize] = GEMM_CONV_OUTPUT[k];
    }
    permute(b, y, &perm)
}

/// Rewrites each float 2-D convolution without feature groups or input dilation into the form
/// the GEMM runs as an implicit im2col (its packing reads the patches straight from the
/// input): the input transposed to NHWC and padded, the kernel transposed to HWIO, the output
/// NCHW as the GEMM writes it (by columns), or else NHWC, transposed back to the original
/// layout. Transposes and pads are O(size) copies (none
/// for operands already in that layout); the patch matrix is never materialized.
pub fn gemm_convs(f: &Func) -> Result<Func, VerifyError> {
    rebuild_convs(f, |b, inst, ops, c, out_ty| {
        if is_gemm_conv(&inst.op)
            || !out_ty.dtype.is_float()
            || c.feature_group_count != 1
            || c.batch_group_count != 1
            || c.input_dims.len() != 4
            || c.lhs_dilation.iter().any(|&d| d != 1)
            || out_ty.numel() == 0
        {
            return Ok(None);
        }
        let at = |dims: &[i64], order: [usize; 4]| order.map(|i| dims[i]);
        let x = permute(b, ops[0], &at(c.input_dims, [0, 2, 3, 1]))?;
        let x = if c.padding.iter().all(|&p| p == (0, 0)) {
            x
        } else {
            let zero = b.scalar(out_ty.dtype, 0.0)?;
            b.inst(
                Op::Pad {
                    edge_padding_low: vec![0, c.padding[0].0, c.padding[1].0, 0],
                    edge_padding_high: vec![0, c.padding[0].1, c.padding[1].1, 0],
                    interior_padding: vec![0; 4],
                },
                &[x, zero],
            )?
        };
        let w = permute(b, ops[1], &at(c.kernel_dims, [2, 3, 1, 0]))?;
        // An NCHW result is written as it stands (by the GEMM's columns); any other through
        // NHWC and a transpose.
        let planes = c.output_dims[..] == GEMM_CONV_PLANES;
        let shape = if planes {
            out_ty.shape.clone()
        } else {
            [0, 2, 3, 1]
                .map(|d| out_ty.shape[c.output_dims[d] as usize])
                .to_vec()
        };
        let conv = b.inst_typed(
            Op::Convolution {
                window_strides: c.window_strides.to_vec(),
                padding: vec![(0, 0); 2],
                lhs_dilation: vec![1, 1],
                rhs_dilation: c.rhs_dilation.to_vec(),
                feature_group_count: 1,
                input_dims: GEMM_CONV_INPUT.to_vec(),
                kernel_dims: GEMM_CONV_KERNEL.to_vec(),
                output_dims: if planes {
                    GEMM_CONV_PLANES.to_vec()
                } else {
                    GEMM_CONV_OUTPUT.to_vec()
                },
                batch_group_count: 1,
            },
            &[x, w],
            TensorType::new(out_ty.dtype, shape),
        )?;
        Ok(Some(vec![if planes {
            conv
        } else {
            from_nhwc(b, conv, c.output_dims)?
        }]))
    })
}

/// Winograd's F(4x4, 3x3) transforms (Lavin and Gray's points 0, ±1, ±2): a 6 x 6 tile `d` of
/// the input and a 3 x 3 kernel `g` give the 4 x 4 outputs `AT [(G g G^T) ⊙ (BT d BT^T)] AT^T`.
const WINOGRAD_BT: [[f64; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];
/// See [`WINOGRAD_BT`].
const WINOGRAD_G: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];
/// See [`WINOGRAD_BT`].
const WINOGRAD_AT: [[f64; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// `Σ coef · value` over the terms with a nonzero coefficient (none: zeros of `ty`); ±1 as
/// adds and subtracts, other coefficients as multiplies by a broadcast constant.
fn combination(
    b: &mut Builder,
    ty: &TensorType,
    terms: impl IntoIterator<Item = (f64, ValueId)>,
) -> Result<ValueId, VerifyError> {
    let mut acc: Option<ValueId> = None;
    for (c, v) in terms {
        if c == 0.0 {
            continue;
        }
        let (magnitude, negative) = (c.abs(), c < 0.0);
        let term = if magnitude == 1.0 {
            v
        } else {
            let k = b.full(ty, magnitude)?;
            b.binary(Op::Multiply {}, v, k)?
        };
        acc = Some(match (acc, negative) {
            (None, false) => term,
            (None, true) => b.unary(Op::Negate {}, term)?,
            (Some(a), false) => b.binary(Op::Add {}, a, term)?,
            (Some(a), true) => b.binary(Op::Subtract {}, a, term)?,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => b.full(ty, 0.0),
    }
}

/// `t x t^T` for the `k x k` grid `x` of arrays of type `ty` (row-major) and the `m x k`
/// matrix `t`: the `m x m` grid (row-major), rows first (`t x`, each entry a [`combination`]
/// of a column of `x`), then columns.
fn sandwich<const K: usize>(
    b: &mut Builder,
    ty: &TensorType,
    t: &[[f64; K]],
    x: &[ValueId],
) -> Result<Vec<ValueId>, VerifyError> {
    let mut rows = Vec::with_capacity(t.len() * K);
    for ta in t {
        for j in 0..K {
            let terms = ta.iter().enumerate().map(|(i, &c)| (c, x[i * K + j]));
            rows.push(combination(b, ty, terms)?);
        }
    }
    let mut out = Vec::with_capacity(t.len() * t.len());
    for row in rows.chunks(K) {
        for te in t {
            let terms = te.iter().zip(row).map(|(&c, &r)| (c, r));
            out.push(combination(b, ty, terms)?);
        }
    }
    Ok(out)
}

/// Rewrites each 2-D convolution with a 3 x 3 kernel, unit strides and dilations, one feature
/// group, non-negative padding, f32 or f64 elements and at least the target's
/// [`FusionLimits::winograd_min_features`](crate::target::FusionLimits::winograd_min_features)
/// input and output features into Winograd's F(4x4, 3x3): the padded NHWC input cut into overlapping
/// 6 x 6 tiles (36 strided slices) and transformed (`BT d BT^T`, adds and small multiples), the
/// kernel transformed (`G g G^T`), one product per transformed position (36 of `[N, TH, TW,
/// C] x [C, O]`, a quarter of the direct convolution's multiply-adds in all; equal kernels,
/// compiled once), and the output transform (`AT m AT^T`) interleaving each tile's 4 x 4
/// outputs back into place. Separate arrays per position, not one stacked `[36, ...]` array:
/// its transform ran the positions as outer loops, each over the whole input (see
/// docs/performance.md).
/// Results differ from the direct sum by rounding only (the transforms are exact in exact
/// arithmetic); f16 and bf16 keep the direct form, whose rounding the transforms' constants (up
/// to 8) would magnify.
pub fn winograd_convs(f: &Func, target: &TargetInfo) -> Result<Func, VerifyError> {
    let min_features = target.fusion.winograd_min_features;
    rebuild_convs(f, |b, inst, ops, conv, out_ty| {
        let (x_ty, w_ty) = (
            &f.values[inst.operands[0].index()],
            &f.values[inst.operands[1].index()],
        );
        if !matches!(out_ty.dtype, DType::F32 | DType::F64)
            || conv.input_dims.len() != 4
            || conv.feature_group_count != 1
            || conv.batch_group_count != 1
            || conv.window_strides.iter().any(|&s| s != 1)
            || conv.lhs_dilation.iter().any(|&d| d != 1)
            || conv.rhs_dilation.iter().any(|&d| d != 1)
            || conv.padding.iter().any(|&(lo, hi)| lo < 0 || hi < 0)
            || conv.kernel_dims[2..]
                .iter()
                .any(|&d| w_ty.shape[d as usize] != 3)
            || x_ty.shape[conv.input_dims[1] as usize] < min_features
            || w_ty.shape[conv.kernel_dims[0] as usize] < min_features
            || out_ty.numel() == 0
        {
            return Ok(None);
        }
        let dt = out_ty.dtype;
        let at = |dims: &[i64], order: [usize; 4]| order.map(|i| dims[i]);
        // The input as NHWC, padded to whole 4 x 4 output tiles (plus the 2 extra rows and
        // columns of the last tiles' 6 x 6 windows).
        let x = permute(b, ops[0], &at(conv.input_dims, [0, 2, 3, 1]))?;
        let (n, h, w, c) = (
            x_ty.shape[conv.input_dims[0] as usize],
            x_ty.shape[conv.input_dims[2] as usize],
            x_ty.shape[conv.input_dims[3] as usize],
            x_ty.shape[conv.input_dims[1] as usize],
        );
        let o = w_ty.shape[conv.kernel_dims[0] as usize];
        let (oh, ow) = (
            out_ty.shape[conv.output_dims[2] as usize],
            out_ty.shape[conv.output_dims[3] as usize],
        );
        let (th, tw) = (oh.div_ceil(4), ow.div_ceil(4));
        let high = |extent: usize, full: usize, lo: i64| (full as i64) - extent as i64 - lo;
        let zero = b.scalar(dt, 0.0)?;
        let xp = b.inst(
            Op::Pad {
                edge_padding_low: vec![0, conv.padding[0].0, conv.padding[1].0, 0],
                edge_padding_high: vec![
                    0,
                    high(h, 4 * th + 2, conv.padding[0].0),
                    high(w, 4 * tw + 2, conv.padding[1].0),
                    0,
                ],
                interior_padding: vec![0; 4],
            },
            &[x, zero],
        )?;
        // Stored as it stands: the transform reads it along C, in vectors; inlined, it would
        // read the input across its planes (NCHW) at every one of its 36 tile positions.
        let xp = b.inst(Op::OptimizationBarrier {}, &[xp])?;
        // d[i][j]: element (i, j) of every tile, [N, TH, TW, C].
        let tile_ty = TensorType::new(dt, [n, th, tw, c]);
        let mut d = Vec::with_capacity(36);
        for i in 0..6i64 {
            for j in 0..6i64 {
                d.push(b.inst(
                    Op::Slice {
                        start_indices: vec![0, i, j, 0],
                        limit_indices: vec![
                            n as i64,
                            i + 4 * (th as i64 - 1) + 1,
                            j + 4 * (tw as i64 - 1) + 1,
                            c as i64,
                        ],
                        strides: vec![1, 4, 4, 1],
                    },
                    &[xp],
                )?);
            }
        }
        // BT d BT^T: 36 arrays [N, TH, TW, C], one per position of the transformed tile.
        let v = sandwich(b, &tile_ty, &WINOGRAD_BT, &d)?;
        // G g G^T from the kernel as HWIO: 36 arrays [C, O].
        let wk = permute(b, ops[1], &at(conv.kernel_dims, [2, 3, 1, 0]))?;
        let tap_ty = TensorType::new(dt, [c, o]);
        let mut g = Vec::with_capacity(9);
        for i in 0..3i64 {
            for j in 0..3i64 {
                let s = b.inst(
                    Op::Slice {
                        start_indices: vec![i, j, 0, 0],
                        limit_indices: vec![i + 1, j + 1, c as i64, o as i64],
                        strides: vec![1; 4],
                    },
                    &[wk],
                )?;
                g.push(b.reshape(s, &[c, o])?);
            }
        }
        let u = sandwich(b, &tap_ty, &WINOGRAD_G, &g)?;
        // The 36 products, [N, TH, TW, C] x [C, O] each.
        let out_tile = TensorType::new(dt, [n, th, tw, o]);
        let mut ms = Vec::with_capacity(36);
        for (vk, uk) in v.iter().zip(&u) {
            ms.push(b.inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: vec![],
                    rhs_batching_dimensions: vec![],
                    lhs_contracting_dimensions: vec![3],
                    rhs_contracting_dimensions: vec![0],
                },
                &[*vk, *uk],
            )?);
        }
        // AT m AT^T: y[4 p + q] is output (p, q) of every tile, [N, TH, TW, O].
        let y = sandwich(b, &out_tile, &WINOGRAD_AT, &ms)?;
        // [N, TH, 4, TW, 4, O] -> [N, 4 TH, 4 TW, O], cut to the output's extent.
        let mut prow = Vec::with_capacity(4);
        for row in y.chunks(4) {
            let qs = row
                .iter()
                .map(|&y| b.reshape(y, &[n, th, 1, tw, 1, o]))
                .collect::<Result<Vec<_>, _>>()?;
            prow.push(b.inst(Op::Concatenate { dimension: 4 }, &qs)?);
        }
        let y = b.inst(Op::Concatenate { dimension: 2 }, &prow)?;
        let y = b.reshape(y, &[n, 4 * th, 4 * tw, o])?;
        let y = if (4 * th, 4 * tw) == (oh, ow) {
            y
        } else {
            b.inst(
                Op::Slice {
                    start_indices: vec![0; 4],
                    limit_indices: vec![n as i64, oh as i64, ow as i64, o as i64],
                    strides: vec![1; 4],
                },
                &[y],
            )?
        };
        Ok(Some(vec![from_nhwc(b, y, conv.output_dims)?]))
    })
}

/// Rewrites each `rng_bit_generator` (Threefry-2x32, 20 rounds) into integer arithmetic on
/// vectors of counter blocks, so that its bits come from kernels: block `i` encrypts the
/// 64-bit counter + i (its low word first) under the key, and its two words are words `2i`
/// and `2i + 1` (a u64 output's element `i`, low word first), or, in a u32 output, the same
/// element of rows `2j` and `2j + 1` of the dimension its grid of blocks splits (as XLA lays
/// them out: `kiln_ir::rng_layout::grid_dims`; a vector's in order); the next state advances the
/// counter by the number of blocks. A `u32[4]` state is `[key0, key1, counter_lo, counter_hi]`,
/// a `u64[2]` state `[key, counter]` (the same bits).
pub fn expand_rngs(f: &Func) -> Result<Func, VerifyError> {
    if !f
        .insts
        .iter()
        .any(|i| matches!(i.op, Op::RngBitGenerator { .. }))
    {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        if !matches!(inst.op, Op::RngBitGenerator { .. }) {
            return Ok(None);
        }
        let out_ty = &f.values[inst.results[1].index()];
        let wide_out = out_ty.dtype == DType::U64;
        let wide_state = f.values[inst.operands[0].index()].dtype == DType::U64;
        let n = out_ty.numel();
        // A u32 output lays its blocks out on a grid (`kiln_ir::rng_layout::grid_dims`).
        let [pre, half, d, post] = kiln_ir::rng_layout::grid_dims(&out_ty.shape);
        let blocks = if wide_out { n } else { pre * half * post };
        // The 64-bit counter lives in i64 (wrapping arithmetic, logical shifts: the same bits).
        let (u32t, u64t) = (DType::U32, DType::I64);
        // The four state words as u32 scalars.
        let word = |b: &mut Builder, i: i64| -> Result<ValueId, VerifyError> {
            let w = b.inst(
                Op::Slice {
                    start_indices: vec![i],
                    limit_indices: vec![i + 1],
                    strides: vec![1],
                },
                &[ops[0]],
            )?;
            b.reshape(w, &[])
        };
        let wide = |b: &mut Builder, v: ValueId, shape: &[usize]| {
            let c = b.scalar(u64t, 32.0)?;
            let c = b.broadcast(c, &[], shape)?;
            let h = b.convert(v, u64t)?;
            b.binary(Op::ShiftLeft {}, h, c)
        };
        // Splits 64-bit values into their high and low u32 words.
        let split = |b: &mut Builder, v: ValueId, shape: &[usize]| {
            let c = b.scalar(u64t, 32.0)?;
            let c = b.broadcast(c, &[], shape)?;
            let h = b.binary(Op::ShiftRightLogical {}, v, c)?;
            Ok::<_, VerifyError>((b.convert(h, u32t)?, b.convert(v, u32t)?))
        };
        // The key's words and the counter (in i64: the same bits).
        let (k0, k1, start, key) = if wide_state {
            let (key, ctr) = (word(b, 0)?, word(b, 1)?);
            let key64 = b.convert(key, u64t)?;
            let (k1, k0) = split(b, key64, &[])?;
            (k0, k1, b.convert(ctr, u64t)?, Some(key))
        } else {
            let (k0, k1, lo, hi) = (word(b, 0)?, word(b, 1)?, word(b, 2)?, word(b, 3)?);
            let hi64 = wide(b, hi, &[])?;
            let lo64 = b.convert(lo, u64t)?;
            (k0, k1, b.binary(Op::Or {}, hi64, lo64)?, None)
        };
        let iota = b.inst_typed(
            Op::Iota { iota_dimension: 0 },
            &[],
            TensorType::new(u64t, [blocks]),
        )?;
        let base = b.broadcast(start, &[], &[blocks])?;
        let ctr = b.binary(Op::Add {}, iota, base)?;
        let (mut x1, mut x0) = split(b, ctr, &[blocks])?;
        let k2 = {
            let x = b.binary(Op::Xor {}, k0, k1)?;
            let c = b.scalar(u32t, f64::from(0x1BD1_1BDAu32))?;
            b.binary(Op::Xor {}, x, c)?
        };
        let ks = [
            b.broadcast(k0, &[], &[blocks])?,
            b.broadcast(k1, &[], &[blocks])?,
            b.broadcast(k2, &[], &[blocks])?,
        ];
        let constant = |b: &mut Builder, v: u32| -> Result<ValueId, VerifyError> {
            let c = b.scalar(u32t, f64::from(v))?;
            b.broadcast(c, &[], &[blocks])
        };
        x0 = b.binary(Op::Add {}, x0, ks[0])?;
        x1 = b.binary(Op::Add {}, x1, ks[1])?;
        const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
        for round in 0..20 {
            x0 = b.binary(Op::Add {}, x0, x1)?;
            let r = ROTATIONS[round % 8];
            let (left, right) = (constant(b, r)?, constant(b, 32 - r)?);
            let l = b.binary(Op::ShiftLeft {}, x1, left)?;
            let h = b.binary(Op::ShiftRightLogical {}, x1, right)?;
            x1 = b.binary(Op::Or {}, l, h)?;
            x1 = b.binary(Op::Xor {}, x1, x0)?;
            if round % 4 == 3 {
                let s = round / 4 + 1;
                x0 = b.binary(Op::Add {}, x0, ks[s % 3])?;
                x1 = b.binary(Op::Add {}, x1, ks[(s + 1) % 3])?;
                let sc = constant(b, s as u32)?;
                x1 = b.binary(Op::Add {}, x1, sc)?;
            }
        }
        let bits = if wide_out {
            // One u64 per block: x0 its low word, x1 its high one.
            let lo = b.convert(x0, DType::U64)?;
            let hi = b.convert(x1, DType::U64)?;
            let c = b.scalar(DType::U64, 32.0)?;
            let c = b.broadcast(c, &[], &[blocks])?;
            let hi = b.binary(Op::ShiftLeft {}, hi, c)?;
            let both = b.binary(Op::Or {}, hi, lo)?;
            b.reshape(both, &out_ty.shape)?
        } else {
            // Each block's two words side by side after its index along the split dimension,
            // [pre, half, 2, post], that dimension's rows 2j and 2j + 1, then its first `d`.
            let c0 = b.reshape(x0, &[pre, half, 1, post])?;
            let c1 = b.reshape(x1, &[pre, half, 1, post])?;
            let pairs = b.inst(Op::Concatenate { dimension: 2 }, &[c0, c1])?;
            let rows = b.reshape(pairs, &[pre, 2 * half, post])?;
            let rows = b.inst(
                Op::Slice {
                    start_indices: vec![0, 0, 0],
                    limit_indices: vec![pre as i64, d as i64, post as i64],
                    strides: vec![1, 1, 1],
                },
                &[rows],
            )?;
            b.reshape(rows, &out_ty.shape)?
        };
        // The next state.
        let used = b.scalar(u64t, blocks as f64)?;
        let next = b.binary(Op::Add {}, start, used)?;
        let words: Vec<ValueId> = match key {
            Some(key) => vec![key, b.convert(next, DType::U64)?],
            None => {
                let (nh, nl) = split(b, next, &[])?;
                vec![k0, k1, nl, nh]
            }
        };
        let words: Vec<ValueId> = words
            .into_iter()
            .map(|w| b.reshape(w, &[1]))
            .collect::<Result<_, _>>()?;
        let state = b.inst(Op::Concatenate { dimension: 0 }, &words)?;
        Ok(Some(vec![state, bits]))
    })
}

/// Folds `transpose(dot_general(a, b))` that swaps the two free parts of the product (keeping
/// the batch in front) into `dot_general(b, a)`, when the transpose is the product's only user:
/// (A B)^T = B^T A^T costs nothing, while the transpose is a full pass over the result.
pub fn fold_transposed_products(f: &Func) -> Result<Func, VerifyError> {
    let mut users = vec![0usize; f.values.len()];
    for inst in &f.insts {
        for o in &inst.operands {
            users[o.index()] += 1;
        }
    }
    for o in &f.outputs {
        users[o.index()] += 1;
    }
    let mut producer = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    // The products to swap, by instruction index.
    let mut swap = vec![false; f.insts.len()];
    for inst in &f.insts {
        let Op::Transpose { permutation } = &inst.op else {
            continue;
        };
        let v = inst.operands[0];
        let Some(p) = producer[v.index()] else {
            continue;
        };
        let Op::DotGeneral {
            lhs_batching_dimensions: lb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
            ..
        } = &f.insts[p].op
        else {
            continue;
        };
        let (ta, tb) = (
            &f.values[f.insts[p].operands[0].index()],
            &f.values[f.insts[p].operands[1].index()],
        );
        let nb = lb.len();
        let (fl, fr) = (ta.rank() - nb - lc.len(), tb.rank() - nb - rc.len());
        let want: Vec<i64> = (0..nb)
            .chain(nb + fl..nb + fl + fr)
            .chain(nb..nb + fl)
            .map(|d| d as i64)
            .collect();
        if users[v.index()] == 1 && fl > 0 && fr > 0 && *permutation == want {
            swap[p] = true;
        }
    }
    if !swap.contains(&true) {
        return Ok(f.clone());
    }
    let mut index = 0;
    rebuild(f, |b, inst, ops| {
        let i = index;
        index += 1;
        match &inst.op {
            Op::DotGeneral {
                lhs_batching_dimensions: lb,
                rhs_batching_dimensions: rb,
                lhs_contracting_dimensions: lc,
                rhs_contracting_dimensions: rc,
            } if swap[i] => {
                let swapped = Op::DotGeneral {
                    lhs_batching_dimensions: rb.clone(),
                    rhs_batching_dimensions: lb.clone(),
                    lhs_contracting_dimensions: rc.clone(),
                    rhs_contracting_dimensions: lc.clone(),
                };
                // Stands for the transpose's result; the transpose below passes it on. Its
                // dimensions are the batch, the right free, then the left free ones; its
                // element type is the product's (which may be wider than the operands').
                let out = &f.values[inst.results[0].index()];
                let nb = lb.len();
                let fl = f.values[inst.operands[0].index()].rank() - nb - lc.len();
                let shape: Vec<usize> = (out.shape[..nb].iter())
                    .chain(&out.shape[nb + fl..])
                    .chain(&out.shape[nb..nb + fl])
                    .copied()
                    .collect();
                let ty = TensorType::new(out.dtype, shape);
                Ok(Some(vec![b.inst_typed(swapped, &[ops[1], ops[0]], ty)?]))
            }
            Op::Transpose { .. } if producer[inst.operands[0].index()].is_some_and(|p| swap[p]) => {
                Ok(Some(vec![ops[0]]))
            }
            _ => Ok(None),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(f: &Func, name: &str) -> usize {
        f.insts.iter().filter(|i| i.op.mnemonic() == name).count()
    }

    #[test]
    fn winograd_takes_3x3_unit_stride_convolutions_with_enough_features_only() {
        let conv = |dt: &str, c: usize, o: usize, k: usize, stride: usize, dil: usize| {
            let span = dil * (k - 1) + 1;
            let out = (12 + 2 - span) / stride + 1;
            format!(
                "func @main(%0: {dt}[2,{c},12,12], %1: {dt}[{o},{c},{k},{k}]) -> {dt}[2,{o},{out},{out}] {{\n  %2 = convolution %0, %1 {{window_strides = [{stride}, {stride}], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [{dil}, {dil}], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]}} : {dt}[2,{o},{out},{out}]\n  return %2\n}}\n"
            )
        };
        let cases = [
            (conv("f32", 32, 48, 3, 1, 1), true),
            (conv("f64", 64, 32, 3, 1, 1), true),
            // Half precision, too few features, another kernel size, a stride, a dilation.
            (conv("f16", 64, 64, 3, 1, 1), false),
            (conv("bf16", 64, 64, 3, 1, 1), false),
            (conv("f32", 16, 64, 3, 1, 1), false),
            (conv("f32", 64, 16, 3, 1, 1), false),
            (conv("f32", 64, 64, 5, 1, 1), false),
            (conv("f32", 64, 64, 3, 2, 1), false),
            (conv("f32", 64, 64, 3, 1, 2), false),
        ];
        for (src, rewritten) in cases {
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let g = winograd_convs(&f, &TargetInfo::reference()).unwrap();
            kiln_ir::verify(&g).unwrap();
            assert_eq!(g.output_types, f.output_types);
            let counts = (count(&g, "convolution"), count(&g, "dot_general"));
            assert_eq!(counts, if rewritten { (0, 36) } else { (1, 0) }, "{src}");
        }
    }

    #[test]
    fn swapping_transposes_of_products_fold_and_others_stay() {
        let folds = kiln_ir::parse_func_text(
            "func @main(%0: f32[3,4,5,6], %1: f32[3,6,7]) -> f32[3,7,4,5] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [1]} : f32[3,4,5,7]\n  %3 = transpose %2 {permutation = [0, 3, 1, 2]} : f32[3,7,4,5]\n  return %3\n}\n",
        )
        .unwrap();
        let g = fold_transposed_products(&folds).unwrap();
        assert_eq!(
            (count(&g, "dot_general"), count(&g, "transpose")),
            (1, 0),
            "{g}"
        );
        assert_eq!(g.output_types, folds.output_types);
        let stays = kiln_ir::parse_func_text(
            "func @main(%0: f32[3,4,5,6], %1: f32[3,6,7]) -> f32[3,5,4,7] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [1]} : f32[3,4,5,7]\n  %3 = transpose %2 {permutation = [0, 2, 1, 3]} : f32[3,5,4,7]\n  return %3\n}\n",
        )
        .unwrap();
        assert_eq!(fold_transposed_products(&stays).unwrap(), stays);
    }

    /// A product into a wider type than its operands' (`f16 x f16 -> f32`, which the GPU
    /// keeps for tensor cores) keeps its result type when its operands are permuted into the
    /// GEMM's layout or swapped to fold a transpose (random program 40981 of the emulator
    /// tests returned f16).
    #[test]
    fn products_into_a_wider_type_keep_it() {
        let permuted = kiln_ir::parse_func_text(
            "func @main(%0: f16[4,3], %1: f16[4,3,2]) -> f32[4,2] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : f32[4,2]\n  return %2\n}\n",
        )
        .unwrap();
        let g = canonicalize_dots(&permuted).unwrap();
        kiln_ir::verify(&g).unwrap();
        assert_eq!(g.output_types, permuted.output_types, "{g}");
        let swapped = kiln_ir::parse_func_text(
            "func @main(%0: f16[3,4,5,6], %1: f16[3,6,7]) -> f32[3,7,4,5] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [1]} : f32[3,4,5,7]\n  %3 = transpose %2 {permutation = [0, 3, 1, 2]} : f32[3,7,4,5]\n  return %3\n}\n",
        )
        .unwrap();
        let g = fold_transposed_products(&swapped).unwrap();
        kiln_ir::verify(&g).unwrap();
        assert_eq!(count(&g, "transpose"), 0, "{g}");
        assert_eq!(g.output_types, swapped.output_types, "{g}");
    }
}
