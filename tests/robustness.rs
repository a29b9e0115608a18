//! One request must never kill, stall or silently corrupt the server: hostile schemas, huge
//! lists and counts, runs that overflow a tokenizer's stack, half-open connections, and the
//! configurations (small batches, speculation on models whose cache cannot be cut) that once
//! crashed the process or answered from a cleared cache. Each case checks the answer, and that
//! `/health` still answers and the cache still serves the next good request.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{
    exclusive_server, generate, long_system_prompt, post, post_json, smollm2_path, spawn_server, test_config,
    tiny_mtp_path, Generated,
};
use firstword::api::ServeOptions;
use firstword::engine::{SpecMode, SpeculationConfig};
use firstword::{ChatMessage, Engine, EngineConfig, Event, GenerationRequest, SamplingParams};
use serde_json::{json, Value};

async fn health(base: &str) -> u16 {
    reqwest::get(format!("{base}/health")).await.expect("health").status().as_u16()
}

fn assert_refused(case: &str, status: u16, body: &Value, code: &str) {
    assert_eq!(status, 400, "{case}: {body}");
    assert_eq!(body["error"]["code"], code, "{case}: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{case}: {body}");
}

fn model_path(file: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models").join(file);
    assert!(path.exists(), "{} is missing: run `bash scripts/fixtures.sh` (make test does)", path.display());
    path
}

fn optional_properties(n: usize) -> Value {
    let properties: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("property_{i}"), json!({"type": "string"}))).collect();
    json!({"type": "object", "properties": properties})
}

fn ref_chain(n: usize) -> Value {
    let defs: serde_json::Map<String, Value> =
        (0..n).map(|i| (format!("link{i}"), json!({"$ref": format!("#/$defs/link{}", i + 1)}))).collect();
    let mut defs = defs;
    defs.insert(format!("link{n}"), json!({"type": "string"}));
    json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/link0"}}, "$defs": defs})
}

fn with_tool(parameters: Value) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
           "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]})
}

fn with_format(schema: Value) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

/// Schemas that aborted the process (a 3,000-link `$ref` chain, 6,000 optional properties) or
/// stalled it for seconds to minutes (1,000–2,000 optional properties, a 20,000-string enum),
/// through tools and response_format alike: each is a 400 naming the limit, at once.
#[tokio::test]
async fn hostile_schemas_are_refused_before_conversion() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let enum_20k = json!({"type": "object", "properties": {"v": {"enum": (0..20_000).map(|i| format!("value{i}")).collect::<Vec<_>>()}}, "required": ["v"]});
    let schemas = [
        ("$ref chain of 3,000", ref_chain(3_000)),
        ("6,000 optional properties", optional_properties(6_000)),
        ("1,000 optional properties", optional_properties(1_000)),
        ("1,500 optional properties", optional_properties(1_500)),
        ("enum of 20,000 strings", enum_20k),
        ("maxLength 10^6", json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 1_000_000}}})),
    ];
    for (case, schema) in schemas {
        for body in [with_tool(schema.clone()), with_format(schema.clone())] {
            let started = Instant::now();
            let (status, answer) = post(base, &body).await;
            assert_refused(case, status, &answer, "schema_too_complex");
            eprintln!("{case}: 400 in {:?}", started.elapsed());
            assert_eq!(health(base).await, 200, "{case}: /health");
        }
    }
    // A schema at the limits is converted and served.
    let at_limit = optional_properties(64);
    let started = Instant::now();
    let (status, answer) = post(base, &with_format(at_limit)).await;
    assert_eq!(status, 200, "64 optional properties: {answer}");
    eprintln!("64 optional properties in response_format: served in {:?}", started.elapsed());
}

