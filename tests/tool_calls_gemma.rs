//! The tool-call checks of tests/tool_calls.rs on gemma-3, a sliding-window model without a
//! chat template of its own.

mod common;

use common::tools::{
    auto_never_leaks_markers, follow_up_after_a_tool_result_is_cached, forced_calls_always_validate,
    json_schema_replies_validate, streamed_calls_match_the_answer,
};
use common::{gemma3_path, one_sequence_config, SharedServer};

/// One gemma-3 server for the tests of this file, one test at a time, with one sequence: the
/// streamed answer is compared with the same request answered before, token for token, and
/// with several sequences the conversations of earlier tests stay kept in their cells, whose
/// places change llama.cpp's sums between the two (docs/serving.md).
static GEMMA3: SharedServer = SharedServer::configured(|| one_sequence_config(gemma3_path()));

#[tokio::test]
async fn gemma3_forced_calls_always_parse_and_validate() {
    let (_guard, server) = GEMMA3.exclusive().await;
    let (required, named) = forced_calls_always_validate(server).await;
    println!("gemma-3: required {required}/20, named {named}/20 calls valid");
}

#[tokio::test]
async fn gemma3_streamed_call_deltas_rebuild_the_answer() {
    let (_guard, server) = GEMMA3.exclusive().await;
    streamed_calls_match_the_answer(server).await;
}

#[tokio::test]
async fn gemma3_json_schema_replies_validate() {
    let (_guard, server) = GEMMA3.exclusive().await;
    json_schema_replies_validate(server).await;
}

#[tokio::test]
async fn gemma3_serves_the_turn_after_a_tool_result_from_the_cache() {
    let (_guard, server) = GEMMA3.exclusive().await;
    let (prompt, completion, cached) = follow_up_after_a_tool_result_is_cached(server).await;
    println!("gemma-3 follow-up: first prompt {prompt} + reply {completion} tokens, next turn cached {cached}");
}

#[tokio::test]
async fn gemma3_never_leaks_call_markers_into_content_in_auto_mode() {
    let (_guard, server) = GEMMA3.exclusive().await;
    auto_never_leaks_markers(server).await;
}
