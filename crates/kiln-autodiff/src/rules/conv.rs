//! The VJP of `convolution`, the one rule too long for the table.
//!
//! Both gradients are convolutions. The rule works in the canonical layout (batch, feature,
//! spatial... for data; out, in, spatial... for kernels), transposing in and out.
//! - lhs_bar: convolve the cotangent, dilated by the forward strides, with the spatially
//!   reversed kernel whose in and out features are exchanged (per group).
//! - rhs_bar: convolve the input with the cotangent as the kernel, batch and feature roles
//!   exchanged so the sum runs over the batch; feature groups become batch groups.
//! - A convolution with batch groups is differentiated one batch group at a time.

use crate::Result;
use kiln_ir::{Builder, Op, ValueId};

fn dilate(s: i64, d: i64) -> i64 {
    if s == 0 { 0 } else { 1 + d * (s - 1) }
}

fn shape(b: &Builder, v: ValueId) -> Vec<i64> {
    b.ty(v)
        .expect("defined")
        .shape
        .iter()
        .map(|&s| s as i64)
        .collect()
}

fn inverse(p: &[i64]) -> Vec<i64> {
    let mut inv = vec![0i64; p.len()];
    for (i, &d) in p.iter().enumerate() {
        inv[d as usize] = i as i64;
    }
    inv
}

