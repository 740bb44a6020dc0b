//! A PostgreSQL of the test's own, for what the shared server cannot show:
//! a primary and a hot standby streaming from it (pg_basebackup with
//! standby.signal), each on a free loopback port, in a scratch directory.
//! Both are stopped (immediate mode) and removed on Drop. Making the pair
//! takes about 1.5 s here.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the
//! commands run as the `postgres` account (runuser), in a directory it
//! owns. The binaries are PG_BINDIR's, else the newest version under
//! /usr/lib/postgresql (Debian's and Ubuntu's layout).
//!
//! A cheaper stand-in, when only a read-only session matters: connect to
//! the shared server with `options=-c default_transaction_read_only=on`.
//! `SHOW transaction_read_only` then says on and a claim's FOR UPDATE fails
//! with SQLSTATE 25006, as on a standby; only pg_is_in_recovery() still
//! says false.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::certs::TestCa;
use super::scratch::{Scratch, free_port};

pub struct PrivatePostgres {
    dir: Scratch,
    primary_port: u16,
    standby_port: u16,
}

impl PrivatePostgres {
    /// Starts a primary (trust authentication, user postgres, database
    /// postgres) and a hot standby of it; returns once both accept
    /// connections.
    pub fn primary_and_standby() -> PrivatePostgres {
        let dir = Scratch::new("pg");
        let cluster = PrivatePostgres {
            dir,
            primary_port: free_port(),
            standby_port: free_port(),
        };
        give_to_postgres(cluster.dir.path());
        let primary = cluster.data("primary");
        cluster.initdb(&primary);
        cluster.configure(&primary, cluster.primary_port);
        std::fs::OpenOptions::new()
            .append(true)
            .open(Path::new(&primary).join("pg_hba.conf"))
            .and_then(|mut hba| {
                use std::io::Write;
                hba.write_all(b"host replication all 127.0.0.1/32 trust\n")
            })
            .unwrap();
        cluster.pg_ctl("primary", "start");
        let standby = cluster.data("standby");
        cluster.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.primary_port.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby,
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "-c",
                "fast",
            ],
        );
        cluster.configure(&standby, cluster.standby_port);
        cluster.pg_ctl("standby", "start");
        cluster
    }

    /// Starts one server that takes TCP connections over TLS only, with the
    /// certificate `ca` issued for its names, and trusts its Unix socket
    /// (in the scratch directory): what a test of sslmode needs, whatever
    /// the shared server's certificate and pg_hba.conf say.
    pub fn tls_only(ca: &TestCa) -> PrivatePostgres {
        let dir = Scratch::new("pg");
        let server = PrivatePostgres {
            dir,
            primary_port: free_port(),
            standby_port: 0,
        };
        give_to_postgres(server.dir.path());
        let primary = server.data("primary");
        server.initdb(&primary);
        server.configure(&primary, server.primary_port);
        for (from, to) in [
            (ca.server_cert(), "server.crt"),
            (ca.server_key(), "server.key"),
        ] {
            let copy = Path::new(&primary).join(to);
            std::fs::copy(from, &copy).unwrap();
            give_to_postgres(&copy);
        }
        let conf = Path::new(&primary).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).unwrap();
        std::fs::write(
            Path::new(&primary).join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        server.pg_ctl("primary", "start");
        server
    }

    /// The directory of its Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn primary_port(&self) -> u16 {
        self.primary_port
    }

    pub fn standby_port(&self) -> u16 {
        self.standby_port
    }

    /// A URL for one of the two ports (database postgres, no password).
    pub fn url(&self, port: u16) -> String {
        format!("postgresql://postgres@127.0.0.1:{port}/postgres")
    }

    /// Stops the primary at once, as a crash would (the standby stays).
    pub fn stop_primary(&self) {
        self.pg_ctl("primary", "stop");
    }

    /// Promotes the standby to a primary, as failover does.
    pub fn promote_standby(&self) {
        self.pg_ctl("standby", "promote");
    }

    fn data(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// A new data directory: trust authentication, user postgres, UTF-8.
    fn initdb(&self, data: &str) {
        self.run(
            "initdb",
            &[
                "-D",
                data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        );
    }

    /// Listens on loopback only, keeps the socket in the scratch directory
    /// (not the shared server's), and skips fsync: nothing here must
    /// survive a crash of the machine.
    fn configure(&self, data: &str, port: u16) {
        let settings = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nhot_standby = on\nlogging_collector = off\n",
            self.dir.path().display()
        );
        let conf = Path::new(data).join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(&settings);
        std::fs::write(&conf, text).unwrap();
    }

    fn pg_ctl(&self, name: &str, action: &str) {
        let data = self.data(name);
        let log = self
            .dir
            .path()
            .join(format!("{name}.log"))
            .display()
            .to_string();
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-m", "immediate", "-w", action],
        );
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let output = as_postgres(&bindir().join(program), args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|error| panic!("running {program}: {error}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        for name in ["standby", "primary"] {
            let data = self.data(name);
            if Path::new(&data).join("postmaster.pid").exists() {
                let _ = as_postgres(
                    &bindir().join("pg_ctl"),
                    &["-D", &data, "-m", "immediate", "-w", "stop"],
                )
                .output();
            }
        }
    }
}

/// Where initdb and pg_ctl are: PG_BINDIR if set, else the newest
/// version's directory in Debian's and Ubuntu's layout.
fn bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .expect("no /usr/lib/postgresql: install PostgreSQL's server package, or set PG_BINDIR");
    versions
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .map(|version| PathBuf::from(format!("/usr/lib/postgresql/{version}/bin")))
        .expect("no PostgreSQL version under /usr/lib/postgresql: set PG_BINDIR")
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// The command, run as the postgres account when we are root.
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

/// Hands a file or directory to the postgres account when we are root.
fn give_to_postgres(dir: &Path) {
    if !running_as_root() {
        return;
    }
    let id = |flag: &str| -> u32 {
        let output = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("no postgres account")
    };
    std::os::unix::fs::chown(dir, Some(id("-u")), Some(id("-g"))).unwrap();
}
