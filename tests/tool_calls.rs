//! Tool calls and JSON output against SmolLM2: forced calls that always parse and validate,
//! streamed deltas that match the non-streamed answer, follow-up turns served from the cache,
//! no markers in content, and no sampler setting that aborts the process. The checks that run
//! on gemma-3 too are in `common::tools`; gemma-3 runs them in tests/tool_calls_gemma.rs.

mod common;

use common::tools::{
    auto_never_leaks_markers, check_call, check_complete_calls, follow_up_after_a_tool_result_is_cached,
    forced_calls_always_validate, json_schema_replies_validate, request, streamed_calls_match_the_answer,
    tool_definitions, tools, REQUESTS,
};
use common::{one_sequence_config, post, smollm2_path, stream_chunks, ServerLock, SharedServer, TestServer};
use firstword::chat::ToolCall;
use firstword::{ChatMessage, Prompt, Role};
use serde_json::{json, Value};

/// The SmolLM2 server of this file, one test at a time, with one sequence: a streamed answer is
/// compared with the same request answered before, token for token, and with several sequences
/// the conversations of earlier tests stay kept in their cells, whose places change llama.cpp's
/// sums between the two (docs/serving.md).
async fn exclusive_server() -> (ServerLock, &'static TestServer) {
    static SMOLLM2: SharedServer = SharedServer::configured(|| one_sequence_config(smollm2_path()));
    SMOLLM2.exclusive().await
}

#[tokio::test]
async fn smollm2_forced_calls_always_parse_and_validate() {
    let (_guard, server) = exclusive_server().await;
    let (required, named) = forced_calls_always_validate(server).await;
    println!("SmolLM2: required {required}/20, named {named}/20 calls valid");
}

