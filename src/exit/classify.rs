//! Whose fault a server's refusal is: the tables that turn a PostgreSQL
//! SQLSTATE or an AMQP reply code into a cause, and so into an exit code.
//!
//! The rule behind both tables: a refusal that the same run would meet
//! again unchanged is the operator's to fix (exit 78); one that may pass on
//! its own (a server restarting, a network, a resource) is an outage
//! (exit 69); and only a refusal of one message's own content is that
//! event's failure, counted against it alone.

/// What a refusal says about the next run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The operator must change something first (exit 78).
    Config,
    /// A rerun may succeed as it is (exit 69).
    Outage,
    /// The broker refused one message for what it is (too large, no route):
    /// the event's own failure.
    Message,
    /// The server takes no writes: a hot standby (or a session made
    /// read-only). A run pointed at the primary succeeds, so it is an outage
    /// (exit 69), but its line must say standby and how to pick the primary.
    Standby,
}

/// SQLSTATE classes (two characters) and codes that a rerun cannot get
/// past. Everything else (connection exceptions, a server shutting down,
/// timeouts, serialization failures, I/O) is an outage.
const POSTGRES_CONFIG: [(&str, &str); 4] = [
    ("28", "invalid authorization: the login was refused"),
    (
        "42",
        "syntax error or access rule violation: a missing table, column or privilege",
    ),
    ("3D000", "invalid_catalog_name: no such database"),
    ("3F000", "invalid_schema_name: no such schema"),
];

/// SQLSTATEs that say the server is read-only (see Cause::Standby).
const POSTGRES_READ_ONLY: [(&str, &str); 1] = [(
    "25006",
    "read_only_sql_transaction: a hot standby, or default_transaction_read_only",
)];

/// SQLSTATEs refusing a login after which libpq tries the next host of the
/// list (fe-connect.c, PQconnectPoll); any other refusal of a server that
/// answered ends the connect there, a wrong password included.
const POSTGRES_NEXT_HOST: [(&str, &str); 1] = [(
    "57P03",
    "cannot_connect_now: starting up, shutting down, or a standby not yet accepting connections",
)];

/// What a PostgreSQL error code (SQLSTATE) means for the run.
pub(crate) fn postgres(sqlstate: &str) -> Cause {
    if listed(&POSTGRES_CONFIG, sqlstate) {
        Cause::Config
    } else if listed(&POSTGRES_READ_ONLY, sqlstate) {
        Cause::Standby
    } else {
        Cause::Outage
    }
}

/// Whether a server that refused our login with this SQLSTATE should be
/// passed over for the next host rather than end the connect.
pub(crate) fn postgres_tries_next_host(sqlstate: &str) -> bool {
    listed(&POSTGRES_NEXT_HOST, sqlstate)
}

/// Whether a table holds the code, or its two-character class.
fn listed(table: &[(&str, &str)], sqlstate: &str) -> bool {
    table
        .iter()
        .any(|(code, _)| sqlstate == *code || (code.len() == 2 && sqlstate.starts_with(code)))
}

/// AMQP 0-9-1 reply codes (the spec's constants), as a connection.close or
/// a channel.close carries them.
const AMQP: [(u16, &str, Cause); 17] = [
    (311, "content-too-large", Cause::Message),
    (312, "no-route", Cause::Message),
    (313, "no-consumers", Cause::Message),
    (320, "connection-forced", Cause::Outage),
    (402, "invalid-path", Cause::Config),
    (403, "access-refused", Cause::Config),
    (404, "not-found", Cause::Config),
    (405, "resource-locked", Cause::Outage),
    (406, "precondition-failed", Cause::Config),
    (501, "frame-error", Cause::Outage),
    (502, "syntax-error", Cause::Outage),
    (503, "command-invalid", Cause::Outage),
    (504, "channel-error", Cause::Outage),
    (505, "unexpected-frame", Cause::Outage),
    (506, "resource-error", Cause::Outage),
    (530, "not-allowed", Cause::Config),
    (541, "internal-error", Cause::Outage),
];

/// What an AMQP reply code means for the run. A code the spec does not
/// list (540 not-implemented among them) is taken for an outage: nothing
/// is blamed on an event for a refusal nobody understands.
pub(crate) fn amqp(reply_code: u16) -> Cause {
    AMQP.iter()
        .find(|(code, _, _)| *code == reply_code)
        .map_or(Cause::Outage, |(_, _, cause)| *cause)
}

/// What the reply code of a channel the broker closed over a publish means.
/// There, 406 precondition-failed refuses the message itself: RabbitMQ uses
/// it for a message larger than max_message_size, an invalid expiration, a
/// user_id that is not the login's. Anywhere else (a declare) it means
/// settings that do not match, the operator's to fix.
pub(crate) fn amqp_publish(reply_code: u16) -> Cause {
    match reply_code {
        406 => Cause::Message,
        _ => amqp(reply_code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_login_or_a_missing_object_is_configuration() {
        for code in [
            "28000", "28P01", "42P01", "42703", "42501", "3D000", "3F000",
        ] {
            assert_eq!(postgres(code), Cause::Config, "{code}");
        }
    }

    #[test]
    fn connection_and_server_trouble_is_an_outage() {
        // connection_failure, admin_shutdown, cannot_connect_now,
        // query_canceled (statement_timeout), serialization_failure,
        // too_many_connections.
        for code in ["08006", "57P01", "57P03", "57014", "40001", "53300"] {
            assert_eq!(postgres(code), Cause::Outage, "{code}");
        }
    }

    #[test]
    fn a_read_only_transaction_means_a_standby() {
        assert_eq!(postgres("25006"), Cause::Standby);
        assert_eq!(postgres("25001"), Cause::Outage);
    }

    #[test]
    fn only_a_server_not_ready_yet_passes_the_login_to_the_next_host() {
        assert!(postgres_tries_next_host("57P03"));
        for code in ["28P01", "28000", "3D000", "53300", "57P01"] {
            assert!(!postgres_tries_next_host(code), "{code}");
        }
    }

    #[test]
    fn a_class_matches_only_codes_that_start_with_it() {
        assert_eq!(postgres("4200X"), Cause::Config);
        assert_eq!(postgres("24000"), Cause::Outage);
        assert_eq!(postgres("3D001"), Cause::Outage);
    }

    #[test]
    fn only_content_and_routing_refusals_are_the_messages_fault() {
        let message: Vec<u16> = AMQP
            .iter()
            .filter(|(_, _, cause)| *cause == Cause::Message)
            .map(|(code, _, _)| *code)
            .collect();
        assert_eq!(message, [311, 312, 313]);
    }

    #[test]
    fn permission_and_missing_things_on_the_broker_are_configuration() {
        for code in [402, 403, 404, 406, 530] {
            assert_eq!(amqp(code), Cause::Config, "{code}");
        }
    }

    #[test]
    fn a_publish_refused_as_too_large_is_the_messages_fault_but_a_refused_write_is_not() {
        assert_eq!(amqp_publish(406), Cause::Message);
        assert_eq!(amqp_publish(311), Cause::Message);
        for code in [403, 404, 530] {
            assert_eq!(amqp_publish(code), Cause::Config, "{code}");
        }
        assert_eq!(amqp_publish(320), Cause::Outage);
    }

    #[test]
    fn a_forced_close_an_internal_error_or_an_unknown_code_is_an_outage() {
        for code in [320, 541, 506, 540, 999] {
            assert_eq!(amqp(code), Cause::Outage, "{code}");
        }
    }
}
