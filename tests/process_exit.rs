//! A process may end while its engine computes: a test binary whose engines live in statics
//! ends after its last test, an embedder's `main` returns mid-reply. `exit` then runs the
//! destructors of llama.cpp's static objects; if the inference thread were still inside
//! `llama_decode` it would read freed memory (CI saw such a test binary die with SIGSEGV after
//! all its tests passed). The engine stops itself first: this test runs a child process (this
//! binary, one ignored test) that leaves a reply streaming and returns, and checks it exits
//! cleanly with the engine already stopped when the child's own exit check runs.

#![allow(unsafe_code)]

mod common;

use std::process::Command;
use std::sync::OnceLock;

use common::{smollm2_path, test_config};
use firstword::{ChatMessage, Engine, Event, Generation, GenerationRequest, Grammar};

/// What the child prints when its exit check finds the inference thread still busy.
const STILL_COMPUTING: &str = "the engine was still computing when the process exited";

/// The child's engine and its reply, alive until the process ends (statics are never dropped).
static CHILD: OnceLock<(Engine, parking_lot::Mutex<Generation>)> = OnceLock::new();

#[test]
fn a_process_that_ends_while_a_reply_streams_exits_cleanly_with_the_engine_stopped() {
    for attempt in 1..=3 {
        let child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--ignored", "--exact", "child_leaves_a_reply_streaming", "--nocapture", "--test-threads=1"])
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&child.stdout);
        let stderr = String::from_utf8_lossy(&child.stderr);
        assert!(stdout.contains("1 passed"), "attempt {attempt}: the child's test ran\n{stdout}\n{stderr}");
        assert!(!stderr.contains(STILL_COMPUTING), "attempt {attempt}: {stderr}");
        assert!(child.status.success(), "attempt {attempt}: the child ended with {:?}\n{stderr}", child.status);
    }
}

/// Run only by the test above, as its child process.
#[test]
#[ignore = "the child process of a_process_that_ends_while_a_reply_streams_exits_cleanly_with_the_engine_stopped"]
fn child_leaves_a_reply_streaming() {
    // Registered before the engine starts, so it runs after the engine's own exit hook (the C
    // library runs them last registered first). Without that hook, llama.cpp's destructors
    // run before this one, and the child either dies or reports here.
    extern "C" {
        fn atexit(hook: extern "C" fn()) -> std::os::raw::c_int;
    }
    extern "C" fn check_engine_stopped() {
        if CHILD.get().is_some_and(|(engine, _)| engine.load().busy) {
            eprintln!("{STILL_COMPUTING}");
        }
    }
    // SAFETY: atexit stores a function pointer valid for the whole run; the hook cannot unwind.
    assert_eq!(unsafe { atexit(check_engine_stopped) }, 0);

    let engine = Engine::start(test_config(smollm2_path())).expect("SmolLM2 loads");
    let mut request = GenerationRequest::chat(vec![ChatMessage::user("Count to a thousand.")]);
    // A reply that cannot end before the process does: letters without end, no end of turn.
    request.grammar = Some(Grammar {
        gbnf: "root ::= [a-z] root".into(),
        root: "root".into(),
        triggers: Vec::new(),
        anchored_triggers: Vec::new(),
    });
    request.max_tokens = Some(4000);
    let mut generation = engine.submit(request).expect("queued");
    loop {
        match generation.next_blocking() {
            Some(Event::Text(_)) => break,
            Some(Event::Started { .. } | Event::Logprobs(_)) => {}
            other => panic!("the reply streams: {other:?}"),
        }
    }
    assert!(engine.load().busy, "the reply is still being generated");
    assert!(CHILD.set((engine, parking_lot::Mutex::new(generation))).is_ok());
}
