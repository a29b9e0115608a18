//! One disk cache file: one conversation's states, turn by turn, as a base and the deltas
//! appended after it (see [`super::delta`]).
//!
//! The base is `FWKV`, the format version, the header's length, an XXH3-64 checksum, a JSON
//! [`Header`] (what the state is valid for, its tokens, the payload's length), then the
//! payload: the target's state bytes followed by the drafter's. Each later segment is `FWKD`,
//! the version, its header's length, its checksum, a JSON [`DeltaHeader`] (the tokens the turn
//! added, the reassembled state's sizes and XXH3) and the delta from the state before. Each
//! checksum covers everything of its segment after the magic but itself, so no byte that
//! decides what a state is used for can change unnoticed.
//!
//! Appending to one file rather than chaining files: a turn's write is one `write` at the end
//! and one `fsync`, the previous turns' bytes are never touched (a crash or a full disk in the
//! middle of an append leaves a partial tail that the reader ignores and the next append cuts
//! off), the index keeps one entry per conversation and eviction removes one file. A base is
//! written to a temporary file, synced and renamed into place (over the older chain of the same
//! conversation, which stays whole until then), so a file under its final name always starts
//! with a whole base.
//!
//! Reading: the headers alone (the index at start-up) tell a file's segments whose bytes are
//! all there; a read checks the base's checksum, then applies the deltas one by one, each
//! checked before it is applied and its result checked against the XXH3 its header carries,
//! and stops at the first that fails: the state returned is the last one verified.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::delta::Layout;
use super::identity::{Fingerprint, Mismatch};

/// The first bytes of every file.
const MAGIC: &[u8; 4] = b"FWKV";
/// The first bytes of every delta segment.
const DELTA_MAGIC: &[u8; 4] = b"FWKD";
/// The layout this build writes and reads. 2: the checksum covers the header too. 3: delta
/// segments may follow the base.
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The name every complete file ends with.
pub(crate) const EXTENSION: &str = "fwkv";
/// Headers are small (a token list of a full context is about 1 MiB of JSON); a larger one is
/// not a header.
const MAX_HEADER_BYTES: u64 = 64 << 20;
/// Magic, version, header length and checksum.
pub(crate) const PREAMBLE_BYTES: u64 = 4 + 4 + 8 + 8;

/// What a file says about its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    /// What the state is valid for.
    pub(crate) fingerprint: Fingerprint,
    /// `snapshot` or `checkpoint`.
    pub(crate) kind: String,
    /// The tokens the state holds, position by position.
    pub(crate) tokens: Vec<i32>,
    /// Bytes of the target's state.
    pub(crate) target_bytes: u64,
    /// Bytes of the drafter's state (0: none).
    pub(crate) drafter_bytes: u64,
    /// The tokens a draft model's context held.
    pub(crate) drafter_tokens: Vec<i32>,
}

/// What a delta segment says about the state it makes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeltaHeader {
    /// `snapshot` or `checkpoint`.
    pub(crate) kind: String,
    /// The tokens the state holds after those of the state before it.
    pub(crate) tokens: Vec<i32>,
    /// The tokens a draft model's context held.
    pub(crate) drafter_tokens: Vec<i32>,
    /// Bytes of the target's state.
    pub(crate) target_bytes: u64,
    /// Bytes of the drafter's state (0: none).
    pub(crate) drafter_bytes: u64,
    /// Bytes of the delta that follows.
    pub(crate) delta_bytes: u64,
    /// XXH3-64 of the state it makes (target and drafter bytes).
    pub(crate) state_hash: u64,
}

