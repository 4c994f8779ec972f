//! The README's typed service, run as written against PostgreSQL and RabbitMQ.
//!
//! The README's block and `tests/bin/readme_service.rs` must be the same text (the
//! binary is what runs; the README's block is also compiled as a doc test). The
//! program runs in a database and a RabbitMQ virtual host of its own, made here and
//! removed afterwards (also when the test fails), through the two environment
//! variables it reads. What the README promises is checked: both versions billed,
//! the negative order dead after one attempt, each invoice's follow-up shipped on
//! its second attempt about a second later, and a prompt, clean exit on Ctrl-C.

use std::time::{Duration, Instant};

use sqlx::Row as _;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-e2e-readme");
const README: &str = include_str!("../../README.md");
const PROGRAM: &str = include_str!("../bin/readme_service.rs");
const TAG: &str = "<!-- readme-service -->\n```rust,no_run\n";

/// The README's block of the typed service.
fn readme_block() -> &'static str {
    let at = README.find(TAG).expect("the README has the typed service") + TAG.len();
    let len = README[at..].find("```\n").expect("the block ends");
    &README[at..at + len]
}

#[test]
fn the_readme_shows_the_program_that_runs() {
    assert_eq!(
        readme_block(),
        PROGRAM,
        "README.md's typed service and tests/bin/readme_service.rs differ: copy one to the other"
    );
}

/// Lines of code (not blank, not only a comment) from `// The outbox` to
/// `service.run()`: the outbox's part of the program.
fn wiring_lines(program: &str) -> Vec<&str> {
    let from = program
        .lines()
        .position(|l| l.trim_start().starts_with("// The outbox"))
        .expect("the program marks its outbox part");
    let mut lines = Vec::new();
    for line in program.lines().skip(from) {
        let code = line.trim();
        if !code.is_empty() && !code.starts_with("//") {
            lines.push(code);
        }
        if code.starts_with("service.run()") {
            return lines;
        }
    }
    panic!("the outbox part ends with service.run()");
}

#[test]
fn the_readme_wires_the_service_in_at_most_25_lines() {
    let wiring = wiring_lines(readme_block());
    assert!(
        wiring.len() <= 25,
        "{} lines of outbox wiring:\n{}",
        wiring.len(),
        wiring.join("\n")
    );
    // The count is of the real thing: the builder, both consumers, the enqueue.
    for part in [
        "Service::postgres",
        ".relay()",
        ".consumer(\"billing\"",
        ".consumer(\"shipping\"",
        "enqueue",
    ] {
        assert!(wiring.iter().any(|l| l.contains(part)), "no {part}");
    }
    for shown in ["Arc::new(", "SystemClock"] {
        assert!(!README.contains(shown), "the README shows {shown}");
    }
}

#[test]
fn the_wiring_count_fails_a_longer_program() {
    let longer = PROGRAM.replace("        .relay()\n", &"        .relay()\n".repeat(10));
    assert!(wiring_lines(&longer).len() > wiring_lines(PROGRAM).len() + 8);
}

/// A database and a virtual host of the test's own, removed on drop.
struct Sandbox {
    admin_url: String,
    database: String,
    vhost: String,
    child: Option<tokio::process::Child>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
        let _ = std::process::Command::new("psql")
            .arg(&self.admin_url)
            .args([
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database),
            ])
            .output();
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["delete_vhost", &self.vhost])
            .output();
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// `url` with its last path segment (a database or a vhost) replaced.
fn with_path(url: &str, path: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    let cut = base.rfind('/').expect("a URL with a path");
    format!("{}/{path}", &base[..cut])
}

async fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .expect("rabbitmqctl (the local RabbitMQ's) runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_typed_service_runs_as_written() {
    let admin_url = env_or(
        "OUTBOX_TEST_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let amqp_url = env_or(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let suffix = format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let mut sandbox = Sandbox {
        admin_url: admin_url.clone(),
        database: format!("readme_{suffix}"),
        vhost: format!("readme-{suffix}"),
        child: None,
    };
    let admin = sqlx::PgPool::connect(&admin_url)
        .await
        .expect("PostgreSQL reachable");
    // SAFETY-SQL: `readme_` and digits, made above.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {}",
        sandbox.database
    )))
    .execute(&admin)
    .await
    .expect("create the test's database");
    admin.close().await;
    rabbitmqctl(&["add_vhost", &sandbox.vhost]).await;
    rabbitmqctl(&[
        "set_permissions",
        "-p",
        &sandbox.vhost,
        "guest",
        ".*",
        ".*",
        ".*",
    ])
    .await;
    let database_url = with_path(&admin_url, &sandbox.database);
    let started = Instant::now();
    sandbox.child = Some(
        Command::new(BIN)
            .env("DATABASE_URL", &database_url)
            .env("AMQP_URL", with_path(&amqp_url, &sandbox.vhost))
            .kill_on_drop(true)
            .spawn()
            .expect("start the README's service"),
    );
    let db = sqlx::PgPool::connect(&database_url)
        .await
        .expect("the test's database");

    // Until both orders are billed and shipped, and the negative one is dead.
    let deadline = started + Duration::from_secs(60);
    let (invoices, shipments, billing, shipping) = loop {
        assert!(
            Instant::now() < deadline,
            "the service did not finish its work within 60 s"
        );
        if let Some(child) = &mut sandbox.child
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("the service exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ids = |sql: &'static str| {
            let db = db.clone();
            async move {
                sqlx::query(sql)
                    .fetch_all(&db)
                    .await
                    .map(|rows| rows.iter().map(|r| r.get::<i64, _>(0)).collect::<Vec<_>>())
                    .unwrap_or_default()
            }
        };
        let invoices = ids("SELECT order_id FROM invoices ORDER BY order_id").await;
        let shipments = ids("SELECT order_id FROM shipments ORDER BY order_id").await;
        let inbox = |consumer: &'static str| {
            let db = db.clone();
            async move {
                sqlx::query(
                    "SELECT status, attempts, coalesce(last_error, '') FROM outbox.outbox_inbox \
                     WHERE consumer = $1 ORDER BY status, attempts",
                )
                .bind(consumer)
                .fetch_all(&db)
                .await
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            (
                                r.get::<String, _>(0),
                                r.get::<i32, _>(1),
                                r.get::<String, _>(2),
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
            }
        };
        let billing = inbox("billing").await;
        let shipping = inbox("shipping").await;
        if shipments.len() >= 2 && billing.len() >= 3 {
            break (invoices, shipments, billing, shipping);
        }
    };
    let work_done = started.elapsed();
    assert_eq!(invoices, [1, 2], "order 1 (version 2) and 2 (version 1)");
    assert_eq!(shipments, [1, 2], "one shipment per invoice");
    let statuses: Vec<(&str, i32)> = billing.iter().map(|(s, a, _)| (s.as_str(), *a)).collect();
    assert_eq!(
        statuses,
        [("consumed", 1), ("consumed", 1), ("dead", 1)],
        "billing: {billing:?}"
    );
    assert!(billing[2].2.contains("negative total"), "{billing:?}");
    let shipped: Vec<(&str, i32)> = shipping.iter().map(|(s, a, _)| (s.as_str(), *a)).collect();
    assert_eq!(
        shipped,
        [("consumed", 2), ("consumed", 2)],
        "each shipment on its second attempt: {shipping:?}"
    );
    // The retry came at the policy's backoff (1 s, jittered), not at a sweep
    // interval of a minute.
    assert!(
        work_done < Duration::from_secs(20),
        "everything took {work_done:?}"
    );

    // Ctrl-C: the service stops, promptly and cleanly.
    let mut child = sandbox.child.take().expect("running");
    let pid = child.id().expect("a pid").to_string();
    let interrupted = Instant::now();
    let kill = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill");
    assert!(kill.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the service stops within 10 s of Ctrl-C")
        .expect("wait");
    assert!(status.success(), "exit after Ctrl-C: {status}");
    eprintln!(
        "README service: work done in {work_done:?}, stopped {:?} after Ctrl-C",
        interrupted.elapsed()
    );
    db.close().await;
}
