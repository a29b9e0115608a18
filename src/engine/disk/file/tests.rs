use super::*;
use crate::engine::disk::delta::noise;
use crate::engine::disk::identity::test_fingerprint;

fn fingerprint() -> Fingerprint {
    test_fingerprint()
}

fn header() -> Header {
    Header {
        fingerprint: fingerprint(),
        kind: "snapshot".into(),
        tokens: vec![1, 2, 3],
        target_bytes: 0,
        drafter_bytes: 0,
        drafter_tokens: Vec::new(),
    }
}

/// The base's header and payload length, as the index reads them.
fn read_header(path: &Path, engine: &Fingerprint) -> Result<(Header, u64), Refusal> {
    read_index(path, engine).map(|index| {
        let payload = index.header.target_bytes + index.header.drafter_bytes;
        (index.header, payload)
    })
}

/// The base's header, target and drafter state, read whole.
fn read_entry(path: &Path, engine: &Fingerprint) -> Result<(Header, Vec<u8>, Vec<u8>), Refusal> {
    read_state(path, engine, 0).map(|mut read| {
        let drafter = read.bytes.split_off(read.index.header.target_bytes as usize);
        (read.index.header, read.bytes, drafter)
    })
}

pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("firstword-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_written_entry_reads_back_whole() {
    let dir = TempDir::new("roundtrip");
    let path = dir.0.join("a.fwkv");
    let target: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    write_entry(&path, header(), &target, b"draft").expect("write");
    let (read, state, drafter) = read_entry(&path, &fingerprint()).expect("read");
    assert_eq!(state, target);
    assert_eq!(drafter, b"draft");
    assert_eq!(read.tokens, vec![1, 2, 3]);
    assert_eq!(read.target_bytes, 100_000);
    assert_eq!(read_header(&path, &fingerprint()).expect("header"), (read, 100_005));
    // Nothing is left under a temporary name.
    assert_eq!(std::fs::read_dir(&dir.0).expect("list").count(), 1);
}

#[test]
fn damaged_files_are_refused_with_the_reason() {
    let dir = TempDir::new("damaged");
    let path = dir.0.join("a.fwkv");
    let target = vec![9u8; 10_000];
    write_entry(&path, header(), &target, &[]).expect("write");
    let bytes = std::fs::read(&path).expect("read");

    std::fs::write(&path, &bytes[..bytes.len() - 100]).expect("truncate");
    let refusal = read_header(&path, &fingerprint()).expect_err("truncated");
    assert!(matches!(refusal, Refusal::Truncated { .. }), "{refusal}");
    std::fs::write(&path, &bytes[..10]).expect("truncate");
    assert!(matches!(read_header(&path, &fingerprint()), Err(Refusal::Truncated { .. })));

    std::fs::write(&path, vec![0u8; bytes.len()]).expect("zero");
    assert!(matches!(read_header(&path, &fingerprint()), Err(Refusal::NotCacheFile)));
    std::fs::write(&path, b"").expect("empty");
    assert!(matches!(read_header(&path, &fingerprint()), Err(Refusal::NotCacheFile)));

    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    std::fs::write(&path, &flipped).expect("flip");
    // The header is intact; the payload is not.
    assert!(read_header(&path, &fingerprint()).is_ok());
    assert!(matches!(read_entry(&path, &fingerprint()), Err(Refusal::Corrupt)));

    let mut versioned = bytes.clone();
    versioned[4] = 9;
    std::fs::write(&path, &versioned).expect("version");
    assert_eq!(
        read_header(&path, &fingerprint()).expect_err("version").to_string(),
        "format version 9, this build reads 3"
    );

    std::fs::write(&path, &bytes).expect("restore");
    let mut other = fingerprint();
    other.context.n_ctx = 1024;
    let refusal = read_header(&path, &other).expect_err("other parameters");
    assert_eq!(refusal.to_string(), "written with other context parameters (context size 4096, now 1024)");
}

#[test]
fn an_interrupted_write_leaves_no_file_under_the_final_name() {
    let dir = TempDir::new("interrupted");
    let path = dir.0.join("a.fwkv");
    // The temporary name is taken (as by a write that crashed): this write fails, and it
    // leaves nothing behind under the final name.
    std::fs::write(temporary_path(&path), b"FWKV partial").expect("partial");
    assert!(write_entry(&path, header(), &[1, 2, 3], &[]).is_err());
    assert!(!path.exists());
    assert_eq!(temporary_writer(&temporary_path(&path)), Some(std::process::id()));
    assert_eq!(temporary_writer(&path), None);
}

/// The bytes of a file in this build's layout holding `header` (any JSON) and `payload`, with
/// a valid checksum: what a damaged header that still parses looks like.
fn raw_file(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut covered = FORMAT_VERSION.to_le_bytes().to_vec();
    covered.extend_from_slice(&(header.len() as u64).to_le_bytes());
    let mut hasher = Xxh3::new();
    hasher.update(&covered);
    hasher.update(header);
    hasher.update(payload);
    [&MAGIC[..], &covered, &hasher.digest().to_le_bytes(), header, payload].concat()
}

