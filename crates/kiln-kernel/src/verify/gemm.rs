//! The GEMM schedule's operands, strides, store, zero steps, unread elements and chained
//! product checked against the kernel's inputs (part of [`super::verify_kernel`]).

use crate::ir::{Kernel, Schedule};
use crate::window::windows_fit;
use kiln_ir::{DType, TensorType};

/// Checks a GEMM kernel's operands against `inputs`: their dtypes and element counts, the
/// strides it reads through and the store it writes through, its zero steps, its convolution's
/// patches and its chained product. Returns the product's dtype, or the problem.
pub(super) fn operands(k: &Kernel, inputs: &[TensorType]) -> Result<DType, String> {
    let Schedule::Gemm {
        epilogue,
        batch,
        m,
        n,
        k: kk,
        conv,
        chain,
        a_trans,
        b_trans,
        strides,
        store,
        zero,
        unread,
    } = &k.schedule
    else {
        return Err("not a GEMM".into());
    };
    let (batch, m, n, kk) = (*batch, *m, *n, *kk);
    if let Some(z) = zero
        && (z.operand > 1 || z.at.0.abs() != 1 || z.at.1.abs() != 1 || conv.is_some())
    {
        return Err(format!(
            "a GEMM's zero steps name operand {} with coefficients {:?}{}: the \
                 operand must be 0 or 1, the step's and the position's coefficients 1 \
                 or -1, and the product no convolution's",
            z.operand,
            z.at,
            if conv.is_some() {
                " on a convolution"
            } else {
                ""
            }
        ));
    }
    if let Some(u) = unread
        && (u.at.0.abs() != 1
            || u.at.1.abs() != 1
            || conv.is_some()
            || chain.is_some()
            || store.is_some())
    {
        return Err(format!(
            "a GEMM's unread elements have coefficients {:?}{}: the column's and the row's \
                 must be 1 or -1, and the product stored by rows, no convolution's nor \
                 chained",
            u.at,
            if conv.is_some() || chain.is_some() || store.is_some() {
                " on a convolution, chained or stored product"
            } else {
                ""
            }
        ));
    }
    let dtype = k.product_dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(format!("a GEMM of {dtype} (f32 and f64 only)"));
    }
    if inputs.len() < 2 {
        return Err(format!(
            "a GEMM reads A and B, but has {} input(s)",
            inputs.len()
        ));
    }
    // Operands of the result's dtype, or (for a GPU's tensor cores, see
    // `canon::widen_dots`) both bf16 or both f16 with an f32 result.
    let half = dtype == DType::F32
        && inputs[0].dtype == inputs[1].dtype
        && matches!(inputs[0].dtype, DType::BF16 | DType::F16);
    for (j, what) in [(0, "A"), (1, "B")] {
        if inputs[j].dtype != dtype && !half {
            return Err(format!("{what} (in{j}) is {}, not {dtype}", inputs[j]));
        }
    }
    if batch * m * n != k.out.numel() {
        return Err(format!(
            "batch {batch} x m {m} x n {n} is not the {} elements of the product {}",
            k.out.numel(),
            k.out
        ));
    }
    // Operands read in place through strides: every element read lies in the buffer.
    let rows = [
        if *a_trans { (kk, m) } else { (m, kk) },
        if *b_trans { (n, kk) } else { (kk, n) },
    ];
    for (j, what) in [(0, "A"), (1, "B")] {
        let Some(s) = &strides[j] else { continue };
        let (r, len) = rows[j];
        let extents: usize = s.batch.iter().map(|b| b.0).product();
        if conv.is_some() || extents != batch || batch * r * len == 0 || s.ld < 1 {
            return Err(format!(
                "{what}'s strides {s:?} do not describe batch {batch} x {r} x {len}"
            ));
        }
        if s.end(r, len) > inputs[j].numel() {
            return Err(format!(
                "{what}'s strides {s:?} read past the end of in{j} ({})",
                inputs[j]
            ));
        }
    }
    // A product stored through strides: every element of the buffer written once.
    if let Some(st) = store {
        if epilogue.is_some() || chain.is_some() || conv.is_some() {
            let what = "a stored product with an epilogue, chain or convolution";
            return Err(what.into());
        }
        if !st.writes_each_once(batch, m, n, k.out.dtype) {
            let s = &st.strides;
            let what = format!("the store {s:?} does not write each of {} once", st.buffer);
            return Err(what);
        }
    }
    let b_elems = match conv {
        None if strides[1].is_some() => inputs[1].numel(),
        None => {
            if strides[0].is_none() && inputs[0].numel() != batch * m * kk {
                return Err(format!(
                    "A (in0, {}) is not batch {batch} x m {m} x k {kk}",
                    inputs[0]
                ));
            }
            batch * kk * n
        }
        Some(p) => {
            if kk != p.kh * p.kw * p.c {
                return Err(format!(
                    "k {kk} is not the patch length {} x {} x {}",
                    p.kh, p.kw, p.c
                ));
            }
            if !windows_fit(p.oh, p.stride[0], p.kh, p.dilation[0], p.h)
                || !windows_fit(p.ow, p.stride[1], p.kw, p.dilation[1], p.w)
            {
                return Err(format!(
                    "an output of {} x {} windows does not fit an input of {} x {}",
                    p.oh, p.ow, p.h, p.w
                ));
            }
            let per_image = p.oh * p.ow;
            let images = if p.planes {
                batch
            } else {
                m / per_image.max(1)
            };
            if (p.planes && m != per_image)
                || (!p.planes && (batch != 1 || images * per_image != m))
            {
                return Err(format!(
                    "batch {batch} x m {m} rows is not a whole number of {} x {} images",
                    p.oh, p.ow
                ));
            }
            if inputs[0].numel() != images * p.h * p.w * p.c {
                return Err(format!(
                    "the image in0 ({}) is not {images} x {} x {} x {}",
                    inputs[0], p.h, p.w, p.c
                ));
            }
            kk * n
        }
    };
    if inputs[1].numel() != b_elems {
        return Err(format!(
            "B (in1, {}) does not hold the {b_elems} elements of the product's B",
            inputs[1]
        ));
    }
    if let Some(ch) = chain {
        if epilogue.is_none() {
            return Err("a chained product without an epilogue".into());
        }
        let Some(b) = inputs.get(ch.b) else {
            return Err(format!(
                "the chained product's B is in{}, past the inputs",
                ch.b
            ));
        };
        // A tensor-core chain (`half`) multiplies its operands' dtype and stores the
        // epilogue's.
        let (b_dtype, out_dtype) = if half {
            (inputs[0].dtype, k.out.dtype)
        } else {
            (dtype, dtype)
        };
        let b_fits = match &ch.b_strides {
            Some(s) => {
                let (r, len) = if ch.b_trans { (ch.n, n) } else { (n, ch.n) };
                s.batch.iter().map(|e| e.0).product::<usize>() == batch
                    && s.end(r, len) <= b.numel()
            }
            None => b.numel() == batch * n * ch.n,
        };
        if b.dtype != b_dtype || !b_fits {
            return Err(format!(
                "the chained product's B (in{}, {b}) is not batch {batch} x {n} x {} of {b_dtype}",
                ch.b, ch.n
            ));
        }
        if ch.out.dtype != out_dtype || ch.out.numel() != batch * m * ch.n {
            return Err(format!(
                "the chained product {} is not batch {batch} x m {m} x {} of {out_dtype}",
                ch.out, ch.n
            ));
        }
    }
    Ok(dtype)
}
