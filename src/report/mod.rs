//! What a run tells: its output on stdout (the one writer, the --json
//! summary, the --dry-run lines), the metrics file, the progress bar and
//! the log on stderr, and the OpenTelemetry traces.

pub mod dry_run;
pub mod logging;
pub mod metrics;
pub mod panic;
pub mod progress;
pub mod stderr;
pub mod stdout;
pub mod summary;
pub mod totals;
pub mod traces;

/// "s" unless there is exactly one.
pub fn plural<N: PartialEq + From<u8>>(count: N) -> &'static str {
    if count == N::from(1) { "" } else { "s" }
}
