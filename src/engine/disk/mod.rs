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
//! A directory another user could write to is refused (see [`private_dir`]); a writer thread
//! that stopped turns the disk cache off for the rest of the process.

mod file;
mod identity;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use llama_cpp_2::token::LlamaToken;

use self::file::{read_entry, read_header, temporary_writer, Header, Refusal, EXTENSION};
use self::writer::{WriteJob, Writer, PENDING, SUPERSEDED, WRITTEN};
use super::decoder::SavedState;
use super::policy::StoredView;
use super::store::StateBytes;
use super::{CacheEntryKind, CacheEntryStatus, DiskStatus};

pub(crate) use self::identity::{ContextShape, Fingerprint, ModelIdentity};

/// One file of this model's directory.
struct DiskEntry {
    path: PathBuf,
    tokens: Vec<LlamaToken>,
    kind: CacheEntryKind,
    bytes: u64,
    used_at: SystemTime,
    /// Written yet? (see [`writer`]).
    status: Arc<AtomicU8>,
    /// Files a pending entry makes redundant, removed once it is written (see
    /// [`WriteJob::replaces`]); passed on to a newer entry that supersedes it first.
    replaces: Vec<PathBuf>,
}

impl DiskEntry {
    fn written(&self) -> bool {
        self.status.load(Ordering::Acquire) == WRITTEN
    }

    fn pending(&self) -> bool {
        self.status.load(Ordering::Acquire) == PENDING
    }
}

/// A file this engine does not use (another model's, or another instance's of this model),
/// which the budget covers too.
struct ForeignFile {
    path: PathBuf,
    bytes: u64,
    used_at: SystemTime,
}

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
    /// Set once the writer thread is found stopped: the disk cache is then off for the rest
    /// of the process, with this reason.
    off: OnceLock<String>,
}

