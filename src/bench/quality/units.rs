//! Grading units: the distinct answers the servers gave to one item and sample, each under a
//! label (A, B, C …) drawn in an order shuffled per unit from the run's secret, so that neither
//! the order nor the labels say which server wrote what. Servers that gave the same answer
//! share one label: the grader scores that text once.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

use super::items::QualityItem;
use super::Answer;

/// Which item and sample a unit grades.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UnitKey {
    /// The item's id.
    pub item: String,
    /// The sample (0: greedy).
    pub sample: u32,
}

/// One distinct answer of a unit.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// `A`, `B`, … in the unit's shuffled order.
    pub label: String,
    /// The answer as the grader reads it: its text, then its tool calls.
    pub text: String,
    /// The servers that gave it (never shown before the unit is graded).
    pub servers: Vec<String>,
}

/// The distinct answers to one item and sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// The item and sample.
    pub key: UnitKey,
    /// The item asked.
    pub item: QualityItem,
    /// The distinct answers, in label order.
    pub choices: Vec<Choice>,
}

impl Unit {
    /// The servers behind each label.
    #[must_use]
    pub fn reveal(&self) -> BTreeMap<String, Vec<String>> {
        self.choices.iter().map(|c| (c.label.clone(), c.servers.clone())).collect()
    }

    /// Per server, the score its answer got, from scores per label; `None` when a label has
    /// no score, an unknown label is given, or a score is outside 1..=5.
    #[must_use]
    pub fn scores_by_server(&self, by_label: &BTreeMap<String, f64>) -> Option<BTreeMap<String, f64>> {
        if by_label.len() != self.choices.len() || by_label.values().any(|s| !(1.0..=5.0).contains(s)) {
            return None;
        }
        let mut scores = BTreeMap::new();
        for choice in &self.choices {
            let score = *by_label.get(&choice.label)?;
            for server in &choice.servers {
                scores.insert(server.clone(), score);
            }
        }
        Some(scores)
    }
}

/// The text a grader reads for one answer: the content, each tool call on a line of its own
/// (`→ name(arguments)`), or why there was no answer.
#[must_use]
pub fn answer_text(answer: &Answer) -> String {
    let mut text = answer.content.trim().to_string();
    for call in &answer.tool_calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("→ {}({})", call.name, call.arguments));
    }
    if text.is_empty() {
        text = if answer.error.is_empty() {
            "(an empty answer)".into()
        } else {
            format!("(no answer: {})", failure(&answer.error))
        };
    }
    text
}

/// What a grader may read of a request's failure: its HTTP status, or that it failed; never
/// the rest (an error may quote the server's URL, which would name it).
fn failure(error: &str) -> String {
    match error.split_whitespace().take(2).collect::<Vec<_>>()[..] {
        ["HTTP", status] => format!("HTTP {}", status.trim_end_matches(':')),
        _ => "the request failed".into(),
    }
}

/// The label of the `index`-th choice: A … Z, then AA, AB, ….
fn label(index: usize) -> String {
    let letter = |n: usize| char::from(b'A' + u8::try_from(n % 26).unwrap_or(0));
    if index < 26 {
        letter(index).to_string()
    } else {
        format!("{}{}", letter(index / 26 - 1), letter(index))
    }
}

/// A number drawn from `secret` and `key`: the same for one run and unit, unpredictable without
/// the secret.
fn draw(secret: u64, key: &UnitKey, round: u64) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (secret, key, round).hash(&mut hasher);
    hasher.finish()
}

/// The units of a run, in the set's item order then by sample: answers grouped by their text,
/// the groups shuffled (Fisher–Yates from the secret) and labelled.
#[must_use]
pub fn units(items: &[QualityItem], answers: &[Answer], secret: u64) -> Vec<Unit> {
    let mut units = Vec::new();
    for item in items {
        let mut samples: Vec<u32> = answers.iter().filter(|a| a.item == item.id).map(|a| a.sample).collect();
        samples.sort_unstable();
        samples.dedup();
        for sample in samples {
            let key = UnitKey { item: item.id.clone(), sample };
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for answer in answers.iter().filter(|a| a.item == item.id && a.sample == sample) {
                let text = answer_text(answer);
                match groups.iter_mut().find(|(t, _)| *t == text) {
                    Some((_, servers)) if !servers.contains(&answer.server) => servers.push(answer.server.clone()),
                    Some(_) => {}
                    None => groups.push((text, vec![answer.server.clone()])),
                }
            }
            for i in (1..groups.len()).rev() {
                let j = usize::try_from(draw(secret, &key, i as u64) % (i as u64 + 1)).unwrap_or(0);
                groups.swap(i, j);
            }
            let choices = groups
                .into_iter()
                .enumerate()
                .map(|(i, (text, servers))| Choice { label: label(i), text, servers })
                .collect();
            units.push(Unit { key, item: item.clone(), choices });
        }
    }
    units
}

