//! The state store: a request with another prefix (an interleaved job) no longer costs a
//! conversation its KV cache. Before such a request cuts the live sequence, the sequence's
//! state is saved in host RAM; a later request that shares more with a saved entry than with
//! the live sequence gets the entry back and prefills only the rest.
//!
//! Every test that could pass with the store doing nothing compares with a store-off run or
//! asserts cached counts only a restore reaches. Correctness is checked as in
//! cache_correctness.rs: greedy output of a restored turn equals that of a fresh context that
//! evaluates the same token split (prefix, then suffix).
//!
//! The engines here serve one sequence ([`common::one_sequence_config`]): with several
//! (`--parallel`), a displaced conversation is first kept in its cells and continued there
//! (tests/together.rs), where other conversations' cells change llama.cpp's sums
//! (docs/serving.md).

mod common;

use common::one_sequence_config as test_config;
use common::{gemma3_path, gemma_turns, generate, long_system_prompt, smollm2_path, Generated};
use firstword::{ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, SamplingParams, Usage};
use serde_json::json;

/// Slack between a turn's `prompt_tokens` and what the next turn of the same conversation may
/// reuse: the reply's tokens near the end of turn 1 may be re-split by the next turn's text.
const SLACK: u32 = 8;

/// Most tokens two unrelated prompts share (the chat template's opening).
const UNRELATED: u32 = 50;

/// One greedy request to the end; returns the text and the usage.
fn run(engine: &Engine, prompt: Prompt, max_tokens: u32) -> (String, Usage) {
    let request = GenerationRequest {
        prompt,
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(Vec::new())
    };
    let Generated { text, usage, .. } = generate(engine, request);
    (text, usage)
}

fn chat(messages: Vec<ChatMessage>) -> Prompt {
    Prompt::chat(messages, Vec::new())
}

/// A long system prompt that shares no text with [`long_system_prompt`] (about
/// `approx_tokens` tokens): the prompt of another job.
fn museum_system_prompt(approx_tokens: usize) -> String {
    let halls = ["east", "north", "glass", "stone", "river", "orchard"];
    let mut text = String::from("Museum guide notes, for visitors asking where things are.\n");
    let mut i = 0;
    while text.len() * 3 / 8 < approx_tokens {
        text.push_str(&format!(
            "Exhibit {i}: the {} hall shows item {} from the year {}.\n",
            halls[i % halls.len()],
            i * 11 % 89,
            1500 + i * 29 % 400
        ));
        i += 1;
    }
    text
}

/// The interleaved job: an unrelated chat prompt of several hundred tokens.
fn interleaved_job(engine: &Engine) -> Usage {
    let prompt = chat(vec![ChatMessage::system(museum_system_prompt(600)), ChatMessage::user("Where is exhibit 4?")]);
    let (_, usage) = run(engine, prompt, 8);
    assert!(usage.prompt_tokens >= 300, "the interleaved job is long enough to matter: {usage:?}");
    assert!(usage.cached_tokens < UNRELATED, "the interleaved job shares next to nothing: {usage:?}");
    usage
}

/// A conversation: its messages so far.
struct Conversation {
    messages: Vec<ChatMessage>,
}

impl Conversation {
    fn new(system: &str, first: &str) -> Self {
        Self { messages: vec![ChatMessage::system(system), ChatMessage::user(first)] }
    }

    /// The next turn: the prompt so far, answered greedily; the reply is kept and `next`, if
    /// any, becomes the next user message.
    fn turn(&mut self, engine: &Engine, max_tokens: u32, next: &str) -> (String, Usage) {
        let (reply, usage) = run(engine, chat(self.messages.clone()), max_tokens);
        assert!(!reply.is_empty(), "a reply: {usage:?}");
        self.messages.push(ChatMessage::assistant(reply.clone()));
        self.messages.push(ChatMessage::user(next));
        (reply, usage)
    }

    fn prompt(&self) -> Prompt {
        chat(self.messages.clone())
    }
}

