//! The variables a template reads that no rendering gives it (firefunction's `functions` and
//! `datetime`): clients give them in `chat_template_kwargs`.

use super::{ChatTemplate, TEMPLATE_NAME};

impl ChatTemplate {
    /// The variables the template reads that neither the template nor a rendering defines
    /// (firefunction's `functions` and `datetime`): clients give them in
    /// `chat_template_kwargs`.
    #[must_use]
    pub fn free_variables(&self) -> Vec<String> {
        const GIVEN: &[&str] = &[
            "messages",
            "tools",
            "add_generation_prompt",
            "bos_token",
            "eos_token",
            "range",
            "namespace",
            "dict",
            "raise_exception",
            "strftime_now",
            "lipsum",
            "cycler",
            "joiner",
            "debug",
            "loop",
            "self",
            "true",
            "false",
            "none",
            "True",
            "False",
            "None",
        ];
        let Ok(template) = self.env.get_template(TEMPLATE_NAME) else { return Vec::new() };
        let mut names: Vec<String> =
            template.undeclared_variables(false).into_iter().filter(|name| !GIVEN.contains(&name.as_str())).collect();
        // A variable the template sets somewhere (under a condition) is its own.
        names.retain(|name| !self.source.contains(&format!("set {name} ")));
        names.sort();
        names
    }
}
