//! Callers, checked in ONE place before any handler runs: a tower layer that
//! authenticates every call (bearer token or client certificate), checks the
//! scope its method needs ([`policy`]), admits it against the client's call
//! quota, and hands the handler the [`Caller`] in the request's extensions.
//!
//! - No or unknown credentials: UNAUTHENTICATED. A missing scope:
//!   PERMISSION_DENIED naming it. Over the call quota: RESOURCE_EXHAUSTED
//!   with a `google.rpc.RetryInfo` delay.
//! - Health is open; reflection follows `api.reflection`.
//! - While `auth.enabled` is false every call runs as the client `local`,
//!   with every scope and no limits.
//! - Refusals of lifecycle and admin methods, and calls that only `admin`
//!   lets in, are written to the audit log.

pub mod policy;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use notify_cache::quota::Quotas;
use notify_core::audit::{self, Entry, Target};
use notify_domain::auth::{Caller, Registry, Scope};
use notify_domain::settings::ReflectionMode;
use notify_proto::v1;
use prost::Message as _;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use self::policy::{Requirement, Rule};
use crate::call_end::{CallEnd, ObservedBody, OnCallEnd};
use crate::tls::TlsPeer;

/// What the layer needs, shared by every connection.
pub struct Guard {
    registry: Registry,
    quotas: Quotas,
    reflection: ReflectionMode,
    max_request_bytes: usize,
    ctx: notify_core::Context,
}

impl Guard {
    /// Builds the guard from the context's settings.
    pub fn new(ctx: notify_core::Context) -> Arc<Self> {
        let settings = &ctx.settings;
        Arc::new(Self {
            registry: Registry::new(&settings.auth),
            quotas: Quotas::new(ctx.cache.clone()),
            reflection: settings.api.reflection,
            max_request_bytes: settings.api.max_request_bytes,
            ctx: ctx.clone(),
        })
    }

    /// The limiter, for the handlers' recipient and announcement quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Finds the caller of a request from its credentials.
    fn authenticate<B>(&self, request: &http::Request<B>) -> Result<Caller, Status> {
        let token = bearer_token(request)?;
        let peer = request.extensions().get::<TlsPeer>();
        let by_cert = peer.and_then(|peer| {
            self.registry.by_cert_names(peer.cert_names.iter().map(String::as_str))
        });
        match (token, by_cert) {
            (Some(token), by_cert) => {
                let client = self
                    .registry
                    .by_token(token)
                    .ok_or_else(|| unauthenticated("the bearer token is not valid"))?;
                match by_cert {
                    Some(cert) if cert.name() != client.name() => Err(unauthenticated(
                        "the bearer token and the client certificate belong to different clients",
                    )),
                    _ => Ok(client),
                }
            }
            (None, Some(client)) => Ok(client),
            (None, None) => match peer.filter(|peer| !peer.cert_names.is_empty()) {
                Some(peer) => Err(unauthenticated(&format!(
                    "the client certificate ({}) belongs to no client",
                    peer.cert_names.join(", ")
                ))),
                None => Err(unauthenticated(
                    "no credentials: send \"authorization: Bearer <token>\" or a client certificate",
                )),
            },
        }
    }

    /// Decides a call; returns the caller and the request (whose body may
    /// have been read to find the audience), or the refusal.
    async fn admit(
        self: Arc<Self>,
        request: http::Request<Body>,
    ) -> Result<(Option<Caller>, Rule, http::Request<Body>), (Status, Option<Audited>)> {
        let path = request.uri().path().to_owned();
        let Some(rule) = policy::rule_for(&path) else {
            return Err((
                Status::permission_denied(format!("no scope is defined for {path}")),
                None,
            ));
        };
        if !self.registry.enabled() {
            return Ok((Some(self.registry.local()), rule, request));
        }
        // Reflection that is open is served to anyone; reflection that is off
        // is not served at all (UNIMPLEMENTED, whoever asks).
        let reflection_unguarded = self.reflection != ReflectionMode::Authenticated;
        match rule.requirement {
            Requirement::Open => return Ok((None, rule, request)),
            Requirement::Reflection if reflection_unguarded => return Ok((None, rule, request)),
            _ => {}
        }
        let caller = self.authenticate(&request).map_err(|status| {
            count_refusal("unauthenticated");
            (status, None)
        })?;
        let (scope, request) = match rule.requirement {
            Requirement::Scope(scope) => (Some(scope), request),
            Requirement::SendByAudience => self.send_scope(&caller, request).await?,
            Requirement::Open | Requirement::Reflection => (None, request),
        };
        if let Some(scope) = scope
            && !caller.allows(scope)
        {
            count_refusal("permission_denied");
            let status = Status::permission_denied(format!(
                "client {} lacks the scope {scope} that {path} needs",
                caller.name()
            ));
            let audited = rule.audited_by_handler || scope == Scope::Admin;
            let record = audited.then(|| Audited {
                caller: caller.clone(),
                action: "call.denied",
                detail: format!("{path}: missing scope {scope}"),
            });
            return Err((status, record));
        }
        if let Err(e) = self.quotas.admit_call(&caller).await {
            count_refusal("quota");
            return Err((crate::status::to_status(e), None));
        }
        caller.count_call();
        Ok((Some(caller), rule, request))
    }