fn canonical(n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

#[allow(clippy::too_many_arguments)]
fn conv(
    b: &mut Builder,
    lhs: ValueId,
    rhs: ValueId,
    strides: Vec<i64>,
    padding: Vec<(i64, i64)>,
    lhs_dil: Vec<i64>,
    rhs_dil: Vec<i64>,
    (feature_groups, batch_groups): (i64, i64),
    dims: [Vec<i64>; 3],
) -> Result<ValueId> {
    let [input_dims, kernel_dims, output_dims] = dims;
    Ok(b.inst(
        Op::Convolution {
            window_strides: strides,
            padding,
            lhs_dilation: lhs_dil,
            rhs_dilation: rhs_dil,
            feature_group_count: feature_groups,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count: batch_groups,
        },
        &[lhs, rhs],
    )?)
}

fn slice_axis(b: &mut Builder, v: ValueId, axis: usize, start: i64, end: i64) -> Result<ValueId> {
    let s = shape(b, v);
    let mut lo = vec![0; s.len()];
    let mut hi = s.clone();
    lo[axis] = start;
    hi[axis] = end;
    Ok(b.inst(
        Op::Slice {
            start_indices: lo,
            limit_indices: hi,
            strides: vec![1; s.len()],
        },
        &[v],
    )?)
}

/// The cotangents of (lhs, rhs) of a convolution with cotangent `g`. A convolution computed
/// in a wider type than its operands' (`preferred_element_type`) is differentiated as the
/// convolution of the converted operands; the cotangents are converted back.
pub fn vjp(b: &mut Builder, op: &Op, x: &[ValueId], g: ValueId) -> Result<Vec<Option<ValueId>>> {
    let dtype = |b: &Builder, v: ValueId| b.ty(v).expect("rules only see defined values").dtype;
    let (wide, narrow) = (dtype(b, g), dtype(b, x[0]));
    if wide == narrow {
        return vjp_same(b, op, x, g);
    }
    let xw = [b.convert(x[0], wide)?, b.convert(x[1], wide)?];
    let gs = vjp_same(b, op, &xw, g)?;
    gs.into_iter()
        .map(|c| c.map(|c| b.convert(c, narrow)).transpose())
        .collect::<std::result::Result<_, _>>()
        .map_err(Into::into)
}

/// [`vjp`] of a convolution whose operands and result have one element type.
fn vjp_same(b: &mut Builder, op: &Op, x: &[ValueId], g: ValueId) -> Result<Vec<Option<ValueId>>> {
    let Op::Convolution {
        window_strides: ws,
        padding,
        lhs_dilation: ld,
        rhs_dilation: rd,
        feature_group_count,
        input_dims,
        kernel_dims,
        output_dims,
        batch_group_count,
    } = op
    else {
        unreachable!("called for convolution only")
    };
    let n = input_dims.len();
    let sp = n - 2;
    let groups = *feature_group_count;
    // Canonical layouts.
    let xc = b.transpose(x[0], input_dims)?;
    let wc = b.transpose(x[1], kernel_dims)?;
    let gc = b.transpose(g, output_dims)?;
    let id = canonical(n);
    if *batch_group_count > 1 {
        // Batch group k is the convolution of the k-th run of input batch elements with the
        // k-th run of output features: differentiate each and join the cotangents.
        let bg = *batch_group_count;
        let (xs, wsh) = (shape(b, xc), shape(b, wc));
        let (nb, ob) = (xs[0] / bg, wsh[0] / bg);
        let one = Op::Convolution {
            window_strides: ws.clone(),
            padding: padding.clone(),
            lhs_dilation: ld.clone(),
            rhs_dilation: rd.clone(),
            feature_group_count: 1,
            input_dims: id.clone(),
            kernel_dims: id.clone(),
            output_dims: id.clone(),
            batch_group_count: 1,
        };
        let (mut gxs, mut gws) = (Vec::new(), Vec::new());
        for k in 0..bg {
            let xk = slice_axis(b, xc, 0, k * nb, (k + 1) * nb)?;
            let wk = slice_axis(b, wc, 0, k * ob, (k + 1) * ob)?;
            let gk = slice_axis(b, gc, 1, k * ob, (k + 1) * ob)?;
            let parts = vjp_same(b, &one, &[xk, wk], gk)?;
            gxs.push(parts[0].expect("a convolution's input cotangent"));
            gws.push(parts[1].expect("a convolution's kernel cotangent"));
        }
        let gxc = b.inst(Op::Concatenate { dimension: 0 }, &gxs)?;
        let gwc = b.inst(Op::Concatenate { dimension: 0 }, &gws)?;
        return Ok(vec![
            Some(b.transpose(gxc, &inverse(input_dims))?),
            Some(b.transpose(gwc, &inverse(kernel_dims))?),
        ]);
    }
    let (xs, wsh, gs) = (shape(b, xc), shape(b, wc), shape(b, gc));
    let (o, i) = (wsh[0], wsh[1]);
    let og = o / groups;

    // lhs_bar. Kernel'[g*I + i, og, k] = w[g*Og + og, i, k], spatially reversed.
    let mut split = vec![groups, og, i];
    split.extend(&wsh[2..]);
    let w1 = b.reshape(wc, &split.iter().map(|&s| s as usize).collect::<Vec<_>>())?;
    // [G, Og, I, K] -> [Og, G, I, K] -> [Og, G*I, K] -> [G*I, Og, K].
    let mut p1 = vec![1i64, 0, 2];
    p1.extend((3..n as i64 + 1).collect::<Vec<_>>());
    let w2 = b.transpose(w1, &p1)?;
    let mut merged = vec![og as usize, (groups * i) as usize];
    merged.extend(wsh[2..].iter().map(|&s| s as usize));
    let w3 = b.reshape(w2, &merged)?;
    let mut swap = vec![1i64, 0];
    swap.extend(2..n as i64);
    let w4 = b.transpose(w3, &swap)?;
    let w5 = b.inst(
        Op::Reverse {
            dimensions: (2..n as i64).collect(),
        },
        &[w4],
    )?;
    let mut lpad = Vec::with_capacity(sp);
    for d in 0..sp {
        let lhs_d = dilate(xs[2 + d], ld[d]);
        let rhs_d = dilate(wsh[2 + d], rd[d]);
        let out_d = dilate(gs[2 + d], ws[d]);
        let before = rhs_d - padding[d].0 - 1;
        let after = lhs_d + rhs_d - 1 - out_d - before;
        lpad.push((before, after));
    }
    let gxc = conv(
        b,
        gc,
        w5,
        ld.clone(),
        lpad,
        ws.clone(),
        rd.clone(),
        (groups, 1),
        [id.clone(), id.clone(), id.clone()],
    )?;
    let gx = b.transpose(gxc, &inverse(input_dims))?;

    // rhs_bar: batch and feature roles exchanged, so the sum runs over the batch; the
    // feature groups become batch groups (group k of the input features meets group k of the
    // cotangent's features).
    let mut rpad = Vec::with_capacity(sp);
    for d in 0..sp {
        let lhs_d = dilate(xs[2 + d], ld[d]);
        let rhs_d = dilate(wsh[2 + d], rd[d]);
        let out_d = dilate(gs[2 + d], ws[d]);
        let lo = padding[d].0;
        rpad.push((lo, out_d - lhs_d + rhs_d - lo - 1));
    }
    let gwc = conv(
        b,
        xc,
        gc,
        rd.clone(),
        rpad,
        ld.clone(),
        ws.clone(),
        (1, groups),
        [swap.clone(), swap.clone(), swap.clone()],
    )?;
    let gw = b.transpose(gwc, &inverse(kernel_dims))?;
    Ok(vec![Some(gx), Some(gw)])
}
