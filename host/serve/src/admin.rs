//! The admin API over HTTP: health and readiness, metrics, and the
//! pipelines a token reaches. Every handler that waits (a swap waits for a
//! commit boundary, a delete for the run to end) runs on a blocking thread.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post, put};
use serde::Deserialize;

use super::api::{
    ApiError, Applied, Deleted, NotRunning, PipelineList, PipelineStatus, Readiness, RejectedFile,
    Steered,
};
use super::forward::{FORWARDED_BY, forward, owner_elsewhere};
use super::policy::Refusal;
use super::server::{Caller, MAX_PIPELINE_FILE, Origin, Server};
use super::supervisor::{Slot, State as PipelineState};
use weir_cluster::PipelineId;

/// The largest body of a route that takes none worth speaking of (the
/// steering verbs, a rollback).
const MAX_SMALL_BODY: usize = 64 << 10;

/// The routes. Every route under `/v1` takes a token, checked from the
/// headers before any of the body is read; every route refuses a body
/// declared larger than its bound before reading it, and stops reading
/// one that grows past it.
pub fn router(server: Arc<Server>) -> Router {
    let max_plugin = server.host.admin.max_plugin_bytes();
    let authenticated = Router::new()
        .route("/v1/pipelines", bounded(get(list), MAX_SMALL_BODY))
        .route(
            "/v1/pipelines/{tenant}/{pipeline}",
            bounded(put(apply).get(status).delete(delete), MAX_PIPELINE_FILE),
        )
        .route(
            "/v1/pipelines/{tenant}/{pipeline}/{verb}",
            bounded(post(steer), MAX_SMALL_BODY),
        )
        .route(
            "/v1/pipelines/{tenant}/{pipeline}/sinks/{sink}/plugin",
            bounded(put(replace), max_plugin),
        )
        .route(
            "/v1/pipelines/{tenant}/{pipeline}/sinks/{sink}/rollback",
            bounded(post(rollback), MAX_SMALL_BODY),
        )
        .route(
            "/v1/tenants/{tenant}/plugins/{sha256}",
            bounded(put(upload_plugin), max_plugin),
        )
        .route_layer(from_fn_with_state(server.clone(), authenticate));
    Router::new()
        .route("/health", bounded(get(health), MAX_SMALL_BODY))
        .route("/ready", bounded(get(ready), MAX_SMALL_BODY))
        .route("/metrics", bounded(get(metrics), MAX_SMALL_BODY))
        .merge(authenticated)
        .with_state(server)
}

/// `route` with its body bounded to `max` bytes: a larger declared length
/// is answered 413 before the body is read, a body that grows past it is
/// not read further.
fn bounded(route: MethodRouter<Arc<Server>>, max: usize) -> MethodRouter<Arc<Server>> {
    route
        .layer::<_, Infallible>(from_fn_with_state(max, refuse_declared_over))
        .layer(DefaultBodyLimit::max(max))
}

async fn refuse_declared_over(State(max): State<usize>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > max as u64
    {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} {}: the body is declared {declared} bytes, over this route's bound of {}",
                request.method(),
                request.uri().path(),
                size(max)
            ),
        );
    }
    next.run(request).await
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Finds the caller from the headers alone and hands it to the handler; a
/// request without a known token is answered 401 before its body is read.
async fn authenticate(
    State(server): State<Arc<Server>>,
    mut request: Request,
    next: Next,
) -> Response {
    match caller(&server, request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refused) => refused.into_response(),
    }
}

type Answer = Result<Response, Failure>;

/// A refusal on its way out (boxed: a response is large, and most
/// answers are not refusals).
pub struct Failure(Box<Response>);

impl From<Response> for Failure {
    fn from(response: Response) -> Self {
        Failure(Box::new(response))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        *self.0
    }
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    let body = ApiError {
        error: message.to_string(),
    };
    (status, axum::Json(body)).into_response()
}

fn refusal(refusal: Refusal) -> Response {
    let status = match &refusal {
        Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
        Refusal::NotFound(_) => StatusCode::NOT_FOUND,
        Refusal::Conflict(_) => StatusCode::CONFLICT,
        Refusal::Plugin(_) => StatusCode::UNPROCESSABLE_ENTITY,
    };
    error(status, refusal)
}

