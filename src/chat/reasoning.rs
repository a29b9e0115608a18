//! Reasoning ("thinking") in a model's output: the markers a chat template writes around it,
//! and a streaming splitter that separates the reasoning from the answer.
//!
//! A reply is reasoning only where the model opens it with the open marker (after optional
//! whitespace), or where the prompt already opened it (templates that end their generation
//! prompt with `<think>`); the reasoning runs to the close marker. Whitespace around the
//! markers is layout: it belongs to neither part.

/// The markers a model family writes around its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningFormat {
    /// Opens the reasoning (`<think>`).
    pub open: &'static str,
    /// Closes it (`</think>`).
    pub close: &'static str,
    /// What the engine writes to end the reasoning when its budget is spent.
    pub forced_close: &'static str,
    /// What may follow the close marker before the answer or a call, left out of both
    /// (Harmony's `<|start|>assistant`, which opens the next message); empty for most.
    pub resume: &'static str,
    /// What opens the answer, left out of it (Harmony's `<|channel|>final<|message|>`); empty
    /// for most.
    pub answer_open: &'static str,
}

impl ReasoningFormat {
    /// The formats firstword knows, most specific first (a template is matched by its close
    /// marker).
    pub const KNOWN: &'static [Self] = &[
        // gpt-oss's Harmony: the analysis channel (matched by its open marker: `<|end|>` ends
        // other templates' turns too).
        Self::HARMONY,
        // Seed-OSS.
        Self::marked("<seed:think>", "</seed:think>", "\n</seed:think>\n\n"),
        // DeepSeek-R1, Qwen3, QwQ, SmolLM3, GLM-4.5, Hunyuan, and the templates written like them.
        Self::marked("<think>", "</think>", "\n</think>\n\n"),
        // Magistral.
        Self::marked("[THINK]", "[/THINK]", "[/THINK]"),
        // Command R7B and Command A Reasoning.
        Self::marked("<|START_THINKING|>", "<|END_THINKING|>", "<|END_THINKING|>"),
    ];

    /// gpt-oss's Harmony: reasoning on the analysis channel, the answer on the final one
    /// (`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`),
    /// calls on the commentary one.
    pub const HARMONY: Self = Self {
        open: "<|channel|>analysis<|message|>",
        close: "<|end|>",
        forced_close: "<|end|><|start|>assistant",
        resume: "<|start|>assistant",
        answer_open: "<|channel|>final<|message|>",
    };

    const fn marked(open: &'static str, close: &'static str, forced_close: &'static str) -> Self {
        Self { open, close, forced_close, resume: "", answer_open: "" }
    }

    /// The reasoning format a chat template writes, detected from its close marker (Harmony's
    /// from its open marker); `None` for templates of models that do not think.
    #[must_use]
    pub fn detect(template: &str) -> Option<Self> {
        Self::KNOWN.iter().copied().find(|format| {
            let marker = if format.answer_open.is_empty() { format.close } else { format.open };
            template.contains(marker)
        })
    }

    /// Whether a prompt ends inside an opened reasoning block (the generation prompt wrote the
    /// open marker), so the reply starts as reasoning.
    #[must_use]
    pub fn opened_by(self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.open)
    }
}

/// A piece of a reply, split.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

/// Where the splitter is in a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: the reply may still open its reasoning.
    Opening,
    /// Inside the reasoning, before any of its text (leading whitespace is dropped).
    ReasoningStart,
    /// Inside the reasoning.
    Reasoning,
    /// After the close marker, before any answer text (leading whitespace is dropped).
    AnswerStart,
    /// The answer: everything is content.
    Answer,
}

