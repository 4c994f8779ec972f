//! The [`AuditLog`] contract.

use std::sync::Arc;

use outbox_core::Timestamp;
use outbox_ports::{AuditEntry, AuditLog};

fn entry(n: u64) -> AuditEntry {
    AuditEntry {
        actor: format!("ops-{n}"),
        action: "requeue".into(),
        target: format!("{{\"status\":\"dead\",\"n\":{n}}}"),
        count: n,
        at: None,
    }
}

/// Entries come back newest first across pages, each once, stamped by the store.
pub async fn records_are_listed_newest_first(log: Arc<dyn AuditLog>) {
    let started = Timestamp::now_utc() - time::Duration::seconds(5);
    for n in 0..5 {
        log.record(entry(n)).await.expect("record");
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = log.list(after, 2).await.expect("list");
        assert!(page.items.len() <= 2);
        seen.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        seen.iter().map(|e| e.count).collect::<Vec<_>>(),
        vec![4, 3, 2, 1, 0]
    );
    for e in &seen {
        let at = e.at.expect("stamped");
        assert!(at >= started && at <= Timestamp::now_utc() + time::Duration::seconds(5));
        assert_eq!(
            AuditEntry {
                at: None,
                ..e.clone()
            },
            entry(e.count),
            "stored as given"
        );
    }
    assert_eq!(log.list(None, 0).await.expect("limit 0").items.len(), 1);
}

/// An empty log has one empty, final page.
pub async fn an_empty_log_has_an_empty_page(log: Arc<dyn AuditLog>) {
    let page = log.list(None, 50).await.expect("list");
    assert!(page.items.is_empty());
    assert_eq!(page.next, None);
}

/// The writes of one target are read back newest first, exactly that target's
/// (not one it only starts like), at most `limit`.
pub async fn writes_are_read_back_by_target(log: Arc<dyn AuditLog>) {
    let record = |target: &str, action: &str| AuditEntry {
        actor: "ops".into(),
        action: action.into(),
        target: target.into(),
        count: 1,
        at: None,
    };
    for (target, action) in [
        ("0190f3a5-6b1c-7d2e-8f00-0123456789ab", "requeue"),
        ("0190f3a5-6b1c-7d2e-8f00-0123456789ab-x", "requeue"),
        ("{\"status\":\"dead\"}", "requeue_matching"),
        ("0190f3a5-6b1c-7d2e-8f00-0123456789ab", "delete"),
    ] {
        log.record(record(target, action)).await.expect("record");
    }
    let mine = log
        .of_target("0190f3a5-6b1c-7d2e-8f00-0123456789ab", 10)
        .await
        .expect("of target");
    assert_eq!(
        mine.iter().map(|e| e.action.as_str()).collect::<Vec<_>>(),
        ["delete", "requeue"],
        "newest first, that target only"
    );
    assert!(mine.iter().all(|e| e.at.is_some()));
    let one = log
        .of_target("0190f3a5-6b1c-7d2e-8f00-0123456789ab", 1)
        .await
        .expect("limited");
    assert_eq!(one.len(), 1);
    assert!(log.of_target("nothing", 10).await.expect("none").is_empty());
}
