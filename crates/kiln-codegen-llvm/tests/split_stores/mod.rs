//! Which 32-bit stores of a PTX text write one 64-bit value in two halves (`ptx.rs` flags any
//! in the kernels it assembles: the driver's JIT was seen to write such a value's low half as
//! zero on an H200).

/// 64-bit registers stored as two 32-bit halves: `st.b32 [a], %rdN` and `st.b32 [a+4], %rdM`
/// where `%rdM` is `%rdN` shifted right by 32 (`shr.u64 %rdM, %rdN, 32`, as LLVM legalizes an
/// `i64` store it takes for unaligned; or `%rdN` itself): a split 64-bit store. A single
/// `st.b32` of a 64-bit register is an integer truncation, and so are 32-bit elements side by
/// side each computed in a 64-bit register (a `pred` to `u32` bitcast's words, `lu`'s pivots
/// from 64-bit scratch: random programs 402, 426 and 1232, which the first form of this check,
/// any two such stores 4 bytes apart, took for split stores).
pub fn split_stores(ptx: &str) -> Vec<String> {
    // Each function by itself: LLVM numbers registers afresh in each.
    let mut functions = vec![Vec::new()];
    for l in ptx.lines().map(str::trim) {
        if l.contains(".entry ") || l.contains(".func ") {
            functions.push(Vec::new());
        }
        functions.last_mut().expect("one at least").push(l);
    }
    functions.iter().flat_map(|f| split_in(f)).collect()
}

/// [`split_stores`] in one function's lines.
fn split_in(lines: &[&str]) -> Vec<String> {
    // `%rdM` -> `%rdN` for each `shr.{u,s,b}64 %rdM, %rdN, 32;`.
    let high_half: std::collections::HashMap<&str, &str> = lines
        .iter()
        .filter(|l| l.starts_with("shr.") && l.contains("64"))
        .filter_map(|l| {
            let args: Vec<&str> = l
                .split_once(char::is_whitespace)?
                .1
                .trim_end_matches(';')
                .split(',')
                .map(str::trim)
                .collect();
            match args.as_slice() {
                [m, n, "32"] => Some((*m, *n)),
                _ => None,
            }
        })
        .collect();
    // (base register, byte offset, stored register) of each 32-bit store of a 64-bit register.
    let halves: Vec<(&str, i64, &str, &str)> = lines
        .iter()
        .filter(|l| l.starts_with("st.") && l.contains(".b32"))
        .filter_map(|&l| {
            let (addr, value) = l.split_once('[')?.1.split_once(']')?;
            let value = value.trim_start_matches(',').trim().trim_end_matches(';');
            if !value.starts_with("%rd") {
                return None;
            }
            let (base, off) = match addr.split_once('+') {
                Some((b, o)) => (b, o.parse().ok()?),
                None => (addr, 0),
            };
            Some((base, off, value, l))
        })
        .collect();
    let mut split = Vec::new();
    for (b, o, lo, l) in &halves {
        for (b2, o2, hi, l2) in &halves {
            if b2 == b && *o2 == o + 4 && (hi == lo || high_half.get(hi) == Some(lo)) {
                split.push(l.to_string());
                split.push(l2.to_string());
            }
        }
    }
    split
}

/// The check above flags the store LLVM splits (`llc-22 -mcpu=sm_90` of an `i64` store with
/// 4-byte alignment) and passes 32-bit elements held in 64-bit registers side by side.
#[test]
fn split_store_check_tells_halves_from_elements() {
    let split = "add.s64 \t%rd3, %rd2, 7;\n\tst.global.b32 \t[%rd1], %rd3;\n\tshr.u64 \t%rd4, %rd3, 32;\n\tst.global.b32 \t[%rd1+4], %rd4;\n";
    assert_eq!(split_stores(split).len(), 2, "{split}");
    // Registers are each function's own: a shift in one does not pair stores in another.
    let two = format!(
        ".visible .entry k0(\n{split}}}\n.visible .entry k1(\nshr.u64 \t%rd4, %rd9, 32;\n}}\n"
    );
    assert_eq!(split_stores(&two).len(), 2, "{two}");
    let apart = ".visible .entry k0(\nst.global.b32 \t[%rd1], %rd3;\nshr.u64 \t%rd4, %rd3, 32;\n}\n.visible .entry k1(\nst.global.b32 \t[%rd1+4], %rd4;\n}\n";
    assert_eq!(split_stores(apart), Vec::<String>::new(), "{apart}");
    let same = "st.global.b32 \t[%rd1+8], %rd3;\n\tst.global.b32 \t[%rd1+12], %rd3;\n";
    assert_eq!(split_stores(same).len(), 2, "{same}");
    let elements = "ld.global.b64 \t%rd51, [%rd9];\n\tst.global.b32 \t[%rd53], %rd51;\n\tld.global.b64 \t%rd54, [%rd9+8];\n\tst.global.b32 \t[%rd53+4], %rd54;\n\tshr.u64 \t%rd60, %rd51, 16;\n";
    assert_eq!(split_stores(elements), Vec::<String>::new(), "{elements}");
}