/// Lists and counts whose cost grows with their size have documented caps.
#[tokio::test]
async fn oversized_lists_and_counts_are_refused() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let user = json!([{"role": "user", "content": "hi"}]);
    let tool = |i: usize| json!({"type": "function", "function": {"name": format!("f{i}")}});
    let bias: serde_json::Map<String, Value> = (0..301).map(|i| (i.to_string(), json!(1))).collect();
    let cases = [
        ("5 stop strings", json!({"messages": user, "stop": ["a", "b", "c", "d", "e"]}), "stop"),
        ("a 300-byte stop string", json!({"messages": user, "stop": ["x".repeat(300)]}), "stop"),
        ("301 logit_bias entries", json!({"messages": user, "logit_bias": bias}), "logit_bias"),
        ("129 tools", json!({"messages": user, "tools": (0..129).map(tool).collect::<Vec<_>>()}), "tools"),
        // 2^31-1 made llama.cpp allocate 8 GiB on the inference thread (28.6 s of stall).
        (
            "repeat_last_n 2147483647",
            json!({"messages": user, "repeat_last_n": 2_147_483_647, "repeat_penalty": 1.1}),
            "repeat_last_n",
        ),
    ];
    for (case, body, param) in cases {
        let (status, answer) = post(base, &body).await;
        assert_eq!(status, 400, "{case}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{case}: {answer}");
    }
    let (status, answer) =
        post(base, &json!({"messages": user, "max_tokens": 4, "repeat_last_n": 4096, "repeat_penalty": 1.1})).await;
    assert_eq!(status, 200, "repeat_last_n = context size: {answer}");
}

/// Work that grows with a body (rendering a chat, tokenizing, token pieces, stored metadata)
/// has documented caps on the real model: at them the answer comes, beyond them a 400, and
/// the server stays healthy. Before, 900K tiny messages rendered for seconds on the async
/// runtime and one 30 MB `metadata` was stored and served back.
#[tokio::test]
async fn bodies_whose_work_grows_with_them_are_bounded() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let messages = |n: usize| json!({"messages": vec![json!({"role": "user", "content": "a"}); n]});
    let (status, answer) = post_json(base, "/apply-template", &messages(4_096)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["prompt"].as_str().is_some_and(|p| p.matches("a<|im_end|>").count() == 4_096), "{answer}");
    let (status, answer) = post_json(base, "/apply-template", &messages(900_000)).await;
    assert_refused("900,000 messages", status, &answer, "limit_exceeded");
    assert_eq!(answer["error"]["param"], "messages");
    // The context is 4096 tokens: 4 contexts of ids, 16 bytes of text a token.
    let (_, one) = post_json(base, "/detokenize", &json!({"tokens": [28]})).await;
    let piece = one["content"].as_str().expect("a piece").to_string();
    let (status, answer) = post_json(base, "/detokenize", &json!({"tokens": vec![28; 16_384]})).await;
    assert_eq!((status, answer["content"].as_str()), (200, Some(piece.repeat(16_384).as_str())));
    let (status, answer) = post_json(base, "/detokenize", &json!({"tokens": vec![0; 16_385]})).await;
    assert_refused("16,385 ids", status, &answer, "limit_exceeded");
    let text = "ab ".repeat(65_536 / 3);
    let (status, answer) = post_json(base, "/tokenize", &json!({"content": text, "with_pieces": true})).await;
    let pieces = answer["tokens"].as_array().expect("pieces");
    assert_eq!(status, 200);
    assert_eq!(pieces.iter().map(|t| t["piece"].as_str().expect("text")).collect::<String>(), text);
    let (status, answer) = post_json(base, "/tokenize", &json!({"content": "a".repeat(65_537)})).await;
    assert_refused("65,537 bytes", status, &answer, "limit_exceeded");
    let metadata = json!({"input": "hi", "metadata": {"k": "v".repeat(30_000_000)}});
    let (status, answer) = post_json(base, "/v1/responses", &metadata).await;
    assert_refused("30 MB of metadata", status, &answer, "limit_exceeded");
    assert_eq!(answer["error"]["param"], "metadata.k");
    assert_eq!(health(base).await, 200);
}

fn spaces_request(n: usize) -> Value {
    json!({"messages": [{"role": "user", "content": format!("Count{}these", " ".repeat(n))}], "max_tokens": 4})
}

