//! llama.cpp's and ggml's log, routed into `tracing` under the target `llama-cpp-2`.
//!
//! llama.cpp writes some lines in pieces: a message at a level, then `CONT` pieces that
//! continue it (the dots of a model load's progress). llama-cpp-2's own bridge aborts the
//! process when a `CONT` piece arrives before any leveled message (it panics inside a C
//! callback, which cannot unwind); here pieces are joined into lines, and a piece with
//! nothing before it is a debug line.

use std::sync::Mutex;

/// The level of a llama.cpp log message (ggml's `ggml_log_level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogLevel {
    /// Details (`GGML_LOG_LEVEL_DEBUG`, and anything unknown).
    Debug,
    /// Progress and facts (`GGML_LOG_LEVEL_INFO`).
    Info,
    /// `GGML_LOG_LEVEL_WARN`.
    Warn,
    /// `GGML_LOG_LEVEL_ERROR`.
    Error,
    /// Continues the previous message (`GGML_LOG_LEVEL_CONT`).
    Continue,
}

impl LogLevel {
    /// The level for ggml's (`ggml.h`; none and unknown ones are debug).
    pub(crate) fn from_ggml(level: llama_cpp_sys_2::ggml_log_level) -> Self {
        match level {
            llama_cpp_sys_2::GGML_LOG_LEVEL_INFO => Self::Info,
            llama_cpp_sys_2::GGML_LOG_LEVEL_WARN => Self::Warn,
            llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR => Self::Error,
            llama_cpp_sys_2::GGML_LOG_LEVEL_CONT => Self::Continue,
            _ => Self::Debug,
        }
    }
}

/// A line longer than this without a newline is logged as it is, so the buffer stays small.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// Joins llama.cpp's message pieces into whole lines.
#[derive(Debug, Default)]
pub(crate) struct LineAssembler {
    /// The line begun and not yet ended, and its level.
    open: Option<(LogLevel, String)>,
}

impl LineAssembler {
    /// Takes one piece and returns the lines it completes, each with its level (never
    /// `Continue`), without their trailing newline.
    pub(crate) fn push(&mut self, level: LogLevel, text: &str) -> Vec<(LogLevel, String)> {
        let mut lines = Vec::new();
        let (level, mut line) = match (level, self.open.take()) {
            (LogLevel::Continue, Some(open)) => open,
            (LogLevel::Continue, None) => (LogLevel::Debug, String::new()),
            (level, Some(open)) => {
                lines.push(open);
                (level, String::new())
            }
            (level, None) => (level, String::new()),
        };
        for piece in text.split_inclusive('\n') {
            line.push_str(piece);
            if line.ends_with('\n') || line.len() >= MAX_LINE_BYTES {
                lines.push((level, std::mem::take(&mut line)));
            }
        }
        if !line.is_empty() {
            self.open = Some((level, line));
        }
        for (_, text) in &mut lines {
            while text.ends_with('\n') || text.ends_with('\r') {
                text.pop();
            }
        }
        lines.retain(|(_, text)| !text.is_empty());
        lines
    }
}

/// The one assembler of the process: llama.cpp's callback is process-wide.
static ASSEMBLER: Mutex<LineAssembler> = Mutex::new(LineAssembler { open: None });

/// Logs one piece of a llama.cpp message (called from the C callback in `ffi`). Never panics.
pub(crate) fn log_piece(level: llama_cpp_sys_2::ggml_log_level, text: &str) {
    let lines = match ASSEMBLER.lock() {
        Ok(mut assembler) => assembler.push(LogLevel::from_ggml(level), text),
        Err(poisoned) => poisoned.into_inner().push(LogLevel::from_ggml(level), text),
    };
    for (level, line) in lines {
        let level = if level != LogLevel::Debug && reports_a_stopped_decode(&line) { LogLevel::Debug } else { level };
        match level {
            LogLevel::Error => tracing::error!(target: "llama-cpp-2", "{line}"),
            LogLevel::Warn => tracing::warn!(target: "llama-cpp-2", "{line}"),
            LogLevel::Info => tracing::info!(target: "llama-cpp-2", "{line}"),
            LogLevel::Debug | LogLevel::Continue => tracing::debug!(target: "llama-cpp-2", "{line}"),
        }
    }
}