#[cfg(test)]
mod tests {
    use super::super::AnsweredCall;
    use super::*;

    fn answer(item: &str, server: &str, content: &str) -> Answer {
        Answer { item: item.into(), sample: 0, server: server.into(), content: content.into(), ..Answer::default() }
    }

    fn items(ids: &[&str]) -> Vec<QualityItem> {
        ids.iter()
            .map(|id| QualityItem {
                id: (*id).into(),
                messages: vec![],
                tools: None,
                reference: None,
                rubric: None,
                max_tokens: None,
            })
            .collect()
    }

    #[test]
    fn equal_answers_share_a_label_and_scores_map_back_to_every_server() {
        let answers = [
            answer("a", "x", "Paris."),
            answer("a", "y", " Paris.\n"),
            answer("a", "z", "It is Lyon."),
            answer("b", "x", ""),
        ];
        let units = units(&items(&["a", "b"]), &answers, 7);
        assert_eq!(units.len(), 2);
        assert_eq!(units[0].choices.len(), 2);
        let paris = units[0].choices.iter().find(|c| c.text == "Paris.").expect("unit");
        assert_eq!(paris.servers, ["x", "y"]);
        let by_label: BTreeMap<String, f64> =
            units[0].choices.iter().map(|c| (c.label.clone(), if c.text == "Paris." { 5.0 } else { 1.0 })).collect();
        let scores = units[0].scores_by_server(&by_label).expect("unit");
        assert_eq!(scores, BTreeMap::from([("x".into(), 5.0), ("y".into(), 5.0), ("z".into(), 1.0)]));
        assert_eq!(units[1].choices[0].text, "(an empty answer)");
    }

    #[test]
    fn scores_must_cover_every_label_within_the_rubric() {
        let answers = [answer("a", "x", "1"), answer("a", "y", "2")];
        let unit = &units(&items(&["a"]), &answers, 1)[0];
        let only_a = BTreeMap::from([("A".to_string(), 3.0)]);
        assert_eq!(unit.scores_by_server(&only_a), None);
        let out_of_range = BTreeMap::from([("A".to_string(), 3.0), ("B".to_string(), 6.0)]);
        assert_eq!(unit.scores_by_server(&out_of_range), None);
        let unknown = BTreeMap::from([("A".to_string(), 3.0), ("C".to_string(), 2.0)]);
        assert_eq!(unit.scores_by_server(&unknown), None);
    }

    #[test]
    fn the_order_follows_the_secret_and_not_the_servers() {
        let answers: Vec<Answer> = (0..40)
            .map(|i| answer(&format!("i{i}"), "first", "one"))
            .chain((0..40).map(|i| answer(&format!("i{i}"), "second", "two")))
            .collect();
        let ids: Vec<String> = (0..40).map(|i| format!("i{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let first_is_a =
            |secret| units(&items(&ids), &answers, secret).iter().filter(|u| u.choices[0].servers == ["first"]).count();
        // About half of the units put the first server's answer under A, and another secret
        // draws another order; the same secret the same one.
        let a = first_is_a(1);
        assert!((10..=30).contains(&a), "{a} of 40");
        assert_eq!(first_is_a(1), a);
        assert_ne!(
            units(&items(&ids), &answers, 1).iter().map(|u| u.choices[0].servers.clone()).collect::<Vec<_>>(),
            units(&items(&ids), &answers, 2).iter().map(|u| u.choices[0].servers.clone()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn tool_calls_and_errors_are_part_of_the_text() {
        let mut call = answer("a", "x", "");
        call.tool_calls.push(AnsweredCall { name: "set_timer".into(), arguments: "{\"minutes\":10}".into() });
        assert_eq!(answer_text(&call), "→ set_timer({\"minutes\":10})");
        let mut failed = answer("a", "x", "");
        failed.error = "HTTP 500: boom".into();
        assert_eq!(answer_text(&failed), "(no answer: HTTP 500)");
        failed.error = "unreachable: error sending request for url (http://127.0.0.1:8081/v1/chat/completions)".into();
        assert_eq!(answer_text(&failed), "(no answer: the request failed)");
        assert_eq!((label(0), label(25), label(26), label(27)), ("A".into(), "Z".into(), "AA".into(), "AB".into()));
    }
}
