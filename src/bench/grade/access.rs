//! Who may use the grading page: requests addressed to this machine by name or loopback address
//! only (a page of another site that rebinds its name to 127.0.0.1 sends its own name as
//! `Host`), and grades posted from the page's own origin only (a page of another site may post
//! a form here without reading the answer).

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::GradeError;

/// The host names the page answers to, without a port.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// `host` without its port: `[::1]:8080` → `[::1]`, `localhost:80` → `localhost`.
fn without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) if host[end + 1..].is_empty() || host[end + 1..].starts_with(':') => &host[..=end],
            _ => host,
        };
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Whether a `Host` header's value names this machine (any port).
#[must_use]
pub(super) fn is_loopback_host(host: &str) -> bool {
    let name = without_port(host.trim()).to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    LOOPBACK_NAMES.contains(&name)
}

/// A header's value as text (none when absent or not visible ASCII).
fn header_text<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Whether a POST may go on: no `Origin` (not sent by a browser page of another site), or the
/// origin of the host it is addressed to.
#[must_use]
pub(super) fn is_same_origin(origin: Option<&str>, host: &str) -> bool {
    origin.is_none_or(|origin| origin.eq_ignore_ascii_case(&format!("http://{host}")))
}

/// Answers 403 before anything else is done with a request addressed to another host, or a POST
/// from another origin.
pub(super) async fn refuse_other_hosts_and_origins(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = header_text(headers, &header::HOST).unwrap_or_default().to_string();
    if !is_loopback_host(&host) {
        return GradeError::HostNotAllowed(host).into_response();
    }
    if request.method() == Method::POST {
        let origin = header_text(headers, &header::ORIGIN);
        if !is_same_origin(origin, &host) {
            return GradeError::OriginNotAllowed(origin.unwrap_or_default().to_string()).into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_any_port_are_this_machine_and_nothing_else_is() {
        for host in ["localhost", "localhost:8123", "LOCALHOST.", "127.0.0.1:9", "[::1]", "[::1]:41000"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["", "evil.example", "evil.example:80", "127.0.0.2", "[::1]x", "localhost.evil", "0.0.0.0:80"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_post_passes_without_an_origin_or_from_its_own() {
        assert!(is_same_origin(None, "127.0.0.1:8000"));
        assert!(is_same_origin(Some("http://127.0.0.1:8000"), "127.0.0.1:8000"));
        assert!(!is_same_origin(Some("http://127.0.0.1:8001"), "127.0.0.1:8000"));
        assert!(!is_same_origin(Some("null"), "127.0.0.1:8000"));
        assert!(!is_same_origin(Some("https://evil.example"), "127.0.0.1:8000"));
    }
}
