//! Scanning a call written as its name, a marker, then the arguments as JSON
//! (`get_weather<｜tool▁sep｜>{…}`, `get_weather[ARGS]{…}`).

use super::json_call::{ValueScan, ValueStep};
use super::literal::{match_literal, Match};
use super::{flush, is_name_char, ScanEvent};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Name,
    NameClose,
    Arguments,
    Done,
    Failed,
}

/// Scans NAME `name_close` {…}, streaming the arguments' text.
#[derive(Debug)]
pub(super) struct NamedCall {
    name_close: String,
    stage: Stage,
    name: String,
    value: ValueScan,
    /// Whether the arguments' first character was read (whitespace before it is skipped).
    in_arguments: bool,
}

impl NamedCall {
    pub(super) fn new(name_close: &str) -> Self {
        Self {
            name_close: name_close.to_string(),
            stage: Stage::Name,
            name: String::new(),
            value: ValueScan::default(),
            in_arguments: false,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    pub(super) fn failed(&self) -> bool {
        self.stage == Stage::Failed
    }

    pub(super) fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        let mut at = 0;
        let mut arguments = String::new();
        while at < input.len() {
            let rest = &input[at..];
            match self.stage {
                Stage::Name => {
                    let length = rest.len() - rest.trim_start_matches(is_name_char).len();
                    self.name.push_str(&rest[..length]);
                    at += length;
                    if at == input.len() {
                        break;
                    }
                    if self.name.is_empty() {
                        self.stage = Stage::Failed;
                        break;
                    }
                    events.push(ScanEvent::Name(std::mem::take(&mut self.name)));
                    self.stage = Stage::NameClose;
                }
                Stage::NameClose => match match_literal(rest, &self.name_close) {
                    Match::Full(used) => {
                        at += used;
                        self.stage = Stage::Arguments;
                    }
                    Match::Partial => break,
                    Match::No => {
                        self.stage = Stage::Failed;
                        break;
                    }
                },
                Stage::Arguments => {
                    let Some(c) = rest.chars().next() else { break };
                    if !self.in_arguments && c.is_whitespace() {
                        at += c.len_utf8();
                        continue;
                    }
                    self.in_arguments = true;
                    match self.value.step(c) {
                        ValueStep::Inside => {
                            arguments.push(c);
                            at += c.len_utf8();
                        }
                        ValueStep::Last => {
                            arguments.push(c);
                            at += c.len_utf8();
                            self.stage = Stage::Done;
                        }
                        ValueStep::Ended => self.stage = Stage::Done,
                    }
                }
                Stage::Done | Stage::Failed => break,
            }
        }
        flush(&mut arguments, events);
        at
    }
}
