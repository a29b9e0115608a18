//! One disk cache file: `FWKV`, the format version, the header's length, an XXH3-64 checksum,
//! a JSON header (what the state is valid for, its tokens, the payload's length), then the
//! payload: the target's state bytes followed by the drafter's. The checksum covers everything
//! after the magic but itself (version, header length, header and payload), so no byte that
//! decides what a state is used for can change unnoticed. Written to a temporary file, synced
//! and renamed into place, so a file under its final name is always complete.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::identity::{Fingerprint, Mismatch};

/// The first bytes of every file.
const MAGIC: &[u8; 4] = b"FWKV";
/// The layout this build writes and reads. 2: the checksum covers the header too.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The name every complete file ends with.
pub(crate) const EXTENSION: &str = "fwkv";
/// Headers are small (a token list of a full context is about 1 MiB of JSON); a larger one is
/// not a header.
const MAX_HEADER_BYTES: u64 = 64 << 20;
/// Magic, version, header length and checksum.
const PREAMBLE_BYTES: u64 = 4 + 4 + 8 + 8;

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

/// A header read from a file, with what checking the rest of the file needs.
struct Parsed {
    header: Header,
    /// The checksum the file carries.
    checksum: u64,
    /// The checksum's state after everything before the payload.
    hasher: Xxh3,
}

/// Reads a file's header and checks it against the file's length and the engine's
/// fingerprint, without reading the payload (its checksum is checked when the file is read
/// whole). Returns the header and the payload's length.
pub(crate) fn read_header(path: &Path, engine: &Fingerprint) -> Result<(Header, u64), Refusal> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let Parsed { header, .. } = parse_header(&mut reader, length, engine)?;
    let payload = header.target_bytes + header.drafter_bytes;
    Ok((header, payload))
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
    Ok(Parsed { header, checksum, hasher })
}

/// Checks that a file of `length` bytes is exactly `before_payload` bytes and the payload the
/// header says, in checked arithmetic: no size larger than the file passes, so nothing is
/// allocated for one.
fn check_sizes(header: &Header, before_payload: u64, length: u64) -> Result<(), Refusal> {
    let expected =
        before_payload.checked_add(header.target_bytes).and_then(|sum| sum.checked_add(header.drafter_bytes));
    match expected {
        Some(expected) if expected == length => Ok(()),
        Some(expected) => Err(truncated(length, expected)),
        None => Err(Refusal::Oversized { target: header.target_bytes, drafter: header.drafter_bytes }),
    }
}

fn truncated(actual: u64, expected: u64) -> Refusal {
    Refusal::Truncated { actual, expected }
}

/// A file's header and payload (target state, drafter state), checked against the engine's
/// fingerprint, its length and its checksum.
pub(crate) fn read_entry(path: &Path, engine: &Fingerprint) -> Result<(Header, Vec<u8>, Vec<u8>), Refusal> {
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    let Parsed { header, checksum, mut hasher } = parse_header(&mut file, length, engine)?;
    let mut target = vec![0u8; header.target_bytes as usize];
    file.read_exact(&mut target)?;
    let mut drafter = vec![0u8; header.drafter_bytes as usize];
    file.read_exact(&mut drafter)?;
    hasher.update(&target);
    hasher.update(&drafter);
    if hasher.digest() != checksum {
        return Err(Refusal::Corrupt);
    }
    Ok((header, target, drafter))
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

/// Writes `header` (its sizes filled in here) and the payload to `path` atomically: a
/// temporary file, synced, renamed into place, the directory synced. On failure the
/// temporary file is removed and nothing is under `path`'s name.
pub(crate) fn write_entry(path: &Path, mut header: Header, target: &[u8], drafter: &[u8]) -> std::io::Result<()> {
    header.target_bytes = target.len() as u64;
    header.drafter_bytes = drafter.len() as u64;
    let text = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let mut covered = [0u8; 12];
    covered[..4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    covered[4..].copy_from_slice(&(text.len() as u64).to_le_bytes());
    let mut hasher = Xxh3::new();
    for part in [&covered[..], &text, target, drafter] {
        hasher.update(part);
    }
    let temporary = temporary_path(path);
    let written = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        // The header holds the conversation's tokens: for the user alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary)?;
        file.write_all(MAGIC)?;
        file.write_all(&covered)?;
        file.write_all(&hasher.digest().to_le_bytes())?;
        file.write_all(&text)?;
        // The tests stop (or kill) a write here, the temporary file begun.
        fail::fail_point!("disk::write");
        file.write_all(target)?;
        file.write_all(drafter)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests;
