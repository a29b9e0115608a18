//! What the media scenario's answers mean, pure: the word error rate of a transcription, the
//! silent-failure probe's verdict over the answers to distinct inputs, and one server's media
//! summary from its rows.

use std::fmt;

use super::super::report::{Row, Scenario};

/// The words of a transcript as they are compared: lower-cased, apostrophes dropped ("don't"
/// is "dont"), every other character that is not a letter or a digit a space between words
/// ("well-known" is two words, as a recogniser may write it).
#[must_use]
pub fn transcript_words(text: &str) -> Vec<String> {
    let cleaned: String = text
        .chars()
        .filter(|c| !matches!(c, '\'' | '\u{2019}'))
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect();
    cleaned.split_whitespace().map(str::to_lowercase).collect()
}

/// The word error rate of `hypothesis` against `reference`: the fewest word substitutions,
/// deletions and insertions that turn one into the other (word-level Levenshtein over
/// [`transcript_words`]), over the reference's word count. 0 is a perfect transcript; an
/// answer with more wrong words than the reference has is above 1. A reference without words
/// counts the hypothesis' words as errors over one word.
///
/// ```
/// use firstword::bench::word_error_rate;
/// assert_eq!(word_error_rate("Turn the lights off.", "turn the light off"), 0.25);
/// assert_eq!(word_error_rate("Hello there!", "hello, there"), 0.0);
/// ```
#[must_use]
pub fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let reference = transcript_words(reference);
    let hypothesis = transcript_words(hypothesis);
    // One row of the edit-distance table at a time: `row[j]` is the distance between the
    // reference so far and the first j words of the hypothesis.
    let mut row: Vec<usize> = (0..=hypothesis.len()).collect();
    for (i, word) in reference.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, other) in hypothesis.iter().enumerate() {
            let substitution = diagonal + usize::from(word != other);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[hypothesis.len()] as f64 / reference.len().max(1) as f64
}

/// One probe request's outcome, as the verdict reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeAnswer<'a> {
    /// An answer came (HTTP 200): its text.
    Answered(&'a str),
    /// The server refused the input with a 4xx: its message.
    Refused(&'a str),
    /// Anything else (5xx, no answer, a broken stream): why.
    Failed(&'a str),
}

/// The silent-failure probe's verdict: distinct inputs must get distinct answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Every input got an answer, and no two answers are the same.
    Distinct {
        /// Inputs (and answers).
        inputs: usize,
    },
    /// Distinct inputs got the same answer: the server answers without looking at them,
    /// whatever HTTP status it sent. The failure a user fears most.
    Same {
        /// The inputs (from 1) of the largest group that got one answer.
        inputs: Vec<usize>,
        /// Inputs sent.
        of: usize,
        /// That answer.
        answer: String,
    },
    /// The server refused every input with a 4xx: it says it takes no such media (not a
    /// silent failure).
    Refused {
        /// The first refusal's message.
        message: String,
    },
    /// Some inputs got no answer; the answers that came differ.
    Incomplete {
        /// Inputs answered.
        answered: usize,
        /// Inputs sent.
        of: usize,
        /// The first refusal or failure.
        error: String,
    },
}

impl ProbeVerdict {
    /// How bad the verdict is, to keep the worst over repetitions: a silent failure first.
    fn severity(&self) -> u8 {
        match self {
            Self::Distinct { .. } => 0,
            Self::Refused { .. } => 1,
            Self::Incomplete { .. } => 2,
            Self::Same { .. } => 3,
        }
    }

    /// The table's cell: PASS, FAILURE, refused or incomplete.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Distinct { .. } => "PASS",
            Self::Same { .. } => "FAILURE",
            Self::Refused { .. } => "refused",
            Self::Incomplete { .. } => "incomplete",
        }
    }
}

impl fmt::Display for ProbeVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Distinct { inputs } => write!(f, "PASS: {inputs} distinct inputs, {inputs} distinct answers"),
            Self::Same { inputs, of, answer } => {
                let list: Vec<String> = inputs.iter().map(usize::to_string).collect();
                let answer: String = answer.chars().take(120).collect();
                write!(f, "FAILURE: inputs {} of {of} (all distinct) got the same answer: {answer:?}", list.join(", "))
            }
            Self::Refused { message } => write!(f, "refused: {message}"),
            Self::Incomplete { answered: 0, of, error } => write!(f, "incomplete: none of {of} answered; {error}"),
            Self::Incomplete { answered, of, error } => {
                write!(f, "incomplete: {answered} of {of} answered (no two alike); {error}")
            }
        }
    }
}

