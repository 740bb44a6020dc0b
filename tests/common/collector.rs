//! A fake OTLP/HTTP collector: a small HTTP/1.1 server on 127.0.0.1 that
//! takes `POST /v1/traces` (protobuf or JSON, keep-alive as exporters use
//! it), decodes each request with opentelemetry-proto, and keeps the spans
//! for the tests to look at. Also the two collectors that are not there: a
//! port that accepts and never answers, and a closed port.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message;

/// A span as it arrived, its ids in hex and its attributes as text.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    /// OTLP's SpanKind: 1 internal, 4 producer.
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: HashMap<String, String>,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// The resource's service.name.
    pub service: String,
}

impl Span {
    pub fn attribute(&self, name: &str) -> &str {
        self.attributes
            .get(name)
            .unwrap_or_else(|| panic!("span {:?} has no {name}: {:?}", self.name, self.attributes))
    }

    /// The span's context as a W3C traceparent (sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub content_type: String,
    pub headers: HashMap<String, String>,
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    requests: Vec<Request>,
}

pub struct Collector {
    pub port: u16,
    received: Arc<Mutex<Received>>,
}

impl Collector {
    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Received::default()));
        let shared = received.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                thread::spawn(move || serve(stream, &shared));
            }
        });
        Collector { port, received }
    }

    /// The base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.received.lock().unwrap().spans.clone()
    }

    pub fn requests(&self) -> Vec<Request> {
        self.received.lock().unwrap().requests.clone()
    }

    /// The spans named `name`.
    pub fn named(&self, name: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|span| span.name == name)
            .collect()
    }

    /// The publish span of the event `event_id`.
    pub fn publish_of(&self, event_id: &str) -> Span {
        let spans = self.spans();
        spans
            .iter()
            .find(|span| {
                span.attributes
                    .get("messaging.message.id")
                    .map(String::as_str)
                    == Some(event_id)
            })
            .unwrap_or_else(|| panic!("no publish span for {event_id} among {spans:#?}"))
            .clone()
    }
}

/// Serves one connection's requests until the client closes it.
fn serve(stream: TcpStream, received: &Mutex<Received>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string();
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|value| value.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let content_type = headers.get("content-type").cloned().unwrap_or_default();
        let arrived = match content_type.as_str() {
            "application/json" => spans_of_json(
                &serde_json::from_slice(&body)
                    .unwrap_or_else(|error| panic!("bad OTLP JSON: {error}")),
            ),
            _ => spans(
                ExportTraceServiceRequest::decode(body.as_slice())
                    .unwrap_or_else(|error| panic!("bad OTLP protobuf: {error}")),
            ),
        };
        let answer: &[u8] = match content_type.as_str() {
            "application/json" => b"{}",
            _ => b"",
        };
        {
            let mut received = received.lock().unwrap();
            received.spans.extend(arrived);
            received.requests.push(Request {
                path,
                content_type: content_type.clone(),
                headers,
            });
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(answer).is_err() {
            return;
        }
    }
}

fn spans(request: ExportTraceServiceRequest) -> Vec<Span> {
    let mut all = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                all.push(Span {
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                        .collect(),
                    status: span.status.map_or(0, |status| status.code),
                    service: service.clone(),
                });
            }
        }
    }
    all
}

/// OTLP/JSON read as the specification writes it (lowerCamelCase names,
/// ids in hex, 64-bit integers as strings), on its own rather than through
/// opentelemetry-proto's serde: the tests' serde_json has
/// arbitrary_precision, which that serde cannot read doubles with.
fn spans_of_json(request: &serde_json::Value) -> Vec<Span> {
    let list = |value: &serde_json::Value, name: &str| -> Vec<serde_json::Value> {
        value[name].as_array().cloned().unwrap_or_default()
    };
    let string = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
    let json_attributes = |value: &serde_json::Value| -> HashMap<String, String> {
        list(value, "attributes")
            .iter()
            .map(|kv| {
                let value = &kv["value"];
                let text = ["stringValue", "intValue", "boolValue", "doubleValue"]
                    .iter()
                    .find_map(|kind| value.get(kind))
                    .map(|value| match value {
                        serde_json::Value::String(text) => text.clone(),
                        other => other.to_string(),
                    })
                    .unwrap_or_else(|| value.to_string());
                (string(&kv["key"]), text)
            })
            .collect()
    };
    let mut all = Vec::new();
    for resource_spans in list(request, "resourceSpans") {
        let service = json_attributes(&resource_spans["resource"])
            .get("service.name")
            .cloned()
            .unwrap_or_default();
        for scope in list(&resource_spans, "scopeSpans") {
            for span in list(&scope, "spans") {
                all.push(Span {
                    name: string(&span["name"]),
                    kind: span["kind"].as_i64().unwrap_or_default() as i32,
                    trace_id: string(&span["traceId"]),
                    span_id: string(&span["spanId"]),
                    parent_span_id: string(&span["parentSpanId"]),
                    attributes: json_attributes(&span),
                    links: list(&span, "links")
                        .iter()
                        .map(|link| (string(&link["traceId"]), string(&link["spanId"])))
                        .collect(),
                    status: span["status"]["code"].as_i64().unwrap_or_default() as i32,
                    service: service.clone(),
                });
            }
        }
    }
    all
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::BoolValue(flag)) => flag.to_string(),
        Some(Value::IntValue(number)) => number.to_string(),
        Some(Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A collector that accepts connections and never answers: the exporter
/// waits for its own timeout.
pub struct Silent {
    pub port: u16,
}

impl Silent {
    pub fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                held.push(stream);
            }
        });
        Silent { port }
    }
}

/// A port nothing listens on: bound, then released.
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    thread::sleep(Duration::from_millis(10));
    port
}
