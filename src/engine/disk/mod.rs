//! The disk cache: sequence states kept across restarts, so the first turn after an update,
//! a crash or a reboot is warm. Each model file gets its own directory under the cache
//! directory; the byte budget covers the whole cache directory, least recently used files
//! first, whoever wrote them. Files are written by a thread of their own (see [`writer`]) and
//! read on demand; a file that is damaged, or was written for another model file or llama.cpp
//! build (never usable again), is refused with a warning naming it and the reason, and
//! removed. A file of the same model written with other context parameters, another draft
//! model or another chat template belongs to another instance (or another configuration) that
//! shares the directory: it is skipped, kept, and counted in the budget. The files the engine
//! does not use are listed once at start and again when room is made, never on a status call.
//! A directory another user could write to is refused (see [`dir::private_dir`]); a writer
//! thread that stopped turns the disk cache off for the rest of the process. Of instances with
//! the same settings on one directory, one writes and the others read only (see [`lock`]).
//!
//! A conversation keeps one file: its next turn (a state whose tokens continue an entry's)
//! goes to the same file, as a delta appended to it (see [`file`] for the layout and
//! [`writer`] for when a new base is written instead), so a turn costs what it changed, not
//! the whole conversation. A file whose last segment is damaged serves the turn before it.

mod delta;
mod dir;
mod entry;
mod file;
mod identity;
mod lock;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use llama_cpp_2::token::LlamaToken;

use self::dir::private_dir;
use self::entry::{DiskEntry, ForeignFile};
use self::file::{read_index, read_state, temporary_writer, Header, Refusal, EXTENSION};
use self::lock::Access;
use self::writer::{Job, ReadFile, Slot, WriteJob, Writer, CONTINUED, FAILED, PENDING, SUPERSEDED};
use super::decoder::SavedState;
use super::policy::StoredView;
use super::store::StateBytes;
use super::{CacheEntryKind, CacheEntryStatus, DiskStatus};

pub(crate) use self::identity::{ContextShape, Fingerprint, ModelIdentity};
pub(crate) use self::writer::{DiskCounters, WriteHold};

/// Serializes the tests that write files (appends among them) against those that make
/// appends fail.
#[cfg(test)]
static FAILPOINTS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Saved states on disk for one model and context.
pub(crate) struct DiskCache {
    /// The cache directory (the budget covers all of it).
    root: PathBuf,
    /// This model's directory in it.
    dir: PathBuf,
    budget: u64,
    fingerprint: Fingerprint,
    /// Entries serve only prompts that continue them in full (see the RAM store).
    whole_only: bool,
    entries: Vec<DiskEntry>,
    /// Files of the cache directory this engine does not use, as last listed.
    others: Vec<ForeignFile>,
    writer: Writer,
    /// Whether this instance writes the files of its settings, or another one does.
    access: Access,
    /// Set once the writer thread is found stopped: the disk cache is then off for the rest
    /// of the process, with this reason.
    off: OnceLock<String>,
}

impl DiskCache {
    /// Opens (creating it) `root`'s directory for the model at `model_path`, takes the lock of
    /// its settings' files (or reads them only, see [`lock`]), indexes the files in it and
    /// refuses (removes, when it writes) the unusable ones.
    ///
    /// # Errors
    /// The directory cannot be created or listed, another user could write to it (see
    /// [`private_dir`]), or the writer thread cannot start.
    pub(crate) fn open(
        root: &Path,
        budget: u64,
        model_path: &Path,
        fingerprint: Fingerprint,
        whole_only: bool,
    ) -> std::io::Result<Self> {
        let dir = root.join(model_directory(model_path));
        private_dir(root)?;
        private_dir(&dir)?;
        let access = Access::take(&dir.join(format!("{}.lock", fingerprint.short_hash())));
        let mut cache = Self {
            root: root.to_path_buf(),
            dir,
            budget,
            fingerprint,
            whole_only,
            entries: Vec::new(),
            others: Vec::new(),
            writer: Writer::start()?,
            access,
            off: OnceLock::new(),
        };
        cache.index()?;
        cache.others = cache.list_others();
        Ok(cache)
    }

