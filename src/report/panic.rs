//! A panic is a bug, and still gets the one line on stderr every failure
//! gets (ARCHITECTURE.md, "One clear line, never a password"):
//! no backtrace (even with RUST_BACKTRACE set), and the exit an
//! unclassified error gets (`Exit::Internal`).
//!
//! Exiting at once, from whichever thread panicked, is safe: nothing the
//! broker had not confirmed was ever marked, and PostgreSQL rolls back the
//! transactions of the connections that go with the process.

use crate::exit::Exit;
use crate::report::stderr;

/// Installs the hook for the rest of the process.
pub fn one_line() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|text| text.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        let place = info
            .location()
            .map(|location| format!(" at {}:{}", location.file(), location.line()))
            .unwrap_or_default();
        stderr::line(&format!(
            "outbox-poll: internal error: {what}{place}; this is a bug, please report it (nothing \
             unconfirmed was marked: the next run sends the events of any batch not committed)"
        ));
        std::process::exit(i32::from(Exit::Internal.code()));
    }));
}