/// Splits a reply into reasoning and answer as its text arrives; text that may be part of a
/// marker (or whitespace before one) is held until it is certain.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    phase: Phase,
    /// Text received and not yet given out.
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for one reply; `inside` when the prompt opened the reasoning.
    #[must_use]
    pub fn new(format: ReasoningFormat, inside: bool) -> Self {
        let phase = if inside { Phase::ReasoningStart } else { Phase::Opening };
        Self { format, phase, held: String::new() }
    }

    /// The markers it follows.
    #[must_use]
    pub fn format(&self) -> ReasoningFormat {
        self.format
    }

    /// Whether the reply is in its answer for good: all further text is content.
    #[must_use]
    pub fn answering(&self) -> bool {
        self.phase == Phase::Answer
    }

    /// Whether the reply is inside its reasoning now (opened, not closed yet).
    #[must_use]
    pub fn in_reasoning(&self) -> bool {
        matches!(self.phase, Phase::ReasoningStart | Phase::Reasoning)
    }

    /// The reasoning and the answer text that `text` makes certain.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            let progressed = match self.phase {
                Phase::Opening => self.opening(&mut out),
                Phase::ReasoningStart | Phase::AnswerStart => self.skip_whitespace(),
                Phase::Reasoning => self.reasoning(&mut out),
                Phase::Answer => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    false
                }
            };
            if !progressed {
                return out;
            }
        }
    }

    /// Gives out what is held at the end of the reply: an unfinished marker is text.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::ReasoningStart | Phase::Reasoning => {
                Split { reasoning: held.trim_end().to_string(), ..Split::default() }
            }
            _ => Split { content: held, ..Split::default() },
        }
    }

    /// Whether the reply opens its reasoning; false while that is not known yet.
    fn opening(&mut self, out: &mut Split) -> bool {
        let start = self.held.len() - self.held.trim_start().len();
        let rest = &self.held[start..];
        if let Some(after) = rest.strip_prefix(self.format.open) {
            self.held = after.to_string();
            self.phase = Phase::ReasoningStart;
            return true;
        }
        if self.format.open.starts_with(rest) {
            return false;
        }
        if !self.format.answer_open.is_empty() {
            // Harmony answers without reasoning on the final channel.
            self.phase = Phase::AnswerStart;
            return true;
        }
        self.phase = Phase::Answer;
        out.content.push_str(&std::mem::take(&mut self.held));
        false
    }

    /// Drops whitespace at the start of a part (and, before the answer, the format's `resume`
    /// and `answer_open` markers); moves on once other text arrived.
    fn skip_whitespace(&mut self) -> bool {
        let mut trimmed = self.held.trim_start();
        if self.phase == Phase::AnswerStart {
            for marker in [self.format.resume, self.format.answer_open] {
                if marker.is_empty() {
                    continue;
                }
                if let Some(rest) = trimmed.strip_prefix(marker) {
                    trimmed = rest.trim_start();
                } else if !trimmed.is_empty() && marker.starts_with(trimmed) {
                    // May be the marker: wait for more.
                    self.held = trimmed.to_string();
                    return false;
                }
            }
        }
        if trimmed.is_empty() {
            self.held.clear();
            return false;
        }
        self.held = trimmed.to_string();
        self.phase = if self.phase == Phase::ReasoningStart { Phase::Reasoning } else { Phase::Answer };
        true
    }

    /// Gives out reasoning up to the close marker (then moves to the answer), holding back what
    /// may be whitespace before it or the start of it.
    fn reasoning(&mut self, out: &mut Split) -> bool {
        let close = self.format.close;
        if let Some(at) = self.held.find(close) {
            out.reasoning.push_str(self.held[..at].trim_end());
            self.held = self.held[at + close.len()..].to_string();
            self.phase = Phase::AnswerStart;
            return true;
        }
        // The longest end of the text that may begin the close marker, and the whitespace
        // before it: held back.
        let partial = (1..close.len().min(self.held.len() + 1))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(self.held.len() - n) && close.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let body = &self.held[..self.held.len() - partial];
        let keep_from = body.trim_end().len();
        out.reasoning.push_str(&self.held[..keep_from]);
        self.held = self.held[keep_from..].to_string();
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK: ReasoningFormat = ReasoningFormat::KNOWN[2];

    /// The whole split of `pieces` fed one by one, then finished.
    fn split(inside: bool, pieces: &[&str]) -> Split {
        let mut splitter = ReasoningSplitter::new(THINK, inside);
        let mut all = Split::default();
        let mut add = |piece: Split| {
            all.reasoning.push_str(&piece.reasoning);
            all.content.push_str(&piece.content);
        };
        for piece in pieces {
            add(splitter.push(piece));
        }
        add(splitter.finish());
        all
    }

    fn both(reasoning: &str, content: &str) -> Split {
        Split { reasoning: reasoning.into(), content: content.into() }
    }

    #[test]
    fn formats_are_detected_by_their_close_marker() {
        assert_eq!(ReasoningFormat::detect("{{ '<think>\\n' }}...{{ '</think>' }}"), Some(THINK));
        assert_eq!(ReasoningFormat::detect("<seed:think></seed:think>").map(|f| f.open), Some("<seed:think>"));
        assert_eq!(ReasoningFormat::detect("[THINK][/THINK]").map(|f| f.close), Some("[/THINK]"));
        assert_eq!(ReasoningFormat::detect("<|im_start|>assistant\n"), None);
    }

    #[test]
    fn a_prompt_that_ends_with_the_open_marker_opens_the_reasoning() {
        assert!(THINK.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!THINK.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!THINK.opened_by("<|im_start|>assistant\n"));
    }

    #[test]
    fn reasoning_opened_by_the_model_is_split_from_the_answer() {
        assert_eq!(split(false, &["<think>\nLet me see.\n</think>\n\nParis."]), both("Let me see.", "Paris."));
        assert_eq!(split(false, &["  <think>a</think>b"]), both("a", "b"));
    }

    #[test]
    fn reasoning_opened_by_the_prompt_needs_no_open_marker() {
        assert_eq!(split(true, &["\nHmm.\n</think>\n\nYes."]), both("Hmm.", "Yes."));
    }

    #[test]
    fn a_reply_that_does_not_open_with_the_marker_is_all_answer() {
        assert_eq!(split(false, &["Paris. <think>x</think>"]), both("", "Paris. <think>x</think>"));
        assert_eq!(split(false, &["<thin", "g>"]), both("", "<thing>"));
    }

    #[test]
    fn unclosed_reasoning_stays_reasoning_and_an_unfinished_marker_is_text() {
        assert_eq!(split(true, &["still thinking </th"]), both("still thinking </th", ""));
        assert_eq!(split(false, &["<thi"]), both("", "<thi"));
    }

    #[test]
    fn harmony_analysis_is_reasoning_and_the_final_channel_the_answer() {
        let harmony = ReasoningFormat::detect("{{ '<|start|>assistant<|channel|>analysis<|message|>' }}<|end|>");
        assert_eq!(harmony, Some(ReasoningFormat::HARMONY));
        assert_eq!(ReasoningFormat::detect("<|user|>{{ m }}<|end|>"), None, "Phi-3.5 ends its turns with <|end|>");
        let text = "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.";
        let whole = |pieces: &[&str]| {
            let mut splitter = ReasoningSplitter::new(ReasoningFormat::HARMONY, false);
            let mut all = Split::default();
            let mut parts: Vec<Split> = pieces.iter().map(|p| splitter.push(p)).collect();
            parts.push(splitter.finish());
            for piece in parts {
                all.reasoning.push_str(&piece.reasoning);
                all.content.push_str(&piece.content);
            }
            all
        };
        assert_eq!(whole(&[text]), both("User wants weather.", "Sunny."));
        for at in (1..text.len()).filter(|&at| text.is_char_boundary(at)) {
            assert_eq!(whole(&[&text[..at], &text[at..]]), both("User wants weather.", "Sunny."), "split at {at}");
        }
        let call = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
        assert_eq!(
            whole(&[call]),
            both("Call it.", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>")
        );
        assert_eq!(whole(&["<|channel|>final<|message|>Hi."]), both("", "Hi."), "no reasoning");
    }

    #[test]
    fn every_chunking_gives_the_same_split() {
        let text = " <think>\nStep 1: é🙂 < </ </t.\n </think>\n\n Answer: 42 </think>";
        let expected = both("Step 1: é🙂 < </ </t.", "Answer: 42 </think>");
        let chars: Vec<&str> = text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect();
        assert_eq!(split(false, &chars), expected, "one character at a time");
        for size in 2..12 {
            let pieces: Vec<String> = chars.chunks(size).map(|c| c.concat()).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(split(false, &pieces), expected, "pieces of {size} characters");
        }
    }

    #[test]
    fn text_is_given_out_as_soon_as_it_is_certain() {
        let mut splitter = ReasoningSplitter::new(THINK, false);
        assert_eq!(splitter.push(" <th"), Split::default(), "may open the reasoning");
        assert_eq!(splitter.push("ink>Hi"), both("Hi", ""));
        assert!(splitter.in_reasoning());
        assert_eq!(splitter.push(" there \n</"), both(" there", ""), "whitespace before a marker waits");
        assert_eq!(splitter.push("think>\n"), Split::default());
        assert!(!splitter.in_reasoning());
        assert_eq!(splitter.push("OK"), both("", "OK"));
    }

    mod properties {
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::sample::Index;

        use super::*;

        /// Text over an alphabet rich in the markers' characters, with whole markers mixed in.
        fn marker_text() -> impl Strategy<Value = String> {
            let atom = prop_oneof![
                Just("<think>".to_string()),
                Just("</think>".to_string()),
                Just("</".to_string()),
                "[<>/thinké ]{1,3}".prop_map(String::from),
                Just("\n".to_string()),
            ];
            vec(atom, 0..10).prop_map(|atoms| atoms.concat())
        }

        /// The split of a whole reply, written from the definition: reasoning where the reply
        /// opens with the marker (or the prompt opened it) up to the first close marker,
        /// whitespace around the markers dropped.
        fn reference(text: &str, inside: bool) -> Split {
            let body = if inside { Some(text) } else { text.trim_start().strip_prefix("<think>") };
            let Some(body) = body else { return both("", text) };
            match body.find("</think>") {
                Some(at) => both(body[..at].trim(), body[at + "</think>".len()..].trim_start()),
                None => both(body.trim_start().trim_end_matches(char::is_whitespace), ""),
            }
        }

        proptest! {
            #[test]
            fn any_chunking_splits_as_the_whole_text_does(
                text in marker_text(),
                inside in any::<bool>(),
                cuts in vec(any::<Index>(), 0..6),
            ) {
                let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
                let mut points: Vec<usize> = cuts.iter().map(|c| boundaries[c.index(boundaries.len())]).collect();
                points.sort_unstable();
                let mut pieces = Vec::new();
                let mut start = 0;
                for point in points.into_iter().chain([text.len()]) {
                    pieces.push(&text[start..point]);
                    start = point;
                }
                let mut splitter = ReasoningSplitter::new(THINK, inside);
                let mut all = Split::default();
                for piece in &pieces {
                    let split = splitter.push(piece);
                    all.reasoning.push_str(&split.reasoning);
                    all.content.push_str(&split.content);
                }
                let rest = splitter.finish();
                all.reasoning.push_str(&rest.reasoning);
                all.content.push_str(&rest.content);
                prop_assert_eq!(all, reference(&text, inside), "pieces {:?}", pieces);
            }
        }
    }
}
