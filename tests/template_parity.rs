//! SmolLM2's own Jinja template, rendered by firstword, is byte-identical to llama.cpp's
//! rendering of the same conversation.

mod common;

use firstword::chat::{ChatTemplate, ModelTemplateFacts, TemplateSource};
use firstword::ChatMessage;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};

#[test]
fn smollm2_template_renders_byte_identical_to_llama_cpp() {
    let backend = LlamaBackend::init().expect("backend");
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(&backend, common::smollm2_path(), &params).expect("SmolLM2 loads");
    let gguf_template = model.chat_template(None).expect("SmolLM2 has a template");
    let facts = ModelTemplateFacts {
        gguf_template: Some(gguf_template.to_string().expect("utf-8")),
        architecture: "llama".into(),
        bos_token: "<|im_start|>".into(),
        eos_token: "<|im_end|>".into(),
    };
    let (template, source) = ChatTemplate::for_model(&facts, None).expect("compiles");
    assert_eq!(source, TemplateSource::Gguf);

    let conversations: Vec<Vec<(&str, &str)>> = vec![
        vec![("system", "You are a concise assistant."), ("user", "Hi! ¿Qué tal? 😀")],
        vec![
            ("system", "Multi\nline\n\n system  "),
            ("user", "First question"),
            ("assistant", "First answer."),
            ("user", "  Second {{ question }} with {% braces %}  "),
        ],
    ];
    for conversation in conversations {
        let ours: Vec<ChatMessage> = conversation
            .iter()
            .map(|(role, content)| match *role {
                "system" => ChatMessage::system(*content),
                "user" => ChatMessage::user(*content),
                _ => ChatMessage::assistant(*content),
            })
            .collect();
        let theirs: Vec<LlamaChatMessage> = conversation
            .iter()
            .map(|(role, content)| LlamaChatMessage::new(role.to_string(), content.to_string()).expect("message"))
            .collect();
        for add_generation_prompt in [true, false] {
            let expected =
                model.apply_chat_template(&gguf_template, &theirs, add_generation_prompt).expect("llama.cpp renders");
            let rendered =
                template.render(&ours, None, add_generation_prompt, &Default::default()).expect("minijinja renders");
            assert_eq!(
                rendered, expected,
                "conversation {conversation:?}, add_generation_prompt {add_generation_prompt}"
            );
        }
    }

    // Without a system message the Jinja template inserts SmolLM's default one, as transformers
    // and llama-server's Jinja path do; llama.cpp's legacy C renderer (used above) skips the
    // template's logic, so here the expected text is the template's own output.
    let rendered = template
        .render(&[ChatMessage::user("No system prompt here.")], None, true, &Default::default())
        .expect("renders");
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nNo system prompt here.<|im_end|>\n<|im_start|>assistant\n"
    );
}
