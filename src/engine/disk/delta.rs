//! Binary deltas between two states of one conversation (the `fast_rsync` crate: librsync's
//! algorithm). The writer keeps a signature of the last state it wrote to a file (a rolling
//! checksum and 8 bytes of MD4 per 256-byte block: 4.7% of the state), and the next state's
//! delta is computed from that signature alone; the reader applies the delta to the state it
//! reassembled before. Nothing here knows llama.cpp's layout: cells appended at the end of
//! every layer's K and V rows, V transposed (one insertion per embedding dimension), cells
//! dropped from the front of a sliding window, or a recurrent state that changes entirely all
//! come out as the bytes that changed plus at most a block per place where they changed. MD4
//! is not trusted: every reassembled state is checked against the XXH3 its segment carries.
//!
//! A chain of deltas is not applied one after another (each a copy of the whole state: 19
//! deltas of a 107 MiB state took 280 ms): each delta's commands (librsync's format: copy a
//! range of the state before, or insert literal bytes) are composed into a [`Layout`] of the
//! newest state as runs of the base's bytes and of the deltas' literals, and the state is
//! copied out of those once.

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

/// The first bytes of a librsync delta.
const DELTA_MAGIC: u32 = 0x7273_0236;
/// Its commands: the end; literals of 1 to 64 bytes (the length in the command); literals
/// whose length follows in 1, 2, 4 or 8 bytes; copies whose offset and length follow in 1, 2,
/// 4 or 8 bytes each (four by four).
const OP_END: u8 = 0;
const OP_LITERAL_64: u8 = 0x40;
const OP_LITERAL_N1: u8 = 0x41;
const OP_LITERAL_N8: u8 = 0x44;
const OP_COPY_N1_N1: u8 = 0x45;
const OP_COPY_N8_N8: u8 = 0x54;

/// A run of a state's bytes: `len` bytes from offset `from` of source `source` (0: the base,
/// k: the k-th delta's bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    start: usize,
    len: usize,
    source: usize,
    from: usize,
}

/// A state as runs of the base's bytes and of deltas' literals.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    pieces: Vec<Piece>,
    len: usize,
}

impl Layout {
    /// The base's layout: all of it.
    pub(super) fn base(len: usize) -> Self {
        let pieces = if len == 0 { Vec::new() } else { vec![Piece { start: 0, len, source: 0, from: 0 }] };
        Self { pieces, len }
    }

    /// Bytes of the state.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The layout of the state that `delta` (source number `source`) makes of this one, which
    /// must be `expected` bytes long.
    ///
    /// # Errors
    /// The delta does not parse, copies from outside this state, or makes another length.
    pub(super) fn then(&self, source: usize, delta: &[u8], expected: usize) -> Result<Self, String> {
        let mut next = Self { pieces: Vec::new(), len: 0 };
        let mut cursor = Cursor { bytes: delta, at: 0 };
        if cursor.int(4)? != u64::from(DELTA_MAGIC) {
            return Err("its delta does not start like one".into());
        }
        loop {
            let command = cursor.int(1)? as u8;
            match command {
                OP_END => break,
                1..=OP_LITERAL_N8 => {
                    let len = if command <= OP_LITERAL_64 {
                        u64::from(command)
                    } else {
                        cursor.int(1 << (command - OP_LITERAL_N1))?
                    };
                    let from = cursor.skip(len)?;
                    next.push(Piece { start: next.len, len: len as usize, source, from });
                }
                OP_COPY_N1_N1..=OP_COPY_N8_N8 => {
                    let mode = command - OP_COPY_N1_N1;
                    let offset = cursor.int(1 << (mode / 4))?;
                    let len = cursor.int(1 << (mode % 4))?;
                    next.copy(self, offset, len)?;
                }
                _ => return Err(format!("its delta has an unknown command {command:#x}")),
            }
            if next.len > expected {
                return Err(format!("its delta makes more than the {expected} bytes its header says"));
            }
        }
        if cursor.at != delta.len() {
            return Err("its delta goes on after its end".into());
        }
        if next.len != expected {
            return Err(format!("its delta makes {} bytes, its header says {expected}", next.len));
        }
        Ok(next)
    }

    /// Appends `len` bytes of `before` from `offset`.
    fn copy(&mut self, before: &Self, offset: u64, len: u64) -> Result<(), String> {
        let end = offset.checked_add(len).filter(|&end| len > 0 && end <= before.len as u64);
        let (Some(end), Ok(offset)) = (end, usize::try_from(offset)) else {
            return Err(format!("its delta copies {len} bytes from {offset} of a state of {}", before.len));
        };
        let end = end as usize;
        let first = before.pieces.partition_point(|piece| piece.start + piece.len <= offset);
        for piece in &before.pieces[first..] {
            if piece.start >= end {
                break;
            }
            let from = offset.max(piece.start);
            let to = end.min(piece.start + piece.len);
            let skipped = from - piece.start;
            self.push(Piece { start: self.len, len: to - from, source: piece.source, from: piece.from + skipped });
        }
        Ok(())
    }

    /// Appends a piece, merged with the last one when it continues it.
    fn push(&mut self, piece: Piece) {
        self.len += piece.len;
        if let Some(last) = self.pieces.last_mut() {
            if last.source == piece.source && last.from + last.len == piece.from {
                last.len += piece.len;
                return;
            }
        }
        self.pieces.push(piece);
    }