/// Whether `line` is one of llama.cpp's lines about a decode its abort callback stopped (a
/// reply whose client left, see `ffi::stop_decodes_with`): expected, so not a warning. Status 1
/// is `GGML_STATUS_ABORTED`, `llama_decode`'s 2 an abort; the removal of the stopped batch's
/// positions follows every failed batch (a real failure still logs its own error).
fn reports_a_stopped_decode(line: &str) -> bool {
    line.ends_with("graph_compute_async failed with error 1")
        || line.ends_with("failed to compute graph, compute status: 1")
        || line.ends_with("failed to decode, ret = 2")
        || line.contains("removing memory module entries")
}

#[cfg(test)]
mod tests {
    use super::{reports_a_stopped_decode, LineAssembler, LogLevel};

    #[test]
    fn a_stopped_decode_is_told_apart_from_a_failed_one() {
        // llama.cpp's lines for a decode its abort callback stopped.
        for line in [
            "graph_compute: ggml_backend_sched_graph_compute_async failed with error 1",
            "process_ubatch: failed to compute graph, compute status: 1",
            "decode: removing memory module entries for seq_id = 0, pos = [27, +inf)",
            "llama_decode: failed to decode, ret = 2",
        ] {
            assert!(reports_a_stopped_decode(line), "{line}");
        }
        // A real failure keeps its level.
        for line in
            ["llama_decode: failed to decode, ret = -3", "process_ubatch: failed to compute graph, compute status: -1"]
        {
            assert!(!reports_a_stopped_decode(line), "{line}");
        }
    }

    #[test]
    fn a_continuation_with_nothing_before_it_is_a_debug_line() {
        // The message that aborted llama-cpp-2's bridge: progress dots before any other log.
        let mut assembler = LineAssembler::default();
        assert!(assembler.push(LogLevel::Continue, ".").is_empty());
        assert!(assembler.push(LogLevel::Continue, ".").is_empty());
        assert_eq!(assembler.push(LogLevel::Continue, ".\n"), vec![(LogLevel::Debug, "...".to_string())]);
    }

    #[test]
    fn continuations_join_the_line_they_continue_at_its_level() {
        let mut assembler = LineAssembler::default();
        assert!(assembler.push(LogLevel::Info, "load_tensors: loading").is_empty());
        assert!(assembler.push(LogLevel::Continue, " ...").is_empty());
        assert_eq!(
            assembler.push(LogLevel::Continue, " done\n"),
            vec![(LogLevel::Info, "load_tensors: loading ... done".into())]
        );
    }

    #[test]
    fn a_new_message_ends_an_unfinished_line_and_pieces_split_at_newlines() {
        let mut assembler = LineAssembler::default();
        assert!(assembler.push(LogLevel::Warn, "half").is_empty());
        assert_eq!(
            assembler.push(LogLevel::Error, "one\ntwo\nthree"),
            vec![(LogLevel::Warn, "half".into()), (LogLevel::Error, "one".into()), (LogLevel::Error, "two".into())]
        );
        assert_eq!(assembler.push(LogLevel::Continue, "\n"), vec![(LogLevel::Error, "three".into())]);
        assert_eq!(LogLevel::from_ggml(llama_cpp_sys_2::GGML_LOG_LEVEL_NONE), LogLevel::Debug);
        assert_eq!(LogLevel::from_ggml(llama_cpp_sys_2::GGML_LOG_LEVEL_CONT), LogLevel::Continue);
    }

    #[test]
    fn a_line_without_newline_stays_bounded() {
        let mut assembler = LineAssembler::default();
        let mut emitted = 0;
        for _ in 0..10_000 {
            emitted += assembler.push(LogLevel::Continue, ".").len();
        }
        assert!(emitted >= 1);
        assert!(assembler.open.as_ref().map_or(0, |(_, line)| line.len()) < super::MAX_LINE_BYTES);
    }
}
