//! `outbox-poll replay --from FILE`: republishes archived events (see the
//! module `archive`) as the relay published them: to the row's exchange
//! column, else --exchange; the routing key, message_id and properties
//! the relay sets (broker::message), the payload's exact bytes, plus the
//! header `x-replayed-at` (when this replay ran, RFC 3339); with publisher
//! confirms and `mandatory`, batch after batch, like a drain.
//!
//! The file is read twice: once whole, to check every line before
//! anything is published (a replay that stops at line 5,000 of 10,000
//! over a malformed line would leave the consumers half replayed, and a
//! rerun would send the first half again), then to publish. A malformed
//! line is one message naming FILE:LINE and what is wrong, exit 78,
//! nothing published.
//!
//! `--since` / `--until` select by created_at (since inclusive, until
//! exclusive), `--event-type` by a shell-style pattern, `--event-id` by
//! id; given together, an event must pass them all. An event archived
//! with an `expires_at` already past is not published (counted expired),
//! as the relay would not publish it.
//!
//! It never connects to PostgreSQL. Exits as a poll does: 0 every selected
//! event confirmed (or none selected), 1 some returned unroutable, refused
//! or nacked (each named on stderr), 69 the broker unreachable or lost,
//! 78 a bad file or a missing --exchange.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{Result, anyhow};
use jiff::Timestamp;

use crate::archive::reader::Reader;
use crate::archive::record::{Record, Time};
use crate::broker::Broker;
use crate::broker::round::NACKED;
use crate::cli::{Cli, ReplayArgs};
use crate::config;
use crate::exit::{self, Exit};
use crate::guard::stop::Stop;
use crate::report::progress::Progress;
use crate::report::totals::Totals;
use crate::report::{plural, stderr, stdout, summary};
use crate::sql::outbox::Event;

/// The header every replayed message carries: when it was replayed.
pub(crate) const REPLAYED_AT: &str = "x-replayed-at";

/// Events published per round of confirms: as a poll's default batch.
const BATCH: usize = 100;

pub fn run(cli: &Cli, args: &ReplayArgs) -> Result<Exit> {
    let started = Instant::now();
    let mut totals = Totals::default();
    let result = replay(cli, args, &mut totals);
    if cli.json {
        return summary::after_run(&totals, started, result);
    }
    if result.is_ok() {
        let (published, failed, expired) = (totals.published, totals.failed, totals.expired);
        let text = format!(
            "replayed {} of {}: {published} published, {failed} failed, {expired} expired",
            totals.claimed,
            args.from.display()
        );
        stdout::line(&text).map_err(stdout::unwritable)?;
    }
    result
}

fn replay(cli: &Cli, args: &ReplayArgs, totals: &mut Totals) -> Result<Exit> {
    let broker = config::broker_config(
        &cli.poll,
        args.amqp_url.as_deref(),
        args.exchange.as_deref(),
        cli.database.connect_timeout,
        args.confirm_timeout,
    )?;
    let filter = Filter::of(args);
    let selected = check(args, &filter)?;
    totals.claimed = selected;
    if selected == 0 {
        return Ok(Exit::Success);
    }
    let stop = Stop::install()?;
    let mut broker = Broker::new(broker, stop.clone());
    let mut progress = Progress::of_total(selected);
    let result = publish(args, &filter, &mut broker, &stop, &mut progress, totals);
    progress.done(totals);
    broker.close();
    result?;
    Ok(match stop.requested() {
        Some(exit) => exit,
        None if totals.failed > 0 => Exit::EventsFailed,
        None => Exit::Success,
    })
}

/// What --since, --until, --event-type and --event-id select.
struct Filter<'a> {
    since: Option<Time>,
    until: Option<Time>,
    event_type: Option<&'a str>,
    event_ids: HashSet<&'a str>,
}