impl DiskCache {
    /// Opens (creating it) `root`'s directory for the model at `model_path`, indexes the files
    /// in it and refuses (removes) the unusable ones.
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
        let mut cache = Self {
            root: root.to_path_buf(),
            dir,
            budget,
            fingerprint,
            whole_only,
            entries: Vec::new(),
            others: Vec::new(),
            writer: Writer::start()?,
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
                if abandoned(&path) {
                    tracing::info!("disk cache: removing {}, left by an interrupted write", path.display());
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                continue;
            }
            match read_header(&path, &self.fingerprint) {
                Ok((header, payload_bytes)) => {
                    let used_at = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                    let entry = DiskEntry {
                        path,
                        tokens: header.tokens.iter().map(|&t| LlamaToken(t)).collect(),
                        kind: kind_from_name(&header.kind),
                        bytes: payload_bytes,
                        used_at,
                        status: Arc::new(AtomicU8::new(WRITTEN)),
                        replaces: Vec::new(),
                    };
                    self.entries.push(entry);
                }
                Err(Refusal::Mismatch(mismatch)) if mismatch.is_another_instance() => {
                    tracing::info!(
                        "disk cache: skipping {}: {mismatch} (another instance's or configuration's file: kept, \
                         and counted in the budget)",
                        path.display()
                    );
                }
                Err(refusal) => refuse(&path, &refusal),
            }
        }
        Ok(())
    }

    /// The cache directory and what it holds, for the start-up log.
    pub(crate) fn describe(&self) -> String {
        format!(
            "disk cache {}: {} entries for this model, {} MiB of {} MiB in use",
            self.root.display(),
            self.entries.len(),
            self.used_bytes() >> 20,
            self.budget >> 20
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
                bytes: usize::try_from(entry.bytes).unwrap_or(usize::MAX),
                last_used: entry.used_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |t| t.as_nanos() as u64),
            })
            .collect()
    }

    /// Bytes of the states queued for the writer and not written yet: memory held until they
    /// are, which the RAM budget covers.
    pub(crate) fn pending_bytes(&self) -> usize {
        let pending: u64 = self.entries.iter().filter(|entry| entry.pending()).map(|entry| entry.bytes).sum();
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
    /// its header's tokens: a warning naming the file and `reason`, the file removed.
    pub(crate) fn refuse(&mut self, index: usize, reason: String) {
        let entry = self.entries.swap_remove(index);
        refuse(&entry.path, &Refusal::Rejected(reason));
    }

    /// Reads the entry at `index`: its tokens, state and kind. A file that cannot be used any
    /// more is refused (a warning, the file removed) and `None` returned.
    pub(crate) fn load(&mut self, index: usize) -> Option<(Vec<LlamaToken>, SavedState, CacheEntryKind)> {
        if self.is_off() {
            return None;
        }
        let started = Instant::now();
        let entry = &self.entries[index];
        let read = read_entry(&entry.path, &self.fingerprint).and_then(|(header, target, drafter)| {
            let tokens: Vec<LlamaToken> = header.tokens.iter().map(|&t| LlamaToken(t)).collect();
            if tokens != entry.tokens {
                return Err(Refusal::Header("its tokens changed since it was indexed".into()));
            }
            let drafter_tokens = header.drafter_tokens.iter().map(|&t| LlamaToken(t)).collect();
            let drafter = (header.drafter_bytes > 0).then_some((drafter, drafter_tokens));
            Ok((tokens, SavedState::from_verified(target, drafter)))
        });
        match read {
            Ok((tokens, state)) => {
                let now = SystemTime::now();
                let touched = std::fs::File::options().write(true).open(&entry.path).and_then(|f| f.set_modified(now));
                if let Err(e) = touched {
                    tracing::debug!("disk cache: cannot update {}'s time: {e}", entry.path.display());
                }
                let kind = entry.kind;
                tracing::debug!(
                    tokens = tokens.len(),
                    mib = state.byte_len() >> 20,
                    ms = started.elapsed().as_secs_f32() * 1000.0,
                    "disk cache: read"
                );
                self.entries[index].used_at = now;
                Some((tokens, state, kind))
            }
            Err(refusal) => {
                refuse(&entry.path, &refusal);
                self.entries.swap_remove(index);
                None
            }
        }
    }

    /// Queues `state` (holding `tokens`) for writing, after removing the entries it makes
    /// redundant and, least recently used first, the files that keep it from fitting the
    /// budget. Nothing is written when the state alone exceeds the budget.
    pub(crate) fn save(&mut self, tokens: &[LlamaToken], state: &SavedState, kind: CacheEntryKind) {
        if self.is_off() {
            return;
        }
        let bytes = state.byte_len() as u64;
        if bytes > self.budget {
            tracing::debug!(mib = bytes >> 20, "disk cache: a state larger than the budget is not written");
            return;
        }
        self.entries.retain(|entry| entry.written() || entry.pending());
        let whole_only = self.whole_only;
        let mut replaces = Vec::new();
        for entry in &mut self.entries {
            let redundant = entry.tokens == tokens
                || (tokens.starts_with(&entry.tokens) && (entry.kind == CacheEntryKind::Snapshot || !whole_only));
            if redundant {
                replaces.extend(supersede(entry));
            }
        }
        self.entries.retain(|entry| entry.written() || entry.pending());
        self.make_room(bytes);
        let path = self.dir.join(format!("{}-{}.{EXTENSION}", self.fingerprint.short_hash(), tokens_hash(tokens)));
        let status = Arc::new(AtomicU8::new(PENDING));
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
            bytes,
            used_at: SystemTime::now(),
            status: Arc::clone(&status),
            replaces: replaces.clone(),
        });
        self.writer.push(WriteJob { path, header, state: state.clone(), status, replaces });
    }

    /// Removes least recently used files (this engine's written entries and the others' files)
    /// until `bytes` more fit the budget. The others' files are listed again first: other
    /// instances may have written some since.
    fn make_room(&mut self, bytes: u64) {
        self.others = self.list_others();
        let mut used = self.used_bytes();
        let foreign = &mut self.others;
        while used + bytes > self.budget {
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
                    used -= entry.bytes;
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
        let own: u64 = self.entries.iter().filter(|e| e.written() || e.pending()).map(|e| e.bytes).sum();
        own + self.others.iter().map(|file| file.bytes).sum::<u64>()
    }

    /// Waits for the queued files, at most `limit`; false if some were not written (at once
    /// when the disk cache is off).
    pub(crate) fn flush(&self, limit: Duration) -> bool {
        !self.is_off() && self.writer.flush(limit)
    }

    /// What `GET /cache` shows of the disk cache.
    pub(crate) fn status(&self) -> DiskStatus {
        if self.is_off() {
            return DiskStatus {
                dir: self.dir.clone(),
                budget_bytes: self.budget,
                used_bytes: self.used_bytes(),
                entries: Vec::new(),
                off: self.off.get().cloned(),
            };
        }
        let mut entries: Vec<CacheEntryStatus> = self
            .entries
            .iter()
            .filter(|entry| entry.written() || entry.pending())
            .map(|entry| CacheEntryStatus {
                kind: entry.kind,
                tokens: entry.tokens.len() as u32,
                bytes: entry.bytes,
                last_used: entry.used_at,
            })
            .collect();
        entries.sort_by_key(|entry| std::cmp::Reverse(entry.last_used));
        DiskStatus {
            dir: self.dir.clone(),
            budget_bytes: self.budget,
            used_bytes: self.used_bytes(),
            entries,
            off: None,
        }
    }
}

