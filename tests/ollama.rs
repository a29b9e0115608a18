//! Ollama's API against a real server on SmolLM2, over raw HTTP: the model list and details,
//! chat streamed (NDJSON) and whole, tools, and a second turn whose prompt the cache mostly
//! holds (a small `prompt_eval_count`); and the official `ollama` Python client
//! (`tests/sdk/ollama_client.py`, in the pinned venv of `scripts/sdk-venv.sh`) called as Home
//! Assistant's integration calls it.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::python::{run_with_timeout, sdk_python};
use common::{
    long_system_prompt, settled_cache, smollm2_path, spawn_server, spawn_server_with, test_config, TestServer,
};
use firstword::api::{ApiKeys, ServeOptions};
use firstword::Engine;
use serde_json::{json, Value};

fn server() -> TestServer {
    spawn_server(Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads"))
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}{path}")).await.expect("request");
    (response.status().as_u16(), response.json().await.expect("JSON"))
}

/// Posts `body` to `path`: the status and the body's lines, each parsed as JSON (one line for a
/// whole answer).
async fn post_lines(base: &str, path: &str, body: &Value) -> (u16, Vec<Value>) {
    let response = reqwest::Client::new().post(format!("{base}{path}")).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let lines = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    (status, lines)
}

#[tokio::test]
async fn ollama_clients_list_show_and_chat_streamed_and_whole() {
    let server = server();
    let base = &server.base;
    let (status, tags) = get(base, "/api/tags").await;
    assert_eq!(status, 200);
    let name = tags["models"][0]["name"].as_str().expect("a name").to_string();
    assert_eq!(name, "SmolLM2-135M-Instruct.Q4_1:latest");
    assert_eq!(tags["models"][0]["details"]["quantization_level"], "Q4_1");
    assert_eq!(tags["models"][0]["details"]["family"], "llama");
    assert!(tags["models"][0]["details"]["parameter_size"].as_str().is_some_and(|p| p.ends_with('M')), "{tags}");

    let (status, show) = post_lines(base, "/api/show", &json!({"model": name})).await;
    assert_eq!(status, 200);
    assert_eq!(show[0]["model_info"]["llama.context_length"], 8192);
    assert_eq!(show[0]["capabilities"], json!(["completion", "tools"]));

    let question = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let options = json!({"temperature": 0, "num_predict": 12, "num_ctx": 8192});
    let (status, whole) = post_lines(
        base,
        "/api/chat",
        &json!({"model": name, "messages": question, "stream": false, "options": options}),
    )
    .await;
    assert_eq!(status, 200, "{whole:?}");
    assert_eq!(whole.len(), 1);
    let whole = &whole[0];
    assert_eq!((&whole["done"], &whole["message"]["role"]), (&json!(true), &json!("assistant")));
    assert!(whole["eval_count"].as_u64().is_some_and(|n| (1..=12).contains(&n)), "{whole}");
    assert!(whole["prompt_eval_count"].as_u64().is_some_and(|n| n > 0), "{whole}");

    let (status, lines) =
        post_lines(base, "/api/chat", &json!({"model": name, "messages": question, "options": options})).await;
    assert_eq!(status, 200);
    let (last, parts) = lines.split_last().expect("lines");
    assert!(parts.iter().all(|l| l["done"] == false));
    let streamed: String = parts.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    assert_eq!(streamed, whole["message"]["content"].as_str().expect("content"), "greedy: the same reply");
    assert_eq!((&last["done"], &last["eval_count"]), (&json!(true), &whole["eval_count"]));
    for field in ["total_duration", "prompt_eval_duration", "eval_duration"] {
        assert!(last[field].as_u64().is_some_and(|ns| ns > 0), "{field}: {last}");
    }

    let (status, missing) = post_lines(base, "/api/chat", &json!({"model": "llama3.2", "messages": question})).await;
    assert_eq!(status, 404);
    assert!(missing[0]["error"].as_str().is_some_and(|m| m.contains("llama3.2")), "{missing:?}");
}

#[tokio::test]
async fn a_second_turn_evaluates_only_what_the_cache_did_not_hold() {
    let server = server();
    let base = &server.base;
    let system = long_system_prompt(400);
    let options = json!({"temperature": 0, "num_predict": 16});
    let mut messages = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": "Hi!"})];
    let (status, first) =
        post_lines(base, "/api/chat", &json!({"messages": messages, "stream": false, "options": options})).await;
    assert_eq!(status, 200, "{first:?}");
    let first_evaluated = first[0]["prompt_eval_count"].as_u64().expect("a count");
    assert!(first_evaluated > 300, "{}", first[0]);
    messages.push(first[0]["message"].clone());
    messages.push(json!({"role": "user", "content": "Turn on the kitchen light."}));
    let (status, second) =
        post_lines(base, "/api/chat", &json!({"messages": messages, "keep_alive": -1, "options": options})).await;
    assert_eq!(status, 200);
    let second_evaluated = second.last().expect("lines")["prompt_eval_count"].as_u64().expect("a count");
    assert!(
        second_evaluated < 60,
        "turn 2 evaluated {second_evaluated} of its prompt tokens (turn 1: {first_evaluated})"
    );
}

