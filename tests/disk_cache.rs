//! The disk cache: a restarted engine serves the conversation from disk and answers exactly as
//! one that never stopped; files that are damaged (their header included) or were written for
//! another model file, or whose state llama.cpp refuses or does not hold their tokens, are
//! refused (removed) and the answer is a fresh engine's; files of instances with other
//! parameters or templates are kept for them; the budget evicts the least recently used file;
//! a directory other users could write to is not used; of two instances with the same
//! settings, the second reads the first's files only. A conversation's next turn is appended to
//! its file as a delta that costs what the turn added; a last segment cut off or damaged serves
//! the turn before it, with the answers of an engine that never stopped.

mod common;

use std::path::{Path, PathBuf};

use common::{chat, greedy, long_system_prompt, model_path, smollm2_path, test_config, Generated};
use firstword::{CacheMiss, CacheSource, ChatMessage, Engine, EngineConfig, Prompt};
use serde_json::Value;

/// A directory of its own for one test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("firstword-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    /// Every complete cache file under it.
    fn cache_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> =
            walk(&self.0).into_iter().filter(|p| p.extension().is_some_and(|e| e == "fwkv")).collect();
        files.sort();
        files
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a cache file's header ends: `FWKV`, the format version, the header's length and the
/// checksum come first.
fn header_end(bytes: &[u8]) -> usize {
    24 + u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize
}

/// A cache file's header.
fn header_of(path: &Path) -> Value {
    let bytes = std::fs::read(path).expect("read");
    serde_json::from_slice(&bytes[24..header_end(&bytes)]).expect("a JSON header")
}

/// Rewrites the cache file at `path`: its header (as JSON) and its payload go through
/// `change`, the header's length follows; the checksum is computed again only with
/// `checksum_again` (a file changed where no checksum can tell).
fn rewrite(path: &Path, checksum_again: bool, change: impl FnOnce(&mut Value, &mut Vec<u8>)) {
    let bytes = std::fs::read(path).expect("read");
    let end = header_end(&bytes);
    let mut header: Value = serde_json::from_slice(&bytes[24..end]).expect("a JSON header");
    let mut payload = bytes[end..].to_vec();
    change(&mut header, &mut payload);
    let text = serde_json::to_vec(&header).expect("JSON");
    let mut covered = bytes[4..8].to_vec();
    covered.extend_from_slice(&(text.len() as u64).to_le_bytes());
    let mut checksum = bytes[16..24].to_vec();
    if checksum_again {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for part in [&covered[..], &text, &payload] {
            hasher.update(part);
        }
        checksum = hasher.digest().to_le_bytes().to_vec();
    }
    std::fs::write(path, [&b"FWKV"[..], &covered, &checksum, &text, &payload].concat()).expect("write");
}

/// Settings writing sequences of 32 tokens or more to `dir`.
fn config(model: PathBuf, dir: &TempDir) -> EngineConfig {
    EngineConfig { cache_dir: Some(dir.0.clone()), cache_min_tokens: 32, ..test_config(model) }
}

/// Turn 1 of a conversation with a long system prompt, and turn 2 built on turn 1's reply.
fn turns(system_tokens: usize) -> (Vec<ChatMessage>, impl Fn(&str) -> Vec<ChatMessage>) {
    let turn1 =
        vec![ChatMessage::system(long_system_prompt(system_tokens)), ChatMessage::user("Which facts mention trains?")];
    let first = turn1.clone();
    let turn2 = move |reply: &str| {
        let mut messages = first.clone();
        messages.push(ChatMessage::assistant(reply));
        messages.push(ChatMessage::user("And gardens?"));
        messages
    };
    (turn1, turn2)
}

/// Starts an engine, runs one turn, and stops it (the files are written by then).
fn write_one_turn(config: &EngineConfig, prompt: Prompt) -> Generated {
    let engine = Engine::start(config.clone()).expect("model loads");
    let reply = greedy(&engine, prompt, 8);
    drop(engine);
    reply
}

