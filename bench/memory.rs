//! The memory a run needs for large payloads: the peak RSS (GNU time's
//! ru_maxrss of the outbox-poll process) of a drain of ten events of 50 MB
//! each, at --batch-size 10: one batch of all ten, unless --batch-bytes
//! cuts it. A size, not a timing: a busy machine does not change it.

use crate::common::{Figure, Fixture, check, load_average};

pub fn large_payloads(fx: &mut Fixture) -> Figure {
    let name = "memory: 10 x 50 MB events, --drain --batch-size 10";
    let mean = fx.fill(10, 50_000_000);
    eprintln!("bench: 10 events, payload mean {mean:.0} bytes");
    let args = ["--drain", "--batch-size", "10", "--json"];
    let (seconds, published, rss, ok) = fx.run_binary(1, &args, true);
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
        load: load_average(),
    }
}
