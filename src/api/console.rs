//! The console: a chat and voice page at `/`, its files embedded in the binary at build time
//! (nothing is fetched from any network, so it works offline and inside the systemd sandbox).
//! The page calls the API as any client does, through the same host, origin and key checks;
//! its files hold no data and are served without a key, so that the page can ask for one.

use axum::extract::Path;
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The folder the page's scripts and styles are served from.
const ASSET_PREFIX: &str = "/console/";

/// Its own scripts, styles and API only: no inline script, no other origin, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file of the page.
struct Asset {
    /// Its name under [`ASSET_PREFIX`].
    name: &'static str,
    /// Its `Content-Type`.
    content_type: &'static str,
    /// Its text.
    body: &'static str,
}

/// The console's look: colours (light and dark), header, layout, messages, controls. The
/// grading page of `firstword bench grade` builds on it.
pub(crate) const CONSOLE_STYLE: &str = include_str!("console/console.css");

/// The content type of stylesheets.
pub(crate) const CSS: &str = "text/css; charset=utf-8";

/// The content type of the page's script modules.
const JS: &str = "text/javascript; charset=utf-8";

/// The page's files (ES modules and the style sheet).
const ASSETS: &[Asset] = &[
    Asset { name: "console.css", content_type: CSS, body: CONSOLE_STYLE },
    Asset { name: "app.js", content_type: JS, body: include_str!("console/app.js") },
    Asset { name: "api.js", content_type: JS, body: include_str!("console/api.js") },
    Asset { name: "chat.js", content_type: JS, body: include_str!("console/chat.js") },
    Asset { name: "voice.js", content_type: JS, body: include_str!("console/voice.js") },
    Asset { name: "charts.js", content_type: JS, body: include_str!("console/charts.js") },
    Asset { name: "words.js", content_type: JS, body: include_str!("console/words.js") },
];

/// The page itself.
const PAGE: &str = include_str!("console/index.html");

/// Whether `path` is one of the console's files (served without a key).
pub(super) fn is_console_file(path: &str) -> bool {
    path == "/" || path.strip_prefix(ASSET_PREFIX).is_some_and(|name| find(name).is_some())
}

/// The file served as `/console/{name}`.
fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.name == name)
}

/// `GET /`: the page.
pub(super) async fn page() -> Response {
    served("text/html; charset=utf-8", PAGE)
}

/// `GET /console/{name}`: one of the page's files; 404 with the envelope for any other name.
pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match find(&name) {
        Some(asset) => served(asset.content_type, asset.body),
        None => ApiError::NotFound.into_response(),
    }
}

/// `body` with its type and the console's security headers.
fn served(content_type: &'static str, body: &'static str) -> Response {
    page_file(content_type, CONTENT_SECURITY_POLICY, body)
}

/// One embedded file of a page this binary serves (the console, `firstword bench grade`'s
/// page): its type, the page's `policy` as Content-Security-Policy, and the headers both pages
/// share (no type sniffing, no referrer, revalidated each time).
pub(crate) fn page_file(content_type: &'static str, policy: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Revalidated each time, so a new binary's page is never mixed with an old script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

/// The bytes the page and all its files add up to.
#[cfg(test)]
pub(super) fn total_bytes() -> usize {
    PAGE.len() + ASSETS.iter().map(|asset| asset.body.len()).sum::<usize>()
}

/// The names of the page's files, as the page refers to them.
#[cfg(test)]
pub(super) fn asset_paths() -> impl Iterator<Item = String> {
    ASSETS.iter().map(|asset| format!("{ASSET_PREFIX}{}", asset.name))
}
