//! Who may call the API: the host names a request may be addressed to (every route, against DNS
//! rebinding), API keys (`Authorization: Bearer`, compared in constant time) on every route but
//! `/health` and the console's files (the page asks for the key and sends it with its calls), and
//! CORS for browser clients of the origins the user named.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use super::error::ApiError;

/// How long a browser may cache a preflight answer.
const PREFLIGHT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// The keys a request may present; none: every request is let in.
#[derive(Clone, Default)]
pub struct ApiKeys(Arc<Vec<Vec<u8>>>);

impl std::fmt::Debug for ApiKeys {
    /// Never the keys themselves.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys").field("count", &self.0.len()).finish()
    }
}

impl ApiKeys {
    /// Accepts requests that present any of `keys` (empty ones are ignored).
    #[must_use]
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(keys.into_iter().filter(|k| !k.is_empty()).map(String::into_bytes).collect()))
    }

    /// The keys of a key file: one per line; blank lines and lines starting with `#` are skipped.
    #[must_use]
    pub fn parse_file(text: &str) -> Vec<String> {
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
    }

    /// Whether any key is required.
    #[must_use]
    pub fn required(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `presented` is one of the keys. Every key is compared, each in constant time, so
    /// the time taken tells nothing about how much of a key matched or which one.
    fn accepts(&self, presented: &[u8]) -> bool {
        let mut matched = subtle::Choice::from(0);
        for key in self.0.iter() {
            matched |= key.as_slice().ct_eq(presented);
        }
        matched.into()
    }
}

/// The bearer token of a request, if it sent one.
fn bearer(request: &Request) -> Option<&[u8]> {
    let value = request.headers().get(header::AUTHORIZATION)?.as_bytes();
    let scheme = value.get(..7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| value[7..].trim_ascii())
}

