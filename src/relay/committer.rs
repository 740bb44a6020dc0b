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

pub(super) struct Committer {
    work: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// The thread, or None when the system will not make one: the drain
    /// then commits on its own thread, as a single batch does.
    pub(super) fn start() -> Option<Committer> {
        let (work, jobs) = mpsc::channel::<Job>();
        let (finished, done) = mpsc::channel::<Done>();
        let thread = thread::Builder::new().name("commit".into()).spawn(move || {
            for (mut session, marks) in jobs {
                let committed = batch::commit(&mut session, &marks);
                if finished.send((session, marks, committed)).is_err() {
                    return;
                }
            }
        });
        match thread {
            Ok(thread) => Some(Committer {
                work: Some(work),
                done,
                thread: Some(thread),
            }),
            Err(error) => {
                log::debug!("committing on the drain's own thread: {error}");
                None
            }
        }
    }

    /// Hands a batch's session and marks to the thread. One batch at a
    /// time: `wait` for it before the next.
    pub(super) fn commit(&self, session: Session, marks: Marks) {
        let work = self
            .work
            .as_ref()
            .expect("the sender lives as long as the committer");
        // The thread ends only when `work` is dropped, or by a panic,
        // which `wait` passes on.
        let _ = work.send((session, marks));
    }

    /// The batch handed over last, its commit over: its session back, its
    /// marks and the commit's result.
    pub(super) fn wait(&mut self) -> Done {
        match self.done.recv() {
            Ok(done) => done,
            // The thread is gone with the session: it panicked, and the
            // panic is the run's (one line on stderr, report::panic).
            Err(_) => match self.thread.take().map(JoinHandle::join) {
                Some(Err(panic)) => std::panic::resume_unwind(panic),
                _ => unreachable!("the commit thread ended with a batch in hand"),
            },
        }
    }
}

impl Drop for Committer {
    /// Ends the thread: it finishes the batch it has (the drain has always
    /// waited for it by then) and leaves its loop.
    fn drop(&mut self) {
        drop(self.work.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
