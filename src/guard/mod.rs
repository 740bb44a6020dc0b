//! What bounds a run: the watchdog, the last bound on every phase, and the
//! signals that stop it at the next safe point.

pub(crate) mod stop;
pub(crate) mod watchdog;