/// Turn 1 of a ~1500-token conversation, an interleaved job, then turn 2; returns the two
/// turns' usages.
fn interleaved_conversation(config: EngineConfig) -> (Usage, Usage) {
    let engine = Engine::start(config).expect("model loads");
    let system = long_system_prompt(1500);
    let mut conversation = Conversation::new(&system, "Which facts mention trains?");
    let (_, turn1) = conversation.turn(&engine, 24, "And gardens?");
    assert!(turn1.prompt_tokens > 1000, "a long conversation: {turn1:?}");
    interleaved_job(&engine);
    let (_, turn2) = conversation.turn(&engine, 24, "Thanks.");
    (turn1, turn2)
}

#[test]
fn an_interleaved_job_does_not_cost_the_conversation_its_cache() {
    let (turn1, turn2) = interleaved_conversation(test_config(smollm2_path()));
    eprintln!("store on: turn 1 {turn1:?}, turn 2 {turn2:?}");
    assert!(
        turn2.cached_tokens + SLACK >= turn1.prompt_tokens,
        "turn 2 reuses turn 1 from the store: cached {} of turn 1's {} prompt tokens",
        turn2.cached_tokens,
        turn1.prompt_tokens
    );

    // The same sequence with the store off loses the conversation's cache: the store did it.
    let off = EngineConfig { cache_ram_mib: 0, ..test_config(smollm2_path()) };
    let (off1, off2) = interleaved_conversation(off);
    eprintln!("store off: turn 1 {off1:?}, turn 2 {off2:?}");
    assert_eq!(off1.prompt_tokens, turn1.prompt_tokens);
    assert!(off2.cached_tokens < UNRELATED, "without the store turn 2 starts over: {off2:?}");
}

#[test]
fn a_conversation_shorter_than_cache_min_tokens_is_not_saved() {
    let config = EngineConfig { cache_min_tokens: 3000, ..test_config(smollm2_path()) };
    let (turn1, turn2) = interleaved_conversation(config);
    eprintln!("cache_min_tokens 3000: turn 1 {turn1:?}, turn 2 {turn2:?}");
    assert!(turn1.prompt_tokens + 100 < 3000);
    assert!(turn2.cached_tokens < UNRELATED, "a sequence under cache_min_tokens is not saved: {turn2:?}");
}

#[test]
fn two_alternating_conversations_both_stay_cached() {
    let engine = Engine::start(test_config(smollm2_path())).expect("model loads");
    let mut a = Conversation::new(&long_system_prompt(1200), "Which facts mention trains?");
    let mut b = Conversation::new(&museum_system_prompt(1200), "Where is exhibit 4?");
    let (_, a1) = a.turn(&engine, 16, "And gardens?");
    let (_, b1) = b.turn(&engine, 16, "And exhibit 9?");
    assert!(a1.prompt_tokens > 800 && b1.prompt_tokens > 800, "{a1:?} {b1:?}");
    assert!(b1.cached_tokens < UNRELATED, "the conversations share next to nothing: {b1:?}");
    let (_, a2) = a.turn(&engine, 16, "Anything about harbors?");
    let (_, b2) = b.turn(&engine, 16, "Which hall is the largest?");
    let (_, a3) = a.turn(&engine, 16, "Thanks.");
    eprintln!("A1 {a1:?}\nB1 {b1:?}\nA2 {a2:?}\nB2 {b2:?}\nA3 {a3:?}");
    each_continues_its_previous_turn([("A2", a1, a2), ("B2", b1, b2), ("A3", a2, a3)]);
}

/// Each named turn reused all of its conversation's previous turn (but [`SLACK`] tokens).
fn each_continues_its_previous_turn(turns: [(&str, Usage, Usage); 3]) {
    for (name, previous, turn) in turns {
        assert!(
            turn.cached_tokens + SLACK >= previous.prompt_tokens,
            "{name} continues its conversation's previous turn: cached {} of the previous turn's {} prompt tokens",
            turn.cached_tokens,
            previous.prompt_tokens
        );
    }
}

