//! A handler's session settings do not outlive its delivery: every inbox COMMIT
//! (single, keyed, retry, batch) is made with the durability configured for the
//! connection, whatever a handler `SET` (session-wide or `SET LOCAL`), and the next
//! handler on the same pooled connection starts from the session's defaults.
//!
//! The durability a COMMIT was made with is read at commit time: a deferred
//! constraint trigger on the handlers' effects table records the
//! `synchronous_commit` in force when the COMMIT runs its deferred triggers, which
//! is the setting the commit record is then written under.

mod common;

use std::time::Duration;

use outbox_adapters_postgres::{
    BatchDelivery, ConsumeOutcome, PgInboxStore, PgPool, PgSchema, TxHandler, connect,
};
use outbox_core::{Decision, Message};
use outbox_ports::Lease;
use outbox_ports::prelude::*;

fn lease(name: &str) -> Lease {
    Lease::new(outbox_testkit::unique_key(name), Duration::from_secs(60))
}

/// Tables `effects` (what handlers write) and `seen` (n, where, setting): a row
/// per effect at commit time (`commit`) and a row per handler start (`start`).
async fn probes(pool: &PgPool, schema: &PgSchema) -> String {
    let s = schema.quoted();
    for sql in [
        format!("CREATE TABLE {s}.effects (n int)"),
        format!("CREATE TABLE {s}.seen (n int, at text, setting text)"),
        format!(
            "CREATE FUNCTION {s}.at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO {s}.seen VALUES (NEW.n, 'commit', \
               current_setting('synchronous_commit')); RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON {s}.effects \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.at_commit()"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(&*sql))
            .execute(pool)
            .await
            .expect(&sql);
    }
    s.to_owned()
}

/// A handler that notes the setting it starts with, runs `first` (a `SET`, or
/// nothing) and writes effect `n`.
fn handler(s: &str, n: i32, first: Option<&str>) -> TxHandler<'static> {
    let mut statements = vec![format!(
        "INSERT INTO {s}.seen VALUES ({n}, 'start', current_setting('synchronous_commit'))"
    )];
    statements.extend(first.map(str::to_owned));
    statements.push(format!("INSERT INTO {s}.effects VALUES ({n})"));
    Box::new(move |conn: &mut sqlx::PgConnection| {
        Box::pin(async move {
            for sql in &statements {
                sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| format!("{sql}: {e}"))?;
            }
            Ok(())
        })
    })
}

fn message(n: i32, key: Option<&str>) -> Message {
    let mut m = outbox_testkit::message("orders", "order.created");
    m.payload = n.to_string().into_bytes();
    m.ordering_key = key.map(str::to_owned);
    m
}

#[tokio::test]
async fn a_handlers_session_settings_reach_neither_its_commit_nor_the_next_delivery() {
    with_db!(|setup, schema| {
        let s = probes(&setup, &schema).await;
        let default: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&setup)
            .await
            .expect("default");
        assert_ne!(
            default, "off",
            "the server's default must be durable for this test"
        );
        // One connection: every delivery runs on the connection the one before it
        // used.
        let one = connect(&common::url(), 1, Duration::from_secs(5))
            .await
            .expect("a pool of one connection");
        let inbox = PgInboxStore::new(one.clone(), &schema);
        let retry_now = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        let session_off = Some("SET synchronous_commit = off");
        let local_off = Some("SET LOCAL synchronous_commit = off");

        // Single path: a handler turns it off for the session, the next one runs.
        for (n, first) in [(1, session_off), (2, None), (3, local_off), (4, None)] {
            let out = inbox
                .consume_in_transaction(
                    "billing",
                    &message(n, None),
                    &lease("w"),
                    retry_now,
                    handler(&s, n, first),
                )
                .await
                .expect("consume");
            assert_eq!(out, ConsumeOutcome::Consumed, "delivery {n}");
        }
        // Keyed path (recorded first, then handled as a retry is).
        for (n, first) in [(5, session_off), (6, None)] {
            let out = inbox
                .consume_in_transaction(
                    "billing",
                    &message(n, Some("k")),
                    &lease("w"),
                    retry_now,
                    handler(&s, n, first),
                )
                .await
                .expect("consume keyed");
            assert_eq!(out, ConsumeOutcome::Consumed, "delivery {n}");
        }
        // A retry of a failed delivery by the consume sweep.
        let failed = message(7, None);
        let failing: TxHandler<'static> =
            Box::new(|_: &mut sqlx::PgConnection| Box::pin(async { Err("boom".into()) }));
        inbox
            .consume_in_transaction("billing", &failed, &lease("w"), retry_now, failing)
            .await
            .expect("first attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sweep = lease("sweep");
        let due = inbox.claim_due("billing", &sweep, 10).await.expect("claim");
        assert_eq!(due.len(), 1);
        let out = inbox
            .retry_in_transaction(
                "billing",
                &sweep,
                &due[0].message,
                due[0].attempts,
                retry_now,
                handler(&s, 7, session_off),
            )
            .await
            .expect("retry");
        assert_eq!(out, ConsumeOutcome::Consumed);
        // A batch: the first handler turns it off, its batch-mates follow; then a
        // delivery of its own on the same connection.
        let batch: Vec<Message> = (8..=10).map(|n| message(n, None)).collect();
        let leases: Vec<Lease> = batch.iter().map(|_| lease("w")).collect();
        let deliveries: Vec<BatchDelivery<'_>> = batch
            .iter()
            .zip(&leases)
            .map(|(message, lease)| BatchDelivery { message, lease })
            .collect();
        let s2 = s.clone();
        let handler_for = move |m: &Message| {
            let n: i32 = String::from_utf8_lossy(&m.payload).parse().expect("n");
            handler(&s2, n, (n == 8).then_some("SET synchronous_commit = off"))
        };
        let outs = inbox
            .consume_batch_in_transaction(
                "billing",
                &deliveries,
                &|_: &_, n, f: &_| retry_now(n, f),
                &handler_for,
            )
            .await;
        for out in outs {
            assert_eq!(out.expect("batch"), ConsumeOutcome::Consumed);
        }
        let out = inbox
            .consume_in_transaction(
                "billing",
                &message(11, None),
                &lease("w"),
                retry_now,
                handler(&s, 11, None),
            )
            .await
            .expect("consume");
        assert_eq!(out, ConsumeOutcome::Consumed);

        let seen: Vec<(i32, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT n, at, setting FROM {s}.seen ORDER BY n, at"
        )))
        .fetch_all(&setup)
        .await
        .expect("seen");
        assert_eq!(
            seen.len(),
            2 * 11,
            "a start and a commit of each delivery: {seen:?}"
        );
        let wrong: Vec<_> = seen.iter().filter(|(_, _, v)| *v != default).collect();
        assert!(
            wrong.is_empty(),
            "a handler's setting reached a commit or a later delivery (default {default}): {wrong:?}"
        );
        // The pooled connection is left as the session's default for whatever uses
        // it next (the consumer's own marks outside a handler's transaction).
        let after: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&one)
            .await
            .expect("after");
        assert_eq!(after, default);
    })
}

