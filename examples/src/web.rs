//! The order service over HTTP, with axum: `POST /orders` writes the order and its
//! `OrderCreated` in one sqlx transaction and answers `201 Created`. Either both
//! are stored or neither: a message is never published for an order that was
//! rolled back, and never lost for one that was committed.
//!
//! ```text
//! curl -X POST localhost:8080/orders -H 'content-type: application/json' \
//!      -d '{"order_id": 42, "total_cents": 1250}'
//! {"order_id":42,"message_id":"0193..."}
//! ```

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use outbox::event::to_new_message;
use outbox::postgres::{PgOutbox, PgPool, sqlx};
use serde::{Deserialize, Serialize};

use crate::Shop;
use crate::events::OrderCreated;

/// What the routes share.
struct App {
    shop: Shop,
    pool: PgPool,
    outbox: PgOutbox,
}

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// The order's id (the caller's: a retried request finds it taken, 409).
    pub order_id: i64,
    /// What it costs, in cents (not negative).
    pub total_cents: i64,
}

/// The answer to a created order.
#[derive(Debug, Serialize)]
pub struct Created {
    /// The order's id.
    pub order_id: i64,
    /// The id of its `order.created` message.
    pub message_id: String,
}

/// The routes: `POST /orders`.
pub fn router(shop: Shop, pool: PgPool) -> Router {
    let outbox = PgOutbox::new(shop.outbox_schema.clone());
    Router::new()
        .route("/orders", post(create_order))
        .with_state(Arc::new(App { shop, pool, outbox }))
}

fn error(status: StatusCode, text: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": text.into() }))).into_response()
}

/// A failure the caller cannot act on: logged in full, answered without the
/// database's words.
fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "creating an order failed");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the order could not be stored; try again",
    )
}

async fn create_order(
    State(app): State<Arc<App>>,
    body: Result<Json<NewOrder>, JsonRejection>,
) -> Response {
    let Json(order) = match body {
        Ok(body) => body,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if order.total_cents < 0 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "total_cents must not be negative",
        );
    }
    // The message first: a value that cannot become one is refused before any
    // write (nothing to roll back).
    let mut event = match to_new_message(&OrderCreated {
        order_id: order.order_id,
        total_cents: order.total_cents,
    }) {
        Ok(event) => event.with_source("web-shop"),
        Err(e) => {
            // The details (type paths, serde's words) go to the log, not the caller.
            tracing::warn!(error = %e, "an order that cannot become a message");
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "the order cannot be published",
            );
        }
    };
    event.exchange.clone_from(&app.shop.exchange);
    let mut tx = match app.pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return internal(e),
    };
    let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.orders (id, total_cents) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        app.shop.schema.quoted()
    )))
    .bind(order.order_id)
    .bind(order.total_cents)
    .execute(&mut *tx)
    .await;
    match inserted {
        Ok(r) if r.rows_affected() == 0 => {
            return error(
                StatusCode::CONFLICT,
                format!("order {} exists already", order.order_id),
            );
        }
        Ok(_) => {}
        Err(e) => return internal(e),
    }
    let message_id = match app.outbox.enqueue(&mut tx, event).await {
        Ok(id) => id,
        Err(e) => return internal(e),
    };
    if let Err(e) = tx.commit().await {
        // The COMMIT's answer may have been lost after it took effect: the caller
        // learns that the outcome is unknown (a retry of the same order id then
        // answers 409 if it was stored), never that nothing was stored.
        tracing::error!(error = %e, order_id = order.order_id, "the order's commit has no answer");
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the order's outcome is unknown; retry it: 409 means it was stored",
        );
    }
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{}", order.order_id))],
        Json(Created {
            order_id: order.order_id,
            message_id: message_id.to_string(),
        }),
    )
        .into_response()
}