/// Two satellites with the same system prompt take turns: each displaces the other, which
/// loses only its own turns (far fewer than `cache_min_tokens`), and is saved all the same
/// because the prompt leaves it before its last reply (another conversation). Each turn then
/// continues its own conversation from the store. With `cache_min_tokens` as the only rule
/// (before), B2 and A3 re-evaluated everything after the system prompt.
#[test]
fn two_conversations_sharing_the_system_prompt_keep_their_own_turns() {
    let config = test_config(smollm2_path());
    let min_save = config.cache_min_tokens;
    let engine = Engine::start(config).expect("model loads");
    let system = long_system_prompt(1200);
    // Own turns of some 40 tokens and 24-token replies: a loss well past the restore margin
    // (and the copy's cost on this CPU), well short of cache_min_tokens.
    let mut a = Conversation::new(
        &system,
        "Which of these facts mention trains, stations or railways? Answer in two short sentences, please, and name them.",
    );
    let mut b = Conversation::new(
        &system,
        "Turn on the office light and the desk lamp, please, then tell me in one sentence which lights are on now.",
    );
    let (_, a1) = a.turn(&engine, 24, "And gardens?");
    let (_, b1) = b.turn(&engine, 24, "And the kitchen?");
    assert!(b1.cached_tokens > 800, "B shares A's system prompt: {b1:?}");
    let own = b1.prompt_tokens - b1.cached_tokens;
    assert!(own + 24 + SLACK < min_save, "B's own turn is short of cache_min_tokens ({min_save}): {b1:?}");
    let (_, a2) = a.turn(&engine, 24, "Anything about harbors?");
    let (_, b2) = b.turn(&engine, 24, "Thanks.");
    let (_, a3) = a.turn(&engine, 24, "Thanks.");
    eprintln!("A1 {a1:?}\nB1 {b1:?}\nA2 {a2:?}\nB2 {b2:?}\nA3 {a3:?}");
    each_continues_its_previous_turn([("A2", a1, a2), ("B2", b1, b2), ("A3", a2, a3)]);
}

/// A fresh engine with the store off evaluates `prompt` split as the restored turn was:
/// its first `cached` tokens alone (no generation), then the rest; returns the greedy text.
fn fresh_split(config: &EngineConfig, prompt: &Prompt, usage: Usage, max_tokens: u32) -> String {
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config.clone() }).expect("model loads");
    let tokens = fresh.tokenize_blocking(prompt).expect("tokenize");
    assert_eq!(tokens.len() as u32, usage.prompt_tokens);
    let keep = usage.cached_tokens as usize;
    if keep > 0 {
        // The prefix alone, so the suffix is a batch of its own.
        let (_, prefix_usage) = run(&fresh, Prompt::Tokens(tokens[..keep].to_vec()), 0);
        assert_eq!(prefix_usage.completion_tokens, 0);
    }
    let (text, fresh_usage) = run(&fresh, Prompt::Tokens(tokens), max_tokens);
    assert_eq!(fresh_usage.cached_tokens, usage.cached_tokens, "same split on both sides");
    text
}

/// A SmolLM2 conversation's turn 1 (the reply is kept), optionally an interleaved job, then
/// turn 2 (greedy); returns turn 1's usage, and turn 2's text and usage.
fn smollm2_turn2(engine: &Engine, interleave: bool) -> (Usage, String, Usage) {
    let mut conversation = Conversation::new(&long_system_prompt(1500), "Which facts mention trains?");
    let (_, turn1) = conversation.turn(engine, 24, "And gardens? Answer in one sentence.");
    if interleave {
        interleaved_job(engine);
    }
    let (text, turn2) = run(engine, conversation.prompt(), 32);
    (turn1, text, turn2)
}

