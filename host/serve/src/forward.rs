//! In a cluster, a request about a pipeline that another host runs is
//! answered by that host: this host asks it on the caller's behalf, with the
//! caller's token, and hands its answer back as it came. Status, the
//! steering verbs, plugin swaps and rollbacks go this way, so `weir ctl`
//! works against any host.
//!
//! A forwarded request carries [`FORWARDED_BY`] and is answered where it
//! lands, never forwarded again: two hosts that each believe the other runs
//! the pipeline (a move under way) cannot bounce a request between them.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use weir_cluster::{PipelineId, Session};

/// The header of a forwarded request: the host that forwarded it.
pub const FORWARDED_BY: &str = "x-weir-forwarded-by";
/// The header of an answer another host gave: that host's name.
pub const ANSWERED_BY: &str = "x-weir-answered-by";
/// The bound on one forwarded request, connecting included.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer read back: a status with its whole swap history
/// is far smaller.
const MAX_ANSWER: usize = 1 << 20;

/// The host that answers for a pipeline, and its admin API's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub address: String,
}

/// The other host that answers for `id`: the one holding its assignment,
/// else the one it is placed on. None when that is this host or nobody,
/// or the host has left the cluster (no address to ask).
pub async fn owner_elsewhere(session: &Session, id: &PipelineId) -> Result<Option<Owner>, String> {
    let keys = session.keys();
    let bound = session.config().request_timeout();
    let mut client = session.client();
    let mut get = async |key: String| -> Result<Option<String>, String> {
        let reply = tokio::time::timeout(bound, client.get(key.as_str(), None))
            .await
            .map_err(|_| format!("etcd did not answer within {} ms", bound.as_millis()))?
            .map_err(|e| format!("reading {key} from etcd: {e}"))?;
        Ok(reply
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    };
    let host = match get(keys.assignment(id)).await? {
        Some(owner) => owner,
        None => match get(keys.placement(id)).await? {
            Some(placed) => placed,
            None => return Ok(None),
        },
    };
    if host == session.name() {
        return Ok(None);
    }
    Ok(get(keys.member(&host))
        .await?
        .map(|address| Owner { host, address }))
}

/// Asks `owner` the same request (`method` on `path` with `body`, and the
/// caller's `Authorization`) and hands back its answer: status, content
/// type and body. An owner that does not answer in time is a 502 that
/// names it. The body was already bounded by the route that took it.
pub async fn forward(
    owner: &Owner,
    me: &str,
    request: (Method, &str, Bytes),
    headers: &HeaderMap,
    what: &str,
) -> Response {
    let (method, path, body) = request;
    let ask = async {
        let stream = tokio::net::TcpStream::connect(owner.address.as_str()).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection ends with the sender, after the one request.
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, owner.address.as_str())
            .header(FORWARDED_BY, me);
        if let Some(token) = headers.get(header::AUTHORIZATION) {
            request = request.header(header::AUTHORIZATION, token);
        }
        let answer = sender.send_request(request.body(Full::new(body))?).await?;
        let (parts, body) = answer.into_parts();
        let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body))
    };
    let failed = |why: String| {
        let message = format!(
            "{what} runs on `{}`, whose admin API at {} did not answer ({why}); ask it, or add \
             ?local=true for this host's own view",
            owner.host, owner.address
        );
        (
            StatusCode::BAD_GATEWAY,
            axum::Json(super::api::ApiError { error: message }),
        )
            .into_response()
    };
    let (parts, body) = match tokio::time::timeout(FORWARD_TIMEOUT, ask).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return failed(e.to_string()),
        Err(_) => return failed(format!("no answer within {} s", FORWARD_TIMEOUT.as_secs())),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = parts.status;
    if let Some(kind) = parts.headers.get(header::CONTENT_TYPE) {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, kind.clone());
    }
    if let Ok(host) = HeaderValue::from_str(&owner.host) {
        response.headers_mut().insert(ANSWERED_BY, host);
    }
    response
}