/// A handler that ends the inbox transaction itself and then changes its session
/// (`ROLLBACK; SET synchronous_commit = off`): the delivery is not retried (it is
/// dead: what a handler does after ending the transaction takes effect), and the setting does not go back into the pool with the
/// connection, on the single path nor in a batch. Before, the ROLLBACK that
/// follows an ended transaction left the session as the handler made it, and the
/// consumer's own marks on that connection were then committed without waiting
/// for the WAL.
#[tokio::test]
async fn a_handler_that_ends_the_transaction_leaves_no_session_setting_behind() {
    with_db!(|setup, schema| {
        let default: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&setup)
            .await
            .expect("default");
        assert_ne!(default, "off", "the server's default must be durable");
        // Every commit that writes an inbox row (the consumer's own marks too)
        // notes the durability it was made with.
        let s = schema.quoted();
        for sql in [
            format!("CREATE TABLE {s}.inbox_commits (setting text)"),
            format!(
                "CREATE FUNCTION {s}.inbox_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN INSERT INTO {s}.inbox_commits VALUES \
                   (current_setting('synchronous_commit')); RETURN NULL; END $$"
            ),
            format!(
                "CREATE CONSTRAINT TRIGGER inbox_commit AFTER INSERT OR UPDATE ON {s}.outbox_inbox \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.inbox_commit()"
            ),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(&*sql))
                .execute(&setup)
                .await
                .expect(&sql);
        }
        let one = connect(&common::url(), 1, Duration::from_secs(5))
            .await
            .expect("a pool of one connection");
        let inbox = PgInboxStore::new(one.clone(), &schema);
        let retry_now = |_, _: &_| Decision::RetryAfter(Duration::ZERO);
        let ends_and_sets = || -> TxHandler<'static> {
            Box::new(|conn: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    for sql in ["ROLLBACK", "SET synchronous_commit = off"] {
                        sqlx::query(sql)
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| format!("{sql}: {e}"))?;
                    }
                    Ok(())
                })
            })
        };
        let setting = || async {
            sqlx::query_scalar::<_, String>("SELECT current_setting('synchronous_commit')")
                .fetch_one(&one)
                .await
                .expect("setting")
        };

        let out = inbox
            .consume_in_transaction(
                "billing",
                &message(1, None),
                &lease("w"),
                retry_now,
                ends_and_sets(),
            )
            .await
            .expect("consume");
        assert!(
            matches!(out, ConsumeOutcome::Dead(_)),
            "an ended transaction is never retried: {out:?}"
        );
        assert_eq!(setting().await, default, "single path");

        let batch: Vec<Message> = (2..=3).map(|n| message(n, None)).collect();
        let leases: Vec<Lease> = batch.iter().map(|_| lease("w")).collect();
        let deliveries: Vec<BatchDelivery<'_>> = batch
            .iter()
            .zip(&leases)
            .map(|(message, lease)| BatchDelivery { message, lease })
            .collect();
        let handler_for = move |_: &Message| ends_and_sets();
        let outs = inbox
            .consume_batch_in_transaction(
                "billing",
                &deliveries,
                &|_: &_, n, f: &_| retry_now(n, f),
                &handler_for,
            )
            .await;
        assert_eq!(outs.len(), 2);
        assert_eq!(setting().await, default, "batch path");
        let commits: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT setting FROM {s}.inbox_commits"
        )))
        .fetch_all(&setup)
        .await
        .expect("commits");
        assert!(!commits.is_empty(), "the marks of the ended deliveries");
        assert!(
            commits.iter().all(|c| *c == default),
            "an inbox row was committed under the handler's setting: {commits:?}"
        );
    })
}