/// The restored turn extends the saved one (its reply included). A fresh split is no exact
/// reference here: SmolLM2's live cache, which evaluated the reply a token at a time, already
/// differs from a fresh context prefilling the same prefix in one batch (measured). The exact
/// reference is the same conversation on a fresh engine with the store off and no interleaved
/// job: its live cache holds what was saved, so the restored turn must match it bit for bit.
/// (A cut inside the prompt, checked against a fresh split, is
/// [`an_entry_sharing_k_tokens_is_never_used_beyond_k`].)
#[test]
fn greedy_output_after_a_restore_equals_a_fresh_context_smollm2() {
    // Both engines compute with the same threads: the governor picks fewer under other load,
    // and a bit-for-bit comparison must not rest on the load being the same for both.
    let config = test_config(smollm2_path());
    let engine = Engine::start(config.clone()).expect("model loads");
    let (turn1, restored_text, turn2) = smollm2_turn2(&engine, true);
    drop(engine);
    eprintln!("turn 1 {turn1:?}, restored turn 2 {turn2:?}");
    assert!(
        turn2.cached_tokens + SLACK >= turn1.prompt_tokens,
        "turn 2 is served from the restored entry: cached {} of {}",
        turn2.cached_tokens,
        turn1.prompt_tokens
    );
    assert!(!restored_text.is_empty());

    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config }).expect("model loads");
    let (_, live_text, live) = smollm2_turn2(&fresh, false);
    eprintln!("never interleaved: turn 2 {live:?}");
    assert_eq!(turn2.prompt_tokens, live.prompt_tokens);
    assert_eq!(turn2.cached_tokens, live.cached_tokens, "the restore reuses what the live cache would have");
    assert_eq!(restored_text, live_text, "the restore changed the output (cut at {})", turn2.cached_tokens);
}

/// Cut on gemma-3: a multiple of the 512-token ubatch (see cache_correctness.rs: gemma-3's
/// Q4_K CPU kernels make a token's KV depend on its batch's size, so only a cut on a ubatch
/// boundary lets both sides compute the prefix in identical batches).
const GEMMA_CUT: usize = 1536;

/// On gemma-3 (token prompts): a conversation of `base[..1560]` and a question, an
/// interleaved job, then `base[..GEMMA_CUT]` and another question, whose longest share is
/// with the saved conversation, exactly `GEMMA_CUT` tokens. Its greedy output must equal a
/// fresh context's with the same split. Returns the restored turn's cached count.
fn gemma_restore_matches_fresh_split(config: &EngineConfig) -> u32 {
    let engine = Engine::start(config.clone()).expect("gemma loads");
    let tokenize = |text: &str| engine.tokenize_blocking(&Prompt::Text(text.to_string())).expect("tokenize");
    let (turn1, prompt) = gemma_turns(&engine, 1560, GEMMA_CUT);
    let (_, usage1) = run(&engine, turn1, 24);
    let other = tokenize(&museum_system_prompt(600));
    let (_, interleaved) = run(&engine, Prompt::Tokens(other), 8);
    assert!(interleaved.cached_tokens < UNRELATED, "{interleaved:?}");
    let (restored_text, usage2) = run(&engine, prompt.clone(), 32);
    drop(engine);
    eprintln!("swa_full {}: turn 1 {usage1:?}, restored turn {usage2:?}", config.swa_full);
    assert!(usage2.cached_tokens as usize <= GEMMA_CUT, "never beyond the shared prefix: {usage2:?}");
    assert!(!restored_text.is_empty());
    let fresh_text = fresh_split(config, &prompt, usage2, 32);
    assert_eq!(restored_text, fresh_text, "the restore changed the output (cut at {})", usage2.cached_tokens);
    usage2.cached_tokens
}

#[test]
fn a_cut_inside_a_gemma_entry_is_not_restored_and_output_equals_a_fresh_context_full_swa() {
    let config = test_config(gemma3_path());
    assert!(config.swa_full, "full SWA cache is the default");
    let cached = gemma_restore_matches_fresh_split(&config);
    // A restored sliding-window state holds only the last `n_swa` positions (llama.cpp's
    // state API, measured: pos_min 1082 after restoring 1594 tokens), so a gemma entry is
    // continued only from its end (see the extension test below): a cut inside it is not
    // served from the store, and certainly not past the window it lost.
    assert!(cached < UNRELATED, "a cut inside a gemma entry is not restored: {cached}");
}

#[test]
fn a_cut_inside_a_gemma_entry_is_not_restored_and_output_equals_a_fresh_context_small_swa() {
    let config = EngineConfig { swa_full: false, ..test_config(gemma3_path()) };
    let cached = gemma_restore_matches_fresh_split(&config);
    assert!(cached < UNRELATED, "a cut inside a gemma entry is not restored: {cached}");
}