#[test]
fn a_restarted_engine_serves_the_conversation_from_disk_as_one_that_never_stopped() {
    let dir = TempDir::new("restart");
    let config = config(smollm2_path(), &dir);
    let (turn1, turn2) = turns(300);

    let engine = Engine::start(config.clone()).expect("model loads");
    let first = greedy(&engine, chat(&turn1), 12);
    assert_eq!(first.timings.cache.reason, Some(CacheMiss::Cold));
    // The restart comes while the user listens, after the reply's upkeep (the next turn's
    // opening evaluated, as the engine that never stops has it); a shutdown during the upkeep
    // writes the state without it, a split of its own.
    engine.wait_idle_blocking();
    drop(engine);
    assert_eq!(dir.cache_files().len(), 1, "the conversation was written: {:?}", dir.cache_files());
    // The files hold the conversation's tokens: for the user alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
    let file = &dir.cache_files()[0];
    assert_eq!(mode(file), 0o600);
    assert_eq!(mode(file.parent().expect("model dir")), 0o700);

    let restarted = Engine::start(config.clone()).expect("model loads");
    let status = restarted.cache_status();
    let disk = status.disk.clone().expect("the disk cache is on");
    assert_eq!(disk.entries.len(), 1, "{status:?}");
    assert_eq!(status.live_tokens, disk.entries[0].tokens, "the conversation is live before the first request");
    let second = greedy(&restarted, chat(&turn2(&first.text)), 12);
    let cache = second.timings.cache.clone();
    eprintln!("turn 1 {:?}; after the restart {:?} {cache:?}", first.usage, second.usage);
    assert_eq!((cache.source, cache.reason), (CacheSource::Disk, Some(CacheMiss::Restored)), "{cache:?}");
    assert_eq!(cache.restore, None, "restored at start: nothing is read on the turn's way");
    assert!(cache.reused > first.usage.prompt_tokens, "turn 1's prompt and reply come from disk: {cache:?}");

    // An engine that never stopped (and has no disk cache).
    let steady = Engine::start(EngineConfig { cache_dir: None, ..config }).expect("model loads");
    let steady_first = greedy(&steady, chat(&turn1), 12);
    assert_eq!(steady_first.text, first.text);
    let steady_second = greedy(&steady, chat(&turn2(&first.text)), 12);
    assert_eq!(steady_second.usage.cached_tokens, second.usage.cached_tokens, "the same split on both sides");
    assert_eq!(second.text, steady_second.text, "the restored state changed the answer");
}