/// Creates `dir` (and its parents) if missing, readable by the user alone (its files hold
/// conversations' tokens), and refuses a directory another user could have planted states
/// in: one owned by another user, or writable by its group or others.
///
/// # Errors
/// It cannot be created or read, or it is not private (the message names it and the fix).
fn private_dir(dir: &Path) -> std::io::Result<()> {
    if !dir.is_dir() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir)?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(dir)?;
        let user = rustix::process::geteuid().as_raw();
        if let Some(problem) = ownership_problem(metadata.uid(), metadata.mode(), user) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} {problem}", dir.display()),
            ));
        }
    }
    Ok(())
}

/// What makes a directory owned by `owner` with `mode` unsafe for `user`'s cache files, with
/// the fix; `None` when it is the user's and only the user's to write.
fn ownership_problem(owner: u32, mode: u32, user: u32) -> Option<String> {
    if owner != user {
        return Some(format!(
            "belongs to user {owner}, not to this process's user {user}: another user could plant states \
             there; use a directory of your own (--cache-dir)"
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by other users (mode {:o}): they could plant states there; run `chmod go-w` on it \
             (or `chmod 700`)",
            mode & 0o7777
        ));
    }
    None
}

/// Makes an entry redundant: a pending one is never written, a written one is removed once
/// the entry that replaces it is in place. Returns the files that entry is to remove: this
/// one's, or what this one was to remove before it was superseded.
fn supersede(entry: &mut DiskEntry) -> Vec<PathBuf> {
    if entry.status.compare_exchange(PENDING, SUPERSEDED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        return std::mem::take(&mut entry.replaces);
    }
    if entry.written() {
        entry.status.store(SUPERSEDED, Ordering::Release);
        return vec![entry.path.clone()];
    }
    Vec::new()
}

/// Warns about an unusable file and removes it.
fn refuse(path: &Path, refusal: &Refusal) {
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

#[cfg(test)]
mod tests {
    use super::{ownership_problem, private_dir};

    #[test]
    fn only_a_directory_of_the_user_s_own_that_others_cannot_write_is_used() {
        assert_eq!(ownership_problem(1000, 0o40700, 1000), None);
        assert_eq!(ownership_problem(1000, 0o40755, 1000), None, "others may read, not write");
        let other_owner = ownership_problem(0, 0o40700, 1000).expect("refused");
        assert!(other_owner.contains("belongs to user 0") && other_owner.contains("--cache-dir"), "{other_owner}");
        let group = ownership_problem(1000, 0o40770, 1000).expect("refused");
        assert!(group.contains("mode 770") && group.contains("chmod"), "{group}");
        assert!(ownership_problem(1000, 0o41777, 1000).is_some(), "sticky or not, others can plant files");
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_others_can_write_to_is_refused_by_name() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("firstword-private-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        private_dir(&dir.join("created")).expect("created for the user alone");
        let mode = std::fs::metadata(dir.join("created")).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let refused = private_dir(&dir).expect_err("writable by others");
        assert!(refused.to_string().starts_with(&dir.display().to_string()), "{refused}");
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        private_dir(&dir).expect("the fix");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
