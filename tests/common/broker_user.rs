//! A RabbitMQ user of a test's own, for the refusals a user without some
//! permission meets.

use std::process::{Command, Stdio};

use crate::common::amqp_addr;

/// A RabbitMQ user of the test's own, made and removed with rabbitmqctl
/// (the shared broker's own users are never touched).
pub struct BrokerUser {
    name: String,
}

impl BrokerUser {
    /// A user that may configure and read everything in vhost `/` and
    /// write nothing.
    pub fn without_write(test: &str) -> BrokerUser {
        let name = format!("outbox_poll_test_{}_{test}", std::process::id());
        let user = BrokerUser { name };
        user.ctl(&["add_user", &user.name, "secret"]);
        user.ctl(&["set_permissions", "-p", "/", &user.name, ".*", "^$", ".*"]);
        user
    }

    pub fn url(&self) -> String {
        let port = amqp_addr().port();
        format!("amqp://{}:secret@127.0.0.1:{port}/%2f", self.name)
    }

    fn ctl(&self, args: &[&str]) {
        let output = Command::new("rabbitmqctl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running rabbitmqctl (the test makes a RabbitMQ user of its own)");
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["delete_user", &self.name])
            .stdin(Stdio::null())
            .output();
    }
}
