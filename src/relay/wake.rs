//! The wake-up of a --follow over many outboxes: per database, one
//! session of its own, on a thread of its own, that LISTENs on the channel
//! of each of its selected tables (`migrate --notify` installs a table's
//! trigger) and looks for due events there too, and tells the follow
//! which tables to serve. So a producer's commit in any tenant wakes the
//! follow at once, as it wakes the follow of a single table, and the looks
//! at a quiet database never take a session from the batches.
//!
//! A thread per database, because a session can only wait on its own
//! socket, and the follow must wait on all of them at once. A watcher
//! looks every LOOK_EVERY where a table has no trigger, and every
//! SAFETY_LOOK where all have one (for what no insert announces: a backoff
//! that ran out, a requeue, rows a killed run gave back). The watchers'
//! sessions count against --max-connections: at most half of the limit
//! watches, so that the other half serves batches, in the selection's
//! order of databases. A database without a watcher, or whose watcher
//! lost its session, is looked at by the follow itself (see `many`); a
//! batch that meets the same outage fails that outbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use crate::plan;
use crate::sql::notify;
use crate::sql::table::TableName;

/// How long a watcher waits before it looks whether the follow has ended:
/// the threads end within this of the follow.
const SLICE: Duration = Duration::from_millis(250);
/// How often a watcher looks for due events where a table has no trigger:
/// one statement per DUE_CHUNK tables (see `plan::due_tables`).
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How often it looks where every table has one.
const SAFETY_LOOK: Duration = Duration::from_secs(1);

/// What a listening thread tells the follow.
enum Heard {
    /// A notification on a channel of this database.
    Channel(usize, String),
    /// A look at this database: the lanes with due events.
    Due(Vec<usize>),
    /// Its session is gone: this database is polled from now on.
    Lost(usize),
}

/// The listeners of a follow over many outboxes.
pub(crate) struct Wake {
    heard: Receiver<Heard>,
    /// Keeps `heard` open while no listener runs.
    _none: Sender<Heard>,
    /// (database, channel) to the lane of its table, and the table.
    lanes: HashMap<(usize, String), (usize, String)>,
    /// Per database: a watcher serves it.
    watched: Vec<bool>,
    /// Per database: its label, for the log.
    labels: Vec<String>,
    /// How many sessions the listeners hold.
    sessions: usize,
    /// Set when the follow ends: the threads return.
    done: Arc<AtomicBool>,
}

/// One database's part of a follow: its index, and its lanes' tables.
pub(crate) struct Tables {
    pub(crate) server: usize,
    pub(crate) label: String,
    pub(crate) lanes: Vec<(usize, TableName)>,
}

impl Wake {
    /// Starts a watcher for each of `databases` while fewer than `most`
    /// watch, on the session `session` gives (one the run already holds,
    /// or a new one). A database whose watcher cannot start is left to the
    /// follow's own looks, with a line in the log: slower, not wrong.
    pub(crate) fn start(
        databases: Vec<Tables>,
        databases_count: usize,
        most: usize,
        max_attempts: i32,
        mut session: impl FnMut(usize) -> Result<Client>,
    ) -> Wake {
        let (tell, heard) = mpsc::channel();
        let mut wake = Wake {
            heard,
            _none: tell.clone(),
            lanes: HashMap::new(),
            watched: vec![false; databases_count],
            labels: vec![String::new(); databases_count],
            sessions: 0,
            done: Arc::new(AtomicBool::new(false)),
        };
        for database in databases {
            wake.labels[database.server] = database.label.clone();
            if wake.sessions >= most {
                log::info!(
                    "database {}: looked at between batches (--max-connections leaves no \
                     session to watch it with)",
                    database.label
                );
                continue;
            }
            let tables: Vec<TableName> = database.lanes.iter().map(|(_, t)| t.clone()).collect();
            let listening = session(database.server).and_then(|mut client| {
                let channels = notify::listen_all(&mut client, &tables)?;
                match channels.len() == tables.len() {
                    true => Ok((client, channels)),
                    false => Err(anyhow!("a table was dropped while the run started")),
                }
            });
            let (client, channels) = match listening {
                Ok(listening) => listening,
                Err(error) => {
                    log::info!(
                        "database {}: looked at between batches: {error:#}",
                        database.label
                    );
                    continue;
                }
            };
            let every = match channels.iter().all(|channel| channel.notified) {
                true => SAFETY_LOOK,
                false => LOOK_EVERY,
            };
            wake.watched[database.server] = true;
            log::info!(
                "database {}: {} of {} tables woken by their notify trigger, the others polled",
                database.label,
                channels.iter().filter(|channel| channel.notified).count(),
                channels.len()
            );
            for ((lane, table), channel) in database.lanes.iter().zip(channels) {
                let value = (*lane, table.to_string());
                wake.lanes.insert((database.server, channel.name), value);
            }
            let watcher = Watcher {
                client,
                server: database.server,
                lanes: database.lanes,
                every,
                max_attempts,
            };
            let (tell, done) = (tell.clone(), wake.done.clone());
            thread::spawn(move || watcher.watch(&tell, &done));
            wake.sessions += 1;
        }
        wake
    }