    /// `SendMessage` needs `send`, or `send.all_users` for an announcement:
    /// a caller with both or neither is decided without reading the body.
    async fn send_scope(
        &self,
        caller: &Caller,
        request: http::Request<Body>,
    ) -> Result<(Option<Scope>, http::Request<Body>), (Status, Option<Audited>)> {
        match (caller.allows(Scope::Send), caller.allows(Scope::SendAllUsers)) {
            (true, true) => return Ok((None, request)),
            (false, false) => return Ok((Some(Scope::Send), request)),
            _ => {}
        }
        let (parts, body) = request.into_parts();
        let limit = self.max_request_bytes + 5;
        let bytes = Limited::new(body, limit)
            .collect()
            .await
            .map_err(|_| (Status::resource_exhausted("the request is too large"), None))?
            .to_bytes();
        let scope = if announces(&bytes).map_err(|status| (status, None))? {
            Scope::SendAllUsers
        } else {
            Scope::Send
        };
        Ok((Some(scope), http::Request::from_parts(parts, Body::new(Full::new(bytes)))))
    }

    fn record(&self, audited: Audited, outcome: &'static str) {
        // A call's end may be seen while its body is dropped, outside the
        // runtime at shutdown: then there is no one left to write it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let ctx = self.ctx.clone();
        runtime.spawn(async move {
            let entry = Entry {
                client: audited.caller.name(),
                action: audited.action,
                target: Target::None,
                outcome,
                detail: audited.detail,
            };
            audit::record(&ctx, entry).await;
        });
    }
}

/// An audit record the layer writes for a call.
struct Audited {
    caller: Caller,
    action: &'static str,
    detail: String,
}

/// Records an admin's use of a call it could make only as admin once the
/// call has ended, with how it ended.
struct AdminUse {
    guard: Arc<Guard>,
    audited: Audited,
}

impl OnCallEnd for AdminUse {
    fn ended(self, end: CallEnd) {
        let outcome = match end.code() {
            tonic::Code::Ok => "ok",
            tonic::Code::Cancelled => "cancelled",
            _ => "failed",
        };
        self.guard.record(self.audited, outcome);
    }
}

/// Reads `SendMessage`'s gRPC frame far enough to tell whether its audience
/// is all users (field 5); other fields are skipped, not decoded.
fn announces(frame: &Bytes) -> Result<bool, Status> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct AudienceProbe {
        #[prost(message, optional, tag = "5")]
        all_users: Option<v1::AllUsersAudience>,
    }
    let Some(header) = frame.get(..5) else {
        return Ok(false);
    };
    if header[0] != 0 {
        return Err(Status::unimplemented("compressed requests are not supported"));
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let message = frame.get(5..5 + length).unwrap_or(&frame[5..]);
    let probe = AudienceProbe::decode(message)
        .map_err(|e| Status::invalid_argument(format!("malformed request: {e}")))?;
    Ok(probe.all_users.is_some())
}

fn bearer_token<B>(request: &http::Request<B>) -> Result<Option<&[u8]>, Status> {
    const SCHEME: &[u8] = b"bearer ";
    let Some(value) = request.headers().get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    // Compared as bytes: a token is ASCII, and a wrong one fails the lookup.
    let value = value.as_bytes();
    match value.split_at_checked(SCHEME.len()) {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case(SCHEME) => {
            let token = token.trim_ascii();
            if token.is_empty() {
                return Err(unauthenticated("the authorization header has an empty token"));
            }
            Ok(Some(token))
        }
        _ => Err(unauthenticated("the authorization header must be \"Bearer <token>\"")),
    }
}

fn unauthenticated(message: &str) -> Status {
    Status::unauthenticated(message)
}

fn count_refusal(reason: &'static str) {
    metrics::counter!("notify_auth_refusals_total", "reason" => reason).increment(1);
}

/// Puts [`AuthService`] around every service.
#[derive(Clone)]
pub struct AuthLayer {
    guard: Arc<Guard>,
}

impl AuthLayer {
    /// Creates the layer.
    pub fn new(guard: Arc<Guard>) -> Self {
        Self { guard }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, guard: self.guard.clone() }
    }
}

/// Authenticates, authorizes and admits each call, then calls `inner`.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S> Service<http::Request<Body>> for AuthService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The ready clone serves this call; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let guard = self.guard.clone();
        Box::pin(async move {
            let (caller, rule, mut request) = match guard.clone().admit(request).await {
                Ok(admitted) => admitted,
                Err((status, audited)) => {
                    if let Some(audited) = audited {
                        guard.record(audited, "permission_denied");
                    }
                    return Ok(status.into_http());
                }
            };
            let admin_use = caller.as_ref().filter(|caller| {
                let Requirement::Scope(scope) = rule.requirement else { return false };
                guard.registry.enabled()
                    && !rule.audited_by_handler
                    && caller.allowed_only_by_admin(scope)
            });
            let audited = admin_use.map(|caller| Audited {
                caller: caller.clone(),
                action: "admin.use",
                detail: request.uri().path().to_owned(),
            });
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
            let response = inner.call(request).await?;
            Ok(match audited {
                // Recorded where the call ends: in the trailers for a
                // stream, however long it runs.
                Some(audited) => {
                    ObservedBody::wrap(response, AdminUse { guard, audited }).map(Body::new)
                }
                None => response,
            })
        })
    }
}

/// Returns the caller the layer admitted, for a handler.
pub fn caller<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))
}