/// 10,000 identical characters overflowed a 2 MiB inference stack inside llama.cpp's
/// `std::regex` pre-tokenizer (Tekken, DeepSeek-V3, GPT-4o style vocabularies): the fixture
/// has SmolLM2's vocabulary with the Tekken pre-tokenizer. Long runs pass; runs beyond the
/// documented bound are a 400; the real models take the same runs.
#[tokio::test]
async fn long_runs_of_one_character_do_not_overflow_the_tokenizer() {
    for model in [model_path("tiny-tekken.gguf"), smollm2_path(), common::gemma3_path()] {
        let server = spawn_server(Engine::start(test_config(model.clone())).expect("model loads"));
        for n in [10_000, 30_000] {
            let (status, answer) = post(&server.base, &spaces_request(n)).await;
            // SmolLM2 and gemma turn 30,000 spaces into few tokens; the fixture may need more
            // than the context holds: either way an answer, not a crash.
            assert!(status == 200 || answer["error"]["code"] == "context_length_exceeded", "{model:?} {n}: {answer}");
        }
        let (status, answer) = post(&server.base, &spaces_request(70_000)).await;
        assert_refused(&format!("{model:?} 70,000 spaces"), status, &answer, "prompt_run_too_long");
        assert_eq!(health(&server.base).await, 200);
    }
}

async fn tokenize(base: &str, content: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/tokenize"))
        .json(&json!({"content": content}))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .expect("POST /tokenize: the server answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

fn user_says(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2})
}