/// `parallel_tool_calls: false`: exactly one call, even where the model would go on.
#[tokio::test]
async fn smollm2_makes_exactly_one_call_without_parallel_calls() {
    let (_guard, server) = exclusive_server().await;
    for (i, user) in REQUESTS.iter().enumerate() {
        let body = request(
            "You are a home assistant.",
            user,
            json!("required"),
            json!({"parallel_tool_calls": false, "seed": i, "temperature": 0.8}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "{answer}");
        let calls = answer["choices"][0]["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "{answer}");
    }
}

#[tokio::test]
async fn smollm2_streamed_call_deltas_rebuild_the_answer() {
    let (_guard, server) = exclusive_server().await;
    streamed_calls_match_the_answer(server).await;
}

#[tokio::test]
async fn smollm2_json_schema_replies_validate() {
    let (_guard, server) = exclusive_server().await;
    json_schema_replies_validate(server).await;
}

#[tokio::test]
async fn smollm2_serves_the_turn_after_a_tool_result_from_the_cache() {
    let (_guard, server) = exclusive_server().await;
    let (prompt, completion, cached) = follow_up_after_a_tool_result_is_cached(server).await;
    println!("SmolLM2 follow-up: first prompt {prompt} + reply {completion} tokens, next turn cached {cached}");
}

#[tokio::test]
async fn smollm2_never_leaks_call_markers_into_content_in_auto_mode() {
    let (_guard, server) = exclusive_server().await;
    auto_never_leaks_markers(server).await;
}

/// Every sampler setting users send, with and without a grammar: always an answer, never an
/// abort (a truncating sampler before the grammar used to kill the process).
#[tokio::test]
async fn no_sampler_setting_aborts_with_or_without_a_grammar() {
    let (_guard, server) = exclusive_server().await;
    let modes = [
        ("plain", json!({})),
        ("tools required", json!({"tools": tools(), "tool_choice": "required"})),
        ("tools auto", json!({"tools": tools(), "tool_choice": "auto"})),
        ("json", json!({"response_format": {"type": "json_object"}})),
    ];
    let mut runs = 0;
    for (mode, extra) in &modes {
        for temperature in [0.0, 1.0, 1.9] {
            for top_k in [0, 1, 40] {
                for (top_p, min_p) in [(1.0, 0.0), (0.05, 0.0), (1.0, 0.95), (0.1, 0.5)] {
                    let mut body = json!({"messages": [{"role": "user", "content": "Weather in Lima?"}], "max_tokens": 10,
                        "temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": runs});
                    for (key, value) in extra.as_object().expect("object") {
                        body[key] = value.clone();
                    }
                    let (status, answer) = post(&server.base, &body).await;
                    assert_eq!(status, 200, "{mode} t={temperature} k={top_k} p={top_p} min_p={min_p}: {answer}");
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 4 * 3 * 3 * 4);
}

/// Each format's grammar (including those for other model families) is accepted by llama.cpp's
/// grammar parser and constrains real generation.
#[tokio::test]
async fn every_format_grammar_parses_in_llama_cpp() {
    use firstword::chat::tools::{request_grammar, OutputSchema, ToolChoice, ToolFormat, ToolSet};
    use firstword::{Event, GenerationRequest, Prompt, SamplingParams};
    let (_guard, server) = exclusive_server().await;
    // A property name with control characters too: Gemma's formats write names as literals.
    let mut definitions = tool_definitions();
    definitions.push(firstword::chat::tools::ToolDefinition {
        name: "odd_names".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {"a\u{0}b\u{1f}": {"type": "string"}}}),
    });
    let set = ToolSet::new(definitions).expect("tools");
    let schema = OutputSchema::new(&json!({"type": "object"})).expect("schema");
    for format in ToolFormat::examples() {
        for (choice, output) in
            [(ToolChoice::Required, None), (ToolChoice::Auto, None), (ToolChoice::Auto, Some(&schema))]
        {
            let grammar = request_grammar(&format, &set, &choice, true, output).expect("grammar");
            let request = GenerationRequest {
                prompt: Prompt::Text("Call a tool:".into()),
                max_tokens: Some(24),
                sampling: SamplingParams::greedy(),
                grammar: Some(grammar),
                ..GenerationRequest::chat(Vec::new())
            };
            let mut generation = server.engine.submit(request).expect("submitted");
            let mut text = String::new();
            loop {
                match generation.next().await {
                    Some(Event::Text(piece)) => text.push_str(&piece),
                    Some(Event::Finished { .. }) => break,
                    Some(Event::Failed(e)) => panic!("{format:?} {choice:?}: {e}"),
                    Some(Event::Started { .. } | Event::Logprobs(_)) => {}
                    None => panic!("{format:?}: no end"),
                }
            }
            if choice == ToolChoice::Required {
                // The opener, or as much of it as the token limit let through (DeepSeek's
                // full-width markers take more than 24 of SmolLM2's tokens).
                let opener = &format.openers()[0];
                let constrained = text.starts_with(opener.as_str()) || (!text.is_empty() && opener.starts_with(&text));
                assert!(constrained || format == ToolFormat::llama3(), "{format:?}: {text:?}");
            }
        }
    }
}

/// A follow-up turn without `tools` still shows the model its earlier calls and their results:
/// the generic format writes them into the messages whether or not the turn carries tools. A
/// server of its own: the shared one remembers calls other tests made the model write (a
/// JSON-equal call sent back is written as generated, spacing included).
#[tokio::test]
async fn tool_history_is_rendered_on_a_turn_without_tools() {
    let server = common::spawn_server(
        firstword::Engine::start(common::test_config(common::smollm2_path())).expect("model loads"),
    );
    let server = &server;
    let call = ToolCall { id: "call_1".into(), name: "set_timer".into(), arguments: "{\"minutes\": 10}".into() };
    let mut result = ChatMessage::new(Role::Tool, "{\"ok\": true}");
    result.tool_call_id = Some("call_1".into());
    let history = vec![
        ChatMessage::system("You are a home assistant."),
        ChatMessage::user("Set a timer for ten minutes."),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::assistant("") },
        result,
        ChatMessage::user("Thanks!"),
    ];
    let written = vec![
        ChatMessage::system("You are a home assistant."),
        ChatMessage::user("Set a timer for ten minutes."),
        ChatMessage::assistant(
            "<tool_call>\n{\"name\": \"set_timer\", \"arguments\": {\"minutes\": 10}}\n</tool_call>",
        ),
        ChatMessage::user("<tool_response>\n{\"ok\": true}\n</tool_response>"),
        ChatMessage::user("Thanks!"),
    ];
    let engine = server.engine.clone();
    let (rendered, expected) = tokio::task::spawn_blocking(move || {
        let tokens = |messages| engine.tokenize_blocking(&Prompt::chat(messages, Vec::new())).expect("tokens");
        (tokens(history), tokens(written))
    })
    .await
    .expect("tokenizer task");
    assert_eq!(rendered, expected, "the calls and the tool result are in the prompt");
    // The same over HTTP: the prompt the server evaluates has the calls and the result.
    let body = json!({"messages": [
        {"role": "system", "content": "You are a home assistant."},
        {"role": "user", "content": "Set a timer for ten minutes."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "set_timer", "arguments": "{\"minutes\": 10}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"ok\": true}"},
        {"role": "user", "content": "Thanks!"}
    ], "max_tokens": 1, "temperature": 0});
    let (status, answer) = post(&server.base, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"].as_u64(), Some(expected.len() as u64), "{answer}");
}

/// A user stop string inside a call never yields half a call: the answer is the whole, valid
/// call, or a 422 (never a cut call with finish_reason "stop").
#[tokio::test]
async fn a_stop_string_never_returns_half_a_call() {
    let (_guard, server) = exclusive_server().await;
    for stop in ["arguments", "minutes", "}"] {
        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            json!("required"),
            json!({"temperature": 0, "stop": [stop]}),
        );
        let (status, answer) = post(&server.base, &body).await;
        if status == 422 {
            assert_eq!(answer["error"]["code"], "invalid_model_output", "stop {stop:?}: {answer}");
        } else {
            assert_eq!(status, 200, "stop {stop:?}: {answer}");
            assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls", "stop {stop:?}: {answer}");
            for call in answer["choices"][0]["message"]["tool_calls"].as_array().expect("calls") {
                check_call(
                    call["function"]["name"].as_str().expect("name"),
                    call["function"]["arguments"].as_str().expect("arguments"),
                )
                .unwrap_or_else(|e| panic!("stop {stop:?}: {e}: {answer}"));
            }
        }
        let chunks = stream_chunks(&server.base, &body).await;
        let failed = chunks.iter().any(|c| c["error"]["code"] == "invalid_model_output");
        let finish: Vec<&str> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
        assert!(failed || finish == ["tool_calls"], "stop {stop:?}: finish {finish:?}, chunks {chunks:?}");
    }
}

/// A stream of only tool calls never says `content: ""` (clients send that back as the
/// assistant's content): the opening chunk has the role and no content.
#[tokio::test]
async fn a_tool_call_stream_never_sends_empty_content() {
    let (_guard, server) = exclusive_server().await;
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "set_timer"}})] {
        let body = request(
            "You are a home assistant.",
            "Set a timer for ten minutes please.",
            choice,
            json!({"temperature": 0}),
        );
        let chunks = stream_chunks(&server.base, &body).await;
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "{chunks:?}");
        let mut calls = 0;
        for chunk in &chunks {
            let Some(choice) = chunk["choices"].get(0) else { continue };
            let delta = &choice["delta"];
            assert!(delta.get("content").is_none_or(Value::is_null), "content in a call-only stream: {chunk}");
            calls += delta["tool_calls"].as_array().map_or(0, Vec::len);
        }
        assert!(calls > 0, "{chunks:?}");
    }
}