/// Why a file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// It could not be read.
    #[error("unreadable: {0}")]
    Unreadable(#[from] std::io::Error),
    /// It does not start like a cache file (zeroed, or something else).
    #[error("not a firstword cache file")]
    NotCacheFile,
    /// Another layout version.
    #[error("format version {0}, this build reads {FORMAT_VERSION}")]
    Version(u32),
    /// The header does not parse, or says something no state of this engine can be.
    #[error("damaged header: {0}")]
    Header(String),
    /// State sizes no file can have: they add up past `u64::MAX` (and might wrap around to
    /// the file's length).
    #[error("damaged header: state sizes of {target} and {drafter} bytes")]
    Oversized {
        /// The target's state size the header says.
        target: u64,
        /// The drafter's.
        drafter: u64,
    },
    /// Shorter or longer than its header says.
    #[error("truncated: {actual} bytes, its header says {expected}")]
    Truncated {
        /// Bytes the file has.
        actual: u64,
        /// Bytes it should have.
        expected: u64,
    },
    /// The checksum of its header and payload does not match.
    #[error("corrupt: checksum mismatch")]
    Corrupt,
    /// Valid, but for another engine.
    #[error("{0}")]
    Mismatch(#[from] Mismatch),
    /// Read whole, but llama.cpp refused the state, or the state it restored does not hold
    /// the header's tokens.
    #[error("{0}")]
    Rejected(String),
}

/// A base header read from a file, with what checking the rest of the base needs.
struct Parsed {
    header: Header,
    /// The checksum the base carries.
    checksum: u64,
    /// The checksum's state after everything before the payload.
    hasher: Xxh3,
    /// Where the base's payload starts.
    payload_at: u64,
}

/// A delta segment whose header parsed and whose bytes are all in the file.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Its header.
    pub(crate) header: DeltaHeader,
    /// The header as written (its checksum covers it).
    text: Vec<u8>,
    /// The checksum it carries.
    checksum: u64,
    /// Where its delta starts.
    payload_at: u64,
    /// Where it ends.
    pub(crate) end: u64,
}

/// What a file's headers say, read without its payloads.
#[derive(Debug)]
pub(crate) struct Index {
    /// The base's header.
    pub(crate) header: Header,
    /// Where the base ends.
    pub(crate) base_end: u64,
    /// The delta segments after it whose bytes are all there, up to the first that is not
    /// (cut off by a crash during an append) or whose header does not parse.
    pub(crate) segments: Vec<Segment>,
}

impl Index {
    /// The tokens of the state the base and its first `deltas` segments make.
    pub(crate) fn tokens(&self, deltas: usize) -> Vec<i32> {
        let mut tokens = self.header.tokens.clone();
        for segment in &self.segments[..deltas] {
            tokens.extend_from_slice(&segment.header.tokens);
        }
        tokens
    }

    /// `(kind, target bytes, drafter bytes)` of the state the base and its first `deltas`
    /// segments make.
    pub(crate) fn state(&self, deltas: usize) -> (&str, u64, u64) {
        match deltas.checked_sub(1).map(|last| &self.segments[last].header) {
            Some(last) => (&last.kind, last.target_bytes, last.drafter_bytes),
            None => (&self.header.kind, self.header.target_bytes, self.header.drafter_bytes),
        }
    }

    /// Where the base and its first `deltas` segments end.
    pub(crate) fn end(&self, deltas: usize) -> u64 {
        deltas.checked_sub(1).map_or(self.base_end, |last| self.segments[last].end)
    }
}

/// Reads a file's headers, the base's checked against the file's length and the engine's
/// fingerprint, without reading the payloads (their checksums are checked when the file is
/// read).
pub(crate) fn read_index(path: &Path, engine: &Fingerprint) -> Result<Index, Refusal> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let parsed = parse_header(&mut reader, length, engine)?;
    index_after(&mut reader, parsed.header, parsed.payload_at, length, engine)
}

/// Reads the delta segments' headers after `header`'s base, whose payload starts at
/// `payload_at`.
fn index_after(
    reader: &mut BufReader<File>,
    header: Header,
    payload_at: u64,
    length: u64,
    engine: &Fingerprint,
) -> Result<Index, Refusal> {
    let base_end = payload_at + header.target_bytes + header.drafter_bytes;
    let mut index = Index { header, base_end, segments: Vec::new() };
    let mut at = base_end;
    let mut tokens = index.header.tokens.len();
    while let Some(segment) = next_segment(reader, at, length)? {
        tokens += segment.header.tokens.len();
        if tokens > engine.context.n_ctx as usize || segment.header.drafter_tokens.len() > engine.context.n_ctx as usize
        {
            break;
        }
        at = segment.end;
        index.segments.push(segment);
    }
    Ok(index)
}