    /// Copies the state out of `sources` (the base's bytes, then each delta's) into `out`.
    ///
    /// # Errors
    /// A source is shorter than a piece says (a layout made from other deltas).
    pub(super) fn materialize(&self, sources: &[&[u8]], out: &mut Vec<u8>) -> Result<(), String> {
        out.clear();
        out.reserve(self.len);
        for piece in &self.pieces {
            let bytes = sources
                .get(piece.source)
                .and_then(|source| source.get(piece.from..piece.from + piece.len))
                .ok_or("a delta is shorter than its commands say")?;
            out.extend_from_slice(bytes);
        }
        Ok(())
    }
}

impl Layout {
    /// Makes the state in `base`'s own buffer (the base's bytes; `deltas` are the deltas'),
    /// when every run of the base moves toward the end or stays (cells appended: the common
    /// case), so that copying the runs from the last to the first never overwrites bytes still
    /// to be copied; `false`, and `base` untouched, otherwise.
    ///
    /// # Errors
    /// A delta is shorter than a piece says (`base` untouched).
    pub(super) fn materialize_in_place(&self, base: &mut Vec<u8>, deltas: &[&[u8]]) -> Result<bool, String> {
        let source_len =
            |source: usize| if source == 0 { Some(base.len()) } else { deltas.get(source - 1).map(|d| d.len()) };
        for piece in &self.pieces {
            if source_len(piece.source).is_none_or(|len| piece.from + piece.len > len) {
                return Err("a delta is shorter than its commands say".into());
            }
        }
        if self.pieces.iter().any(|piece| piece.source == 0 && piece.from > piece.start) {
            return Ok(false);
        }
        // Runs are written from the last to the first: one at output offset s reads from at
        // most s + its length, below every run written before it.
        base.resize(self.len.max(base.len()), 0);
        for piece in self.pieces.iter().rev() {
            let (from, to) = (piece.from..piece.from + piece.len, piece.start);
            if piece.source == 0 {
                base.copy_within(from, to);
            } else {
                base[to..to + piece.len].copy_from_slice(&deltas[piece.source - 1][from]);
            }
        }
        base.truncate(self.len);
        Ok(true)
    }
}

/// A position in a delta.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    /// The big-endian integer of the next `n` bytes.
    fn int(&mut self, n: usize) -> Result<u64, String> {
        let from = self.skip(n as u64)?;
        Ok(self.bytes[from..self.at].iter().fold(0u64, |value, &byte| value << 8 | u64::from(byte)))
    }

    /// Steps over `n` bytes; returns where they start.
    fn skip(&mut self, n: u64) -> Result<usize, String> {
        let from = self.at;
        let end = usize::try_from(n).ok().and_then(|n| from.checked_add(n)).filter(|&end| end <= self.bytes.len());
        self.at = end.ok_or("its delta ends in the middle of a command")?;
        Ok(from)
    }
}

/// Pseudo-random bytes (xorshift; `seed` picks the stream): KV rows as far as a delta can
/// tell, for the disk cache's tests.
#[cfg(test)]
pub(super) fn noise(length: usize, seed: u64) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `delta` applied to `base`, through a layout.
    fn apply(base: &[u8], delta: &[u8], out: &mut Vec<u8>, expected: usize) -> Result<(), String> {
        Layout::base(base.len()).then(1, delta, expected)?.materialize(&[base, delta], out)
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

    #[test]
    fn a_chain_composed_makes_each_state_as_applying_its_deltas_one_by_one_does() {
        // Cells appended, dropped from the front, rewritten in the middle, a state shrunk.
        let mut states = vec![noise(300_000, 11)];
        type Edit = dyn Fn(&[u8]) -> Vec<u8>;
        let edits: [&Edit; 5] = [
            &|s| [s, &noise(5000, 12)].concat(),
            &|s| [&s[20_000..], &noise(20_000, 13)[..]].concat(),
            &|s| [&s[..100_000], &noise(3000, 14)[..], &s[103_000..]].concat(),
            &|s| s.chunks(60_000).flat_map(|c| [c, &noise(700, c.len() as u64)[..]].concat()).collect(),
            &|s| s[..250_000].to_vec(),
        ];
        for edit in edits {
            let next = edit(states.last().expect("a state"));
            states.push(next);
        }
        let deltas: Vec<Vec<u8>> = states
            .windows(2)
            .map(|pair| StateSignature::of(&pair[0]).diff(&pair[1], usize::MAX).expect("a delta"))
            .collect();
        let mut layout = Layout::base(states[0].len());
        let mut sources: Vec<&[u8]> = vec![&states[0]];
        let mut one_by_one = states[0].clone();
        let mut in_place_states = 0;
        for (k, delta) in deltas.iter().enumerate() {
            layout = layout.then(k + 1, delta, states[k + 1].len()).expect("composes");
            sources.push(delta);
            let mut composed = Vec::new();
            layout.materialize(&sources, &mut composed).expect("materializes");
            let mut applied = Vec::new();
            fast_rsync::apply(&one_by_one, delta, &mut applied).expect("applies");
            assert!(composed == applied && applied == states[k + 1], "state {}", k + 1);
            // In the base's own buffer, where every base run moves toward the end.
            let mut in_place = states[0].clone();
            if layout.materialize_in_place(&mut in_place, &sources[1..]).expect("in place") {
                assert!(in_place == states[k + 1], "state {} in place", k + 1);
                in_place_states += 1;
            } else {
                assert!(in_place == states[0], "untouched");
            }
            one_by_one = applied;
        }
        assert!(layout.pieces.len() < 40, "{} pieces", layout.pieces.len());
        // Cells appended: made in place; a front dropped (every later state): not.
        assert_eq!(in_place_states, 1);
    }
}
