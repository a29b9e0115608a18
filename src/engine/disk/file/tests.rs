use super::*;
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
        checksum: String::new(),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
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
    assert_eq!(read_header(&path, &fingerprint()).expect("header"), read);
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
        "format version 9, this build reads 1"
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