/// The delta segment at `at` of a file of `length` bytes, if its header parses and its bytes
/// are all there.
fn next_segment(reader: &mut BufReader<File>, at: u64, length: u64) -> std::io::Result<Option<Segment>> {
    if length.saturating_sub(at) < PREAMBLE_BYTES {
        return Ok(None);
    }
    reader.seek(SeekFrom::Start(at))?;
    let mut preamble = [0u8; PREAMBLE_BYTES as usize];
    reader.read_exact(&mut preamble)?;
    let header_len = u64::from_le_bytes(preamble[8..16].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(preamble[4..8].try_into().expect("4 bytes"));
    let payload_at = at + PREAMBLE_BYTES + header_len;
    if &preamble[..4] != DELTA_MAGIC
        || version != FORMAT_VERSION
        || header_len > MAX_HEADER_BYTES
        || payload_at > length
    {
        return Ok(None);
    }
    let mut text = vec![0u8; header_len as usize];
    reader.read_exact(&mut text)?;
    let Ok(header) = serde_json::from_slice::<DeltaHeader>(&text) else { return Ok(None) };
    let end = payload_at.checked_add(header.delta_bytes).filter(|&end| end <= length);
    let checksum = u64::from_le_bytes(preamble[16..24].try_into().expect("8 bytes"));
    Ok(end.map(|end| Segment { header, text, checksum, payload_at, end }))
}

/// Reads the preamble and header from the start of a file of `length` bytes and checks them
/// against the file's length and the engine's fingerprint. Every size is checked against the
/// length before it is used, so a damaged header never makes a large allocation.
fn parse_header(reader: &mut impl Read, length: u64, engine: &Fingerprint) -> Result<Parsed, Refusal> {
    let mut preamble = [0u8; PREAMBLE_BYTES as usize];
    if length < PREAMBLE_BYTES {
        return Err(if length == 0 { Refusal::NotCacheFile } else { truncated(length, PREAMBLE_BYTES) });
    }
    reader.read_exact(&mut preamble)?;
    if &preamble[..4] != MAGIC {
        return Err(Refusal::NotCacheFile);
    }
    let version = u32::from_le_bytes(preamble[4..8].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(Refusal::Version(version));
    }
    let header_len = u64::from_le_bytes(preamble[8..16].try_into().expect("8 bytes"));
    let checksum = u64::from_le_bytes(preamble[16..24].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER_BYTES {
        return Err(Refusal::Header(format!("{header_len} bytes long")));
    }
    if length - PREAMBLE_BYTES < header_len {
        return Err(truncated(length, PREAMBLE_BYTES + header_len));
    }
    let mut text = vec![0u8; header_len as usize];
    reader.read_exact(&mut text)?;
    let header: Header = serde_json::from_slice(&text).map_err(|e| Refusal::Header(e.to_string()))?;
    check_sizes(&header, PREAMBLE_BYTES + header_len, length)?;
    header.fingerprint.check(engine)?;
    let n_ctx = engine.context.n_ctx as usize;
    if header.tokens.len() > n_ctx || header.drafter_tokens.len() > n_ctx {
        return Err(Refusal::Header(format!("{} tokens in a context of {n_ctx}", header.tokens.len())));
    }
    let mut hasher = Xxh3::new();
    hasher.update(&preamble[4..16]);
    hasher.update(&text);
    Ok(Parsed { header, checksum, hasher, payload_at: PREAMBLE_BYTES + header_len })
}

/// Checks that a file of `length` bytes holds at least `before_payload` bytes and the payload
/// the header says, in checked arithmetic: no size larger than the file passes, so nothing is
/// allocated for one. (Delta segments may follow.)
fn check_sizes(header: &Header, before_payload: u64, length: u64) -> Result<(), Refusal> {
    let expected =
        before_payload.checked_add(header.target_bytes).and_then(|sum| sum.checked_add(header.drafter_bytes));
    match expected {
        Some(expected) if expected <= length => Ok(()),
        Some(expected) => Err(truncated(length, expected)),
        None => Err(Refusal::Oversized { target: header.target_bytes, drafter: header.drafter_bytes }),
    }
}

fn truncated(actual: u64, expected: u64) -> Refusal {
    Refusal::Truncated { actual, expected }
}

/// A state read from a file.
#[derive(Debug)]
pub(crate) struct ReadState {
    /// The file's headers.
    pub(crate) index: Index,
    /// Delta segments applied after the base: the state is that of the base and these.
    pub(crate) deltas: usize,
    /// The target's state bytes followed by the drafter's.
    pub(crate) bytes: Vec<u8>,
    /// Why the read stopped before the segments it was asked for: the first one that failed
    /// its checks.
    pub(crate) damaged: Option<String>,
}

/// Reads the state the base and its first `deltas` delta segments make (at most as many as
/// there are): the base checked against the engine's fingerprint, the file's length and its
/// checksum (a base that fails refuses the file), then each delta checked by its checksum,
/// applied, and its result checked by the XXH3 its header carries; the first that fails ends
/// the read, with the state verified before it.
pub(crate) fn read_state(path: &Path, engine: &Fingerprint, deltas: usize) -> Result<ReadState, Refusal> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let Parsed { header, checksum, mut hasher, payload_at } = parse_header(&mut reader, length, engine)?;
    let mut bytes = vec![0u8; (header.target_bytes + header.drafter_bytes) as usize];
    reader.read_exact(&mut bytes)?;
    hasher.update(&bytes);
    if hasher.digest() != checksum {
        return Err(Refusal::Corrupt);
    }
    let index = index_after(&mut reader, header, payload_at, length, engine)?;
    let mut read = ReadState { index, deltas: 0, bytes, damaged: None };
    let wanted = deltas.min(read.index.segments.len());
    // Every delta checked and composed, then the newest state copied out once and verified;
    // one that fails hands over to the one before.
    let mut layouts = vec![Layout::base(read.bytes.len())];
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for (k, segment) in read.index.segments[..wanted].iter().enumerate() {
        let before = layouts.last().expect("the base's");
        let composed = read_delta(&mut reader, segment, before.len())
            .and_then(|(delta, expected)| Ok((before.then(k + 1, &delta, expected)?, delta)));
        match composed {
            Ok((layout, delta)) => {
                layouts.push(layout);
                payloads.push(delta);
            }
            Err(reason) => {
                read.damaged = Some(format!("segment {} of {}: {reason}", k + 2, wanted + 1));
                break;
            }
        }
    }
    // The newest state, where it can be, is made in the base's own buffer (no second copy of
    // the state to allocate); should it fail its check, the base is read again for the others.
    if layouts.len() > 1 {
        let k = layouts.len() - 1;
        let deltas: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        if let Ok(true) = layouts[k].materialize_in_place(&mut read.bytes, &deltas) {
            if xxhash_rust::xxh3::xxh3_64(&read.bytes) == read.index.segments[k - 1].header.state_hash {
                read.deltas = k;
                return Ok(read);
            }
            read.damaged =
                Some(format!("segment {} of {}: the state it makes does not match its checksum", k + 1, wanted + 1));
            layouts.pop();
            payloads.pop();
            read.bytes.resize(layouts[0].len(), 0);
            reader.seek(SeekFrom::Start(payload_at))?;
            reader.read_exact(&mut read.bytes)?;
        }
    }
    let mut state = Vec::new();
    while layouts.len() > 1 {
        let k = layouts.len() - 1;
        let sources: Vec<&[u8]> = std::iter::once(&read.bytes[..]).chain(payloads.iter().map(Vec::as_slice)).collect();
        let made = layouts[k].materialize(&sources, &mut state);
        if made.is_ok() && xxhash_rust::xxh3::xxh3_64(&state) == read.index.segments[k - 1].header.state_hash {
            read.bytes = state;
            read.deltas = k;
            break;
        }
        read.damaged =
            Some(format!("segment {} of {}: the state it makes does not match its checksum", k + 1, wanted + 1));
        layouts.pop();
        payloads.pop();
    }
    Ok(read)
}

/// Reads `segment`'s delta, checked against the segment's checksum, and the length of the
/// state it makes of one of `before` bytes.
fn read_delta(reader: &mut BufReader<File>, segment: &Segment, before: usize) -> Result<(Vec<u8>, usize), String> {
    let header = &segment.header;
    // A copy can repeat the state's bytes, so a delta could make any length: one past twice
    // the state and the delta is refused before anything is allocated for it.
    let bound = 2 * before as u64 + header.delta_bytes;
    let expected = header.target_bytes.checked_add(header.drafter_bytes).filter(|&expected| expected <= bound);
    let Some(expected) = expected else {
        return Err(format!("state sizes of {} and {} bytes", header.target_bytes, header.drafter_bytes));
    };
    let mut delta = vec![0u8; segment.header.delta_bytes as usize];
    reader
        .seek(SeekFrom::Start(segment.payload_at))
        .and_then(|_| reader.read_exact(&mut delta))
        .map_err(|e| e.to_string())?;
    let mut hasher = Xxh3::new();
    hasher.update(&FORMAT_VERSION.to_le_bytes());
    hasher.update(&(segment.text.len() as u64).to_le_bytes());
    hasher.update(&segment.text);
    hasher.update(&delta);
    if hasher.digest() != segment.checksum {
        return Err("corrupt: checksum mismatch".into());
    }
    Ok((delta, expected as usize))
}

/// The temporary name a file is written under by this process.
pub(crate) fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// The process that was writing a temporary file, from its name.
pub(crate) fn temporary_writer(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?.strip_suffix(".tmp")?;
    name.rsplit_once('.')?.1.parse().ok()
}

/// The preamble of a segment (its magic, the version, `text`'s length and the checksum of
/// them, `text` and `payload`) and the hasher that made its checksum.
fn preamble(magic: &[u8; 4], text: &[u8], payload: &[&[u8]]) -> [u8; PREAMBLE_BYTES as usize] {
    let mut preamble = [0u8; PREAMBLE_BYTES as usize];
    preamble[..4].copy_from_slice(magic);
    preamble[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    preamble[8..16].copy_from_slice(&(text.len() as u64).to_le_bytes());
    let mut hasher = Xxh3::new();
    hasher.update(&preamble[4..16]);
    hasher.update(text);
    for part in payload {
        hasher.update(part);
    }
    preamble[16..].copy_from_slice(&hasher.digest().to_le_bytes());
    preamble
}

/// Writes `header` (its sizes filled in here) and the payload to `path` atomically as a new
/// base: a temporary file, synced, renamed into place (over the older file of the same name,
/// whole until then), the directory synced. On failure the temporary file is removed and
/// `path` is as it was. Returns the bytes written.
pub(crate) fn write_entry(path: &Path, mut header: Header, target: &[u8], drafter: &[u8]) -> std::io::Result<u64> {
    header.target_bytes = target.len() as u64;
    header.drafter_bytes = drafter.len() as u64;
    let text = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let preamble = preamble(MAGIC, &text, &[target, drafter]);
    let temporary = temporary_path(path);
    let written = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        // The header holds the conversation's tokens: for the user alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary)?;
        file.write_all(&preamble)?;
        file.write_all(&text)?;
        // The tests stop, fail (a full disk) or kill a write here, the temporary file begun.
        fail::fail_point!("disk::write", |_| Err(std::io::Error::other("failure injected at disk::write")));
        file.write_all(target)?;
        file.write_all(drafter)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(PREAMBLE_BYTES + (text.len() + target.len() + drafter.len()) as u64)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Appends a delta segment (`header`, its delta length filled in here, and `delta`) to the
/// file at `path` at offset `at`, the end of its last whole segment (whatever follows, the
/// tail of an append that did not finish, is cut off first), and syncs it. On failure the
/// file is cut back to `at`: the state it held is untouched either way. Returns the bytes
/// written.
pub(crate) fn append_segment(path: &Path, at: u64, mut header: DeltaHeader, delta: &[u8]) -> std::io::Result<u64> {
    header.delta_bytes = delta.len() as u64;
    let text = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let preamble = preamble(DELTA_MAGIC, &text, &[delta]);
    let mut file = OpenOptions::new().write(true).open(path)?;
    if file.metadata()?.len() < at {
        return Err(std::io::Error::other(format!("{} is shorter than its last segment's end", path.display())));
    }
    let appended = (|| {
        file.set_len(at)?;
        file.seek(SeekFrom::Start(at))?;
        file.write_all(&preamble)?;
        file.write_all(&text)?;
        // The tests stop, fail (a full disk) or kill an append here, the segment begun.
        fail::fail_point!("disk::append", |_| Err(std::io::Error::other("failure injected at disk::append")));
        file.write_all(delta)?;
        file.sync_data()?;
        Ok(PREAMBLE_BYTES + (text.len() + delta.len()) as u64)
    })();
    if appended.is_err() {
        let _ = file.set_len(at).and_then(|()| file.sync_data());
    }
    appended
}

#[cfg(test)]
pub(super) mod tests;