/// In `auto` mode a reply that opens with a JSON object is a call: SmolLM2 answered this
/// request (seed 0) with `{"type": "function", "name": "set_timer", ...}` as content. Now such a
/// reply is constrained into a valid call of a declared tool. (JSON after other text, such as
/// `set_timer({...`, is text: only a reply-opening object counts as a call.)
#[tokio::test]
async fn auto_mode_never_answers_with_a_json_object_as_content() {
    let (_guard, server) = exclusive_server().await;
    let mut calls_made = 0;
    for seed in 0..=7 {
        let body = request(
            "You are a home assistant.",
            "Set a timer for two minutes please.",
            json!("auto"),
            json!({"temperature": 0.8, "seed": seed, "max_tokens": 96}),
        );
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 200, "seed {seed}: {answer}");
        let message = &answer["choices"][0]["message"];
        let content = message["content"].as_str().unwrap_or_default();
        assert!(!content.trim_start().starts_with('{'), "seed {seed}: a JSON object as content: {answer}");
        calls_made += check_complete_calls(&answer, &format!("seed {seed}: "));
        let streamed: String = stream_chunks(&server.base, &body)
            .await
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(String::from))
            .collect();
        // Not compared with the answer above: the second request starts from another cache
        // state (a reused prefix), and sampled text may then differ; the rule holds for both.
        assert!(
            !streamed.trim_start().starts_with('{'),
            "seed {seed}: a JSON object as streamed content: {streamed:?}"
        );
    }
    println!("SmolLM2 auto timer: {calls_made} valid calls in 8 replies");
}

