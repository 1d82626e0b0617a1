//! The HTTP side: bind the listening socket (a taken port or a bad address is a user error),
//! then answer `GET /metrics` with a fresh scrape, on one thread, until the caller stops.
//!
//! The exporter may listen on every interface, so a client is not trusted to behave: a
//! connection that sends no complete request head within [`header_timeout`] is closed (also
//! between the requests of a kept-alive connection), and at most [`MAX_CONNECTIONS`] are served
//! at once. A connection arriving at the cap takes the place of the one idle longest, preferring
//! those that never sent a request: a neighbour holding connections open (and reconnecting as
//! each times out) cannot keep Prometheus out.

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    convert::Infallible,
    io,
    net::SocketAddr,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Result;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

pub use super::negotiate::Format;
use super::negotiate::negotiate;
use crate::error::UserError;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What answers a scrape: the body in the asked format, or why it failed.
pub trait Exposition {
    fn render(&self, format: Format) -> Result<String, String>;
}

/// At most this many connections are served at once. At the cap, the connection idle longest is
/// closed to make room (one that never sent a request first), rather than the new one refused.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a complete request head (Prometheus sends its in one
/// packet). `MM_PROBE_HEADER_TIMEOUT_MS` overrides it, for the tests that wait it out.
pub fn header_timeout() -> Duration {
    std::env::var("MM_PROBE_HEADER_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .filter(|&ms| ms > 0)
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// Binds the first of `addresses` this host has (`:PORT` falls back to IPv4 where it has no
/// IPv6), before any probe is attached, so that a taken port costs nothing to report. A taken
/// port or a refusal ends the search: the next address would listen somewhere else than asked.
pub async fn bind(addresses: &[SocketAddr]) -> Result<TcpListener> {
    let mut first_error = None;
    for &address in addresses {
        match TcpListener::bind(address).await {
            Ok(listener) => return Ok(listener),
            Err(e) if matches!(e.kind(), io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied) => {
                return Err(bind_error(address, e));
            }
            Err(e) => {
                first_error.get_or_insert((address, e));
            }
        }
    }
    let (address, e) = first_error.expect("parse_listen gives at least one address");
    Err(bind_error(address, e))
}

fn bind_error(address: SocketAddr, e: io::Error) -> anyhow::Error {
    let why = match e.kind() {
        io::ErrorKind::AddrInUse => "the port is in use (another exporter?): pick another with --listen".to_string(),
        io::ErrorKind::AddrNotAvailable => "no interface of this machine has that address".to_string(),
        io::ErrorKind::PermissionDenied => "not permitted (ports below 1024 need CAP_NET_BIND_SERVICE)".to_string(),
        _ => e.to_string(),
    };
    UserError::new(format!("cannot listen on {address}: {why}")).into()
}

/// Accepts connections until the future is dropped; each connection is served on this thread
/// (a `LocalSet` must be running), so scrapes never run at the same time.
pub async fn serve(listener: TcpListener, exposition: Rc<dyn Exposition>) -> Result<()> {
    let timeout = header_timeout();
    let open = Rc::new(Connections::default());
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
        if open.len() >= MAX_CONNECTIONS && !open.close_longest_idle() {
            drop(stream);
            continue;
        }
        let exposition = exposition.clone();
        let id = open.next_id();
        let connection = open.clone();
        let task = tokio::task::spawn_local(async move {
            let _registered = Registered(connection.clone(), id);
            let service = service_fn(move |request| {
                connection.touched(id);
                let response = respond(&request, exposition.as_ref());
                async move { Ok::<_, Infallible>(response) }
            });
            // A client that goes away mid-request, or times out, is its own business.
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        open.register(id, task.abort_handle());
    }
}

/// The open connections: when each last finished a request (never, for a new one), and how to
/// close it.
#[derive(Default)]
struct Connections {
    next: Cell<u64>,
    open: RefCell<BTreeMap<u64, Open>>,
}

struct Open {
    abort: Option<tokio::task::AbortHandle>,
    /// When it last sent a request; `None` until its first.
    last_request: Option<Instant>,
}

impl Connections {
    fn len(&self) -> usize {
        self.open.borrow().len()
    }

    fn next_id(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        self.open.borrow_mut().insert(id, Open { abort: None, last_request: None });
        id
    }

    fn register(&self, id: u64, abort: tokio::task::AbortHandle) {
        if let Some(open) = self.open.borrow_mut().get_mut(&id) {
            open.abort = Some(abort);
        }
    }

    fn touched(&self, id: u64) {
        if let Some(open) = self.open.borrow_mut().get_mut(&id) {
            open.last_request = Some(Instant::now());
        }
    }

    /// Closes the connection that never sent a request and is oldest (ids grow with time), else
    /// the one whose last request is oldest. False when none can be closed.
    fn close_longest_idle(&self) -> bool {
        let victim = {
            let open = self.open.borrow();
            open.iter()
                .filter(|(_, o)| o.abort.is_some())
                .min_by_key(|(id, o)| (o.last_request.is_some(), o.last_request, **id))
                .map(|(id, _)| *id)
        };
        let Some(id) = victim else { return false };
        if let Some(open) = self.open.borrow_mut().remove(&id)
            && let Some(abort) = open.abort
        {
            abort.abort();
        }
        true
    }
}

/// One open connection, listed while it lives.
struct Registered(Rc<Connections>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.open.borrow_mut().remove(&self.1);
    }
}

fn respond(request: &Request<Incoming>, exposition: &dyn Exposition) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let accept = request.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let format = negotiate(accept);
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

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, body, "text/plain; charset=utf-8")
}

fn with_type(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
