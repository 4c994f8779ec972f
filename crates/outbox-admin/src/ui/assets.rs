//! The dashboard's static files, embedded in the binary: the vendored htmx
//! (`assets/htmx-2.0.11.min.js`, see `assets/README.md` for its origin and
//! checksum), the stylesheet, the live numbers' and the copy button's scripts and
//! the icon. Nothing is loaded from elsewhere.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// htmx 2.0.11, unmodified (`dist/htmx.min.js` of the npm package `htmx.org`).
pub(crate) const HTMX: &[u8] = include_bytes!("../../assets/htmx-2.0.11.min.js");
/// The live numbers: one server-sent-events stream per browser, shared by its
/// tabs (`[data-live]`), written for this project.
pub(crate) const LIVE: &[u8] = include_bytes!("../../assets/live.js");
/// The stylesheet: light and dark (system preference, or the theme cookie).
pub(crate) const STYLE: &[u8] = include_bytes!("../../assets/style.css");
/// One-click copy of an id (`button[data-copy]`), written for this project.
pub(crate) const COPY: &[u8] = include_bytes!("../../assets/copy.js");
/// The tab's icon: an outbox tray with an arrow out (drawn for this project).
pub(crate) const FAVICON: &[u8] = include_bytes!("../../assets/favicon.svg");

/// `GET <base>/assets/{file}`.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let (body, content_type) = match file.as_str() {
        "htmx.min.js" => (HTMX, "text/javascript; charset=utf-8"),
        "live.js" => (LIVE, "text/javascript; charset=utf-8"),
        "style.css" => (STYLE, "text/css; charset=utf-8"),
        "copy.js" => (COPY, "text/javascript; charset=utf-8"),
        "favicon.svg" => (FAVICON, "image/svg+xml"),
        _ => return super::render::error_page(StatusCode::NOT_FOUND, "no such file"),
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}