/// A tool loop keeps its cache when the client re-serializes the call's arguments (haystack
/// and the AI SDK send `{"city":"Paris"}` back where the model wrote `{"city": "Paris"}`): the
/// call is JSON-equal to the one generated, so it is written back as generated and the next
/// turn reuses the whole previous prompt and reply.
#[tokio::test]
async fn a_reserialized_call_in_the_history_keeps_the_cache() {
    let (_guard, server) = exclusive_server().await;
    let system = common::long_system_prompt(400);
    let first = request(
        &system,
        "What's the weather in Oslo in celsius?",
        json!("required"),
        json!({"temperature": 0, "parallel_tool_calls": false}),
    );
    let (status, answer) = post(&server.base, &first).await;
    assert_eq!(status, 200, "{answer}");
    let prompt = answer["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    let reply = answer["usage"]["completion_tokens"].as_u64().expect("completion tokens");
    let call = answer["choices"][0]["message"]["tool_calls"][0].clone();
    let written = call["function"]["arguments"].as_str().expect("arguments");
    let value: Value = serde_json::from_str(written).expect("JSON arguments");
    let reserialized = serde_json::to_string_pretty(&value).expect("JSON");
    assert_ne!(reserialized, written, "the client's text differs from the model's");
    let mut messages = first["messages"].as_array().expect("messages").clone();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": call["id"], "type": "function",
        "function": {"name": call["function"]["name"], "arguments": reserialized}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 3}"}));
    let follow =
        json!({"messages": messages, "tools": tools(), "tool_choice": "none", "max_tokens": 8, "temperature": 0});
    let (status, next) = post(&server.base, &follow).await;
    assert_eq!(status, 200, "{next}");
    let cache = &next["timings"]["cache"];
    assert!(cache["reason"].is_null(), "no history change: {cache}");
    // The turn boundary after the reply (end of turn, the next turn's opening) is new.
    let reused = cache["reused"].as_u64().expect("reused");
    assert!(reused + 3 >= prompt + reply, "reused {reused} of prompt {prompt} + reply {reply}: {cache}");
    println!("SmolLM2 re-serialized call: prompt {prompt} + reply {reply}, next turn reused {reused}: {cache}");
}

/// A required call that is complete ends where another would not fit in `max_tokens`, rather
/// than start a further parallel call that the limit cuts (`finish_reason: "length"`). The end
/// of generation is banned here, so after its first call the model can only go on to another:
/// with room for one more it does; with less, the answer ends after the first, as
/// `tool_calls`.
#[tokio::test]
async fn a_complete_required_call_ends_where_another_would_not_fit() {
    let (_guard, server) = exclusive_server().await;
    let (status, tokens) = common::post_json(
        &server.base,
        "/tokenize",
        &json!({"content": "<|im_end|><|endoftext|>", "parse_special": true}),
    )
    .await;
    assert_eq!(status, 200, "{tokens}");
    let bias: serde_json::Map<String, Value> =
        tokens["tokens"].as_array().expect("tokens").iter().map(|t| (t.to_string(), json!(-100))).collect();
    let ask = |max_tokens: u32| {
        request(
            "You are a home assistant.",
            "What's the weather in Paris?",
            json!("required"),
            json!({"temperature": 0, "max_tokens": max_tokens, "logit_bias": bias}),
        )
    };
    // With plenty of room: calls until the limit, the first one complete.
    let (status, long) = post(&server.base, &ask(200)).await;
    assert_eq!(status, 200, "{long}");
    let calls = long["choices"][0]["message"]["tool_calls"].as_array().expect("calls").len();
    assert!(calls >= 2, "with the end banned it goes on to further calls: {long}");
    // The first call's length, from the same greedy answer cut after it.
    let one = request(
        "You are a home assistant.",
        "What's the weather in Paris?",
        json!("required"),
        json!({"temperature": 0, "max_tokens": 200, "parallel_tool_calls": false}),
    );
    let (_, single) = post(&server.base, &one).await;
    let first = single["usage"]["completion_tokens"].as_u64().expect("tokens") as u32;
    // Room for the first call and a little more, not for a second.
    let (status, tight) = post(&server.base, &ask(first + 8)).await;
    assert_eq!(status, 200, "{tight}");
    let choice = &tight["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{tight}");
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "{tight}");
    check_call("get_weather", calls[0]["function"]["arguments"].as_str().expect("arguments")).expect("valid");
    assert!(tight["usage"]["completion_tokens"].as_u64().expect("tokens") < u64::from(first + 8), "{tight}");
}