#[tokio::test]
async fn tools_come_back_as_ollama_calls_or_as_text_never_as_json_content() {
    let server = server();
    let tools = json!([{"type": "function", "function": {"name": "set_timer", "description": "Start a timer",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}}]);
    let messages = json!([{"role": "user", "content": "Set a timer for 5 minutes."}]);
    for stream in [false, true] {
        let body = json!({"messages": messages, "tools": tools, "stream": stream, "options": {"temperature": 0, "num_predict": 48}});
        let (status, lines) = post_lines(&server.base, "/api/chat", &body).await;
        assert_eq!(status, 200, "{lines:?}");
        assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
        let content: String = lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
        assert!(!content.contains("\"name\"") && !content.contains("tool_call"), "a call as content: {content}");
        for call in lines.iter().filter_map(|l| l["message"]["tool_calls"].as_array()).flatten() {
            assert_eq!(call["function"]["name"], "set_timer", "{call}");
            assert!(call["function"]["arguments"].is_object(), "arguments an object: {call}");
        }
    }
}

#[tokio::test]
async fn generate_answers_templated_and_raw_prompts_and_an_empty_one_only_loads() {
    let server = server();
    let base = &server.base;
    let options = json!({"temperature": 0, "num_predict": 8});
    for raw in [false, true] {
        let body = json!({"prompt": "The capital of France is", "raw": raw, "stream": false, "options": options});
        let (status, answer) = post_lines(base, "/api/generate", &body).await;
        assert_eq!(status, 200, "{answer:?}");
        assert!(answer[0]["response"].as_str().is_some_and(|r| !r.is_empty()), "{answer:?}");
        assert!(answer[0]["eval_count"].as_u64().is_some_and(|n| (1..=8).contains(&n)), "{answer:?}");
    }
    let (status, loaded) = post_lines(base, "/api/generate", &json!({"model": "SmolLM2-135M-Instruct.Q4_1"})).await;
    assert_eq!(status, 200, "{loaded:?}");
    assert_eq!((&loaded[0]["done"], &loaded[0]["done_reason"]), (&json!(true), &json!("load")));
    let (status, embed) = post_lines(base, "/api/embed", &json!({"input": "hi"})).await;
    assert_eq!(status, 501);
    assert!(embed[0]["error"].is_string());
}

#[tokio::test]
async fn the_official_ollama_client_works_as_home_assistant_calls_it() {
    let server = server();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(sdk_python(&root));
    command.arg("-u").arg(root.join("tests/sdk/ollama_client.py")).arg(&server.base);
    client_checks_pass("ollama client", command).await;
}

