//! Scanning a call in Python syntax (`get_weather(city="Paris", days=3)`, LFM2), converting it
//! to JSON: each argument is sent once its value is complete.

use serde_json::Value;

use super::{is_name_char, ScanEvent};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    Name,
    Open,
    KeyOrEnd,
    Key,
    Value,
    Done,
    Failed,
}

/// Scans `name(key=value, …)`.
#[derive(Debug, Default)]
pub(super) struct PythonicCall {
    stage: Stage,
    name: String,
    key: String,
    value: String,
    /// Open brackets and the quote of the string being read, innermost last.
    nesting: Vec<char>,
    escaped: bool,
    count: usize,
}

impl PythonicCall {
    pub(super) fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    pub(super) fn failed(&self) -> bool {
        self.stage == Stage::Failed
    }

    pub(super) fn feed(&mut self, input: &str, events: &mut Vec<ScanEvent>) -> usize {
        for (at, c) in input.char_indices() {
            match self.stage {
                Stage::Done | Stage::Failed => return at,
                Stage::Name if is_name_char(c) => self.name.push(c),
                Stage::Name if !self.name.is_empty() => {
                    events.push(ScanEvent::Name(std::mem::take(&mut self.name)));
                    self.stage = if c == '(' { Stage::KeyOrEnd } else { Stage::Open };
                }
                Stage::Name => self.stage = Stage::Failed,
                Stage::Open if c.is_whitespace() => {}
                Stage::Open => self.stage = if c == '(' { Stage::KeyOrEnd } else { Stage::Failed },
                Stage::KeyOrEnd if c.is_whitespace() || c == ',' => {}
                Stage::KeyOrEnd if c == ')' => {
                    events.push(ScanEvent::Arguments(if self.count == 0 { "{}" } else { "}" }.into()));
                    self.stage = Stage::Done;
                }
                Stage::KeyOrEnd => {
                    self.key = c.to_string();
                    self.stage = Stage::Key;
                }
                Stage::Key if c == '=' => {
                    self.value.clear();
                    self.stage = Stage::Value;
                }
                Stage::Key => self.key.push(c),
                Stage::Value => {
                    if self.nesting.is_empty() && (c == ',' || c == ')') {
                        let value = python_to_json(self.value.trim())
                            .unwrap_or_else(|| Value::String(self.value.trim().into()));
                        let opening = if self.count == 0 { "{" } else { ", " };
                        let key = Value::String(self.key.trim().to_string());
                        events.push(ScanEvent::Arguments(format!(
                            "{opening}{key}: {}",
                            crate::chat::python_json(&value)
                        )));
                        self.count += 1;
                        if c == ')' {
                            events.push(ScanEvent::Arguments("}".into()));
                            self.stage = Stage::Done;
                        } else {
                            self.stage = Stage::KeyOrEnd;
                        }
                        continue;
                    }
                    self.value.push(c);
                    self.track(c);
                }
            }
        }
        input.len()
    }

    /// Follows strings and brackets in a value.
    fn track(&mut self, c: char) {
        match self.nesting.last().copied() {
            Some(quote @ ('"' | '\'')) => {
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' {
                    self.escaped = true;
                } else if c == quote {
                    self.nesting.pop();
                }
            }
            _ => match c {
                '"' | '\'' | '[' | '{' | '(' => self.nesting.push(c),
                ']' | '}' | ')' => {
                    self.nesting.pop();
                }
                _ => {}
            },
        }
    }
}

/// A Python literal (strings in either quote, numbers, `True`/`False`/`None`, lists, tuples
/// and dicts) as JSON; `None` if it is not one.
pub(crate) fn python_to_json(text: &str) -> Option<Value> {
    let mut parser = Literal { chars: text.chars().collect(), at: 0 };
    let value = parser.value()?;
    parser.skip_space();
    (parser.at == parser.chars.len()).then_some(value)
}

struct Literal {
    chars: Vec<char>,
    at: usize,
}

impl Literal {
    fn skip_space(&mut self) {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        match *self.chars.get(self.at)? {
            quote @ ('"' | '\'') => self.string(quote).map(Value::String),
            '[' | '(' => {
                let close = if self.chars[self.at] == '[' { ']' } else { ')' };
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_space();
                    if self.chars.get(self.at) == Some(&close) {
                        self.at += 1;
                        return Some(Value::Array(items));
                    }
                    items.push(self.value()?);
                    self.skip_space();
                    if self.chars.get(self.at) == Some(&',') {
                        self.at += 1;
                    }
                }
            }
            '{' => {
                self.at += 1;
                let mut map = serde_json::Map::new();
                loop {
                    self.skip_space();
                    if self.chars.get(self.at) == Some(&'}') {
                        self.at += 1;
                        return Some(Value::Object(map));
                    }
                    let key = match self.value()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.skip_space();
                    (self.chars.get(self.at) == Some(&':')).then_some(())?;
                    self.at += 1;
                    let value = self.value()?;
                    map.insert(key, value);
                    self.skip_space();
                    if self.chars.get(self.at) == Some(&',') {
                        self.at += 1;
                    }
                }
            }
            _ => {
                let start = self.at;
                while self.chars.get(self.at).is_some_and(|c| c.is_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
                {
                    self.at += 1;
                }
                let word: String = self.chars[start..self.at].iter().collect();
                match word.as_str() {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    number => serde_json::from_str::<serde_json::Number>(number).ok().map(Value::Number),
                }
            }
        }
    }

    fn string(&mut self, quote: char) -> Option<String> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let c = *self.chars.get(self.at)?;
            self.at += 1;
            match c {
                '\\' => {
                    let escaped = *self.chars.get(self.at)?;
                    self.at += 1;
                    out.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        other => other,
                    });
                }
                c if c == quote => return Some(out),
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_literals_become_json() {
        assert_eq!(python_to_json("'it\\'s'"), Some(Value::String("it's".into())));
        assert_eq!(
            python_to_json("{'a': [1, 2.5, True, None], \"b\": (3,)}"),
            Some(serde_json::json!({"a": [1, 2.5, true, null], "b": [3]}))
        );
        assert_eq!(python_to_json("-3"), Some(serde_json::json!(-3)));
        assert_eq!(python_to_json("Paris"), None);
    }
}
