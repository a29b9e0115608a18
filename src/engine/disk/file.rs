//! One disk cache file: `FWKV`, the format version, a JSON header (what the state is valid
//! for, its tokens, the payload's length and checksum), then the payload: the target's state
//! bytes followed by the drafter's. Written to a temporary file, synced and renamed into place,
//! so a file under its final name is always complete.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::identity::{Fingerprint, Mismatch};

/// The first bytes of every file.
const MAGIC: &[u8; 4] = b"FWKV";
/// The layout this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// The name every complete file ends with.
pub(crate) const EXTENSION: &str = "fwkv";
/// Headers are small (a token list of a full context is about 1 MiB of JSON); a larger one is
/// not a header.
const MAX_HEADER_BYTES: u64 = 64 << 20;
/// Magic, version and header length.
const PREAMBLE_BYTES: u64 = 4 + 4 + 8;

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
    /// XXH3-64 of the payload, hex.
    pub(crate) checksum: String,
}

impl Header {
    /// Bytes of the payload.
    pub(crate) fn payload_bytes(&self) -> u64 {
        self.target_bytes + self.drafter_bytes
    }
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
    /// The header does not parse.
    #[error("damaged header: {0}")]
    Header(String),
    /// Shorter or longer than its header says.
    #[error("truncated: {actual} bytes, its header says {expected}")]
    Truncated {
        /// Bytes the file has.
        actual: u64,
        /// Bytes it should have.
        expected: u64,
    },
    /// The payload's checksum does not match.
    #[error("corrupt: checksum mismatch")]
    Corrupt,
    /// Valid, but for another engine.
    #[error("{0}")]
    Mismatch(#[from] Mismatch),
}

/// Reads a file's header and checks it against the file's length and the engine's
/// fingerprint, without reading the payload.
pub(crate) fn read_header(path: &Path, engine: &Fingerprint) -> Result<Header, Refusal> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let header = parse_header(&mut reader, length)?;
    header.fingerprint.check(engine)?;
    Ok(header)
}

/// Reads the preamble and header from the start of a file of `length` bytes.
fn parse_header(reader: &mut impl Read, length: u64) -> Result<Header, Refusal> {
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
    if header_len > MAX_HEADER_BYTES {
        return Err(Refusal::Header(format!("{header_len} bytes long")));
    }
    if length < PREAMBLE_BYTES + header_len {
        return Err(truncated(length, PREAMBLE_BYTES + header_len));
    }
    let mut text = vec![0u8; header_len as usize];
    reader.read_exact(&mut text)?;
    let header: Header = serde_json::from_slice(&text).map_err(|e| Refusal::Header(e.to_string()))?;
    let expected = PREAMBLE_BYTES + header_len + header.payload_bytes();
    if length != expected {
        return Err(truncated(length, expected));
    }
    Ok(header)
}

fn truncated(actual: u64, expected: u64) -> Refusal {
    Refusal::Truncated { actual, expected }
}

/// A file's header and payload (target state, drafter state), checked against the engine's
/// fingerprint, its length and its checksum.
pub(crate) fn read_entry(path: &Path, engine: &Fingerprint) -> Result<(Header, Vec<u8>, Vec<u8>), Refusal> {
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    let header = parse_header(&mut file, length)?;
    header.fingerprint.check(engine)?;
    let mut target = vec![0u8; header.target_bytes as usize];
    file.read_exact(&mut target)?;
    let mut drafter = vec![0u8; header.drafter_bytes as usize];
    file.read_exact(&mut drafter)?;
    if checksum(&target, &drafter) != header.checksum {
        return Err(Refusal::Corrupt);
    }
    Ok((header, target, drafter))
}

/// XXH3-64 of a payload, hex.
pub(crate) fn checksum(target: &[u8], drafter: &[u8]) -> String {
    let mut hasher = Xxh3::new();
    hasher.update(target);
    hasher.update(drafter);
    format!("{:016x}", hasher.digest())
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

/// Writes `header` (its checksum filled in here) and the payload to `path` atomically: a
/// temporary file, synced, renamed into place, the directory synced. On failure the
/// temporary file is removed and nothing is under `path`'s name.
pub(crate) fn write_entry(path: &Path, mut header: Header, target: &[u8], drafter: &[u8]) -> std::io::Result<()> {
    header.checksum = checksum(target, drafter);
    header.target_bytes = target.len() as u64;
    header.drafter_bytes = drafter.len() as u64;
    let text = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let temporary = temporary_path(path);
    let written = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        // The header holds the conversation's tokens: for the user alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary)?;
        file.write_all(MAGIC)?;
        file.write_all(&FORMAT_VERSION.to_le_bytes())?;
        file.write_all(&(text.len() as u64).to_le_bytes())?;
        file.write_all(&text)?;
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
