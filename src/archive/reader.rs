//! Reading an archive back: plain, gzip (every member, as zcat reads a
//! file of many) or zstd (every frame), one line at a time, each with its
//! number for messages.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use anyhow::{Result, anyhow};

use crate::archive::Compression;
use crate::exit;

/// The lines of an archive.
pub struct Reader {
    input: Box<dyn BufRead>,
    /// The file's path as given, for messages.
    name: String,
    /// The number of the last line read, from 1.
    number: usize,
    line: String,
}

impl Reader {
    /// Opens `path`; a file that cannot be read is the operator's to fix
    /// (exit 78).
    pub fn open(path: &Path) -> Result<Reader> {
        let name = path.display().to_string();
        let file = File::open(path)
            .map_err(|error| exit::config(anyhow!("cannot read the archive {name}: {error}")))?;
        let mut file = BufReader::new(file);
        // An empty file holds no rows, whatever its extension says.
        let empty = file
            .fill_buf()
            .map_err(|error| exit::config(anyhow!("cannot read the archive {name}: {error}")))?
            .is_empty();
        let input: Box<dyn BufRead> = match Compression::of(path) {
            _ if empty => Box::new(file),
            Compression::Plain => Box::new(file),
            Compression::Gzip => {
                Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
            }
            Compression::Zstd => {
                let decoder = zstd::stream::read::Decoder::with_buffer(file).map_err(|error| {
                    exit::config(anyhow!("cannot read the archive {name}: {error}"))
                })?;
                Box::new(BufReader::new(decoder))
            }
        };
        Ok(Reader {
            input,
            name,
            number: 0,
            line: String::new(),
        })
    }

    /// `FILE:LINE`, the place of the line last read, for messages.
    pub(crate) fn place(&self) -> String {
        format!("{}:{}", self.name, self.number)
    }

    /// The number of the line last read.
    pub(crate) fn number(&self) -> usize {
        self.number
    }

    /// The next line without its newline, None at the end. A file that
    /// does not decompress, or a line that is not UTF-8, is named with
    /// its line (exit 78).
    pub fn next_line(&mut self) -> Result<Option<&str>> {
        self.line.clear();
        let read = self.input.read_line(&mut self.line);
        self.number += 1;
        match read {
            Ok(0) => Ok(None),
            Ok(_) => {
                let line = self.line.strip_suffix('\n').unwrap_or(&self.line);
                Ok(Some(line.strip_suffix('\r').unwrap_or(line)))
            }
            Err(error) => {
                let what = match error.kind() {
                    io::ErrorKind::InvalidData => format!("{error} (not UTF-8 text, or corrupt)"),
                    io::ErrorKind::UnexpectedEof => {
                        format!("{error} (the file is cut short: copied while written?)")
                    }
                    _ => error.to_string(),
                };
                Err(exit::config(anyhow!(
                    "cannot read the archive at {}: {what}",
                    self.place()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::writer::Writer;

    fn round_trip(name: &str) -> Vec<String> {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join(name);
        let mut writer = Writer::create(&path).unwrap();
        for batch in [&["{\"a\": 1}", "{\"b\": 2}"][..], &["{\"c\": 3}"][..]] {
            let mut member = writer.member().unwrap();
            for line in batch {
                member.line(line).unwrap();
            }
            member.commit().unwrap();
        }
        writer.finish().unwrap();
        let mut reader = Reader::open(&path).unwrap();
        let mut lines = Vec::new();
        while let Some(line) = reader.next_line().unwrap() {
            lines.push(line.to_string());
        }
        lines
    }

    #[test]
    fn every_member_of_every_compression_reads_back_in_order() {
        for name in ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst"] {
            assert_eq!(
                round_trip(name),
                ["{\"a\": 1}", "{\"b\": 2}", "{\"c\": 3}"],
                "{name}"
            );
        }
    }

    #[test]
    fn an_archive_without_rows_is_still_a_valid_compressed_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("empty.gz");
        Writer::create(&path).unwrap().finish().unwrap();
        let mut decoded = Vec::new();
        let file = File::open(&path).unwrap();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut decoded).unwrap();
        assert!(decoded.is_empty());
        let mut reader = Reader::open(&path).unwrap();
        assert!(reader.next_line().unwrap().is_none());
    }

    #[test]
    fn an_existing_file_is_never_overwritten() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("a.jsonl");
        std::fs::write(&path, "kept\n").unwrap();
        let error = Writer::create(&path).err().unwrap();
        assert_eq!(crate::exit::Exit::of(&error), crate::exit::Exit::Config);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept\n");
    }
}
