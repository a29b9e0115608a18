//! llama.cpp's threads follow the machine: while other processes keep every core but one busy,
//! the engine computes with one thread (its spinning workers would otherwise wait for each
//! other at every barrier); once they stop, it goes back to what the measure allows. A reply
//! computed with one thread is the one a fixed two-thread engine gives (greedy).
//! The return needs the other cores free of other work while it runs (CI runs the test
//! binaries one at a time); with another build running beside it, it fails, never passes.
//! The counts checked are those llama.cpp reports for its context (`llama_n_threads`, read
//! back after each change), not the ones the engine asked for. Only the CPUs of the process's
//! affinity mask count: an engine started on one CPU computes with one thread.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{chat, greedy, smollm2_path, test_config};
use firstword::{ChatMessage, Engine, EngineConfig, ThreadsInUse};

/// Busy loops in other processes, stopped when dropped.
struct BusyLoops(Vec<Child>);

impl BusyLoops {
    fn start(count: usize) -> Self {
        Self(
            (0..count)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("a busy loop starts")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The tests take turns: each needs the machine's load to be what it makes it.
fn machine() -> MutexGuard<'static, ()> {
    static MACHINE: Mutex<()> = Mutex::new(());
    MACHINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The CPUs this thread may run on (what the engine it starts measures against).
fn mask() -> rustix::thread::CpuSet {
    rustix::thread::sched_getaffinity(None).expect("the test's affinity mask")
}

/// The threads a measure of `other` busy cores allows, configured for two.
fn allowed(threads: &ThreadsInUse) -> u32 {
    let busy = threads.other_busy_cores.round() as u32;
    let quota = threads.cpu_limit.map_or(u32::MAX, |limit| (limit as u32).max(1));
    2u32.min(threads.cpus.min(quota)).min(threads.cpus.saturating_sub(busy)).max(1)
}

fn question(text: &str) -> firstword::Prompt {
    chat(&[ChatMessage::system("You are a helpful home assistant."), ChatMessage::user(text)])
}

/// Sends short requests until `done` holds for the engine's threads once it is idle (the
/// engine measures the machine every 250 ms and sets the threads before a batch); panics
/// after a minute.
fn until(engine: &Engine, what: &str, done: impl Fn(&ThreadsInUse) -> bool) -> ThreadsInUse {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        greedy(engine, question("Say hello."), 8);
        engine.wait_idle_blocking();
        let threads = engine.threads();
        if done(&threads) {
            return threads;
        }
        assert!(Instant::now() < deadline, "{what}: still {threads:?} after a minute");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn threads_drop_to_one_while_other_processes_hold_the_other_cores_and_come_back() {
    let _machine = machine();
    let config = EngineConfig { threads: 2, threads_batch: 2, fixed_threads: false, ..test_config(smollm2_path()) };
    let engine = Engine::start(config.clone()).expect("SmolLM2 loads");
    engine.wait_idle_blocking();
    assert_eq!(engine.threads().counts, firstword::ThreadCounts { generation: 2, batch: 2 }, "configured at start");

    let cpus = mask().count() as usize;
    let load = BusyLoops::start(cpus.saturating_sub(1));
    let loaded = until(&engine, "under load", |t| t.counts.generation == 1 && t.counts.batch == 1);
    assert_eq!(loaded.cpus as usize, cpus);
    // A prompt the engine has not seen, evaluated and answered with one thread.
    let prompt = question("Name three rooms of a house, one per line.");
    let one_thread = greedy(&engine, prompt.clone(), 24);
    let usage = one_thread.usage;
    assert!(usage.prompt_tokens >= usage.cached_tokens + 10, "the question was evaluated here: {usage:?}");
    engine.wait_idle_blocking();
    assert_eq!(engine.threads().counts.generation, 1, "the load held while it was answered");
    drop(load);

    // The measure sees the busy loops gone, and the threads follow it.
    // (A reading taken as the threads dropped can be below a whole core: the loops' core is
    // then gone once the measure is under half a core either way.)
    let busy_before = loaded.other_busy_cores;
    let gone = (busy_before - 0.5).max(0.5);
    let after = until(&engine, "after the load", |t| t.other_busy_cores < gone);
    assert_eq!(after.counts.generation, allowed(&after), "{after:?}");
    assert_eq!(after.counts.batch, allowed(&after), "{after:?}");

    let fixed = Engine::start(EngineConfig { fixed_threads: true, ..config }).expect("SmolLM2 loads");
    let two_threads = greedy(&fixed, prompt, 24);
    assert_eq!(fixed.threads().counts, firstword::ThreadCounts { generation: 2, batch: 2 });
    assert_eq!(one_thread.text, two_threads.text, "the same reply at either thread count");
}

#[test]
fn only_the_cpus_of_the_affinity_mask_count() {
    let _machine = machine();
    let all = mask();
    let first = (0..rustix::thread::CpuSet::MAX_CPU).find(|&cpu| all.is_set(cpu)).expect("a CPU");
    let mut one = rustix::thread::CpuSet::new();
    one.set(first);
    // The engine's threads (the inference thread, the sampler, llama.cpp's workers) inherit
    // the mask of the thread that starts it, as a whole process does under `taskset -c 0`.
    rustix::thread::sched_setaffinity(None, &one).expect("the test thread pinned to one CPU");
    let started = Engine::start(EngineConfig {
        threads: 2,
        threads_batch: 2,
        fixed_threads: false,
        ..test_config(smollm2_path())
    });
    rustix::thread::sched_setaffinity(None, &all).expect("the test thread's mask restored");
    let engine = started.expect("SmolLM2 loads");
    engine.wait_idle_blocking();

    // Whatever runs on the machine's other CPUs, one CPU leaves room for one thread, for
    // generation and for prompts of any length, and llama.cpp computes with one.
    let one_thread = firstword::ThreadCounts { generation: 1, batch: 1 };
    let threads = until(&engine, "on one CPU", |t| t.cpus != 0 && t.counts == one_thread);
    assert_eq!(threads.cpus, 1, "{threads:?}");
    assert!(threads.other_busy_cores <= 1.0 + 1e-9, "only the one CPU is measured: {threads:?}");
    let long = question(&"Tell me about the kitchen. ".repeat(80));
    let answer = greedy(&engine, long, 4);
    assert!(answer.usage.prompt_tokens >= 256, "a long prompt batch: {:?}", answer.usage);
    engine.wait_idle_blocking();
    assert_eq!(engine.threads().counts, one_thread, "a long prompt keeps one thread on one CPU");
}
