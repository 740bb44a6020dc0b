//! A thread that marks and commits a drain's batches, one at a time, each
//! on its own session, while the drain claims, sends and awaits the next.
//!
//! Why: a batch's marks and COMMIT are PostgreSQL's work and a WAL flush
//! (an fsync of a few milliseconds with `synchronous_commit = on`). Done
//! on the drain's thread, they held up the next claim and send: at the
//! default batch of 100 they were more than half of a batch's time on
//! that thread, and the broker went short of messages (issue 28). Each
//! batch is still one transaction on one session from claim to commit,
//! with its locks held to its commit; only the thread that waits for the
//! commit changes.

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};

use crate::relay::batch::{self, Marks};
use crate::relay::session::{Session, Uncommitted};

/// A batch's session and marks, on their way to the thread and back with
/// the commit's result.
type Job = (Session, Marks);
type Done = (Session, Marks, Result<(), Uncommitted>);

/// The thread, started by the first batch handed over: a drain that finds
/// nothing makes none.
#[derive(Default)]
pub(super) struct Committer {
    thread: Option<Thread>,
    /// The result of a batch committed on the drain's own thread, when the
    /// system would not make one.
    here: Option<Done>,
    /// The system would not make the thread: the run does not ask again.
    refused: bool,
}

struct Thread {
    work: Sender<Job>,
    done: Receiver<Done>,
    handle: JoinHandle<()>,
}

impl Committer {
    /// Hands a batch's session and marks over. One batch at a time:
    /// `wait` for it before the next.
    pub(super) fn commit(&mut self, mut session: Session, marks: Marks) {
        if self.thread.is_none() && !self.refused {
            match start() {
                Ok(thread) => self.thread = Some(thread),
                Err(error) => {
                    self.refused = true;
                    log::debug!("committing on the drain's own thread: {error}");
                }
            }
        }
        match &self.thread {
            // The thread ends only when its sender is dropped, or by a
            // panic, which `wait` passes on.
            Some(thread) => {
                let _ = thread.work.send((session, marks));
            }
            None => {
                let committed = batch::commit(&mut session, &marks);
                self.here = Some((session, marks, committed));
            }
        }
    }

    /// The batch handed over last, its commit over: its session back, its
    /// marks and the commit's result.
    pub(super) fn wait(&mut self) -> Done {
        if let Some(done) = self.here.take() {
            return done;
        }
        let thread = self.thread.take().expect("a batch was handed over");
        match thread.done.recv() {
            Ok(done) => {
                self.thread = Some(thread);
                done
            }
            // The thread is gone with the session: it panicked, and the
            // panic is the run's (one line on stderr, report::panic).
            Err(_) => {
                drop(thread.work);
                match thread.handle.join() {
                    Err(panic) => std::panic::resume_unwind(panic),
                    Ok(()) => unreachable!("the commit thread ended with a batch in hand"),
                }
            }
        }
    }
}

/// The thread: it commits each batch it is handed, until the drain drops
/// its sender.
fn start() -> std::io::Result<Thread> {
    let (work, jobs) = mpsc::channel::<Job>();
    let (finished, done) = mpsc::channel::<Done>();
    let handle = thread::Builder::new()
        .name("commit".into())
        .spawn(move || {
            for (mut session, marks) in jobs {
                let committed = batch::commit(&mut session, &marks);
                if finished.send((session, marks, committed)).is_err() {
                    return;
                }
            }
        })?;
    Ok(Thread { work, done, handle })
}

impl Drop for Committer {
    /// Ends the thread: the drain has waited for its last batch by then,
    /// so it only leaves its loop.
    fn drop(&mut self) {
        if let Some(Thread { work, handle, .. }) = self.thread.take() {
            drop(work);
            let _ = handle.join();
        }
    }
}
