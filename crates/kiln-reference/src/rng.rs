//! Threefry-2x32 (20 rounds), the counter-based generator of `rng_bit_generator`.

const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];

/// Threefry-2x32 with 20 rounds: encrypts the counter block `ctr` under `key`.
pub fn threefry2x32(key: [u32; 2], ctr: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let mut x0 = ctr[0].wrapping_add(ks[0]);
    let mut x1 = ctr[1].wrapping_add(ks[1]);
    for round in 0..20 {
        x0 = x0.wrapping_add(x1);
        x1 = x1.rotate_left(ROTATIONS[round % 8]);
        x1 ^= x0;
        if round % 4 == 3 {
            let s = round / 4 + 1;
            x0 = x0.wrapping_add(ks[s % 3]);
            x1 = x1.wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u32);
        }
    }
    [x0, x1]
}

/// Fills `n` words from `state` = [key0, key1, counter_lo, counter_hi] and returns them with the
/// next state (the counter advanced by the number of blocks used). Block `b` encrypts the
/// 64-bit counter `counter + b` as its (low, high) words; its two results are words `2b` and
/// `2b + 1`. This is XLA's THREE_FRY on a `u64[2]` state `[key, counter]` read as four
/// little-endian words.
pub fn bits(state: [u32; 4], n: usize) -> (Vec<u32>, [u32; 4]) {
    let key = [state[0], state[1]];
    let ctr = ((state[3] as u64) << 32) | state[2] as u64;
    let blocks = n.div_ceil(2) as u64;
    let mut out = Vec::with_capacity(n + 1);
    for b in 0..blocks {
        let c = ctr.wrapping_add(b);
        out.extend(threefry2x32(key, [c as u32, (c >> 32) as u32]));
    }
    out.truncate(n);
    let next = ctr.wrapping_add(blocks);
    (out, [state[0], state[1], next as u32, (next >> 32) as u32])
}

/// The words of a u32 output of shape `shape` from `state`, and the next state, as XLA's
/// THREE_FRY lays them out ([`kiln_ir::rng_layout::block_grid`]: for a vector, block `b`'s
/// words at `2b` and `2b + 1`; a `u32[4,4]` has the first words of blocks 0 to 3 in its first
/// row and their second words in its second). The counter advances by the grid's blocks.
pub fn u32_words(state: [u32; 4], shape: &[usize]) -> (Vec<u32>, [u32; 4]) {
    let [pre, half, d, post] = kiln_ir::rng_layout::grid_dims(shape);
    let (bits, next) = bits(state, 2 * pre * half * post);
    let mut out = vec![0; pre * d * post];
    for p in 0..pre {
        for j in 0..half {
            for h in (0..2).filter(|h| 2 * j + h < d) {
                for q in 0..post {
                    out[(p * d + 2 * j + h) * post + q] = bits[2 * ((p * half + j) * post + q) + h];
                }
            }
        }
    }
    (out, next)
}

/// A `u64[2]` state `[key, counter]` as the four words [`bits`] takes (little-endian halves).
pub fn words_of(state: [u64; 2]) -> [u32; 4] {
    let [k, c] = state;
    [k as u32, (k >> 32) as u32, c as u32, (c >> 32) as u32]
}

/// The `u64[2]` state of four words (the inverse of [`words_of`]).
pub fn state_of(words: [u32; 4]) -> [u64; 2] {
    [
        words[0] as u64 | (words[1] as u64) << 32,
        words[2] as u64 | (words[3] as u64) << 32,
    ]
}
