//! What a run tells: its output on stdout (the one writer, the --json
//! summary, the --dry-run lines), the metrics file, the progress bar and
//! the log on stderr, and the OpenTelemetry traces.

pub(crate) mod dry_run;
pub mod logging;
pub mod metrics;
pub(crate) mod otlp_client;
pub mod panic;
pub(crate) mod progress;
pub mod stderr;
pub(crate) mod stdout;
pub(crate) mod summary;
pub mod totals;
pub(crate) mod traces;

/// "s" unless there is exactly one.
pub(crate) fn plural<N: PartialEq + From<u8>>(count: N) -> &'static str {
    if count == N::from(1) { "" } else { "s" }
}