/// The verdict over the answers to distinct inputs, one per input in order. Answers are
/// compared with surrounding whitespace trimmed; two empty answers are the same answer.
#[must_use]
pub fn probe_verdict(answers: &[ProbeAnswer<'_>]) -> ProbeVerdict {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, answer) in answers.iter().enumerate() {
        if let ProbeAnswer::Answered(text) = answer {
            let text = text.trim();
            match groups.iter_mut().find(|(seen, _)| *seen == text) {
                Some((_, inputs)) => inputs.push(i + 1),
                None => groups.push((text, vec![i + 1])),
            }
        }
    }
    let of = answers.len();
    // The largest group; the first of equal ones.
    if let Some((answer, inputs)) = groups.iter().rev().max_by_key(|(_, inputs)| inputs.len()) {
        if inputs.len() > 1 {
            return ProbeVerdict::Same { inputs: inputs.clone(), of, answer: (*answer).to_string() };
        }
    }
    let answered = groups.len();
    let first_error = answers.iter().find_map(|answer| match answer {
        ProbeAnswer::Answered(_) => None,
        ProbeAnswer::Refused(why) | ProbeAnswer::Failed(why) => Some((*why).to_string()),
    });
    match first_error {
        None => ProbeVerdict::Distinct { inputs: of },
        Some(message) if answered == 0 && answers.iter().all(|a| matches!(a, ProbeAnswer::Refused(_))) => {
            ProbeVerdict::Refused { message }
        }
        Some(error) => ProbeVerdict::Incomplete { answered, of, error },
    }
}

/// A row as a probe answer: answered when it has no error, refused when the server sent a
/// 4xx, failed otherwise.
fn answer_of(row: &Row) -> ProbeAnswer<'_> {
    if row.error.is_empty() {
        ProbeAnswer::Answered(row.reply.as_deref().unwrap_or_default())
    } else if (400..500).contains(&row.http_status) {
        ProbeAnswer::Refused(&row.error)
    } else {
        ProbeAnswer::Failed(&row.error)
    }
}

/// One server's media results over all repetitions.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaSummary {
    /// Each transcribed clip's word error rate, in order, repetition after repetition.
    pub wer: Vec<f64>,
    /// Their mean.
    pub wer_mean: Option<f64>,
    /// The first transcription request that was refused or failed, and why.
    pub transcription_error: Option<String>,
    /// Every transcription request was refused with a 4xx (the server takes no audio).
    pub transcription_refused: bool,
    /// The probe with spoken clips: the worst verdict of any repetition.
    pub audio: Option<ProbeVerdict>,
    /// The probe with pictures: the worst verdict of any repetition.
    pub image: Option<ProbeVerdict>,
}

