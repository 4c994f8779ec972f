//! Publishes to an exchange that does not exist are said in the log: one warning
//! naming the exchange, the error and how many failed, not a line per message and
//! not nothing (each retry is logged at debug level only).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_adapters_memory::{MemoryBroker, MemoryOutboxStore};
use outbox_core::RetryPolicy;
use outbox_ports::{Lease, OutboxRelayPath, OutboxStore, SystemClock};
use outbox_relay::dispatcher::publish_claimed;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn failing_publishes_to_a_missing_exchange_are_said_once_per_exchange() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let store = Arc::new(MemoryOutboxStore::new(Arc::new(SystemClock)));
    let broker = MemoryBroker::new(); // no exchange declared: every publish fails
    let retry = RetryPolicy {
        initial_backoff: Duration::from_secs(60),
        max_backoff: Duration::from_secs(60),
        max_attempts: 10,
    };
    for _ in 0..2 {
        let batch: Vec<_> = (0..20)
            .map(|_| outbox_testkit::message("nowhere-to-go", "k"))
            .collect();
        store.enqueue(batch).await.expect("enqueue");
        let lease = Lease::new("holder", Duration::from_secs(30));
        let claimed = store.claim_pending(&lease, 100).await.expect("claim");
        let counts = publish_claimed(&*store, &broker, &lease, claimed, &retry, || 0.5)
            .await
            .expect("marks");
        assert_eq!(counts.failed, 20, "every publish failed and is retried");
    }
    let text = String::from_utf8(captured.0.lock().expect("log").clone()).expect("utf-8");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("nowhere-to-go"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one line for 40 failures within a minute: {text}"
    );
    let line = lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("publishes to this exchange are failing"),
        "{line}"
    );
    assert!(
        line.contains("failed=20"),
        "the first batch's count: {line}"
    );
    assert!(line.contains("not found"), "the error: {line}");
}
