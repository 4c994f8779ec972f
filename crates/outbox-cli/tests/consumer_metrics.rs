//! The consumer process's `/metrics` (as the example billing consumer serves it).
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_consumer::{CancellationToken, ConsumerCounters};
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
    let serving = tokio::spawn(outbox_cli::http::serve_consumer(
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
    // Every metric shown says what it is.
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("outbox_"))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    assert!(!shown.is_empty());
    for name in shown {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no # HELP for {name}: {text}"
        );
    }
}

/// The worker's readiness: deliveries in hand that the inbox does not record (here:
/// an inbox that refuses every arrival, as one waiting past its lock or statement
/// timeout does) fail `/readyz` within `stall_after`, naming the stall; once the
/// inbox records them, it clears by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_inbox_records_nothing_fails_readiness_and_recovers() {
    use std::sync::atomic::AtomicBool;

    use outbox_adapters_memory::MemoryBroker;
    use outbox_consumer::{ConsumerConfig, ConsumerWorker, HandlerRegistry, handler_fn};
    use outbox_core::{InboxStatus, Message};
    use outbox_ports::{Arrival, MockInboxStore, PortError, SystemClock};

    const QUEUE: &str = "stall.consumer";
    let broker = MemoryBroker::new();
    broker.declare_exchange("contract", outbox_adapters_memory::ExchangeKind::Topic);
    broker.declare_queue(QUEUE);
    broker.bind(QUEUE, "contract", "#");
    let down = Arc::new(AtomicBool::new(true));
    let mut inbox = MockInboxStore::new();
    let d = Arc::clone(&down);
    inbox.expect_record_arrival().returning(move |_, _, _| {
        if d.load(Ordering::SeqCst) {
            Err(PortError::transient(
                "record arrival",
                "canceling statement due to lock timeout",
            ))
        } else {
            // Recorded before (a duplicate): acknowledged without the handler.
            Ok(Arrival::Duplicate(InboxStatus::Consumed))
        }
    });
    let worker = ConsumerWorker::new(
        Arc::new(inbox),
        Arc::new(broker.clone()),
        HandlerRegistry::new().fallback(handler_fn(|_m: Message| async { Ok(()) })),
        Arc::new(SystemClock),
        ConsumerConfig {
            store_error_backoff: Duration::from_millis(50),
            stall_after: Duration::from_millis(500),
            ..ConsumerConfig::new("stall-test", QUEUE)
        },
    );
    let progress = worker.progress();
    let counters = worker.counters();
    let cancel = CancellationToken::new();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr")
    };
    let serving = tokio::spawn(outbox_cli::http::serve_consumer_ready(
        addr,
        "stall-test".to_owned(),
        counters,
        progress,
        cancel.clone(),
    ));
    let running = tokio::spawn(worker.run(cancel.clone()));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.0 200"));
    use outbox_ports::Publisher as _;
    let published = broker.publish(&outbox_testkit::messages(3)).await;
    assert!(published.iter().all(|o| o.is_confirmed()), "{published:?}");

    let until = |want: &'static str, within: Duration| async move {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let r = get(addr, "/readyz").await;
            if r.starts_with(want) {
                return r;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/readyz not {want} within {within:?}: {r}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let red = until("HTTP/1.0 503", Duration::from_secs(3)).await;
    assert!(red.contains("worker: stalled"), "{red}");
    let metrics = get(addr, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "outbox_consumer_stalled{consumer=\"stall-test\"} 1"),
        "{metrics}"
    );
    down.store(false, Ordering::SeqCst);
    let green = until("HTTP/1.0 200", Duration::from_secs(5)).await;
    assert!(green.contains("worker: ok"), "{green}");
    // Every delivery recorded, so acknowledged: nothing left on the queue.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while broker.queue_depth(QUEUE) != (0, 0) {
        assert!(tokio::time::Instant::now() < deadline, "deliveries left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running.await.expect("worker");
    serving.await.expect("task").expect("serve");
}