/// The media summary of one server's rows (`None` when the media scenario did not run).
#[must_use]
pub fn media_summary(rows: &[&Row]) -> Option<MediaSummary> {
    if !rows.iter().any(|r| r.scenario.is_media()) {
        return None;
    }
    let transcriptions = rows.iter().filter(|r| r.scenario == Scenario::Transcription);
    let wer: Vec<f64> = transcriptions.clone().filter_map(|r| r.wer).collect();
    let verdict = |scenario: Scenario| {
        let mut reps: Vec<u32> = rows.iter().filter(|r| r.scenario == scenario).map(|r| r.rep).collect();
        reps.dedup();
        reps.into_iter()
            .map(|rep| {
                let answers: Vec<ProbeAnswer<'_>> =
                    rows.iter().filter(|r| r.scenario == scenario && r.rep == rep).map(|r| answer_of(r)).collect();
                probe_verdict(&answers)
            })
            .max_by_key(ProbeVerdict::severity)
    };
    Some(MediaSummary {
        wer_mean: (!wer.is_empty()).then(|| wer.iter().sum::<f64>() / wer.len() as f64),
        wer,
        transcription_error: transcriptions.clone().find(|r| !r.error.is_empty()).map(|r| r.error.clone()),
        transcription_refused: transcriptions.clone().next().is_some()
            && transcriptions.clone().all(|r| matches!(answer_of(r), ProbeAnswer::Refused(_))),
        audio: verdict(Scenario::ProbeAudio),
        image: verdict(Scenario::ProbeImage),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProbeAnswer::{Answered, Failed, Refused};

    #[test]
    fn words_are_lower_cased_without_punctuation() {
        assert_eq!(transcript_words("Don't STOP, well-known… ok?"), ["dont", "stop", "well", "known", "ok"]);
        assert_eq!(transcript_words("Ça   va\n"), ["ça", "va"]);
        assert!(transcript_words(" ... ").is_empty());
    }

    #[test]
    fn the_word_error_rate_counts_substitutions_deletions_and_insertions() {
        let reference = "The quick brown fox jumps over the lazy dog.";
        assert_eq!(word_error_rate(reference, "the quick brown fox jumps over the lazy dog"), 0.0);
        // One substitution, one deletion ("lazy"), one insertion ("very") of 9 words.
        let wer = word_error_rate(reference, "The quick red fox jumps over the very dog");
        assert!((wer - 2.0 / 9.0).abs() < 1e-12, "{wer}");
        let wer = word_error_rate(reference, "the quick brown fox jumps over the lazy old dog");
        assert!((wer - 1.0 / 9.0).abs() < 1e-12, "{wer}");
        assert_eq!(word_error_rate("one two three four", "two three four"), 0.25);
        // Nothing heard: every word deleted.
        assert_eq!(word_error_rate("one two three four", ""), 1.0);
        // More wrong words than the reference has: above 1.
        assert_eq!(word_error_rate("one two", "a b c d e f"), 3.0);
        assert_eq!(word_error_rate("", ""), 0.0);
        assert_eq!(word_error_rate("", "noise noise"), 2.0);
        // Order matters: a swap is two edits.
        assert_eq!(word_error_rate("a b", "b a"), 1.0);
    }

    #[test]
    fn distinct_answers_to_distinct_inputs_pass() {
        let answers = [Answered("A red square."), Answered("A checkerboard."), Answered("Stripes.")];
        assert_eq!(probe_verdict(&answers), ProbeVerdict::Distinct { inputs: 3 });
        assert_eq!(probe_verdict(&answers).label(), "PASS");
    }

    #[test]
    fn the_same_fluent_answer_to_distinct_inputs_is_a_failure() {
        let same = "The audio is a person speaking clearly.";
        let answers = [Answered(same), Answered(" The audio is a person speaking clearly.\n"), Answered(same)];
        let verdict = probe_verdict(&answers);
        assert_eq!(verdict, ProbeVerdict::Same { inputs: vec![1, 2, 3], of: 3, answer: same.into() });
        assert_eq!(verdict.label(), "FAILURE");
        assert!(verdict.to_string().starts_with("FAILURE: inputs 1, 2, 3 of 3"), "{verdict}");
        // Two of four alike is a failure too, whatever the others did; the largest group is named.
        let answers =
            [Answered("x"), Answered("y"), Refused("HTTP 400: no"), Answered("y"), Answered("x"), Answered("y")];
        assert_eq!(probe_verdict(&answers), ProbeVerdict::Same { inputs: vec![2, 4, 6], of: 6, answer: "y".into() });
        // Empty answers are the same answer.
        assert_eq!(probe_verdict(&[Answered(""), Answered(" ")]).label(), "FAILURE");
    }

    #[test]
    fn refusals_are_no_silent_failure() {
        let answers =
            [Refused("HTTP 400: this server takes no audio"), Refused("HTTP 400: this server takes no audio")];
        assert_eq!(
            probe_verdict(&answers),
            ProbeVerdict::Refused { message: "HTTP 400: this server takes no audio".into() }
        );
        // Some answered, some not: incomplete, not refused.
        let answers = [Answered("a"), Refused("HTTP 400: too big"), Answered("b")];
        let verdict = probe_verdict(&answers);
        assert_eq!(verdict, ProbeVerdict::Incomplete { answered: 2, of: 3, error: "HTTP 400: too big".into() });
        assert_eq!(verdict.label(), "incomplete");
        // A server error is no refusal (llama-server answers media its projector lacks with a 500).
        let verdict = probe_verdict(&[Failed("HTTP 500: image input is not supported"), Refused("HTTP 400: x")]);
        assert_eq!(verdict.label(), "incomplete");
        assert_eq!(verdict.to_string(), "incomplete: none of 2 answered; HTTP 500: image input is not supported");
    }

    #[test]
    fn the_summary_keeps_each_clip_and_the_worst_verdict_of_all_repetitions() {
        let row = |rep, scenario, turn, status: u16, reply: &str, error: &str| Row {
            http_status: status,
            reply: error.is_empty().then(|| reply.to_string()),
            error: error.into(),
            wer: (scenario == Scenario::Transcription && error.is_empty()).then(|| word_error_rate("a b", reply)),
            ..Row::new("s", rep, scenario, turn)
        };
        let rows = [
            row(1, Scenario::Transcription, 1, 200, "a b", ""),
            row(1, Scenario::Transcription, 2, 200, "a c d", ""),
            row(1, Scenario::ProbeAudio, 1, 200, "one", ""),
            row(1, Scenario::ProbeAudio, 2, 200, "two", ""),
            row(2, Scenario::ProbeAudio, 1, 200, "same", ""),
            row(2, Scenario::ProbeAudio, 2, 200, "same", ""),
            row(1, Scenario::ProbeImage, 1, 400, "", "HTTP 400: no pictures here"),
            row(1, Scenario::ProbeImage, 2, 400, "", "HTTP 400: no pictures here"),
        ];
        let rows: Vec<&Row> = rows.iter().collect();
        let summary = media_summary(&rows).expect("media rows");
        assert_eq!(summary.wer, [0.0, 1.0]);
        assert_eq!(summary.wer_mean, Some(0.5));
        assert_eq!(summary.transcription_error, None);
        assert!(!summary.transcription_refused);
        assert_eq!(summary.audio.as_ref().map(ProbeVerdict::label), Some("FAILURE"), "repetition 2 failed");
        assert_eq!(summary.image, Some(ProbeVerdict::Refused { message: "HTTP 400: no pictures here".into() }));
        assert_eq!(media_summary(&rows[..0]), None);
    }
}
