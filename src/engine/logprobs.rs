//! Log-probabilities of generated tokens: computed from the raw logits, and released with the
//! text they belong to.

use std::collections::VecDeque;

use llama_cpp_2::token::LlamaToken;

use super::tokenizer::Tokenizer;
use super::{Candidate, TokenLogprob};

/// `chosen`'s log-probability under `logits` (log-softmax, before any sampling setting) and the
/// `top` likeliest tokens, most likely first. `chosen_bytes` is its text as the reply has it.
pub(crate) fn token_logprob(
    tokenizer: &Tokenizer,
    logits: &[f32],
    chosen: LlamaToken,
    chosen_bytes: Vec<u8>,
    top: usize,
) -> TokenLogprob {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    // Each term in f32 (fast), summed in f64: a 262K-token vocabulary of small terms loses
    // precision in an f32 sum.
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| f64::from((l - max).exp())).sum();
    let log_normalizer = f64::from(max) + sum.ln();
    let logprob = |token: usize| (f64::from(logits[token]) - log_normalizer) as f32;
    let chosen_index = usize::try_from(chosen.0).unwrap_or(0).min(logits.len().saturating_sub(1));
    TokenLogprob {
        chosen: Candidate { token: chosen.0, bytes: chosen_bytes, logprob: logprob(chosen_index) },
        top: likeliest(logits, top)
            .into_iter()
            .map(|token| Candidate {
                token: token as i32,
                bytes: tokenizer.piece(LlamaToken(token as i32)),
                logprob: logprob(token),
            })
            .collect(),
    }
}

/// The `count` tokens with the highest logits, highest first (the lower id first among equal
/// ones), in one pass without copying the vocabulary.
fn likeliest(logits: &[f32], count: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(count + 1);
    if count == 0 {
        return best;
    }
    for (token, &logit) in logits.iter().enumerate() {
        if !logit.is_finite() || (best.len() == count && logit <= logits[best[count - 1]]) {
            continue;
        }
        let at = best.partition_point(|&b| logits[b] >= logit);
        best.insert(at, token);
        best.truncate(count);
    }
    best
}

/// Generated tokens' log-probabilities waiting for their text to be sent: a token is released
/// once the text sent covers its last byte (text is held back while it may be a stop string or
/// half a character).
#[derive(Default)]
pub(crate) struct LogprobQueue {
    /// Each token with the span of the decoded text it ends (byte offsets).
    pending: VecDeque<(TokenLogprob, usize, usize)>,
    /// Bytes of decoded text so far.
    decoded: usize,
}

impl LogprobQueue {
    /// A token whose piece decoded to `decoded_bytes` more bytes of text.
    pub(crate) fn push(&mut self, logprob: TokenLogprob, decoded_bytes: usize) {
        let start = self.decoded;
        self.decoded += decoded_bytes;
        self.pending.push_back((logprob, start, self.decoded));
    }

    /// The tokens whose text lies within the first `sent` bytes.
    pub(crate) fn release(&mut self, sent: usize) -> Vec<TokenLogprob> {
        let ready = self.pending.iter().take_while(|(_, _, end)| *end <= sent).count();
        self.pending.drain(..ready).map(|(logprob, _, _)| logprob).collect()
    }

    /// At the end of the reply, the tokens that gave any of the `sent` bytes; the rest was a
    /// stop string, never sent.
    pub(crate) fn release_rest(&mut self, sent: usize) -> Vec<TokenLogprob> {
        let gave_text =
            |&(_, start, end): &(TokenLogprob, usize, usize)| start < sent || (start == end && start == sent);
        let ready = self.pending.iter().take_while(|entry| gave_text(entry)).count();
        let released = self.pending.drain(..ready).map(|(logprob, _, _)| logprob).collect();
        self.pending.clear();
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: i32) -> TokenLogprob {
        TokenLogprob { chosen: Candidate { token: id, bytes: Vec::new(), logprob: 0.0 }, top: Vec::new() }
    }

    fn ids(released: Vec<TokenLogprob>) -> Vec<i32> {
        released.into_iter().map(|t| t.chosen.token).collect()
    }

    #[test]
    fn the_likeliest_tokens_come_highest_first() {
        let logits = [0.5, f32::NEG_INFINITY, 2.0, -1.0, 2.0, f32::NAN, 1.5];
        assert_eq!(likeliest(&logits, 3), vec![2, 4, 6]);
        assert_eq!(likeliest(&logits, 0), Vec::<usize>::new());
        assert_eq!(likeliest(&logits, 10), vec![2, 4, 6, 0, 3], "only finite logits");
    }

    #[test]
    fn a_token_is_released_once_its_text_is_sent() {
        let mut queue = LogprobQueue::default();
        queue.push(token(1), 3);
        queue.push(token(2), 0); // half a character: its text comes with the next token
        queue.push(token(3), 4);
        assert_eq!(ids(queue.release(2)), Vec::<i32>::new());
        assert_eq!(ids(queue.release(3)), vec![1, 2]);
        assert_eq!(ids(queue.release(7)), vec![3]);
    }

    #[test]
    fn tokens_of_a_stop_string_are_never_released() {
        let mut queue = LogprobQueue::default();
        queue.push(token(1), 5); // "Hello"
        queue.push(token(2), 3); // " ST" (the stop string "STOP" starts at byte 6)
        queue.push(token(3), 2); // "OP"
        assert_eq!(ids(queue.release(5)), vec![1]);
        assert_eq!(ids(queue.release_rest(6)), vec![2], "it gave the space");
        assert!(queue.release(100).is_empty());
    }
}
