//! Logging to stderr. Silent by default: cron mails whatever a job prints,
//! so a healthy run prints nothing and only warnings and errors get out.

/// `-v` shows our progress, `-vv` adds our debug and the libraries' info.
/// lapin stays quiet below -vv: it reports at warn and error what we report
/// ourselves in one line (a returned message, a closed channel), and dumps
/// whole messages while doing it.
/// RUST_LOG, when set, replaces all of this (e.g. `RUST_LOG=lapin=debug`;
/// lapin logs through `tracing`, whose "log" feature forwards to us).
pub fn init(verbose: u8) {
    let default = match verbose {
        0 => "warn,lapin=off",
        1 => "warn,lapin=off,outbox_poll=info",
        _ => "info,outbox_poll=debug",
    };
    let filters = std::env::var("RUST_LOG").unwrap_or_else(|_| default.to_string());
    env_logger::Builder::new().parse_filters(&filters).init();
}
