//! What turns a template or a message into a response, for the pages and the
//! login alike: HTML with its content type, a page rendered with a status, and
//! the error page.

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{Page, UiError};

/// `body` as an HTML response.
pub(crate) fn html(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// `page` as an HTML response with `status` (a template that fails is logged and
/// shows as [`UiError::Render`]).
pub(crate) fn render(status: StatusCode, page: &impl Template) -> Page {
    let body = page.render().map_err(|e| {
        tracing::error!(error = %e, "template failed");
        UiError::Render
    })?;
    Ok((status, html(body)).into_response())
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
}

/// A page that says what went wrong (no navigation: it may be shown before login).
pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    let page = ErrorPage {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or(""),
        message,
    };
    let body = page
        .render()
        .unwrap_or_else(|_| format!("{} {message}", status.as_u16()));
    (status, html(body)).into_response()
}