impl<'a> Filter<'a> {
    fn of(args: &'a ReplayArgs) -> Filter<'a> {
        Filter {
            since: args.since.map(Time::At),
            until: args.until.map(Time::At),
            event_type: args.event_type.as_deref(),
            event_ids: args.event_id.iter().map(String::as_str).collect(),
        }
    }

    /// A record without created_at passes no time filter.
    fn selects(&self, record: &Record) -> bool {
        let after = |since: Time| record.created_at.is_some_and(|at| at >= since);
        let before = |until: Time| record.created_at.is_some_and(|at| at < until);
        self.since.is_none_or(after)
            && self.until.is_none_or(before)
            && self
                .event_type
                .is_none_or(|pattern| matches_glob(pattern, record.event_type()))
            && (self.event_ids.is_empty() || self.event_ids.contains(record.event_id()))
    }
}

/// Reads the whole archive, checking every line; returns how many events
/// the filters select. Nothing is published before this passes.
fn check(args: &ReplayArgs, filter: &Filter) -> Result<u64> {
    let mut reader = Reader::open(&args.from)?;
    let mut selected = 0;
    while let Some(record) = next_record(&mut reader)? {
        if filter.selects(&record) {
            selected += 1;
        }
    }
    Ok(selected)
}

/// The next record of the archive, skipping blank lines; a line that is
/// not one names its place (exit 78).
fn next_record(reader: &mut Reader) -> Result<Option<Record>> {
    loop {
        let id = reader.number() as i64 + 1;
        let Some(line) = reader.next_line()? else {
            return Ok(None);
        };
        if line.trim().is_empty() {
            continue;
        }
        return match Record::parse(line, id) {
            Ok(record) => Ok(Some(record)),
            Err(why) => Err(exit::config(anyhow!(
                "{}: {why}; nothing was published (correct or remove the line and replay again)",
                reader.place()
            ))),
        };
    }
}

/// The second reading: the selected events, a batch at a time, until the
/// end or a signal.
fn publish(
    args: &ReplayArgs,
    filter: &Filter,
    broker: &mut Broker,
    stop: &Stop,
    progress: &mut Progress,
    totals: &mut Totals,
) -> Result<()> {
    let replayed_at = Timestamp::now().to_string();
    let mut reader = Reader::open(&args.from)?;
    let mut batch = Vec::with_capacity(BATCH);
    let mut at_end = false;
    while !at_end && stop.requested().is_none() {
        let now = Timestamp::now();
        while batch.len() < BATCH {
            let Some(record) = next_record(&mut reader)? else {
                at_end = true;
                break;
            };
            if !filter.selects(&record) {
                continue;
            }
            let event = record.into_event(REPLAYED_AT, &replayed_at, now);
            match event.expired() {
                true => totals.expired += 1,
                false => batch.push(event),
            }
        }
        if !batch.is_empty() {
            send(broker, &batch, args, totals)?;
            batch.clear();
            progress.update(totals);
        }
    }
    Ok(())
}

/// One batch, its confirms awaited; each failure named on stderr. An
/// outage (or a refusal of --exchange) ends the replay with its exit.
fn send(
    broker: &mut Broker,
    events: &[Event],
    args: &ReplayArgs,
    totals: &mut Totals,
) -> Result<()> {
    let sent = broker.send(events, false)?;
    let outcome = broker.outcome(sent, events);
    totals.batches += 1;
    totals.published += outcome.confirmed.len() as u64;
    let failures = outcome
        .failed
        .iter()
        .map(|(id, reason)| (*id, reason.as_str()))
        .chain(outcome.declined.iter().map(|id| (*id, NACKED)));
    for (id, reason) in failures {
        totals.failed += 1;
        let event_id = events
            .iter()
            .find(|event| event.id == id)
            .map_or("?", |event| event.event_id.as_str());
        stderr::line(&format!(
            "outbox-poll: event {event_id} ({}:{id}) was not replayed: {reason}",
            args.from.display()
        ));
    }
    match outcome.outage {
        Some(outage) => {
            let left = events.len() as u64 - outcome.confirmed.len() as u64;
            Err(outage.context(format!(
                "replaying {}: {left} event{} of the batch unconfirmed",
                args.from.display(),
                plural(left)
            )))
        }
        None => Ok(()),
    }
}

/// A shell-style pattern: `*` any run of characters, `?` any one, every
/// other character itself.
fn matches_glob(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), text.chars().collect());
    // The classic greedy match with one backtrack point, the last `*`.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::matches_glob;

    #[test]
    fn event_type_patterns_match_as_the_shell_does() {
        for (pattern, text, matches) in [
            ("order.*", "order.created", true),
            ("order.*", "orders.created", false),
            ("*.created", "order.created", true),
            ("order.?reated", "order.created", true),
            ("order", "order.created", false),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
        ] {
            assert_eq!(matches_glob(pattern, text), matches, "{pattern} {text}");
        }
    }
}