fn ok(value: impl serde::Serialize) -> Response {
    (StatusCode::OK, axum::Json(value)).into_response()
}

/// The caller behind the request's bearer token.
fn caller(server: &Server, headers: &HeaderMap) -> Result<Caller, Failure> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let unauthorized = |why: &str| {
        let mut response = error(StatusCode::UNAUTHORIZED, why);
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Bearer".parse().expect("a valid header"),
        );
        Failure::from(response)
    };
    let Some(token) = token else {
        return Err(unauthorized(
            "an `Authorization: Bearer TOKEN` header is needed",
        ));
    };
    server
        .caller(token)
        .ok_or_else(|| unauthorized("the token is not known"))
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the handler failed: {e}"),
        )
    })
}

async fn health() -> &'static str {
    "ok\n"
}

/// Ready when every pipeline that should run runs (or paused, or its
/// source ended) and every pipeline file was admitted.
async fn ready(State(server): State<Arc<Server>>) -> Response {
    let mut not_running = Vec::new();
    for slot in server.slots() {
        let (state, reason) = slot.state();
        let fine = matches!(
            state,
            PipelineState::Running | PipelineState::Paused | PipelineState::Finished
        );
        if !fine {
            not_running.push(NotRunning {
                pipeline: slot.id(),
                state,
                reason,
            });
        }
    }
    let rejected: Vec<RejectedFile> = server
        .rejected
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(file, why)| RejectedFile {
            file: file.display().to_string(),
            error: why.clone(),
        })
        .collect();
    let ready = not_running.is_empty() && rejected.is_empty();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready,
        not_running,
        rejected,
    };
    (status, axum::Json(body)).into_response()
}

/// Every series for the operator's token (or anyone, with
/// `admin.open_metrics`), a tenant's own series for its token: the names
/// of pipelines, sinks and tables are the tenant's business.
async fn metrics(State(server): State<Arc<Server>>, headers: HeaderMap) -> Answer {
    let page = if server.host.admin.open_metrics {
        server.metrics.render()
    } else {
        match caller(&server, &headers)? {
            Caller::Operator => server.metrics.render(),
            Caller::Tenant(tenant) => server.metrics.render_for_tenant(&tenant),
        }
    };
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        page,
    )
        .into_response())
}

async fn list(State(server): State<Arc<Server>>, Extension(caller): Extension<Caller>) -> Answer {
    Ok(ok(PipelineList {
        pipelines: server.list(&caller),
        rejected: server.rejected_for(&caller),
    }))
}

async fn apply(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Answer {
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| error(StatusCode::BAD_REQUEST, "the pipeline file is not UTF-8"))?;
    let changed = blocking(move || server.apply(&caller, &tenant, &pipeline, &text, Origin::Api))
        .await?
        .map_err(refusal)?;
    Ok(ok(Applied { changed }))
}

/// `?local=true`: this host's own view of a pipeline, not its owner's.
#[derive(Deserialize)]
struct View {
    #[serde(default)]
    local: bool,
}

/// In a cluster, the answer of the host that runs the pipeline, when this
/// host stands by for it and the request was neither forwarded already nor
/// asked for this host's view. When etcd cannot be read, this host answers
/// (its standby reason says where the pipeline ran when it last knew).
async fn from_owner(
    server: &Server,
    slot: &Slot,
    local: bool,
    (method, body): (Method, Bytes),
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<Response> {
    let session = server.cluster()?;
    if local || headers.contains_key(FORWARDED_BY) || slot.state().0 != PipelineState::Standby {
        return None;
    }
    let id = PipelineId::new(&slot.tenant.name, &slot.name);
    let owner = match owner_elsewhere(session, &id).await {
        Ok(owner) => owner?,
        Err(why) => {
            tracing::warn!(pipeline = %slot.id(), "cannot find the pipeline's owner: {why}");
            return None;
        }
    };
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let request = (method, path, body);
    Some(forward(&owner, session.name(), request, headers, &slot.id()).await)
}

async fn status(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline)): Path<(String, String)>,
    Query(view): Query<View>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: HeaderMap,
) -> Answer {
    let slot = server.slot(&caller, &tenant, &pipeline).map_err(refusal)?;
    let asked = (Method::GET, Bytes::new());
    if let Some(answer) = from_owner(&server, &slot, view.local, asked, &uri, &headers).await {
        return Ok(answer);
    }
    let (state, reason) = slot.state();
    let file = slot
        .tenant
        .pipelines_dir
        .join(format!("{}.yaml", slot.name));
    Ok(ok(PipelineStatus {
        tenant: slot.tenant.name.clone(),
        pipeline: slot.name.clone(),
        state,
        reason,
        failures: slot.failures(),
        file: file.display().to_string(),
        plugins: slot
            .plugins()
            .into_iter()
            .map(|(sink, version)| (sink, version.into()))
            .collect(),
        live: slot.live(),
        sink_errors: slot.sink_errors(),
        swaps: slot.swaps(),
        host: server.cluster().map(|session| session.name().to_string()),
    }))
}