/// gemma-3 (full SWA cache), token prompts: turn 1, optionally an interleaved job, then turn 1
/// with its reply and a question (the whole entry is shared); returns turn 2's text and usage.
fn gemma_extension_turn2(engine: &Engine, interleave: bool) -> (Usage, String, Usage) {
    let tokenize = |text: &str| engine.tokenize_blocking(&Prompt::Text(text.to_string())).expect("tokenize");
    let bos = tokenize("");
    let without_bos = |text: &str| tokenize(text)[bos.len()..].to_vec();
    let mut prompt = tokenize(&long_system_prompt(2500))[..1560].to_vec();
    prompt.extend(without_bos("\nQuestion: which facts mention trains?\nAnswer:"));
    let (reply, turn1) = run(engine, Prompt::Tokens(prompt.clone()), 24);
    if interleave {
        let (_, other) = run(engine, Prompt::Tokens(tokenize(&museum_system_prompt(600))), 8);
        assert!(other.cached_tokens < UNRELATED, "{other:?}");
    }
    prompt.extend(without_bos(&reply));
    prompt.extend(without_bos("\nQuestion: and gardens?\nAnswer:"));
    let (text, turn2) = run(engine, Prompt::Tokens(prompt), 24);
    (turn1, text, turn2)
}

/// A restored gemma-3 entry continued where it ends (the cut needs only the last window):
/// the same output as the never-interleaved live cache, from as many cached tokens.
#[test]
fn gemma_a_restored_turn_that_extends_the_entry_equals_the_live_cache() {
    let config = test_config(gemma3_path());
    let engine = Engine::start(config.clone()).expect("gemma loads");
    let (turn1, restored_text, turn2) = gemma_extension_turn2(&engine, true);
    drop(engine);
    eprintln!("gemma extension: turn 1 {turn1:?}, restored turn 2 {turn2:?}");
    assert!(turn2.cached_tokens + SLACK >= turn1.prompt_tokens, "served from the restored entry: {turn2:?}");
    let live = Engine::start(EngineConfig { cache_ram_mib: 0, ..config }).expect("gemma loads");
    let (_, live_text, live_usage) = gemma_extension_turn2(&live, false);
    eprintln!("gemma never interleaved: turn 2 {live_usage:?}");
    assert_eq!(turn2.cached_tokens, live_usage.cached_tokens, "the restore reuses what the live cache would have");
    assert_eq!(restored_text, live_text, "the restore changed the output (cut at {})", turn2.cached_tokens);
}

#[test]
fn an_entry_sharing_k_tokens_is_never_used_beyond_k() {
    let config = test_config(smollm2_path());
    let engine = Engine::start(config.clone()).expect("model loads");
    let system = long_system_prompt(1500);
    let mut conversation = Conversation::new(&system, "Which facts mention trains?");
    let saved = conversation.prompt();
    let (_, turn1) = conversation.turn(&engine, 24, "And gardens?");
    interleaved_job(&engine);

    // Same system prompt, another first question: shares only part of the saved entry.
    let prompt = chat(vec![ChatMessage::system(&system), ChatMessage::user("List three facts about gardens.")]);
    let saved_tokens = engine.tokenize_blocking(&saved).expect("tokenize");
    let tokens = engine.tokenize_blocking(&prompt).expect("tokenize");
    let shared = saved_tokens.iter().zip(&tokens).take_while(|(a, b)| a == b).count() as u32;
    assert!(shared > 1000 && shared + 5 < turn1.prompt_tokens, "a partial share: {shared} of {turn1:?}");
    let (restored_text, usage) = run(&engine, prompt.clone(), 32);
    drop(engine);
    eprintln!("turn 1 {turn1:?}, shared {shared}, partial turn {usage:?}");
    assert!(usage.cached_tokens <= shared, "cached {} beyond the {shared} shared tokens", usage.cached_tokens);
    assert_eq!(usage.cached_tokens, shared, "the shared part comes from the store");
    assert!(!restored_text.is_empty());
    let fresh_text = fresh_split(&config, &prompt, usage, 32);
    assert_eq!(restored_text, fresh_text, "the restore changed the output (cut at {})", usage.cached_tokens);
}

