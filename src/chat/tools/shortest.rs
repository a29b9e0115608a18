//! The shortest text a GBNF grammar accepts: what the smallest valid answer under a grammar
//! (a required call, a JSON reply) costs at least, so the engine can keep room for it.
//!
//! Reads llama.cpp's GBNF (rules, literals, character classes, `.`, groups, `*` `+` `?` and
//! `{m,n}`), gives each rule its shortest length by a fixed point (a rule's alternatives are
//! sums of their elements' least repetitions), then writes the text out along the choices that
//! reached each length first, so a rule that refers to itself never loops.

use std::collections::HashMap;

/// Most characters the shortest text may have before it is given up on.
const MOST_CHARS: usize = 1 << 16;

/// Deepest nesting of rules and groups written out.
const MOST_DEPTH: usize = 256;

/// One lexical element of GBNF.
#[derive(Clone, Debug, PartialEq)]
enum Lexeme {
    /// A string literal's characters.
    Literal(Vec<char>),
    /// A character class, as one character it matches (`None`: it matches none).
    Class(Option<char>),
    /// `.`.
    Any,
    /// A rule name.
    Name(String),
    /// `::=`.
    Define,
    Open,
    Close,
    Bar,
    /// A repetition's least count (`*` and `?`: 0, `+`: 1, `{m,…}`: m).
    Repeat(u32),
}

/// One element of a sequence and its least count.
#[derive(Clone, Debug)]
struct Item {
    element: Element,
    least: u32,
}

#[derive(Clone, Debug)]
enum Element {
    Text(String),
    /// Matches nothing (an empty class).
    Nothing,
    Rule(usize),
    Group(Vec<Vec<Item>>),
}

/// The shortest text the grammar's `root` rule accepts, `None` when it accepts none, the text
/// cannot be read as GBNF, or the shortest text would be longer than [`MOST_CHARS`].
#[must_use]
pub fn shortest_text(gbnf: &str, root: &str) -> Option<String> {
    let lexemes = lex(gbnf)?;
    let mut grammar = Parsed::default();
    let mut at = 0;
    while at < lexemes.len() {
        let (Lexeme::Name(name), Some(Lexeme::Define)) = (&lexemes[at], lexemes.get(at + 1)) else { return None };
        let id = grammar.id(name);
        at += 2;
        let alternatives = grammar.alternatives(&lexemes, &mut at, 0)?;
        grammar.rules.resize(grammar.names.len(), None);
        grammar.rules[id] = Some(alternatives);
    }
    let rules: Vec<Vec<Vec<Item>>> = grammar.rules.into_iter().map(|r| r.unwrap_or_default()).collect();
    let root = *grammar.names.get(root)?;
    let (lengths, chosen) = fixed_point(&rules);
    lengths[root]?;
    let mut out = String::new();
    write_rule(&rules, &chosen, &lengths, root, &mut out, 0).then_some(out)
}

/// Rule names to ids, and each rule's alternatives once defined.
#[derive(Default)]
struct Parsed {
    names: HashMap<String, usize>,
    rules: Vec<Option<Vec<Vec<Item>>>>,
}

impl Parsed {
    fn id(&mut self, name: &str) -> usize {
        let next = self.names.len();
        *self.names.entry(name.to_string()).or_insert(next)
    }

    /// Alternatives up to a `)` (when `depth` > 0) or the next rule's definition.
    fn alternatives(&mut self, lexemes: &[Lexeme], at: &mut usize, depth: u32) -> Option<Vec<Vec<Item>>> {
        let mut alternatives = vec![Vec::new()];
        loop {
            let Some(lexeme) = lexemes.get(*at) else { return (depth == 0).then_some(alternatives) };
            let element = match lexeme {
                Lexeme::Name(_) if depth == 0 && lexemes.get(*at + 1) == Some(&Lexeme::Define) => {
                    return Some(alternatives)
                }
                Lexeme::Close if depth > 0 => {
                    *at += 1;
                    return Some(alternatives);
                }
                Lexeme::Bar => {
                    alternatives.push(Vec::new());
                    *at += 1;
                    continue;
                }
                Lexeme::Repeat(least) => {
                    let item = alternatives.last_mut()?.last_mut()?;
                    item.least = item.least.saturating_mul(*least);
                    *at += 1;
                    continue;
                }
                Lexeme::Literal(chars) => Element::Text(chars.iter().collect()),
                Lexeme::Class(Some(c)) => Element::Text(c.to_string()),
                Lexeme::Class(None) => Element::Nothing,
                Lexeme::Any => Element::Text("a".into()),
                Lexeme::Name(name) => Element::Rule(self.id(name)),
                Lexeme::Open => {
                    *at += 1;
                    let group = self.alternatives(lexemes, at, depth + 1)?;
                    alternatives.last_mut()?.push(Item { element: Element::Group(group), least: 1 });
                    continue;
                }
                Lexeme::Close | Lexeme::Define => return None,
            };
            *at += 1;
            alternatives.last_mut()?.push(Item { element, least: 1 });
        }
    }
}

