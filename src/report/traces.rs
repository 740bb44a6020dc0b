//! OpenTelemetry traces of a run, exported over OTLP/HTTP (protobuf or
//! JSON) when an endpoint is set: a span for the run, one per batch, and one
//! per event handed to the broker, following the messaging semantic
//! conventions and linked to the producer's `traceparent`.
//!
//! Nothing here is built without `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the relay holds an
//! `Option<Traces>`, and a run without one pays a branch per batch, never
//! per event. The SDK's batch span processor exports from a thread of its
//! own, so a slow or dead collector never holds a batch up; at the end the
//! run waits for the last spans at most `FLUSH_BOUND`. An export that fails
//! is told once on stderr, and the run goes on: traces are never worth
//! failing a relay for.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Link, Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt,
    TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::{Context, Key, KeyValue, StringValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter};

use crate::broker::headers::TRACEPARENT;
use crate::broker::publisher::Outcome;
use crate::config::{Database, Relay};
use crate::exit::Exit;
use crate::plan;
use crate::report::totals::Totals;
use crate::report::{otlp_client, stderr};
use crate::sql::outbox::Event;
use crate::sql::table::TableName;

/// The longest a run waits at its end for the collector to take the last
/// spans; `OTEL_EXPORTER_OTLP_TIMEOUT` shortens it. An unreachable
/// collector delays the exit by this much at most, and never fails it.
pub(crate) const FLUSH_BOUND: Duration = Duration::from_secs(2);

const SERVICE_NAME: &str = "outbox-poll";

/// A run's tracing: the provider (its exporter and batch processor), and
/// the run's span, the parent of every batch's.
pub(crate) struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    run: Context,
    warning: Arc<Warning>,
    bound: Duration,
    /// Whether an event without a traceparent gets the publish span's
    /// (OTEL_PROPAGATORS names tracecontext, as it does unset).
    inject: bool,
    exchange: StringValue,
    /// The publish spans' name for the run's exchange, made once: a span per
    /// event must not cost an allocation it can do without.
    publish_name: &'static str,
}

/// Where a batch happened, as its span says: the outbox's database (its
/// label: hosts and name, never a password) and table. Made once per
/// outbox, not per batch.
pub(crate) struct Place {
    database: StringValue,
    table: StringValue,
}

impl Place {
    pub(crate) fn new(database: &str, table: &TableName) -> Place {
        Place {
            database: StringValue::from(Arc::<str>::from(database)),
            table: StringValue::from(Arc::<str>::from(table.to_string())),
        }
    }

    /// The outbox of a run over one table.
    pub(crate) fn of(database: &Database) -> Place {
        Place::new(&plan::label(&database.conninfo), &database.table)
    }
}

/// A batch's span and the spans of the events it handed to the broker, in
/// the order of the batch's events.
pub(crate) struct BatchTrace {
    batch: Context,
    publishes: Vec<Span>,
    began: Instant,
}

