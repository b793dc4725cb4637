//! HTTP API v1 (actix-web, JSON) on `listeners.http`.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/quorum` | 200 [`QuorumStatus`] |
//! | `POST /v1/append` `{"records": ["text", ...]}` | 200 `{"base_offset", "last_offset", "epoch"}` once committed |
//! | `GET /v1/log?from=OFFSET&max=N` | 200 [`LogPage`] of committed records (below the log start: from the newest snapshot) |
//! | any read of the log or the image `?consistency=linearizable` | as without, once this node has applied a read index from the leader (`NodeHandle::read_barrier`) |
//! | `POST /v1/snapshot` | 200 `{"end_offset", "epoch", "size_bytes", "created"}` once the snapshot is durable |
//! | `GET /healthz` | 200 `{"status": "ok", "node_id", "role", "leader_id", "leader_epoch"}` |
//! | `GET /metrics` | 200 Prometheus text (see [`metrics`]) |
//!
//! Every error is JSON with an `error` code (see [`ApiError`]): 400
//! `BAD_REQUEST` (malformed JSON, wrong shape, empty record list, bad query
//! parameters) and `REJECTED` (the node refused the batch); 413
//! `PAYLOAD_TOO_LARGE` (body over the batch cap); 503 `NOT_LEADER` (with
//! `leader_id`, null when unknown) and `UNAVAILABLE`; 500 `OUTCOME_UNKNOWN`
//! (leadership lost after the records were handed over: they may or may not
//! commit; never retried here); 404 `NOT_FOUND`; 405 `METHOD_NOT_ALLOWED`;
//! with a tokens file ([`auth`]), 401 `UNAUTHENTICATED` and 403
//! `CLUSTER_AUTHORIZATION_FAILED`.
//!
//! Handlers only decode, call the node, and encode: they are written against
//! the small `NodeApi` trait so they can be tested without a quorum.

pub mod auth;
mod client_listener;
mod error;
mod funnel;
mod local;
mod metadata;
pub mod metrics;

use std::future::Future;
use std::net::SocketAddr;
use std::num::IntErrorKind;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::error::JsonPayloadError;
use actix_web::guard::{Guard, GuardContext};
use actix_web::http::{header, Method};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer, ResponseError};
use serde::Deserialize;
use serde_json::json;

pub use auth::Tokens;
pub use client_listener::{ClientLimits, FRAME_SLACK_BYTES, MAX_IN_FLIGHT};
pub use error::ApiError;
use funnel::AppendFunnel;
pub use local::{LocalHttpServer, LocalServer};

use crate::messages::{Record, MAX_BATCH_BYTES};
use crate::node::{
    Answer, AppendError, Appended, ControllerError, LogPage, MetadataImage, MetricsSnapshot, NodeError, NodeHandle,
    Operation, QuorumStatus, RecordPage, SnapshotInfo,
};
use crate::raft::Offset;
use crate::types::AppendReply;

/// `GET /v1/log` returns this many records when `max` is not given.
pub const LOG_PAGE_DEFAULT: usize = 100;
/// `GET /v1/log` never returns more than this many records; a larger `max`
/// is capped, not refused.
pub const LOG_PAGE_MAX: usize = 10_000;
/// Longest a graceful stop waits for in-flight requests, in seconds.
const SHUTDOWN_TIMEOUT_S: u64 = 5;

/// Binds the HTTP API for `handle` on `addr` (port 0 picks a free port) with
/// the request body capped at the default batch cap
/// ([`MAX_BATCH_BYTES`], 8 MiB) and one worker thread. Returns the server,
/// which the caller spawns or awaits, and the bound address. The server does
/// not install signal handlers: stopping it is the caller's business
/// (`server.handle().stop(true)`).
pub fn http_server(handle: NodeHandle, addr: SocketAddr) -> std::io::Result<(actix_web::dev::Server, SocketAddr)> {
    http_server_with(handle, addr, MAX_BATCH_BYTES, 1, ApiSecurity::default())
}