/// Each rule's shortest length (`None`: it accepts no text) and the alternative that reached
/// it first.
fn fixed_point(rules: &[Vec<Vec<Item>>]) -> (Vec<Option<usize>>, Vec<usize>) {
    let mut lengths: Vec<Option<usize>> = vec![None; rules.len()];
    let mut chosen = vec![0; rules.len()];
    loop {
        let mut changed = false;
        for (id, alternatives) in rules.iter().enumerate() {
            for (index, sequence) in alternatives.iter().enumerate() {
                let Some(length) = sequence_length(sequence, &lengths) else { continue };
                if lengths[id].is_none_or(|known| length < known) {
                    lengths[id] = Some(length);
                    chosen[id] = index;
                    changed = true;
                }
            }
        }
        if !changed {
            return (lengths, chosen);
        }
    }
}

fn sequence_length(sequence: &[Item], lengths: &[Option<usize>]) -> Option<usize> {
    sequence.iter().try_fold(0usize, |sum, item| {
        if item.least == 0 {
            return Some(sum);
        }
        let one = match &item.element {
            Element::Text(text) => text.chars().count(),
            Element::Nothing => return None,
            Element::Rule(id) => lengths[*id]?,
            Element::Group(group) => group.iter().filter_map(|s| sequence_length(s, lengths)).min()?,
        };
        Some(sum.saturating_add(one.saturating_mul(item.least as usize)).min(MOST_CHARS + 1))
    })
}

/// Writes rule `id`'s shortest text; false past [`MOST_CHARS`] or [`MOST_DEPTH`].
fn write_rule(
    rules: &[Vec<Vec<Item>>],
    chosen: &[usize],
    lengths: &[Option<usize>],
    id: usize,
    out: &mut String,
    depth: usize,
) -> bool {
    depth < MOST_DEPTH && write_sequence(rules, chosen, lengths, &rules[id][chosen[id]], out, depth + 1)
}

fn write_sequence(
    rules: &[Vec<Vec<Item>>],
    chosen: &[usize],
    lengths: &[Option<usize>],
    sequence: &[Item],
    out: &mut String,
    depth: usize,
) -> bool {
    for item in sequence {
        for _ in 0..item.least {
            let written = match &item.element {
                Element::Text(text) => {
                    out.push_str(text);
                    true
                }
                Element::Nothing => false,
                Element::Rule(id) => write_rule(rules, chosen, lengths, *id, out, depth),
                Element::Group(group) => {
                    let shortest = group.iter().min_by_key(|s| sequence_length(s, lengths).unwrap_or(usize::MAX));
                    shortest.is_some_and(|s| write_sequence(rules, chosen, lengths, s, out, depth + 1))
                }
            };
            if !written || out.len() > MOST_CHARS * 4 {
                return false;
            }
        }
    }
    true
}

