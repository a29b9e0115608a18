//! Gemma call grammars in llama.cpp's own grammar engine: a string ends only at its quote
//! marker and may hold any other text, numbers are JSON numbers, top-level keys are the
//! schema's names (`:` included), and `auto` grammars also take a bare JSON call. Loads only
//! SmolLM2's vocabulary: a grammar sampler needs a vocabulary, not weights.

mod common;

use firstword::chat::tools::{request_grammar, ToolChoice, ToolDefinition, ToolFormat, ToolSet};
use firstword::Grammar;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use serde_json::json;

/// What llama.cpp's grammar makes of a text.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The text is a whole match: the grammar allows the end of generation after it.
    Complete,
    /// The text is a beginning of a match.
    Partial,
    /// Some token of the text is not allowed.
    Rejected,
}

fn verdict(model: &LlamaModel, grammar: &Grammar, text: &str) -> Verdict {
    let mut sampler = LlamaSampler::grammar(model, &grammar.gbnf, &grammar.root)
        .unwrap_or_else(|e| panic!("llama.cpp cannot parse the grammar ({e}):\n{}", grammar.gbnf));
    for token in model.vocab().tokenize(text.as_bytes(), false, false) {
        if sampler.try_accept(token).is_err() {
            return Verdict::Rejected;
        }
    }
    let eos = model.vocab().eos();
    let mut end = LlamaTokenDataArray::new(vec![LlamaTokenData::new(eos, 0.0, 0.0)], false);
    end.apply_sampler(&mut sampler);
    if end.data[0].logit().is_finite() {
        Verdict::Complete
    } else {
        Verdict::Partial
    }
}

fn tools() -> ToolSet {
    ToolSet::new(vec![ToolDefinition {
        name: "f".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": "number"}, "a:b": {"type": "string"}}}),
    }])
    .expect("tools")
}

#[test]
fn gemma_grammars_in_llama_cpp() {
    let backend = LlamaBackend::init().expect("backend");
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(&backend, common::smollm2_path(), &params).expect("vocabulary loads");
    let tools = tools();
    for (format, q, open, close) in [
        (ToolFormat::gemma4(), "<|\"|>", "<|tool_call>", "<tool_call|>"),
        (ToolFormat::function_gemma(), "<escape>", "<start_function_call>", "<end_function_call>"),
    ] {
        let grammar = request_grammar(&format, &tools, &ToolChoice::Required, false, None).expect("grammar");
        let call = |body: &str| format!("{open}call:f{{{body}}}{close}");
        let string = |text: &str| call(&format!("s:{q}{text}{q}"));
        // A string holds any text without the quote marker, `<` included, up to its end.
        let quote_start = &q[..q.len() - 1];
        for text in ["", "a", "a<", "<", "<<", "a<<b", "x<|y", "x<e", "<esc", quote_start, "1 < 2 and 3 <> 4"] {
            assert_eq!(verdict(&model, &grammar, &string(text)), Verdict::Complete, "{format:?} string {text:?}");
        }
        // The first quote marker ends the string.
        let inside = format!("s:{q}x{q}y{q}");
        assert_eq!(verdict(&model, &grammar, &call(&inside)), Verdict::Rejected, "{format:?}: {inside:?}");
        let ended = format!("{open}call:f{{s:{q}x{q}");
        assert_eq!(verdict(&model, &grammar, &ended), Verdict::Partial, "{format:?}: after the string");
        // Numbers as JSON writes them: no leading zeros.
        for number in ["0", "10", "-0.5", "3e2", "-12.25E-3"] {
            assert_eq!(verdict(&model, &grammar, &call(&format!("n:{number}"))), Verdict::Complete, "{number}");
        }
        for number in ["01", "-01", "00", "0.5.1", "1."] {
            assert_eq!(verdict(&model, &grammar, &call(&format!("n:{number}"))), Verdict::Rejected, "{number}");
        }
        // Top-level keys are the schema's names, `:` included, in the schema's order, each once.
        let keyed = call(&format!("n:1,a:b:{q}v{q}"));
        assert_eq!(verdict(&model, &grammar, &keyed), Verdict::Complete, "{format:?}: {keyed}");
        assert_eq!(verdict(&model, &grammar, &call("x:1")), Verdict::Rejected, "{format:?}: unknown key");
        let repeated = call(&format!("s:{q}a{q},s:{q}b{q}"));
        assert_eq!(verdict(&model, &grammar, &repeated), Verdict::Rejected, "{format:?}: a key twice");

        // `auto`: a reply opening with a JSON object must be a bare JSON call of a declared tool.
        let auto = request_grammar(&format, &tools, &ToolChoice::Auto, true, None).expect("grammar");
        assert_eq!(auto.anchored_triggers, vec!["{".to_string()]);
        let bare = r#"{"name": "f", "arguments": {"s": "x", "n": 2}}"#;
        assert_eq!(verdict(&model, &auto, bare), Verdict::Complete, "{format:?}: {bare}");
        assert_eq!(verdict(&model, &auto, &string("a<")), Verdict::Complete, "{format:?}: tagged call");
        let other = r#"{"type": "function", "name": "f"}"#;
        assert_eq!(verdict(&model, &auto, other), Verdict::Rejected, "{format:?}: not a call");
    }
    // Every other format's `auto` grammar takes the bare JSON call too.
    let others =
        ToolFormat::examples().into_iter().filter(|f| *f != ToolFormat::gemma4() && *f != ToolFormat::function_gemma());
    for format in others {
        let key = if format == ToolFormat::llama3() { "parameters" } else { "arguments" };
        let auto = request_grammar(&format, &tools, &ToolChoice::Auto, true, None).expect("grammar");
        let bare = format!(r#"{{"name": "f", "{key}": {{"s": "x<"}}}}"#);
        assert_eq!(verdict(&model, &auto, &bare), Verdict::Complete, "{format:?}: {bare}");
    }
}