/// What a listener of the API asks of its clients: a bearer token of
/// `tokens` ([`auth`]), and TLS with the node's certificate
/// ([`crate::tls::Tls::server`]). The default asks for neither.
#[derive(Clone, Debug, Default)]
pub struct ApiSecurity {
    pub tokens: Option<Arc<Tokens>>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// [`http_server`] with the request body capped at `max_body_bytes` (the
/// server binary passes `log.max_batch_bytes`) and `workers` threads
/// (`listeners.http_workers` when it is 1 or more; 0 is taken as 1 here:
/// the node's own thread is [`http_server_here`]). `security` may ask
/// for a bearer token (every request but `GET /healthz`) and TLS.
///
/// Fewer workers are faster: the API's own work per request is small, and
/// one thread hands all of its appends to the node together (one message,
/// one batch), where several split them and each adds thread wake-ups. On
/// the benchmark machine (2 cores, three nodes and the load generator) one
/// worker gave 16-43% more appends per second at 256 clients than two, and
/// a lower p99 at 1 and 8 clients; no worker at all
/// ([`http_server_here`] on the node's thread, the binary's default) gave
/// 8% more than one at 64 clients and 22% more at 256 (BENCHMARKS.md).
pub fn http_server_with(
    handle: NodeHandle,
    addr: SocketAddr,
    max_body_bytes: usize,
    workers: usize,
    security: ApiSecurity,
) -> std::io::Result<(actix_web::dev::Server, SocketAddr)> {
    serve(handle, addr, max_body_bytes, workers.max(1), security)
}

/// Binds the HTTP API for `handle` on `addr` and serves it on the current
/// thread, which must run an actix runtime: started on the node's own
/// thread, appends reach the node without crossing threads (see
/// [`LocalHttpServer`]). The body cap is `max_body_bytes`, as in
/// [`http_server_with`]; idle connections close after 5 s, as with
/// actix-web's server, and at most 25,600 connections are served at once
/// (fewer when the process may open fewer than twice as many files).
/// `security` as in [`http_server_with`]. Returns the running server and
/// the bound address.
pub fn http_server_here(
    handle: NodeHandle,
    addr: SocketAddr,
    max_body_bytes: usize,
    security: ApiSecurity,
) -> std::io::Result<(LocalHttpServer, SocketAddr)> {
    local::serve_here(
        handle,
        addr,
        max_body_bytes,
        local::KEEP_ALIVE,
        local::max_connections(),
        security,
    )
}

/// Binds the client listener (the client protocol,
/// [`crate::messages::client`]) for `handle` on `addr` and serves it on the
/// current thread, which must run an actix runtime (the node's own, in the
/// server binary). `limits` are usually
/// [`ClientLimits::for_batch_bytes`]`(log.max_batch_bytes)`. `security`
/// may ask for TLS, and for a token a connection authenticates with first
/// ([`auth`]). Returns the
/// running server and the bound address (port 0 picks a free port).
pub fn client_server_here(
    handle: NodeHandle,
    addr: SocketAddr,
    limits: ClientLimits,
    security: ApiSecurity,
) -> std::io::Result<(LocalServer, SocketAddr)> {
    client_listener::serve_here(handle, addr, limits, security)
}

/// What the handlers need from a node; [`NodeHandle`] in production, a fake
/// in the unit tests below.
pub(crate) trait NodeApi: Clone + 'static {
    fn append(&self, records: Vec<Vec<u8>>) -> impl Future<Output = Result<Appended, AppendError>>;
    /// Several appends handed over at once, in order; each outcome goes to
    /// its own reply when known. Must be called on an actix runtime.
    fn append_each(&self, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
        for (records, reply) in groups {
            let node = self.clone();
            actix_rt::spawn(async move {
                let _ = reply.send(node.append(records).await);
            });
        }
    }
    fn describe(&self) -> impl Future<Output = Result<QuorumStatus, NodeError>>;
    fn read_records(&self, from: Offset, max: usize) -> impl Future<Output = Result<RecordPage, NodeError>>;
    fn metrics(&self) -> impl Future<Output = Result<MetricsSnapshot, NodeError>>;
    fn create_snapshot(&self) -> impl Future<Output = Result<SnapshotInfo, NodeError>>;
    /// The newest metadata image; None unless the node keeps one.
    fn metadata_image(&self) -> Option<MetadataImage> {
        None
    }
    /// Waits until a linearizable read may be served (see
    /// [`NodeHandle::read_barrier`]).
    fn read_barrier(&self) -> impl Future<Output = Result<Offset, AppendError>> {
        std::future::ready(Err(AppendError::Unavailable(
            "this node serves no linearizable reads".to_string(),
        )))
    }
    /// A controller operation (see [`NodeHandle::operate`]).
    fn operate(&self, _operation: Operation) -> impl Future<Output = Result<Answer, ControllerError>> {
        std::future::ready(Err(ControllerError::NotController {
            leader_id: None,
            message: "this node keeps no metadata".to_string(),
        }))
    }
}