    /// The sessions the listeners hold, out of --max-connections.
    pub(crate) fn sessions(&self) -> usize {
        self.sessions
    }

    /// Whether a watcher serves `server`: the follow need not look at it.
    pub(crate) fn watches(&self, server: usize) -> bool {
        self.watched[server]
    }

    /// Waits until `until` or the first word of a watcher; the lanes to
    /// serve by then (a lane once, however many commits announced it).
    pub(crate) fn wait(&mut self, until: Instant) -> Vec<usize> {
        let mut lanes = Vec::new();
        // Disconnected cannot be: the Wake keeps a sender of its own.
        let mut next = self
            .heard
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .ok();
        while let Some(heard) = next {
            match heard {
                Heard::Channel(server, channel) => {
                    if let Some((lane, table)) = self.lanes.get(&(server, channel)) {
                        log::trace!("woken by a commit in {table}");
                        if !lanes.contains(lane) {
                            lanes.push(*lane);
                        }
                    }
                }
                Heard::Due(due) => {
                    for lane in due {
                        if !lanes.contains(&lane) {
                            lanes.push(lane);
                        }
                    }
                }
                Heard::Lost(server) => {
                    log::info!(
                        "database {}: the session watching it was lost: looked at \
                         between batches from now on",
                        self.labels[server]
                    );
                    self.watched[server] = false;
                }
            }
            next = self.heard.try_recv().ok();
        }
        lanes
    }
}

impl Drop for Wake {
    /// The threads return within SLICE, their sessions closed with them;
    /// the run does not wait for that: none holds anything but its socket.
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// A database's watcher, on a thread of its own.
struct Watcher {
    client: Client,
    server: usize,
    /// The lanes of its tables, with the table of each.
    lanes: Vec<(usize, TableName)>,
    /// How often it looks for due events.
    every: Duration,
    max_attempts: i32,
}

impl Watcher {
    /// Tells `tell` the channel of each notification on its session, and
    /// every `every` which lanes have due events, until the follow ends or
    /// the session is lost.
    fn watch(mut self, tell: &Sender<Heard>, done: &AtomicBool) {
        let tables: Vec<TableName> = self.lanes.iter().map(|(_, t)| t.clone()).collect();
        let mut looked_at = Instant::now();
        while !done.load(Ordering::Relaxed) {
            let look_at = looked_at + self.every;
            let limit = look_at.saturating_duration_since(Instant::now()).min(SLICE);
            let heard = self
                .client
                .notifications()
                .timeout_iter(limit)
                .next()
                .map(|notification| notification.map(|n| n.channel().to_string()));
            let told = match heard {
                Ok(Some(channel)) => tell.send(Heard::Channel(self.server, channel)),
                // The driver also ends the wait early, with nothing, when
                // the server has gone.
                Ok(None) if !self.client.is_closed() => Ok(()),
                Ok(None) | Err(_) => {
                    let _ = tell.send(Heard::Lost(self.server));
                    return;
                }
            };
            if told.is_err() {
                return;
            }
            if Instant::now() >= look_at {
                looked_at = Instant::now();
                let due = plan::due_tables(&mut self.client, &tables, self.max_attempts);
                if self.client.is_closed() {
                    let _ = tell.send(Heard::Lost(self.server));
                    return;
                }
                let due: Vec<usize> = self
                    .lanes
                    .iter()
                    .zip(due)
                    .filter(|(_, due)| *due)
                    .map(|((lane, _), _)| *lane)
                    .collect();
                if !due.is_empty() && tell.send(Heard::Due(due)).is_err() {
                    return;
                }
            }
        }
    }
}
