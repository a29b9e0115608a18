//! Blind grading by a judge model (`--judge URL`): any OpenAI-compatible server scores each
//! unit's answers on the person's rubric, the answers anonymised as "Answer 1", "Answer 2" …
//! and shown twice, in label order and reversed, so that a judge's preference for a position
//! cancels out: each answer's score is the mean of its two. A reply that is not the scores
//! asked for is reported with its first words, never guessed at.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::store::RunDir;
use super::units::Unit;
use super::{latest_grades, Grade, Grader, QualityError, UnitKey};

/// The judge: where it is and what to ask it for.
#[derive(Clone, Debug)]
pub struct JudgeConfig {
    /// Base URL (with or without `/v1`).
    pub url: String,
    /// `model` sent in its requests.
    pub model: String,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// What a judge run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JudgeReport {
    /// Units graded now.
    pub graded: usize,
    /// Units graded before (a judge run resumes).
    pub already: usize,
    /// Units the judge did not grade, and why.
    pub failures: Vec<(UnitKey, String)>,
}

const RUBRIC: &str = "You grade the answers of a voice assistant, blind. Score each answer from 1 to 5: \
    5 is correct, useful and fit to be spoken aloud (short, plain sentences, no markdown); 1 is wrong, \
    useless or harmful. A tool call counts as the assistant acting. The order of the answers means nothing.";

/// The conversation as the judge reads it.
fn conversation(unit: &Unit) -> String {
    let mut text = String::new();
    for message in &unit.item.messages {
        let role = message["role"].as_str().unwrap_or("?");
        let content = match &message["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .map(|p| {
                    p["text"]
                        .as_str()
                        .map_or_else(|| format!("[{}]", p["type"].as_str().unwrap_or("part")), str::to_string)
                })
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        };
        text.push_str(&format!("{role}: {content}\n"));
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let function = &call["function"];
            text.push_str(&format!(
                "{role} calls {}({})\n",
                function["name"].as_str().unwrap_or("?"),
                function["arguments"].as_str().unwrap_or("")
            ));
        }
    }
    if let Some(tools) = unit.item.tools() {
        let names: Vec<&str> =
            tools.as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str()).collect();
        text.push_str(&format!("(tools offered: {})\n", names.join(", ")));
    }
    text
}