impl NodeApi for NodeHandle {
    fn append(&self, records: Vec<Vec<u8>>) -> impl Future<Output = Result<Appended, AppendError>> {
        NodeHandle::append(self, records)
    }
    fn append_each(&self, groups: Vec<(Vec<Vec<u8>>, AppendReply)>) {
        NodeHandle::append_each(self, groups)
    }
    fn describe(&self) -> impl Future<Output = Result<QuorumStatus, NodeError>> {
        NodeHandle::describe(self)
    }
    fn read_records(&self, from: Offset, max: usize) -> impl Future<Output = Result<RecordPage, NodeError>> {
        NodeHandle::read_records(self, from, max)
    }
    fn metrics(&self) -> impl Future<Output = Result<MetricsSnapshot, NodeError>> {
        NodeHandle::metrics(self)
    }
    fn create_snapshot(&self) -> impl Future<Output = Result<SnapshotInfo, NodeError>> {
        NodeHandle::create_snapshot(self)
    }
    fn metadata_image(&self) -> Option<MetadataImage> {
        NodeHandle::metadata_image(self)
    }
    fn operate(&self, operation: Operation) -> impl Future<Output = Result<Answer, ControllerError>> {
        NodeHandle::operate(self, operation)
    }
    fn read_barrier(&self) -> impl Future<Output = Result<Offset, AppendError>> {
        NodeHandle::read_barrier(self)
    }
}

/// The read parameter every GET of the log or the image takes.
#[derive(Debug, Deserialize)]
struct ReadParams {
    consistency: Option<String>,
}

/// `?consistency=`: `local` (the default) reads this node as it is, which
/// may trail the leader; `linearizable` first waits for a read index from
/// the leader ([`NodeHandle::read_barrier`]), so that the read sees every
/// write acknowledged before the request, by any node.
async fn consistent<N: NodeApi>(node: &N, req: &HttpRequest) -> Result<(), ApiError> {
    let params = web::Query::<ReadParams>::from_query(req.query_string())
        .map_err(|e| ApiError::bad_request(format!("query string: {e}")))?;
    match params.consistency.as_deref() {
        None | Some("local") => Ok(()),
        Some("linearizable") => node.read_barrier().await.map(drop).map_err(ApiError::from),
        Some(other) => Err(ApiError::bad_request(format!(
            "consistency: expected \"local\" or \"linearizable\", got {:?}",
            truncated(other)
        ))),
    }
}

fn serve<N: NodeApi + Send>(
    node: N,
    addr: SocketAddr,
    max_body_bytes: usize,
    workers: usize,
    security: ApiSecurity,
) -> std::io::Result<(actix_web::dev::Server, SocketAddr)> {
    let tokens = security.tokens;
    let server = HttpServer::new(move || {
        let node = node.clone();
        app(tokens.clone()).configure(move |cfg| routes(cfg, node, max_body_bytes))
    })
    .workers(workers)
    // Per worker; together no more than the API on the node's thread takes.
    .max_connections((local::max_connections() / workers).max(1))
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_TIMEOUT_S);
    let server = match security.tls {
        None => server.bind(addr)?,
        Some(tls) => server.bind_rustls_0_23(addr, (*tls).clone())?,
    };
    let bound = server.addrs().first().copied().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("{addr} resolved to no address"),
        )
    })?;
    Ok((server.run(), bound))
}

/// The application every route is configured on: with `tokens`, each
/// request passes [`auth::authorize`] first.
fn app(
    tokens: Option<Arc<Tokens>>,
) -> App<
    impl actix_service::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let mut app = App::new();
    if let Some(tokens) = tokens {
        app = app.app_data(web::Data::new(tokens));
    }
    app.wrap(actix_web::middleware::from_fn(auth::authorize))
}