/// The next turn of a restored conversation is appended to its file as a delta (the writer
/// signed the state it read); a last segment cut off in the middle (a crash during the append)
/// or with a flipped bit serves the turn before it, and the answer is the one the engine gave
/// from that turn; the conversation's next state is then appended where the whole segments end
/// (the cut-off tail dropped) or, after a damaged segment, written as a new base.
#[test]
fn a_turn_is_appended_as_a_delta_and_a_damaged_one_serves_the_turn_before() {
    let dir = TempDir::new("appended");
    let config = config(smollm2_path(), &dir);
    let (turn1, turn2) = turns(300);
    let first = write_one_turn(&config, chat(&turn1));
    let file = dir.cache_files().pop().expect("turn 1's file");
    let base = std::fs::read(&file).expect("read");
    let base_tokens = header_of(&file)["tokens"].as_array().expect("tokens").len();

    // Turn 2, after a restart: turn 1 restored, turn 2 appended.
    let engine = Engine::start(config.clone()).expect("model loads");
    assert_eq!(engine.cache_status().live_tokens as usize, base_tokens);
    let second = greedy(&engine, chat(&turn2(&first.text)), 12);
    let disk = common::settled_cache(&engine).disk.expect("disk cache on");
    drop(engine);
    assert_eq!(dir.cache_files(), std::slice::from_ref(&file), "one file for the conversation");
    let appended = std::fs::read(&file).expect("read");
    assert_eq!(appended[..base.len()], base[..], "turn 1's bytes are untouched");
    assert_eq!(&appended[base.len()..base.len() + 4], b"FWKD", "a delta segment follows");
    let delta = (appended.len() - base.len()) as u64;
    assert_eq!(disk.bytes_written, delta, "this engine wrote the delta alone: {disk:?}");
    let state = disk.entries[0].bytes;
    let added = (disk.entries[0].tokens as usize - base_tokens) as u64;
    eprintln!("base {} bytes, delta {delta} bytes for {added} tokens, state {state}", base.len());
    assert!(delta < state / 10, "the delta costs what the turn added: {delta} of {state}");

    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let damages: [(&str, bool, Damage); 2] = [
        ("cut off in the middle", true, Box::new(|bytes: &mut Vec<u8>| bytes.truncate(bytes.len() - 1000))),
        (
            "a flipped bit",
            false,
            Box::new(|bytes: &mut Vec<u8>| {
                let at = bytes.len() - 100;
                bytes[at] ^= 0x10;
            }),
        ),
    ];
    for (what, appended_again, damage) in damages {
        let mut damaged = appended.clone();
        damage(&mut damaged);
        std::fs::write(&file, &damaged).expect("damage");
        let engine = Engine::start(config.clone()).expect("model loads");
        let status = engine.cache_status();
        assert_eq!(status.live_tokens as usize, base_tokens, "{what}: turn 1 restored: {status:?}");
        let again = greedy(&engine, chat(&turn2(&first.text)), 12);
        assert_eq!(again.usage.cached_tokens, second.usage.cached_tokens, "{what}: the same split");
        assert_eq!(again.text, second.text, "{what}: the answer from turn 1's state");
        engine.wait_idle_blocking();
        drop(engine);
        let rewritten = std::fs::read(&file).expect("read");
        if appended_again {
            assert_eq!(rewritten[..base.len()], base[..], "{what}: appended after turn 1");
            assert_eq!(&rewritten[base.len()..base.len() + 4], b"FWKD", "{what}");
        } else {
            let tokens = header_of(&file)["tokens"].as_array().expect("tokens").len();
            assert!(tokens > base_tokens, "{what}: turn 2 written as a new base ({tokens} tokens)");
        }
        // Either way, the next start restores turn 2.
        let engine = Engine::start(config.clone()).expect("model loads");
        assert_eq!(engine.cache_status().live_tokens, disk.entries[0].tokens, "{what}");
    }
}

/// Damages the one cache file under `dir` with `damage`, starts an engine with `config`, and
/// checks that the file was refused (removed, nothing live) and the first answer is a fresh
/// engine's.
fn refused_after(dir: &TempDir, config: &EngineConfig, prompt: &Prompt, damage: impl FnOnce(&Path)) {
    let files = dir.cache_files();
    assert_eq!(files.len(), 1, "{files:?}");
    damage(&files[0]);
    let engine = Engine::start(config.clone()).expect("model loads");
    let status = engine.cache_status();
    assert_eq!(status.live_tokens, 0, "nothing restored: {status:?}");
    assert!(status.disk.expect("disk cache on").entries.is_empty());
    assert!(!files[0].exists(), "the refused file is removed");
    let answer = greedy(&engine, prompt.clone(), 8);
    assert_eq!(answer.timings.cache.reason, Some(CacheMiss::Cold), "{:?}", answer.timings.cache);
    drop(engine);
    let fresh = Engine::start(EngineConfig { cache_dir: None, ..config.clone() }).expect("model loads");
    assert_eq!(answer.text, greedy(&fresh, prompt.clone(), 8).text);
    // This engine wrote its own file again.
    assert_eq!(dir.cache_files().len(), 1);
}