impl Traces {
    /// The run's tracing, from the standard `OTEL_*` variables; None, with
    /// nothing built, unless an OTLP endpoint is set. A configuration the
    /// exporter refuses (an endpoint that is no URL) is told on stderr and
    /// the run goes on without traces.
    pub(crate) fn from_env(relay: &Relay) -> Option<Traces> {
        let Some(endpoint) = endpoint() else {
            log::debug!(
                "traces: no OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT, \
                 OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): no exporter built"
            );
            return None;
        };
        let protocol = protocol();
        let warning = Arc::new(Warning {
            told: AtomicBool::new(false),
            endpoint: endpoint.clone(),
        });
        let exporter = otlp_client::for_endpoint(&endpoint, export_timeout()).and_then(|client| {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client.clone())
                .with_endpoint(endpoint.as_str())
                .with_protocol(protocol)
                .build()?;
            Ok((exporter, client))
        });
        let (exporter, client) = match exporter {
            Ok(built) => built,
            Err(error) => {
                warning.tell(&format!("cannot export traces: {error:#}"));
                return None;
            }
        };
        log::debug!("traces: exporting to {endpoint} over {protocol:?}");
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Told {
                inner: exporter,
                client,
                warning: warning.clone(),
            })
            .with_resource(resource())
            .build();
        let tracer = provider.tracer(SERVICE_NAME);
        let run = SpanBuilder::from_name("outbox-poll run")
            .with_kind(SpanKind::Internal)
            .with_attributes(options(relay))
            .start_with_context(&tracer, &Context::new());
        Some(Traces {
            provider,
            tracer,
            run: Context::new().with_span(run),
            warning,
            bound: bound(),
            inject: injects(),
            exchange: StringValue::from(Arc::<str>::from(relay.broker.exchange.as_str())),
            // One string per run, which lives as long as the process.
            publish_name: Box::leak(format!("publish {}", relay.broker.exchange).into_boxed_str()),
        })
    }

    /// Starts the spans of a batch of the outbox at `place` whose
    /// transaction began at `began`, about to hand `events` to the broker:
    /// a publish span for each,
    /// linked to the producer's traceparent where the event's headers carry
    /// one. An event without one gets the publish span's context as its
    /// `traceparent` header, so the consumer's spans follow the relay's.
    pub(crate) fn publishing(
        &self,
        place: &Place,
        began: (SystemTime, Instant),
        events: &mut [Event],
    ) -> BatchTrace {
        let batch = SpanBuilder::from_name("outbox-poll batch")
            .with_kind(SpanKind::Internal)
            .with_start_time(began.0)
            .with_attributes([
                KeyValue::new("db.system.name", "postgresql"),
                KeyValue::new("db.collection.name", place.table.clone()),
                KeyValue::new("outbox_poll.database", place.database.clone()),
                KeyValue::new("outbox_poll.table", place.table.clone()),
            ])
            .start_with_context(&self.tracer, &self.run);
        let batch = self.run.with_span(batch);
        let now = SystemTime::now();
        let epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let publishes = events
            .iter_mut()
            .map(|event| {
                let producer = event.headers.as_deref().and_then(producer_traceparent);
                let links = match &producer {
                    Some(Some(context)) => vec![Link::with_context(context.clone())],
                    _ => Vec::new(),
                };
                let name: Cow<'static, str> = match &event.exchange {
                    Some(exchange) => Cow::Owned(format!("publish {exchange}")),
                    None => Cow::Borrowed(self.publish_name),
                };
                let span = SpanBuilder::from_name(name)
                    .with_kind(SpanKind::Producer)
                    .with_start_time(now)
                    .with_links(links)
                    .with_attributes(self.publish_attributes(event, epoch))
                    .start_with_context(&self.tracer, &batch);
                // A traceparent the producer wrote, valid or not, is theirs
                // and passes through unchanged.
                if producer.is_none() && self.inject {
                    event.traceparent = Some(traceparent(span.span_context()));
                }
                span
            })
            .collect();
        BatchTrace {
            batch,
            publishes,
            began: began.1,
        }
    }

    /// Ends a batch's spans once its transaction committed (or failed):
    /// each publish span with what the broker said of its event, the
    /// batch's with its figures.
    pub(crate) fn settled(
        &self,
        trace: BatchTrace,
        events: &[Event],
        outcome: &Outcome,
        expired: usize,
        committed: bool,
    ) {
        let confirmed: HashSet<i64> = outcome.confirmed.iter().copied().collect();
        let failed: HashMap<i64, &str> = outcome
            .failed
            .iter()
            .map(|(id, reason)| (*id, reason.as_str()))
            .collect();
        let declined: HashSet<i64> = outcome.declined.iter().copied().collect();
        for (event, mut span) in events.iter().zip(trace.publishes) {
            let status = if confirmed.contains(&event.id) {
                Status::Ok
            } else if let Some(reason) = failed.get(&event.id) {
                Status::error(reason.to_string())
            } else if declined.contains(&event.id) {
                Status::error("nacked by the broker")
            } else {
                Status::error("not confirmed by the broker")
            };
            span.set_status(status);
            span.end();
        }
        let batch = trace.batch.span();
        let failed = outcome.failed.len() + outcome.declined.len();
        batch.set_attributes([
            KeyValue::new("outbox_poll.batch.claimed", (events.len() + expired) as i64),
            KeyValue::new(
                "outbox_poll.batch.published",
                outcome.confirmed.len() as i64,
            ),
            KeyValue::new("outbox_poll.batch.failed", failed as i64),
            KeyValue::new("outbox_poll.batch.expired", expired as i64),
            KeyValue::new(
                "outbox_poll.transaction.duration_ms",
                trace.began.elapsed().as_secs_f64() * 1000.0,
            ),
        ]);
        match (committed, &outcome.outage) {
            (false, _) => batch.set_status(Status::error("the transaction did not commit")),
            (true, Some(outage)) => batch.set_status(Status::error(format!("{outage:#}"))),
            (true, None) => {}
        }
        batch.end();
    }

    /// Ends the run's span with its exit code and totals, and waits for the
    /// collector to take every span, at most the bound.
    pub(crate) fn finish(self, exit: Exit, totals: &Totals, started: Instant) {
        let run = self.run.span();
        let code = exit.code();
        run.set_attributes([
            KeyValue::new("outbox_poll.exit_code", i64::from(code)),
            KeyValue::new("outbox_poll.claimed", totals.claimed as i64),
            KeyValue::new("outbox_poll.published", totals.published as i64),
            KeyValue::new("outbox_poll.failed", totals.failed as i64),
            KeyValue::new("outbox_poll.expired", totals.expired as i64),
            KeyValue::new("outbox_poll.batches", totals.batches as i64),
            KeyValue::new(
                "outbox_poll.duration_ms",
                started.elapsed().as_secs_f64() * 1000.0,
            ),
        ]);
        if code != 0 {
            run.set_status(Status::error(format!("exit code {code}")));
        }
        run.end();
        let flushing = Instant::now();
        if self.provider.shutdown_with_timeout(self.bound).is_err() {
            let waited = humantime::format_duration(round_ms(flushing.elapsed()));
            self.warning.tell(&format!(
                "the collector did not take the last spans within {waited}; they are lost"
            ));
        }
    }

    /// The exchange an event is published to: its own, or the run's.
    fn destination(&self, event: &Event) -> StringValue {
        match &event.exchange {
            Some(exchange) => StringValue::from(exchange.clone()),
            None => self.exchange.clone(),
        }
    }

    /// The messaging semantic conventions' attributes of a publish, and the
    /// event's wait since created_at, in milliseconds.
    fn publish_attributes(&self, event: &Event, now: Duration) -> Vec<KeyValue> {
        let routing_key = event.routing_key.as_deref().unwrap_or(&event.event_type);
        let mut attributes = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.operation.type", "publish"),
            KeyValue::new("messaging.destination.name", self.destination(event)),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                routing_key.to_string(),
            ),
            KeyValue::new("messaging.message.id", event.event_id.clone()),
        ];
        if let Some(created) = event.created_at.filter(|seconds| seconds.is_finite()) {
            let wait = (now.as_secs_f64() - created) * 1000.0;
            attributes.push(KeyValue::new("outbox_poll.wait_ms", wait.max(0.0) as i64));
        }
        attributes
    }
}