/// Every route, the extractor configuration that keeps their errors JSON,
/// and JSON 404/405 answers.
fn routes<N: NodeApi>(cfg: &mut web::ServiceConfig, node: N, max_body_bytes: usize) {
    // Called once per worker thread: each gets its own funnel.
    cfg.app_data(AppendFunnel::new(node.clone()))
        .app_data(web::Data::new(node))
        .app_data(
            web::JsonConfig::default()
                .limit(max_body_bytes)
                // `curl -d` sends application/x-www-form-urlencoded; the
                // body is JSON whatever the header says.
                .content_type_required(false)
                .content_type(|_| true)
                .error_handler(json_error),
        )
        .app_data(web::PayloadConfig::new(max_body_bytes))
        .app_data(
            web::QueryConfig::default()
                .error_handler(|err, _req| ApiError::bad_request(format!("query string: {err}")).into()),
        )
        .service(one_method("/v1/quorum", Method::GET, quorum::<N>))
        .service(one_method("/v1/append", Method::POST, append::<N>))
        .service(one_method("/v1/log", Method::GET, log::<N>))
        .service(one_method("/v1/snapshot", Method::POST, snapshot::<N>))
        .service(one_method("/v1/image", Method::GET, metadata::image::<N>))
        .service(
            methods("/v1/brokers")
                .on(Method::GET, metadata::brokers::<N>)
                .on(Method::POST, metadata::register_broker::<N>),
        )
        .service(
            methods("/v1/brokers/{id}")
                .on(Method::GET, metadata::broker::<N>)
                .on(Method::DELETE, metadata::unregister_broker::<N>),
        )
        .service(one_method(
            "/v1/brokers/{id}/heartbeat",
            Method::POST,
            metadata::heartbeat::<N>,
        ))
        .service(
            methods("/v1/topics")
                .on(Method::GET, metadata::topics::<N>)
                .on(Method::POST, metadata::create_topic::<N>),
        )
        .service(
            methods("/v1/topics/{name}")
                .on(Method::GET, metadata::topic::<N>)
                .on(Method::DELETE, metadata::delete_topic::<N>),
        )
        .service(one_method(
            "/v1/topics/{name}/partitions",
            Method::POST,
            metadata::create_partitions::<N>,
        ))
        .service(
            methods("/v1/configs/{kind}/")
                .on(Method::GET, metadata::default_configs::<N>)
                .on(Method::PATCH, metadata::alter_default_configs::<N>),
        )
        .service(
            methods("/v1/configs/{kind}/{name}")
                .on(Method::GET, metadata::configs::<N>)
                .on(Method::PATCH, metadata::alter_configs::<N>),
        )
        .service(
            methods("/v1/features")
                .on(Method::GET, metadata::features::<N>)
                .on(Method::PATCH, metadata::update_features::<N>),
        )
        .service(one_method(
            "/v1/partitions/alter",
            Method::POST,
            metadata::alter_partitions::<N>,
        ))
        .service(one_method(
            "/v1/partitions/elect",
            Method::POST,
            metadata::elect_leader::<N>,
        ))
        .service(one_method("/healthz", Method::GET, healthz::<N>))
        .service(one_method("/metrics", Method::GET, prometheus::<N>))
        .default_service(web::to(not_found));
}

fn json_error(err: JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
    let api_error = match &err {
        JsonPayloadError::OverflowKnownLength { length, limit } => {
            ApiError::payload_too_large(format!("body of {length} bytes is over the limit of {limit} bytes"))
        }
        JsonPayloadError::Overflow { limit } => {
            ApiError::payload_too_large(format!("body is over the limit of {limit} bytes"))
        }
        JsonPayloadError::Payload(actix_web::error::PayloadError::Overflow) => {
            ApiError::payload_too_large("body is over the size limit".to_owned())
        }
        // Refused for its size, as the node refuses a batch over the limit.
        JsonPayloadError::Deserialize(e) if e.to_string().starts_with(RECORDS_OVER_A_BATCH) => {
            ApiError::rejected(e.to_string())
        }
        JsonPayloadError::Deserialize(e) => ApiError::bad_request(format!(
            "body must be a JSON object {{\"records\": [\"text\", ...]}}: {e}"
        )),
        other => ApiError::bad_request(format!("cannot read body: {other}")),
    };
    api_error.into()
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!("no route for {}", truncated(req.path()))).error_response()
}