#[test]
fn truncated_zeroed_and_corrupt_files_are_refused() {
    let dir = TempDir::new("damaged");
    let config = config(smollm2_path(), &dir);
    let (turn1, _) = turns(200);
    let prompt = chat(&turn1);
    write_one_turn(&config, prompt.clone());
    refused_after(&dir, &config, &prompt, |file| {
        let bytes = std::fs::read(file).expect("read");
        std::fs::write(file, &bytes[..bytes.len() / 2]).expect("truncate");
    });
    refused_after(&dir, &config, &prompt, |file| {
        let length = std::fs::metadata(file).expect("metadata").len() as usize;
        std::fs::write(file, vec![0u8; length]).expect("zero");
    });
    refused_after(&dir, &config, &prompt, |file| {
        // A flipped bit in the state: the header is intact, the checksum is not.
        let mut bytes = std::fs::read(file).expect("read");
        let middle = bytes.len() - 1000;
        bytes[middle] ^= 0x10;
        std::fs::write(file, bytes).expect("flip");
    });
}

/// Two instances of one model with other context sizes or templates share a cache directory:
/// each skips the other's files and keeps them (before, each start removed the other's file
/// and both started cold); each restores its own.
#[test]
fn files_of_other_parameters_and_templates_are_kept_for_their_instance() {
    let dir = TempDir::new("instances");
    let config = config(smollm2_path(), &dir);
    let (turn1, _) = turns(200);
    let prompt = chat(&turn1);
    write_one_turn(&config, prompt.clone());
    let first = dir.cache_files();
    assert_eq!(first.len(), 1, "{first:?}");

    let template = dir.0.join("chatml.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .expect("template");
    let others = [
        EngineConfig { ctx_size: Some(2048), ..config.clone() },
        EngineConfig { chat_template_file: Some(template), ..config.clone() },
    ];
    for (i, other) in others.iter().enumerate() {
        // The other instance starts with nothing of its own, leaves the files it finds, and
        // writes its own beside them.
        let engine = Engine::start(other.clone()).expect("model loads");
        let status = engine.cache_status();
        assert_eq!(status.live_tokens, 0, "nothing restored: {status:?}");
        assert!(status.disk.expect("disk cache on").entries.is_empty());
        let answer = greedy(&engine, prompt.clone(), 8);
        assert_eq!(answer.timings.cache.reason, Some(CacheMiss::Cold), "{:?}", answer.timings.cache);
        drop(engine);
        let files = dir.cache_files();
        assert_eq!(files.len(), i + 2, "each instance keeps its own file: {files:?}");
        assert!(first.iter().all(|file| files.contains(file)), "{files:?}");
    }
    // Each instance restores its own file at its next start.
    for own in std::iter::once(&config).chain(&others) {
        let engine = Engine::start(own.clone()).expect("model loads");
        let answer = greedy(&engine, prompt.clone(), 8);
        assert!(answer.usage.cached_tokens > 0, "{:?}", answer.timings.cache);
        assert_eq!(answer.timings.cache.source, CacheSource::Disk, "{:?}", answer.timings.cache);
        drop(engine);
    }
}

/// A file written for another model file behind the same path can never be used again: it is
/// refused and removed.
#[test]
fn files_of_a_replaced_model_are_refused() {
    let dir = TempDir::new("replaced");
    let config = config(smollm2_path(), &dir);
    let link = dir.0.join("model.gguf");
    std::os::unix::fs::symlink(smollm2_path(), &link).expect("symlink");
    let linked = EngineConfig { model_path: link.clone(), ..config.clone() };
    let tokens = Prompt::Tokens((1..200).collect());
    write_one_turn(&linked, tokens.clone());
    std::fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(model_path("tiny-lfm2.gguf"), &link).expect("symlink");
    refused_after(&dir, &linked, &tokens, |_| {});
}

#[test]
fn the_disk_budget_evicts_the_least_recently_used_file() {
    let dir = TempDir::new("budget");
    // About 23 KB per SmolLM2 token: two conversations of ~300 tokens fit, three do not.
    let config = EngineConfig { cache_disk_mib: 16, ..config(smollm2_path(), &dir) };
    let engine = Engine::start(config).expect("model loads");
    let conversation = |topic: &str, system_tokens: usize| {
        vec![ChatMessage::system(format!("{topic}\n{}", long_system_prompt(system_tokens))), ChatMessage::user("Hi.")]
    };
    let on_disk = |engine: &Engine| -> Vec<u32> {
        let mut tokens: Vec<u32> =
            common::settled_cache(engine).disk.expect("disk").entries.iter().map(|e| e.tokens).collect();
        tokens.sort_unstable();
        tokens
    };
    let a = greedy(&engine, chat(&conversation("Topic A.", 250)), 6);
    let b = greedy(&engine, chat(&conversation("Topic B.", 230)), 6);
    let files = on_disk(&engine);
    assert_eq!(
        files.len(),
        2,
        "both fit: a {:?}, b {:?}, {files:?} {:?}",
        a.usage,
        b.usage,
        engine.cache_status().disk
    );
    // A's next turn: its newer file replaces the older one and makes A the most recent.
    let mut a2 = conversation("Topic A.", 250);
    a2.push(ChatMessage::assistant(a.text.as_str()));
    a2.push(ChatMessage::user("Tell me more."));
    let a2_reply = greedy(&engine, chat(&a2), 6);
    let files = on_disk(&engine);
    assert_eq!(files.len(), 2, "{files:?}");
    greedy(&engine, chat(&conversation("Topic C.", 240)), 6);
    let files = on_disk(&engine);
    eprintln!("a {:?}, b {:?}, a2 {:?}: on disk {files:?}", a.usage, b.usage, a2_reply.usage);
    assert_eq!(files.len(), 2, "C evicted one: {files:?}");
    assert!(
        !files.iter().any(|&t| t.abs_diff(b.usage.prompt_tokens) < 16),
        "B, the least recently used, is the one evicted: {files:?}"
    );
    assert!(files.iter().any(|&t| t > a2_reply.usage.prompt_tokens), "A's newest turn stays: {files:?}");
    assert_eq!(dir.cache_files().len(), 2, "the evicted file is gone from disk");
    let used: u64 = walk(&dir.0).iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
    assert!(used <= 16 << 20, "the budget holds: {used} bytes");
}

/// A conversation whose system prompt ends with a door code, asking for it.
fn door_code(code: &str) -> Prompt {
    let system = format!("{}\nThe garage door code is {code}.", long_system_prompt(200));
    chat(&[ChatMessage::system(system), ChatMessage::user("What is the garage door code?")])
}

#[test]
fn a_header_changed_where_it_still_parses_is_refused_and_the_answer_is_a_fresh_engines() {
    let dir = TempDir::new("header");
    let config = config(smollm2_path(), &dir);
    let engine = Engine::start(config.clone()).expect("model loads");
    greedy(&engine, door_code("4719"), 8);
    let written = engine.tokenize_blocking(&door_code("4719")).expect("tokens");
    let asked = engine.tokenize_blocking(&door_code("0719")).expect("tokens");
    drop(engine);
    let changed: Vec<usize> = (0..asked.len()).filter(|&i| written[i] != asked[i]).collect();
    assert_eq!(changed.len(), 1, "one token tells the codes apart: {changed:?}");
    // The state computed for 4719 under a token list that says 0719, its checksum as it was:
    // served, it answered "4719" to a prompt saying 0719 (the header was not checksummed).
    refused_after(&dir, &config, &door_code("0719"), |file| {
        rewrite(file, false, |header, _| header["tokens"][changed[0]] = asked[changed[0]].into());
    });
}

#[test]
fn a_state_that_does_not_hold_its_header_s_tokens_is_refused() {
    let dir = TempDir::new("positions");
    let config = config(smollm2_path(), &dir);
    let (turn1, _) = turns(200);
    let prompt = chat(&turn1);
    write_one_turn(&config, prompt.clone());
    // One token fewer than the state holds, the checksum made to match: only the restored
    // sequence's last position tells.
    refused_after(&dir, &config, &prompt, |file| {
        rewrite(file, true, |header, _| {
            header["tokens"].as_array_mut().expect("tokens").pop();
        });
    });
}

/// Makes the state in the cache file at `path` one llama.cpp refuses (its stream count, the
/// first field, changed), with a checksum that matches, and gives the file `modified` as its
/// time (which decides the most recently used).
fn make_state_unreadable(path: &Path, modified: std::time::SystemTime) {
    rewrite(path, true, |_, payload| payload[..4].copy_from_slice(&2u32.to_le_bytes()));
    std::fs::File::options().write(true).open(path).and_then(|f| f.set_modified(modified)).expect("time");
}

#[test]
fn a_state_llama_cpp_refuses_is_refused_by_its_file_at_start_up() {
    let dir = TempDir::new("refused-state");
    let config = config(smollm2_path(), &dir);
    let (turn1, _) = turns(200);
    let prompt = chat(&turn1);
    write_one_turn(&config, prompt.clone());
    refused_after(&dir, &config, &prompt, |file| make_state_unreadable(file, std::time::SystemTime::now()));
}

#[test]
fn a_state_llama_cpp_refuses_is_tried_once_and_the_live_sequence_serves_instead() {
    let dir = TempDir::new("refused-live");
    let config = config(smollm2_path(), &dir);
    let system = long_system_prompt(300);
    let conversation = |question: &str| vec![ChatMessage::system(system.as_str()), ChatMessage::user(question)];
    // B's own part is long enough that its file spares far more than the shared system prompt:
    // more than the tokens that could be prefilled in the time its read takes (the policy's
    // measured disk margin).
    let b_question = format!(
        "Which facts mention trains? List every one of them with its number, and say for each whether it \
         also mentions a city, a river, a garden or a mountain. {}",
        (1..=60).map(|i| format!("Check fact {i} too.")).collect::<Vec<_>>().join(" ")
    );
    let b_question = b_question.as_str();
    let next_turn = |reply: &str| {
        let mut messages = conversation(b_question);
        messages.push(ChatMessage::assistant(reply));
        messages.push(ChatMessage::user("And gardens?"));
        messages
    };
    // Conversation B, then A: two files, A the most recent.
    let engine = Engine::start(config.clone()).expect("model loads");
    let b = greedy(&engine, chat(&conversation(b_question)), 16);
    engine.wait_idle_blocking();
    let b_file = dir.cache_files();
    assert_eq!(b_file.len(), 1, "{b_file:?}");
    greedy(&engine, chat(&conversation("Which facts mention rivers?")), 8);
    drop(engine);
    assert_eq!(dir.cache_files().len(), 2, "{:?}", dir.cache_files());
    make_state_unreadable(&b_file[0], std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1));

    // A is live after the restart; B's next turn finds B's file, whose state llama.cpp
    // refuses: the file is removed at once, and A, the live sequence, serves what it shares.
    let restarted = Engine::start(config.clone()).expect("model loads");
    assert!(restarted.cache_status().live_tokens > 0, "A was restored");
    let turn2 = chat(&next_turn(&b.text));
    let answer = greedy(&restarted, turn2.clone(), 8);
    let cache = answer.timings.cache.clone();
    eprintln!("B's next turn after the refused file: {:?} {cache:?}", answer.usage);
    assert!(!b_file[0].exists(), "the refused file is removed, never tried again");
    assert_eq!(cache.source, CacheSource::Live, "{cache:?}");
    assert!(cache.reused > 250, "the live sequence kept serving the system prompt: {cache:?}");
    drop(restarted);

    // An engine that never had the file, with the same split.
    let steady = Engine::start(EngineConfig { cache_dir: None, ..config }).expect("model loads");
    greedy(&steady, chat(&conversation("Which facts mention rivers?")), 8);
    let expected = greedy(&steady, turn2, 8);
    assert_eq!(expected.usage.cached_tokens, answer.usage.cached_tokens, "the same split");
    assert_eq!(answer.text, expected.text);
}

