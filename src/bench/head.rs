//! H, the changed head: a Home Assistant session in each of the three layouts its integrations
//! write ([`HeadLayout`]): the fixed system message, the clock at its end, the clock first,
//! and the clock-last text with nothing moving. Between turns the clock moves and one or two
//! devices change state (not in the unchanged layout); the history grows with the replies. Each follow-up turn's prompt tokens the server evaluated (`prompt_tokens` less
//! `cached_tokens`) and its TTFT, against the fixed layout's: what a clock line costs a turn.

use serde_json::json;

use super::home::{HeadLayout, Home, HOME_ASKS};
use super::report::{Row, Scenario};
use super::ServerRun;

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    /// H: one session of `turns` turns per layout, the fixed layout first.
    pub(super) async fn changed_head_scenario(&mut self) {
        for layout in HeadLayout::ALL {
            let nonce = self.nonce(&format!("Home ({}). ", layout.name()));
            let mut home = Home::new(self.config.home_entities);
            let mut history = Vec::new();
            for turn in 1..=self.config.turns {
                let moved = if layout.changes() { turn as usize } else { 1 };
                if moved > 1 {
                    home.step(self.rep as usize * 5 + moved);
                }
                let minutes = self.rep as usize * 97 + moved * 3;
                let system = nonce.clone() + &home.system(layout, minutes);
                let ask = HOME_ASKS[(self.rep as usize + turn as usize - 2) % HOME_ASKS.len()];
                let mut messages = vec![json!({"role": "system", "content": system})];
                messages.extend(history.iter().cloned());
                messages.push(json!({"role": "user", "content": ask}));
                let body = self.body(&messages, self.config.turn_tokens, true);
                let reply = self.request(self.row(Scenario::changed_head(layout), turn), body).await;
                history.push(json!({"role": "user", "content": ask}));
                history.push(json!({"role": "assistant", "content": reply.content}));
            }
        }
    }
}