/// The resource at `path`, served by `handler` for `method` alone; other
/// methods get 405 with an `Allow` header. actix-web's own method routes
/// (`web::get()`) also record, in every request's extensions, each method
/// they check, for an `Allow` header they build: an allocation and a map
/// entry per request, which [`OnlyMethod`] does without.
fn one_method<F, Args>(path: &str, method: Method, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    let allowed = method.clone();
    web::resource(path)
        .route(web::route().guard(OnlyMethod(method)).to(handler))
        .default_service(web::to(move |req: HttpRequest| {
            let allowed = allowed.clone();
            async move { not_allowed(&req, &allowed) }
        }))
}

/// A resource served for several methods (each added with [`on`]); the
/// others get 405 with an `Allow` header naming them.
struct Methods {
    allowed: Vec<Method>,
    resource: actix_web::Resource,
}

fn methods(path: &str) -> Methods {
    Methods {
        allowed: Vec::new(),
        resource: web::resource(path),
    }
}

impl Methods {
    /// Serves `method` with `handler`.
    fn on<F, Args>(mut self, method: Method, handler: F) -> Methods
    where
        F: actix_web::Handler<Args>,
        Args: actix_web::FromRequest + 'static,
        F::Output: actix_web::Responder + 'static,
    {
        self.allowed.push(method.clone());
        self.resource = self.resource.route(web::route().guard(OnlyMethod(method)).to(handler));
        self
    }
}

impl actix_web::dev::HttpServiceFactory for Methods {
    fn register(self, config: &mut actix_web::dev::AppService) {
        let allowed: Vec<String> = self.allowed.iter().map(|m| m.to_string()).collect();
        let resource = self.resource.default_service(web::to(move |req: HttpRequest| {
            let allowed = allowed.join(", ");
            async move {
                let mut response =
                    ApiError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), truncated(req.path())))
                        .error_response();
                if let Ok(value) = header::HeaderValue::from_str(&allowed) {
                    response.headers_mut().insert(header::ALLOW, value);
                }
                response
            }
        }));
        resource.register(config)
    }
}

/// Matches requests of one method.
struct OnlyMethod(Method);

impl Guard for OnlyMethod {
    fn check(&self, ctx: &GuardContext<'_>) -> bool {
        ctx.head().method == self.0
    }
}

fn not_allowed(req: &HttpRequest, allowed: &Method) -> HttpResponse {
    let mut response =
        ApiError::MethodNotAllowed(format!("{} is not allowed on {}", req.method(), truncated(req.path())))
            .error_response();
    // A method's name is always a valid header value.
    if let Ok(value) = header::HeaderValue::from_str(allowed.as_str()) {
        response.headers_mut().insert(header::ALLOW, value);
    }
    response
}

async fn quorum<N: NodeApi>(node: web::Data<N>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(node.describe().await?))
}

/// Writes a snapshot at the committed end of the log and answers once it
/// is durable (the latest one, `created: false`, if nothing is newer).
async fn snapshot<N: NodeApi>(node: web::Data<N>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(node.create_snapshot().await?))
}

/// Every write body of the API decoded from `data`, as the handlers
/// decode them (for the fuzz targets, `crate::fuzzing`).
pub(crate) fn fuzz_bodies(data: &[u8]) {
    let _ = serde_json::from_slice::<AppendRequest>(data);
    metadata::fuzz_bodies(data);
}

/// The body of `POST /v1/append`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendRequest {
    #[serde(deserialize_with = "records_of_one_batch")]
    records: Vec<String>,
}

/// How the error of [`records_of_one_batch`] begins.
const RECORDS_OVER_A_BATCH: &str = "the records take more than";