#[test]
fn sizes_that_add_up_to_the_length_only_by_wrapping_are_refused_without_allocating() {
    let dir = TempDir::new("wrapping");
    let path = dir.0.join("a.fwkv");
    let payload = [7u8; 16];
    // 2^62 + (2^64 - 2^62 + 16) wraps to 16, the payload's real length: unchecked, the sizes
    // passed the length check and the read allocated 2^62 bytes (an abort at every start-up).
    let mut header = serde_json::to_value(header()).expect("header");
    header["target_bytes"] = (1u64 << 62).into();
    header["drafter_bytes"] = (0u64.wrapping_sub(1 << 62) + 16).into();
    let text = serde_json::to_vec(&header).expect("JSON");
    std::fs::write(&path, raw_file(&text, &payload)).expect("write");
    let refusal = read_header(&path, &fingerprint()).expect_err("oversized");
    assert_eq!(
        refusal.to_string(),
        "damaged header: state sizes of 4611686018427387904 and 13835058055282163728 bytes"
    );
    assert!(matches!(read_entry(&path, &fingerprint()), Err(Refusal::Oversized { .. })));

    // A size past the file's length, or sizes each within it but together past it: refused
    // by the length, before anything is read.
    for (target, drafter) in [(1u64 << 62, 0u64), (16, 16)] {
        header["target_bytes"] = target.into();
        header["drafter_bytes"] = drafter.into();
        let text = serde_json::to_vec(&header).expect("JSON");
        std::fs::write(&path, raw_file(&text, &payload)).expect("write");
        assert!(matches!(read_header(&path, &fingerprint()), Err(Refusal::Truncated { .. })));
        assert!(matches!(read_entry(&path, &fingerprint()), Err(Refusal::Truncated { .. })));
    }
}

#[test]
fn a_changed_header_digit_is_refused_as_corrupt() {
    let dir = TempDir::new("header-digit");
    let path = dir.0.join("a.fwkv");
    let mut tokens = header();
    tokens.tokens = vec![4719, 12, 13];
    write_entry(&path, tokens, &[5u8; 1000], &[]).expect("write");
    let bytes = std::fs::read(&path).expect("read");
    // The same length, still valid JSON, another token list (4719 becomes 3719).
    let at = bytes.windows(4).position(|w| w == b"4719").expect("the token id in the header");
    let mut changed = bytes.clone();
    changed[at] = b'3';
    std::fs::write(&path, &changed).expect("change");
    let (read, _) = read_header(&path, &fingerprint()).expect("the header parses");
    assert_eq!(read.tokens, vec![3719, 12, 13]);
    let refusal = read_entry(&path, &fingerprint()).expect_err("the checksum covers the header");
    assert!(matches!(refusal, Refusal::Corrupt), "{refusal}");
    // And the header's length field.
    let mut lengthened = bytes.clone();
    lengthened[8] ^= 1;
    std::fs::write(&path, &lengthened).expect("change");
    assert!(read_entry(&path, &fingerprint()).is_err());
}

#[test]
fn files_of_the_first_layout_are_refused_by_version() {
    let dir = TempDir::new("version-1");
    let path = dir.0.join("a.fwkv");
    let mut bytes = raw_file(b"{}", &[]);
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    assert_eq!(read_header(&path, &fingerprint()).expect_err("v1").to_string(), "format version 1, this build reads 3");
}

#[test]
fn a_token_list_longer_than_the_context_is_refused() {
    let dir = TempDir::new("long");
    let path = dir.0.join("a.fwkv");
    let mut long = header();
    long.tokens = vec![1; 4097];
    write_entry(&path, long, &[1, 2, 3], &[]).expect("write");
    let refusal = read_header(&path, &fingerprint()).expect_err("longer than n_ctx 4096");
    assert_eq!(refusal.to_string(), "damaged header: 4097 tokens in a context of 4096");
}

/// A file of three turns: a base of 60 KB, then two deltas adding 3 KB each. Returns the
/// states, the tokens of each turn, and where each segment ends.
fn three_turns(path: &Path) -> (Vec<Vec<u8>>, Vec<Vec<i32>>, Vec<u64>) {
    let mut states = vec![[noise(30_000, 1), noise(30_000, 2)].concat()];
    states.push([&states[0][..], &noise(3000, 3)].concat());
    states.push([&states[1][..], &noise(3000, 4)].concat());
    let tokens: Vec<Vec<i32>> = vec![(0..10).collect(), (0..14).collect(), (0..17).collect()];
    let mut ends =
        vec![write_entry(path, Header { tokens: tokens[0].clone(), ..header() }, &states[0], &[]).expect("base")];
    for turn in 1..3 {
        let delta = crate::engine::disk::delta::StateSignature::of(&states[turn - 1])
            .diff(&states[turn], states[turn].len())
            .expect("a delta");
        let header = DeltaHeader {
            kind: "snapshot".into(),
            tokens: tokens[turn][tokens[turn - 1].len()..].to_vec(),
            drafter_tokens: Vec::new(),
            target_bytes: states[turn].len() as u64,
            drafter_bytes: 0,
            delta_bytes: 0,
            state_hash: xxhash_rust::xxh3::xxh3_64(&states[turn]),
        };
        let at = ends[turn - 1];
        ends.push(at + append_segment(path, at, header, &delta).expect("append"));
    }
    assert_eq!(std::fs::metadata(path).expect("file").len(), ends[2]);
    (states, tokens, ends)
}

