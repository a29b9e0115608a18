//! Ollama's API over a scripted engine: the model endpoints, `GET /` by `Accept`, errors in
//! Ollama's shape, and chat and generate framing (NDJSON, nanosecond durations, tool calls as
//! objects) and field mapping.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;

use super::router::{call, replying, send, text_of};
use crate::api::ollama::{parameter_size, quantization};
use crate::engine::FinishReason;

#[tokio::test]
async fn version_tags_ps_and_show_describe_the_one_model() {
    let engine = replying(&[], FinishReason::Stop);
    let (status, version) = call(&engine, Method::GET, "/api/version", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(version["version"].as_str().is_some_and(|v| v.contains('.')), "{version}");

    let (status, tags) = call(&engine, Method::GET, "/api/tags", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    let listed = &tags["models"][0];
    assert_eq!((&listed["name"], &listed["model"]), (&json!("test-model:latest"), &json!("test-model:latest")));
    assert_eq!(listed["details"]["format"], "gguf");
    assert_eq!(listed["details"]["family"], "llama");
    assert_eq!(listed["details"]["parameter_size"], "135M");
    assert_eq!(listed["details"]["quantization_level"], "Q4_1");
    assert_eq!(listed["size"], 91_000_000);
    assert_eq!(tags["models"].as_array().map(Vec::len), Some(1));

    let (status, ps) = call(&engine, Method::GET, "/api/ps", Body::empty()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ps["models"][0]["name"], "test-model:latest");
    assert_eq!(ps["models"][0]["context_length"], 4096);

    for name in ["test-model", "test-model:latest"] {
        let (status, show) = call(&engine, Method::POST, "/api/show", json!({"model": name}).to_string()).await;
        assert_eq!(status, StatusCode::OK, "{show}");
        assert_eq!(show["details"]["quantization_level"], "Q4_1");
        assert_eq!(show["model_info"]["llama.context_length"], 8192);
        assert_eq!(show["model_info"]["general.parameter_count"], 134_515_008);
        assert_eq!(show["capabilities"], json!(["completion", "tools"]), "no projector, no reasoning markers");
    }
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn errors_come_in_ollamas_shape_with_their_status() {
    let engine = replying(&[], FinishReason::Stop);
    let (status, body) = call(&engine, Method::POST, "/api/show", json!({"model": "llama3"}).to_string()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let message = body["error"].as_str().expect("error is a string, as Ollama writes it");
    assert!(message.contains("\"llama3\" not found") && message.contains("test-model:latest"), "{message}");

    let (status, body) = call(&engine, Method::POST, "/api/show", "{\"model\": ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].is_string(), "{body}");

    for (method, path) in [
        (Method::POST, "/api/pull"),
        (Method::POST, "/api/create"),
        (Method::DELETE, "/api/delete"),
        (Method::POST, "/api/push"),
        (Method::POST, "/api/copy"),
    ] {
        let (status, body) = call(&engine, method, path, json!({"model": "llama3"}).to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let message = body["error"].as_str().expect("a string");
        assert!(message.contains("the one model it was started with"), "{path}: {message}");
    }
}

#[tokio::test]
async fn root_answers_ollamas_probe_and_browsers_the_console() {
    let engine = replying(&[], FinishReason::Stop);
    let get = |accept: Option<&str>, method: Method| {
        let mut builder = Request::builder().method(method).uri("/");
        if let Some(accept) = accept {
            builder = builder.header(header::ACCEPT, accept);
        }
        builder.body(Body::empty()).expect("a request")
    };
    // What a browser's navigation sends.
    let browser = send(&engine, get(Some("text/html,application/xhtml+xml,*/*;q=0.8"), Method::GET)).await;
    assert_eq!(browser.status(), StatusCode::OK);
    assert!(browser.headers()[header::CONTENT_TYPE].to_str().unwrap_or("").starts_with("text/html"));
    assert!(text_of(browser).await.contains("<html"));
    for accept in [None, Some("*/*"), Some("application/json")] {
        let probe = send(&engine, get(accept, Method::GET)).await;
        assert_eq!(probe.status(), StatusCode::OK);
        assert_eq!(text_of(probe).await, "Ollama is running", "Accept {accept:?}");
    }
    let head = send(&engine, get(None, Method::HEAD)).await;
    assert_eq!(head.status(), StatusCode::OK);
    assert!(text_of(head).await.is_empty());
}

#[test]
fn sizes_and_quantizations_are_written_as_ollama_writes_them() {
    assert_eq!(parameter_size(134_515_008), "135M");
    assert_eq!(parameter_size(7_241_732_096), "7.2B");
    assert_eq!(quantization(15), "Q4_K_M");
    assert_eq!(quantization(3), "Q4_1");
    assert_eq!(quantization(999), "unknown");
}

/// The NDJSON lines of a streamed answer, each parsed.
async fn ndjson(engine: &std::sync::Arc<super::fake::FakeEngine>, body: &serde_json::Value) -> Vec<serde_json::Value> {
    let response = send(
        engine,
        super::router::request(Method::POST, "/api/chat", "application/json", Body::from(body.to_string())),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/x-ndjson");
    let text = text_of(response).await;
    assert!(text.ends_with('\n'), "{text:?}");
    text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect()
}

fn hello(stream: bool) -> serde_json::Value {
    json!({"model": "test-model:latest", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[tokio::test]
async fn a_streamed_chat_is_one_object_per_line_the_last_done_with_counts_in_nanoseconds() {
    let engine = replying(&["Hel", "lo"], FinishReason::Stop);
    let lines = ndjson(&engine, &hello(true)).await;
    let (last, parts) = lines.split_last().expect("lines");
    assert!(parts
        .iter()
        .all(|l| l["done"] == false && l["message"]["role"] == "assistant" && l["model"] == "test-model:latest"));
    let text: String = parts.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    assert_eq!(text, "Hello");
    assert_eq!((&last["done"], &last["done_reason"]), (&json!(true), &json!("stop")));
    // 10 prompt tokens, 4 of them from the cache: 6 evaluated.
    assert_eq!((&last["prompt_eval_count"], &last["eval_count"]), (&json!(6), &json!(3)));
    for field in ["total_duration", "load_duration", "prompt_eval_duration", "eval_duration"] {
        assert!(last[field].is_u64(), "{field}: {last}");
    }
    assert!(last["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    // Absent `stream` streams too, as Ollama's default.
    let engine = replying(&["Hi"], FinishReason::Length);
    let mut body = hello(true);
    body.as_object_mut().map(|b| b.remove("stream"));
    let lines = ndjson(&engine, &body).await;
    assert_eq!(lines.last().map(|l| l["done_reason"].clone()), Some(json!("length")));
}

#[tokio::test]
async fn a_whole_chat_is_one_object_and_options_reach_the_engine_request() {
    let engine = replying(&["Hello"], FinishReason::Stop);
    let mut body = hello(false);
    body["options"] = json!({"temperature": 0.2, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "seed": 42,
        "num_predict": 9, "stop": ["\n\n"], "repeat_penalty": 1.3, "num_ctx": 65536, "num_thread": 4});
    body["keep_alive"] = json!(-1);
    body["think"] = json!(false);
    let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["message"], json!({"role": "assistant", "content": "Hello"}));
    assert_eq!((&answer["done"], &answer["prompt_eval_count"]), (&json!(true), &json!(6)));
    let submitted = engine.submitted.lock();
    let request = &submitted[0];
    assert_eq!((request.max_tokens, request.stop.clone()), (Some(9), vec!["\n\n".to_string()]));
    let s = &request.sampling;
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.repeat_penalty), (0.2, 0.9, 7, 0.1, Some(42), 1.3));
    let crate::engine::Prompt::Chat { template_kwargs, .. } = &request.prompt else { panic!("a chat prompt") };
    assert_eq!(template_kwargs.get("enable_thinking"), Some(&json!(false)), "think: false");
    assert!(request.grammar.is_none());
}

#[tokio::test]
async fn calls_come_back_as_objects_never_as_content_streamed_or_not() {
    let call_text = super::call_text("set_timer", "{\"minutes\": 5}");
    let tools = json!([{"type": "function", "function": {"name": "set_timer",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}}}}]);
    let engine = replying(&[&call_text], FinishReason::Stop);
    let mut body = hello(false);
    body["tools"] = tools.clone();
    let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["message"]["content"], "");
    assert_eq!(
        answer["message"]["tool_calls"],
        json!([{"function": {"name": "set_timer", "arguments": {"minutes": 5}}}])
    );
    assert_eq!(answer["done_reason"], "stop");

    let engine = replying(&[&call_text[..9], &call_text[9..]], FinishReason::Stop);
    body["stream"] = json!(true);
    let lines = ndjson(&engine, &body).await;
    let calls: Vec<_> = lines.iter().filter(|l| l["message"]["tool_calls"].is_array()).collect();
    assert_eq!(calls.len(), 1, "{lines:?}");
    assert_eq!(calls[0]["message"]["tool_calls"][0]["function"]["arguments"], json!({"minutes": 5}));
    assert!(
        lines.iter().all(|l| !l["message"]["content"].as_str().unwrap_or_default().contains("tool_call")),
        "{lines:?}"
    );
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
}

#[tokio::test]
async fn history_calls_and_results_map_into_the_conversation() {
    let engine = replying(&["Done."], FinishReason::Stop);
    let body = json!({"model": "test-model", "stream": false, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Timer for 5 minutes"},
        {"role": "assistant", "content": "", "thinking": "a timer",
            "tool_calls": [{"function": {"name": "set_timer", "arguments": {"minutes": 5}}}]},
        {"role": "tool", "content": "{\"data\": \"ok\", \"error\": null}", "tool_name": "set_timer"},
    ]});
    let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let submitted = engine.submitted.lock();
    let crate::engine::Prompt::Chat { messages, .. } = &submitted[0].prompt else { panic!("a chat prompt") };
    let call = &messages[2].tool_calls[0];
    assert_eq!((call.name.as_str(), call.arguments.as_str()), ("set_timer", "{\"minutes\":5}"));
    assert_eq!(messages[2].reasoning.as_deref(), Some("a timer"));
    assert_eq!(messages[3].tool_call_id.as_deref(), Some(call.id.as_str()), "the result answers the call");
}

#[tokio::test]
async fn format_json_or_a_schema_constrains_the_reply_by_grammar() {
    for format in [json!("json"), json!({"type": "object", "properties": {"a": {"type": "integer"}}})] {
        let engine = replying(&["{\"a\": 1}"], FinishReason::Stop);
        let mut body = hello(false);
        body["format"] = format.clone();
        let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["message"]["content"], "{\"a\": 1}");
        assert!(engine.submitted.lock()[0].grammar.is_some(), "{format}");
    }
}

#[tokio::test]
async fn bad_chat_bodies_get_ollama_errors_and_reach_no_engine() {
    let engine = replying(&["never"], FinishReason::Stop);
    let cases = [
        ("temperature 9", json!({"options": {"temperature": 9}}), StatusCode::BAD_REQUEST, "temperature"),
        ("unknown option", json!({"options": {"warmth": 1}}), StatusCode::BAD_REQUEST, "warmth"),
        ("num_predict 0", json!({"options": {"num_predict": 0}}), StatusCode::BAD_REQUEST, "num_predict"),
        ("num_ctx text", json!({"options": {"num_ctx": "big"}}), StatusCode::BAD_REQUEST, "num_ctx"),
        ("format xml", json!({"format": "xml"}), StatusCode::BAD_REQUEST, "format"),
        ("think maybe", json!({"think": "maybe"}), StatusCode::BAD_REQUEST, "think"),
        ("other model", json!({"model": "llama3.2"}), StatusCode::NOT_FOUND, "not found"),
        ("no messages", json!({"messages": []}), StatusCode::BAD_REQUEST, "messages"),
        (
            "image without projector",
            json!({"messages": [{"role": "user", "content": "what?", "images": ["iVBORw0KGgo="]}]}),
            StatusCode::BAD_REQUEST,
            "image",
        ),
    ];
    for (case, change, expected, mentions) in cases {
        let mut body = hello(true);
        for (key, value) in change.as_object().expect("an object") {
            body[key] = value.clone();
        }
        let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
        assert_eq!(status, expected, "{case}: {answer}");
        let message = answer["error"].as_str().unwrap_or_else(|| panic!("{case}: {answer}"));
        assert!(message.contains(mentions), "{case}: {message}");
    }
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn an_engine_failure_mid_stream_ends_it_with_an_error_line() {
    use crate::engine::{EngineError, Event};
    let script = vec![
        Event::Started { prompt_tokens: 10, cached_tokens: 0, in_reasoning: false },
        Event::Text("Hi".into()),
        Event::Failed(EngineError::ShuttingDown),
    ];
    let engine = std::sync::Arc::new(super::fake::FakeEngine::answering(script));
    let lines = ndjson(&engine, &hello(true)).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[1]["error"].as_str().is_some_and(|m| !m.is_empty()), "{lines:?}");
}

#[tokio::test]
async fn a_larger_num_ctx_does_not_grow_the_context_an_overlong_prompt_gets_a_400() {
    use crate::engine::{EngineError, Event};
    let overflow = EngineError::ContextOverflow { prompt_tokens: 5000, max_tokens: 0, needed: 5000, n_ctx: 4096 };
    let engine = std::sync::Arc::new(super::fake::FakeEngine::answering(vec![Event::Failed(overflow)]));
    let mut body = hello(true);
    body["options"] = json!({"num_ctx": 131_072});
    let (status, answer) = call(&engine, Method::POST, "/api/chat", body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"].as_str().is_some_and(|m| m.contains("4096")), "{answer}");
}

#[tokio::test]
async fn generate_answers_a_prompt_as_a_one_turn_chat_or_raw_text() {
    let engine = replying(&["Par", "is"], FinishReason::Stop);
    let body = json!({"model": "test-model", "prompt": "Capital of France?", "system": "Be brief.", "stream": false,
        "context": [1, 2, 3], "options": {"num_predict": 5}});
    let (status, answer) = call(&engine, Method::POST, "/api/generate", body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (&answer["response"], &answer["done"], &answer["done_reason"]),
        (&json!("Paris"), &json!(true), &json!("stop"))
    );
    assert!(answer.get("context").is_none() && answer.get("message").is_none(), "{answer}");
    {
        let submitted = engine.submitted.lock();
        let crate::engine::Prompt::Chat { messages, .. } = &submitted[0].prompt else { panic!("a chat prompt") };
        let turns: Vec<_> = messages.iter().map(|m| (m.role, m.content.as_str())).collect();
        use crate::chat::Role;
        assert_eq!(turns, [(Role::System, "Be brief."), (Role::User, "Capital of France?")]);
        assert_eq!(submitted[0].max_tokens, Some(5));
    }

    let engine = replying(&[" Paris"], FinishReason::Length);
    let body = json!({"prompt": "The capital of France is", "raw": true, "system": "ignored when raw"});
    let response = send(
        &engine,
        super::router::request(Method::POST, "/api/generate", "application/json", Body::from(body.to_string())),
    )
    .await;
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/x-ndjson");
    let text = text_of(response).await;
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let streamed: String = lines.iter().filter_map(|l| l["response"].as_str()).collect();
    assert_eq!(streamed, " Paris");
    assert_eq!(lines.last().map(|l| l["done_reason"].clone()), Some(json!("length")));
    let submitted = engine.submitted.lock();
    assert!(matches!(&submitted[0].prompt, crate::engine::Prompt::Text(t) if t == "The capital of France is"));
}

#[tokio::test]
async fn an_empty_generate_only_loads_and_embeddings_are_501() {
    let engine = replying(&["never"], FinishReason::Stop);
    let (status, answer) =
        call(&engine, Method::POST, "/api/generate", json!({"model": "test-model"}).to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (&answer["done"], &answer["done_reason"], &answer["response"]),
        (&json!(true), &json!("load"), &json!(""))
    );
    for path in ["/api/embed", "/api/embeddings"] {
        let (status, answer) =
            call(&engine, Method::POST, path, json!({"model": "test-model", "input": "hi"}).to_string()).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{path}");
        assert!(answer["error"].as_str().is_some_and(|m| m.contains("cannot embed")), "{answer}");
    }
    for (case, body) in [
        ("raw with images", json!({"prompt": "x", "raw": true, "images": ["AAAA"]})),
        ("suffix", json!({"prompt": "x", "suffix": "y"})),
        ("template", json!({"prompt": "x", "template": "{{ .Prompt }}"})),
        ("other model", json!({"prompt": "x", "model": "llama3"})),
    ] {
        let (status, answer) = call(&engine, Method::POST, "/api/generate", body.to_string()).await;
        assert!(status.is_client_error(), "{case}: {answer}");
        assert!(answer["error"].is_string(), "{case}: {answer}");
    }
    assert!(engine.submitted.lock().is_empty());
}

#[tokio::test]
async fn ollamas_endpoints_take_the_same_keys_and_host_checks() {
    use crate::api::{router_with, AllowedHosts, ApiKeys, ServeOptions};
    use tower::ServiceExt;
    let options = ServeOptions { api_keys: ApiKeys::new(["sk-local-1".to_string()]), ..ServeOptions::default() };
    let engine = replying(&["Hi"], FinishReason::Stop);
    let send_with = |key: Option<&str>, host: &str| {
        let mut builder = Request::builder().method(Method::GET).uri("/api/tags").header(header::HOST, host);
        if let Some(key) = key {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let engine: std::sync::Arc<dyn crate::api::backend::Backend> = engine.clone();
        router_with(engine, &options).oneshot(builder.body(Body::empty()).expect("a request"))
    };
    // Refused before any endpoint runs, and still in Ollama's shape: `error` is a string.
    let ollama_error = |response: axum::response::Response| async move {
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.expect("a body");
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        (status, body["error"].as_str().map(str::to_owned).unwrap_or_else(|| panic!("a string error: {body}")))
    };
    let (status, message) = ollama_error(send_with(None, "localhost").await.expect("answer")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(message.contains("missing API key"), "{message}");
    assert_eq!(send_with(Some("sk-local-1"), "localhost").await.expect("answer").status(), StatusCode::OK);
    let (status, message) =
        ollama_error(send_with(Some("sk-local-1"), "attacker.example").await.expect("answer")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(message.contains("attacker.example"), "{message}");
    assert!(matches!(options.allowed_hosts, AllowedHosts::Names(_)));
}

#[tokio::test]
async fn unknown_ollama_paths_and_methods_answer_in_ollamas_shape_and_openai_paths_keep_theirs() {
    let engine = replying(&[], FinishReason::Stop);
    for (method, path, status) in [
        (Method::POST, "/api/embeddingz", StatusCode::NOT_FOUND),
        (Method::GET, "/api/chat", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let (answered, body) = call(&engine, method, path, Body::empty()).await;
        assert_eq!(answered, status, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    // The OpenAI paths keep the OpenAI envelope.
    let (status, body) = call(&engine, Method::GET, "/v1/nothing", Body::empty()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"].is_string(), "{body}");
}