#[test]
fn the_header_records_the_flash_attention_llama_cpp_chose() {
    let dir = TempDir::new("flash");
    let config = config(smollm2_path(), &dir);
    assert_eq!(config.flash_attention, firstword::engine::FlashAttention::Auto);
    let (turn1, _) = turns(100);
    write_one_turn(&config, chat(&turn1));
    let header = header_of(&dir.cache_files()[0]);
    let recorded = &header["fingerprint"]["context"]["flash_attention"];
    assert!(recorded == "on" || recorded == "off", "what llama.cpp chose, not the policy: {recorded}");
}

#[test]
fn a_cache_directory_other_users_could_write_to_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("shared");
    let shared = dir.0.join("cache");
    std::fs::create_dir(&shared).expect("dir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let config = EngineConfig { cache_dir: Some(shared.clone()), ..config(smollm2_path(), &dir) };
    let (turn1, _) = turns(100);
    // The server starts and serves; only the disk cache is off.
    let engine = Engine::start(config.clone()).expect("model loads");
    assert!(engine.cache_status().disk.is_none(), "a directory others can write to is not used");
    greedy(&engine, chat(&turn1), 4);
    drop(engine);
    assert!(dir.cache_files().is_empty(), "nothing written there: {:?}", dir.cache_files());
    // Its owner's fix, as the warning says.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let engine = Engine::start(config).expect("model loads");
    assert!(engine.cache_status().disk.is_some());
}

