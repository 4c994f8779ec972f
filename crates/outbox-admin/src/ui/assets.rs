//! The dashboard's static files, embedded in the binary: the vendored htmx
//! (`assets/htmx-2.0.11.min.js`, see `assets/README.md` for its origin and
//! checksum), the stylesheet, the copy button's script and the icon. Nothing is loaded from elsewhere.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// htmx 2.0.11, unmodified (`dist/htmx.min.js` of the npm package `htmx.org`).
pub(crate) const HTMX: &[u8] = include_bytes!("../../assets/htmx-2.0.11.min.js");
/// htmx's SSE extension 2.2.4, unmodified (`dist/sse.min.js` of the npm package
/// `htmx-ext-sse`): the overview's live numbers.
pub(crate) const HTMX_SSE: &[u8] = include_bytes!("../../assets/htmx-ext-sse-2.2.4.min.js");
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
        "htmx-ext-sse.min.js" => (HTMX_SSE, "text/javascript; charset=utf-8"),
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
