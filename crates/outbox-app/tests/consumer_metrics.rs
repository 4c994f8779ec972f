//! The consumer process's `/metrics` (as the example billing consumer serves it).
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_app::{CancellationToken, ConsumerCounters};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut stream = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "connect: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("response");
    body
}

#[tokio::test]
async fn consumer_metrics_export_the_retention_counter() {
    let counters = Arc::new(ConsumerCounters::default());
    counters.retention_deleted.store(6, Ordering::Relaxed);
    counters.consumed.store(3, Ordering::Relaxed);
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr")
    };
    let cancel = CancellationToken::new();
    let serving = tokio::spawn(outbox_app::http::serve_consumer(
        addr,
        "metrics-test".to_owned(),
        Arc::clone(&counters),
        cancel.clone(),
    ));
    let text = get(addr, "/metrics").await;
    cancel.cancel();
    serving.await.expect("task").expect("serve");
    assert!(
        text.lines()
            .any(|l| l == "outbox_retention_deleted_total{consumer=\"metrics-test\"} 6"),
        "{text}"
    );
}