/// Where spans go: the traces endpoint as given, or the general endpoint
/// with the signal's path (the OTLP/HTTP convention). An empty variable
/// counts as unset.
fn endpoint() -> Option<String> {
    if let Some(traces) = variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(traces);
    }
    let base = variable("OTEL_EXPORTER_OTLP_ENDPOINT")?;
    Some(format!("{}/v1/traces", base.trim_end_matches('/')))
}

/// http/protobuf unless http/json is asked for. gRPC is not built in: a
/// request for it is told once and protobuf over HTTP is used.
fn protocol() -> Protocol {
    let asked = variable("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| variable("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match asked.as_deref() {
        None | Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => {
            stderr::line(&format!(
                "outbox-poll: warning: OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported \
                 (http/protobuf or http/json): exporting traces over http/protobuf"
            ));
            Protocol::HttpBinary
        }
    }
}

/// Whether to write the publish span's context into an event that has no
/// traceparent: yes unless OTEL_PROPAGATORS leaves out `tracecontext`
/// (`none` turns it off: a header costs the broker about a seventh more
/// CPU per message, bench/README.md). W3C trace context is the one
/// propagator built in; another one named is told once and not used.
fn injects() -> bool {
    let Some(propagators) = variable("OTEL_PROPAGATORS") else {
        return true;
    };
    let names: Vec<&str> = propagators.split(',').map(str::trim).collect();
    let others: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !["tracecontext", "baggage", "none", ""].contains(name))
        .collect();
    if !others.is_empty() {
        stderr::line(&format!(
            "outbox-poll: warning: OTEL_PROPAGATORS names {} that outbox-poll does not \
             write: only tracecontext (the W3C traceparent) is built in",
            others.join(", ")
        ));
    }
    names.contains(&"tracecontext")
}

