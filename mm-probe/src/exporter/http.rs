//! The HTTP side: bind the listening socket (a taken port or a bad address is a user error),
//! then answer `GET /metrics` with a fresh scrape, on one thread, until the caller stops.

use std::{convert::Infallible, io, net::SocketAddr, rc::Rc};

use anyhow::Result;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::error::UserError;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which text format the client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Classic,
}

/// What answers a scrape: the body in the asked format, or why it failed.
pub trait Exposition {
    fn render(&self, format: Format) -> Result<String, String>;
}

/// `--listen` as a socket address, or a one-line error that shows the expected form.
pub fn parse_listen(text: &str) -> Result<SocketAddr, UserError> {
    text.parse().map_err(|_| {
        UserError::new(format!(
            "--listen {text:?} is not an address:port: write e.g. 127.0.0.1:9479 or [::1]:9479 (0.0.0.0:9479 serves every interface)"
        ))
    })
}

/// Binds before any probe is attached, so that a taken port costs nothing to report.
pub async fn bind(address: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(address).await.map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::AddrInUse => {
                "the port is in use (another exporter?): pick another with --listen".to_string()
            }
            io::ErrorKind::AddrNotAvailable => "no interface of this machine has that address".to_string(),
            io::ErrorKind::PermissionDenied => "not permitted (ports below 1024 need CAP_NET_BIND_SERVICE)".to_string(),
            _ => e.to_string(),
        };
        UserError::new(format!("cannot listen on {address}: {why}")).into()
    })
}

/// Accepts connections until the future is dropped; each connection is served on this thread
/// (a `LocalSet` must be running), so scrapes never run at the same time.
pub async fn serve(listener: TcpListener, exposition: Rc<dyn Exposition>) -> Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: say so, keep serving.
                eprintln!("mm-probe exporter: accepting a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let exposition = exposition.clone();
        tokio::task::spawn_local(async move {
            let service = service_fn(move |request| {
                let response = respond(&request, exposition.as_ref());
                async move { Ok::<_, Infallible>(response) }
            });
            // A client that goes away mid-request is its own business.
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn respond(request: &Request<Incoming>, exposition: &dyn Exposition) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let format = negotiate(request);
            match exposition.render(format) {
                Ok(body) => {
                    let content_type = if format == Format::OpenMetrics { OPENMETRICS } else { CLASSIC };
                    with_type(StatusCode::OK, body, content_type)
                }
                Err(why) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            }
        }
        "/" => plain(StatusCode::OK, "mm-probe exporter: metrics at /metrics\n".into()),
        _ => plain(StatusCode::NOT_FOUND, "not found: metrics are at /metrics\n".into()),
    }
}

/// OpenMetrics when the client accepts it (Prometheus does), else the classic text format.
fn negotiate(request: &Request<Incoming>) -> Format {
    let accept = request.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("application/openmetrics-text") { Format::OpenMetrics } else { Format::Classic }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, body, "text/plain; charset=utf-8")
}

fn with_type(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_or_explain() {
        assert_eq!(parse_listen("127.0.0.1:9479").unwrap().port(), 9479);
        assert!(parse_listen("[::1]:1").unwrap().is_ipv6());
        let err = parse_listen("localhost").unwrap_err().to_string();
        assert!(err.contains("not an address:port") && !err.contains('\n'), "{err}");
        assert!(parse_listen("127.0.0.1").is_err(), "a port is required");
    }
}
