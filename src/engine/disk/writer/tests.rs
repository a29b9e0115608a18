use super::*;
use crate::engine::disk::delta::noise;
use crate::engine::disk::file::read_state;
use crate::engine::disk::file::tests::TempDir;
use crate::engine::disk::identity::test_fingerprint;
use crate::engine::disk::FAILPOINTS;

/// A state of `layers` runs (K and V rows of each layer) of `cells` cells of 64 bytes: the
/// first `cells` of each run the same whatever their number, as a conversation's cache is.
fn state(layers: usize, cells: usize) -> Vec<u8> {
    (0..layers).flat_map(|layer| noise(4096 * 64, layer as u64 + 1)[..cells * 64].to_vec()).collect()
}

fn header(tokens: usize) -> Header {
    Header {
        fingerprint: test_fingerprint(),
        kind: "snapshot".into(),
        tokens: (0..tokens as i32).collect(),
        target_bytes: 0,
        drafter_bytes: 0,
        drafter_tokens: Vec::new(),
    }
}

fn job(path: &std::path::Path, tokens: usize, bytes: Vec<u8>, replaces: Vec<PathBuf>) -> (WriteJob, Arc<Slot>) {
    let slot = Arc::new(Slot::default());
    let state = SavedState::from_verified(bytes, None);
    (WriteJob { path: path.to_path_buf(), header: header(tokens), state, slot: Arc::clone(&slot), replaces }, slot)
}

/// Writes `tokens` and `bytes` to `path` and waits for it; returns the slot.
fn write_now(writer: &Writer, path: &std::path::Path, tokens: usize, bytes: Vec<u8>) -> Arc<Slot> {
    let (job, slot) = job(path, tokens, bytes, Vec::new());
    writer.push(Job::Write(Box::new(job)));
    assert!(writer.flush(Duration::from_secs(30)));
    slot
}

fn read(path: &std::path::Path) -> (Vec<i32>, Vec<u8>, usize) {
    let read = read_state(path, &test_fingerprint(), usize::MAX).expect("reads");
    assert_eq!(read.damaged, None);
    (read.index.tokens(read.deltas), read.bytes, read.deltas)
}

#[test]
fn a_conversation_s_next_turns_are_appended_as_deltas_and_cost_what_they_added() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-turns");
    let path = dir.0.join("a.fwkv");
    let writer = Writer::start().expect("writer");
    // 24 runs of 2000 cells, then 10 turns of 40 cells each.
    let first = state(24, 2000);
    let slot = write_now(&writer, &path, 2000, first.clone());
    assert_eq!((slot.status(), slot.deltas.load(Ordering::Relaxed)), (WRITTEN, 0));
    let base = std::fs::metadata(&path).expect("file").len();
    for turn in 1..=10 {
        let cells = 2000 + 40 * turn;
        let slot = write_now(&writer, &path, cells, state(24, cells));
        assert_eq!((slot.status(), slot.deltas.load(Ordering::Relaxed)), (WRITTEN, turn as u32));
        let (tokens, bytes, deltas) = read(&path);
        assert_eq!((tokens.len(), deltas), (cells, turn));
        assert!(bytes == state(24, cells), "turn {turn} reads back as written");
    }
    let file = std::fs::metadata(&path).expect("file").len();
    let last = state(24, 2400).len() as u64;
    let written = writer.counters().bytes_written();
    assert_eq!(written, file, "every byte written is in the file once");
    // What was added: 400 cells of 24 runs; each delta also carries about a block per run.
    let added = 24 * 400 * 64 + 10 * 24 * 2 * 256;
    assert!(file < base + added as u64 + 10 * 1024, "{file} bytes for a base of {base} and {added} added");
    assert!(file < last * 5 / 4, "{file} bytes for a final state of {last}");
    let signatures = writer.counters().signature_bytes();
    assert!(signatures > 0 && signatures < last / 15, "{signatures} bytes of signature for {last}");
}

