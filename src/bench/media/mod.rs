//! The media scenario (`--media`), for servers started with a projector (`--mmproj`): the
//! transcription check (spoken sentences sent as `input_audio` parts, each answer's word error
//! rate against what was said) and the silent-failure probe (distinct clips and distinct
//! pictures, each asked "Describe this.": distinct inputs must get distinct answers).

mod inputs;
mod verdict;

use serde_json::{json, Value};

pub use inputs::bmp;
#[cfg(test)]
pub(super) use inputs::SpokenClip;
pub(super) use inputs::{audio_part, image_part, MediaInputs};
pub use verdict::{
    media_summary, probe_verdict, transcript_words, word_error_rate, MediaSummary, ProbeAnswer, ProbeVerdict,
};

use super::client::send;
use super::report::{Row, Scenario};
use super::{base, ServerRun};

/// The transcription check's instruction.
const TRANSCRIBE: &str = "Transcribe this audio.";

/// The probe's question, the same for every clip and picture.
const DESCRIBE: &str = "Describe this.";

/// Tokens each probe answer may take: enough for answers to differ.
const PROBE_TOKENS: u32 = 24;

/// Requests per server and repetition: a transcription per clip, a probe per clip and per
/// picture.
pub(super) fn media_requests() -> u64 {
    3 * inputs::SENTENCES.len() as u64
}

/// A transcription's `max_tokens`: a bit above the sentence's length (two tokens a word and
/// some room for an end of turn).
fn transcription_tokens(sentence: &str) -> u32 {
    2 * sentence.split_whitespace().count() as u32 + 8
}

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    /// The transcription check, then the probe with the clips and with the pictures; every
    /// request greedy, one user message holding the media and the instruction.
    pub(super) async fn media_scenarios(&mut self, media: &MediaInputs) {
        for (i, clip) in media.clips.iter().enumerate() {
            let body = self.media_body(inputs::audio_part(&clip.wav), TRANSCRIBE, transcription_tokens(clip.text));
            let mut row = self.row(Scenario::Transcription, i as u32 + 1);
            let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
            if row.error.is_empty() {
                row.wer = Some(word_error_rate(clip.text, &reply.content));
                row.reply = Some(reply.content);
            }
            self.record(row);
        }
        let clips = media.clips.iter().map(|clip| inputs::audio_part(&clip.wav));
        self.probe(Scenario::ProbeAudio, clips.collect()).await;
        self.probe(Scenario::ProbeImage, media.images.iter().map(|bmp| inputs::image_part(bmp)).collect()).await;
    }

    /// One probe: each part asked [`DESCRIBE`], a row per part with the answer (the verdict
    /// is made over the rows, in the summary).
    async fn probe(&mut self, scenario: Scenario, parts: Vec<Value>) {
        for (i, part) in parts.into_iter().enumerate() {
            let body = self.media_body(part, DESCRIBE, PROBE_TOKENS);
            let mut row = self.row(scenario, i as u32 + 1);
            let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
            if row.error.is_empty() {
                row.reply = Some(reply.content);
            }
            self.record(row);
        }
    }

    /// A streamed greedy request of one user message: the media part, then `instruction`.
    fn media_body(&self, part: Value, instruction: &str, max_tokens: u32) -> Value {
        let content = json!([part, {"type": "text", "text": instruction}]);
        self.body(&[json!({"role": "user", "content": content})], max_tokens, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcription_may_take_a_bit_more_than_its_sentence() {
        assert_eq!(transcription_tokens("The quick brown fox jumps over the lazy dog."), 26);
        for sentence in inputs::SENTENCES {
            let words = sentence.split_whitespace().count() as u32;
            assert!(transcription_tokens(sentence) > words * 3 / 2, "{sentence}");
        }
        assert_eq!(media_requests(), 12);
    }
}
