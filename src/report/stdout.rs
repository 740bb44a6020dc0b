//! The one way to stdout: every command prints through here, a line (or a
//! block) at a time, flushed at once so a pipe sees each line as it comes.
//!
//! A closed pipe (`outbox-poll status | head -1`, `--dry-run | head`) is
//! not an error: nobody reads any more, so later writes are skipped and
//! the run goes on to its own end and exit code, quietly, as ripgrep does.
//! (Rust ignores SIGPIPE, so the write fails with BrokenPipe instead of
//! killing the process in the middle of a transaction.) Any other failure,
//! a full disk say, is returned for one clear line.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::anyhow;

use crate::exit;

/// Set once a write met a closed pipe.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` and a newline.
pub(crate) fn line(text: &str) -> io::Result<()> {
    write(format!("{text}\n").as_bytes())
}

/// Writes `bytes` as they are.
pub(crate) fn write(bytes: &[u8]) -> io::Result<()> {
    if is_closed() {
        return Ok(());
    }
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::SeqCst);
            Ok(())
        }
        result => result,
    }
}

/// Whether the reader of stdout has gone: output nobody reads need not be
/// produced (a dry run stops printing its lines).
pub(crate) fn is_closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// A write that failed for another reason than a closed pipe: the output
/// the operator asked for cannot be delivered, so the operator must look
/// (exit 78, like an unwritable metrics file).
pub(crate) fn unwritable(error: io::Error) -> anyhow::Error {
    exit::config(anyhow!(
        "cannot write to stdout: {error}; check where stdout goes (a full disk, a closed file)"
    ))
}