async fn delete(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
) -> Answer {
    blocking(move || server.delete(&caller, &tenant, &pipeline, Origin::Api))
        .await?
        .map_err(refusal)?;
    Ok(ok(Deleted { deleted: true }))
}

async fn steer(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline, verb)): Path<(String, String, String)>,
    Query(view): Query<View>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: HeaderMap,
) -> Answer {
    let slot = server.slot(&caller, &tenant, &pipeline).map_err(refusal)?;
    // Steering acts where the pipeline runs.
    let asked = (Method::POST, Bytes::new());
    if let Some(answer) = from_owner(&server, &slot, view.local, asked, &uri, &headers).await {
        return Ok(answer);
    }
    let done = match verb.as_str() {
        "pause" => slot.pause(),
        "resume" => slot.resume(),
        "stop" => {
            slot.stop();
            Ok(())
        }
        "start" => {
            slot.start();
            Ok(())
        }
        _ => {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("no action `{verb}`: pause, resume, stop or start"),
            )
            .into());
        }
    };
    done.map_err(|why| {
        error(
            StatusCode::CONFLICT,
            format!("cannot {verb} `{}`: {why}", slot.id()),
        )
    })?;
    let (state, reason) = slot.state();
    Ok(ok(Steered { state, reason }))
}

#[derive(Deserialize)]
struct Pin {
    sha256: Option<String>,
    /// Swap on this host even when another runs the pipeline.
    #[serde(default)]
    local: bool,
}

/// A swap acts where the pipeline runs: asked of a host that stands by for
/// it, it is forwarded, plugin and all, to the owner.
async fn replace(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline, sink)): Path<(String, String, String)>,
    Query(pin): Query<Pin>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let slot = server.slot(&caller, &tenant, &pipeline).map_err(refusal)?;
    let asked = (Method::PUT, body.clone());
    if let Some(answer) = from_owner(&server, &slot, pin.local, asked, &uri, &headers).await {
        return Ok(answer);
    }
    let swapped = blocking(move || {
        server.replace(
            &caller,
            &tenant,
            &pipeline,
            &sink,
            &body,
            pin.sha256.as_deref(),
        )
    })
    .await?
    .map_err(refusal)?;
    Ok(ok(swapped))
}

async fn rollback(
    State(server): State<Arc<Server>>,
    Path((tenant, pipeline, sink)): Path<(String, String, String)>,
    Query(view): Query<View>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    headers: HeaderMap,
) -> Answer {
    let slot = server.slot(&caller, &tenant, &pipeline).map_err(refusal)?;
    let asked = (Method::POST, Bytes::new());
    if let Some(answer) = from_owner(&server, &slot, view.local, asked, &uri, &headers).await {
        return Ok(answer);
    }
    let swapped = blocking(move || server.rollback(&caller, &tenant, &pipeline, &sink))
        .await?
        .map_err(refusal)?;
    Ok(ok(swapped))
}

async fn upload_plugin(
    State(server): State<Arc<Server>>,
    Path((tenant, sha256)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Answer {
    let uploaded = blocking(move || server.upload_plugin(&caller, &tenant, &sha256, &body))
        .await?
        .map_err(refusal)?;
    Ok(ok(uploaded))
}