/// DeepSeek-V3's pre-tokenizer matches letters and combining marks as one word
/// (`[\p{L}\p{M}]+`) through `std::regex`: 500,000 decomposed "á" (a letter and U+0301 each)
/// overflowed the 256 MiB tokenizing stack and killed the process (through `/tokenize` and
/// through a chat message). EXAONE-MoE's joins words separated by single spaces: 1,000,000
/// "a " is one match there. Each is a 400 now, and the server serves the next request; on
/// DeepSeek-V3 the spaced letters are short words, tokenized.
#[tokio::test]
async fn marks_and_space_joined_words_cannot_overflow_a_regex_pre_tokenizer() {
    let decomposed = "a\u{301}".repeat(500_000);
    let spaced = "a ".repeat(1_000_000);
    // /tokenize takes at most 16 bytes a context token (limit_exceeded above it); a chat
    // message is bounded by the body limit only, so the run guard is what refuses it.
    let deepseek = spawn_server(Engine::start(test_config(model_path("tiny-deepseek3.gguf"))).expect("fixture loads"));
    let (status, answer) = tokenize(&deepseek.base, &decomposed).await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = post(&deepseek.base, &user_says(&decomposed)).await;
    assert_refused("a chat message of 500,000 decomposed á", status, &answer, "prompt_run_too_long");
    assert_eq!(health(&deepseek.base).await, 200);
    let (status, answer) = tokenize(&deepseek.base, &"a ".repeat(20_000)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["tokens"].as_array().is_some_and(|t| t.len() >= 20_000), "one token per word at least");
    let (status, answer) = post(&deepseek.base, &user_says("Say hi.")).await;
    assert_eq!(status, 200, "{answer}");

    let exaone = spawn_server(Engine::start(test_config(model_path("tiny-exaone-moe.gguf"))).expect("fixture loads"));
    let (status, answer) = post(&exaone.base, &user_says(&spaced)).await;
    assert_refused("a chat message of 1,000,000 \"a \"", status, &answer, "prompt_run_too_long");
    let (status, answer) = post(&exaone.base, &user_says("Say hi.")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(health(&exaone.base).await, 200);
}

/// Fed text the post-reply re-tokenization and a library caller can send too: the engine
/// itself refuses an over-long run with an error event, never a crash.
#[test]
fn the_engine_refuses_overlong_runs_itself() {
    let engine = Engine::start(test_config(model_path("tiny-tekken.gguf"))).expect("fixture loads");
    let request = GenerationRequest {
        prompt: firstword::Prompt::Text(format!("a{}b", " ".repeat(100_000))),
        max_tokens: Some(2),
        ..GenerationRequest::chat(Vec::new())
    };
    let mut generation = engine.submit(request).expect("queued");
    match generation.next_blocking() {
        Some(Event::Failed(e)) => assert!(e.to_string().contains("in a row"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    engine.wait_idle_blocking();
}

/// A greedy reply to `user`.
fn greedy(engine: &Engine, user: &str, max_tokens: u32) -> Generated {
    let request = GenerationRequest {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::chat(vec![ChatMessage::user(user)])
    };
    generate(engine, request)
}

/// The verify batch is the picked token plus its drafts and must fit `n_batch` (llama.cpp
/// aborts the process otherwise). The smallest batch sizes with the deepest drafts, for both
/// drafters, generate; the MTP fixture's output (large logit margins by construction) equals
/// plain decoding.
#[test]
fn the_smallest_batches_speculate_without_aborting() {
    let plain = Engine::start(EngineConfig { batch_size: 1, ..test_config(tiny_mtp_path()) }).expect("loads");
    let expected = greedy(&plain, "Tell me about the sea.", 48).text;
    drop(plain);
    for batch_size in [1, 2, 8] {
        let mtp = SpeculationConfig { mode: SpecMode::Mtp, draft_max: Some(64), always: true, ..Default::default() };
        let config = EngineConfig { batch_size, speculation: mtp, ..test_config(tiny_mtp_path()) };
        let engine = Engine::start(config).expect("MTP fixture loads");
        assert_eq!(greedy(&engine, "Tell me about the sea.", 48).text, expected, "MTP, batch {batch_size}");
        engine.wait_idle_blocking();
        drop(engine);
        let draft = SpeculationConfig { draft_max: Some(64), ..common::smollm2_drafting_for_itself() };
        let config = EngineConfig { batch_size, speculation: draft, ..test_config(smollm2_path()) };
        let engine = Engine::start(config).expect("SmolLM2 self-draft loads");
        let text = greedy(&engine, "Write the numbers from 1 to 40.", 96).text;
        assert!(!text.is_empty(), "draft model, batch {batch_size}");
        engine.wait_idle_blocking();
    }
}

/// On a hybrid model (LFM2: short convolutions + attention) rejected drafts are rolled back
/// through llama.cpp's recurrent-state snapshots (`n_rs_seq`) and the reply is right; a
/// recurrent model without rollback (Mamba) is refused
/// speculation at start-up (explicit) or served without it (auto), never answered from a
/// cache cleared mid-reply.
#[test]
fn speculation_on_models_whose_cache_cannot_be_cut_freely() {
    let draft = |mode| SpeculationConfig {
        mode,
        draft_model: Some(smollm2_path()),
        draft_p_min: 0.0,
        always: true,
        ..Default::default()
    };
    let lfm2 = model_path("tiny-lfm2.gguf");
    let plain = Engine::start(test_config(lfm2.clone())).expect("LFM2 loads");
    let expected = greedy(&plain, "Hello there", 12).text;
    drop(plain);
    let config = EngineConfig { speculation: draft(SpecMode::Draft), ..test_config(lfm2) };
    let engine = Engine::start(config).expect("LFM2 with a draft model");
    // SmolLM2 drafts nothing this random model would say: every draft is rejected and rolled
    // back, and the reply goes on from the right state (it equals plain decoding: without the
    // snapshots the cache was cleared at the first rejection and generation went on from
    // position 0). Asking the same again would cut deeper than the last batch: llama.cpp
    // accepts that cut and then computes garbage, so the engine prefills instead.
    let first = greedy(&engine, "Hello there", 12);
    let stats = first.timings.draft.expect("speculation ran");
    assert!(stats.drafted > stats.accepted, "drafts were rejected: {stats:?}");
    assert_eq!(first.text, expected, "speculative reply vs plain decoding");
    let again = greedy(&engine, "Hello there", 12);
    assert_eq!(again.text, expected, "the same request again ({:?})", again.usage);
    engine.wait_idle_blocking();
    drop(engine);

    let mamba = model_path("tiny-mamba.gguf");
    let refused = Engine::start(EngineConfig { speculation: draft(SpecMode::Draft), ..test_config(mamba.clone()) });
    let error = refused.expect_err("explicit speculation on Mamba is refused").to_string();
    assert!(error.contains("rolled back"), "{error}");
    let engine = Engine::start(EngineConfig { speculation: draft(SpecMode::Auto), ..test_config(mamba) })
        .expect("auto serves Mamba without speculation");
    assert!(!greedy(&engine, "Hello", 8).text.is_empty());
    engine.wait_idle_blocking();
}

/// llama.cpp gives Gemma 2 a 4096-token window when the GGUF has no window key: the engine
/// uses the window llama.cpp applies, so `--swa-small` never trusts a cut it cannot make.
#[test]
fn the_sliding_window_is_the_one_llama_cpp_applies() {
    let config = EngineConfig { ctx_size: Some(8192), ..test_config(model_path("tiny-gemma2.gguf")) };
    let engine = Engine::start(config).expect("gemma2 fixture loads");
    assert_eq!(engine.model_info().expect("info").n_swa, Some(4096));
    let gemma3 = Engine::start(test_config(common::gemma3_path())).expect("gemma3 loads");
    assert_eq!(gemma3.model_info().expect("info").n_swa, Some(512));
}

/// A stop string that matches inside a call never cuts it: stops apply to free text only.
#[tokio::test]
async fn stop_strings_do_not_cut_tool_calls() {
    let (_guard, server) = exclusive_server().await;
    let body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "tool_choice": "required", "stop": ["city", "\""], "max_tokens": 64, "temperature": 0
    });
    let (status, answer) = post(&server.base, &body).await;
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    let arguments = choice["message"]["tool_calls"][0]["function"]["arguments"].as_str().expect("arguments");
    let parsed: Value = serde_json::from_str(arguments).expect("complete JSON arguments");
    assert!(parsed["city"].is_string(), "{parsed}");
}

/// A stop string whose held-back text starts at a token boundary left the post-reply cache
/// upkeep with nothing to re-evaluate: it decoded an empty batch, failed, and cleared the
/// cache (the next turn was cold: 0 of 292 cached). The next turn now reuses the conversation.
#[tokio::test]
async fn a_stop_string_keeps_the_cache_for_the_next_turn() {
    let (_guard, server) = exclusive_server().await;
    let system = long_system_prompt(280);
    let question = "Write the numbers from 1 to 10, separated by commas.";
    let first = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                       "stop": ["4, 5,"], "max_tokens": 48, "temperature": 0});
    let (status, answer) = post(&server.base, &first).await;
    assert_eq!(status, 200, "{answer}");
    let reply = answer["choices"][0]["message"]["content"].as_str().expect("content").to_string();
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    let next = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question},
                                   {"role": "assistant", "content": reply}, {"role": "user", "content": "Thanks."}],
                      "max_tokens": 4, "temperature": 0});
    let (status, answer) = post(&server.base, &next).await;
    assert_eq!(status, 200, "{answer}");
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    assert!(cached >= prompt_tokens, "next turn cached {cached} of the first turn's {prompt_tokens} prompt tokens");
}