#[test]
fn a_state_that_changed_entirely_or_another_conversation_is_written_as_a_new_base() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-bases");
    let path = dir.0.join("a.fwkv");
    let writer = Writer::start().expect("writer");
    write_now(&writer, &path, 100, noise(200_000, 1));
    // A recurrent model's state: every byte changes; the delta is not worth it.
    let slot = write_now(&writer, &path, 110, noise(200_000, 2));
    assert_eq!(slot.deltas.load(Ordering::Relaxed), 0);
    assert_eq!(read(&path).1, noise(200_000, 2));
    // Tokens that do not continue the file's (a rewritten history): a new base.
    let mut other = noise(200_000, 2);
    other.extend_from_slice(&[7; 1000]);
    let (mut rewritten, slot) = job(&path, 120, other.clone(), Vec::new());
    rewritten.header.tokens[5] = -1;
    writer.push(Job::Write(Box::new(rewritten)));
    assert!(writer.flush(Duration::from_secs(30)));
    assert_eq!((slot.status(), slot.deltas.load(Ordering::Relaxed)), (WRITTEN, 0));
    assert_eq!(read(&path).1, other);
}

#[test]
fn a_chain_is_written_anew_past_its_segments_or_half_its_state_in_deltas() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-compact");
    let path = dir.0.join("a.fwkv");
    let writer = Writer::start().expect("writer");
    let mut bytes = noise(100_000, 3);
    write_now(&writer, &path, 10, bytes.clone());
    let mut deltas = Vec::new();
    for turn in 1..=40 {
        bytes.extend_from_slice(&noise(300, 100 + 2 * turn));
        deltas.push(write_now(&writer, &path, 10 + turn as usize, bytes.clone()).deltas.load(Ordering::Relaxed));
    }
    let limit = MAX_SEGMENTS - 1;
    assert_eq!(deltas[..limit as usize], (1..=limit).collect::<Vec<_>>()[..], "{deltas:?}");
    assert_eq!(deltas[limit as usize], 0, "the 32nd segment is a new base: {deltas:?}");
    assert_eq!(read(&path).1, bytes);
    let dir = TempDir::new("writer-half");
    let path = dir.0.join("b.fwkv");
    let mut bytes = noise(100_000, 4);
    write_now(&writer, &path, 10, bytes.clone());
    let mut deltas = Vec::new();
    for turn in 1..=4 {
        bytes.extend_from_slice(&noise(35_000, 200 + 2 * turn));
        deltas.push(write_now(&writer, &path, 10 + turn as usize, bytes.clone()).deltas.load(Ordering::Relaxed));
    }
    // 35 KB of deltas, then 70 KB for a state of 170 KB; 105 KB would pass half of 205 KB.
    assert_eq!(deltas, [1, 2, 0, 1], "past half the state in deltas, a new base");
}

#[cfg(feature = "failpoints")]
#[test]
fn a_failed_append_keeps_the_turn_before_and_the_file_it_was_to_replace() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-failed-append");
    let path = dir.0.join("a.fwkv");
    let older = dir.0.join("older.fwkv");
    std::fs::write(&older, b"an older conversation's file").expect("older");
    let writer = Writer::start().expect("writer");
    let first = noise(100_000, 5);
    write_now(&writer, &path, 10, first.clone());
    let length = std::fs::metadata(&path).expect("file").len();

    // A full disk in the middle of the append of the next turn.
    fail::cfg("disk::append", "return").expect("failpoint");
    let mut next = first.clone();
    next.extend_from_slice(&noise(3000, 6));
    let (append, slot) = job(&path, 12, next.clone(), vec![older.clone()]);
    writer.push(Job::Write(Box::new(append)));
    assert!(writer.flush(Duration::from_secs(30)));
    fail::remove("disk::append");
    assert_eq!(slot.status(), FAILED);
    assert_eq!(std::fs::metadata(&path).expect("file").len(), length, "the partial segment is cut off");
    assert_eq!(read(&path), ((0..10).collect(), first.clone(), 0), "the turn before is whole");
    assert!(older.exists(), "what it was to replace is kept: before, it was removed all the same");

    // The append that failed is tried again: the chain is as it was.
    let (append, slot) = job(&path, 12, next.clone(), vec![older.clone()]);
    writer.push(Job::Write(Box::new(append)));
    assert!(writer.flush(Duration::from_secs(30)));
    assert_eq!((slot.status(), slot.deltas.load(Ordering::Relaxed)), (WRITTEN, 1));
    assert_eq!(read(&path).1, next);
    assert!(!older.exists(), "removed once its successor is in place");
}