    /// Reads every header of the model's directory.
    fn index(&mut self) -> std::io::Result<()> {
        for item in std::fs::read_dir(&self.dir)? {
            let path = item?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.ends_with(".tmp") {
                if self.writes() && abandoned(&path) {
                    tracing::info!("disk cache: removing {}, left by an interrupted write", path.display());
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                continue;
            }
            self.index_file(path);
        }
        Ok(())
    }

    /// Reads a file's headers: an entry for its last whole segment, or the file skipped
    /// (another instance's) or refused.
    fn index_file(&mut self, path: PathBuf) {
        match read_index(&path, &self.fingerprint) {
            Ok(index) => {
                let metadata = std::fs::metadata(&path);
                let used_at = metadata.as_ref().ok().and_then(|m| m.modified().ok()).unwrap_or(SystemTime::UNIX_EPOCH);
                let file_bytes = metadata.map_or(index.end(index.segments.len()), |m| m.len());
                self.entries.push(DiskEntry::indexed(path, &index, file_bytes, used_at));
            }
            Err(Refusal::Mismatch(mismatch)) if mismatch.is_another_instance() => {
                tracing::info!(
                    "disk cache: skipping {}: {mismatch} (another instance's or configuration's file: kept, \
                     and counted in the budget)",
                    path.display()
                );
            }
            Err(refusal) => refuse(&path, &refusal, self.writes()),
        }
    }

    /// Whether this instance writes and removes files (see [`lock`]).
    fn writes(&self) -> bool {
        self.access.read_only().is_none()
    }

    /// The cache directory and what it holds, for the start-up log.
    pub(crate) fn describe(&self) -> String {
        format!(
            "disk cache {}: {} entries for this model, {} MiB of {} MiB in use{}",
            self.root.display(),
            self.entries.len(),
            self.used_bytes() >> 20,
            self.budget >> 20,
            if self.writes() { "" } else { " (read only)" }
        )
    }

    /// Whether the disk cache is off: its writer thread stopped (logged once, at error, when
    /// first found).
    pub(crate) fn is_off(&self) -> bool {
        if self.off.get().is_some() {
            return true;
        }
        let Some(panic) = self.writer.stopped() else { return false };
        if self.off.set(format!("its writer thread stopped: {panic}")).is_ok() {
            tracing::error!(
                "disk cache off for the rest of this process: its writer thread stopped ({panic}); nothing more \
                 is read or written, and nothing waits for it"
            );
        }
        true
    }

    /// The written files as the cache policy sees them (none when the disk cache is off).
    pub(crate) fn views(&self) -> Vec<StoredView<'_>> {
        if self.is_off() {
            return Vec::new();
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.written())
            .map(|(index, entry)| StoredView {
                index,
                tokens: &entry.tokens,
                bytes: usize::try_from(entry.state_bytes).unwrap_or(usize::MAX),
                last_used: entry.used_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |t| t.as_nanos() as u64),
            })
            .collect()
    }

    /// Bytes of the states queued for the writer and not written yet: memory held until they
    /// are, which the RAM budget covers.
    pub(crate) fn pending_bytes(&self) -> usize {
        let pending: u64 = self.entries.iter().filter(|entry| entry.pending()).map(|entry| entry.state_bytes).sum();
        usize::try_from(pending).unwrap_or(usize::MAX)
    }

    /// Whether a state of `bytes` can be written at all (it fits the budget).
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        bytes as u64 <= self.budget
    }

    /// The most recently used written entry: the conversation to restore at start-up.
    pub(crate) fn most_recent(&self) -> Option<usize> {
        if self.is_off() {
            return None;
        }
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.written())
            .max_by_key(|(_, entry)| entry.used_at)
            .map(|(index, _)| index)
    }

    /// Whether an entry holding exactly `tokens` is on disk or being written.
    pub(crate) fn holds(&self, tokens: &[LlamaToken]) -> bool {
        !self.is_off()
            && self.entries.iter().any(|entry| (entry.written() || entry.pending()) && entry.tokens == tokens)
    }

    /// Refuses the entry at `index`, whose state llama.cpp would not take or that did not hold
    /// its header's tokens: a warning naming the file and `reason`, the file removed (kept
    /// for the instance that writes it, when this one reads only).
    pub(crate) fn refuse(&mut self, index: usize, reason: String) {
        let entry = self.entries.swap_remove(index);
        refuse(&entry.path, &Refusal::Rejected(reason), self.writes());
        self.writer.push(Job::Forget(entry.path));
    }

    /// Reads the entry at `index`: its tokens, state and kind. A file that cannot be used any
    /// more is refused (a warning, the file removed) and `None` returned. A file whose last
    /// segments fail their checks serves the state before them (with its tokens, fewer than
    /// the entry's), with a warning; the conversation's next state is then written as a new
    /// base.
    pub(crate) fn load(&mut self, index: usize) -> Option<(Vec<LlamaToken>, SavedState, CacheEntryKind)> {
        if self.is_off() {
            return None;
        }
        let started = Instant::now();
        let entry = &self.entries[index];
        let deltas = entry.slot.deltas.load(Ordering::Relaxed) as usize;
        let read = read_state(&entry.path, &self.fingerprint, deltas).and_then(|mut read| {
            let tokens: Vec<LlamaToken> = read.index.tokens(read.deltas).into_iter().map(LlamaToken).collect();
            if read.deltas < deltas && read.damaged.is_none() {
                read.damaged = Some(format!("it ends after segment {} of {}", read.deltas + 1, deltas + 1));
            }
            let whole = if read.damaged.is_some() { entry.tokens.starts_with(&tokens) } else { tokens == entry.tokens };
            if !whole {
                return Err(Refusal::Header("its tokens changed since it was indexed".into()));
            }
            Ok((tokens, read))
        });
        let (tokens, read) = match read {
            Ok(read) => read,
            Err(refusal) => {
                refuse(&entry.path, &refusal, self.writes());
                let entry = self.entries.swap_remove(index);
                self.writer.push(Job::Forget(entry.path));
                return None;
            }
        };
        let (kind, target_bytes, _) = read.index.state(read.deltas);
        let kind = kind_from_name(kind);
        let drafter_tokens = match read.deltas.checked_sub(1) {
            Some(last) => &read.index.segments[last].header.drafter_tokens,
            None => &read.index.header.drafter_tokens,
        };
        let drafter_tokens: Vec<LlamaToken> = drafter_tokens.iter().map(|&t| LlamaToken(t)).collect();
        let end = read.index.end(read.deltas);
        let delta_bytes = end - read.index.base_end;
        let mut target = read.bytes;
        let drafter = target.split_off(target_bytes as usize);
        let has_drafter = !drafter.is_empty();
        let state = SavedState::from_verified(target, has_drafter.then_some((drafter, drafter_tokens)));
        let now = SystemTime::now();
        let writes = self.writes();
        let entry = &mut self.entries[index];
        // A reader leaves the files as they are, their times included.
        let touched = || std::fs::File::options().write(true).open(&entry.path).and_then(|f| f.set_modified(now));
        if let Err(e) = if writes { touched() } else { Ok(()) } {
            tracing::debug!("disk cache: cannot update {}'s time: {e}", entry.path.display());
        }
        entry.used_at = now;
        if let Some(damage) = read.damaged {
            tracing::warn!(
                "disk cache: {}: {damage}; serving the state before it ({} tokens of {}); the conversation's \
                 next state is written as a new file",
                entry.path.display(),
                tokens.len(),
                entry.tokens.len()
            );
            entry.tokens.clone_from(&tokens);
            entry.kind = kind;
            entry.state_bytes = state.byte_len() as u64;
            entry.slot.deltas.store(read.deltas as u32, Ordering::Relaxed);
            self.writer.push(Job::Forget(entry.path.clone()));
        } else if writes {
            let read_file = ReadFile {
                path: entry.path.clone(),
                tokens: tokens.iter().map(|t| t.0).collect(),
                state: state.clone(),
                deltas: read.deltas as u32,
                delta_bytes,
                end,
            };
            self.writer.push(Job::Sign(read_file));
        }
        tracing::debug!(
            tokens = tokens.len(),
            mib = state.byte_len() >> 20,
            deltas = read.deltas,
            ms = started.elapsed().as_secs_f32() * 1000.0,
            "disk cache: read"
        );
        Some((tokens, state, kind))
    }

    /// Queues `state` (holding `tokens`) for writing, after removing the entries it makes
    /// redundant and, least recently used first, the files that keep it from fitting the
    /// budget. Nothing is written when the state alone exceeds the budget. A state that
    /// continues an entry (the conversation's next turn) goes to that entry's file, the
    /// longest one's if several: the writer appends it as a delta there, or writes a new base
    /// in its place; until then, the file may grow to the larger of its size and the state's.
    /// An instance that reads only writes nothing, unless the one that wrote has stopped: it
    /// then becomes the writer (see [`Self::take_over`]).
    pub(crate) fn save(&mut self, tokens: &[LlamaToken], state: &SavedState, kind: CacheEntryKind) {
        if self.is_off() {
            return;
        }
        let was_reading = !self.writes();
        if !self.access.may_write() {
            tracing::debug!("disk cache: not written: another instance writes this directory");
            return;
        }
        if was_reading {
            self.take_over();
        }
        let bytes = state.byte_len() as u64;
        if bytes > self.budget {
            tracing::debug!(mib = bytes >> 20, "disk cache: a state larger than the budget is not written");
            return;
        }
        self.prune();
        let whole_only = self.whole_only;
        let redundant = |entry: &DiskEntry| {
            entry.tokens == tokens
                || (tokens.starts_with(&entry.tokens) && (entry.kind == CacheEntryKind::Snapshot || !whole_only))
        };
        let continued = self.entries.iter().filter(|entry| redundant(entry)).max_by_key(|entry| entry.tokens.len());
        let estimate = continued.map_or(bytes, |entry| entry.file_bytes().max(bytes));
        let path = continued.map(|entry| entry.path.clone()).unwrap_or_else(|| {
            self.dir.join(format!("{}-{}.{EXTENSION}", self.fingerprint.short_hash(), tokens_hash(tokens)))
        });
        let mut replaces = Vec::new();
        for entry in self.entries.iter_mut().filter(|entry| redundant(entry)) {
            replaces.extend(supersede(entry, entry.path == path));
        }
        self.entries.retain(|entry| entry.written() || entry.pending());
        let slot = Arc::new(Slot::default());
        let header = Header {
            fingerprint: self.fingerprint.clone(),
            kind: kind.as_str().to_string(),
            tokens: tokens.iter().map(|t| t.0).collect(),
            target_bytes: 0,
            drafter_bytes: 0,
            drafter_tokens: state.drafter().map(|(_, tokens)| tokens.iter().map(|t| t.0).collect()).unwrap_or_default(),
        };
        self.entries.push(DiskEntry {
            path: path.clone(),
            tokens: tokens.to_vec(),
            kind,
            state_bytes: bytes,
            estimate,
            used_at: SystemTime::now(),
            slot: Arc::clone(&slot),
            replaces: replaces.clone(),
        });
        self.make_room();
        self.writer.push(Job::Write(Box::new(WriteJob { path, header, state: state.clone(), slot, replaces })));
    }

    /// Indexes the directory again, as the writer now: the instance that wrote it may have
    /// written more, or other files, since this one indexed it.
    fn take_over(&mut self) {
        for entry in std::mem::take(&mut self.entries) {
            self.writer.push(Job::Forget(entry.path));
        }
        if let Err(e) = self.index() {
            tracing::warn!("disk cache: cannot list {}: {e}", self.dir.display());
        }
        self.others = self.list_others();
    }

    /// Drops the entries that were superseded or whose write failed; a failed write's file
    /// holds what it held before (the turn before, for an append): it is indexed again.
    fn prune(&mut self) {
        let failed: Vec<PathBuf> =
            self.entries.iter().filter(|entry| entry.slot.status() == FAILED).map(|entry| entry.path.clone()).collect();
        self.entries.retain(|entry| entry.written() || entry.pending());
        for path in failed {
            if path.exists() && !self.entries.iter().any(|entry| entry.path == path) {
                self.index_file(path);
            }
        }
    }

    /// Removes least recently used files (this engine's written entries and the others' files)
    /// until what is written and being written fits the budget. The others' files are listed
    /// again first: other instances may have written some since.
    fn make_room(&mut self) {
        self.others = self.list_others();
        let mut used = self.used_bytes();
        let foreign = &mut self.others;
        while used > self.budget {
            let own = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, entry)| entry.written())
                .min_by_key(|(_, entry)| entry.used_at)
                .map(|(index, entry)| (index, entry.used_at));
            let other = foreign.iter().enumerate().min_by_key(|(_, file)| file.used_at).map(|(i, f)| (i, f.used_at));
            match (own, other) {
                (Some((index, own_time)), other) if other.is_none_or(|(_, time)| own_time <= time) => {
                    let entry = self.entries.swap_remove(index);
                    tracing::debug!(file = %entry.path.display(), "disk cache: evicted");
                    let _ = std::fs::remove_file(&entry.path);
                    used -= entry.file_bytes();
                    self.writer.push(Job::Forget(entry.path));
                }
                (_, Some((index, _))) => {
                    let file = foreign.swap_remove(index);
                    tracing::debug!(file = %file.path.display(), "disk cache: evicted a file this engine does not use");
                    let _ = std::fs::remove_file(&file.path);
                    used = used.saturating_sub(file.bytes);
                }
                _ => return,
            }
        }
    }

    /// Complete files of the cache directory that are not this engine's entries: other
    /// models' directories, and other instances' files in this model's.
    fn list_others(&self) -> Vec<ForeignFile> {
        let Ok(dirs) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let own: std::collections::HashSet<&Path> = self.entries.iter().map(|entry| entry.path.as_path()).collect();
        dirs.flatten()
            .map(|dir| dir.path())
            .filter(|dir| dir.is_dir())
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flat_map(|files| files.flatten())
            .filter(|file| file.path().extension().and_then(|e| e.to_str()) == Some(EXTENSION))
            .filter(|file| !own.contains(file.path().as_path()))
            .filter_map(|file| {
                let metadata = file.metadata().ok()?;
                let used_at = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                Some(ForeignFile { path: file.path(), bytes: metadata.len(), used_at })
            })
            .collect()
    }

    /// Bytes the cache directory holds (this engine's entries being written included), as
    /// last listed.
    fn used_bytes(&self) -> u64 {
        let own: u64 = self.entries.iter().filter(|e| e.written() || e.pending()).map(DiskEntry::file_bytes).sum();
        own + self.others.iter().map(|file| file.bytes).sum::<u64>()
    }

    /// Waits for the queued files, at most `limit`; false if some were not written (at once
    /// when the disk cache is off).
    pub(crate) fn flush(&self, limit: Duration) -> bool {
        !self.is_off() && self.writer.flush(limit)
    }

    /// The writer's counters, live.
    pub(crate) fn counters(&self) -> DiskCounters {
        self.writer.counters()
    }

    /// What makes the writer wait while the engine computes.
    pub(crate) fn write_hold(&self) -> WriteHold {
        self.writer.hold()
    }

    /// What `GET /cache` shows of the disk cache.
    pub(crate) fn status(&self) -> DiskStatus {
        let counters = self.counters();
        if self.is_off() {
            return DiskStatus {
                dir: self.dir.clone(),
                budget_bytes: self.budget,
                used_bytes: self.used_bytes(),
                bytes_written: counters.bytes_written(),
                signature_bytes: counters.signature_bytes(),
                entries: Vec::new(),
                off: self.off.get().cloned(),
                read_only: self.access.read_only().map(str::to_string),
            };
        }
        let mut entries: Vec<CacheEntryStatus> = self
            .entries
            .iter()
            .filter(|entry| entry.written() || entry.pending())
            .map(|entry| CacheEntryStatus {
                kind: entry.kind,
                tokens: entry.tokens.len() as u32,
                bytes: entry.state_bytes,
                last_used: entry.used_at,
            })
            .collect();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.last_used));
        DiskStatus {
            dir: self.dir.clone(),
            budget_bytes: self.budget,
            used_bytes: self.used_bytes(),
            bytes_written: counters.bytes_written(),
            signature_bytes: counters.signature_bytes(),
            entries,
            off: None,
            read_only: self.access.read_only().map(str::to_string),
        }
    }
}

