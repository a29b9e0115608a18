//! Text completions, the Responses API and the tokenizer endpoints against the real SmolLM2
//! model: one prefix cache serves all of them, the tokenizer endpoints agree with what
//! generation evaluates, and bad input gets a 4xx envelope naming its field.

mod common;

use common::{exclusive_server, long_system_prompt, post_events, post_json};
use serde_json::{json, Value};

fn cache_reused_all_but_the_last_token(body: &Value, prompt_tokens: u64) {
    let cache = &body["timings"]["cache"];
    let reused = cache["reused"].as_u64().expect("reused");
    assert!(reused + 1 >= prompt_tokens, "{reused} of {prompt_tokens} reused: {cache}");
    assert!([Value::Null, json!("prompt-shorter")].contains(&cache["reason"]), "{cache}");
}

#[tokio::test]
async fn chat_completions_and_responses_share_one_prefix_cache() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let system = long_system_prompt(400);
    let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": "Which fact is first?"}]);
    let (status, chat) =
        post_json(base, "/v1/chat/completions", &json!({"messages": messages, "max_tokens": 4, "temperature": 0}))
            .await;
    assert_eq!(status, 200, "{chat}");
    let prompt_tokens = chat["usage"]["prompt_tokens"].as_u64().expect("n");

    // The same conversation as raw text: the template's rendering, continued as it is.
    let (_, rendered) = post_json(base, "/apply-template", &json!({"messages": messages})).await;
    let prompt = rendered["prompt"].as_str().expect("prompt");
    let (status, text) =
        post_json(base, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens), "the same tokens as the chat");
    cache_reused_all_but_the_last_token(&text, prompt_tokens);

    // The same conversation through the Responses API: instructions are the system message.
    let body =
        json!({"instructions": system, "input": "Which fact is first?", "max_output_tokens": 4, "temperature": 0});
    let (status, response) = post_json(base, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{response}");
    let usage = &response["usage"];
    assert_eq!(usage["input_tokens"].as_u64(), Some(prompt_tokens), "{usage}");
    let cached = usage["input_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    assert!(cached + 1 >= prompt_tokens, "{usage}");
}

#[tokio::test]
async fn text_completions_take_text_or_token_ids() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let prompt = "The three primary colours are";
    let (_, tokens) = post_json(base, "/tokenize", &json!({"content": prompt})).await;
    let (status, by_ids) =
        post_json(base, "/v1/completions", &json!({"prompt": tokens["tokens"], "max_tokens": 6, "temperature": 0}))
            .await;
    assert_eq!(status, 200, "{by_ids}");
    assert_eq!(by_ids["object"], "text_completion");
    assert_eq!(by_ids["usage"]["prompt_tokens"].as_u64(), tokens["tokens"].as_array().map(|t| t.len() as u64));
    let (status, by_text) =
        post_json(base, "/v1/completions", &json!({"prompt": [prompt], "max_tokens": 6, "temperature": 0})).await;
    assert_eq!(status, 200, "{by_text}");
    cache_reused_all_but_the_last_token(&by_text, by_text["usage"]["prompt_tokens"].as_u64().expect("n"));
    // OpenAI's default length.
    let (_, default) =
        post_json(base, "/v1/completions", &json!({"prompt": "Once upon a time", "temperature": 0})).await;
    assert!(default["usage"]["completion_tokens"].as_u64().is_some_and(|n| n <= 16), "{default}");

    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    let (status, events) = post_events(base, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(|(_, data)| data), Some(&json!("[DONE]")));
    let chunks: Vec<&Value> = events.iter().map(|(_, data)| data).filter(|d| d.is_object()).collect();
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes.len(), 1, "one finish: {chunks:?}");
    let usage = chunks.last().expect("a usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64(), "{usage}");
}

