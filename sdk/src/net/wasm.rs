//! In WebAssembly: `std::net` over `wasi:sockets`, and `wasi:http` through
//! the Bytecode Alliance's `wasip2` bindings, blocking; the host checks the
//! grants.

use std::io;
use std::net::{SocketAddr, TcpStream};

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::{OutputStream, StreamError};

use super::grants::Host;
use super::http::{HttpError, Prepared, Response};

pub fn tcp_connect(target: &str, host: &Host, port: u16) -> io::Result<TcpStream> {
    let connected = match host {
        Host::Ip(ip) => TcpStream::connect(SocketAddr::new(*ip, port)),
        Host::Name(name) => TcpStream::connect((name.as_str(), port)),
    };
    connected.map_err(|e| {
        // The host refuses an ungranted address as a denied connect and
        // an ungranted name as a failed lookup; an ordinary network
        // failure needs no hint.
        use io::ErrorKind::*;
        let hint = match e.kind() {
            ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut
            | HostUnreachable | NetworkUnreachable => String::new(),
            _ => format!(" (if it is not granted: add `{host}:{port}` to grants.tcp)"),
        };
        io::Error::new(
            e.kind(),
            format!("TCP connection to {target} failed: {e}{hint}"),
        )
    })
}

/// Sends the request with the blocking calls of `wasi:http`: start it,
/// write the whole body, then wait for the answer, which decides what
/// went wrong (a client that writes the body while it waits, as `wstd`
/// does, reports whichever fails first: a refused request then looks
/// like a reset connection).
pub fn send(prepared: Prepared) -> Result<Response, HttpError> {
    let target = prepared.target();
    let shown = format!("{} {}", prepared.request.method(), prepared.request.uri());
    let invalid = |why: String| HttpError::Invalid(format!("{shown}: {why}"));
    let (parts, body) = prepared.request.into_parts();

    let headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect();
    let headers = Fields::from_list(&headers)
        .map_err(|e| invalid(format!("the host refuses the headers: {e:?}")))?;
    let request = OutgoingRequest::new(headers);
    let method = match parts.method.as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_string()),
    };
    let scheme = match prepared.scheme.as_str() {
        "https" => Scheme::Https,
        _ => Scheme::Http,
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let authority = parts.uri.authority().map(|a| a.as_str());
    request
        .set_method(&method)
        .and_then(|()| request.set_scheme(Some(&scheme)))
        .and_then(|()| request.set_authority(authority))
        .and_then(|()| request.set_path_with_query(Some(path)))
        .map_err(|()| invalid("the host refuses the method, scheme, host or path".into()))?;

    let options = RequestOptions::new();
    let nanos = Some(u64::try_from(prepared.timeout.as_nanos()).unwrap_or(u64::MAX));
    // A host that does not support a timeout keeps its own bound.
    let _ = options.set_connect_timeout(nanos);
    let _ = options.set_first_byte_timeout(nanos);
    let _ = options.set_between_bytes_timeout(nanos);

    let outgoing_body = request
        .body()
        .map_err(|()| invalid("the request body was already taken".into()))?;
    let pending = outgoing_handler::handle(request, Some(options))
        .map_err(|code| classify(&shown, &target, &code))?;
    // A failed write is not the verdict: the host closes the body
    // stream when it refuses the request, when the connection fails,
    // and also when the client has taken all `Content-Length` bytes.
    // The answer below says which.
    if let Ok(stream) = outgoing_body.write() {
        let _ = write_all(&stream, &body);
    }
    let _ = OutgoingBody::finish(outgoing_body, None);

    pending.subscribe().block();
    let answer = match pending.get() {
        Some(Ok(answer)) => answer,
        _ => {
            return Err(HttpError::Connection(format!(
                "{shown}: the host gave no answer"
            )));
        }
    };
    let response = answer.map_err(|code| classify(&shown, &target, &code))?;

    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    let incoming = response
        .consume()
        .map_err(|()| HttpError::Connection(format!("{shown}: the answer has no body")))?;
    let body = read_all(&incoming, prepared.max_response_bytes).map_err(|e| match e {
        ReadError::TooLarge => HttpError::TooLarge(format!(
            "{shown}: the response body exceeds {} bytes",
            prepared.max_response_bytes
        )),
        ReadError::Stream(e) => HttpError::Connection(format!(
            "{shown}: reading the answer failed: {}",
            stream_failure(&e)
        )),
    })?;
    drop(IncomingBody::finish(incoming));
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Why a stream failed, as the host words it (the `Debug` form of a
/// stream error shows only the handle of the host's error).
fn stream_failure(error: &StreamError) -> String {
    match error {
        StreamError::LastOperationFailed(e) => e.to_debug_string(),
        StreamError::Closed => "the stream closed".into(),
    }
}

/// Writes `data` as fast as the host takes it, then flushes.
fn write_all(stream: &OutputStream, mut data: &[u8]) -> Result<(), StreamError> {
    while !data.is_empty() {
        let permitted = stream.check_write()?;
        if permitted == 0 {
            stream.subscribe().block();
            continue;
        }
        let n = usize::try_from(permitted)
            .unwrap_or(usize::MAX)
            .min(data.len());
        stream.write(&data[..n])?;
        data = &data[n..];
    }
    stream.blocking_flush()
}

enum ReadError {
    TooLarge,
    Stream(StreamError),
}

/// Reads the whole body, refusing more than `limit` bytes.
fn read_all(incoming: &IncomingBody, limit: usize) -> Result<Vec<u8>, ReadError> {
    let stream = incoming
        .stream()
        .map_err(|()| ReadError::Stream(StreamError::Closed))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => {
                if bytes.len() + chunk.len() > limit {
                    return Err(ReadError::TooLarge);
                }
                bytes.extend_from_slice(&chunk);
            }
            Err(StreamError::Closed) => return Ok(bytes),
            Err(e) => return Err(ReadError::Stream(e)),
        }
    }
}

fn classify(shown: &str, target: &str, code: &ErrorCode) -> HttpError {
    let message = format!("{shown}: {code:?}");
    match code {
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => {
            HttpError::Denied(format!(
                "{shown}: refused by the host; the operator grants it in grants.http \
                 (`{target}`), and a granted name reaches public addresses only"
            ))
        }
        ErrorCode::DnsTimeout
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => HttpError::Timeout(message),
        ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestUriTooLong
        | ErrorCode::HttpRequestHeaderSectionSize(_)
        | ErrorCode::HttpRequestHeaderSize(_)
        | ErrorCode::HttpRequestBodySize(_)
        | ErrorCode::HttpRequestLengthRequired => HttpError::Invalid(message),
        ErrorCode::HttpResponseBodySize(_) | ErrorCode::HttpResponseHeaderSectionSize(_) => {
            HttpError::TooLarge(message)
        }
        _ => HttpError::Connection(message),
    }
}
