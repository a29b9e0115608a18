//! What the disk cache knows of each file: this engine's entries and the other instances'
//! files the byte budget also covers.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use llama_cpp_2::token::LlamaToken;

use super::file::Index;
use super::kind_from_name;
use super::writer::{Slot, PENDING, WRITTEN};
use crate::engine::CacheEntryKind;

/// One state of this model's directory: a file's last whole segment, or one being written.
pub(super) struct DiskEntry {
    pub(super) path: PathBuf,
    pub(super) tokens: Vec<LlamaToken>,
    pub(super) kind: CacheEntryKind,
    /// Bytes of its state.
    pub(super) state_bytes: u64,
    /// Before it is written: what its file may come to (see [`super::DiskCache::save`]).
    pub(super) estimate: u64,
    pub(super) used_at: SystemTime,
    /// Written yet, and where (see [`super::writer`]).
    pub(super) slot: Arc<Slot>,
    /// Files a pending entry makes redundant, removed once it is written (see
    /// [`super::writer::WriteJob::replaces`]); passed on to a newer entry that supersedes it first.
    pub(super) replaces: Vec<PathBuf>,
}

impl DiskEntry {
    pub(super) fn written(&self) -> bool {
        self.slot.status() == WRITTEN
    }

    pub(super) fn pending(&self) -> bool {
        self.slot.status() == PENDING
    }

    /// Bytes its file takes (or may take, while it is written).
    pub(super) fn file_bytes(&self) -> u64 {
        if self.written() {
            self.slot.file_bytes.load(Ordering::Relaxed)
        } else {
            self.estimate
        }
    }

    /// The entry for the last whole segment of a file whose headers are `index`.
    pub(super) fn indexed(path: PathBuf, index: &Index, file_bytes: u64, used_at: SystemTime) -> Self {
        let deltas = index.segments.len();
        let (kind, target, drafter) = index.state(deltas);
        Self {
            tokens: index.tokens(deltas).into_iter().map(LlamaToken).collect(),
            kind: kind_from_name(kind),
            state_bytes: target + drafter,
            estimate: file_bytes,
            used_at,
            slot: Arc::new(Slot::written(deltas as u32, file_bytes)),
            replaces: Vec::new(),
            path,
        }
    }
}

/// A file this engine does not use (another model's, or another instance's of this model),
/// which the budget covers too.
pub(super) struct ForeignFile {
    pub(super) path: PathBuf,
    pub(super) bytes: u64,
    pub(super) used_at: SystemTime,
}
