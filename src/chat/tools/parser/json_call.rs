//! Scanning one JSON call object (`{"name": …, "arguments": …}`) as it streams.

use super::{flush, ScanEvent};

/// Where a JSON call object scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonStage {
    Open,
    KeyOrEnd,
    Key,
    Colon,
    ValueStart,
    NameString,
    Value,
    AfterValue,
    Done,
    Failed,
}

/// Scans `{"name": "…", "arguments": {…}}` (the format's own keys, in any order, others skipped), streaming the
/// arguments' text. Arguments written before the name are held until the name is known.
#[derive(Debug)]
pub(super) struct JsonCall {
    name_key: String,
    args_key: String,
    stage: JsonStage,
    /// Raw text of the key or name string being read, quotes included.
    raw: String,
    escaped: bool,
    key: String,
    value: ValueScan,
    name_known: bool,
    early_arguments: String,
}

impl JsonCall {
    pub(super) fn is_done(&self) -> bool {
        self.stage == JsonStage::Done
    }

    /// Not a call after all.
    pub(super) fn failed(&self) -> bool {
        self.stage == JsonStage::Failed
    }

    pub(super) fn new(name_key: &str, args_key: &str) -> Self {
        Self {
            name_key: name_key.to_string(),
            args_key: args_key.to_string(),
            stage: JsonStage::Open,
            raw: String::new(),
            escaped: false,
            key: String::new(),
            value: ValueScan::default(),
            name_known: false,
            early_arguments: String::new(),
        }
    }

    pub(super) fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        let mut arguments = String::new();
        for (at, c) in input.char_indices() {
            if matches!(self.stage, JsonStage::Done | JsonStage::Failed) {
                flush(&mut arguments, events);
                return at;
            }
            self.step(c, &mut arguments, events);
        }
        flush(&mut arguments, events);
        input.len()
    }

    fn step(&mut self, c: char, arguments: &mut String, events: &mut Vec<ScanEvent>) {
        use JsonStage as S;
        match self.stage {
            _ if c.is_whitespace()
                && matches!(self.stage, S::Open | S::KeyOrEnd | S::Colon | S::ValueStart | S::AfterValue) => {}
            S::Open => self.stage = if c == '{' { S::KeyOrEnd } else { S::Failed },
            S::KeyOrEnd => match c {
                '"' => self.start_string(S::Key),
                '}' => self.stage = S::Done,
                _ => self.stage = S::Failed,
            },
            S::Key | S::NameString => {
                if !self.string_char(c) {
                    return;
                }
                let text: String = serde_json::from_str(&self.raw).unwrap_or_default();
                if self.stage == S::Key {
                    self.key = text;
                    self.stage = S::Colon;
                } else {
                    flush(arguments, events);
                    events.push(ScanEvent::Name(text));
                    self.name_known = true;
                    if !self.early_arguments.is_empty() {
                        events.push(ScanEvent::Arguments(std::mem::take(&mut self.early_arguments)));
                    }
                    self.stage = S::AfterValue;
                }
            }
            S::Colon => self.stage = if c == ':' { S::ValueStart } else { S::Failed },
            S::ValueStart if self.key == self.name_key && c == '"' => self.start_string(S::NameString),
            S::ValueStart => {
                self.value = ValueScan::default();
                self.stage = S::Value;
                self.step(c, arguments, events);
            }
            S::Value => {
                let step = self.value.step(c);
                if step != ValueStep::Ended && self.key == self.args_key {
                    if self.name_known {
                        arguments.push(c);
                    } else {
                        self.early_arguments.push(c);
                    }
                }
                match step {
                    ValueStep::Inside => {}
                    ValueStep::Last => self.stage = S::AfterValue,
                    ValueStep::Ended => {
                        self.stage = S::AfterValue;
                        self.step(c, arguments, events);
                    }
                }
            }
            S::AfterValue => match c {
                ',' => self.stage = S::KeyOrEnd,
                '}' => self.stage = S::Done,
                _ => self.stage = S::Failed,
            },
            S::Done | S::Failed => {}
        }
    }

    fn start_string(&mut self, stage: JsonStage) {
        self.raw.clear();
        self.raw.push('"');
        self.escaped = false;
        self.stage = stage;
    }

    /// Adds a character of a JSON string; true when it closed the string.
    fn string_char(&mut self, c: char) -> bool {
        self.raw.push(c);
        if self.escaped {
            self.escaped = false;
        } else if c == '\\' {
            self.escaped = true;
        } else if c == '"' {
            return true;
        }
        false
    }
}

/// Follows one JSON value character by character to find where it ends.
#[derive(Debug, Default)]
pub(super) struct ValueScan {
    started: bool,
    depth: u32,
    in_string: bool,
    escaped: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum ValueStep {
    /// The character belongs to the value, which goes on.
    Inside,
    /// The character was the value's last.
    Last,
    /// The value had already ended; the character is not part of it.
    Ended,
}

impl ValueScan {
    /// Reads the next character of the value.
    pub(super) fn step(&mut self, c: char) -> ValueStep {
        if !self.started {
            self.started = true;
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth = 1,
                _ => {}
            }
            return ValueStep::Inside;
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 0 {
                    return ValueStep::Last;
                }
            }
            return ValueStep::Inside;
        }
        if self.depth == 0 {
            // A number or literal ends at the first character that cannot continue it.
            return if c == ',' || c == '}' || c == ']' || c.is_whitespace() {
                ValueStep::Ended
            } else {
                ValueStep::Inside
            };
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    return ValueStep::Last;
                }
            }
            _ => {}
        }
        ValueStep::Inside
    }
}
