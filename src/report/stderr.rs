//! Lines on stderr that never fail the run. `eprintln!` panics when it
//! cannot write (stderr closed: `2>&1 | head -1`), and the program wants
//! a closed pipe to end the program quietly, never with a panic. A line
//! that cannot be written is lost; nothing else depends on it.

use std::io::Write;

/// Writes `text` and a newline on stderr, if stderr takes it.
pub fn line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}