/// The flush bound, shorter when the export timeout is.
fn bound() -> Duration {
    export_timeout().map_or(FLUSH_BOUND, |timeout| timeout.min(FLUSH_BOUND))
}

/// The timeout of one export request, if set (`OTEL_EXPORTER_OTLP_TIMEOUT`,
/// in milliseconds).
fn export_timeout() -> Option<Duration> {
    variable("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| variable("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|text| text.parse().ok())
        .map(Duration::from_millis)
}

/// The SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), named
/// outbox-poll unless those name the service.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    match named {
        true => detected,
        false => Resource::builder().with_service_name(SERVICE_NAME).build(),
    }
}

/// The run's options, as the run span's attributes.
fn options(relay: &Relay) -> Vec<KeyValue> {
    let mut options = vec![
        KeyValue::new("outbox_poll.batch_size", relay.batch_size),
        KeyValue::new("outbox_poll.drain", relay.drain),
        KeyValue::new("outbox_poll.follow", relay.follow),
        KeyValue::new("outbox_poll.ordered", relay.ordered),
        KeyValue::new("outbox_poll.ordered_by_key", relay.ordered_by_key),
        KeyValue::new("outbox_poll.dry_run", relay.dry_run),
        KeyValue::new("outbox_poll.in_flight", relay.in_flight as i64),
        KeyValue::new("outbox_poll.exchange", relay.broker.exchange.clone()),
        KeyValue::new(
            "outbox_poll.on_publish",
            format!("{:?}", relay.on_publish).to_lowercase(),
        ),
    ];
    if let Some(max) = relay.max_batches {
        options.push(KeyValue::new("outbox_poll.max_batches", max as i64));
    }
    if let Some(max) = relay.max_duration {
        options.push(KeyValue::new(
            "outbox_poll.max_duration_ms",
            max.as_millis() as i64,
        ));
    }
    options
}

/// The headers column's `traceparent`: None when it has none, Some(None)
/// when it has one that is not a W3C traceparent
/// (version-traceid-spanid-flags), else the producer's span context.
fn producer_traceparent(headers: &str) -> Option<Option<SpanContext>> {
    // Most rows carry no trace context: they are not parsed a second time.
    if !headers.contains(TRACEPARENT) {
        return None;
    }
    let members: serde_json::Map<String, serde_json::Value> = serde_json::from_str(headers).ok()?;
    let value = members.get(TRACEPARENT)?;
    Some(value.as_str().and_then(parse_traceparent))
}

fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// A span context as a W3C traceparent.
fn traceparent(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

fn variable(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn round_ms(duration: Duration) -> Duration {
    Duration::from_millis(duration.as_millis() as u64)
}

/// One warning line on stderr for the whole run, whatever fails how often:
/// under cron every line is mailed.
#[derive(Debug)]
struct Warning {
    told: AtomicBool,
    endpoint: String,
}

impl Warning {
    fn tell(&self, what: &str) {
        if !self.told.swap(true, Ordering::Relaxed) {
            stderr::line(&format!(
                "outbox-poll: warning: traces to {}: {what}; the relay goes on without them",
                self.endpoint
            ));
        }
    }
}

/// The OTLP exporter, its first failure told (see `Warning`) with the
/// cause its client saw.
#[derive(Debug)]
struct Told {
    inner: opentelemetry_otlp::SpanExporter,
    client: otlp_client::Remembering,
    warning: Arc<Warning>,
}

impl SpanExporter for Told {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let exported = self.inner.export(batch).await;
        if let Err(error) = &exported {
            match self.client.cause() {
                Some(cause) => self
                    .warning
                    .tell(&format!("exporting failed: {error} ({cause})")),
                None => self.warning.tell(&format!("exporting failed: {error}")),
            }
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_w3c_traceparent_is_read_and_written_back_the_same() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(text).unwrap();
        assert!(context.is_remote());
        assert_eq!(traceparent(&context), text);
    }

    #[test]
    fn a_traceparent_that_is_not_w3c_is_no_context() {
        for text in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(text).is_none(), "{text:?}");
        }
    }

    #[test]
    fn the_producers_traceparent_is_found_in_the_headers_column() {
        let headers =
            r#"{"a": 1, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
        assert!(producer_traceparent(headers).unwrap().is_some());
        assert_eq!(producer_traceparent(r#"{"a": "traceparent"}"#), None);
        assert_eq!(producer_traceparent(r#"{"traceparent": 7}"#), Some(None));
    }
}
