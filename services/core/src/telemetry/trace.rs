//! OpenTelemetry traces: the OTLP exporter behind the `tracing` spans, and
//! W3C trace context carried across gRPC calls and AMQP chunk tasks.
//!
//! Off unless `trace.otlp_endpoint` is set. When off, the propagation helpers
//! return at once and the spans that exist only for traces (SQL, Redis) stay
//! below the log filter's level, so they cost nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use lapin::types::{AMQPValue, FieldTable};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{LevelFilter, Targets};

use notify_domain::settings::TraceSettings;

/// The W3C trace context headers (`traceparent`, `tracestate`).
const CONTEXT_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// True once this process exports spans.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// True when this process exports spans (so trace context is worth carrying).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The span exporter of a process; flushes what is buffered at shutdown.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Builds the OTLP/gRPC exporter and its tracer provider (inside the
    /// Tokio runtime: the exporter's channel lives on it). `None` when
    /// tracing is off.
    pub(super) fn build(
        settings: &TraceSettings,
        service: &'static str,
    ) -> Result<Option<Self>, opentelemetry_otlp::ExporterBuildError> {
        if !settings.enabled() {
            return Ok(None);
        }
        let exporter =
            SpanExporter::builder().with_tonic().with_endpoint(&settings.otlp_endpoint).build()?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(Resource::builder().with_service_name(service).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer that turns `tracing` spans into OpenTelemetry spans:
    /// Notify's own spans down to debug (SQL and Redis calls), other
    /// crates' from info.
    pub(super) fn layer<S>(&self, service: &'static str) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        use tracing_subscriber::Layer as _;
        let targets = Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("notify_store", LevelFilter::DEBUG)
            .with_target("notify_cache", LevelFilter::DEBUG)
            .with_target("notify_core", LevelFilter::DEBUG)
            .with_target("notify_api", LevelFilter::DEBUG)
            .with_target("notify_worker", LevelFilter::DEBUG);
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(service))
            .with_filter(targets)
    }

    /// Marks the process as exporting and installs the W3C propagator.
    pub(super) fn activate(&self) {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        EXPORTING.store(true, Ordering::Relaxed);
    }

    /// Exports what is still buffered and stops the exporter. Runs on a
    /// blocking thread: the flush waits on a channel served by the runtime.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = flushed {
            eprintln!("trace export did not flush: {e}");
        }
    }
}

/// Writes the current span's trace context into an AMQP message's headers.
pub fn inject_into_amqp(headers: &mut FieldTable) {
    if !exporting() {
        return;
    }
    let mut carrier = HashMap::new();
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MapCarrier(&mut carrier));
    });
    write_amqp_carrier(headers, carrier);
}

/// Makes the trace context in an AMQP message's headers (if any) the parent
/// of `span`.
pub fn follow_amqp(span: &tracing::Span, headers: Option<&FieldTable>) {
    if !exporting() {
        return;
    }
    if let Some(headers) = headers {
        follow(span, &read_amqp_carrier(headers));
    }
}

fn write_amqp_carrier(headers: &mut FieldTable, carrier: HashMap<String, String>) {
    for (key, value) in carrier {
        headers.insert(key.into(), AMQPValue::LongString(value.into()));
    }
}

fn read_amqp_carrier(headers: &FieldTable) -> HashMap<String, String> {
    CONTEXT_HEADERS
        .iter()
        .filter_map(|name| match headers.inner().get(*name) {
            Some(AMQPValue::LongString(value)) => {
                Some(((*name).to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            }
            _ => None,
        })
        .collect()
}

/// Makes the trace context of a request's headers (if any) the parent of
/// `span`.
pub fn follow_http(span: &tracing::Span, headers: &http::HeaderMap) {
    if !exporting() {
        return;
    }
    let carrier: HashMap<String, String> = CONTEXT_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect();
    follow(span, &carrier);
}

fn follow(span: &tracing::Span, carrier: &HashMap<String, String>) {
    if carrier.is_empty() {
        return;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&ReadCarrier(carrier))
    });
    // Fails only when the span is disabled; there is nothing to parent then.
    let _ = span.set_parent(parent);
}

struct MapCarrier<'a>(&'a mut HashMap<String, String>);

impl Injector for MapCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct ReadCarrier<'a>(&'a HashMap<String, String>);

impl Extractor for ReadCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;

    use super::*;

    #[test]
    fn trace_context_survives_amqp_headers() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = FieldTable::default();
        write_amqp_carrier(
            &mut headers,
            HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]),
        );
        let carrier = read_amqp_carrier(&headers);
        assert_eq!(carrier.get("traceparent").map(String::as_str), Some(traceparent));
        let context = TraceContextPropagator::new().extract(&ReadCarrier(&carrier));
        let span = context.span();
        let remote = span.span_context();
        assert_eq!(remote.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(remote.span_id().to_string(), "00f067aa0ba902b7");
        assert!(remote.is_sampled() && remote.is_remote());
    }
}