#[test]
fn each_turn_of_a_file_reads_back_and_the_index_reads_headers_only() {
    let dir = TempDir::new("chain");
    let path = dir.0.join("a.fwkv");
    let (states, tokens, ends) = three_turns(&path);
    assert!(ends[2] - ends[0] < 7000, "the deltas cost what they add: {ends:?}");
    let index = read_index(&path, &fingerprint()).expect("index");
    assert_eq!((index.segments.len(), index.tokens(2)), (2, tokens[2].clone()));
    assert_eq!(index.state(2), ("snapshot", states[2].len() as u64, 0));
    for turn in 0..3 {
        let read = read_state(&path, &fingerprint(), turn).expect("read");
        assert_eq!((read.deltas, read.damaged.as_deref()), (turn, None));
        assert!(read.bytes == states[turn], "turn {turn}");
        assert_eq!(read.index.tokens(turn), tokens[turn]);
        assert_eq!(read.index.end(turn), ends[turn]);
    }
}

#[test]
fn a_truncated_last_segment_is_ignored_and_the_next_append_cuts_it_off() {
    let dir = TempDir::new("chain-truncated");
    let path = dir.0.join("a.fwkv");
    let (states, tokens, ends) = three_turns(&path);
    // A crash in the middle of the third turn's append.
    for cut in [ends[1] + 10, ends[1] + 200, ends[2] - 1] {
        std::fs::File::options().write(true).open(&path).and_then(|f| f.set_len(cut)).expect("truncate");
        let index = read_index(&path, &fingerprint()).expect("the base and the first delta are whole");
        assert_eq!(index.segments.len(), 1, "cut at {cut}");
        assert_eq!(index.tokens(1), tokens[1]);
        let read = read_state(&path, &fingerprint(), 2).expect("read");
        assert_eq!(read.deltas, 1);
        assert!(read.bytes == states[1], "the turn before");
    }
    // The next append goes where the last whole segment ends.
    let delta = crate::engine::disk::delta::StateSignature::of(&states[1]).diff(&states[2], 1 << 20).expect("delta");
    let header = DeltaHeader {
        kind: "snapshot".into(),
        tokens: tokens[2][14..].to_vec(),
        drafter_tokens: Vec::new(),
        target_bytes: states[2].len() as u64,
        drafter_bytes: 0,
        delta_bytes: 0,
        state_hash: xxhash_rust::xxh3::xxh3_64(&states[2]),
    };
    append_segment(&path, ends[1], header, &delta).expect("append");
    let read = read_state(&path, &fingerprint(), 2).expect("read");
    assert_eq!((read.deltas, read.damaged), (2, None));
    assert!(read.bytes == states[2]);
}

#[test]
fn a_damaged_last_segment_serves_the_turn_before() {
    let dir = TempDir::new("chain-flipped");
    let path = dir.0.join("a.fwkv");
    let (states, _, ends) = three_turns(&path);
    let bytes = std::fs::read(&path).expect("read");
    // A flipped bit in the last delta, in its header, in its checksum: never the last turn.
    for at in [ends[2] - 10, ends[1] + 40, ends[1] + 20] {
        let mut flipped = bytes.clone();
        flipped[at as usize] ^= 0x04;
        std::fs::write(&path, &flipped).expect("flip");
        let read = read_state(&path, &fingerprint(), 2).expect("the base is whole");
        assert_eq!(read.deltas, 1, "flipped at {at}");
        assert!(read.bytes == states[1], "the turn before");
    }
    // Flipped in the last delta's bytes: its header still parses, the read says why it stopped.
    let mut flipped = bytes.clone();
    flipped[ends[2] as usize - 10] ^= 0x04;
    std::fs::write(&path, &flipped).expect("flip");
    assert_eq!(read_index(&path, &fingerprint()).expect("index").segments.len(), 2);
    let read = read_state(&path, &fingerprint(), 2).expect("read");
    assert_eq!(read.damaged.as_deref(), Some("segment 3 of 3: corrupt: checksum mismatch"));
    // A delta whose checksum matches but whose result does not (a wrong match at write time).
    let mut header: DeltaHeader = {
        let index = read_index(&path, &fingerprint()).expect("index");
        index.segments[1].header.clone()
    };
    std::fs::write(&path, &bytes[..ends[1] as usize]).expect("cut");
    header.state_hash ^= 1;
    let delta = crate::engine::disk::delta::StateSignature::of(&states[1]).diff(&states[2], 1 << 20).expect("delta");
    append_segment(&path, ends[1], header, &delta).expect("append");
    let read = read_state(&path, &fingerprint(), 2).expect("read");
    assert_eq!(read.deltas, 1);
    assert_eq!(read.damaged.as_deref(), Some("segment 3 of 3: the state it makes does not match its checksum"));
}