/// A request without max_tokens stops at the server's cap (`-n/--n-predict`).
#[tokio::test]
async fn requests_without_max_tokens_stop_at_n_predict() {
    let engine = Engine::start(EngineConfig { n_predict: Some(6), ..test_config(smollm2_path()) }).expect("loads");
    let server = spawn_server(engine);
    // Banning <|im_end|> (token 2) keeps the model talking.
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}], "logit_bias": {"2": -100}});
    let (status, answer) = post(&server.base, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 6, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
}

/// Starts a server with short connection timeouts; returns its address and a trigger for
/// its shutdown, and the thread that serves (joined to see that shutdown completes).
fn spawn_with_timeouts(engine: Engine) -> (String, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    let options = ServeOptions {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(2),
        ..ServeOptions::default()
    };
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            address_tx.send(listener.local_addr().expect("addr")).expect("address");
            let shutdown = async move {
                let _ = stop_rx.await;
            };
            firstword::api::serve_with(listener, engine, options, shutdown).await.expect("serve");
        });
    });
    (address_rx.recv().expect("address").to_string(), stop_tx, thread)
}

/// Whether the server closed `stream` (read gives end-of-file or an error) within `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// 200 half-open requests held their sockets forever (none closed after 65 s) and could
/// block graceful shutdown. Now each is closed after the header timeout, an idle keep-alive
/// connection too, a body that never arrives is a 408, and shutdown completes.
#[test]
fn half_open_and_idle_connections_are_closed() {
    let engine = Engine::start(test_config(smollm2_path())).expect("loads");
    let (address, stop, thread) = spawn_with_timeouts(engine.clone());
    let mut half_open: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut stream = TcpStream::connect(&address).expect("connect");
            stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n").expect("partial headers");
            stream
        })
        .collect();
    let mut idle = TcpStream::connect(&address).expect("connect");
    let mut slow_body = TcpStream::connect(&address).expect("connect");
    slow_body
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess")
        .expect("headers and part of the body");
    // /health answers meanwhile.
    let mut probe = TcpStream::connect(&address).expect("connect");
    probe.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("health");
    let mut answer = String::new();
    probe.read_to_string(&mut answer).expect("health answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let started = Instant::now();
    let closed = half_open.iter_mut().map(|s| closed_within(s, Duration::from_secs(10))).filter(|&c| c).count();
    assert_eq!(closed, 200, "half-open requests closed");
    assert!(closed_within(&mut idle, Duration::from_secs(10)), "idle connection closed");
    eprintln!("200 half-open requests and an idle connection closed after {:?}", started.elapsed());
    let mut response = String::new();
    slow_body.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = slow_body.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 408"), "a body that never arrives: {response:?}");

    // Shutdown completes with a half-open connection still there.
    let mut lingering = TcpStream::connect(&address).expect("connect");
    lingering.write_all(b"GET /hea").expect("partial");
    let started = Instant::now();
    stop.send(()).expect("stop");
    thread.join().expect("server thread");
    eprintln!("shutdown with a half-open connection took {:?}", started.elapsed());
    engine.wait_idle_blocking();
}

