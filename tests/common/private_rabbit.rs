//! RabbitMQ nodes of the test's own, never the shared one: each has its
//! own node name, AMQP and distribution ports, data, logs, pid file,
//! configuration and Erlang cookie (HOME) in a scratch directory, no
//! plugins (so no management listener), and listens on loopback only.
//! Every rabbitmqctl call names the node (`-n`). On Drop the node's whole
//! process group is killed and the directory removed.
//!
//! - [`RabbitNode`]: one node, which a test can put under a memory alarm so
//!   that it blocks publishers (connection.blocked).
//! - [`RabbitCluster`]: nodes joined into one cluster (join_cluster), for
//!   failover; a test kills one with [`RabbitNode::kill`].
//!
//! Starting a node takes about 10-20 s on this machine (Erlang boot), so a
//! cluster belongs in its own README command, not in plain `cargo test`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::scratch::{Scratch, free_port};

const SBIN: &str = "/usr/lib/rabbitmq/bin";
/// How long a node may take to accept AMQP connections.
const BOOT_LIMIT: Duration = Duration::from_secs(120);

pub struct RabbitNode {
    name: String,
    port: u16,
    dir: PathBuf,
    /// The Erlang cookie lives in HOME; the nodes of a cluster share one.
    home: PathBuf,
    child: Option<Child>,
    /// Owned here only when the node is alone; a cluster owns its own.
    _scratch: Option<Scratch>,
}

impl RabbitNode {
    /// Starts a node and waits until it accepts AMQP connections.
    pub fn start() -> RabbitNode {
        let scratch = Scratch::new("rabbit");
        write_cookie(scratch.path());
        let mut node = RabbitNode::spawn(scratch.path(), scratch.path(), 0);
        node._scratch = Some(scratch);
        node.wait_until_up();
        node
    }

    /// Launches a node in `dir`, without waiting for it.
    fn spawn(dir: &Path, home: &Path, index: usize) -> RabbitNode {
        let dir = dir.join(format!("node{index}"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let name = format!("outbox-poll-{}-{port}@localhost", std::process::id());
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.join("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{port}\nlog.console = false\n\
                 log.file.level = warning\n"
            ),
        )
        .unwrap();
        let mut node = RabbitNode {
            name,
            port,
            dir,
            home: home.to_path_buf(),
            child: None,
            _scratch: None,
        };
        let mut command = node.command(Path::new(SBIN).join("rabbitmq-server"));
        let log = std::fs::File::create(node.dir.join("server.out")).unwrap();
        command
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", node.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", node.dir.join("log"))
            .env("RABBITMQ_PID_FILE", node.dir.join("pid"))
            .env("RABBITMQ_CONFIG_FILE", node.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                node.dir.join("enabled_plugins"),
            )
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                node.dir.join("advanced.config"),
            )
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // A group of its own, so Drop can kill the VM and its helpers.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        node.child = Some(command.spawn().expect("starting rabbitmq-server"));
        node
    }

    /// A command with this node's environment: its own env file (not
    /// /etc/rabbitmq's), name and cookie.
    fn command(&self, program: PathBuf) -> Command {
        let mut command = Command::new(program);
        command
            .env("HOME", &self.home)
            .env("RABBITMQ_CONF_ENV_FILE", self.dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("ERL_EPMD_ADDRESS", "127.0.0.1");
        command
    }

    fn wait_until_up(&mut self) {
        let deadline = Instant::now() + BOOT_LIMIT;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().unwrap())
            {
                panic!(
                    "RabbitMQ node {} exited ({status}) while starting: see {}",
                    self.name,
                    self.dir.join("server.out").display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} did not start",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// amqp://guest:guest@127.0.0.1:PORT/%2f
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Runs `rabbitmqctl -n NODE args...`; panics if it fails.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let output = self
            .command(Path::new(SBIN).join("rabbitmqctl"))
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .expect("running rabbitmqctl");
        assert!(
            output.status.success(),
            "rabbitmqctl -n {} {args:?} failed: {}{}",
            self.name,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Sets the memory high watermark below what the node uses: it raises
    /// a memory alarm and blocks every publishing connection, telling each
    /// with connection.blocked.
    pub fn raise_memory_alarm(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    }

    /// Back to RabbitMQ's default watermark: the alarm clears and blocked
    /// connections are told connection.unblocked.
    pub fn clear_memory_alarm(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    }

    /// The node's resource alarms, as rabbitmqctl prints them.
    pub fn alarms(&self) -> String {
        let output = self.ctl(&["eval", "rabbit_alarm:get_alarms()."]);
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Kills the node at once (SIGKILL to its process group), like a
    /// crashed machine: clients see their connections drop.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            // The signal is delivered to the VM asynchronously; the node is
            // gone once its listener is.
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Nodes joined into one cluster: the first starts alone, each other one
/// joins it (stop_app, join_cluster, start_app). Sharing one HOME gives
/// them one Erlang cookie.
pub struct RabbitCluster {
    nodes: Vec<RabbitNode>,
    _scratch: Scratch,
}

impl RabbitCluster {
    pub fn start(size: usize) -> RabbitCluster {
        let scratch = Scratch::new("rabbit-cluster");
        write_cookie(scratch.path());
        let mut nodes: Vec<RabbitNode> = (0..size)
            .map(|index| RabbitNode::spawn(scratch.path(), scratch.path(), index))
            .collect();
        for node in &mut nodes {
            node.wait_until_up();
        }
        let first = nodes[0].name.clone();
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["join_cluster", &first]);
            node.ctl(&["start_app"]);
        }
        for node in &mut nodes[1..] {
            node.wait_until_up();
        }
        RabbitCluster {
            nodes,
            _scratch: scratch,
        }
    }

    pub fn nodes(&self) -> &[RabbitNode] {
        &self.nodes
    }

    pub fn node_mut(&mut self, index: usize) -> &mut RabbitNode {
        &mut self.nodes[index]
    }

    /// Every node's URL, in order, separated by commas (the form
    /// `--amqp-url` takes for a cluster).
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(RabbitNode::url).collect();
        urls.join(",")
    }
}

/// An Erlang cookie in `home`, written before any node starts: nodes
/// started together would otherwise race to create different ones.
fn write_cookie(home: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let cookie = home.join(".erlang.cookie");
    let value = format!("OUTBOXPOLL{}X{}", std::process::id(), free_port());
    std::fs::write(&cookie, value).unwrap();
    std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400)).unwrap();
}
