//! Binary deltas between two states of one conversation (the `fast_rsync` crate: librsync's
//! algorithm). The writer keeps a signature of the last state it wrote to a file (a rolling
//! checksum and 8 bytes of MD4 per 256-byte block: 4.7% of the state), and the next state's
//! delta is computed from that signature alone; the reader applies the delta to the state it
//! reassembled before. Nothing here knows llama.cpp's layout: cells appended at the end of
//! every layer's K and V rows, V transposed (one insertion per embedding dimension), cells
//! dropped from the front of a sliding window, or a recurrent state that changes entirely all
//! come out as the bytes that changed plus at most a block per place where they changed. MD4
//! is not trusted: every reassembled state is checked against the XXH3 its segment carries.

use std::io::Write;

use fast_rsync::{IndexedSignature, Signature, SignatureOptions};

/// Bytes per signature block: small enough that a transposed V (thousands of insertion points
/// a turn) costs little more than what changed, large enough that the signature stays ~5%.
const BLOCK_BYTES: u32 = 256;
/// Bytes of each block's MD4 kept in the signature.
const HASH_BYTES: u32 = 8;

/// What the writer keeps of the last state it wrote to a file.
pub(super) struct StateSignature(Signature);

impl StateSignature {
    /// The signature of `state`.
    pub(super) fn of(state: &[u8]) -> Self {
        Self(Signature::calculate(state, SignatureOptions { block_size: BLOCK_BYTES, crypto_hash_size: HASH_BYTES }))
    }

    /// Bytes it holds in memory.
    pub(super) fn bytes(&self) -> u64 {
        self.0.serialized().len() as u64
    }

    /// The delta that turns the signed state into `state`, or `None` when it would be longer
    /// than `limit` bytes (the diff stops there: a state that changed entirely costs no more
    /// than reaching the limit).
    pub(super) fn diff(&self, state: &[u8], limit: usize) -> Option<Vec<u8>> {
        let index: IndexedSignature<'_> = self.0.index();
        let mut out = Bounded { bytes: Vec::new(), limit };
        fast_rsync::diff(&index, state, &mut out).ok()?;
        Some(out.bytes)
    }
}

/// A buffer that refuses to grow past its limit, which stops the diff writing into it.
struct Bounded {
    bytes: Vec<u8>,
    limit: usize,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("the delta outgrew its limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Applies `delta` to `base` into `out` (emptied first), which must come to `expected` bytes.
///
/// # Errors
/// The delta does not parse, reaches outside `base`, or makes another length.
pub(super) fn apply(base: &[u8], delta: &[u8], out: &mut Vec<u8>, expected: usize) -> Result<(), String> {
    out.clear();
    out.reserve(expected);
    fast_rsync::apply_limited(base, delta, out, expected).map_err(|e| format!("its delta does not apply: {e}"))?;
    if out.len() != expected {
        return Err(format!("its delta makes {} bytes, its header says {expected}", out.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(length: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..length)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A state laid out as `layers` runs of `cells` cells of `width` bytes, as K rows are.
    fn rows(layers: usize, cells: usize, width: usize, seed: u64) -> Vec<Vec<u8>> {
        (0..layers).map(|layer| noise(cells * width, seed + layer as u64)).collect()
    }

    #[test]
    fn cells_appended_to_every_run_cost_what_they_add() {
        // 60 runs (30 layers' K and V), 1000 cells of 64 bytes, then 40 cells more in each.
        let old = rows(60, 1000, 64, 1);
        let added = rows(60, 40, 64, 99);
        let before: Vec<u8> = old.concat();
        let after: Vec<u8> = old.iter().zip(&added).flat_map(|(o, a)| [o.as_slice(), a.as_slice()].concat()).collect();
        let signature = StateSignature::of(&before);
        assert!(signature.bytes() * 20 < before.len() as u64 + 1000, "{} of {}", signature.bytes(), before.len());
        let delta = signature.diff(&after, after.len()).expect("within the limit");
        let changed = after.len() - before.len();
        assert!(delta.len() < changed + 60 * 2 * BLOCK_BYTES as usize, "{} for {changed} added", delta.len());
        let mut out = Vec::new();
        apply(&before, &delta, &mut out, after.len()).expect("applies");
        assert_eq!(out, after);
    }

    #[test]
    fn a_transposed_layout_costs_about_a_block_per_insertion_point() {
        // V transposed: one run per embedding dimension, each gaining 40 cells of 2 bytes.
        let old = rows(2000, 1000, 2, 7);
        let added = rows(2000, 40, 2, 77);
        let before: Vec<u8> = old.concat();
        let after: Vec<u8> = old.iter().zip(&added).flat_map(|(o, a)| [o.as_slice(), a.as_slice()].concat()).collect();
        let delta = StateSignature::of(&before).diff(&after, after.len()).expect("within the limit");
        let changed = after.len() - before.len();
        assert!(delta.len() < changed + 2000 * (BLOCK_BYTES as usize + 16), "{} for {changed} added", delta.len());
        assert!(delta.len() < after.len() / 2, "{} of {}", delta.len(), after.len());
        let mut out = Vec::new();
        apply(&before, &delta, &mut out, after.len()).expect("applies");
        assert_eq!(out, after);
    }

    #[test]
    fn cells_dropped_from_the_front_and_added_at_the_end_cost_what_was_added() {
        let before = noise(1 << 20, 3);
        let after = [&before[64 << 10..], &noise(64 << 10, 4)].concat();
        let delta = StateSignature::of(&before).diff(&after, after.len()).expect("within the limit");
        assert!(delta.len() < (64 << 10) + 4096, "{}", delta.len());
        let mut out = Vec::new();
        apply(&before, &delta, &mut out, after.len()).expect("applies");
        assert_eq!(out, after);
    }

    #[test]
    fn a_state_that_changed_entirely_stops_the_diff_at_its_limit() {
        let before = noise(1 << 20, 5);
        let after = noise(1 << 20, 6);
        assert!(StateSignature::of(&before).diff(&after, after.len() / 2).is_none());
    }

    #[test]
    fn a_damaged_delta_or_a_wrong_length_is_an_error_never_a_panic() {
        let before = noise(100_000, 8);
        let mut after = before.clone();
        after[50_000..50_100].copy_from_slice(&noise(100, 9));
        let delta = StateSignature::of(&before).diff(&after, after.len()).expect("within the limit");
        let mut out = Vec::new();
        assert!(apply(&before, &delta, &mut out, after.len() - 1).is_err());
        assert!(apply(&before, &delta[..delta.len() - 3], &mut out, after.len()).is_err());
        assert!(apply(&before[..1000], &delta, &mut out, after.len()).is_err());
        for i in 0..delta.len().min(64) {
            let mut damaged = delta.clone();
            damaged[i] ^= 0xff;
            // Applies or not; never a panic, never past the expected length.
            let _ = apply(&before, &damaged, &mut out, after.len());
            assert!(out.len() <= after.len());
        }
    }
}