#[test]
fn a_file_read_back_is_continued_with_a_delta_and_a_forgotten_one_with_a_base() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-sign");
    let path = dir.0.join("a.fwkv");
    let first = noise(100_000, 8);
    // Written by an earlier process.
    let earlier = Writer::start().expect("writer");
    write_now(&earlier, &path, 10, first.clone());
    drop(earlier);
    let writer = Writer::start().expect("writer");
    let end = std::fs::metadata(&path).expect("file").len();
    let state = SavedState::from_verified(first.clone(), None);
    let tokens: Vec<i32> = (0..10).collect();
    writer.push(Job::Sign(ReadFile { path: path.clone(), tokens, state, deltas: 0, delta_bytes: 0, end }));
    let mut next = first.clone();
    next.extend_from_slice(&noise(1000, 9));
    assert_eq!(write_now(&writer, &path, 11, next.clone()).deltas.load(Ordering::Relaxed), 1);
    writer.push(Job::Forget(path.clone()));
    next.extend_from_slice(&noise(1000, 10));
    assert_eq!(write_now(&writer, &path, 12, next.clone()).deltas.load(Ordering::Relaxed), 0);
    assert_eq!(read(&path).1, next);
}

#[test]
fn a_failed_base_keeps_the_file_it_was_to_replace() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-failed-base");
    let path = dir.0.join("a.fwkv");
    let older = dir.0.join("older.fwkv");
    std::fs::write(&older, b"an older conversation's file").expect("older");
    let writer = Writer::start().expect("writer");
    let first = noise(100_000, 5);
    write_now(&writer, &path, 10, first.clone());
    // The temporary name taken (as by a write that crashed): the new base fails.
    let temporary = crate::engine::disk::file::temporary_path(&path);
    std::fs::write(&temporary, b"FWKV partial").expect("partial");
    let (rewrite, slot) = job(&path, 5, noise(100_000, 7), vec![older.clone()]);
    writer.push(Job::Write(Box::new(rewrite)));
    assert!(writer.flush(Duration::from_secs(30)));
    assert_eq!(slot.status(), FAILED);
    assert_eq!(read(&path).1, first, "the file it was to replace is whole");
    assert!(older.exists(), "what it was to replace is kept: before, it was removed all the same");
    let (rewrite, slot) = job(&path, 5, noise(100_000, 7), vec![older.clone()]);
    writer.push(Job::Write(Box::new(rewrite)));
    assert!(writer.flush(Duration::from_secs(30)));
    assert_eq!(slot.status(), WRITTEN);
    assert_eq!(read(&path).1, noise(100_000, 7));
    assert!(!older.exists(), "removed once its successor is in place");
}

/// The writer's thread runs at nice 19, so its checksums and deltas yield the cores to a
/// request being evaluated.
#[cfg(target_os = "linux")]
#[test]
fn the_writer_runs_at_the_lowest_priority() {
    let nice = std::thread::spawn(|| {
        in_the_background();
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("this thread's stat");
        // Fields after the name's closing parenthesis, from the third (state); nice is the 19th.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("name") + 2..].split(' ').collect();
        fields[16].parse::<i32>().expect("nice")
    })
    .join()
    .expect("thread");
    assert_eq!(nice, 19);
}

/// While the engine holds the writer, a queued file waits (a flush in the meantime times
/// out and nothing is on disk); released, it is written.
#[test]
fn a_held_writer_writes_nothing_until_released() {
    let _serial = FAILPOINTS.lock();
    let dir = TempDir::new("writer-held");
    let path = dir.0.join("a.fwkv");
    let writer = Writer::start().expect("writer");
    let hold = writer.hold();
    hold.set(true);
    let (job, slot) = job(&path, 100, state(4, 100), Vec::new());
    writer.push(Job::Write(Box::new(job)));
    assert!(!writer.flush(Duration::from_millis(500)), "held: not written");
    assert_eq!(slot.status(), PENDING);
    assert!(!path.exists());
    hold.set(false);
    assert!(writer.flush(Duration::from_secs(30)));
    assert_eq!(slot.status(), WRITTEN);
    assert_eq!(read(&path).0.len(), 100);
}
