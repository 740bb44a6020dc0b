//! Checks many areas share: the shape of every error, the order of keyed
//! messages, and waiting for a condition.

use std::collections::HashMap;
use std::time::Duration;

use super::broker::Message;
use super::run::Run;

/// The shape every error must have: one line, no panic, no backtrace.
pub fn assert_one_clear_line(run: &Run) {
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got: {}",
        run.stderr
    );
    assert!(
        lines[0].starts_with("outbox-poll: error: "),
        "{}",
        run.stderr
    );
    for bad in [
        "panicked",
        "backtrace",
        "RUST_BACKTRACE",
        "Error {",
        "Some(",
    ] {
        assert!(!run.stderr.contains(bad), "{bad:?} in: {}", run.stderr);
    }
}

/// Checks that each ordering key's messages, named `<key>-<n>`, arrived
/// with n counting up from 0 and carried their key as `x-ordering-key`;
/// returns how many were checked.
pub fn assert_in_order_per_key(messages: &[Message]) -> u32 {
    let mut next: HashMap<String, u32> = HashMap::new();
    for message in messages {
        let key = message.header_text("x-ordering-key").unwrap();
        let (name, n) = message.message_id.split_once('-').unwrap();
        assert_eq!(name, key);
        let expected = next.entry(key.clone()).or_insert(0);
        assert_eq!(
            n.parse::<u32>().unwrap(),
            *expected,
            "key {key} out of order"
        );
        *expected += 1;
    }
    next.values().sum()
}

/// Waits until `condition` holds, checking every 20 ms, for at most `limit`.
pub fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}