#[test]
fn a_budget_too_small_for_one_entry_skips_saving() {
    // About 23 KB of state per SmolLM2 token: a 1500-token conversation is tens of MiB.
    let config = EngineConfig { cache_ram_mib: 1, ..test_config(smollm2_path()) };
    let engine = Engine::start(config).expect("model loads");
    let mut conversation = Conversation::new(&long_system_prompt(1500), "Which facts mention trains?");
    let (_, turn1) = conversation.turn(&engine, 24, "And gardens?");
    interleaved_job(&engine);
    let (reply, turn2) = conversation.turn(&engine, 24, "Thanks.");
    eprintln!("cache_ram_mib 1: turn 1 {turn1:?}, turn 2 {turn2:?}");
    assert!(turn2.cached_tokens < UNRELATED, "nothing fit the budget: {turn2:?}");
    assert!(!reply.is_empty());
    // And it keeps serving, the live cache included.
    let (reply, turn3) = conversation.turn(&engine, 8, "Bye.");
    assert!(!reply.is_empty());
    assert!(turn3.cached_tokens + SLACK >= turn2.prompt_tokens, "the live cache still works: {turn3:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn http_usage_reports_the_restored_tokens() {
    let server = common::spawn_server(Engine::start(test_config(smollm2_path())).expect("model loads"));
    let system = long_system_prompt(1500);
    let post = |messages: serde_json::Value| {
        let base = server.base.clone();
        async move {
            let body = json!({"messages": messages, "max_tokens": 16, "temperature": 0});
            let (status, body) = common::post(&base, &body).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let first = post(
        json!([{"role": "system", "content": system}, {"role": "user", "content": "Which facts mention trains?"}]),
    )
    .await;
    let reply = first["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    let other = json!([{"role": "system", "content": museum_system_prompt(600)}, {"role": "user", "content": "Where is exhibit 4?"}]);
    let other = post(other).await;
    assert!(other["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached") < u64::from(UNRELATED));
    let second = post(json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "Which facts mention trains?"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And gardens?"}
    ]))
    .await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
    eprintln!("http: turn 1 prompt {prompt_tokens}, turn 2 usage {}", second["usage"]);
    assert!(cached + u64::from(SLACK) >= prompt_tokens, "turn 2 cached {cached} of turn 1's {prompt_tokens}");

    // timings.cache says where the tokens came from; the interleaved job reports the save.
    let cache = &second["timings"]["cache"];
    assert_eq!((&cache["source"], &cache["reason"]), (&json!("ram"), &json!("restored")), "{cache}");
    assert_eq!(cache["reused"].as_u64(), Some(cached), "{cache}");
    assert!(cache["restore_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{cache}");
    let job = &other["timings"]["cache"];
    assert!(job["save_ms"].as_f64().is_some_and(|ms| ms > 0.0), "the job displaced turn 1: {job}");

    // GET /cache: the live sequence is turn 2's; the job's state waits in the store.
    let view: serde_json::Value =
        reqwest::get(format!("{}/cache", server.base)).await.expect("GET /cache").json().await.expect("JSON");
    eprintln!("GET /cache: {view}");
    assert!(view["live_tokens"].as_u64().expect("live_tokens") > cached, "{view}");
    let entries = view["entries"].as_array().expect("entries");
    let job_prompt = other["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(
        entries.iter().any(|e| e["kind"] == "snapshot" && e["tokens"].as_u64() >= Some(job_prompt)),
        "the job's snapshot: {view}"
    );
    let used: u64 = entries.iter().map(|e| e["bytes"].as_u64().expect("bytes")).sum();
    assert_eq!(view["used_bytes"].as_u64(), Some(used), "{view}");
    assert!(used <= view["budget_bytes"].as_u64().expect("budget"), "{view}");
}

#[test]
fn the_cli_accepts_cache_flags() {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_firstword")).args(["serve", "--help"]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--cache-ram"), "{help}");
    assert!(help.contains("--cache-min-tokens"), "{help}");
    assert!(help.contains("--checkpoint-every"), "{help}");
}