/// Runs a client's checks (`command`) to their end within 120 s: they print each step, and
/// `ok` last.
async fn client_checks_pass(name: &'static str, command: Command) {
    let (status, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_with_timeout(command, Duration::from_secs(120))).await.expect("runner");
    println!("{stdout}");
    let status = status.unwrap_or_else(|| panic!("the {name} checks ran past 120 s:\n{stdout}"));
    assert!(status.success(), "the {name} checks failed ({status}):\n{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

/// The same as Home Assistant's calls, through the official JavaScript client (ollama-js,
/// `tests/sdk/ollama_client.mjs`, pinned by `scripts/ollama-js.sh`), on a server that takes an
/// API key: without it the client reads the 401 as Ollama's string error.
#[tokio::test]
async fn the_official_javascript_client_works_with_an_api_key() {
    const KEY: &str = "sk-ollama-js";
    let options = ServeOptions { api_keys: ApiKeys::new([KEY.to_string()]), ..ServeOptions::default() };
    let server = spawn_server_with(Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads"), options);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let installed = Command::new("bash").arg("scripts/ollama-js.sh").current_dir(&root).output().expect("bash runs");
    let listed = String::from_utf8_lossy(&installed.stdout);
    assert!(
        installed.status.success(),
        "scripts/ollama-js.sh failed:\n{listed}\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let modules = listed.lines().last().expect("the node_modules path").trim().to_string();
    let mut command = Command::new("node");
    command.arg(root.join("tests/sdk/ollama_client.mjs")).arg(modules).arg(&server.base).arg(KEY);
    client_checks_pass("ollama-js", command).await;
}

/// Pictures through `/api/chat` on a real projector (the vision fixture): `show` says
/// `vision`; a message's `images` (base64, as Ollama's clients send them) reach the model as
/// the OpenAI path's image parts do (the same prompt, picture included: the OpenAI request
/// finds all of it cached); the next turn with the same picture continues the cache; a broken
/// picture is a 400 in Ollama's shape, and the server goes on.
#[tokio::test]
async fn pictures_in_ollama_messages_reach_the_projector_as_openai_image_parts_do() {
    use common::media::{base64, red, vision_projector, VISION_TOKENS};
    let config = firstword::EngineConfig { mmproj: Some(vision_projector()), ..test_config(smollm2_path()) };
    let server = spawn_server(Engine::start(config).expect("SmolLM2 with the vision fixture loads"));
    let base = &server.base;
    let (status, show) = post_lines(base, "/api/show", &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(show[0]["capabilities"], json!(["completion", "tools", "vision"]));

    let picture = base64(&red());
    let options = json!({"temperature": 0, "num_predict": 8});
    let ask = |images: Value| {
        json!({"messages": [{"role": "user", "content": "What colour is this?", "images": images}],
        "stream": false, "options": options})
    };
    let (status, with) = post_lines(base, "/api/chat", &ask(json!([picture]))).await;
    assert_eq!(status, 200, "{with:?}");
    let tokens = |answer: &[Value]| answer[0]["prompt_eval_count"].as_u64().expect("a count");

    // The same turn as an OpenAI image part: the very same prompt, picture included (the cache
    // holds all of it but the last token, which is evaluated again for fresh logits).
    let url = format!("data:image/bmp;base64,{picture}");
    let openai = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What colour is this?"}]}], "max_tokens": 8, "temperature": 0});
    let (status, answer) = common::post_json(base, "/v1/chat/completions", &openai).await;
    assert_eq!(status, 200, "{answer}");
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert_eq!(prompt_tokens, tokens(&with), "the same prompt, evaluated whole the first time");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1, "{answer}");

    // The next turn with the same picture continues the cache.
    let reply = answer["choices"][0]["message"]["content"].as_str().expect("a reply");
    let next = json!({"messages": [{"role": "user", "content": "What colour is this?", "images": [picture]},
        {"role": "assistant", "content": reply}, {"role": "user", "content": "Are you sure?"}],
        "stream": false, "options": options});
    let (status, second) = post_lines(base, "/api/chat", &next).await;
    assert_eq!(status, 200, "{second:?}");
    let evaluated = tokens(&second);
    assert!(evaluated + u64::from(VISION_TOKENS) <= tokens(&with), "the picture's turn is cached: {second:?}");

    // Without the picture, its tokens are missing from the prompt.
    let (status, without) = post_lines(base, "/api/chat", &ask(json!([]))).await;
    assert_eq!(status, 200, "{without:?}");
    assert!(tokens(&with) >= tokens(&without) + u64::from(VISION_TOKENS), "{with:?} {without:?}");

    let (status, broken) = post_lines(base, "/api/chat", &ask(json!([base64(b"BM not a picture")]))).await;
    assert_eq!(status, 400, "{broken:?}");
    assert!(broken[0]["error"].as_str().is_some_and(|e| e.contains("BMP")), "{broken:?}");
    let (status, again) = post_lines(base, "/api/chat", &ask(json!([picture]))).await;
    assert_eq!(status, 200, "the server goes on: {again:?}");
}

/// A client that leaves an NDJSON stream after its first lines: the generation stops and is
/// parked, and the same request sent again adopts it (the reply is the one it gives alone).
/// Each token is slowed a little, so the reply is still going on when the client leaves.
#[tokio::test]
#[cfg_attr(not(feature = "failpoints"), ignore = "slows tokens at a failpoint: needs --features failpoints")]
async fn a_client_that_leaves_a_stream_stops_its_generation() {
    let _scenario = fail::FailScenario::setup();
    fail::cfg("engine::token", "sleep(15)").expect("failpoint");
    let server = server();
    let body = json!({"messages": [{"role": "user", "content": "Describe a lighthouse at night."}],
        "options": {"temperature": 0, "num_predict": 40}});
    let mut response =
        reqwest::Client::new().post(format!("{}/api/chat", server.base)).json(&body).send().await.expect("request");
    assert_eq!(response.status().as_u16(), 200);
    let mut received = String::new();
    while received.lines().count() < 3 {
        let chunk = response.chunk().await.expect("chunk").expect("the stream goes on");
        received.push_str(&String::from_utf8_lossy(&chunk));
        assert!(!received.contains("\"done\":true"), "ended: {received}");
    }
    drop(response);
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let (status, answer) = post_lines(&server.base, "/api/chat", &whole).await;
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(answer[0]["done"], true);
    let parking = settled_cache(&server.engine).parking;
    assert_eq!((parking.parked, parking.adopted), (1, 1), "{parking:?}");
}