/// With the queue full, a request is refused before its body is read: a client that sends
/// headers and never the body gets its 503 at once, not a 408 after the body timeout.
#[test]
fn a_full_queue_refuses_before_reading_the_body() {
    let engine = Engine::start(EngineConfig { queue_size: 1, ..test_config(smollm2_path()) }).expect("loads");
    let (address, stop, thread) = spawn_with_timeouts(engine.clone());
    // One generation runs and one waits: both keep talking (<|im_end|> banned).
    let long = json!({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
                      "logit_bias": {"2": -100}, "stream": true})
    .to_string();
    let send = |wait_for_start: bool| {
        let mut stream = TcpStream::connect(&address).expect("connect");
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}",
            long.len()
        );
        stream.write_all(request.as_bytes()).expect("send");
        if wait_for_start {
            let mut first = [0u8; 12];
            stream.read_exact(&mut first).expect("response starts");
            assert_eq!(&first, b"HTTP/1.1 200", "generation admitted");
        }
        stream
    };
    let running = send(true);
    let queued = send(false);
    // The queued request's answer starts only when it runs; give it time to be admitted.
    std::thread::sleep(Duration::from_millis(500));
    let mut waiting = TcpStream::connect(&address).expect("connect");
    waiting
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        .expect("headers only");
    waiting.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut answer = [0u8; 12];
    waiting.read_exact(&mut answer).expect("an answer without the body");
    assert_eq!(&answer, b"HTTP/1.1 503", "{}", String::from_utf8_lossy(&answer));
    drop((running, queued));
    engine.shutdown();
    stop.send(()).expect("stop");
    thread.join().expect("server thread");
}
