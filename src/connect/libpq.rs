//! How the environment is read for libpq's variables (PGHOST, PGPORT,
//! ...; see `conninfo` for what each means).

/// A way to read the environment, so tests can pass their own.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, with empty variables treated as unset (the
/// rule of docs/src/command-line.md for every variable; libpq itself would take
/// `PGSSLMODE=` as an invalid empty value).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}