/// Every cache file under `dir`, with its length.
fn files_and_lengths(dir: &TempDir) -> Vec<(PathBuf, u64)> {
    dir.cache_files()
        .into_iter()
        .map(|path| (path.clone(), std::fs::metadata(&path).expect("metadata").len()))
        .collect()
}

/// Two instances with the same settings on one directory: the first writes it; the second
/// restores from it and serves, but writes and removes nothing (the first's conversation goes
/// on in its file, appended, untouched by the second's turns), until the first stops: then the
/// next state the second saves makes it the writer. A restart of the first while the second
/// runs finds its conversation and comes back warm.
#[test]
fn a_second_instance_with_the_same_settings_only_reads_the_first_s_files() {
    let dir = TempDir::new("instances");
    let config = config(smollm2_path(), &dir);
    let (turn1, turn2) = turns(300);
    let first = Engine::start(config.clone()).expect("model loads");
    let one = greedy(&first, chat(&turn1), 8);
    first.wait_idle_blocking();

    let second = Engine::start(config.clone()).expect("model loads");
    let status = second.cache_status();
    assert!(status.live_tokens > one.usage.prompt_tokens, "the second restores the first's file: {status:?}");
    let why = status.disk.expect("on").read_only.expect("the second reads only");
    assert!(why.contains("another instance with the same settings"), "{why}");
    assert_eq!(first.cache_status().disk.expect("on").read_only, None, "the first writes");
    // The first's conversation goes on (a delta appended to its file); the second answers the
    // same conversation otherwise (its state continues that file's) and another one.
    let two = greedy(&first, chat(&turn2(&one.text)), 8);
    first.wait_idle_blocking();
    let written = files_and_lengths(&dir);
    assert_eq!(written.len(), 1, "one conversation, one file: {written:?}");
    let mut otherwise = turn1.clone();
    otherwise.extend([ChatMessage::assistant(&one.text), ChatMessage::user("And rivers?")]);
    let answers = [greedy(&second, chat(&otherwise), 8), greedy(&second, door_code("4711"), 8)];
    second.wait_idle_blocking();
    assert!(answers.iter().all(|answer| answer.usage.completion_tokens > 0), "the second serves");
    assert_eq!(files_and_lengths(&dir), written, "the second instance wrote, cut or removed a file");
    assert_eq!(second.cache_status().disk.expect("on").bytes_written, 0);

    // The first restarts while the second runs: its conversation comes back warm.
    drop(first);
    let restarted = Engine::start(config.clone()).expect("model loads");
    let status = restarted.cache_status();
    assert_eq!(status.live_tokens, status.disk.as_ref().expect("on").entries[0].tokens, "{status:?}");
    let mut turn3 = turn2(&one.text);
    turn3.extend([ChatMessage::assistant(&two.text), ChatMessage::user("And the moon?")]);
    let three = greedy(&restarted, chat(&turn3), 8);
    let cache = three.timings.cache.clone();
    assert_eq!((cache.source, cache.restore), (CacheSource::Disk, None), "restored at start: {cache:?}");
    assert!(cache.reused > two.usage.prompt_tokens, "turn 2's prompt and reply come from disk: {cache:?}");
    restarted.wait_idle_blocking();
    let file = &written[0].0;
    let grown = std::fs::metadata(file).expect("the first's file").len();
    assert!(grown > written[0].1, "turn 3 appended to the first's file");
    drop(restarted);

    // The first gone, the second's next state makes it the writer: a file of its own.
    let more = greedy(&second, door_code("4712"), 8);
    assert!(more.usage.completion_tokens > 0);
    second.wait_idle_blocking();
    let disk = second.cache_status().disk.expect("on");
    assert!(disk.bytes_written > 0 && disk.read_only.is_none(), "the second writes now: {disk:?}");
    assert_eq!(std::fs::metadata(file).expect("the first's file").len(), grown, "the first's file is untouched");
    let files = dir.cache_files();
    assert_eq!(files.len(), 3, "the first's and the second's two conversations: {files:?}");
}

