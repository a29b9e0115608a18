//! Grammar rules for text: strings that never contain a marker, and Gemma's value syntax.

use crate::chat::tools::gbnf::{class_excluding, literal};

/// Gemma's value syntax: JSON-like, with strings between quote markers and numbers as JSON
/// writes them (no leading zeros), so the converted arguments are valid JSON.
pub(super) fn gemma_value_rules(quote: &str) -> String {
    format!(
        "fw-g-value ::= fw-g-string | fw-g-dict | fw-g-array | fw-g-number | \"true\" | \"false\" | \"null\"\n\
         fw-g-string ::= {q} fw-g-text-0 {q}\n\
         {text}\
         fw-g-key ::= [^:}}<,{{ ]+\n\
         fw-g-dict ::= \"{{\" ( fw-g-key \":\" fw-g-value ( \",\" fw-g-key \":\" fw-g-value )* )? \"}}\"\n\
         fw-g-array ::= \"[\" ( fw-g-value ( \",\" fw-g-value )* )? \"]\"\n\
         fw-g-number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n",
        q = literal(quote),
        text = text_without(quote, "fw-g-text")
    )
}

/// Rules `{name}-0`, `{name}-1`, … matching exactly the texts that do not contain `marker`
/// (any of them may end right before it): `{name}-k` is the state where the text so far ends
/// with the first `k` characters of the marker and contains no whole marker.
pub(super) fn text_without(marker: &str, name: &str) -> String {
    let mut out = String::new();
    for (k, state) in marker_free_states(marker).iter().enumerate() {
        let mut alternatives = vec![String::new()];
        for &(c, next) in &state.moves {
            alternatives.push(format!("{} {name}-{next}", literal(&c.to_string())));
        }
        alternatives.push(format!("{} {name}-0", class_excluding(&state.special)));
        out.push_str(&format!("{name}-{k} ::= {}\n", alternatives.join(" | ")));
    }
    out
}

/// A state of the automaton that follows text for a marker (Knuth-Morris-Pratt).
#[derive(Debug, PartialEq, Eq)]
struct MarkerState {
    /// Characters that lead to another state than 0, with that state.
    moves: Vec<(char, usize)>,
    /// Characters that do not lead to state 0: those of `moves` and the one that would
    /// complete the marker (not allowed).
    special: Vec<char>,
}

/// The states 0..n of the automaton that reads text without `marker` (n characters long).
fn marker_free_states(marker: &str) -> Vec<MarkerState> {
    let chars: Vec<char> = marker.chars().collect();
    let mut alphabet = chars.clone();
    alphabet.sort_unstable();
    alphabet.dedup();
    (0..chars.len())
        .map(|k| {
            let mut state = MarkerState { moves: Vec::new(), special: Vec::new() };
            for &c in &alphabet {
                // The longest beginning of the marker that ends the text read so far plus `c`.
                let mut read = chars[..k].to_vec();
                read.push(c);
                let next = (0..=read.len().min(chars.len())).rev().find(|&m| read.ends_with(&chars[..m])).unwrap_or(0);
                if next == chars.len() {
                    state.special.push(c);
                } else if next > 0 {
                    state.moves.push((c, next));
                    state.special.push(c);
                }
            }
            state
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the automaton of [`marker_free_states`] over `text`: whether it stays free of the marker.
    fn accepted_without(marker: &str, text: &str) -> bool {
        let states = marker_free_states(marker);
        let mut k = 0;
        for c in text.chars() {
            let state = &states[k];
            k = match state.moves.iter().find(|(m, _)| *m == c) {
                Some(&(_, next)) => next,
                None if state.special.contains(&c) => return false,
                None => 0,
            };
        }
        true
    }

    #[test]
    fn gemma_strings_are_exactly_the_texts_without_the_quote() {
        for quote in ["<|\"|>", "<escape>"] {
            for text in ["a<", "a<<b", "x<|y", "<", "<<", "<|", "<|\"|", "<esc", "<<escape", "a<|\"<|\"|", "é<é"] {
                assert!(accepted_without(quote, text), "{quote}: {text:?}");
            }
            for text in [quote.to_string(), format!("x{quote}"), format!("<{quote}y"), format!("<|{quote}")] {
                assert!(!accepted_without(quote, &text), "{quote}: {text:?}");
            }
            // Every text over the marker's characters and one other, up to 7 long.
            let alphabet: Vec<char> =
                quote.chars().chain(['a']).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            let mut texts = vec![String::new()];
            for _ in 0..7 {
                texts = texts.iter().flat_map(|t| alphabet.iter().map(move |c| format!("{t}{c}"))).collect();
                for text in &texts {
                    assert_eq!(accepted_without(quote, text), !text.contains(quote), "{quote}: {text:?}");
                }
            }
        }
    }

    #[test]
    fn gemma_string_and_number_rules() {
        let rules = gemma_value_rules("<|\"|>");
        assert!(rules.contains("fw-g-string ::= \"<|\\\"|>\" fw-g-text-0 \"<|\\\"|>\"\n"), "{rules}");
        assert!(rules.contains("fw-g-text-0 ::=  | \"<\" fw-g-text-1 | [^\\x3C] fw-g-text-0\n"), "{rules}");
        assert!(rules.contains("fw-g-text-4 ::=  | \"<\" fw-g-text-1 | [^\\x3C\\x3E] fw-g-text-0\n"), "{rules}");
        assert!(rules.contains("fw-g-number ::= \"-\"? ( \"0\" | [1-9] [0-9]* )"), "no leading zeros: {rules}");
    }
}