/// Makes an entry redundant: a pending one is never written, a written one is removed once
/// the entry that replaces it is in place (`same_file`: kept, the newer entry continues its
/// file). Returns the files that entry is to remove: this one's, or what this one was to
/// remove before it was superseded.
fn supersede(entry: &mut DiskEntry, same_file: bool) -> Vec<PathBuf> {
    let fate = if same_file { CONTINUED } else { SUPERSEDED };
    if entry.slot.status.compare_exchange(PENDING, fate, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        return std::mem::take(&mut entry.replaces);
    }
    if entry.written() {
        entry.slot.status.store(fate, Ordering::Release);
        return if same_file { Vec::new() } else { vec![entry.path.clone()] };
    }
    Vec::new()
}

/// Warns about an unusable file and removes it (`removes`: this instance writes; a reader
/// leaves it to the instance that does).
fn refuse(path: &Path, refusal: &Refusal, removes: bool) {
    if !removes {
        tracing::warn!("disk cache: not using {}: {refusal}; left to the instance that writes it", path.display());
        return;
    }
    tracing::warn!("disk cache: refusing {}: {refusal}; the file is removed", path.display());
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!("disk cache: cannot remove {}: {e}", path.display());
    }
}

/// Whether a temporary file's writer is gone (its process no longer runs; where that cannot be
/// told, an hour without change).
fn abandoned(path: &Path) -> bool {
    let Some(pid) = temporary_writer(path) else { return true };
    if pid == std::process::id() {
        return true;
    }
    if cfg!(target_os = "linux") {
        return !Path::new("/proc").join(pid.to_string()).exists();
    }
    let age = std::fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    age.is_none_or(|age| age > Duration::from_secs(3600))
}

/// The directory of a model file: its name and a hash of its absolute path (two models of
/// the same name elsewhere do not share one; a replaced file is refused as another model).
fn model_directory(model_path: &Path) -> String {
    let absolute = std::path::absolute(model_path).unwrap_or_else(|_| model_path.to_path_buf());
    let stem = model_path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let hash = xxhash_rust::xxh3::xxh3_64(absolute.to_string_lossy().as_bytes());
    format!("{stem}-{:08x}", hash >> 32)
}

/// The file name of an entry: a hash of its tokens.
fn tokens_hash(tokens: &[LlamaToken]) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.0.to_le_bytes()).collect();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

fn kind_from_name(name: &str) -> CacheEntryKind {
    if name == CacheEntryKind::Checkpoint.as_str() {
        CacheEntryKind::Checkpoint
    } else {
        CacheEntryKind::Snapshot
    }
}
