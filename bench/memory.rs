//! The memory a run needs for large payloads: peak RSS (GNU time's
//! ru_maxrss of the outbox-poll process) for ten events of 50 MB each, in
//! one batch of ten and in a drain. These are sizes, not timings: a busy
//! machine does not change them.

use crate::common::{Figure, Fixture, check};

/// Ten 50 MB payloads: each figure on a freshly filled table, every event
/// verified as arrived and every row as marked.
pub fn large_payloads(fx: &mut Fixture) -> Vec<Figure> {
    let runs: [(&str, &[&str]); 2] = [
        (
            "memory: 10 x 50 MB events, --batch-size 10",
            &["--batch-size", "10", "--json"],
        ),
        ("memory: 10 x 50 MB events, --drain", &["--drain", "--json"]),
    ];
    runs.into_iter()
        .map(|(name, args)| {
            let mean = fx.fill(10, 50_000_000);
            eprintln!("bench: 10 events, payload mean {mean:.0} bytes");
            let (seconds, published, rss, ok) = fx.run_binary(1, args, true);
            let (mut verified, mut failed) = fx.verify(10, true, true);
            if !ok {
                verified.push_str(", NONZERO EXIT");
                failed = true;
            }
            check(failed, &verified);
            eprintln!("bench: {name}: {rss:?} KiB");
            Figure {
                name: name.into(),
                events: published,
                seconds,
                rss_kb: rss,
                verified,
            }
        })
        .collect()
}