/// Lets a request through if it presents a key (or none is required, or it asks `/health` or
/// gets a file of the console); otherwise answers 401 with the envelope and
/// `WWW-Authenticate: Bearer`.
pub(super) async fn require_key(State(keys): State<ApiKeys>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let open = path == "/health"
        || (matches!(*request.method(), Method::GET | Method::HEAD) && super::console::is_console_file(path));
    if !keys.required() || open {
        return next.run(request).await;
    }
    let error = match bearer(&request) {
        Some(token) if keys.accepts(token) => return next.run(request).await,
        Some(_) => ApiError::Unauthorized("incorrect API key provided"),
        None => ApiError::Unauthorized("missing API key: send it as 'Authorization: Bearer KEY'"),
    };
    let mut response = error.into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The host names a request may be addressed to (its `Host` header, and the authority of an
/// absolute request target). A web page can make its own domain resolve to this machine (DNS
/// rebinding): its requests are then same-origin for the browser, and pass any origin check,
/// but they carry the page's domain as `Host`. So only names the user vouched for are served:
/// `localhost`, the address the server was bound to, and `--allowed-host` names. An IP address
/// is always accepted: a page whose origin is an IP address was served from that address, so
/// a browser never sends one for another server. A request without `Host` (HTTP/1.0 clients;
/// browsers always send it) passes.
#[derive(Clone, Debug)]
pub enum AllowedHosts {
    /// Any host name (`--allowed-host '*'`, asked for explicitly).
    Any,
    /// These names (lowercase, without a trailing dot), and IP addresses.
    Names(Arc<Vec<String>>),
}

impl Default for AllowedHosts {
    /// `localhost` and IP addresses only.
    fn default() -> Self {
        Self::Names(Arc::new(vec!["localhost".to_string()]))
    }
}

impl AllowedHosts {
    /// The names a server bound to `bound` (an address or a name) accepts, with `extra` names
    /// (`--allowed-host`; `*` for any).
    ///
    /// # Errors
    /// A name that cannot be a host name (the message names it).
    pub fn parse(bound: &str, extra: &[String]) -> Result<Self, String> {
        if extra.iter().any(|name| name.trim() == "*") {
            return Ok(Self::Any);
        }
        let mut names = vec!["localhost".to_string()];
        for name in std::iter::once(bound).chain(extra.iter().map(String::as_str)) {
            let name = normalize(name.trim());
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'[' | b']'));
            if !valid {
                return Err(format!("invalid host name {name:?}"));
            }
            if !is_ip_address(&name) && !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(Self::Names(Arc::new(names)))
    }

    /// Whether a request addressed to `host` (a `Host` header's value, with or without a port)
    /// is served.
    #[must_use]
    pub fn admits(&self, host: &str) -> bool {
        let Self::Names(names) = self else { return true };
        let name = normalize(strip_port(host));
        is_ip_address(&name) || names.contains(&name)
    }
}

/// A host name as compared: lowercase, without the trailing dot of a fully qualified name.
fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `name` of `name:port`; `[v6]` of `[v6]:port`. Anything else after `]` than a port leaves
/// the host whole, so it is no address (`[::1]anything` is refused).
fn strip_port(host: &str) -> &str {
    let is_port = |port: &str| port.bytes().all(|b| b.is_ascii_digit());
    if host.starts_with('[') {
        return match host.split_once(']') {
            Some((address, rest)) if rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port) => {
                &host[..=address.len()]
            }
            _ => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        _ => host,
    }
}

fn is_ip_address(name: &str) -> bool {
    let bracketed = name.strip_prefix('[').and_then(|n| n.strip_suffix(']'));
    name.parse::<Ipv4Addr>().is_ok() || bracketed.unwrap_or(name).parse::<Ipv6Addr>().is_ok()
}

/// Answers 403 (`host_not_allowed`) before anything else is done with a request addressed to
/// a host name that is not allowed; see [`AllowedHosts`].
pub(super) async fn refuse_unknown_hosts(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    let header = request.headers().get(header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    let target = request.uri().authority().map(|a| a.as_str().rsplit('@').next().unwrap_or_default().to_string());
    for host in header.into_iter().chain(target) {
        if !allowed.admits(&host) {
            return ApiError::HostNotAllowed(strip_port(&host).to_string()).into_response();
        }
    }
    next.run(request).await
}

/// The origins whose browser pages may call the API (CORS); none by default, so browsers
/// refuse cross-origin calls.
#[derive(Clone, Debug, Default)]
pub enum CorsOrigins {
    /// No cross-origin calls.
    #[default]
    None,
    /// Any origin (`*`, asked for explicitly).
    Any,
    /// These origins.
    List(Vec<HeaderValue>),
}

/// Refuses a POST that a browser page of a foreign origin sent (403 with the envelope): the
/// page could not read the answer without CORS, but a "simple" cross-origin POST (a form,
/// `text/plain`) still reaches the server, so any web page the user visits could otherwise
/// make this machine's model work for it. Browsers send `Origin` with every cross-origin POST;
/// other clients (SDKs, curl) send none and pass, as do pages of the server's own origin and of
/// the `--cors-origin` origins.
pub(super) async fn refuse_foreign_origins(
    State(allowed): State<CorsOrigins>,
    request: Request,
    next: Next,
) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN) else { return next.run(request).await };
    if request.method() != Method::POST || allowed.admits(origin) || same_origin(origin, &request) {
        return next.run(request).await;
    }
    ApiError::OriginNotAllowed(String::from_utf8_lossy(origin.as_bytes()).into_owned()).into_response()
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent to.
fn same_origin(origin: &HeaderValue, request: &Request) -> bool {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, host)| host);
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

impl CorsOrigins {
    /// Whether pages of `origin` may call the API.
    fn admits(&self, origin: &HeaderValue) -> bool {
        match self {
            Self::None => false,
            Self::Any => true,
            Self::List(origins) => {
                origins.iter().any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
            }
        }
    }

    /// The origins of `--cors-origin` flags: `*` for any, else each exactly
    /// (`http://localhost:3000`; a trailing `/` is dropped).
    ///
    /// # Errors
    /// An origin that cannot be a header value (the message names it).
    pub fn parse(origins: &[String]) -> Result<Self, String> {
        if origins.is_empty() {
            return Ok(Self::None);
        }
        if origins.iter().any(|o| o == "*") {
            return Ok(Self::Any);
        }
        let values: Result<Vec<HeaderValue>, String> = origins
            .iter()
            .map(|o| HeaderValue::from_str(o.trim_end_matches('/')).map_err(|_| format!("invalid CORS origin {o:?}")))
            .collect();
        Ok(Self::List(values?))
    }

