//! The running figures of a poll run: what the JSON summary, the metrics
//! file, the progress bar and the watchdog report; and, over many
//! outboxes, each one's figures and exit code.

use crate::exit::Exit;

/// What a run has done so far; a batch counts once its transaction ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub(crate) claimed: u64,
    pub(crate) published: u64,
    pub(crate) failed: u64,
    /// Events claimed past their expires_at: marked expired, never sent.
    pub(crate) expired: u64,
    pub(crate) batches: u64,
    /// Events the broker answered for in a batch whose COMMIT's outcome is
    /// unknown (the connection dropped during it): marked or not, nobody
    /// can tell, so they are counted neither as published nor as failed.
    pub(crate) unknown: u64,
}

impl Totals {
    /// Adds another's figures: a run's totals over its outboxes.
    pub(crate) fn add(&mut self, other: &Totals) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.failed += other.failed;
        self.expired += other.expired;
        self.batches += other.batches;
        self.unknown += other.unknown;
    }
}

/// What became of one outbox of a run over many (`relay::many`).
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) database: String,
    pub(crate) table: String,
    pub(crate) totals: Totals,
    pub(crate) exit: Exit,
}