#[tokio::test]
async fn the_tokenizer_endpoints_agree_with_generation() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let content = "Hello wörld 🙂<|im_end|>";
    let (status, pieces) = post_json(base, "/tokenize", &json!({"content": content, "with_pieces": true})).await;
    assert_eq!(status, 200, "{pieces}");
    let pieces = pieces["tokens"].as_array().expect("tokens").clone();
    // Pieces that are not whole UTF-8 come as bytes.
    let bytes: Vec<u8> = pieces
        .iter()
        .flat_map(|p| match &p["piece"] {
            Value::String(text) => text.as_bytes().to_vec(),
            bytes => bytes.as_array().expect("bytes").iter().map(|b| b.as_u64().expect("byte") as u8).collect(),
        })
        .collect();
    assert_eq!(String::from_utf8(bytes).expect("UTF-8"), content);
    assert!(pieces.iter().any(|p| p["piece"] == "<|im_end|>"), "the special token is read: {pieces:?}");
    let (_, literal) = post_json(base, "/tokenize", &json!({"content": content, "parse_special": false})).await;
    assert!(literal["tokens"].as_array().expect("tokens").len() > pieces.len(), "written out as text");
    let ids: Vec<Value> = pieces.iter().map(|p| p["id"].clone()).collect();
    let (status, back) = post_json(base, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(status, 200);
    assert_eq!(back["content"], content);

    // /apply-template's text is exactly what a chat request evaluates.
    let chat = json!({"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 2, "temperature": 0});
    let (_, prompt) = post_json(base, "/apply-template", &chat).await;
    let (_, tokens) = post_json(base, "/tokenize", &json!({"content": prompt["prompt"], "add_special": true})).await;
    let (_, reply) = post_json(base, "/v1/chat/completions", &chat).await;
    assert_eq!(tokens["tokens"].as_array().map(|t| t.len() as u64), reply["usage"]["prompt_tokens"].as_u64());
}

#[tokio::test]
async fn bad_input_to_the_new_endpoints_gets_a_4xx_envelope_and_changes_nothing() {
    let (_guard, server) = exclusive_server().await;
    let base = server.base.as_str();
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        ("/v1/completions", json!({"max_tokens": 4}), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": ["a", "b"]}), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "x", "logprobs": 6}), 400, Some("logprobs")),
        ("/v1/completions", json!({"prompt": "x", "suffix": "y"}), 400, Some("suffix")),
        ("/v1/completions", json!({"prompt": [1, 99_999_999]}), 400, None),
        ("/v1/completions", json!({"prompt": "x", "temperature": "hot"}), 400, Some("temperature")),
        ("/v1/responses", json!({"model": "m"}), 400, Some("input")),
        ("/v1/responses", json!({"input": "x", "tools": [{"type": "file_search"}]}), 400, Some("tools[0].type")),
        ("/v1/responses", json!({"input": "x", "background": true}), 400, Some("background")),
        ("/v1/responses", json!({"input": "x", "truncation": "auto"}), 400, Some("truncation")),
        ("/v1/responses", json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), 400, Some("input[0].type")),
        (
            "/v1/responses",
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            400,
            Some("text.format.schema"),
        ),
        ("/v1/responses", json!({"input": "x", "reasoning": {"effort": "max"}}), 400, Some("reasoning.effort")),
        (
            "/v1/responses",
            json!({"input": "x", "previous_response_id": "resp_gone"}),
            404,
            Some("previous_response_id"),
        ),
        ("/tokenize", json!({"content": 5}), 400, Some("content")),
        ("/detokenize", json!({"tokens": [-1]}), 400, None),
        ("/apply-template", json!({"messages": []}), 400, Some("messages")),
    ];
    for (path, body, status, param) in cases {
        let (got, answer) = post_json(base, path, &body).await;
        assert_eq!(got, status, "{path} {body}: {answer}");
        let error = &answer["error"];
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{path} {body}: {answer}");
        assert!(error["type"].is_string() && error.get("code").is_some(), "{answer}");
        assert_eq!(error["param"].as_str(), param, "{path} {body}: {answer}");
    }
    let client = reqwest::Client::new();
    let missing = client.get(format!("{base}/v1/responses/resp_gone")).send().await.expect("request");
    assert_eq!(missing.status().as_u16(), 404);
    let health = client.get(format!("{base}/health")).send().await.expect("request");
    assert_eq!(health.status().as_u16(), 200, "the server is still up");
}
