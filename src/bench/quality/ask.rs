//! Q: each server answers every item of the quality set, streamed and timed like the other
//! scenarios, with the same sampling for all (greedy, or the same seeds): matched pairs. Each
//! answer is appended to the run's directory as it comes.

use super::super::client::{send, ServerReply};
use super::super::media::MediaInputs;
use super::super::report::{Row, Scenario};
use super::super::{base, ServerRun};
use super::store::RunDir;
use super::{Answer, AnsweredCall, QualityError, QualitySet};

/// The quality scenario's settings.
#[derive(Clone, Debug)]
pub struct QualityRun {
    /// The items.
    pub set: QualitySet,
    /// Seeded samples per item (1: one greedy answer).
    pub samples: u32,
    /// Where the answers go.
    pub dir: RunDir,
}

impl QualityRun {
    /// The samples asked: 0 (greedy) alone, or seeds 1 to K.
    #[must_use]
    pub fn sample_numbers(&self) -> Vec<u32> {
        if self.samples <= 1 {
            vec![0]
        } else {
            (1..=self.samples).collect()
        }
    }

    /// Requests per server.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.sample_numbers().len() as u64 * self.set.items.len() as u64
    }
}

/// The answer a reply makes.
fn answer(item: &str, sample: u32, row: &Row, reply: ServerReply) -> Answer {
    Answer {
        item: item.to_string(),
        sample,
        server: row.server.clone(),
        content: reply.content,
        tool_calls: reply
            .calls
            .into_iter()
            .map(|call| AnsweredCall { name: call.name, arguments: call.arguments })
            .collect(),
        finish_reason: reply.finish_reason,
        error: row.error.clone(),
        ttft_ms: row.ttft_ms,
        total_ms: row.total_ms,
    }
}

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    /// Q: every item, every sample; a row and an answer each.
    pub(in crate::bench) async fn quality_scenario(
        &mut self,
        quality: &QualityRun,
        media: Option<&MediaInputs>,
    ) -> Result<(), QualityError> {
        for sample in quality.sample_numbers() {
            for (index, item) in quality.set.items.iter().enumerate() {
                let body = item.body(&self.config.model, sample, media);
                let mut row = self.row(Scenario::Quality, index as u32 + 1);
                let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
                quality.dir.append_answer(&answer(&item.id, sample, &row, reply))?;
                self.record(row);
            }
        }
        Ok(())
    }
}