/// The request for one order of the answers.
fn request(config: &JudgeConfig, unit: &Unit, order: &[usize]) -> Value {
    let mut prompt = format!("Conversation:\n{}", conversation(unit));
    if let Some(reference) = &unit.item.reference {
        prompt.push_str(&format!("\nA good answer: {reference}\n"));
    }
    if let Some(notes) = &unit.item.rubric {
        prompt.push_str(&format!("Notes: {notes}\n"));
    }
    for (position, &index) in order.iter().enumerate() {
        prompt.push_str(&format!("\nAnswer {}:\n{}\n", position + 1, unit.choices[index].text));
    }
    prompt.push_str(&format!(
        "\nCompare each answer with what a good answer says. Reply with one JSON object and nothing else: \
         its key \"reasoning\" holds your comparison in one sentence of your own words, its key \"scores\" \
         a list of {} whole numbers from 1 to 5, one per answer, in the order of the answers.",
        order.len()
    ));
    let schema = json!({"type": "object", "properties": {
            "reasoning": {"type": "string", "maxLength": 400},
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5},
                "minItems": order.len(), "maxItems": order.len()}},
        "required": ["reasoning", "scores"], "additionalProperties": false});
    json!({"model": config.model, "temperature": 0, "max_tokens": 400, "stream": false,
        "messages": [{"role": "system", "content": RUBRIC}, {"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "grades", "schema": schema}}})
}

/// The scores and reasoning in a judge's reply, or why they are not there (with the reply's
/// first words).
fn parse_reply(content: &str, answers: usize) -> Result<(Vec<f64>, String), String> {
    let shown: String = content.chars().take(160).collect();
    let bad = |why: &str| format!("{why}: {shown:?}");
    let start = content.find('{').ok_or_else(|| bad("no JSON object in the judge's reply"))?;
    let end =
        content.rfind('}').filter(|&end| end > start).ok_or_else(|| bad("no JSON object in the judge's reply"))?;
    let value: Value = serde_json::from_str(&content[start..=end]).map_err(|_| bad("the judge's reply is not JSON"))?;
    let scores: Vec<f64> = value["scores"]
        .as_array()
        .ok_or_else(|| bad("no scores in the judge's reply"))?
        .iter()
        .map(|s| s.as_f64().filter(|s| (1.0..=5.0).contains(s)))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("a score outside 1..5 in the judge's reply"))?;
    if scores.len() != answers {
        return Err(bad(&format!("{} scores for {answers} answers", scores.len())));
    }
    Ok((scores, value["reasoning"].as_str().unwrap_or_default().to_string()))
}

/// Asks the judge once; the content of its reply.
async fn ask(client: &reqwest::Client, config: &JudgeConfig, body: &Value) -> Result<String, String> {
    let base = super::super::base(&config.url);
    let response = client
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .map_err(|e| format!("the judge is unreachable: {e}"))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| format!("the judge's reply was cut: {e}"))?;
    if !status.is_success() {
        let shown: String = text.chars().take(160).collect();
        return Err(format!("the judge answered HTTP {}: {shown}", status.as_u16()));
    }
    let value: Value = serde_json::from_str(&text).map_err(|_| {
        let shown: String = text.chars().take(160).collect();
        format!("the judge's reply is not a chat completion: {shown:?}")
    })?;
    value["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "the judge's reply has no message content".to_string())
}

/// The judge's grade of one unit: each answer scored in both orders, the scores averaged.
///
/// # Errors
/// Why the judge gave no usable scores (unreachable, an HTTP error, a reply that is not the
/// scores asked for), in words.
pub async fn judge_unit(client: &reqwest::Client, config: &JudgeConfig, unit: &Unit) -> Result<Grade, String> {
    let forward: Vec<usize> = (0..unit.choices.len()).collect();
    let reversed: Vec<usize> = forward.iter().rev().copied().collect();
    let orders = if unit.choices.len() > 1 { vec![forward, reversed] } else { vec![forward] };
    let mut totals = vec![0.0; unit.choices.len()];
    let mut reasoning = Vec::new();
    for order in &orders {
        let content = ask(client, config, &request(config, unit, order)).await?;
        let (scores, why) = parse_reply(&content, order.len())?;
        for (&index, score) in order.iter().zip(scores) {
            totals[index] += score;
        }
        reasoning.push(why);
    }
    let by_label: BTreeMap<String, f64> =
        unit.choices.iter().zip(&totals).map(|(c, total)| (c.label.clone(), total / orders.len() as f64)).collect();
    let scores =
        unit.scores_by_server(&by_label).ok_or_else(|| "the judge's scores do not fit the answers".to_string())?;
    let tie = scores.values().all(|s| Some(s) == scores.values().next());
    Ok(Grade {
        key: unit.key.clone(),
        grader: Grader::Judge,
        scores,
        tie,
        reasoning,
        at: chrono::Utc::now().to_rfc3339(),
    })
}

/// Grades every unit of the run the judge has not graded yet, each grade stored as it comes;
/// `progress` is called after each unit.
///
/// # Errors
/// The run directory cannot be read or a grade not written. A judge that fails is not an
/// error: its failures are in the report.
pub async fn judge_run(
    dir: &RunDir,
    config: &JudgeConfig,
    mut progress: impl FnMut(&UnitKey, Result<(), &str>),
) -> Result<JudgeReport, QualityError> {
    let client = reqwest::Client::builder().timeout(config.timeout).build().map_err(|e| QualityError::Write {
        path: dir.path().to_path_buf(),
        error: std::io::Error::other(e.to_string()),
    })?;
    let grades = dir.grades()?;
    let done = latest_grades(&grades, Grader::Judge);
    let mut report = JudgeReport::default();
    for unit in dir.units()? {
        if done.contains_key(&unit.key) {
            report.already += 1;
            continue;
        }
        match judge_unit(&client, config, &unit).await {
            Ok(grade) => {
                dir.append_grade(&grade)?;
                report.graded += 1;
                progress(&unit.key, Ok(()));
            }
            Err(why) => {
                progress(&unit.key, Err(&why));
                report.failures.push((unit.key, why));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_that_are_not_the_scores_are_refused_with_their_words() {
        assert_eq!(parse_reply("{\"reasoning\": \"ok\", \"scores\": [4, 2]}", 2), Ok((vec![4.0, 2.0], "ok".into())));
        assert_eq!(parse_reply("Sure! ```json\n{\"scores\": [3]}\n```", 1).map(|r| r.0), Ok(vec![3.0]));
        for garbage in
            ["I like the first one.", "{\"scores\": [4]}", "{\"scores\": [4, 9]}", "{\"scores\": \"4,2\"}", "{]"]
        {
            let error = parse_reply(garbage, 2).expect_err("reply refused");
            assert!(error.contains("judge") || error.contains("answers"), "{error}");
        }
        assert!(parse_reply("I like the first one.", 2).expect_err("reply refused").contains("I like the first one."));
    }
}
