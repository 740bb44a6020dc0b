//! Writing an archive: created never over an existing file, each batch a
//! member of its own (a gzip member, a zstd frame, or plain lines),
//! flushed and fsync'ed before the caller deletes the batch's rows.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Stdout, Write};
use std::os::fd::AsFd;
use std::path::Path;

use anyhow::{Result, anyhow};

use crate::archive::Compression;
use crate::exit;

/// zstd's default level: about gzip's ratio at several times its speed.
const ZSTD_LEVEL: i32 = 3;

/// An archive open for appending batches.
pub struct Writer {
    sink: Sink,
    compression: Compression,
    /// The file's path as given, or `stdout`, for messages.
    name: String,
    /// Members written and synced so far.
    members: u64,
    /// The file's length after the last synced member.
    synced: u64,
}

/// Where the bytes go.
enum Sink {
    File(File),
    Stdout(Stdout),
}

impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Sink::File(file) => file.write(bytes),
            Sink::Stdout(stdout) => stdout.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::File(file) => file.flush(),
            Sink::Stdout(stdout) => stdout.flush(),
        }
    }
}

impl Sink {
    /// Makes what was written durable: fsync of the file; stdout is synced
    /// when it is a file (`> archive.jsonl`), and a pipe or terminal,
    /// which cannot be, is left to whoever reads it.
    fn sync(&mut self) -> io::Result<()> {
        match self {
            Sink::File(file) => file.sync_all(),
            Sink::Stdout(stdout) => {
                stdout.flush()?;
                let file = File::from(stdout.as_fd().try_clone_to_owned()?);
                match file.sync_all() {
                    Err(error)
                        if matches!(
                            error.kind(),
                            io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported
                        ) =>
                    {
                        Ok(())
                    }
                    result => result,
                }
            }
        }
    }
}

impl Writer {
    /// Creates the archive at `path` (`-`: stdout), refusing an existing
    /// file, and syncs its directory so that the new name itself survives
    /// a crash. Every failure is the operator's to fix (exit 78): a file
    /// already there, a directory missing or read-only, a full disk.
    pub(crate) fn create(path: &Path) -> Result<Writer> {
        if path == Path::new("-") {
            return Ok(Writer {
                sink: Sink::Stdout(io::stdout()),
                compression: Compression::Plain,
                name: "stdout".into(),
                members: 0,
                synced: 0,
            });
        }
        let name = path.display().to_string();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|error| {
                let advice = match error.kind() {
                    io::ErrorKind::AlreadyExists => {
                        "an archive is never overwritten: name a new file (e.g. with the date)"
                    }
                    _ => "check the directory exists and this user may write to it",
                };
                exit::config(anyhow!(
                    "cannot create the archive {name}: {error}; {advice}; nothing was deleted"
                ))
            })?;
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(directory)
            .and_then(|directory| directory.sync_all())
            .map_err(|error| {
                exit::config(anyhow!(
                    "cannot sync the directory of the archive {name}: {error}; nothing was deleted"
                ))
            })?;
        Ok(Writer {
            sink: Sink::File(file),
            compression: Compression::of(path),
            name,
            members: 0,
            synced: 0,
        })
    }

    /// Cuts off what a failed member left after the last synced one (a
    /// line cut short by a full disk, say), so the archive stays readable
    /// to its end: those rows were not deleted. Best effort: the run is
    /// failing already, for the reason it reports.
    pub(crate) fn discard_unsynced(&mut self) {
        if let Sink::File(file) = &mut self.sink {
            let _ = file.set_len(self.synced).and_then(|()| file.sync_all());
        }
    }

    /// Whether the archive goes to stdout (then the command's own report
    /// goes to stderr, out of the archive's way).
    pub(crate) fn is_stdout(&self) -> bool {
        matches!(self.sink, Sink::Stdout(_))
    }

    /// A new member for one batch's rows (after what a failed one left,
    /// cut off: see `discard_unsynced`).
    pub(crate) fn member(&mut self) -> Result<Member<'_>> {
        self.discard_unsynced();
        let name = &self.name;
        let buffered = BufWriter::new(&mut self.sink);
        let encoder = match self.compression {
            Compression::Plain => Encoder::Plain(buffered),
            Compression::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                buffered,
                flate2::Compression::default(),
            )),
            Compression::Zstd => Encoder::Zstd(
                zstd::stream::write::Encoder::new(buffered, ZSTD_LEVEL)
                    .map_err(|error| unwritable(name, &error))?,
            ),
        };
        Ok(Member {
            encoder,
            name,
            members: &mut self.members,
            synced: &mut self.synced,
            rows: 0,
        })
    }

    /// Ends the archive. One that received no row still gets an empty
    /// member, so that a compressed archive is always a valid file for
    /// zcat and zstdcat.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.discard_unsynced();
        if self.members == 0 && self.compression != Compression::Plain {
            self.member()?.commit()?;
        }
        Ok(())
    }
}

/// One batch's rows, compressed as they come.
pub(crate) struct Member<'a> {
    encoder: Encoder<'a>,
    name: &'a str,
    members: &'a mut u64,
    synced: &'a mut u64,
    rows: u64,
}

enum Encoder<'a> {
    Plain(BufWriter<&'a mut Sink>),
    Gzip(flate2::write::GzEncoder<BufWriter<&'a mut Sink>>),
    Zstd(zstd::stream::write::Encoder<'static, BufWriter<&'a mut Sink>>),
}

impl Member<'_> {
    /// Appends one row: `json` is one JSON object on one line (jsonb's
    /// text never holds a raw newline: strings escape it).
    pub(crate) fn line(&mut self, json: &str) -> Result<()> {
        let written = match &mut self.encoder {
            Encoder::Plain(out) => out.write_all(json.as_bytes()).and(out.write_all(b"\n")),
            Encoder::Gzip(out) => out.write_all(json.as_bytes()).and(out.write_all(b"\n")),
            Encoder::Zstd(out) => out.write_all(json.as_bytes()).and(out.write_all(b"\n")),
        };
        written.map_err(|error| unwritable(self.name, &error))?;
        self.rows += 1;
        Ok(())
    }

    /// Ends the member, flushes it and syncs the file: when this returns
    /// Ok, the member's rows are on disk and may be deleted. Returns how
    /// many rows it holds.
    pub(crate) fn commit(self) -> Result<u64> {
        let name = self.name;
        let fail = |error: io::Error| unwritable(name, &error);
        let buffered = match self.encoder {
            Encoder::Plain(out) => out,
            Encoder::Gzip(out) => out.finish().map_err(fail)?,
            Encoder::Zstd(out) => out.finish().map_err(fail)?,
        };
        let sink = buffered
            .into_inner()
            .map_err(|error| fail(error.into_error()))?;
        sink.flush().and_then(|()| sink.sync()).map_err(fail)?;
        if let Sink::File(file) = sink {
            *self.synced = file.metadata().map_err(fail)?.len();
        }
        *self.members += 1;
        Ok(self.rows)
    }
}

/// A write or a sync failed (a full disk, an I/O error, a closed pipe):
/// the batch's rows are not deleted.
fn unwritable(name: &str, error: &io::Error) -> anyhow::Error {
    exit::config(anyhow!(
        "cannot write the archive {name}: {error}; the rows of this batch were not deleted \
         (free space, or archive elsewhere, and prune again)"
    ))
}
