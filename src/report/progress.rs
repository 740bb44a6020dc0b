//! A progress bar for a --drain (or a replay) that someone is watching: published count,
//! rate and remaining backlog, on stderr. Only when stderr is a terminal
//! and the drain has run for more than a moment; under cron, in CI or with
//! stderr redirected nothing is drawn and not even the backlog is counted.
//! A terminal that cannot redraw a line (TERM=dumb or unset) gets no bar.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use postgres::Client;

use crate::config::{Database, Relay};
use crate::report::totals::Totals;
use crate::sql::figures;

/// A drain shorter than this shows nothing at all.
const GRACE: Duration = Duration::from_secs(1);

/// Inactive (and free) unless a bar may be drawn.
pub(crate) struct Progress(Option<Active>);

struct Active {
    started: Instant,
    /// Due events when the drain started.
    backlog: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Counts the due backlog (one cheap query), if a bar may be drawn.
    pub(crate) fn new(client: &mut Client, database: &Database, relay: &Relay) -> Progress {
        if !relay.drain || !can_redraw() {
            return Progress(None);
        }
        // Only a bar's length: without it the bar grows as events come.
        let backlog = figures::due(client, &database.table, database.max_attempts).unwrap_or(0);
        Progress::active(backlog.max(0) as u64)
    }

    /// For a run of `total` events known beforehand (a replay), if a bar
    /// may be drawn.
    pub(crate) fn of_total(total: u64) -> Progress {
        match can_redraw() {
            true => Progress::active(total),
            false => Progress(None),
        }
    }

    fn active(backlog: u64) -> Progress {
        Progress(Some(Active {
            started: Instant::now(),
            backlog,
            bar: None,
        }))
    }

    /// After each batch.
    pub(crate) fn update(&mut self, totals: &Totals) {
        let Some(progress) = &mut self.0 else { return };
        let elapsed = progress.started.elapsed();
        if progress.bar.is_none() && elapsed < GRACE {
            return;
        }
        let bar = progress.bar.get_or_insert_with(|| {
            let bar =
                ProgressBar::with_draw_target(Some(progress.backlog), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        let done = totals.published + totals.failed;
        // New events may arrive during the drain.
        bar.set_length(progress.backlog.max(done));
        bar.set_position(done);
        let rate = totals.published as f64 / elapsed.as_secs_f64().max(0.001);
        bar.set_message(format!(
            "published {}, failed {}, {rate:.0}/s, {} remaining",
            totals.published,
            totals.failed,
            progress.backlog.saturating_sub(done)
        ));
    }

    /// When the drain ends: the final figures stay on screen.
    pub(crate) fn done(mut self, totals: &Totals) {
        self.update(totals);
        if let Some(bar) = self.0.and_then(|progress| progress.bar) {
            bar.finish();
        }
    }
}

/// A bar redraws its line in place: that needs a terminal, and one that
/// can move the cursor (not `TERM=dumb`, nor no TERM at all).
fn can_redraw() -> bool {
    let term = std::env::var("TERM").unwrap_or_default();
    std::io::stderr().is_terminal() && !term.is_empty() && term != "dumb"
}