/// The `records` array, refused as soon as the records would take more
/// than the largest batch ([`MAX_BATCH_BYTES`]) in the log, where each
/// takes 12 bytes more than its text. Without this, a body of millions of
/// empty strings held tens of bytes of memory per body byte, twice (as
/// strings, then as records), before the node refused it for its size.
fn records_of_one_batch<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct Records;

    impl<'de> serde::de::Visitor<'de> for Records {
        type Value = Vec<String>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("an array of strings")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut records = Vec::new();
            let mut bytes = 0usize;
            while let Some(record) = seq.next_element::<String>()? {
                bytes += Record::data_encoded_len(record.len());
                if bytes > MAX_BATCH_BYTES {
                    return Err(serde::de::Error::custom(format_args!(
                        "{RECORDS_OVER_A_BATCH} {MAX_BATCH_BYTES} bytes in the log \
                         (each takes 12 bytes more than its text)"
                    )));
                }
                records.push(record);
            }
            Ok(records)
        }
    }

    deserializer.deserialize_seq(Records)
}

async fn append<N: NodeApi>(req: HttpRequest, body: web::Json<AppendRequest>) -> Result<HttpResponse, ApiError> {
    let records = body.into_inner().records;
    if records.is_empty() {
        return Err(ApiError::bad_request(
            "records must hold at least one record".to_owned(),
        ));
    }
    let records = records.into_iter().map(String::into_bytes).collect();
    // Resolves only at commit. Any failure after hand-over comes back as
    // OutcomeUnknown and is passed on as such, never retried.
    let funnel = req
        .app_data::<Rc<AppendFunnel<N>>>()
        .ok_or_else(|| ApiError::unavailable("no append funnel on this worker".to_owned()))?;
    let appended = funnel.append(records).await?;
    Ok(HttpResponse::Ok().json(appended))
}

/// The query of `GET /v1/log`, as text so that errors can name the
/// parameter.
#[derive(Debug, Deserialize)]
struct LogParams {
    from: Option<String>,
    max: Option<String>,
    /// Read by [`consistent`].
    #[allow(dead_code)]
    consistency: Option<String>,
}

async fn log<N: NodeApi>(
    node: web::Data<N>,
    params: web::Query<LogParams>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let params = params.into_inner();
    consistent(node.get_ref(), &req).await?;
    let max = match params.max.as_deref() {
        None => LOG_PAGE_DEFAULT,
        Some(text) => match text.parse::<u64>() {
            // A count too large for u64 is still a count: cap it.
            Err(e) if *e.kind() == IntErrorKind::PosOverflow => LOG_PAGE_MAX,
            Ok(0) | Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "max: expected a record count of at least 1, got {:?}",
                    truncated(text)
                )))
            }
            Ok(n) => usize::try_from(n).unwrap_or(usize::MAX).min(LOG_PAGE_MAX),
        },
    };
    let from = match params.from.as_deref() {
        // The log start moves only forward (snapshots), so a stale value
        // at worst makes the node answer from its new start.
        None => node.describe().await?.log_start_offset,
        Some(text) => match text.parse::<Offset>() {
            Ok(offset) if offset >= 0 => offset,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "from: expected an offset (an integer >= 0), got {:?}",
                    truncated(text)
                )))
            }
        },
    };
    let page = node.read_records(from, max).await?;
    if node.metadata_image().is_some() {
        return Ok(HttpResponse::Ok().json(metadata::log_page(page)));
    }
    Ok(HttpResponse::Ok().json(LogPage::from(page)))
}

async fn healthz<N: NodeApi>(node: web::Data<N>) -> Result<HttpResponse, ApiError> {
    let status = node.describe().await?;
    Ok(HttpResponse::Ok().json(json!({
        "status": "ok",
        "node_id": status.node_id,
        "role": status.role,
        "leader_id": status.leader_id,
        "leader_epoch": status.leader_epoch,
    })))
}

async fn prometheus<N: NodeApi>(node: web::Data<N>) -> Result<HttpResponse, ApiError> {
    let snapshot = node.metrics().await?;
    Ok(HttpResponse::Ok()
        .content_type(metrics::CONTENT_TYPE)
        .body(metrics::render(&snapshot)))
}

/// Caps text echoed back from a request, so an error message stays small.
fn truncated(text: &str) -> String {
    const MAX_ECHO_CHARS: usize = 64;
    if text.chars().count() <= MAX_ECHO_CHARS {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(MAX_ECHO_CHARS).collect();
        short.push('…');
        short
    }
}

#[cfg(test)]
mod tests;