    /// The CORS layer (`tower-http`'s), `None` when no origin is allowed.
    pub(super) fn layer(&self) -> Option<CorsLayer> {
        let allow_origin = match self {
            Self::None => return None,
            Self::Any => AllowOrigin::any(),
            Self::List(origins) => AllowOrigin::list(origins.clone()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(allow_origin)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                // The SDKs send headers of their own (openai-node's `x-stainless-*`): any header
                // a preflight asks for is allowed, for the origins allowed.
                .allow_headers(AllowHeaders::mirror_request())
                .max_age(PREFLIGHT_MAX_AGE),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_matched_whole() {
        let keys = ApiKeys::new(["secret-one".to_string(), String::new(), "two".to_string()]);
        assert!(keys.required());
        assert!(keys.accepts(b"secret-one") && keys.accepts(b"two"));
        assert!(!keys.accepts(b"secret") && !keys.accepts(b"secret-one ") && !keys.accepts(b""));
        assert!(!ApiKeys::new([String::new()]).required());
        assert!(!ApiKeys::default().required());
        assert_eq!(format!("{keys:?}"), "ApiKeys { count: 2 }");
    }

    #[test]
    fn a_key_file_has_one_key_per_line() {
        assert_eq!(ApiKeys::parse_file("# comment\n  key-a  \n\nkey-b\n"), ["key-a", "key-b"]);
    }

    #[test]
    fn hosts_are_names_the_user_vouched_for_or_addresses() {
        let default = AllowedHosts::default();
        for host in
            ["localhost", "localhost:8080", "LOCALHOST.:1", "127.0.0.1:8080", "[::1]:8080", "[::1]", "192.168.1.20"]
        {
            assert!(default.admits(host), "{host}");
        }
        for host in ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "", "[::1"] {
            assert!(!default.admits(host), "{host}");
        }
        let named = AllowedHosts::parse("0.0.0.0", &["Homelab.lan".into(), "box".into()]).expect("names");
        assert!(named.admits("homelab.lan:8080") && named.admits("box") && named.admits("10.0.0.7:8080"));
        assert!(!named.admits("evil.example:8080"));
        let bound = AllowedHosts::parse("myhost.local", &[]).expect("a bound name");
        assert!(bound.admits("myhost.local:8080") && !bound.admits("other.local"));
        assert!(matches!(AllowedHosts::parse("127.0.0.1", &["*".into()]), Ok(AllowedHosts::Any)));
        assert!(AllowedHosts::Any.admits("evil.example"));
    }

    #[test]
    fn only_a_port_may_follow_a_bracketed_address() {
        let default = AllowedHosts::default();
        assert!(default.admits("[::1]:8080") && default.admits("[::1]"));
        for host in ["[::1]anything", "[::1].evil.example", "[::1]:80x", "[::1]:8080:1", "[::1]]", "[::1] "] {
            assert!(!default.admits(host), "{host}");
        }
        assert_eq!(AllowedHosts::parse("::", &["bad/name".into()]).expect_err("bad"), "invalid host name \"bad/name\"");
    }

    #[test]
    fn origins_are_checked() {
        assert!(CorsOrigins::parse(&[]).expect("none").layer().is_none());
        assert!(matches!(CorsOrigins::parse(&["*".into(), "http://a".into()]), Ok(CorsOrigins::Any)));
        let one = CorsOrigins::parse(&["http://localhost:3000/".into()]).expect("one");
        assert!(matches!(&one, CorsOrigins::List(list) if list == &["http://localhost:3000"]));
        assert!(one.layer().is_some());
        assert_eq!(
            CorsOrigins::parse(&["bad\norigin".into()]).expect_err("bad"),
            "invalid CORS origin \"bad\\norigin\""
        );
    }
}
