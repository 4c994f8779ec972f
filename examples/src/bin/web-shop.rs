//! The order service over HTTP: `POST /orders` (see `outbox_examples::web`).
//! Settings as the other shop programs (`SHOP_*`, `OUTBOX_SCHEMA`), and `WEB_ADDR`
//! (default `127.0.0.1:8080`). Run `order-service setup` once first. Stops on
//! SIGINT or SIGTERM after the requests in flight.

use outbox_examples::{Shop, web};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telemetry = outbox_examples::telemetry("web-shop")?;
    let shop = Shop::from_env()?;
    let pool = shop.pool().await?;
    let addr = std::env::var("WEB_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| anyhow::anyhow!("WEB_ADDR {addr}: {e}"))?;
    tracing::info!(%addr, "web shop listening");
    let served = axum::serve(listener, web::router(shop, pool))
        .with_graceful_shutdown(outbox_examples::shutdown_signal())
        .await;
    telemetry.shutdown().await;
    Ok(served?)
}