/// A conversation served in a lane (its request came while another reply streamed) is written
/// to disk too when its lane ends: after a restart its next turn comes from its file, and
/// answers as a fresh engine given the same split.
#[test]
fn a_conversation_served_beside_another_reply_is_on_disk_after_a_restart() {
    let dir = TempDir::new("lane");
    let config = EngineConfig { parallel: 3, ..config(smollm2_path(), &dir) };
    let (turn1, turn2) = turns(300);
    let system = turn1[0].clone();
    let story = vec![system, ChatMessage::user("Tell me a long story about a dragon in a kitchen.")];

    let engine = Engine::start(config.clone()).expect("model loads");
    // The story's end of turn banned: it still streams when the other request has ended.
    let end_of_turn: Vec<i32> = ["<|im_end|>", "<|endoftext|>"]
        .iter()
        .filter_map(|text| engine.tokenize_blocking(&Prompt::Text((*text).into())).ok()?.last().copied())
        .collect();
    let story = firstword::GenerationRequest {
        prompt: chat(&story),
        max_tokens: Some(120),
        sampling: firstword::SamplingParams {
            logit_bias: end_of_turn.iter().map(|&token| (token, f32::NEG_INFINITY)).collect(),
            ..firstword::SamplingParams::greedy()
        },
        ..firstword::GenerationRequest::chat(Vec::new())
    };
    let streaming = common::streaming(&engine, story);
    // A reply long enough that its file serves well past the system prompt the story's
    // conversation (live at the restart) shares with it.
    let first = greedy(&engine, chat(&turn1), 48);
    let (story, _) = streaming.join().expect("reader");
    assert!(first.timings.shared.is_some_and(|shared| shared.sequence > 0), "served in a lane: {:?}", first.timings);
    assert_eq!(story.usage.completion_tokens, 120);
    engine.wait_idle_blocking();
    drop(engine);
    assert_eq!(dir.cache_files().len(), 2, "the story and the lane's conversation: {:?}", dir.cache_files());

    let restarted = Engine::start(config.clone()).expect("model loads");
    let prompt = chat(&turn2(&first.text));
    let second = greedy(&restarted, prompt.clone(), 12);
    let cache = second.timings.cache.clone();
    eprintln!("lane turn {:?}; after the restart {:?} {cache:?}", first.usage, second.usage);
    assert_eq!(cache.source, CacheSource::Disk, "{cache:?}");
    assert!(cache.reused > first.usage.prompt_tokens, "the lane's prompt and reply come from disk: {cache:?}");
    let fresh =
        common::fresh_split(&EngineConfig { cache_dir: None, ..config }, &prompt, second.usage.cached_tokens, 12);
    assert_eq!(second.text, fresh.text, "the lane's state from disk answers as a fresh engine");
}