/// GBNF text as lexemes (comments and whitespace dropped); `None` where it is not GBNF.
fn lex(text: &str) -> Option<Vec<Lexeme>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let lexeme = match c {
            c if c.is_whitespace() => continue,
            '#' => {
                chars.by_ref().find(|&c| c == '\n');
                continue;
            }
            '"' => {
                let mut literal = Vec::new();
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => literal.push(escape(&mut chars)?),
                        c => literal.push(c),
                    }
                }
                Lexeme::Literal(literal)
            }
            '[' => {
                let negated = chars.next_if_eq(&'^').is_some();
                let mut ranges = Vec::new();
                loop {
                    let start = match chars.next()? {
                        ']' => break,
                        '\\' => escape(&mut chars)?,
                        c => c,
                    };
                    let mut end = start;
                    if chars.peek() == Some(&'-') {
                        chars.next();
                        end = match chars.next()? {
                            ']' => {
                                ranges.push((start, start));
                                ranges.push(('-', '-'));
                                break;
                            }
                            '\\' => escape(&mut chars)?,
                            c => c,
                        };
                    }
                    ranges.push((start, end));
                }
                Lexeme::Class(class_member(&ranges, negated))
            }
            '.' => Lexeme::Any,
            ':' => {
                (chars.next()? == ':' && chars.next()? == '=').then_some(())?;
                Lexeme::Define
            }
            '(' => Lexeme::Open,
            ')' => Lexeme::Close,
            '|' => Lexeme::Bar,
            '*' | '?' => Lexeme::Repeat(0),
            '+' => Lexeme::Repeat(1),
            '{' => {
                let counts: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let least = counts.split(',').next()?.trim();
                Lexeme::Repeat(if least.is_empty() { 0 } else { least.parse().ok()? })
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut name = c.to_string();
                while let Some(next) = chars.next_if(|&n| n.is_ascii_alphanumeric() || n == '-' || n == '_') {
                    name.push(next);
                }
                Lexeme::Name(name)
            }
            _ => return None,
        };
        out.push(lexeme);
    }
    Some(out)
}

/// The character after a backslash (llama.cpp's escapes).
fn escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<char> {
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, digits: usize| {
        let text: String = chars.take(digits).collect();
        char::from_u32(u32::from_str_radix(&text, 16).ok()?)
    };
    Some(match chars.next()? {
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        'x' => hex(chars, 2)?,
        'u' => hex(chars, 4)?,
        'U' => hex(chars, 8)?,
        c => c,
    })
}

/// A character the class matches, printable where one is: the first of its ranges, or for a
/// negated class the first of a few common characters it does not exclude.
fn class_member(ranges: &[(char, char)], negated: bool) -> Option<char> {
    let within = |c: char| ranges.iter().any(|&(start, end)| (start..=end).contains(&c));
    if !negated {
        return ranges.iter().find(|(start, end)| start <= end).map(|&(start, _)| start);
    }
    "a0 xA_".chars().chain((0x20..0x7F).filter_map(char::from_u32)).find(|&c| !within(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_classes_and_least_repetitions() {
        let grammar = "root ::= \"{\" space [a-z]+ [^\"\\\\]{2,5} digit* \"}\"? end\nspace ::= \" \"?\ndigit ::= [0-9]\nend ::= \"\\n\" | \"\\x41bc\"\n";
        assert_eq!(shortest_text(grammar, "root").as_deref(), Some("{aaa\n"));
    }

    #[test]
    fn the_shortest_alternative_and_group_win_and_recursion_ends() {
        let grammar = "root ::= item (\",\" item)* | \"[\" ( \"long one\" | \"ok\" ) \"]\"\n\
                       item ::= \"(\" item \")\" | \"xyz\"\n";
        assert_eq!(shortest_text(grammar, "root").as_deref(), Some("xyz"));
        let nested = "root ::= \"<\" value \">\"\nvalue ::= \"[\" value \"]\" | \"\"\n";
        assert_eq!(shortest_text(nested, "root").as_deref(), Some("<>"));
    }

    #[test]
    fn alternatives_continue_across_lines_and_comments() {
        let grammar =
            "# a comment\nroot ::= (\n  \"aaa\" |\n  \"b\"\n) tail # trailing\ntail ::= [\\]-] \nother ::= root root\n";
        assert_eq!(shortest_text(grammar, "root").as_deref(), Some("b]"));
        assert_eq!(shortest_text(grammar, "other").as_deref(), Some("b]b]"));
    }

    #[test]
    fn no_text_for_unreadable_or_empty_grammars() {
        assert_eq!(shortest_text("root ::= loop\nloop ::= \"a\" loop\n", "root"), None, "no finite text");
        assert_eq!(shortest_text("root ::= []\n", "root"), None, "an empty class");
        assert_eq!(shortest_text("root ::= \"unclosed\n", "root"), None);
        assert_eq!(shortest_text("root ::= \"a\"\n", "missing"), None);
        assert_eq!(shortest_text("root ::= undefined\n", "root"), None);
    }
}
